"""What this machine has: the CPUs and GPUs this process may hand to trials, found without
importing torch (so that ``import ftnb`` stays fast and works on machines without CUDA), and a
:class:`~ftnb.execution.resources.ResourcePool` of all of them (:func:`pool_of_this_machine`).

CPUs: the CPU affinity mask, limited by a cgroup v2 quota. GPUs: ``CUDA_VISIBLE_DEVICES``, else
NVML (through ctypes), else the ``/dev/nvidiaN`` device files.

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
import functools
import math
import os
import re
from pathlib import Path

from .resources import ResourcePool

__all__ = [
    "clear_detection_cache",
    "detect_cpus",
    "detect_gpus",
    "pool_of_this_machine",
]

# Values CUDA and batch systems put in CUDA_VISIBLE_DEVICES to mean "no GPU";
# Slurm/HTCondor write "NoDevFiles" when a job was granted none.
_NO_DEVICE_MARKERS = frozenset({"-1", "NoDevFiles"})

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_SELF_CGROUP = Path("/proc/self/cgroup")
_DEV_DIR = Path("/dev")
_DEV_GPU_RE = re.compile(r"nvidia[0-9]+")
_NVML_LIB = "libnvidia-ml.so.1"


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



def pool_of_this_machine() -> ResourcePool:
    """A pool of everything :func:`detect_cpus` and :func:`detect_gpus` report."""
    return ResourcePool(detect_cpus(), detect_gpus())
