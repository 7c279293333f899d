"""ftnb.WorkerGroup (issue 16): elastic worker groups with real processes and real signals.

A failed worker (SIGKILL, an exception, a hang past call_timeout_s, a MemoryError under a lowered
RLIMIT_AS) gives a classified failure while the others' results come back; before the next call
it is recreated in the same slot and handed the caller's state. Too many failed calls in a row
raise WorkerGroupError, which a Tuner retries from the trial's checkpoint; a SIGKILLed trial or
driver takes its workers with it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time

import cloudpickle
import pytest
from procs import pid_alive, run_script, wait_for

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.elastic import worker_index
from ftnb.storage import ExperimentPaths

# The workers' functions and classes below travel by value, as a notebook's do: the workers
# never import this module (and pytest with it).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Runner:
    """A worker's object: remembers the index its factory got and the states pushed into it."""

    def __init__(self, index, pid_dir=None):
        self.index = index
        self.states = []
        if pid_dir:
            _touch(os.path.join(pid_dir, f"pid-{index}-{os.getpid()}"))

    def set_state(self, state):
        self.states.append(state)


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def whoami(runner, *args):
    """What a worker is: its process, the factory's index, worker_index(), the states it got."""
    return {"pid": os.getpid(), "factory_index": runner.index, "worker_index": worker_index(),
            "states": list(runner.states)}


def sigkill_worker(runner, victim):
    if worker_index() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return whoami(runner)


def pids_of(results) -> list:
    return [r.value["pid"] for r in results]


def wait_dead(pids, what="the workers to be gone") -> None:
    wait_for(lambda: not any(pid_alive(p) for p in pids), 15, what)


def pids_written(folder) -> list:
    return [int(p.split("-")[2]) for p in os.listdir(folder) if p.startswith("pid-")]


# -- failures during a map --------------------------------------------------------------------


def test_sigkilled_worker_fails_alone_and_comes_back_in_its_slot_with_the_state():
    version = {"n": 0}

    def get_state():
        version["n"] += 1
        return {"weights": f"v{version['n']}"}

    with ftnb.WorkerGroup(Runner, 4, get_state=get_state) as group:
        first = group.map(whoami)
        assert [r.ok for r in first] == [True] * 4
        assert [(r.value["factory_index"], r.value["worker_index"]) for r in first] == \
            [(i, i) for i in range(4)]
        assert all(r.value["states"] == [] for r in first)  # nothing pushed into new workers
        before = pids_of(first)

        killed = group.map(sigkill_worker, 2)  # worker 2 SIGKILLs itself during the call
        assert [(r.index, r.ok) for r in killed] == [(0, True), (1, True), (2, False), (3, True)]
        error = killed[2].error
        assert error["kind"] == "signal" and error["signal"] == "SIGKILL", error
        with pytest.raises(RuntimeError, match="worker 2 failed"):
            killed[2].get()
        wait_dead([before[2]])
        assert group.stats["worker_failures_signal"] == 1
        assert group.stats["workers_healthy"] == 3

        again = group.map(whoami)
        assert [r.ok for r in again] == [True] * 4
        after = pids_of(again)
        assert after[2] != before[2] and after[:2] == before[:2] and after[3] == before[3]
        recreated = again[2].value
        assert recreated["factory_index"] == 2 and recreated["worker_index"] == 2
        assert recreated["states"] == [{"weights": "v1"}]  # pushed before it took work
        assert [r.value["states"] for r in again if r.index != 2] == [[]] * 3
        assert group.stats["worker_restarts"] == 1 and version["n"] == 1

        # A worker killed while idle, between two calls, is recreated before the next call
        # instead of missing from its results.
        os.kill(after[0], signal.SIGKILL)
        wait_dead([after[0]])
        idle = group.map(whoami)
        assert [(r.index, r.ok) for r in idle] == [(i, True) for i in range(4)]
        assert idle[0].value["pid"] != after[0]
        assert idle[0].value["states"] == [{"weights": "v2"}]
        assert group.stats["worker_restarts"] == 2
        assert group.stats["worker_failures"] == 2


def test_a_worker_slow_to_come_back_joins_a_later_map_while_the_others_go_on(tmp_path,
                                                                             monkeypatch):
    import ftnb.elastic.group

    monkeypatch.setattr(ftnb.elastic.group, "RECREATE_WAIT_S", 0.3)
    slow = tmp_path / "slow"

    def make(index):
        if index == 1 and slow.exists():
            time.sleep(3)  # as an actor waiting for a node with room
        return Runner(index)

    with ftnb.WorkerGroup(make, 2, get_state=lambda: "latest") as group:
        slow.write_text("")  # (before the failure: worker 1's replacement starts when it is seen)
        assert [r.ok for r in group.map(sigkill_worker, 1)] == [True, False]
        without = group.map(whoami)
        assert [(r.index, r.ok) for r in without] == [(0, True)]  # did not wait for worker 1
        assert group.healthy == [0] and group.stats["worker_restarts"] == 1
        both = wait_for(lambda: (results := group.map(whoami)) and len(results) == 2
                        and results, 30, "worker 1 to join a map")
        assert both[1].value["states"] == ["latest"]  # pushed before it took work
        assert group.stats["worker_restarts"] == 1  # started once, not again while starting


def test_a_failed_workers_replacement_starts_when_the_failure_is_seen_and_takes_the_next_state(
        tmp_path):
    weights = {"version": 0}
    asked = []

    def get_state():
        asked.append(weights["version"])
        return weights["version"]

    with ftnb.WorkerGroup(lambda index: Runner(index, str(tmp_path)), 2,
                          get_state=get_state) as group:
        before = pids_of(group.map(whoami))
        assert [r.ok for r in group.map(sigkill_worker, 1)] == [True, False]
        # Its replacement's process is up (it ran the factory) before the next map is called,
        # and the restart is counted; the state is not asked for yet.
        new = wait_for(lambda: set(pids_written(tmp_path)) - set(before), 30,
                       "worker 1's replacement to start without a map")
        assert group.stats["worker_restarts"] == 1 and asked == []
        weights["version"] = 1  # the caller's work on the failed map's results
        again = group.map(whoami)
        assert [r.ok for r in again] == [True, True]
        assert again[1].value["pid"] in new and again[1].value["factory_index"] == 1
        assert again[1].value["states"] == [1]  # the state when it took work
        assert again[0].value["pid"] == before[0] and asked == [1]


def test_a_replacement_that_fails_to_start_is_replaced_within_max_restarts(tmp_path):
    fail = tmp_path / "fail-once"

    def make(index):
        runner = Runner(index, str(tmp_path))
        if index == 1 and fail.exists():
            fail.unlink()
            raise RuntimeError("the simulator did not start")
        return runner

    with ftnb.WorkerGroup(make, 2, max_restarts=2, get_state=lambda: "latest") as group:
        before = pids_of(group.map(whoami))
        fail.write_text("")
        assert [r.ok for r in group.map(sigkill_worker, 1)] == [True, False]
        (failed,) = wait_for(lambda: set(pids_written(tmp_path)) - set(before), 30,
                             "worker 1's first replacement")
        wait_dead([failed], "the replacement whose factory raised to end")
        # The next map sees that start fail, starts another (the second restart) and waits
        # for it.
        again = group.map(whoami)
        assert [r.ok for r in again] == [True, True]
        assert again[1].value["pid"] not in (failed, before[1])
        assert again[1].value["states"] == ["latest"]
        stats = group.stats
        assert (stats["worker_restarts"], stats["worker_failures_signal"],
                stats["worker_failures_exception"]) == (2, 1, 1)
        # max_restarts is used up: a failed worker is not replaced.
        assert [r.ok for r in group.map(sigkill_worker, 1)] == [True, False]
        assert [(r.index, r.ok) for r in group.map(whoami)] == [(0, True)]
        assert group.stats["worker_restarts"] == 2


def test_closing_the_group_ends_a_replacement_still_starting(tmp_path):
    hold = tmp_path / "hold"

    def make(index):
        runner = Runner(index, str(tmp_path))
        while index == 1 and hold.exists():
            time.sleep(0.02)  # a slow start (a simulator loading)
        return runner

    group = ftnb.WorkerGroup(make, 2)
    before = pids_of(group.map(whoami))
    hold.write_text("")
    assert [r.ok for r in group.map(sigkill_worker, 1)] == [True, False]
    (starting,) = wait_for(lambda: set(pids_written(tmp_path)) - set(before), 30,
                           "worker 1's replacement to start")
    group.close()
    wait_dead([starting, before[0]], "the group's workers, the one starting too, to end")


def _limited_memory(index):
    """Worker 2 may map only 256 MiB more than it has when it starts."""
    if index == 2:
        with open("/proc/self/status") as f:
            vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, ((vm_kib * 1024) + 256 * 2**20, hard))
    return Runner(index)


def _misbehave(runner):
    index = worker_index()
    if index == 0:
        raise ValueError("planned failure in worker 0")
    if index == 1:
        threading.Event().wait()  # hangs until the group kills it
    if index == 2:
        return len(bytearray(1024 * 2**20))  # 1 GiB: over its RLIMIT_AS
    return whoami(runner)


def test_exception_timeout_and_memory_error_fail_their_worker_only():
    with ftnb.WorkerGroup(_limited_memory, 4, call_timeout_s=2.0) as group:
        before = pids_of(group.map(whoami))
        results = group.map(_misbehave)
        assert [r.ok for r in results] == [False, False, False, True]

        raised, hung, oom, fine = results
        assert raised.error["kind"] == "exception" and raised.error["type"] == "ValueError"
        assert raised.error["message"] == "planned failure in worker 0"
        assert "Traceback" in raised.error["traceback"]
        assert 'raise ValueError("planned failure in worker 0")' in raised.error["traceback"]
        assert hung.error["kind"] == "timeout"
        assert "call_timeout_s=2.0" in hung.error["message"]
        assert oom.error["kind"] == "oom" and oom.error["type"] == "MemoryError"
        assert fine.value["pid"] == before[3]
        # The three failed workers were killed (their state may be corrupt).
        wait_dead(before[:3])
        stats = group.stats
        assert (stats["worker_failures_exception"], stats["worker_failures_timeout"],
                stats["worker_failures_oom"]) == (1, 1, 1)

        again = group.map(whoami)
        assert [r.ok for r in again] == [True] * 4
        assert set(pids_of(again)[:3]).isdisjoint(before) and pids_of(again)[3] == before[3]
        assert group.stats["worker_restarts"] == 3


def _sleep_then_pid(runner, seconds):
    time.sleep(seconds)
    return os.getpid()


def test_a_call_queued_behind_another_gets_its_own_call_timeout():
    # Two calls of 0.6 x call_timeout_s sent together: the second one's clock starts when the
    # first one ends, so neither times out.
    with ftnb.WorkerGroup(Runner, 1, call_timeout_s=2.0, max_in_flight_per_worker=2) as group:
        assert group.map_async(_sleep_then_pid, 1.2) == 1
        assert group.map_async(_sleep_then_pid, 1.2) == 1
        results = []
        while len(results) < 2:
            results += group.fetch_ready(timeout_s=30)
        assert [r.ok for r in results] == [True, True], results
        assert group.stats["worker_failures"] == 0


# -- starting --------------------------------------------------------------------------------


def test_validate_names_the_failing_worker_and_leaves_no_process(tmp_path):
    def make(index):
        runner = Runner(index, str(tmp_path))
        if index == 1:
            raise RuntimeError("no simulator license on this worker")
        return runner

    with pytest.raises(ftnb.WorkerGroupError) as info:
        ftnb.WorkerGroup(make, 4, validate=True)
    message = str(info.value)
    assert "1 of 4 workers failed to start" in message
    assert "worker 1: exception RuntimeError: no simulator license" in message
    assert "validate=False" in message  # the fix
    pids = pids_written(tmp_path)
    assert len(pids) == 4
    wait_dead(pids, "every worker of the refused group to be gone")


def test_validate_false_starts_with_the_others_and_recreates_the_failed_one(tmp_path):
    flag = tmp_path / "fail-once"
    flag.write_text("")

    def make(index):
        if index == 3 and flag.exists():
            flag.unlink()
            raise RuntimeError("first start fails")
        return Runner(index, str(tmp_path))

    with ftnb.WorkerGroup(make, 4, validate=False) as group:
        assert group.healthy == [0, 1, 2]
        assert group.stats["worker_failures_exception"] == 1
        # Worker 3's second start began with the group, before any map.
        wait_for(lambda: len(pids_written(tmp_path)) == 4, 30, "worker 3's second start")
        results = group.map(whoami)
        assert [(r.index, r.ok) for r in results] == [(i, True) for i in range(4)]
        assert results[3].value["factory_index"] == 3
        assert group.stats["worker_restarts"] == 1


def _raise_unless(runner, ok):
    if not ok:
        raise RuntimeError("every worker fails")
    return worker_index()


def test_more_failed_calls_in_a_row_than_tolerated_raise():
    with ftnb.WorkerGroup(Runner, 2, consecutive_failure_tolerance=2) as group:
        for ok in (False, False, True, False, False):  # a healthy call resets the count
            results = group.map(_raise_unless, ok)
            assert [r.ok for r in results] == [ok, ok]
        assert group.stats["consecutive_failures"] == 2
        with pytest.raises(ftnb.WorkerGroupError, match="3 consecutive calls without a healthy "
                                                        "result.*tolerance=2"):
            group.map(_raise_unless, False)


def test_map_async_counts_failed_calls_in_a_row_per_call_not_per_fetch():
    # Two calls sent at once, both failing on every worker: two failed calls in a row (over
    # the tolerance of 1), however their results are fetched.
    with ftnb.WorkerGroup(Runner, 2, consecutive_failure_tolerance=1,
                          max_in_flight_per_worker=2) as group:
        assert group.map_async(_raise_unless, False) == 2
        assert group.map_async(_raise_unless, False) == 2
        fetched = []
        with pytest.raises(ftnb.WorkerGroupError, match="2 consecutive calls"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                fetched += group.fetch_ready(timeout_s=1)
        assert len(fetched) <= 2  # raised at the second call's last result, not later

    # A call with one healthy result among failed ones resets the count.
    with ftnb.WorkerGroup(Runner, 2, consecutive_failure_tolerance=1) as group:
        assert [r.ok for r in group.map(_raise_unless, False)] == [False, False]
        assert group.stats["consecutive_failures"] == 1
        assert group.map_async(_index_or_raise, 0) == 2
        results = []
        while len(results) < 2:
            results += group.fetch_ready(timeout_s=30)
        assert sorted((r.index, r.ok) for r in results) == [(0, True), (1, False)]
        assert group.stats["consecutive_failures"] == 0


def _index_or_raise(runner, good):
    if worker_index() != good:
        raise RuntimeError("only one worker succeeds")
    return worker_index()


def test_a_factory_with_an_optional_index_gets_the_index():
    def make(index=None):
        return Runner(index)

    with ftnb.WorkerGroup(make, 2) as group:
        assert [r.value["factory_index"] for r in group.map(whoami)] == [0, 1]


# -- inside a Tuner ---------------------------------------------------------------------------


def _fail_in_first_attempt(runner, step, attempt):
    if attempt == 1 and step == 3:
        raise RuntimeError(f"planned failure at step {step}")
    return step


def _elastic_trainable(config):
    import tempfile

    ctx = ftnb.get_context()
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read())
    with ftnb.WorkerGroup(Runner, 2, consecutive_failure_tolerance=1) as group:
        with open(os.path.join(config["dir"], f"workers-{ctx.attempt}"), "w") as f:
            json.dump(pids_of(group.map(whoami)), f)
        for step in range(start + 1, config["n"] + 1):
            while not any(r.ok for r in group.map(_fail_in_first_attempt, step, ctx.attempt)):
                pass  # failed calls: try the step again (the group raises past its tolerance)
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                ftnb.report({"step": step, **group.stats},
                            checkpoint=ftnb.Checkpoint.from_directory(d))


def test_a_trial_whose_group_gives_up_is_retried_from_its_checkpoint(tmp_path):
    n = 5
    (tmp_path / "marks").mkdir()
    results = ftnb.Tuner(
        _elastic_trainable,
        param_space={"n": n, "dir": str(tmp_path / "marks")},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="elastic", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    assert results.num_errors == 0
    (trial,) = ExperimentState.load(ExperimentPaths.at(results.experiment_path)).trials
    assert trial.status == "TERMINATED"
    (failure,) = trial.failures
    assert (failure.kind, failure.type, failure.attempt) == ("exception", "WorkerGroupError", 1)
    assert "consecutive_failure_tolerance=1" in failure.message
    assert failure.iteration == 2
    assert [a.start_iteration for a in trial.attempts] == [0, 2]
    rows = results[0].rows
    assert [r["training_iteration"] for r in rows] == list(range(1, n + 1))
    assert [r["step"] for r in rows] == list(range(1, n + 1))
    assert rows[-1]["worker_restarts"] == 0  # the second attempt's group never failed
    # The first attempt's workers ended with it.
    wait_dead(json.loads((tmp_path / "marks" / "workers-1").read_text()))


# -- sub-environments -------------------------------------------------------------------------


class _Env:
    def __init__(self, index):
        self.index = index
        self.steps = 0

    def step(self, action):
        if action == "crash":
            raise RuntimeError(f"sub-environment {self.index} crashed")
        self.steps += 1
        return self.steps


class _EnvRunner:
    def __init__(self):
        self.envs = ftnb.SubEnvironments(_Env, 3, max_restarts=1)

    def step(self, actions):
        results = self.envs.map(lambda env, action: env.step(action), actions)
        return {"pid": os.getpid(), "restarts": list(self.envs.restarts),
                "results": [(r.ok, r.value, (r.error or {}).get("type")) for r in results]}


def _step(runner, actions):
    return runner.step(actions)


def test_a_failing_sub_environment_restarts_without_its_worker():
    with ftnb.WorkerGroup(_EnvRunner, 1) as group:
        (first,) = group.map(_step, ["go", "go", "go"])
        (crashed,) = group.map(_step, ["go", "crash", "go"])
        assert crashed.ok, crashed.error  # the worker's call went on
        value = crashed.value
        assert value["pid"] == first.value["pid"]
        assert value["results"] == [(True, 2, None), (False, None, "RuntimeError"),
                                    (True, 2, None)]
        assert value["restarts"] == [0, 1, 0]
        (after,) = group.map(_step, ["go", "go", "go"])
        assert after.value["results"] == [(True, 3, None), (True, 1, None), (True, 3, None)]
        assert group.stats["worker_restarts"] == 0 and group.stats["worker_failures"] == 0

        # A second crash of sub-environment 1 is past max_restarts=1: the worker fails.
        (beyond,) = group.map(_step, ["go", "crash", "go"])
        assert not beyond.ok
        assert (beyond.error["kind"], beyond.error["type"]) == ("exception", "WorkerGroupError")
        assert "sub-environment 1 failed again after 1 restarts" in beyond.error["message"]
        wait_dead([first.value["pid"]])


# -- map_async ---------------------------------------------------------------------------------


def _wait_for_gate(runner, gate):
    deadline = time.monotonic() + 60
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.01)
    return os.getpid()


def test_map_async_bounds_unfetched_calls_and_returns_a_killed_workers_as_failures(tmp_path):
    gate = str(tmp_path / "gate")
    with ftnb.WorkerGroup(lambda index: Runner(index, str(tmp_path)), 2,
                          max_in_flight_per_worker=2) as group:
        pids = pids_of(group.map(whoami))
        assert group.map_async(_wait_for_gate, gate) == 2
        assert group.map_async(_wait_for_gate, gate) == 2
        assert group.map_async(_wait_for_gate, gate) == 0  # 2 unfetched per worker: the bound
        assert group.fetch_ready() == []
        with pytest.raises(RuntimeError, match="fetch_ready"):
            group.map(whoami)

        os.kill(pids[1], signal.SIGKILL)
        lost = []
        while len(lost) < 2:
            lost += group.fetch_ready(timeout_s=30)
        assert [(r.index, r.ok, r.error["kind"]) for r in lost] == \
            [(1, False, "signal"), (1, False, "lost")]
        assert lost[0].call_id != lost[1].call_id
        # The fetch that saw the death started its replacement.
        wait_for(lambda: len(pids_written(tmp_path)) == 3, 30, "worker 1's replacement")

        # Worker 1 is recreated and takes one call; worker 0 still holds two unfetched.
        assert group.map_async(_wait_for_gate, gate) == 1
        _touch(gate)
        done = []
        while len(done) < 3:
            done += group.fetch_ready(timeout_s=30)
        assert sorted((r.index, r.ok) for r in done) == [(0, True), (0, True), (1, True)]
        assert {r.value for r in done if r.index == 0} == {pids[0]}
        assert group.fetch_ready() == []
        assert len(group.map(whoami)) == 2


# -- processes ---------------------------------------------------------------------------------

MAIN_SCRIPT = """
import os
import ftnb

with open("main-runs", "a") as f:  # no __main__ guard: workers must not run this again
    f.write(f"{os.getpid()}\\n")


class Counter:
    def __init__(self, index):
        self.total = index * 100

    def set_state(self, state):
        self.total = state


def add(counter, n):
    counter.total += n
    return counter.total


with ftnb.WorkerGroup(Counter, 3, get_state=lambda: -1) as group:
    print("RESULTS", [r.value for r in group.map(add, 5)], flush=True)
"""


def test_factories_and_functions_defined_in_a_scripts_main_work(tmp_path):
    proc = run_script(tmp_path, MAIN_SCRIPT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "RESULTS [5, 105, 205]" in out
    assert (tmp_path / "main-runs").read_text().split() == [str(proc.pid)]


BUSY_SCRIPT = """
import json, os, threading
import ftnb


def pid_of(worker):
    return os.getpid()


def hang(worker, folder):
    open(os.path.join(folder, f"busy-{os.getpid()}"), "w").close()
    threading.Event().wait()


with ftnb.WorkerGroup(lambda: {}, 3) as group:
    print("PIDS", json.dumps([r.value for r in group.map(pid_of)]), flush=True)
    group.map(hang, os.getcwd())
"""


def wait_busy(folder, workers) -> None:
    wait_for(lambda: all((folder / f"busy-{pid}").exists() for pid in workers), 30,
             "every worker to be in its call")


def test_a_killed_caller_takes_its_busy_workers_with_it(tmp_path):
    # The workers are in a call that never ends: only the kernel can end them with the caller.
    proc = run_script(tmp_path, BUSY_SCRIPT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line + proc.stdout.read()
        workers = json.loads(line.split(" ", 1)[1])
        wait_busy(tmp_path, workers)
        proc.kill()
        proc.wait(10)
        wait_dead(workers, "the busy workers to die with their caller")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


DRIVER = """
import json, os, sys, threading, time
import ftnb


def pid_of(worker):
    return os.getpid()


def hang(worker, folder):
    open(os.path.join(folder, f"busy-{os.getpid()}"), "w").close()
    threading.Event().wait()


def step(worker):
    time.sleep(0.02)


def trainable(config):
    attempt = ftnb.get_context().attempt
    with ftnb.WorkerGroup(lambda: {}, 3) as group:
        workers = [r.value for r in group.map(pid_of)]
        path = os.path.join(config["dir"], f"attempt-{attempt}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"trial": os.getpid(), "workers": workers}, f)
        os.replace(path + ".tmp", path)
        if attempt == 1:
            group.map(hang, config["dir"])  # the test SIGKILLs this trial meanwhile
        for i in range(3000):  # the test SIGKILLs the driver meanwhile
            group.map(step)
            ftnb.report({"i": i})


if __name__ == "__main__":
    ftnb.Tuner(trainable, param_space={"dir": sys.argv[1]},
               run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="held", verbose=0,
                                         failure_config=ftnb.FailureConfig(max_failures=1))).fit()
"""


@pytest.mark.slow
def test_a_killed_trial_or_driver_takes_its_workers_with_it(tmp_path):
    driver = run_script(tmp_path, DRIVER, str(tmp_path))
    try:
        def attempt(n):
            path = tmp_path / f"attempt-{n}.json"
            return path.exists() and json.loads(path.read_text())

        first = wait_for(lambda: attempt(1), 60, "the first attempt's workers")
        state_path = ExperimentPaths.at(str(tmp_path / "held"))

        def recorded_pid():
            try:
                return ExperimentState.load(state_path).trials[0].attempts[0].pid
            except (OSError, ValueError, IndexError, AttributeError):
                return None

        assert wait_for(recorded_pid, 30, "the attempt's pid in the state") == first["trial"]
        wait_busy(tmp_path, first["workers"])
        os.kill(first["trial"], signal.SIGKILL)
        wait_dead([first["trial"], *first["workers"]], "the killed trial's workers to die")

        second = wait_for(lambda: attempt(2), 60, "the retried attempt's workers")
        assert set(second["workers"]).isdisjoint(first["workers"])
        driver.kill()  # SIGKILL the driver itself: its trial ends at its next report
        driver.wait(10)
        wait_dead([second["trial"], *second["workers"]], "the driver's trial and workers to die")
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.communicate(timeout=30)


def test_a_local_group_keeps_no_spare_worker():
    # A local worker starts by a fork in about 0.1 s: spare_workers (for Ray) starts nothing.
    import multiprocessing

    with ftnb.WorkerGroup(Runner, 2, spare_workers=2, get_state=lambda: "v1") as group:
        assert len(multiprocessing.active_children()) == 2
        first = group.map(sigkill_worker, 1)
        assert [r.ok for r in first] == [True, False]
        again = group.map(whoami)
        assert again[1].value["states"] == ["v1"]
        assert len(multiprocessing.active_children()) == 2
        assert group.stats["workers_spare"] == 0


# -- bad input --------------------------------------------------------------------------------


def _two_args(a, b):
    return None


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"num_workers": 0}, ValueError, "num_workers=0) must be a whole number >= 1"),
        ({"num_workers": 2.5}, ValueError, "num_workers=2.5)"),
        ({"call_timeout_s": -1}, ValueError, "call_timeout_s=-1) must be a number of seconds"),
        ({"call_timeout_s": True}, ValueError, "call_timeout_s=True)"),
        ({"factory": Runner(0)}, TypeError, "must be a function that builds"),
        ({"factory": _two_args}, TypeError, "must take no argument or one"),
        ({"get_state": {"w": 1}}, TypeError, "get_state={'w': 1}) must be a function"),
        ({"max_restarts": -2}, ValueError, "max_restarts=-2) must be a whole number >= -1"),
        ({"max_in_flight_per_worker": 0}, ValueError, "max_in_flight_per_worker=0)"),
        ({"consecutive_failure_tolerance": -1}, ValueError, "consecutive_failure_tolerance=-1)"),
        ({"spare_workers": -1}, ValueError, "spare_workers=-1) must be a whole number >= 0"),
    ],
)
def test_bad_arguments_name_themselves_and_the_fix(kwargs, error, words):
    args = {"factory": Runner, "num_workers": 2, **kwargs}
    with pytest.raises(error) as info:
        ftnb.WorkerGroup(args.pop("factory"), args.pop("num_workers"), **args)
    assert words in str(info.value)


class _NoSetState:
    pass


def test_get_state_without_set_state_is_refused_at_construction():
    with pytest.raises(ftnb.WorkerGroupError) as info:
        ftnb.WorkerGroup(_NoSetState, 2, get_state=lambda: {"weights": 1})
    message = str(info.value)
    assert "has no set_state(state) method" in message
    assert "Fix: add `def set_state(self, state): ...`" in message
