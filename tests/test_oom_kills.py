"""A SIGKILL is an OOM kill only when the kernel says so of that very process: its own cgroup's
count or the kernel log's record of its pid; another process's OOM kill elsewhere, counted in
machine-wide counters, changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.execution.oom import cgroup_oom_kills, kernel_killed
from ftnb.storage import ExperimentPaths


def _record(seq, seconds, text):
    return f"3,{seq},{int(seconds * 1e6)},-;{text}".encode()


RECORDS = [
    _record(1, 10.0, "Out of memory: Killed process 4242 (python) total-vm:221368kB, anon-rss:0kB"),
    _record(2, 20.0, "Memory cgroup out of memory: Killed process 5151 (ftnb.ab12) total-vm:1kB"),
    _record(3, 30.0, "Out of memory: Kill process 6161 (python) score 901 or sacrifice child"),
    _record(4, 40.0, "oom-kill:constraint=CONSTRAINT_MEMCG,task=python3,pid=7171,uid=0"),
    _record(5, 50.0, "audit: pid=8181 Killed process 818 (x) is not an OOM line"),
]


@pytest.mark.parametrize("pid,since,expected", [
    (4242, 5.0, True),     # the machine's OOM killer named it, after it started
    (5151, 5.0, True),     # a memory cgroup's OOM killer named it
    (6161, 5.0, True),     # older kernels' wording
    (4242, 15.0, False),   # that pid was killed before this process started: another process
    (9999, 5.0, False),    # another process was OOM-killed: not this one
    (7171, 5.0, False),    # only the "Killed process" line counts, not the summary
    (8181, 5.0, False),
    (81, 5.0, False),      # a pid is matched whole
])
def test_the_kernel_log_names_the_process_it_killed(pid, since, expected):
    assert kernel_killed(pid, since, RECORDS) is expected


def test_no_record_no_oom():
    assert kernel_killed(4242, 0.0, []) is False
    assert kernel_killed(4242, 0.0, [b"garbage", b"6,1;Killed process 4242 (x) "]) is False


def test_a_cgroup_counts_its_own_oom_kills(tmp_path):
    assert cgroup_oom_kills(None) is None
    assert cgroup_oom_kills(str(tmp_path)) is None
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\n")
    assert cgroup_oom_kills(str(tmp_path)) == 1
    (tmp_path / "memory.events").unlink()
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    assert cgroup_oom_kills(str(tmp_path)) == 4


# -- real OOM kills --------------------------------------------------------------------------------
def _own_cgroup(controller: str) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    raise OSError


@pytest.fixture
def small_memory_cgroup():
    """A memory cgroup of 64 MiB (cgroup v2's memory.max or v1's memory.limit_in_bytes),
    whose processes the kernel OOM-kills when they take more; skipped where none can be made."""
    name = f"ftnb-test-{uuid.uuid4().hex[:8]}"
    candidates = []
    try:
        candidates.append((f"/sys/fs/cgroup/memory{_own_cgroup('memory')}",
                           "memory.limit_in_bytes"))
    except OSError:
        pass
    try:
        candidates.append((f"/sys/fs/cgroup{_own_cgroup('')}", "memory.max"))
    except OSError:
        pass
    for parent, limit in candidates:
        folder = os.path.join(parent.rstrip("/"), name)
        try:
            os.mkdir(folder)
        except OSError:
            continue
        try:
            with open(os.path.join(folder, limit), "w") as f:
                f.write(str(64 * 2**20))
        except OSError:
            os.rmdir(folder)
            continue
        yield folder
        for _ in range(100):
            try:
                os.rmdir(folder)
                break
            except OSError:
                import time

                time.sleep(0.05)
        return
    pytest.skip("no memory cgroup can be made here")


HOG = "import sys; open(sys.argv[1], 'w').write('0'); x = bytearray(1024 * 2**20)"


def _oom_elsewhere(config):
    """Another process (not this one) is OOM-killed; then this trial dies of SIGKILL."""
    # The hog joins the small cgroup itself (the "0" written to cgroup.procs is the writer).
    hog = subprocess.run([sys.executable, "-c", HOG, config["procs"]])
    assert hog.returncode == -signal.SIGKILL, hog.returncode
    ftnb.report({"step": 1})
    os.kill(os.getpid(), signal.SIGKILL)


def _out_of_memory(config):
    ftnb.report({"step": 1})
    with open(config["procs"], "w") as f:
        f.write("0")
    hold = bytearray(1024 * 2**20)  # the OOM killer's victim: this trial
    ftnb.report({"step": 2, "size": len(hold)})


def _failure_kinds(results):
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    return [failure.kind for failure in state.trials[0].failures]


def _kernel_log_readable():
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


def _procs_file(folder):
    return os.path.join(folder, "cgroup.procs")


def test_a_sigkill_while_another_process_is_oom_killed_is_a_signal(tmp_path, small_memory_cgroup):
    results = ftnb.Tuner(
        _oom_elsewhere, param_space={"procs": _procs_file(small_memory_cgroup)},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="elsewhere", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)),
    ).fit()
    assert _failure_kinds(results) == ["signal"], results[0].error


@pytest.mark.skipif(not _kernel_log_readable(), reason="the kernel log (/dev/kmsg) is unreadable")
def test_a_trial_the_oom_killer_kills_is_oom(tmp_path, small_memory_cgroup):
    results = ftnb.Tuner(
        _out_of_memory, param_space={"procs": _procs_file(small_memory_cgroup)},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="itself", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)),
    ).fit()
    assert _failure_kinds(results) == ["oom"], results[0].error


class _Idle:
    pass


def _worker_oom_elsewhere(worker, procs):
    hog = subprocess.run([sys.executable, "-c", HOG, procs])
    assert hog.returncode == -signal.SIGKILL, hog.returncode
    os.kill(os.getpid(), signal.SIGKILL)


def _worker_out_of_memory(worker, procs):
    with open(procs, "w") as f:
        f.write("0")
    return len(bytearray(1024 * 2**20))


def test_a_workergroup_worker_sigkilled_while_another_process_is_oom_killed_died_of_a_signal(
        small_memory_cgroup):
    with ftnb.WorkerGroup(_Idle, 1) as group:
        [result] = group.map(_worker_oom_elsewhere, _procs_file(small_memory_cgroup))
    assert not result.ok and result.error["kind"] == "signal", result.error


@pytest.mark.skipif(not _kernel_log_readable(), reason="the kernel log (/dev/kmsg) is unreadable")
def test_a_workergroup_worker_the_oom_killer_kills_is_oom(small_memory_cgroup):
    with ftnb.WorkerGroup(_Idle, 1) as group:
        [result] = group.map(_worker_out_of_memory, _procs_file(small_memory_cgroup))
    assert not result.ok and result.error["kind"] == "oom", result.error


# -- the attempt's own cgroup decides, where it counts ---------------------------------------------
#: A pid no kernel log record names (above the kernel's pid limit, 2**22).
_NO_SUCH_PID = (1 << 22) + 7


def test_the_attempts_cgroup_count_decides_over_the_kernel_log(tmp_path):
    """What the local executor does at an attempt's end (read ``memory.events`` of the
    attempt's cgroup before removing it, then decide), over a cgroup v2 folder's layout made in
    tmp: the count of the attempt's own cgroup decides, whatever the kernel log says; no count
    (no memory accounting) leaves the kernel log to decide."""
    from ftnb.execution.oom import oom_killed

    cgroup = tmp_path / "ftnb.tok.t1_00000.1"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("")
    assert oom_killed(_NO_SUCH_PID, 0.0, cgroup_oom_kills(str(cgroup))) is False  # no count
    (cgroup / "memory.events").write_text(
        "low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\noom_group_kill 0\n")
    assert cgroup_oom_kills(str(cgroup)) == 0
    # Its processes hit the limit (oom 1) but none was killed: a SIGKILL is a signal.
    assert oom_killed(_NO_SUCH_PID, 0.0, cgroup_oom_kills(str(cgroup))) is False
    (cgroup / "memory.events").write_text(
        "low 0\nhigh 0\nmax 40\noom 2\noom_kill 1\noom_group_kill 0\n")
    assert oom_killed(_NO_SUCH_PID, 0.0, cgroup_oom_kills(str(cgroup))) is True
    # A file of another shape (a kernel that names things otherwise): no count, no guess.
    (cgroup / "memory.events").write_text("oom_kill one\n")
    assert cgroup_oom_kills(str(cgroup)) is None


def test_a_real_attempt_cgroup_has_a_count_only_with_memory_accounting():
    """On this machine's own cgroup v2 hierarchy: an attempt's cgroup has an ``oom_kill``
    count exactly when the memory controller is enabled for its parent's children (not where
    memory is cgroup v1's, as on the CI machine: then the kernel log decides)."""
    import os
    import uuid

    from ftnb.execution.process_tree import AttemptCgroup

    cgroup = AttemptCgroup.create(f"probe.{uuid.uuid4().hex}")
    if cgroup is None:
        pytest.skip("this machine gives no cgroup to make")
    try:
        with open(os.path.join(os.path.dirname(cgroup.folder), "cgroup.subtree_control")) as f:
            accounted = "memory" in f.read().split()
        kills = cgroup_oom_kills(cgroup.folder)
        assert (kills is not None) is accounted, (cgroup.folder, kills)
        if accounted:
            assert kills == 0
    finally:
        cgroup.end()
    assert cgroup.removed
