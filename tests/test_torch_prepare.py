"""``ftnb.torch``: ``get_device``, ``prepare_model``, ``prepare_data_loader``.

The data-parallel behaviour runs in a real ``torch.distributed`` group: two spawned processes
join a gloo group through a ``TCPStore`` that this (pytest) process serves on a free loopback
port, run every check once, and send their observations back through a queue; the tests then
compare the ranks' observations. Single-process behaviour (world size 1, bad input, moving
batches) runs here directly.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    WeightedRandomSampler,
)

import ftnb.torch as ftorch

WORLD_SIZE = 2
_GROUP_TIMEOUT_S = 60.0  # every rank's result must arrive within this


# =========================================================================== in each rank


class Stream(IterableDataset):
    """A stream of numbers: no indices for a DistributedSampler."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


def collate_as_list(batch: list[Any]) -> list[Any]:
    """A collate function the rebuilt loader must keep: batches stay plain lists."""
    return list(batch)


def _samples(loader: Any) -> list[int]:
    return [int(item) for batch in loader for item in batch]


def _error(call: Any) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - any error is an observation to compare
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _checks(rank: int) -> dict[str, Any]:
    """Everything a rank observes; the tests compare the ranks' answers."""
    out: dict[str, Any] = {"world_size": dist.get_world_size()}

    # DDP: rank 0's parameters are broadcast, gradients are averaged in backward().
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1, bias=False)
    out["weight_before"] = model.weight.detach().flatten().tolist()
    wrapped = ftorch.prepare_model(model)
    out["ddp_type"] = type(wrapped).__name__
    out["ddp_module_is_model"] = isinstance(wrapped, DistributedDataParallel) and (
        wrapped.module is model
    )
    out["weight_after"] = model.weight.detach().flatten().tolist()
    x = torch.full((2, 4), float(rank + 1))  # local gradient: 2 * (rank + 1) per weight
    wrapped(x).sum().backward()
    out["grad"] = model.weight.grad.flatten().tolist()

    out["none_type"] = type(
        ftorch.prepare_model(torch.nn.Linear(2, 1), parallel_strategy=None)
    ).__name__
    fsdp = ftorch.prepare_model(torch.nn.Linear(4, 2), parallel_strategy="fsdp")
    out["fsdp_type"] = type(fsdp).__name__
    fsdp(torch.ones(3, 4)).sum().backward()  # runs a sharded forward and backward

    # A shuffled loader: a DistributedSampler with shuffle=True, arguments kept.
    shuffled = ftorch.prepare_data_loader(
        DataLoader(list(range(10)), batch_size=2, shuffle=True, collate_fn=collate_as_list)
    )
    out["shuffled_sampler"] = type(shuffled.sampler).__name__
    out["shuffled_shuffle"] = shuffled.sampler.shuffle
    out["shuffled_kept"] = (shuffled.batch_size, shuffled.collate_fn is collate_as_list)
    out["shuffled_len"] = len(shuffled)
    shuffled.sampler.set_epoch(0)
    out["epoch0"] = _samples(shuffled)
    shuffled.sampler.set_epoch(1)
    out["epoch1"] = _samples(shuffled)

    in_order = ftorch.prepare_data_loader(DataLoader(list(range(10)), batch_size=3))
    out["in_order_shuffle"] = in_order.sampler.shuffle
    out["in_order"] = _samples(in_order)

    # 11 samples: padded to 6 per rank, so both ranks run the same number of steps.
    uneven = ftorch.prepare_data_loader(DataLoader(list(range(11)), batch_size=4, drop_last=True))
    out["uneven"] = (len(uneven), _samples(uneven), uneven.drop_last)

    # Worker arguments carried over (checked without starting workers).
    workers = ftorch.prepare_data_loader(
        DataLoader(
            list(range(10)),
            batch_size=2,
            num_workers=1,
            prefetch_factor=3,
            persistent_workers=True,
            timeout=7.0,
        )
    )
    out["workers"] = (
        workers.num_workers,
        workers.prefetch_factor,
        workers.persistent_workers,
        workers.timeout,
    )

    # Left alone: an explicit batch_sampler, a DistributedSampler already, add_dist_sampler=False.
    batch_sampler = DataLoader(
        list(range(10)),
        batch_sampler=BatchSampler(SequentialSampler(range(10)), batch_size=2, drop_last=False),
    )
    already = DataLoader(list(range(10)), sampler=DistributedSampler(list(range(10))))
    plain = DataLoader(list(range(10)), batch_size=2)
    out["left_alone"] = [
        ftorch.prepare_data_loader(batch_sampler) is batch_sampler,
        ftorch.prepare_data_loader(already) is already,
        ftorch.prepare_data_loader(plain, add_dist_sampler=False) is plain,
    ]

    # Refused: a stream, a sampler a DistributedSampler cannot reproduce.
    out["stream_error"] = _error(lambda: ftorch.prepare_data_loader(DataLoader(Stream())))
    weighted = DataLoader(
        list(range(4)), sampler=WeightedRandomSampler([0.1, 0.2, 0.3, 0.4], num_samples=4)
    )
    out["weighted_error"] = _error(lambda: ftorch.prepare_data_loader(weighted))
    return out


def run_rank(rank: int, port: int, results: Any) -> None:
    """A spawned rank: join the gloo group on ``port``, run :func:`_checks`, put
    ``(rank, observations, traceback or None)`` on ``results``."""
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, WORLD_SIZE, is_master=False, timeout=timedelta(seconds=30)
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=30)
        )
        try:
            observed = _checks(rank)
        finally:
            dist.destroy_process_group()
        results.put((rank, observed, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, None, traceback.format_exc()))


# =========================================================================== in pytest


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    """The observations of ranks 0 and 1 of one real 2-process gloo group."""
    store = dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [
        context.Process(target=run_rank, args=(rank, store.port, results), daemon=True)
        for rank in range(WORLD_SIZE)
    ]
    for proc in procs:
        proc.start()
    try:
        observed: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + _GROUP_TIMEOUT_S
        while len(observed) < WORLD_SIZE:
            try:
                rank, out, error = results.get(timeout=0.5)
            except queue.Empty:
                missing = [r for r in range(WORLD_SIZE) if r not in observed]
                dead = [r for r in missing if procs[r].exitcode is not None]
                if dead:
                    # A rank that exited cleanly put its result before: give the queue a moment.
                    try:
                        rank, out, error = results.get(timeout=2.0)
                    except queue.Empty:
                        codes = {r: procs[r].exitcode for r in dead}
                        pytest.fail(f"rank(s) {dead} exited without a result: exit codes {codes}")
                elif time.monotonic() > deadline:
                    pytest.fail(f"no result from rank(s) {missing} in {_GROUP_TIMEOUT_S:.0f} s")
                else:
                    continue
            if error is not None:
                pytest.fail(f"rank {rank} failed:\n{error}")
            observed[rank] = out
        return observed
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        results.close()
        del store


@pytest.mark.slow
def test_prepare_model_wraps_in_ddp_and_averages_gradients(ranks: dict[int, dict]) -> None:
    r0, r1 = ranks[0], ranks[1]
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["ddp_type"] == r1["ddp_type"] == "DistributedDataParallel"
    assert r0["ddp_module_is_model"] and r1["ddp_module_is_model"]
    # Different initial weights (seeded by rank); DDP starts both from rank 0's.
    assert r0["weight_before"] != r1["weight_before"]
    assert r0["weight_after"] == r1["weight_after"] == r0["weight_before"]
    # Local gradients 2.0 and 4.0 per weight; both ranks hold their average.
    assert r0["grad"] == r1["grad"] == [3.0] * 4


@pytest.mark.slow
def test_prepare_model_strategies_none_and_fsdp(ranks: dict[int, dict]) -> None:
    for observed in ranks.values():
        assert observed["none_type"] == "Linear"
        assert observed["fsdp_type"] == "FullyShardedDataParallel"


@pytest.mark.slow
def test_shuffled_loader_gives_each_rank_a_disjoint_shuffled_half(
    ranks: dict[int, dict],
) -> None:
    r0, r1 = ranks[0], ranks[1]
    for observed in (r0, r1):
        assert observed["shuffled_sampler"] == "DistributedSampler"
        assert observed["shuffled_shuffle"] is True
        assert observed["shuffled_kept"] == (2, True)  # batch size, collate_fn
        assert observed["shuffled_len"] == 3  # ceil(5 / 2) batches
        assert len(observed["epoch0"]) == len(observed["epoch1"]) == 5
    for epoch in ("epoch0", "epoch1"):
        assert set(r0[epoch]).isdisjoint(r1[epoch])
        assert sorted(r0[epoch] + r1[epoch]) == list(range(10))
    # A shuffle, and set_epoch gives a new one (the seed is fixed, so this is deterministic).
    assert r0["epoch0"] + r1["epoch0"] != list(range(10))
    assert r0["epoch0"] != sorted(r0["epoch0"]) or r1["epoch0"] != sorted(r1["epoch0"])
    assert (r0["epoch0"], r1["epoch0"]) != (r0["epoch1"], r1["epoch1"])


@pytest.mark.slow
def test_unshuffled_loader_stays_in_order(ranks: dict[int, dict]) -> None:
    assert ranks[0]["in_order_shuffle"] is False and ranks[1]["in_order_shuffle"] is False
    assert ranks[0]["in_order"] == [0, 2, 4, 6, 8]
    assert ranks[1]["in_order"] == [1, 3, 5, 7, 9]


@pytest.mark.slow
def test_uneven_dataset_is_padded_so_ranks_run_the_same_steps(ranks: dict[int, dict]) -> None:
    (len0, samples0, drop0), (len1, samples1, drop1) = ranks[0]["uneven"], ranks[1]["uneven"]
    assert len0 == len1 == 1 and drop0 is drop1 is True  # 6 samples each, batches of 4
    assert len(samples0) == len(samples1) == 4


@pytest.mark.slow
def test_loader_worker_arguments_are_kept(ranks: dict[int, dict]) -> None:
    for observed in ranks.values():
        assert tuple(observed["workers"]) == (1, 3, True, 7.0)


@pytest.mark.slow
def test_loaders_that_must_not_change_are_left_alone(ranks: dict[int, dict]) -> None:
    for observed in ranks.values():
        assert observed["left_alone"] == [True, True, True]


@pytest.mark.slow
def test_streams_and_custom_samplers_are_refused_with_a_fix(ranks: dict[int, dict]) -> None:
    for observed in ranks.values():
        stream = observed["stream_error"]
        assert stream.startswith("TypeError:") and "IterableDataset" in stream
        assert "Fix:" in stream and "add_dist_sampler=False" in stream
        weighted = observed["weighted_error"]
        assert weighted.startswith("ValueError:") and "WeightedRandomSampler" in weighted
        assert "Fix:" in weighted and "add_dist_sampler=False" in weighted


# --------------------------------------------------------------------------- world size 1


def test_outside_a_group_nothing_is_wrapped() -> None:
    assert not dist.is_initialized()
    model = torch.nn.Linear(3, 1)
    prepared = ftorch.prepare_model(model)
    assert prepared is model  # .to() of a model already there returns it
    assert prepared.weight.device == ftorch.get_device()
    loader = DataLoader(list(range(6)), batch_size=2, shuffle=True)
    if ftorch.get_device().type == "cpu":
        assert ftorch.prepare_data_loader(loader) is loader
    assert ftorch.prepare_data_loader(loader, move_to_device=False) is loader


def test_get_device() -> None:
    device = ftorch.get_device()
    if torch.cuda.is_available():
        assert device == torch.device("cuda", torch.cuda.current_device())
    else:
        assert device == torch.device("cpu")


def test_move_to_device_false_or_a_device() -> None:
    model = torch.nn.Linear(3, 1)
    assert ftorch.prepare_model(model, move_to_device=False) is model
    on_meta = ftorch.prepare_model(torch.nn.Linear(3, 1), move_to_device=torch.device("meta"))
    assert on_meta.weight.device.type == "meta"


class Pair(NamedTuple):
    features: torch.Tensor
    label: str


def test_device_loader_moves_nested_batches_and_keeps_the_loader_interface() -> None:
    # The meta device stands in for a GPU: moving a tensor there is real, and needs none.
    items = [{"x": torch.ones(2), "pair": Pair(torch.zeros(1), "a"), "id": i} for i in range(5)]
    loader = DataLoader(items, batch_size=2, collate_fn=list)
    moved = ftorch.DeviceDataLoader(loader, torch.device("meta"))
    assert len(moved) == 3
    assert moved.sampler is loader.sampler and moved.batch_size == 2
    batches = list(moved)
    assert len(batches) == 3 and isinstance(batches[0], list)
    first = batches[0][0]
    assert first["x"].device.type == "meta"
    assert isinstance(first["pair"], Pair) and first["pair"].features.device.type == "meta"
    assert first["pair"].label == "a" and first["id"] == 0
    assert "meta" in repr(moved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_model_and_batches_arrive_on_it() -> None:
    device = ftorch.get_device()
    assert device.type == "cuda"
    model = ftorch.prepare_model(torch.nn.Linear(3, 1))
    assert model.weight.device == device
    loader = ftorch.prepare_data_loader(DataLoader(torch.arange(6.0), batch_size=2))
    assert isinstance(loader, ftorch.DeviceDataLoader) and len(loader) == 3
    assert all(batch.device == device for batch in loader)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda: ftorch.prepare_model(torch.nn.Linear),
            TypeError,
            (
                r"prepare_model\(model=\.\.\.\) must be a torch.nn.Module; got type.*Fix: pass "
                r"the model instance"
            ),
        ),
        (
            lambda: ftorch.prepare_model("resnet"),
            TypeError,
            r"must be a torch.nn.Module; got str: 'resnet'",
        ),
        (
            lambda: ftorch.prepare_model(torch.nn.Linear(2, 1), parallel_strategy="zero"),
            ValueError,
            r"parallel_strategy='zero'\) is not a strategy\. Fix: pass 'ddp'",
        ),
        (
            lambda: ftorch.prepare_model(torch.nn.Linear(2, 1), parallel_strategy_kwargs=[1]),
            TypeError,
            r"parallel_strategy_kwargs=\[1\]\) must be a dict",
        ),
        (
            lambda: ftorch.prepare_model(torch.nn.Linear(2, 1), move_to_device="cuda"),
            TypeError,
            r"move_to_device='cuda'\) must be True, False or a torch.device\. Fix:",
        ),
        (
            lambda: ftorch.prepare_data_loader([1, 2, 3]),
            TypeError,
            (
                r"data_loader=\.\.\.\) must be a torch.utils.data.DataLoader; got list: "
                r"\[1, 2, 3\].*Fix: wrap the dataset first"
            ),
        ),
        (
            lambda: ftorch.prepare_data_loader(DataLoader([1]), add_dist_sampler="yes"),
            TypeError,
            r"add_dist_sampler='yes'\) must be True or False",
        ),
    ],
    ids=["model_class", "model_str", "strategy", "kwargs", "move_to_device", "loader", "flag"],
)
def test_bad_input_names_the_argument_the_value_and_the_fix(
    call: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()
