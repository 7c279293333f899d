"""``ftnb.torch``: make a model and a ``DataLoader`` data-parallel inside
``TorchTrainer``'s ``train_loop_per_worker``, like Ray Train's ``ray.train.torch``::

    import ftnb.torch

    def train_loop_per_worker(config):
        model = ftnb.torch.prepare_model(MyModel())            # DDP when there are 2+ ranks
        loader = ftnb.torch.prepare_data_loader(
            DataLoader(dataset, batch_size=64, shuffle=True))  # each rank: its share
        for epoch in range(config["epochs"]):
            loader.sampler.set_epoch(epoch)                    # a new shuffle every epoch
            for x, y in loader:                                # already on get_device()
                ...

Each rank runs in its own process in one ``torch.distributed`` process group that ftnb sets
up; a GPU rank sees exactly one GPU. Outside such a group (one rank, or plain Python) the
functions still work: the model is only moved to the device, the loader only moves batches.

Only users who train with torch import this module; ``import ftnb`` never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from .input_checks import short_repr

__all__ = ["DeviceDataLoader", "get_device", "prepare_data_loader", "prepare_model"]

_STRATEGIES = ("ddp", "fsdp", None)


def get_device() -> torch.device:
    """The device this rank trains on: ``cuda:<current device>`` when this process can use CUDA
    (ftnb gives each GPU rank exactly one visible GPU, so that is ``cuda:0``), else ``cpu``.

    >>> get_device()  # doctest: +SKIP
    device(type='cpu')
    """
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _world_size() -> int:
    """The size of the default ``torch.distributed`` group, 1 outside any group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this rank's device and, with 2+ ranks, wrap it for data parallelism.

    Args:
        model: the ``torch.nn.Module`` to train.
        move_to_device: ``True`` moves it to :func:`get_device`, a ``torch.device`` moves it
            there, ``False`` leaves it where it is.
        parallel_strategy: ``"ddp"`` wraps it in ``DistributedDataParallel`` (gradients are
            averaged over the ranks in ``backward()``), ``"fsdp"`` in
            ``FullyShardedDataParallel`` (parameters sharded over the ranks), ``None`` does not
            wrap it. Nothing is wrapped outside a ``torch.distributed`` group of 2+ ranks.
        parallel_strategy_kwargs: extra keyword arguments of the wrapper, e.g.
            ``{"find_unused_parameters": True}`` for DDP.

    Returns:
        The wrapped model (the original is its ``.module``), or ``model`` itself, moved.

    >>> model = prepare_model(torch.nn.Linear(4, 1))  # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"prepare_model(model=...) must be a torch.nn.Module; got {type(model).__name__}: "
            f"{short_repr(model)}. Fix: pass the model instance, e.g. "
            "prepare_model(MyModel()) (not the class, and not a model already wrapped in a "
            "function)."
        )
    if parallel_strategy not in _STRATEGIES:
        raise ValueError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) is not a strategy. Fix: "
            "pass 'ddp' (DistributedDataParallel), 'fsdp' (FullyShardedDataParallel) or None "
            "(no wrapping)."
        )
    if parallel_strategy_kwargs is not None and not isinstance(parallel_strategy_kwargs, dict):
        raise TypeError(
            f"prepare_model(parallel_strategy_kwargs={short_repr(parallel_strategy_kwargs)}) "
            "must be a dict of keyword arguments for the wrapper. Fix: pass e.g. "
            "{'find_unused_parameters': True}, or None."
        )
    device = _target_device(move_to_device, "prepare_model")
    if device is not None:
        model = model.to(device)
    if parallel_strategy is None or _world_size() < 2:
        return model
    kwargs = dict(parallel_strategy_kwargs or {})
    model_device = _device_of(model)
    if parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if model_device is not None and model_device.type == "cuda":
            kwargs.setdefault("device_ids", [model_device.index])
        return DistributedDataParallel(model, **kwargs)
    from torch.distributed.fsdp import FullyShardedDataParallel

    if model_device is not None:  # FSDP looks for an accelerator unless told the device
        kwargs.setdefault("device_id", model_device)
    return FullyShardedDataParallel(model, **kwargs)


def _target_device(move_to_device: Any, where: str) -> torch.device | None:
    """The device ``move_to_device`` asks for (``None``: do not move)."""
    if isinstance(move_to_device, torch.device):
        return move_to_device
    if isinstance(move_to_device, bool):
        return get_device() if move_to_device else None
    raise TypeError(
        f"{where}(move_to_device={short_repr(move_to_device)}) must be True, False or a "
        "torch.device. Fix: pass True to use ftnb.torch.get_device(), or False to keep it where "
        "it is."
    )


def _device_of(model: torch.nn.Module) -> torch.device | None:
    """The one device all of ``model``'s parameters and buffers are on (``None``: several, or
    a model without any)."""
    devices = {t.device for t in model.parameters()} | {t.device for t in model.buffers()}
    return devices.pop() if len(devices) == 1 else None


def prepare_data_loader(
    data_loader: DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
) -> DataLoader | DeviceDataLoader:
    """Give each rank its own share of ``data_loader``'s dataset, and move batches to the device.

    With 2+ ranks and ``add_dist_sampler``, a loader whose sampler is not already a
    ``DistributedSampler`` is rebuilt with the same arguments (batch size, workers, collate
    function, ``drop_last``, ...) and ``sampler=DistributedSampler(dataset, shuffle=...)``:
    shuffled (``shuffle=True``) if the original was, in order otherwise. Each rank then reads
    ``ceil(len(dataset) / world_size)`` samples, every ``world_size``-th one, so all ranks run
    the same number of steps (the sampler repeats a few samples when the length does not
    divide evenly). As with plain DDP, call ``loader.sampler.set_epoch(epoch)`` at the start of
    every epoch, or every epoch repeats the first one's order.

    A loader given an explicit ``batch_sampler`` is left alone (it decides which samples form a
    batch; shard them in it); so is a loader given a sampler other than the default sequential
    or random one: that raises, since replacing it would silently change the sampling.

    Args:
        data_loader: the ``torch.utils.data.DataLoader`` over the whole dataset.
        add_dist_sampler: ``False`` keeps the sampler (each rank then reads every sample).
        move_to_device: when :func:`get_device` is not the CPU, return a
            :class:`DeviceDataLoader` that moves every batch there (tensors in nested tuples,
            lists and dicts).

    >>> loader = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))  # doctest: +SKIP
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(
            f"prepare_data_loader(data_loader=...) must be a torch.utils.data.DataLoader; got "
            f"{type(data_loader).__name__}: {short_repr(data_loader)}. Fix: wrap the dataset "
            "first, e.g. prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))."
        )
    for arg, value in (("add_dist_sampler", add_dist_sampler), ("move_to_device", move_to_device)):
        if not isinstance(value, bool):
            raise TypeError(
                f"prepare_data_loader({arg}={short_repr(value)}) must be True or False. "
                f"Fix: pass {arg}=True or {arg}=False."
            )
    if add_dist_sampler and _world_size() > 1:
        data_loader = _with_distributed_sampler(data_loader)
    if move_to_device:
        device = get_device()
        if device.type != "cpu":
            return DeviceDataLoader(data_loader, device)
    return data_loader


# DataLoader arguments carried over to the rebuilt loader (those this torch version has).
_LOADER_ARGS = (
    "batch_size",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def _with_distributed_sampler(loader: DataLoader) -> DataLoader:
    """``loader`` rebuilt with a ``DistributedSampler``, or ``loader`` itself when it already
    has one or has its own batch sampler."""
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        return loader
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(
            f"prepare_data_loader(data_loader=...) reads a {type(loader.dataset).__name__}, an "
            "IterableDataset: a stream has no indices for a DistributedSampler to split among "
            "ranks. Fix: give each rank its part inside the dataset's __iter__ (using "
            "ftnb.get_context().get_world_rank() and .get_world_size()) and pass "
            "add_dist_sampler=False, or use a map-style Dataset."
        )
    if loader.batch_sampler is not None and loader.batch_size is None:
        return loader  # an explicit batch_sampler: the user decides what each rank reads
    if type(sampler) is RandomSampler and not sampler.replacement:
        shuffle = sampler.num_samples == len(sampler.data_source)
    else:
        shuffle = False
    if not shuffle and type(sampler) is not SequentialSampler:
        raise ValueError(
            f"prepare_data_loader(data_loader=...) has a {_sampler_name(sampler)}, which a "
            "DistributedSampler cannot reproduce: replacing it would silently change which "
            "samples are drawn. Fix: shard the samples among ranks in your sampler (e.g. with "
            "ftnb.get_context().get_world_rank() and .get_world_size()) and pass "
            "add_dist_sampler=False, or build the DataLoader with shuffle=True/False and no "
            "sampler."
        )
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS if hasattr(loader, name)}
    if not kwargs.get("num_workers"):
        kwargs.pop("prefetch_factor", None)  # DataLoader refuses it without workers
        kwargs.pop("persistent_workers", None)
    return DataLoader(
        loader.dataset, sampler=DistributedSampler(loader.dataset, shuffle=shuffle), **kwargs
    )


def _sampler_name(sampler: Any) -> str:
    if type(sampler) is RandomSampler:
        return "RandomSampler with replacement=True or num_samples"
    return f"sampler of type {type(sampler).__name__}"


class DeviceDataLoader:
    """A ``DataLoader`` whose batches arrive on ``device``: what :func:`prepare_data_loader`
    returns on a GPU rank. Tensors in a batch (also inside nested tuples, lists and dicts) are
    moved there; anything else is passed through.

    ``len()`` and every attribute of the wrapped loader (``.sampler``, ``.dataset``,
    ``.batch_size``, ...) work as on the loader itself.

    >>> loader = DeviceDataLoader(DataLoader(dataset, batch_size=8), torch.device("cuda", 0))  # doctest: +SKIP
    """

    def __init__(self, data_loader: DataLoader, device: torch.device) -> None:
        self.data_loader = data_loader
        self.device = device
        # Copies from pinned memory can overlap with compute; from pageable memory they cannot.
        self._non_blocking = bool(getattr(data_loader, "pin_memory", False))

    def __iter__(self) -> Iterator[Any]:
        for batch in self.data_loader:
            yield self._move(batch)

    def __len__(self) -> int:
        return len(self.data_loader)

    def __getattr__(self, name: str) -> Any:
        if name == "data_loader":  # not set yet (unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.data_loader, name)

    def __repr__(self) -> str:
        return f"DeviceDataLoader({self.data_loader!r}, device={self.device})"

    def _move(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=self._non_blocking)
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
            return type(batch)(*(self._move(item) for item in batch))
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._move(item) for item in batch)
        if isinstance(batch, Mapping):
            moved = {key: self._move(value) for key, value in batch.items()}
            try:
                return type(batch)(moved)
            except TypeError:  # a mapping type that cannot be built from a dict
                return moved
        return batch
