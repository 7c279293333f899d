"""Per-trial resource requests and a CPU/GPU pool: what a trial asks for, and what is free.

This module answers two questions for the scheduler:

* What did the user ask for?  :class:`TrialResources` parses the Ray Tune style
  ``resources_per_trial`` argument (``{"cpu": 2, "gpu": 0.5}``).
* Can a trial start now, and on which GPUs?  :class:`ResourcePool` hands out
  :class:`Allocation` objects whose :meth:`Allocation.env` is merged into the trial
  process's environment.

What this machine has (CPU and GPU detection, and a pool of all of it) is
:mod:`ftnb.execution.machine`'s: the executor contract names :class:`TrialResources`, and the
core may know it, but nothing of a machine.
"""

from __future__ import annotations

import difflib
import math
import numbers
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..wording import number, plural

__all__ = [
    "Allocation",
    "ResourcePool",
    "TrialResources",
    "check_fits",
    "check_group_fits",
    "concurrency_note",
    "max_concurrency",
]

# Float sums such as 0.1 * 10 land a hair above or below the exact value; every
# comparison against a capacity allows this much slack so such requests still fit.
_EPS = 1e-9

_ARG = "resources_per_trial"
_ALLOWED_KEYS = {"cpu": "cpu", "gpu": "gpu", "CPU": "cpu", "GPU": "gpu"}
_EXAMPLE = "{'cpu': 2, 'gpu': 0.5}"


# --------------------------------------------------------------------------- requests


def _check_amount(key: str, value: object, shown: str) -> float:
    """Validate one ``cpu``/``gpu`` amount; ``shown`` is the user's whole argument for messages."""
    # bool is an int subclass, but {"gpu": True} is almost certainly a mistake for 1.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{_ARG}={shown}: {key!r} must be a number, got {value!r} "
            f"({type(value).__name__}). Fix: pass a number, e.g. {_ARG}={{'{key}': 1}}."
        )
    amount = float(value)
    if not math.isfinite(amount):
        raise ValueError(
            f"{_ARG}={shown}: {key!r} must be a finite number, got {value!r}. "
            f"Fix: pass a finite amount, e.g. {_ARG}={{'{key}': 1}}."
        )
    if amount < 0:
        raise ValueError(
            f"{_ARG}={shown}: {key!r} must be >= 0, got {value!r}. "
            f"Fix: pass {key}=0 or a positive amount."
        )
    if key == "gpu" and amount > 1 and not amount.is_integer():
        lower, upper = math.floor(amount), math.ceil(amount)
        raise ValueError(
            f"{_ARG}={shown}: gpu={value!r} is not allowed: a fraction of a GPU is only for "
            f"several trials sharing one GPU, so gpu must be below 1 (e.g. 0.5) or a whole "
            f"number (e.g. 1 or 2). Fix: use gpu={lower} or gpu={upper}."
        )
    return amount


@dataclass(frozen=True)
class TrialResources:
    """What one trial needs: ``cpu`` cores (may be fractional) and ``gpu`` devices.

    ``gpu`` is either a whole number of GPUs given to the trial exclusively, or a
    fraction below 1 meaning the trial shares one GPU with other fractional trials
    (e.g. two trials with ``gpu=0.5`` run on the same device). ``cpu=0`` is allowed,
    as in Ray Tune, for trials that only wait on a GPU or on I/O.
    """

    cpu: float = 1.0
    gpu: float = 0.0

    def __post_init__(self) -> None:
        shown = f"TrialResources(cpu={self.cpu!r}, gpu={self.gpu!r})"
        # Normalize to float so TrialResources(cpu=2) and from_user({"cpu": 2.0}) are
        # interchangeable everywhere (equality, hashing, arithmetic in the pool).
        object.__setattr__(self, "cpu", _check_amount("cpu", self.cpu, shown))
        object.__setattr__(self, "gpu", _check_amount("gpu", self.gpu, shown))

    @classmethod
    def from_user(cls, value: TrialResources | dict[str, Any] | None) -> TrialResources:
        """Parse the ``resources_per_trial`` argument.

        Accepts ``None`` (1 CPU, no GPU), a dict with keys ``"cpu"`` and/or ``"gpu"``
        (Ray's ``"CPU"``/``"GPU"`` spelling also works; missing keys take the defaults),
        or a :class:`TrialResources`.

        Raises:
            TypeError: ``value`` has the wrong type, or an amount is not a number.
            ValueError: an unknown or duplicated key, a negative or infinite amount, or a
                ``gpu`` above 1 that is not a whole number.
        """
        if value is None:
            return cls()
        if isinstance(value, TrialResources):
            return value
        if not isinstance(value, dict):
            hint = ""
            if type(value).__name__ == "PlacementGroupFactory":
                hint = (" Ray's own PlacementGroupFactory is not ftnb's: use "
                        "ftnb.PlacementGroupFactory(bundles) (its bundles are summed).")
            raise TypeError(
                f"{_ARG} must be None, a dict like {_EXAMPLE}, or a TrialResources; got "
                f"{value!r} ({type(value).__name__}).{hint} Fix: pass e.g. {_ARG}={_EXAMPLE}."
            )
        shown = repr(value)
        amounts: dict[str, float] = {}
        for key, raw in value.items():
            canonical = _ALLOWED_KEYS.get(key) if isinstance(key, str) else None
            if canonical is None:
                close = difflib.get_close_matches(str(key), list(_ALLOWED_KEYS), n=1)
                guess = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"{_ARG}={shown} has unknown key {key!r}.{guess} Allowed keys: 'cpu', "
                    f"'gpu' (or 'CPU', 'GPU'). Fix: pass e.g. {_ARG}={_EXAMPLE}."
                )
            if canonical in amounts:
                raise ValueError(
                    f"{_ARG}={shown} gives {canonical!r} twice (as {canonical!r} and "
                    f"{canonical.upper()!r}). Fix: keep only one of them."
                )
            amounts[canonical] = _check_amount(canonical, raw, shown)
        return cls(**amounts)

    def as_dict(self) -> dict[str, float]:
        """Return ``{"cpu": ..., "gpu": ...}``, the form users pass in."""
        return {"cpu": self.cpu, "gpu": self.gpu}

    def _short_repr(self) -> str:
        return f"{{'cpu': {number(self.cpu)}, 'gpu': {number(self.gpu)}}}"


# ------------------------------------------------------------------------------- pool


@dataclass(frozen=True)
class Allocation:
    """Resources granted to one running trial by a :class:`ResourcePool`.

    ``gpu_fraction`` is the share of each GPU in ``gpu_ids`` that the trial holds:
    ``1.0`` for whole GPUs, the requested fraction for a shared GPU, ``0.0`` without GPU.
    ``alloc_id`` tells apart allocations that are otherwise equal (two trials with
    ``gpu=0.5`` on the same GPU), so that each can be released exactly once.
    """

    cpu: float
    gpu_ids: tuple[str, ...]
    gpu_fraction: float
    alloc_id: int = field(default=0)

    def env(self) -> dict[str, str]:
        """Environment variables to set in the trial process.

        ``CUDA_VISIBLE_DEVICES`` is always set, to an empty string when the trial got
        no GPU, so that a trial that asked for none cannot grab one. ``OMP_NUM_THREADS``
        (``max(1, int(cpu))``) keeps numeric libraries from starting one thread per
        machine core in every trial; it is only a default, and the caller should keep
        the user's own ``OMP_NUM_THREADS`` when one is already set.
        """
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids),
            "OMP_NUM_THREADS": str(max(1, int(self.cpu))),
        }


class ResourcePool:
    """CPUs and GPUs shared by the trials of one experiment on this machine.

    Whole-GPU requests get GPUs that nothing else uses; fractional requests
    (``0 < gpu < 1``) share one GPU whose summed fractions stay at most 1, packed onto
    the fullest GPU that still fits (best fit) so whole GPUs stay free for whole
    requests. Thread-safe.
    """

    def __init__(self, cpus: float, gpu_ids: list[str]) -> None:
        """Create a pool of ``cpus`` CPUs (may be fractional) and the GPUs ``gpu_ids``."""
        if isinstance(cpus, bool) or not isinstance(cpus, numbers.Real) or not cpus >= 0:
            raise ValueError(f"ResourcePool cpus must be a number >= 0, got {cpus!r}.")
        ids = [str(gpu_id) for gpu_id in gpu_ids]
        if len(set(ids)) != len(ids):
            raise ValueError(f"ResourcePool gpu_ids must be distinct, got {ids!r}.")
        self._cpus = float(cpus)
        self._gpu_ids: tuple[str, ...] = tuple(ids)
        self._free_cpu = self._cpus
        self._gpu_used: dict[str, float] = {gpu_id: 0.0 for gpu_id in ids}
        self._live: dict[int, Allocation] = {}
        self._next_id = 1
        self._lock = threading.Lock()

    @property
    def cpus(self) -> float:
        """Total CPUs in the pool."""
        return self._cpus

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        """All GPU ids in the pool, in the order they are handed out."""
        return self._gpu_ids

    @property
    def free_cpu(self) -> float:
        """CPUs not currently allocated."""
        with self._lock:
            return self._free_cpu

    def gpu_usage(self) -> dict[str, float]:
        """Allocated fraction (0.0 to 1.0) of each GPU, by id."""
        with self._lock:
            return dict(self._gpu_used)

    def __repr__(self) -> str:
        return (
            f"ResourcePool(cpus={number(self._cpus)}, gpu_ids={list(self._gpu_ids)!r}, "
            f"running={len(self._live)})"
        )

    def fits_ever(self, req: TrialResources) -> bool:
        """Whether ``req`` fits on this pool when nothing else is running."""
        return req.cpu <= self._cpus + _EPS and math.ceil(req.gpu) <= len(self._gpu_ids)

    def fits_now(self, req: TrialResources) -> bool:
        """Whether :meth:`try_acquire` would grant ``req`` now (it allocates nothing).

        Raises:
            ValueError: ``req`` can never fit on this pool (see :func:`check_fits`).
        """
        check_fits(req, self)
        with self._lock:
            return req.cpu <= self._free_cpu + _EPS and self._pick_gpus(req.gpu) is not None

    def try_acquire(self, req: TrialResources) -> Allocation | None:
        """Allocate ``req`` now, or return None if it does not fit until others release.

        Raises:
            ValueError: ``req`` can never fit on this pool (see :func:`check_fits`);
                returning None would make the caller wait forever.
        """
        check_fits(req, self)
        with self._lock:
            if req.cpu > self._free_cpu + _EPS:
                return None
            gpu_ids = self._pick_gpus(req.gpu)
            if gpu_ids is None:
                return None
            if req.gpu == 0:
                fraction = 0.0
            elif req.gpu < 1:
                fraction = req.gpu
            else:
                fraction = 1.0
            for gpu_id in gpu_ids:
                self._gpu_used[gpu_id] += fraction
            self._free_cpu -= req.cpu
            alloc = Allocation(
                cpu=req.cpu, gpu_ids=gpu_ids, gpu_fraction=fraction, alloc_id=self._next_id
            )
            self._next_id += 1
            self._live[alloc.alloc_id] = alloc
            return alloc

    def try_acquire_group(self, req: TrialResources, n: int) -> list[Allocation] | None:
        """``n`` allocations of ``req`` (one per rank of a group), all or none."""
        taken: list[Allocation] = []
        for _ in range(n):
            alloc = self.try_acquire(req)
            if alloc is None:
                for held in taken:
                    self.release(held)
                return None
            taken.append(alloc)
        return taken

    def fits_now_group(self, req: TrialResources, n: int) -> bool:
        """Whether ``n`` ranks of ``req`` could be allocated now."""
        if n == 1:
            return self.fits_now(req)
        taken = self.try_acquire_group(req, n)
        for alloc in taken or ():
            self.release(alloc)
        return taken is not None

    def _pick_gpus(self, gpu: float) -> tuple[str, ...] | None:
        """Choose GPUs for a request; caller holds the lock. None means not now."""
        if gpu == 0:
            return ()
        if gpu < 1:
            best: str | None = None
            for gpu_id in self._gpu_ids:
                used = self._gpu_used[gpu_id]
                if used + gpu <= 1.0 + _EPS and (best is None or used > self._gpu_used[best]):
                    best = gpu_id
            return None if best is None else (best,)
        idle = [gpu_id for gpu_id in self._gpu_ids if self._gpu_used[gpu_id] <= _EPS]
        wanted = int(gpu)
        return tuple(idle[:wanted]) if len(idle) >= wanted else None

    def release(self, alloc: Allocation) -> None:
        """Return an allocation's resources to the pool.

        Raises:
            ValueError: ``alloc`` was already released or did not come from this pool.
        """
        with self._lock:
            if self._live.get(alloc.alloc_id) != alloc:
                raise ValueError(
                    f"{alloc!r} is not held in this pool: it was already released or "
                    "came from another pool."
                )
            del self._live[alloc.alloc_id]
            self._free_cpu = min(self._cpus, self._free_cpu + alloc.cpu)
            for gpu_id in alloc.gpu_ids:
                used = self._gpu_used[gpu_id] - alloc.gpu_fraction
                # Snap float residue (0.1 + 0.2 - 0.1 - 0.2) back to an exactly idle GPU.
                self._gpu_used[gpu_id] = 0.0 if used <= _EPS else used


def check_fits(req: TrialResources, pool: ResourcePool) -> None:
    """Raise ``ValueError`` if ``req`` can never run on ``pool``, saying what to change."""
    if pool.fits_ever(req):
        return
    n_gpus = len(pool.gpu_ids)
    if n_gpus:
        gpus = f"{plural(n_gpus, 'GPU')} (ids: {', '.join(pool.gpu_ids)})"
    else:
        gpus = "no GPU"
    fixes: list[str] = []
    if req.cpu > pool.cpus + _EPS:
        fixes.append(
            f"ask for at most {plural(pool.cpus, 'CPU')} per trial, or set FTNB_NUM_CPUS "
            "if CPUs are not detected"
        )
    if math.ceil(req.gpu) > n_gpus:
        if n_gpus:
            ask = f"ask for at most {plural(n_gpus, 'GPU')} per trial"
        else:
            ask = "ask for gpu=0"
        fixes.append(f"{ask}, or set FTNB_NUM_GPUS / CUDA_VISIBLE_DEVICES if GPUs are not detected")
    raise ValueError(
        f"{_ARG}={req._short_repr()} can never be satisfied on this machine: it has "
        f"{plural(pool.cpus, 'CPU')} and {gpus}. Fix: {'; and '.join(fixes)}."
    )


def check_group_fits(req: TrialResources, n: int, pool: ResourcePool) -> None:
    """Raise ``ValueError`` if a group of ``n`` ranks, each asking for ``req``, can never run on
    ``pool`` (every rank at once), saying what to change."""
    if n == 1:
        check_fits(req, pool)
        return
    empty = ResourcePool(pool.cpus, list(pool.gpu_ids))
    if empty.try_acquire_group(req, n) is not None:
        return
    gpus = plural(len(pool.gpu_ids), "GPU")
    raise ValueError(
        f"ScalingConfig(num_workers={n}, resources_per_worker={req._short_repr()}) needs "
        f"{number(req.cpu * n)} CPUs and {number(math.ceil(req.gpu) * n)} GPUs at once, but this "
        f"machine has {plural(pool.cpus, 'CPU')} and {gpus}. Fix: fewer workers, or fewer CPUs "
        "per worker (resources_per_worker={'CPU': 0.5} lets ranks share cores), or set "
        "FTNB_NUM_CPUS / FTNB_NUM_GPUS if they are not detected."
    )


def max_concurrency(req: TrialResources, pool: ResourcePool) -> int:
    """How many trials of ``req`` can run at once on ``pool`` when it is empty.

    Returns 0 if ``req`` never fits, and ``sys.maxsize`` if it asks for nothing
    (``cpu=0, gpu=0``); callers should cap that with their own concurrency limit.
    """
    if not pool.fits_ever(req):
        return 0
    bounds: list[int] = []
    if req.cpu > 0:
        bounds.append(math.floor(pool.cpus / req.cpu + _EPS))
    n_gpus = len(pool.gpu_ids)
    if 0 < req.gpu < 1:
        bounds.append(n_gpus * math.floor(1.0 / req.gpu + _EPS))
    elif req.gpu >= 1:
        bounds.append(n_gpus // int(req.gpu))
    return min(bounds) if bounds else sys.maxsize


def concurrency_note(asked: Optional[int], trials: int, req: TrialResources, num_workers: int,
                     cpus: float, gpu_ids: Sequence[str]) -> str:
    """One line saying that fewer trials than ``asked`` (``max_concurrent_trials``) run at once
    because ``trials`` trials of ``num_workers`` ranks asking for ``req`` each fit only so
    many times on a machine of ``cpus`` CPUs and GPUs ``gpu_ids``, and how to run more; "" when
    as many as asked (or as there are trials) fit."""
    if not asked or trials <= 1:
        return ""
    pool = ResourcePool(cpus, list(gpu_ids))
    whole = TrialResources(cpu=req.cpu * num_workers,
                           gpu=req.gpu * num_workers if req.gpu >= 1 else req.gpu)
    fits = max_concurrency(whole, pool)
    if fits <= 0 or fits >= min(asked, trials):
        return ""
    rank = f"a group of {num_workers} ranks of " if num_workers > 1 else ""
    gpu_bound = req.gpu > 0 and (req.cpu == 0 or len(gpu_ids) / max(whole.gpu, _EPS)
                                 < cpus / max(whole.cpu, _EPS))
    if gpu_bound:
        asks = f"{plural(req.gpu, 'GPU')}"
        has = plural(len(gpu_ids), "GPU")
        fix = ("fewer GPUs per trial (resources_per_trial={'gpu': 0.5} or --gpus-per-trial "
               "0.5 lets two trials share a GPU), or set FTNB_NUM_GPUS if GPUs are not detected")
    else:
        asks = f"{plural(req.cpu, 'CPU')}"
        has = plural(cpus, "CPU")
        fix = ("fewer CPUs per trial (resources_per_trial={'cpu': 0.5} or --cpus-per-trial "
               "0.5), or set FTNB_NUM_CPUS if CPUs are not detected")
    if num_workers > 1:
        fix = ("fewer CPUs per rank (ScalingConfig(resources_per_worker={'CPU': 0.5})), or "
               "fewer ranks" if not gpu_bound else "fewer ranks per trial")
    return (f"ftnb: only {fits} trials run at once, not the {min(asked, trials)} asked for "
            f"(max_concurrent_trials, --concurrency): each trial asks for {rank}{asks}"
            f"{' each' if rank else ''}, and this machine has {has}. To run more at once, ask "
            f"for {fix}.")
