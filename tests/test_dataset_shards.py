"""``ftnb.train.shards.shard_of``: each rank's contiguous share of a ``TorchTrainer`` dataset.

For every supported type, world size and length: the shards are disjoint, cover the dataset
once and in order, differ in size by at most one (earlier ranks larger), and have the promised
type. Then ObjectRefs, ``SequenceShard`` itself, and the refusals' messages.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Subset

import ftnb
from ftnb.train.shards import SequenceShard, shard_bounds, shard_of

WORLD_SIZES = (1, 2, 3, 4)
LENGTHS = (0, 1, 5, 10, 11)


class SquaresDataset(Dataset):
    """A map-style torch dataset: item ``i`` is ``i * i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


class Squares:
    """Sequence-like without being a list or a torch Dataset: ``__len__`` and ``__getitem__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i * i


class SquaresStream(IterableDataset):
    """A stream: no positions to split by."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter([0, 1, 4])


def _numpy(n: int) -> np.ndarray:
    return np.arange(n * 2).reshape(n, 2) * 10


def _dataframe(n: int) -> pd.DataFrame:
    # A non-default index, so that keeping it is visible.
    return pd.DataFrame(
        {"x": range(n), "y": [f"r{i}" for i in range(n)]}, index=range(100, 100 + n)
    )


def _series(n: int) -> pd.Series:
    return pd.Series(range(n), index=[f"k{i}" for i in range(n)], dtype="int64")


# name -> (make(n), the shard type, items(obj) as a list for comparison)
CASES: dict[str, tuple[Callable[[int], Any], type, Callable[[Any], list]]] = {
    "numpy": (_numpy, np.ndarray, lambda a: [tuple(row) for row in a.tolist()]),
    "dataframe": (
        _dataframe,
        pd.DataFrame,
        lambda df: list(zip(df.index, df["x"], df["y"])),
    ),
    "series": (_series, pd.Series, lambda s: list(s.items())),
    "tensor": (lambda n: torch.arange(n) * 3, torch.Tensor, lambda t: t.tolist()),
    "torch_dataset": (SquaresDataset, Subset, lambda d: [d[i] for i in range(len(d))]),
    "list": (lambda n: [f"s{i}" for i in range(n)], list, list),
    "tuple": (lambda n: tuple(range(n)), tuple, list),
    "range": (lambda n: range(3, 3 + 2 * n, 2), range, list),
    "sequence": (Squares, SequenceShard, lambda s: [s[i] for i in range(len(s))]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("length", LENGTHS)
def test_shards_are_contiguous_disjoint_and_cover_the_dataset(
    case: str, world_size: int, length: int
) -> None:
    make, shard_type, items = CASES[case]
    data = make(length)
    shards = [shard_of(data, rank, world_size, name="train") for rank in range(world_size)]

    assert all(isinstance(shard, shard_type) for shard in shards), [type(s) for s in shards]
    # Concatenated in rank order, the shards are the dataset: disjoint, complete, in order.
    assert [item for shard in shards for item in items(shard)] == items(data)
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1, sizes
    assert sizes == sorted(sizes, reverse=True), f"earlier ranks get the extra items: {sizes}"
    assert sizes == [len(part) for part in np.array_split(np.arange(length), world_size)]


def test_numpy_shards_are_views() -> None:
    data = np.arange(12).reshape(6, 2)
    shard = shard_of(data, 1, 2, name="train")
    assert np.shares_memory(shard, data)
    shard[0, 0] = -1  # a view: writes reach the dataset
    assert data[3, 0] == -1


def test_dataframe_shard_keeps_the_index_and_columns() -> None:
    df = _dataframe(5)
    shard = shard_of(df, 1, 2, name="train")
    assert list(shard.index) == [103, 104]
    assert list(shard.columns) == ["x", "y"]
    assert shard.loc[104, "y"] == "r4"


def test_torch_dataset_shard_is_a_subset_of_the_dataset() -> None:
    data = SquaresDataset(7)
    shard = shard_of(data, 2, 3, name="train")
    assert shard.dataset is data
    assert list(shard.indices) == [5, 6]
    assert [shard[0], shard[1]] == [25, 36]


def test_object_ref_is_loaded_then_sharded() -> None:
    data = _numpy(11)
    ref = ftnb.put(data)
    shards = [shard_of(ref, rank, 3, name="train") for rank in range(3)]
    assert all(isinstance(s, np.ndarray) for s in shards)
    assert np.array_equal(np.concatenate(shards), data)
    assert [len(s) for s in shards] == [4, 4, 3]

    frame_ref = ftnb.put(_dataframe(5))
    assert list(shard_of(frame_ref, 0, 2, name="train").index) == [100, 101, 102]


def test_shard_bounds_match_array_split() -> None:
    assert [shard_bounds(10, rank, 3) for rank in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [shard_bounds(2, rank, 4) for rank in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    with pytest.raises(ValueError, match=r"length=-1"):
        shard_bounds(-1, 0, 1)


# --------------------------------------------------------------------------- SequenceShard


def test_sequence_shard_indexing_iteration_and_slicing() -> None:
    shard = shard_of(Squares(10), 1, 3, name="train")  # positions 4, 5, 6
    assert isinstance(shard, SequenceShard)
    assert len(shard) == 3
    assert list(shard) == [16, 25, 36]
    assert shard[0] == 16 and shard[2] == 36
    assert shard[-1] == 36 and shard[-3] == 16
    assert shard[np.int64(1)] == 25
    for bad in (3, -4, 100):
        with pytest.raises(IndexError, match="out of range for a shard of 3 items"):
            shard[bad]
    with pytest.raises(TypeError, match="integers or slices, not str"):
        shard["a"]
    tail = shard[1:]
    assert isinstance(tail, SequenceShard) and list(tail) == [25, 36]
    assert list(shard[::-1]) == [36, 25, 16]
    assert "Squares" in repr(shard) and "3 items" in repr(shard)


def test_sequence_shard_is_read_only() -> None:
    shard = shard_of(Squares(4), 0, 2, name="train")
    with pytest.raises(TypeError):
        shard[0] = 1  # type: ignore[index]


def test_empty_sequence_shard() -> None:
    shard = shard_of(Squares(1), 1, 2, name="train")
    assert len(shard) == 0 and list(shard) == []
    with pytest.raises(IndexError):
        shard[0]
    assert "0 items" in repr(shard)


# --------------------------------------------------------------------------- refusals


def _squares_generator():  # type: ignore[no-untyped-def]
    yield from (0, 1, 4)


@pytest.mark.parametrize(
    "data, what",
    [
        (SquaresStream(), "IterableDataset"),
        (_squares_generator(), "iterator"),
        (iter([1, 2, 3]), "iterator"),
        ({1, 2, 3}, "no __getitem__"),
        (object(), "no __len__ and __getitem__"),
        (np.array(5), "len() fails"),
    ],
    ids=["iterable_dataset", "generator", "iterator", "set", "object", "0d_array"],
)
def test_unsplittable_data_is_refused_naming_the_dataset_and_the_fix(data: Any, what: str) -> None:
    with pytest.raises(TypeError) as info:
        shard_of(data, 0, 2, name="valid")
    message = str(info.value)
    assert "datasets={'valid': ...}" in message, message
    assert what in message, message
    assert "Fix: give a map-style dataset" in message, message
    assert "get_world_rank()" in message and "get_world_size()" in message, message


def test_text_and_mappings_are_refused_with_their_own_fix() -> None:
    with pytest.raises(TypeError, match=r"'train'.*text, not a dataset.*Fix: if it is a path"):
        shard_of("data/train.csv", 0, 2, name="train")
    with pytest.raises(TypeError, match=r"'train'.*a mapping.*Fix: for several datasets"):
        shard_of({"x": [1, 2]}, 0, 2, name="train")


@pytest.mark.parametrize(
    "rank, world_size, match",
    [
        (2, 2, r"rank=2 is out of range for world_size=2.*0 <= rank < 2"),
        (-1, 2, r"rank=-1 is out of range"),
        (0, 0, r"world_size=0 must be >= 1"),
        (0.0, 2, r"rank=0.0 \(float\) must be an int"),
        (0, "2", r"world_size='2' \(str\) must be an int"),
        (True, 2, r"rank=True \(bool\) must be an int"),
    ],
)
def test_bad_rank_or_world_size_is_a_value_error(rank: Any, world_size: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        shard_of([1, 2, 3], rank, world_size, name="train")


def test_sharding_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from ftnb.train.shards import shard_of\n"
        "assert shard_of([1, 2, 3], 0, 2, name='t') == [1, 2]\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
