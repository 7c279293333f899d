"""The executor contract (:mod:`ftnb.execution.contract`) as a test suite any executor can run.

Subclass :class:`ExecutorContract` in a test module, say which executor it tests, and pytest runs
every test of the suite on it (as fsspec's ``tests/abstract`` does for filesystems)::

    # tests/test_my_executor.py
    from ftnb.testing.executor_contract import ExecutorContract


    class TestMyExecutor(ExecutorContract):
        executor_name = "mine"  # its ``name``

        def make_executor(self, cpus, output_events):
            from my_package import MyExecutor

            return MyExecutor(cpus=cpus, output_events=output_events)

An executor is done when the suite passes on it. What a subclass provides:

* ``executor_name``: the executor's ``name``.
* :meth:`~ExecutorContract.make_executor`: a new executor with ``cpus`` CPUs and no GPU, handing
  over its attempts' output as :class:`~ftnb.execution.contract.OutputEvent` when
  ``output_events``. The default builds the registered ``executor_name``
  (:func:`ftnb.execution.create_executor`) with ``pool=ResourcePool(cpus, [])``.
* ``killed_attempts_run_on``: True if a killed attempt's code may go on running (threads cannot
  be killed outright): the suite then checks that it writes nothing more, rather than that it
  ends.
* any fixture the executor needs, as an autouse fixture of the subclass (a Ray cluster, a
  server).

The tests run real attempts (processes, threads, actors: whatever the executor makes) whose
trainables are the functions of this module, so they import wherever the attempt runs, and
write to an experiment folder in pytest's ``tmp_path``. The group tests run only on an executor
that ``runs_groups``, and need torch.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

import ftnb
from ftnb.execution import create_executor
from ftnb.execution.contract import (
    AttemptSpec,
    Capacity,
    DoneEvent,
    ErrorEvent,
    EventKind,
    Executor,
    ExitEvent,
    GroupNotSupportedError,
    NoRoomError,
    OutputEvent,
    ResultEvent,
    StartedEvent,
)
from ftnb.execution.resources import ResourcePool, TrialResources
from ftnb.storage import ExperimentPaths, Storage
from ftnb.testing.waiting import pid_alive, wait_for

__all__ = ["ExecutorContract"]


# ---- trainables (module level: they travel to processes by reference) -------------------------
def reports_three(config):
    print("hello from", config["who"])
    print("to stderr", file=sys.stderr)
    for i in range(3):
        ftnb.report({"score": i * config["step"]})
    print("bye")
    print("no newline yet", end="")


def raises_after_one(config):
    ftnb.report({"score": 1})
    raise ValueError("boom")


def reports_until_stopped(config):
    """Reports every 20 ms, counting its loops in a file (written before each report), for
    ever: only a stop request or a kill ends it."""
    loops = 0
    while True:
        loops += 1
        with open(config["loops"], "w") as f:
            f.write(str(loops))
        ftnb.report({"loops": loops})
        time.sleep(0.02)


def ignores_kills(config):
    """Swallows everything, the kill's exception and the fence included, and goes on reporting
    for ``after`` loops past the first swallowed exception."""
    left = None
    while left is None or left > 0:
        try:
            if left is not None:
                left -= 1
            ftnb.report({"loops": 1})
            time.sleep(0.02)
        except BaseException:
            if left is None:
                left = config["after"]
    with open(config["done"], "w") as f:
        f.write("done")


def exits_with(config):
    sys.exit(config["code"])


def reports_four_noting_returns(config):
    """Reports 4 times; after each report returns, notes its iteration in config["returned"]."""
    for i in range(1, 5):
        ftnb.report({"score": i})
        with open(config["returned"], "w") as f:
            f.write(str(i))


def flaky_with_checkpoints(config):
    import tempfile

    checkpoint = ftnb.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "i")) as f:
                start = int(f.read()) + 1
    for i in range(start, 4):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "i"), "w") as f:
                f.write(str(i))
            ftnb.report({"i": i}, checkpoint=ftnb.Checkpoint.from_directory(folder))
        if i == 1 and ftnb.get_context().attempt == 1:
            raise RuntimeError("flaky")


def group_reports(config):
    ctx = ftnb.get_context()
    with open(os.path.join(config["dir"], f"rank-{ctx.get_world_rank()}"), "w") as f:
        f.write(f"{ctx.get_world_size()} {os.environ['RANK']} {os.environ['MASTER_PORT']}")
    for i in range(3):
        ftnb.report({"score": i})
    if config.get("fail_rank") == ctx.get_world_rank():
        raise ValueError(f"boom in rank {ctx.get_world_rank()}")


def group_reports_noting_returns(config):
    """Every rank reports 4 times, noting after each report returns its iteration in
    ``<dir>/returned-<rank>``."""
    rank = ftnb.get_context().get_world_rank()
    for i in range(1, 5):
        ftnb.report({"score": i})
        with open(os.path.join(config["dir"], f"returned-{rank}"), "w") as f:
            f.write(str(i))


# ---- helpers -----------------------------------------------------------------------------------
def make_spec(experiment, trainable, config, trial_id="t0", attempt=1, **kw) -> AttemptSpec:
    experiment.storage.makedirs(experiment.trial(trial_id).dir)
    return AttemptSpec(
        trial_id=trial_id, attempt=attempt, trainable=trainable, config=config,
        storage=experiment.storage, experiment_dir=experiment.dir, experiment_name="exp",
        trial_dir_name=trial_id, **kw,
    )


def until(executor, stop, timeout=150.0, what="the condition") -> list:
    """Poll ``executor`` until ``stop(events so far)`` holds; the events. (150 s, as
    ``until_exit``: the first result of a Ray attempt waits for its actor's process to start,
    two of them at once in test_shutdown_ends_everything.)"""
    events: list = []
    deadline = time.monotonic() + timeout
    while not stop(events):
        assert time.monotonic() < deadline, f"timed out waiting for {what}; got {events}"
        events.extend(executor.poll(0.1))
    return events


def until_exit(executor, trial_id="t0", timeout=150.0) -> list:
    # 150 s: a Ray group's two rank processes (ray, torch, gloo) took over 60 s to start, fail
    # and exit on two cores at load 15.
    return until(executor, lambda evs: any(isinstance(e, ExitEvent) and e.trial_id == trial_id
                                           for e in evs),
                 timeout, f"the exit of {trial_id}")


def of(events, trial_id="t0"):
    return [e for e in events if e.trial_id == trial_id]


def rows_of(experiment, trial_id="t0") -> list[dict]:
    return experiment.trial(trial_id).read_results()


# ---- the suite ---------------------------------------------------------------------------------
class ExecutorContract:
    """The executor contract's tests; subclass it to run them on an executor (see the module
    docstring)."""

    #: The executor's ``name`` (and, for the default :meth:`make_executor`, its registered name).
    executor_name: str = ""
    #: Whether a killed attempt's code may go on running (threads): then it must write nothing.
    killed_attempts_run_on: bool = False

    def make_executor(self, cpus: float, output_events: bool) -> Executor:
        """A new executor with ``cpus`` CPUs and no GPU (the caller shuts it down)."""
        return create_executor(self.executor_name, pool=ResourcePool(cpus, []),
                               output_events=output_events)

    @pytest.fixture
    def executor(self):
        """A new executor of 2 CPUs that hands output over, shut down after the test."""
        made = self.make_executor(2, output_events=True)
        yield made
        made.shutdown()

    @pytest.fixture
    def experiment(self, tmp_path):
        """An experiment's folders, in ``tmp_path``."""
        return ExperimentPaths.of(Storage(str(tmp_path / "runs")), "exp")

    def test_it_is_an_executor_and_says_what_it_has(self, executor):
        assert isinstance(executor, Executor) and executor.name == self.executor_name
        assert executor.capacity() == Capacity(2.0, ())
        assert executor.running() == []
        assert executor.has_room(TrialResources(cpu=2))

    def test_an_attempt_runs_to_its_end_in_order(self, executor, experiment):
        spec = make_spec(experiment, reports_three, {"who": "t0", "step": 2})
        executor.start(spec)
        assert executor.running() == ["t0"]
        events = until_exit(executor)
        assert all(e.trial_id == "t0" and e.attempt == 1 for e in events)
        lifecycle = [e for e in events if not isinstance(e, OutputEvent)]
        assert [e.kind for e in lifecycle] == [EventKind.STARTED] + [EventKind.RESULT] * 3 + [
            EventKind.DONE, EventKind.EXIT]
        assert isinstance(events[-1], ExitEvent)  # last, output included
        results = [e for e in lifecycle if isinstance(e, ResultEvent)]
        assert [(r.row["training_iteration"], r.row["score"], r.rank) for r in results] == [
            (1, 0, 0), (2, 2, 0), (3, 4, 0)]
        # a result event is news of a row already on storage
        assert [r["score"] for r in rows_of(experiment)] == [0, 2, 4]
        done, end = lifecycle[-2], lifecycle[-1]
        assert isinstance(done, DoneEvent) and (done.outcome, done.iteration) == ("finished", 3)
        assert (end.exit_code, end.first_failing_rank, end.node_lost) == (0, None, False)
        assert [(r.rank, r.exit_code) for r in end.ranks] == [(0, 0)]
        started = lifecycle[0]
        assert isinstance(started, StartedEvent)
        # released by the time its exit is handed over; nothing of it comes afterwards
        assert executor.running() == []
        assert executor.has_room(TrialResources(cpu=2))
        assert of(executor.poll(0.3)) == []

    def test_output_is_handed_over_in_whole_lines_before_the_exit(self, executor, experiment):
        executor.start(make_spec(experiment, reports_three, {"who": "t0", "step": 1}))
        events = until_exit(executor)
        exit_at = next(i for i, e in enumerate(events) if isinstance(e, ExitEvent))
        out = [e for e in events if isinstance(e, OutputEvent)]
        assert out and all(events.index(e) < exit_at for e in out)
        text = {s: "".join(e.text for e in out if e.stream == s) for s in ("stdout", "stderr")}
        # no partial line
        assert text == {"stdout": "hello from t0\nbye\n", "stderr": "to stderr\n"}

    def test_no_output_events_unless_asked(self, experiment):
        executor = self.make_executor(1, output_events=False)
        try:
            executor.start(make_spec(experiment, reports_three, {"who": "t0", "step": 1}))
            events = until_exit(executor)
        finally:
            executor.shutdown()
        assert not [e for e in events if isinstance(e, OutputEvent)]
        assert [e.kind for e in events][-2:] == [EventKind.DONE, EventKind.EXIT]

    def test_a_raised_error_is_reported_by_its_rank(self, executor, experiment):
        executor.start(make_spec(experiment, raises_after_one, {}))
        events = [e for e in until_exit(executor) if not isinstance(e, OutputEvent)]
        assert [e.kind for e in events] == [EventKind.STARTED, EventKind.RESULT, EventKind.ERROR,
                                            EventKind.EXIT]
        error, end = events[2], events[3]
        assert isinstance(error, ErrorEvent)
        assert (error.failure_kind, error.type, error.message, error.iteration, error.rank) == (
            "exception", "ValueError", "boom", 1, 0)
        assert "raise ValueError" in error.traceback
        assert error.as_failure()["kind"] == "exception"
        assert (end.exit_code, end.first_failing_rank) == (1, 0)

    def test_sys_exit_is_an_error_with_its_code(self, executor, experiment):
        executor.start(make_spec(experiment, exits_with, {"code": 3}))
        events = [e for e in until_exit(executor) if not isinstance(e, OutputEvent)]
        error, end = events[-2], events[-1]
        assert isinstance(error, ErrorEvent)
        assert (error.failure_kind, error.exit_code) == ("exit", 3)
        assert (end.exit_code, end.first_failing_rank) == (3, 0)

    def test_request_stop_ends_it_at_its_next_report(self, executor, experiment, tmp_path):
        loops = str(tmp_path / "loops")
        executor.start(make_spec(experiment, reports_until_stopped, {"loops": loops}))
        until(executor, lambda evs: any(isinstance(e, ResultEvent) for e in evs), what="a result")
        executor.request_stop("t0")
        events = [e for e in until_exit(executor) if not isinstance(e, OutputEvent)]
        done, end = events[-2], events[-1]
        assert isinstance(done, DoneEvent) and done.outcome == "stopped"
        assert (end.exit_code, end.first_failing_rank) == (0, None)
        executor.request_stop("t0")  # not running any more: nothing happens

    @pytest.mark.parametrize("answer", ["continue", "stop"])
    def test_a_report_at_a_decision_point_waits_for_the_answer(self, executor, experiment,
                                                               tmp_path, answer):
        from ftnb.schedulers.decision_points import DecisionPoints

        returned = tmp_path / "returned"
        executor.start(make_spec(experiment, reports_four_noting_returns,
                                 {"returned": str(returned)},
                                 decision_points=DecisionPoints("training_iteration",
                                                                milestones=(2,))))
        events = until(executor, lambda evs: any(isinstance(e, ResultEvent) and e.awaits_decision
                                                 for e in evs), what="the decision point")
        results = [e for e in events if isinstance(e, ResultEvent)]
        assert [(e.row["training_iteration"], e.awaits_decision) for e in results] == [
            (1, False), (2, True)]
        # It waits: report 2 does not return, nothing more is reported, until the answer.
        assert not [e for e in executor.poll(0.5) if isinstance(e, ResultEvent)]
        assert returned.read_text() == "1" and len(rows_of(experiment)) == 2
        executor.decide("t0", 2, answer)
        events = [e for e in until_exit(executor) if not isinstance(e, OutputEvent)]
        done = next(e for e in events if isinstance(e, DoneEvent))
        rows = [r["training_iteration"] for r in rows_of(experiment)]
        if answer == "stop":  # it ends exactly there
            assert (done.outcome, rows, returned.read_text()) == ("stopped", [1, 2], "1")
        else:
            assert (done.outcome, rows, returned.read_text()) == ("finished", [1, 2, 3, 4], "4")
        assert events[-1].exit_code == 0
        executor.decide("t0", 3, "stop")  # not running any more: dropped

    def test_kill_ends_it_with_a_sigkill_and_nothing_after(self, executor, experiment, tmp_path):
        loops = str(tmp_path / "loops")
        executor.start(make_spec(experiment, reports_until_stopped, {"loops": loops}))
        first = until(executor, lambda evs: any(isinstance(e, ResultEvent) for e in evs),
                      what="a result")
        pids = next(e.pids for e in first if isinstance(e, StartedEvent))
        executor.kill("t0")
        events = until_exit(executor)
        end = events[-1]
        assert isinstance(end, ExitEvent) and end.signal_number == signal.SIGKILL
        assert end.first_failing_rank == 0 and [r.signal_number for r in end.ranks] == [9]
        assert [e for e in events if isinstance(e, ExitEvent)] == [end]
        assert executor.running() == [] and executor.has_room(TrialResources(cpu=2))
        for pid in pids:  # a process of its own, if it had one, is gone
            assert not pid_alive(pid)
        assert of(executor.poll(0.3)) == []

    def test_resources_are_refused_when_full(self, executor, experiment, tmp_path):
        big = TrialResources(cpu=2)
        executor.start(make_spec(experiment, reports_until_stopped, {"loops": str(tmp_path / "a")},
                                 resources=big))
        assert not executor.has_room(TrialResources(cpu=1))
        assert executor.has_room(TrialResources(cpu=0))
        with pytest.raises(NoRoomError, match="no room for trial 't1'"):
            executor.start(make_spec(experiment, reports_until_stopped,
                                     {"loops": str(tmp_path / "b")}, trial_id="t1"))
        with pytest.raises(ValueError, match="already has a running attempt"):
            executor.start(make_spec(experiment, reports_until_stopped,
                                     {"loops": str(tmp_path / "c")}, attempt=2))
        with pytest.raises(ValueError, match="can never be satisfied"):
            executor.has_room(TrialResources(cpu=3))
        executor.kill("t0")
        until_exit(executor)
        assert executor.has_room(big)
        assert executor.running() == []

    def test_a_group_it_cannot_run_is_refused_before_anything_starts(self, executor, experiment):
        if executor.runs_groups:
            # It runs groups, but not one bigger than its machine: refused before anything starts.
            too_many = int(executor.capacity().cpus) + 1
            spec = make_spec(experiment, reports_three, {"who": "t0", "step": 1},
                             num_workers=too_many)
            with pytest.raises(ValueError, match=rf"ScalingConfig\(num_workers={too_many}.*Fix:"):
                executor.start(spec)
            assert executor.running() == []
            assert executor.has_room(TrialResources(), 2 if too_many > 2 else 1)
            assert executor.poll(0.1) == []
            return
        spec = make_spec(experiment, reports_three, {"who": "t0", "step": 1}, num_workers=2)
        with pytest.raises(GroupNotSupportedError) as info:
            executor.start(spec)
        message = str(info.value)
        assert message.startswith(f"num_workers=2: the {executor.name!r} executor runs an attempt")
        assert "Fix: use num_workers=1" in message and "\n" not in message
        with pytest.raises(GroupNotSupportedError):
            executor.check_fits(TrialResources(), num_workers=2)
        assert executor.running() == [] and executor.has_room(TrialResources(cpu=2))
        assert executor.poll(0.1) == []

    def test_shutdown_ends_everything(self, executor, experiment, tmp_path):
        for trial_id in ("t0", "t1"):
            executor.start(make_spec(experiment, reports_until_stopped,
                                     {"loops": str(tmp_path / trial_id)}, trial_id=trial_id))
        events = until(executor, lambda evs: {e.trial_id for e in evs
                                              if isinstance(e, ResultEvent)} == {"t0", "t1"},
                       what="both to report")
        pids = [p for e in events if isinstance(e, StartedEvent) for p in e.pids]
        executor.shutdown()
        assert executor.running() == []
        for pid in pids:
            assert not pid_alive(pid)
        wait_for(lambda: not [t for t in threading.enumerate()
                              if t.name.startswith("ftnb-attempt-")], timeout=30,
                 what="the attempts' threads to end")
        with pytest.raises(RuntimeError, match="shut down"):
            executor.start(make_spec(experiment, reports_three, {"who": "t2", "step": 1},
                                     trial_id="t2"))
        executor.shutdown()  # twice is fine

    def test_a_killed_attempt_writes_nothing_more(self, executor, experiment, tmp_path):
        """Even one that swallows the kill (a thread cannot be killed outright): every report it
        makes afterwards is fenced before it writes, and no event of it is handed over."""
        done = str(tmp_path / "done")
        executor.start(make_spec(experiment, ignores_kills, {"done": done, "after": 5}))
        until(executor, lambda evs: any(isinstance(e, ResultEvent) for e in evs), what="a result")
        executor.kill("t0")
        until_exit(executor)
        rows = len(rows_of(experiment))
        if not self.killed_attempts_run_on:
            return  # its process is killed: nothing of it runs any more
        # the thread goes on for 5 more loops, each report of them fenced
        wait_for(lambda: os.path.exists(done), timeout=30,
                 what="the attempt to loop on past its kill")
        assert len(rows_of(experiment)) == rows
        assert of(executor.poll(0.1)) == []

    def test_the_controller_runs_on_it(self, tmp_path):
        """A retry from a checkpoint, end to end, on the executor (the in-process one makes such
        controller tests fast)."""
        executor = self.make_executor(2, output_events=False)
        grid = ftnb.Tuner(
            flaky_with_checkpoints, param_space={"x": ftnb.grid_search([1, 2])},
            run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="e", verbose=0,
                                      executor=executor,
                                      failure_config=ftnb.FailureConfig(max_failures=1)),
        ).fit()
        assert executor.running() == []
        assert grid.num_errors == 0 and grid.num_terminated == 2
        for result in grid:
            assert [r["i"] for r in result.metrics_dataframe.to_dict("records")] == [0, 1, 2, 3]
        state = json.loads((tmp_path / "e" / "experiment_state.json").read_text())
        for trial in state["trials"]:
            assert [a["outcome"] for a in trial["attempts"]] == ["failed", "finished"]
            assert [f["type"] for f in trial["failures"]] == ["RuntimeError"]
        with pytest.raises(RuntimeError, match="shut down"):  # the controller shut it down
            executor.start(make_spec(ExperimentPaths.of(Storage(str(tmp_path)), "e"),
                                    reports_three, {}))

    def _group_executor(self, executor):
        """Skip a group test where the executor runs no groups, or torch is missing."""
        if not executor.runs_groups:
            pytest.skip(f"the {executor.name!r} executor runs no groups")
        pytest.importorskip("torch")

    def test_a_group_is_one_attempt_with_one_started_done_and_exit_event(
            self, executor, experiment, tmp_path):
        self._group_executor(executor)
        spec = make_spec(experiment, group_reports, {"dir": str(tmp_path)}, num_workers=2,
                         resources=TrialResources(cpu=0.5))
        executor.start(spec)
        events = until_exit(executor)
        kinds = [e.kind.value for e in events if e.kind.value != "output"]
        assert kinds == ["started", "result", "result", "result", "done", "exit"]
        started, exit_event = events[0], events[-1]
        assert len(started.pids) == 2 and len(set(started.pids)) == 2
        assert [r.rank for r in exit_event.ranks] == [0, 1]
        assert all(r.exit_code == 0 for r in exit_event.ranks)
        assert exit_event.first_failing_rank is None
        assert [r["score"] for r in rows_of(experiment)] == [0, 1, 2]  # rank 0's rows only
        seen = [(tmp_path / f"rank-{r}").read_text().split() for r in (0, 1)]
        assert [s[:2] for s in seen] == [["2", "0"], ["2", "1"]]
        assert seen[0][2] == seen[1][2]  # one rendezvous port for the group
        assert executor.has_room(TrialResources(cpu=1), 2)  # every rank's allocation released

    def test_a_groups_decision_ends_every_rank_at_that_report(self, executor, experiment, tmp_path):
        from ftnb.schedulers.decision_points import DecisionPoints

        self._group_executor(executor)
        executor.start(make_spec(experiment, group_reports_noting_returns, {"dir": str(tmp_path)},
                                 num_workers=2, resources=TrialResources(cpu=0.5),
                                 decision_points=DecisionPoints("training_iteration",
                                                                milestones=(2,))))
        until(executor, lambda evs: any(isinstance(e, ResultEvent) and e.awaits_decision
                                        for e in evs), what="rank 0's decision point")
        executor.decide("t0", 2, "stop")
        events = [e for e in until_exit(executor) if not isinstance(e, OutputEvent)]
        assert [e.kind.value for e in events][-2:] == ["done", "exit"]
        assert events[-2].outcome == "stopped"
        assert all(r.exit_code == 0 for r in events[-1].ranks)
        assert [r["training_iteration"] for r in rows_of(experiment)] == [1, 2]
        # Every rank's report of iteration 2 ended its attempt: none returned from it.
        assert [(tmp_path / f"returned-{r}").read_text() for r in (0, 1)] == ["1", "1"]

    def test_a_rank_that_raises_ends_the_group_and_is_its_first_failing_rank(
            self, executor, experiment, tmp_path):
        self._group_executor(executor)
        spec = make_spec(experiment, group_reports, {"dir": str(tmp_path), "fail_rank": 1},
                         num_workers=2, resources=TrialResources(cpu=0.5))
        executor.start(spec)
        events = until_exit(executor)
        errors = [e for e in events if isinstance(e, ErrorEvent)]
        assert [(e.rank, e.type) for e in errors][:1] == [(1, "ValueError")]
        exit_event = events[-1]
        assert exit_event.first_failing_rank == 1 and exit_event.ranks[1].exit_code == 1
        assert not exit_event.ranks[1].collateral
        assert executor.running() == []
