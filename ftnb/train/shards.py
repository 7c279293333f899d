"""Each rank's share of a dataset given to ``TorchTrainer(datasets={name: data})``.

:func:`shard_of` splits a dataset into ``world_size`` contiguous blocks, like
``numpy.array_split``: the shards of ranks ``0 .. world_size - 1`` are disjoint, cover the dataset
exactly once and in order, and earlier ranks get the one extra item when the length does not
divide evenly (10 items on 3 ranks: 4, 3, 3)::

    shard_of(list(range(10)), rank=1, world_size=3, name="train")  # [4, 5, 6]

Why contiguous blocks: a block of a numpy array, a DataFrame or a torch ``Dataset`` is a view or
a cheap slice, never a copy of the data, and it keeps neighbouring rows (time series, files
written in order) together. Shuffle inside a shard with the ``DataLoader`` as usual.

Why sizes may differ by one: it keeps every item. With ``DistributedDataParallel`` every rank
must run the same number of steps, or a collective (the gradient all-reduce) waits forever for a
peer that has finished its epoch. Either drop the remainder: run, on every rank, the number of
full batches of the smallest shard, ``steps = (len(data) // world_size) // batch_size``, e.g.
``for batch in itertools.islice(loader, steps)`` (``DataLoader(..., drop_last=True)`` alone is
not enough when the shard sizes straddle a multiple of the batch size: 4 and 3 items in batches
of 2 give 2 and 1 steps). Or give the whole dataset to :func:`ftnb.torch.prepare_data_loader`,
whose ``DistributedSampler`` pads the ranks to equal sizes by repeating a few items.

Supported: numpy arrays (a view along axis 0), pandas DataFrames and Series (an ``.iloc`` slice
that keeps the index), CPU or GPU torch tensors (a view along dimension 0), map-style
``torch.utils.data.Dataset`` (a ``torch.utils.data.Subset``), ``list``, ``tuple`` and ``range``
(a slice of the same type), and any other object with ``__len__`` and ``__getitem__`` (a
read-only :class:`SequenceShard`). An :class:`~ftnb.objects.ObjectRef` from ``ftnb.put`` is
loaded with ``ftnb.get`` first. Streams (iterators, generators, ``IterableDataset``) are refused:
they have no length to split.

torch is never imported here: a torch object can only exist once torch is imported, so the
torch checks look it up in ``sys.modules``.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ..objects.describe import type_name
from ..objects.store import ObjectRef
from ..objects.store import get as get_object

__all__ = ["SequenceShard", "shard_bounds", "shard_of"]


def shard_bounds(length: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s contiguous block of ``length`` items split among
    ``world_size`` ranks; earlier ranks get the extra items.

    >>> [shard_bounds(10, rank, 3) for rank in range(3)]
    [(0, 4), (4, 7), (7, 10)]
    """
    _check_rank(rank, world_size)
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(
            f"shard_bounds(length={length!r}): length must be an int >= 0. Fix: pass len(data)."
        )
    base, extra = divmod(length, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_of(data: Any, rank: int, world_size: int, *, name: str) -> Any:
    """Rank ``rank``'s contiguous share of ``data``, the dataset ``name`` of
    ``TorchTrainer(datasets={name: data})``, in the natural type of ``data``.

    The shards of ranks ``0 .. world_size - 1`` are disjoint and cover ``data`` exactly once;
    their sizes differ by at most one (see the module docstring for what that means with DDP).

    >>> shard_of(list(range(5)), rank=0, world_size=2, name="train")
    [0, 1, 2]
    >>> shard_of(range(5), rank=1, world_size=2, name="train")
    range(3, 5)

    Raises:
        ValueError: ``rank`` or ``world_size`` is not an int with ``0 <= rank < world_size``.
        TypeError: ``data`` is a stream or has no length (an iterator, a generator, a
            ``torch.utils.data.IterableDataset``, a set, a dict, a string).
    """
    _check_rank(rank, world_size)
    if isinstance(data, ObjectRef):
        data = get_object(data)
    _refuse_unsplittable(data, name)
    length = _length(data, name)
    start, stop = shard_bounds(length, rank, world_size)

    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(data, numpy.ndarray):
        return data[start:stop]
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, (pandas.DataFrame, pandas.Series)):
        return data.iloc[start:stop]
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(data, torch.Tensor):
            return data[start:stop]
        if isinstance(data, torch.utils.data.Dataset):
            return torch.utils.data.Subset(data, range(start, stop))
    if isinstance(data, (list, tuple, range)):
        return data[start:stop]
    return SequenceShard(data, range(start, stop))


class SequenceShard:
    """A read-only view of some positions of a sequence-like object (anything with ``__len__``
    and integer ``__getitem__``): what :func:`shard_of` returns for types it has no natural
    slice for. Items are fetched from the underlying object on access, never copied.

    Supports ``len()``, iteration, integer indexing (negative indices count from the shard's
    end, out-of-range indices raise ``IndexError``) and slicing (another ``SequenceShard``).

    >>> shard = SequenceShard("abcdef", range(2, 5))
    >>> len(shard), shard[0], shard[-1], list(shard)
    (3, 'c', 'e', ['c', 'd', 'e'])
    """

    __slots__ = ("_base", "_positions")

    def __init__(self, base: Any, positions: range) -> None:
        if not isinstance(positions, range):
            raise TypeError(
                f"SequenceShard(positions={positions!r}) must be a range of positions in the "
                "underlying object. Fix: pass e.g. range(start, stop)."
            )
        self._base = base
        self._positions = positions

    @property
    def base(self) -> Any:
        """The underlying object that items are read from."""
        return self._base

    @property
    def positions(self) -> range:
        """The positions of this shard's items in :attr:`base`, in order."""
        return self._positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return SequenceShard(self._base, self._positions[index])
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"SequenceShard indices must be integers or slices, not "
                f"{type(index).__name__}: {index!r}."
            ) from None
        size = len(self._positions)
        if not -size <= position < size:
            raise IndexError(
                f"SequenceShard index {position} is out of range for a shard of {size} items."
            )
        return self._base[self._positions[position]]

    def __iter__(self) -> Iterator[Any]:
        base = self._base
        for position in self._positions:
            yield base[position]

    def __repr__(self) -> str:
        positions = self._positions
        return (
            f"SequenceShard({type_name(type(self._base))}, "
            f"positions {positions.start}..{positions.stop - 1 if positions else positions.start}"
            f", {len(positions)} items)"
        )


# --------------------------------------------------------------------------- checks


_FIX = (
    "Fix: give a map-style dataset (a torch.utils.data.Dataset with __len__ and __getitem__), "
    "a numpy array, a pandas DataFrame or a list; or shard it yourself inside "
    "train_loop_per_worker using ftnb.get_context().get_world_rank() and "
    ".get_world_size()."
)


def _check_rank(rank: Any, world_size: Any) -> None:
    """Raise a ValueError unless ``rank`` and ``world_size`` are ints with
    ``0 <= rank < world_size``."""
    for arg, value in (("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            # A ValueError like the range checks below: to the trainer, both are a bad rank.
            raise ValueError(  # noqa: TRY004
                f"{arg}={value!r} ({type(value).__name__}) must be an int. Fix: pass the "
                "rank's number and the group's size as ints, e.g. rank=0, world_size=2."
            )
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1. Fix: pass the number of ranks.")
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank={rank} is out of range for world_size={world_size}. Fix: pass a rank with "
            f"0 <= rank < {world_size}."
        )


def _where(name: str, data: Any) -> str:
    return f"TorchTrainer(datasets={{{name!r}: ...}}) got a {type_name(type(data))}"


def _refuse_unsplittable(data: Any, name: str) -> None:
    """Raise a TypeError naming dataset ``name`` if ``data`` is something that cannot be split
    into ranks' shards by position."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.utils.data.IterableDataset):
        raise TypeError(
            f"{_where(name, data)}, an IterableDataset: a stream cannot be split into shards "
            f"before it is read. {_FIX}"
        )
    if isinstance(data, Iterator):  # generators included
        raise TypeError(
            f"{_where(name, data)}, an iterator: it can be read only once and has no length "
            f"to split among ranks (a generator has to be consumed to be counted). {_FIX} For "
            "a generator, list(...) it first if it fits in memory."
        )
    if isinstance(data, (str, bytes, bytearray)):
        raise TypeError(
            f"{_where(name, data)} ({data[:60]!r}), which is text, not a dataset. Fix: if it is "
            "a path, load the data (e.g. pandas.read_csv(path)) and pass that, or pass the path "
            "in train_loop_config and read each rank's part inside train_loop_per_worker."
        )
    if isinstance(data, Mapping):
        raise TypeError(
            f"{_where(name, data)}, a mapping: its items are looked up by key, not by position, "
            "so it cannot be split into contiguous shards. Fix: for several datasets, give each "
            "its own key in datasets={...}; for records, pass a list of them or a pandas "
            "DataFrame."
        )
    cls = type(data)
    if not (hasattr(cls, "__len__") and hasattr(cls, "__getitem__")):
        missing = " and ".join(m for m in ("__len__", "__getitem__") if not hasattr(cls, m))
        raise TypeError(
            f"{_where(name, data)}, which has no {missing}: it cannot be split by position "
            f"among ranks. {_FIX}"
        )


def _length(data: Any, name: str) -> int:
    """``len(data)``, or a TypeError naming dataset ``name`` (a 0-d array has ``__len__`` but
    no length)."""
    try:
        return len(data)
    except TypeError as exc:
        raise TypeError(f"{_where(name, data)} whose len() fails ({exc}). {_FIX}") from None
