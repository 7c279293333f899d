"""Per-trial resource requests, machine detection, and a CPU/GPU pool.

This module answers three questions for the scheduler:

* What did the user ask for?  :class:`TrialResources` parses the Ray Tune style
  ``resources_per_trial`` argument (``{"cpu": 2, "gpu": 0.5}``).
* What does this machine have?  :func:`detect_cpus` and :func:`detect_gpus` look at
  CPU affinity, cgroup quotas, ``CUDA_VISIBLE_DEVICES`` and NVML -- without importing
  torch, so that ``import ftnb`` stays fast and works on machines without CUDA.
* Can a trial start now, and on which GPUs?  :class:`ResourcePool` hands out
  :class:`Allocation` objects whose :meth:`Allocation.env` is merged into the trial
  process's environment.

Environment variables
---------------------
``FTNB_NUM_CPUS``
    An integer >= 1. Overrides CPU detection, e.g. to leave cores free for the notebook.
``FTNB_NUM_GPUS``
    An integer >= 0. Overrides GPU detection. ``0`` hides all GPUs from trials. With
    ``N > 0`` the GPU ids are the first ``N`` entries of ``CUDA_VISIBLE_DEVICES`` when
    that variable lists at least ``N`` devices (so limiting never remaps trials onto
    GPUs this process was not given), and ``"0"`` .. ``"N-1"`` otherwise (which lets
    tests pretend a CPU-only machine has GPUs).
``CUDA_VISIBLE_DEVICES``
    When set (and ``FTNB_NUM_GPUS`` is not), its entries are the GPUs trials may use.
"""

from __future__ import annotations

import ctypes
import difflib
import functools
import math
import numbers
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..wording import number, plural

__all__ = [
    "Allocation",
    "ResourcePool",
    "TrialResources",
    "check_fits",
    "clear_detection_cache",
    "detect_cpus",
    "detect_gpus",
    "max_concurrency",
]

# Float sums such as 0.1 * 10 land a hair above or below the exact value; every
# comparison against a capacity allows this much slack so such requests still fit.
_EPS = 1e-9

_ARG = "resources_per_trial"
_ALLOWED_KEYS = {"cpu": "cpu", "gpu": "gpu", "CPU": "cpu", "GPU": "gpu"}
_EXAMPLE = "{'cpu': 2, 'gpu': 0.5}"

# Values CUDA and batch systems put in CUDA_VISIBLE_DEVICES to mean "no GPU";
# Slurm/HTCondor write "NoDevFiles" when a job was granted none.
_NO_DEVICE_MARKERS = frozenset({"-1", "NoDevFiles"})

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_DEV_DIR = Path("/dev")
_DEV_GPU_RE = re.compile(r"nvidia[0-9]+")
_NVML_LIB = "libnvidia-ml.so.1"




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
                hint = " Placement groups are a Ray cluster feature that ftnb does not support."
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


# -------------------------------------------------------------------------- detection


def _env_int(name: str, minimum: int) -> int | None:
    """Read an integer override from the environment; None when unset or blank."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        number = int(raw.strip())
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise ValueError(
            f"environment variable {name}={raw!r} must be an integer >= {minimum}. "
            f"Fix: set it to e.g. {name}={max(minimum, 1)}, or unset it to auto-detect."
        )
    return number


def _read_cpu_max(path: Path) -> int | None:
    """Parse one cgroup v2 ``cpu.max`` file ("QUOTA PERIOD" or "max PERIOD")."""
    try:
        parts = path.read_text().split()
    except OSError:
        return None
    if len(parts) < 1 or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _cgroup_cpu_limit(
    root: Path = _CGROUP_ROOT, proc_cgroup: Path = _PROC_SELF_CGROUP
) -> int | None:
    """The tightest cgroup v2 CPU quota on this process's cgroup or its ancestors.

    Inside a container the namespace root (``/sys/fs/cgroup/cpu.max``) carries the
    container's limit; on a host the process's own cgroup (from ``/proc/self/cgroup``)
    or one of its parents may, so all of them are checked.
    """
    candidates = [root / "cpu.max"]
    try:
        for line in proc_cgroup.read_text().splitlines():
            # cgroup v2 has a single "0::/path" line; v1 controllers are ignored here.
            if line.startswith("0::"):
                rel = Path(line[3:].strip().lstrip("/"))
                while rel.parts:
                    candidates.append(root / rel / "cpu.max")
                    rel = rel.parent
                break
    except OSError:
        pass
    limits = [limit for limit in map(_read_cpu_max, candidates) if limit is not None]
    return min(limits) if limits else None


def detect_cpus() -> int:
    """Number of CPUs this process may use (at least 1).

    ``FTNB_NUM_CPUS`` (an integer >= 1) overrides detection. Otherwise this is the size
    of the CPU affinity mask (``os.sched_getaffinity``, which respects ``taskset`` and
    Slurm/cpuset pinning), further limited by a cgroup v2 CPU quota (``cpu.max``, as set
    by ``docker --cpus`` or Kubernetes limits, rounded up), falling back to
    ``os.cpu_count()`` where affinity is not available.
    """
    override = _env_int("FTNB_NUM_CPUS", minimum=1)
    if override is not None:
        return override
    count: int | None = None
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            count = len(getaffinity(0))
        except OSError:
            count = None
    if not count:
        count = os.cpu_count() or 1
    quota = _cgroup_cpu_limit()
    if quota is not None:
        count = min(count, quota)
    return max(1, count)


def _parse_cuda_visible_devices(raw: str) -> list[str]:
    """Entries of ``CUDA_VISIBLE_DEVICES`` that CUDA would actually expose."""
    ids: list[str] = []
    for entry in raw.split(","):
        entry = entry.strip()
        # CUDA ignores everything from the first invalid entry on, so "0,-1,1" is just "0".
        if not entry or entry in _NO_DEVICE_MARKERS or entry.startswith("-"):
            break
        ids.append(entry)
    return ids


def _nvml_gpu_count() -> int | None:
    """GPU count from the NVIDIA driver's NVML library, or None if unavailable."""
    try:
        lib = ctypes.CDLL(_NVML_LIB)
    except OSError:
        return None
    try:
        if lib.nvmlInit_v2() != 0:
            return None
        try:
            count = ctypes.c_uint(0)
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return None
            return int(count.value)
        finally:
            lib.nvmlShutdown()
    except (AttributeError, OSError):
        # An old or broken driver may lack the _v2 symbols; fall through to /dev.
        return None


def _dev_gpu_count(dev: Path = _DEV_DIR) -> int | None:
    """Number of ``/dev/nvidiaN`` device files, or None if there are none."""
    try:
        names = [p.name for p in dev.iterdir()]
    except OSError:
        return None
    count = sum(1 for name in names if _DEV_GPU_RE.fullmatch(name))
    return count or None


@functools.cache
def _probe_gpus() -> tuple[str, ...]:
    """Hardware probe (NVML, then /dev); cached because loading NVML takes ~100 ms."""
    count = _nvml_gpu_count()
    if count is None:
        count = _dev_gpu_count()
    # CUDA numbers the devices a process can see from 0, whatever the physical ids are.
    return tuple(str(i) for i in range(count or 0))


def clear_detection_cache() -> None:
    """Forget the cached hardware GPU probe, so the next :func:`detect_gpus` probes again."""
    _probe_gpus.cache_clear()


def detect_gpus() -> list[str]:
    """GPU ids this process may hand to trials, as ``CUDA_VISIBLE_DEVICES`` entries.

    Does not import torch. In order of precedence:

    1. ``FTNB_NUM_GPUS=N``: ``N`` GPUs (see the module docstring for which ids).
    2. ``CUDA_VISIBLE_DEVICES``: its entries; empty, ``-1`` or ``NoDevFiles`` mean none.
    3. NVML (``libnvidia-ml.so.1`` through ctypes): ``"0"`` .. ``"count-1"``.
    4. The number of ``/dev/nvidiaN`` device files.
    5. No GPUs.

    The environment is read on every call (so setting a variable in a notebook takes
    effect); only the NVML/``/dev`` probe is cached per process, see
    :func:`clear_detection_cache`.
    """
    visible_raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = None if visible_raw is None else _parse_cuda_visible_devices(visible_raw)
    limit = _env_int("FTNB_NUM_GPUS", minimum=0)
    if limit is not None:
        if visible is not None and len(visible) >= limit:
            return visible[:limit]
        return [str(i) for i in range(limit)]
    if visible is not None:
        return visible
    return list(_probe_gpus())


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

    @classmethod
    def from_machine(cls) -> ResourcePool:
        """A pool of everything :func:`detect_cpus` and :func:`detect_gpus` report."""
        return cls(detect_cpus(), detect_gpus())

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
