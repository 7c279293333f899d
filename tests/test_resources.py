"""Tests for ftnb.execution.resources (parsing, the CPU/GPU pool) and ftnb.execution.machine
(detection)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftnb.execution import machine
from ftnb.execution.machine import (
    clear_detection_cache,
    detect_cpus,
    detect_gpus,
    pool_of_this_machine,
)
from ftnb.execution.resources import (
    concurrency_note,
    Allocation,
    ResourcePool,
    TrialResources,
    check_fits,
    max_concurrency,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts without overrides and with an empty hardware-probe cache."""
    for name in ("FTNB_NUM_CPUS", "FTNB_NUM_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    clear_detection_cache()
    yield
    clear_detection_cache()


# ------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("value", "cpu", "gpu"),
    [
        (None, 1.0, 0.0),
        ({}, 1.0, 0.0),
        ({"cpu": 2}, 2.0, 0.0),
        ({"gpu": 1}, 1.0, 1.0),
        ({"cpu": 0.5, "gpu": 0.25}, 0.5, 0.25),
        ({"CPU": 4, "GPU": 2}, 4.0, 2.0),
        ({"cpu": 0}, 0.0, 0.0),
        ({"cpu": 0, "gpu": 0}, 0.0, 0.0),
        ({"gpu": 3.0}, 1.0, 3.0),
    ],
)
def test_from_user_accepts(value: object, cpu: float, gpu: float) -> None:
    res = TrialResources.from_user(value)  # type: ignore[arg-type]
    assert (res.cpu, res.gpu) == (cpu, gpu)
    assert isinstance(res.cpu, float) and isinstance(res.gpu, float)


def test_from_user_passes_trial_resources_through() -> None:
    res = TrialResources(cpu=2, gpu=0.5)
    assert TrialResources.from_user(res) is res
    assert res == TrialResources.from_user({"cpu": 2.0, "gpu": 0.5})
    assert res.as_dict() == {"cpu": 2.0, "gpu": 0.5}


def test_trial_resources_is_frozen() -> None:
    res = TrialResources()
    with pytest.raises(AttributeError):
        res.cpu = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "exc", "fragments"),
    [
        ({"cpus": 2}, ValueError, ["unknown key 'cpus'", "Did you mean 'cpu'", "'cpu', 'gpu'"]),
        ({"memory": 10}, ValueError, ["unknown key 'memory'", "Allowed keys: 'cpu', 'gpu'"]),
        ({1: 2}, ValueError, ["unknown key 1"]),
        ({"cpu": 1, "CPU": 2}, ValueError, ["'cpu' twice", "keep only one"]),
        ({"cpu": -1}, ValueError, ["'cpu' must be >= 0", "got -1"]),
        ({"gpu": -0.5}, ValueError, ["'gpu' must be >= 0", "got -0.5"]),
        ({"cpu": "2"}, TypeError, ["'cpu' must be a number", "got '2' (str)"]),
        ({"gpu": None}, TypeError, ["'gpu' must be a number", "got None"]),
        ({"gpu": True}, TypeError, ["'gpu' must be a number", "got True (bool)"]),
        ({"cpu": float("nan")}, ValueError, ["finite"]),
        ({"gpu": float("inf")}, ValueError, ["finite"]),
        (
            {"gpu": 1.5},
            ValueError,
            ["gpu=1.5 is not allowed", "below 1", "whole number", "gpu=1 or gpu=2"],
        ),
        ({"cpu": 1, "gpu": 2.25}, ValueError, ["gpu=2.25", "gpu=2 or gpu=3"]),
    ],
)
def test_from_user_errors_name_argument_value_and_fix(
    value: dict[object, object], exc: type[Exception], fragments: list[str]
) -> None:
    with pytest.raises(exc) as info:
        TrialResources.from_user(value)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"resources_per_trial={value!r}" in message
    assert "Fix:" in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("value", ["cpu=2", 2, [1, 0], ("cpu", 1)])
def test_from_user_rejects_wrong_type(value: object) -> None:
    with pytest.raises(TypeError) as info:
        TrialResources.from_user(value)  # type: ignore[arg-type]
    message = str(info.value)
    assert "resources_per_trial" in message
    assert repr(value) in message
    assert type(value).__name__ in message
    assert "Fix:" in message


def test_from_user_hints_about_placement_groups() -> None:
    class PlacementGroupFactory:  # (Ray's, say)
        pass

    with pytest.raises(TypeError, match="use ftnb.PlacementGroupFactory"):
        TrialResources.from_user(PlacementGroupFactory())  # type: ignore[arg-type]


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValueError, match=r"TrialResources\(cpu=1, gpu=1.5\)"):
        TrialResources(cpu=1, gpu=1.5)
    with pytest.raises(ValueError, match="must be >= 0"):
        TrialResources(cpu=-2)


# ---------------------------------------------------------------------- GPU detection


def _no_hardware(monkeypatch: pytest.MonkeyPatch, count: int | None = None) -> None:
    """Make the NVML probe report ``count`` GPUs (None: no NVML) and /dev report none."""
    monkeypatch.setattr(machine, "_nvml_gpu_count", lambda: count)
    monkeypatch.setattr(machine, "_dev_gpu_count", lambda: None)


def test_ftnb_num_gpus_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_hardware(monkeypatch, count=8)
    monkeypatch.setenv("FTNB_NUM_GPUS", "3")
    assert detect_gpus() == ["0", "1", "2"]
    monkeypatch.setenv("FTNB_NUM_GPUS", "0")
    assert detect_gpus() == []


def test_ftnb_num_gpus_limits_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_hardware(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.setenv("FTNB_NUM_GPUS", "2")
    # Limiting must not remap trials onto physical GPUs 0 and 1, which we were not given.
    assert detect_gpus() == ["4", "5"]
    # Asking for more than are visible is taken literally (tests fake GPUs this way).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == ["0", "1"]


@pytest.mark.parametrize("raw", ["1.5", "-1", "two"])
def test_ftnb_num_gpus_invalid(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("FTNB_NUM_GPUS", raw)
    with pytest.raises(ValueError, match=f"FTNB_NUM_GPUS={raw!r}.*integer >= 0"):
        detect_gpus()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", ["0"]),
        ("2,3", ["2", "3"]),
        (" 1 , 0 ", ["1", "0"]),
        ("GPU-8f1a,GPU-22bc", ["GPU-8f1a", "GPU-22bc"]),
        ("", []),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,-1,1", ["0"]),
    ],
)
def test_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: list[str]
) -> None:
    _no_hardware(monkeypatch, count=8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", raw)
    assert detect_gpus() == expected


def test_nvml_then_dev_then_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_nvml_gpu_count", lambda: 2)
    monkeypatch.setattr(machine, "_dev_gpu_count", lambda: 4)
    assert detect_gpus() == ["0", "1"]

    clear_detection_cache()
    monkeypatch.setattr(machine, "_nvml_gpu_count", lambda: None)
    assert detect_gpus() == ["0", "1", "2", "3"]

    clear_detection_cache()
    monkeypatch.setattr(machine, "_dev_gpu_count", lambda: None)
    assert detect_gpus() == []


def test_probe_is_cached_until_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_nvml() -> int:
        calls.append(1)
        return 1

    monkeypatch.setattr(machine, "_nvml_gpu_count", fake_nvml)
    assert detect_gpus() == ["0"]
    assert detect_gpus() == ["0"]
    assert len(calls) == 1
    # Environment overrides are read on every call, without clearing the cache.
    monkeypatch.setenv("FTNB_NUM_GPUS", "2")
    assert detect_gpus() == ["0", "1"]
    monkeypatch.delenv("FTNB_NUM_GPUS")
    clear_detection_cache()
    assert detect_gpus() == ["0"]
    assert len(calls) == 2


def test_nvml_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_NVML_LIB", "libftnb-does-not-exist.so.1")
    assert machine._nvml_gpu_count() is None


def test_nvml_failure_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeLib:
        def __init__(self, init_rc: int, count_rc: int, count: int) -> None:
            self.init_rc, self.count_rc, self.count = init_rc, count_rc, count
            self.shutdowns = 0

        def nvmlInit_v2(self) -> int:
            return self.init_rc

        def nvmlDeviceGetCount_v2(self, ref: object) -> int:
            ref._obj.value = self.count  # type: ignore[attr-defined]
            return self.count_rc

        def nvmlShutdown(self) -> int:
            self.shutdowns += 1
            return 0

    for init_rc, count_rc, expected in [(0, 0, 3), (9, 0, None), (0, 9, None)]:
        lib = FakeLib(init_rc, count_rc, 3)
        monkeypatch.setattr(machine.ctypes, "CDLL", lambda name, lib=lib: lib)
        assert machine._nvml_gpu_count() == expected
        assert lib.shutdowns == (1 if init_rc == 0 else 0)

    class NoSymbols:
        pass

    monkeypatch.setattr(machine.ctypes, "CDLL", lambda name: NoSymbols())
    assert machine._nvml_gpu_count() is None


def test_dev_gpu_count(tmp_path: Path) -> None:
    assert machine._dev_gpu_count(tmp_path) is None
    for name in ("nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"):
        (tmp_path / name).touch()
    assert machine._dev_gpu_count(tmp_path) == 2
    assert machine._dev_gpu_count(tmp_path / "missing") is None


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, ftnb.execution.machine as r; r.detect_gpus(); r.detect_cpus(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- CPU detection


def test_ftnb_num_cpus_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTNB_NUM_CPUS", "3")
    assert detect_cpus() == 3
    for bad in ("0", "-2", "1.5", "many"):
        monkeypatch.setenv("FTNB_NUM_CPUS", bad)
        with pytest.raises(ValueError, match=f"FTNB_NUM_CPUS={bad!r}"):
            detect_cpus()


def test_detect_cpus_uses_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(machine, "_cgroup_cpu_limit", lambda: None)
    assert detect_cpus() == 3


def test_detect_cpus_falls_back_to_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(machine.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 6)
    monkeypatch.setattr(machine, "_cgroup_cpu_limit", lambda: None)
    assert detect_cpus() == 6
    monkeypatch.setattr(machine.os, "cpu_count", lambda: None)
    assert detect_cpus() == 1


def test_detect_cpus_limited_by_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    affinity = set(range(16))
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: affinity, raising=False)
    monkeypatch.setattr(machine, "_cgroup_cpu_limit", lambda: 4)
    assert detect_cpus() == 4
    monkeypatch.setattr(machine, "_cgroup_cpu_limit", lambda: 32)
    assert detect_cpus() == 16


def test_detect_cpus_real_machine() -> None:
    n = detect_cpus()
    assert 1 <= n <= (os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("50000 100000\n", 1),
        ("400000\n", 4),
        ("garbage\n", None),
        ("", None),
    ],
)
def test_read_cpu_max(tmp_path: Path, content: str, expected: int | None) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(content)
    assert machine._read_cpu_max(path) == expected


def test_cgroup_limit_walks_own_cgroup_and_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    leaf = root / "user.slice" / "job" / "task"
    leaf.mkdir(parents=True)
    (root / "user.slice" / "cpu.max").write_text("800000 100000\n")
    (root / "user.slice" / "job" / "cpu.max").write_text("250000 100000\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/user.slice/job/task\n")
    assert machine._cgroup_cpu_limit(root, proc) == 3

    # A container sees only its namespace root.
    proc.write_text("0::/\n")
    (root / "cpu.max").write_text("100000 100000\n")
    assert machine._cgroup_cpu_limit(root, proc) == 1

    # Neither file readable: no limit.
    assert machine._cgroup_cpu_limit(tmp_path / "nope", tmp_path / "nope2") is None


# ------------------------------------------------------------------------------ pool


def test_cpu_only_pool() -> None:
    pool = ResourcePool(cpus=2, gpu_ids=[])
    req = TrialResources(cpu=1)
    a = pool.try_acquire(req)
    b = pool.try_acquire(req)
    assert a is not None and b is not None
    assert pool.try_acquire(req) is None
    assert pool.free_cpu == 0
    pool.release(a)
    assert pool.free_cpu == 1
    c = pool.try_acquire(req)
    assert c is not None
    assert c.alloc_id not in (a.alloc_id, b.alloc_id)


def test_fractional_cpus_sum_exactly() -> None:
    pool = ResourcePool(cpus=1, gpu_ids=[])
    req = TrialResources(cpu=0.1)
    allocs = [pool.try_acquire(req) for _ in range(10)]
    assert all(a is not None for a in allocs)
    assert pool.try_acquire(req) is None
    for a in allocs:
        assert a is not None
        pool.release(a)
    assert pool.free_cpu == pytest.approx(1.0)
    assert pool.free_cpu <= 1.0


def test_two_half_gpu_trials_share_one_gpu_third_waits() -> None:
    pool = ResourcePool(cpus=8, gpu_ids=["0"])
    half = TrialResources(cpu=1, gpu=0.5)
    a = pool.try_acquire(half)
    b = pool.try_acquire(half)
    assert a is not None and b is not None
    assert a.gpu_ids == b.gpu_ids == ("0",)
    assert a.gpu_fraction == b.gpu_fraction == 0.5
    assert a != b  # distinct allocations even though they hold the same resources
    assert pool.try_acquire(half) is None
    pool.release(a)
    c = pool.try_acquire(half)
    assert c is not None and c.gpu_ids == ("0",)


def test_fractional_packs_best_fit() -> None:
    pool = ResourcePool(cpus=16, gpu_ids=["0", "1"])
    a = pool.try_acquire(TrialResources(gpu=0.5))
    assert a is not None and a.gpu_ids == ("0",)
    # Packs onto the partly used GPU instead of spreading, keeping GPU 1 whole.
    b = pool.try_acquire(TrialResources(gpu=0.25))
    assert b is not None and b.gpu_ids == ("0",)
    whole = pool.try_acquire(TrialResources(gpu=1))
    assert whole is not None and whole.gpu_ids == ("1",)
    # 0.5 no longer fits on GPU 0 (0.75 used) and GPU 1 is exclusively taken.
    assert pool.try_acquire(TrialResources(gpu=0.5)) is None
    c = pool.try_acquire(TrialResources(gpu=0.25))
    assert c is not None and c.gpu_ids == ("0",)
    assert pool.gpu_usage() == {"0": 1.0, "1": 1.0}


def test_best_fit_picks_fullest_gpu_that_fits() -> None:
    pool = ResourcePool(cpus=16, gpu_ids=["0", "1", "2"])
    on0 = pool.try_acquire(TrialResources(gpu=0.75))
    on1 = pool.try_acquire(TrialResources(gpu=0.5))
    assert on0 is not None and on1 is not None
    assert (on0.gpu_ids, on1.gpu_ids) == (("0",), ("1",))
    # 0.25 fits on both 0 (0.75 used) and 1 (0.5 used): the fuller one wins.
    d = pool.try_acquire(TrialResources(gpu=0.25))
    assert d is not None and d.gpu_ids == ("0",)
    e = pool.try_acquire(TrialResources(gpu=0.5))
    assert e is not None and e.gpu_ids == ("1",)


def test_whole_gpu_never_shares() -> None:
    pool = ResourcePool(cpus=8, gpu_ids=["0", "1"])
    frac = pool.try_acquire(TrialResources(gpu=0.1))
    assert frac is not None and frac.gpu_ids == ("0",)
    whole = pool.try_acquire(TrialResources(gpu=1))
    assert whole is not None and whole.gpu_ids == ("1",)
    assert whole.gpu_fraction == 1.0
    # GPU 0 is 90% free, but a whole-GPU trial must not go there.
    assert pool.try_acquire(TrialResources(gpu=1)) is None
    # And fractional trials must not go onto GPU 1.
    other = pool.try_acquire(TrialResources(gpu=0.2))
    assert other is not None and other.gpu_ids == ("0",)
    pool.release(frac)
    assert pool.try_acquire(TrialResources(gpu=1)) is None
    pool.release(other)
    again = pool.try_acquire(TrialResources(gpu=1))
    assert again is not None and again.gpu_ids == ("0",)


def test_multi_gpu_request_takes_idle_gpus() -> None:
    pool = ResourcePool(cpus=8, gpu_ids=["0", "1", "2", "3"])
    one = pool.try_acquire(TrialResources(gpu=0.5))
    assert one is not None and one.gpu_ids == ("0",)
    two = pool.try_acquire(TrialResources(gpu=2))
    assert two is not None and two.gpu_ids == ("1", "2")
    assert pool.try_acquire(TrialResources(gpu=2)) is None
    pool.release(one)
    later = pool.try_acquire(TrialResources(gpu=2))
    assert later is not None and later.gpu_ids == ("0", "3")


def test_gpu_request_waits_for_cpu_too() -> None:
    pool = ResourcePool(cpus=1, gpu_ids=["0", "1"])
    a = pool.try_acquire(TrialResources(cpu=1, gpu=1))
    assert a is not None
    # A GPU is free but no CPU is; nothing must be half-allocated.
    assert pool.try_acquire(TrialResources(cpu=1, gpu=1)) is None
    assert pool.gpu_usage() == {"0": 1.0, "1": 0.0}
    zero_cpu = pool.try_acquire(TrialResources(cpu=0, gpu=1))
    assert zero_cpu is not None and zero_cpu.gpu_ids == ("1",)


def test_fraction_sums_use_epsilon() -> None:
    pool = ResourcePool(cpus=100, gpu_ids=["0"])
    tenth = TrialResources(cpu=0, gpu=0.1)
    allocs = [pool.try_acquire(tenth) for _ in range(10)]
    assert all(a is not None and a.gpu_ids == ("0",) for a in allocs)
    assert pool.try_acquire(tenth) is None
    for a in allocs:
        assert a is not None
        pool.release(a)
    assert pool.gpu_usage() == {"0": 0.0}
    assert pool.try_acquire(TrialResources(gpu=1)) is not None


def test_double_release_and_foreign_release() -> None:
    pool = ResourcePool(cpus=2, gpu_ids=["0"])
    a = pool.try_acquire(TrialResources(gpu=0.5))
    assert a is not None
    pool.release(a)
    with pytest.raises(ValueError, match="already released"):
        pool.release(a)
    assert pool.free_cpu == 2
    assert pool.gpu_usage() == {"0": 0.0}

    other = ResourcePool(cpus=2, gpu_ids=["0"])
    b = other.try_acquire(TrialResources())
    assert b is not None
    with pytest.raises(ValueError, match="another pool"):
        pool.release(b)


def test_try_acquire_raises_when_never_fits() -> None:
    pool = ResourcePool(cpus=2, gpu_ids=["0"])
    with pytest.raises(ValueError, match="can never be satisfied"):
        pool.try_acquire(TrialResources(cpu=1, gpu=2))


def test_pool_validation_and_repr() -> None:
    with pytest.raises(ValueError, match="cpus"):
        ResourcePool(cpus=-1, gpu_ids=[])
    with pytest.raises(ValueError, match="distinct"):
        ResourcePool(cpus=1, gpu_ids=["0", "0"])
    pool = ResourcePool(cpus=4, gpu_ids=["0", "1"])
    assert pool.cpus == 4.0 and pool.gpu_ids == ("0", "1")
    assert repr(pool) == "ResourcePool(cpus=4, gpu_ids=['0', '1'], running=0)"


def test_pool_from_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTNB_NUM_CPUS", "5")
    monkeypatch.setenv("FTNB_NUM_GPUS", "2")
    pool = pool_of_this_machine()
    assert pool.cpus == 5 and pool.gpu_ids == ("0", "1")


# ------------------------------------------------------------------------------ env()


def test_env_with_and_without_gpus() -> None:
    pool = ResourcePool(cpus=8, gpu_ids=["3", "5"])
    none = pool.try_acquire(TrialResources(cpu=2.7))
    assert none is not None
    assert none.env() == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}
    two = pool.try_acquire(TrialResources(cpu=0.5, gpu=2))
    assert two is not None
    assert two.env() == {"CUDA_VISIBLE_DEVICES": "3,5", "OMP_NUM_THREADS": "1"}


def test_env_for_constructed_allocation() -> None:
    alloc = Allocation(cpu=0, gpu_ids=("GPU-abc",), gpu_fraction=0.5)
    assert alloc.env() == {"CUDA_VISIBLE_DEVICES": "GPU-abc", "OMP_NUM_THREADS": "1"}


# ----------------------------------------------------------------- never-fits errors


def test_check_fits_message_for_gpus() -> None:
    pool = ResourcePool(cpus=2, gpu_ids=["0"])
    req = TrialResources.from_user({"cpu": 1, "gpu": 3})
    with pytest.raises(ValueError) as info:
        check_fits(req, pool)
    assert str(info.value) == (
        "resources_per_trial={'cpu': 1, 'gpu': 3} can never be satisfied on this machine: "
        "it has 2 CPUs and 1 GPU (ids: 0). Fix: ask for at most 1 GPU per trial, or set "
        "FTNB_NUM_GPUS / CUDA_VISIBLE_DEVICES if GPUs are not detected."
    )


def test_check_fits_message_without_gpus() -> None:
    pool = ResourcePool(cpus=1, gpu_ids=[])
    with pytest.raises(ValueError) as info:
        check_fits(TrialResources(gpu=0.5), pool)
    message = str(info.value)
    assert "resources_per_trial={'cpu': 1, 'gpu': 0.5}" in message
    assert "it has 1 CPU and no GPU." in message
    assert "ask for gpu=0, or set FTNB_NUM_GPUS / CUDA_VISIBLE_DEVICES" in message


def test_check_fits_message_for_cpus_and_both() -> None:
    pool = ResourcePool(cpus=4, gpu_ids=["0", "1"])
    with pytest.raises(ValueError) as info:
        check_fits(TrialResources(cpu=6), pool)
    message = str(info.value)
    assert "resources_per_trial={'cpu': 6, 'gpu': 0}" in message
    assert "it has 4 CPUs and 2 GPUs (ids: 0, 1)" in message
    assert "ask for at most 4 CPUs per trial, or set FTNB_NUM_CPUS" in message
    assert "GPU per trial" not in message

    with pytest.raises(ValueError) as info:
        check_fits(TrialResources(cpu=6, gpu=4), pool)
    message = str(info.value)
    assert "at most 4 CPUs" in message and "at most 2 GPUs" in message


def test_check_fits_passes_and_fits_ever() -> None:
    pool = ResourcePool(cpus=2, gpu_ids=["0"])
    for req in (TrialResources(cpu=2, gpu=1), TrialResources(cpu=0, gpu=0.5), TrialResources()):
        assert pool.fits_ever(req)
        check_fits(req, pool)
    assert not pool.fits_ever(TrialResources(cpu=2.5))
    assert not ResourcePool(cpus=2, gpu_ids=[]).fits_ever(TrialResources(gpu=0.01))


# ------------------------------------------------------------------- max_concurrency


@pytest.mark.parametrize(
    ("cpus", "gpus", "req", "expected"),
    [
        (4, [], {"cpu": 1}, 4),
        (4, [], {"cpu": 3}, 1),
        (1, [], {"cpu": 0.1}, 10),
        (3, [], {"cpu": 0.7}, 4),
        (8, ["0"], {"cpu": 1, "gpu": 0.5}, 2),
        (8, ["0", "1"], {"cpu": 1, "gpu": 1 / 3}, 6),
        (3, ["0", "1"], {"cpu": 1, "gpu": 0.25}, 3),
        (16, ["0", "1", "2"], {"cpu": 1, "gpu": 2}, 1),
        (16, ["0", "1", "2", "3"], {"cpu": 1, "gpu": 2}, 2),
        (2, ["0", "1", "2", "3"], {"cpu": 0, "gpu": 1}, 4),
        (100, ["0"], {"cpu": 0, "gpu": 0.1}, 10),
    ],
)
def test_max_concurrency_matches_pool(
    cpus: float, gpus: list[str], req: dict[str, float], expected: int
) -> None:
    pool = ResourcePool(cpus, gpus)
    res = TrialResources.from_user(req)
    assert max_concurrency(res, pool) == expected
    # The formula must agree with what the pool actually admits.
    admitted = 0
    while pool.try_acquire(res) is not None:
        admitted += 1
    assert admitted == expected


def test_max_concurrency_edge_cases() -> None:
    pool = ResourcePool(cpus=2, gpu_ids=["0"])
    assert max_concurrency(TrialResources(cpu=1, gpu=2), pool) == 0
    assert max_concurrency(TrialResources(cpu=0, gpu=0), pool) == sys.maxsize


@pytest.mark.parametrize("asked, trials, cpu, gpu, ranks, cpus, gpus, says", [
    (4, 4, 1, 0, 1, 2, 0, "ftnb: only 2 trials run at once, not the 4 asked for (max_concurrent_"
                          "trials, --concurrency): each trial asks for 1 CPU, and this machine "
                          "has 2 CPUs. To run more at once, ask for fewer CPUs per trial "
                          "(resources_per_trial={'cpu': 0.5} or --cpus-per-trial 0.5), or set "
                          "FTNB_NUM_CPUS if CPUs are not detected."),
    (8, 3, 1, 0, 1, 2, 0, "only 2 trials run at once, not the 3 asked for"),  # 3 trials
    (4, 4, 1, 1, 1, 8, 2, "each trial asks for 1 GPU, and this machine has 2 GPUs"),
    (4, 4, 1, 0, 2, 4, 0, "each trial asks for a group of 2 ranks of 1 CPU each"),
    (2, 4, 1, 0, 1, 2, 0, ""),  # as many as asked fit
    (4, 2, 1, 0, 1, 2, 0, ""),  # as many as there are trials fit
    (None, 4, 1, 0, 1, 2, 0, ""),  # nothing asked: as many as fit, as documented
    (4, 4, 0.5, 0, 1, 2, 0, ""),
])
def test_concurrency_note_says_why_fewer_than_asked_run(asked, trials, cpu, gpu, ranks, cpus,
                                                        gpus, says):
    note = concurrency_note(asked, trials, TrialResources(cpu=cpu, gpu=gpu), ranks, cpus,
                            [str(i) for i in range(gpus)])
    assert (says in note) if says else note == ""
