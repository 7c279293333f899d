"""Nothing a trial starts outlives its attempt: children in its process group, children in a new
session, daemons forked twice (with and without exec) end when the attempt ends, returns,
raises or is killed, and after a SIGKILLed driver when the experiment is taken over; the same
for the ranks of a group and for a WorkerGroup worker's children. Every check is by pid, once
with a cgroup per attempt (where this machine lets the test make one) and once with the marks
alone."""

from __future__ import annotations

import functools
import os
import signal
import threading
import uuid

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.execution.process_tree import AttemptCgroup
from ftnb.storage import ExperimentPaths

from procs import pid_alive, run_script, wait_for
from stray_family import families, family_pids, start_family, start_family_into


def _alive(pids):
    return [pid for pid in pids if pid_alive(pid)]


@pytest.fixture(autouse=True, params=["cgroup", "marks"])
def attempt_cgroups(request, monkeypatch):
    """Each test twice: attempts in cgroups of their own, and without (the subreaper and the
    marks alone, as where the machine gives no cgroup)."""
    if request.param == "marks":
        monkeypatch.setenv("FTNB_ATTEMPT_CGROUPS", "0")
    else:
        probe = AttemptCgroup.create(f"probe.{uuid.uuid4().hex}")
        if probe is None:
            pytest.skip("this machine gives no cgroup to make")
        probe.end()
    return request.param


def _own_cgroup():
    with open("/proc/self/cgroup") as f:
        return next(line.strip() for line in f if line.startswith("0::"))


@pytest.fixture
def no_strays_left():
    """Whatever a failing test leaves running is killed after it (by pid)."""
    files: list[str] = []
    yield files.append
    for path in files:
        for pid in _alive(family_pids(path)):
            os.kill(pid, signal.SIGKILL)


def _trial_kinds(results):
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    return [[failure.kind for failure in trial.failures] for trial in state.trials]


def _starts_family_then(config):
    start_family_into(config["pids"])
    ftnb.report({"step": 1, "cgroup": _own_cgroup()})
    if config["end"] == "raises":
        raise RuntimeError("the trial fails")
    if config["end"] == "killed":  # as by the OOM killer: no chance to clean up
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("end,kinds", [("returns", []), ("raises", ["exception"]),
                                       ("killed", ["signal"])])
def test_what_a_trial_starts_ends_with_its_attempt(tmp_path, no_strays_left, end, kinds,
                                                   attempt_cgroups):
    pids = str(tmp_path / "pids")
    no_strays_left(pids)
    results = ftnb.Tuner(
        _starts_family_then, param_space={"pids": pids, "end": end},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="fam", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)),
    ).fit()
    assert _trial_kinds(results) == [kinds]
    in_its_own = "/ftnb." in results[0].metrics["cgroup"]
    assert in_its_own is (attempt_cgroups == "cgroup"), results[0].metrics["cgroup"]
    assert len(family_pids(pids)) == 4
    # By the time the attempt's end is known, nothing of it runs: no waiting here.
    assert _alive(family_pids(pids)) == []


def _starts_family_and_waits(config):
    mine = start_family_into(config["pids"])
    if config["i"] == 0:
        ftnb.report({"step": 1})
        return
    # Trial 1 outlives trial 0: the end of trial 0 must not end what trial 1 started.
    wait_for(lambda: len(families(config["pids"])) == 2
             and not _alive(next(f for f in families(config["pids"]) if f != mine).values()),
             timeout=60, what="trial 0's processes to end")
    ftnb.report({"mine_alive": len(_alive(mine.values()))})


def test_the_end_of_one_attempt_spares_the_processes_of_another(tmp_path, no_strays_left):
    pids = str(tmp_path / "pids")
    no_strays_left(pids)
    results = ftnb.Tuner(
        _starts_family_and_waits,
        param_space={"pids": pids, "i": ftnb.grid_search([0, 1])},
        resources_per_trial={"cpu": 0.1},  # both at once, however few CPUs the machine has
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="two", verbose=0),
    ).fit()
    assert _trial_kinds(results) == [[], []]
    assert sorted(r.metrics.get("mine_alive", -1) for r in results) == [-1, 4]
    assert _alive(family_pids(pids)) == []


KILLED_DRIVER = """
import os, sys, threading
import ftnb
from stray_family import start_family_into

def train(config):
    if not os.path.exists(config["again"]):
        start_family_into(config["pids"])
        threading.Event().wait(300)  # until the driver is killed
    ftnb.report({"step": 1})

if __name__ == "__main__":
    ftnb.run(train, name="killed", storage_path=sys.argv[1],
             param_space={"pids": sys.argv[2], "again": sys.argv[3]},
             run_config=ftnb.RunConfig(verbose=0))
    print("DONE")
"""


@pytest.mark.slow
def test_what_the_trials_of_a_killed_driver_started_ends_when_it_is_run_again(
        tmp_path, no_strays_left):
    pids, again = str(tmp_path / "pids"), str(tmp_path / "again")
    no_strays_left(pids)
    args = (str(tmp_path / "runs"), pids, again)
    driver = run_script(tmp_path, KILLED_DRIVER, *args)
    try:
        wait_for(lambda: family_pids(pids), 60, "the trial to start its processes")
    finally:
        driver.kill()  # (its output pipe may be held by what survives it: no communicate)
        driver.wait(30)
    started = family_pids(pids)
    # The trial process dies with its driver; what it started is left to the next driver.
    wait_for(lambda: _alive(started) == started, 5, "the family to be running")
    open(again, "w").close()
    rerun = run_script(tmp_path, KILLED_DRIVER, *args)
    out, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0 and "DONE" in out, out
    assert _alive(started) == []


def _group_loop(config):
    start_family_into(config["pids"])
    rank = ftnb.get_context().get_world_rank()
    ftnb.report({"step": 1})
    if rank == 1:
        raise RuntimeError("rank 1 fails")
    threading.Event().wait(300)  # rank 0: ended by the executor with its group


@pytest.mark.slow
def test_what_the_ranks_of_a_group_start_ends_with_the_group(tmp_path, no_strays_left):
    pids = str(tmp_path / "pids")
    no_strays_left(pids)
    with pytest.raises(ftnb.TrainingFailedError, match="rank 1 fails"):
        ftnb.TorchTrainer(
            _group_loop, train_loop_config={"pids": pids},
            scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
            run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="group", verbose=0,
                                      failure_config=ftnb.FailureConfig(max_failures=0)),
        ).fit()
    assert len(families(pids)) == 2
    assert _alive(family_pids(pids)) == []


class _Parent:
    def __init__(self, pids):
        self.family = start_family_into(pids)  # a recreated worker's too


def _family_of(parent):
    return parent.family


def _fail(parent):
    raise ValueError("this worker fails")


def _hang(parent):
    threading.Event().wait()


def _uses_workers(config):
    # (a timeout long enough for the calls that return at once on a loaded machine)
    with ftnb.WorkerGroup(functools.partial(_Parent, config["pids"]), 3,
                          call_timeout_s=5.0) as group:
        first = [result.get() for result in group.map(_family_of)]
        group.map(lambda parent: _fail(parent) if ftnb.elastic.worker_index() == 0
                  else _hang(parent) if ftnb.elastic.worker_index() == 1 else None)
        # The failed worker (it exits) and the hung one (the group kills it) took theirs along.
        wait_for(lambda: not _alive([*first[0].values(), *first[1].values()]), 30,
                 "the failed workers' processes to end")
        ftnb.report({"third_alive": len(_alive(first[2].values()))})
        # Left running in the workers: the group's end, and the attempt's, end them.


@pytest.mark.slow
def test_what_workergroup_workers_start_ends_with_them(tmp_path, no_strays_left):
    pids = str(tmp_path / "pids")
    no_strays_left(pids)
    results = ftnb.Tuner(
        _uses_workers, param_space={"pids": pids},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="workers", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)),
    ).fit()
    assert _trial_kinds(results) == [[]], results[0].error
    assert results[0].metrics["third_alive"] == 4
    assert len(families(pids)) >= 3  # (and those of the workers recreated meanwhile)
    assert _alive(family_pids(pids)) == []
