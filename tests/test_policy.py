"""The failure and retention policy, table by table: no processes, no files, no clock."""

from __future__ import annotations

import math

import pytest

from ftnb.config import CheckpointConfig, FailureConfig
from ftnb.core.policy import (
    AttemptEnd,
    checkpoints_to_delete,
    classify_end,
    decide_after_failure,
    experiment_status,
    is_repeated_error,
)
from ftnb.core.records import FailureRecord, TrialRecord, TrialStatus

BOOM = {"kind": "exception", "type": "ValueError", "message": "boom", "iteration": 3,
        "traceback": "Traceback ...", "exit_code": 1}


# -- classify_end ---------------------------------------------------------------------------------
@pytest.mark.parametrize("end, outcome, kind, by_controller", [
    (AttemptEnd(outcome="finished", exit_code=0), "finished", None, False),
    (AttemptEnd(outcome="stopped", exit_code=0), "stopped", None, True),
    # killed after its grace period: the controller's doing, not a failure
    (AttemptEnd(stop_requested=True, exit_code=-9), "interrupted", None, True),
    # ...unless it raised on the way out
    (AttemptEnd(stop_requested=True, error=BOOM, exit_code=1), "failed", "exception", False),
    (AttemptEnd(outcome="preempted", exit_code=143), "preempted", "preemption", False),
    (AttemptEnd(exit_code=-15), "preempted", "preemption", False),
    (AttemptEnd(preempted=True, exit_code=143), "preempted", "preemption", False),
    (AttemptEnd(preempted=True, exit_code=1), "failed", "exit", False),
    (AttemptEnd(exit_code=143), "failed", "exit", False),  # 143 alone is just an exit code
    (AttemptEnd(error=BOOM, exit_code=1), "failed", "exception", False),
    (AttemptEnd(error={**BOOM, "kind": "oom", "type": "MemoryError"}, exit_code=1), "failed",
     "oom", False),
    (AttemptEnd(error={**BOOM, "kind": "usage"}, exit_code=1), "failed", "usage", False),
    (AttemptEnd(exit_code=-9), "failed", "signal", False),
    (AttemptEnd(exit_code=-9, oom_killed=True), "failed", "oom", False),
    (AttemptEnd(exit_code=-11), "failed", "signal", False),
    (AttemptEnd(exit_code=3), "failed", "exit", False),
    (AttemptEnd(exit_code=None), "failed", "exit", False),
    # the executor says the machine is gone: whatever the process's exit looked like
    (AttemptEnd(node_lost=True, exit_code=None), "node_lost", "node_lost", False),
    (AttemptEnd(node_lost=True, exit_code=-9, error=BOOM), "node_lost", "node_lost", False),
])
def test_classify_end(end, outcome, kind, by_controller):
    ending = classify_end(end, attempt=2, iteration=5, now=100.0)
    assert ending.outcome == outcome
    assert ending.stopped_by_controller is by_controller
    if kind is None:
        assert ending.failure is None
        return
    f = ending.failure
    assert (f.kind, f.attempt, f.time) == (kind, 2, 100.0)
    assert f.counted is (kind != "preemption")  # a lost node counts, as in Ray Tune


@pytest.mark.parametrize("exit_code, oom, signal, message", [
    (-9, False, "SIGKILL", "killed by SIGKILL"),
    (-9, True, "SIGKILL", "killed by SIGKILL (the kernel's out-of-memory killer)"),
    (-11, False, "SIGSEGV", "killed by SIGSEGV"),
    (-99, False, "signal 99", "killed by signal 99"),
])
def test_a_kill_names_its_signal(exit_code, oom, signal, message):
    f = classify_end(AttemptEnd(exit_code=exit_code, oom_killed=oom), attempt=1, iteration=0,
                     now=0.0).failure
    assert (f.signal, f.message, f.exit_code) == (signal, message, exit_code)


def test_a_raised_error_keeps_its_details_and_the_later_iteration():
    f = classify_end(AttemptEnd(error=BOOM, exit_code=1), attempt=1, iteration=2, now=0.0).failure
    assert (f.type, f.message, f.traceback, f.exit_code) == ("ValueError", "boom",
                                                            "Traceback ...", 1)
    assert f.iteration == 3  # the error's own iteration, past the last acknowledged report
    f = classify_end(AttemptEnd(error={**BOOM, "iteration": None}), attempt=1, iteration=2,
                     now=0.0).failure
    assert f.iteration == 2


def test_a_lost_node_is_named():
    f = classify_end(AttemptEnd(node_lost=True, node="10.0.0.7"), attempt=3, iteration=4,
                     now=0.0).failure
    assert f.message == "the node running the attempt was lost (10.0.0.7)"
    assert f.summary() == "node_lost the node running the attempt was lost (10.0.0.7) " \
                          "(attempt 3, iter 4)"


def test_an_exit_code_is_the_message_when_nothing_else_is_known():
    f = classify_end(AttemptEnd(exit_code=3), attempt=1, iteration=0, now=0.0).failure
    assert f.message == "the trial process exited with code 3" and f.exit_code == 3


# -- decide_after_failure ---------------------------------------------------------------------------
def _failure(attempt: int, kind: str = "exception", *, type_: str = "ValueError",
             message: str = "boom", iteration: int = 3, counted: bool = True) -> FailureRecord:
    return FailureRecord(attempt=attempt, time=float(attempt), iteration=iteration, kind=kind,
                         type=type_ if kind in ("exception", "oom", "usage") else None,
                         message=message, counted=counted)


def _trial(*failures: FailureRecord, forgiven: int = 0) -> TrialRecord:
    return TrialRecord("t", "t", {}, failures=list(failures), failures_forgiven=forgiven)


def _decide(trial: TrialRecord, stopping: bool = False, **config):
    return decide_after_failure(trial, trial.failures[-1], FailureConfig(**config),
                                stopping=stopping)


@pytest.mark.parametrize("failures, config, status, reason_has", [
    # max_failures=0: the first counted failure errors the trial
    ([_failure(1)], {}, TrialStatus.ERRORED, "it failed 1 time, more than "
                                             "FailureConfig(max_failures=0) allows"),
    ([_failure(1, "signal")], {"max_failures": 1}, TrialStatus.PENDING, None),
    ([_failure(1, "signal"), _failure(2, "signal")], {"max_failures": 1}, TrialStatus.ERRORED,
     "it failed 2 times, more than FailureConfig(max_failures=1) allows"),
    ([_failure(i, "exit", message=str(i)) for i in range(1, 101)], {"max_failures": -1},
     TrialStatus.PENDING, None),
    # a preemption is not the trial's fault: again at once, whatever the budget
    ([_failure(1, "preemption", counted=False)], {}, TrialStatus.PENDING, None),
    # a lost node counts, as in Ray Tune: within the budget again, beyond it errored
    ([_failure(1, "node_lost")], {"max_failures": 1}, TrialStatus.PENDING, None),
    ([_failure(1, "node_lost"), _failure(2, "node_lost")], {"max_failures": 1},
     TrialStatus.ERRORED, "more than"),
    # misuse of the API cannot be fixed by retrying
    ([_failure(1, "usage")], {"max_failures": 5}, TrialStatus.ERRORED, "misused"),
    # the same error at the same point twice in a row is deterministic
    ([_failure(1), _failure(2)], {"max_failures": 5}, TrialStatus.ERRORED, "twice in a row"),
    ([_failure(1), _failure(2)], {"max_failures": 5, "stop_on_repeated_error": False},
     TrialStatus.PENDING, None),
    ([_failure(1), _failure(2, iteration=4)], {"max_failures": 5}, TrialStatus.PENDING, None),
])
def test_decide_after_failure(failures, config, status, reason_has):
    decision = _decide(_trial(*failures), **config)
    assert decision.status is status
    if reason_has is None:
        assert decision.reason is None
    else:
        assert reason_has in decision.reason
    assert decision.stop_experiment is None


def test_a_stopping_experiment_pauses_the_trial_whatever_failed():
    for failure in (_failure(1), _failure(1, "usage"), _failure(1, "preemption", counted=False)):
        assert _decide(_trial(failure), stopping=True).status is TrialStatus.PAUSED


def test_fail_fast_stops_the_experiment_only_when_a_trial_errors():
    assert _decide(_trial(_failure(1)), fail_fast=True).stop_experiment == "fail_fast"
    retried = _decide(_trial(_failure(1)), fail_fast=True, max_failures=1)
    assert retried.status is TrialStatus.PENDING and retried.stop_experiment is None


def test_forgiven_failures_give_a_fresh_budget():
    old = [_failure(1, "signal"), _failure(2, "signal")]
    assert _decide(_trial(*old, _failure(3, "signal"), forgiven=2),
                   max_failures=1).status is TrialStatus.PENDING
    assert _decide(_trial(*old, _failure(3, "signal")),
                   max_failures=1).status is TrialStatus.ERRORED


# -- is_repeated_error ---------------------------------------------------------------------------
@pytest.mark.parametrize("failures, repeated", [
    ([_failure(1), _failure(2)], True),
    ([_failure(1, "oom", type_="MemoryError"), _failure(2, "oom", type_="MemoryError")], True),
    ([_failure(1)], False),
    ([_failure(1), _failure(2, message="other")], False),
    ([_failure(1), _failure(2, type_="KeyError")], False),
    ([_failure(1), _failure(2, iteration=9)], False),
    # a preemption in between does not break the run...
    ([_failure(1), _failure(2, "preemption", counted=False), _failure(3)], True),
    ([_failure(1), _failure(2, "node_lost", counted=False), _failure(3)], True),
    # ...nor does an attempt stopped with its experiment (attempt 2: paused, no failure)...
    ([_failure(1), _failure(3)], True),
    # ...but another counted failure in between does
    ([_failure(1), _failure(2, "signal"), _failure(3)], False),
    # kills are not recognisable as the same error
    ([_failure(1, "signal"), _failure(2, "signal")], False),
    ([_failure(1, "exit"), _failure(2, "exit")], False),
])
def test_is_repeated_error(failures, repeated):
    assert is_repeated_error(failures, failures[-1]) is repeated


# -- checkpoints_to_delete -------------------------------------------------------------------------
def _ckpts(*scores):
    return [{"dir_name": f"checkpoint_{i:06d}", "iteration": i + 1, "score": s}
            for i, s in enumerate(scores)]


def _deleted(checkpoints, **config):
    return [c["iteration"] for c in checkpoints_to_delete(checkpoints,
                                                          CheckpointConfig(**config))]


@pytest.mark.parametrize("scores, config, deleted", [
    ((1, 2, 3), {}, []),  # keep everything by default
    ((1, 2, 3), {"num_to_keep": 3}, []),
    ((1, 2, 3, 4), {"num_to_keep": 2}, [1, 2]),  # oldest first without a score
    ((5, 1, 9, 2), {"num_to_keep": 2, "checkpoint_score_attribute": "acc"}, [2, 1]),
    ((5, 1, 9, 2), {"num_to_keep": 2, "checkpoint_score_attribute": "loss",
                    "checkpoint_score_order": "min"}, [3, 1]),
    # a missing or NaN score is the worst; ties go to the older
    ((math.nan, 3, None, 3, 0), {"num_to_keep": 2, "checkpoint_score_attribute": "acc"},
     [1, 3, 2]),
    # the latest is kept even when it is the worst (a retry starts from it)
    ((9, 8, 1), {"num_to_keep": 1, "checkpoint_score_attribute": "acc"}, [2, 1]),
])
def test_checkpoints_to_delete(scores, config, deleted):
    assert _deleted(_ckpts(*scores), **config) == deleted


# -- experiment_status ---------------------------------------------------------------------------
@pytest.mark.parametrize("stopping, statuses, status", [
    (None, ["TERMINATED", "TERMINATED"], "FINISHED"),
    (None, ["TERMINATED", "ERRORED"], "ERRORED"),
    ("fail_fast", ["ERRORED", "PAUSED"], "ERRORED"),
    ("interrupted", ["TERMINATED", "PAUSED"], "INTERRUPTED"),
    ("stopped by user", ["ERRORED", "PAUSED"], "INTERRUPTED"),
    (None, [], "FINISHED"),
])
def test_experiment_status(stopping, statuses, status):
    assert experiment_status(stopping, statuses) == status


# -- statuses and kinds are enums with behaviour, stored as their values ----------------------------
def test_statuses_and_kinds_have_behaviour_and_are_stored_as_values():
    import json

    from ftnb.core.records import (
        AttemptOutcome,
        AttemptRecord,
        ExperimentState,
        ExperimentStatus,
        FailureKind,
    )

    assert [s.is_finished() for s in ExperimentStatus] == [False, True, True, False]
    assert [s.is_finished() for s in TrialStatus] == [False, False, False, True, True]
    assert [k.value for k in FailureKind if not k.counts_as_failure()] == ["preemption", "storage"]
    ending = classify_end(AttemptEnd(outcome="finished"), attempt=1, iteration=3, now=0.0)
    assert ending.outcome is AttemptOutcome.FINISHED
    state = ExperimentState(name="x", trainable="train", trials=[TrialRecord(
        "t", "t", {}, status=TrialStatus.TERMINATED,
        attempts=[AttemptRecord(1, 0.0, outcome=ending.outcome)])],
        status=experiment_status(None, [TrialStatus.TERMINATED]))
    stored = json.loads(json.dumps(state.to_json()))
    assert stored["status"] == "FINISHED"
    assert stored["trials"][0]["status"] == "TERMINATED"
    assert stored["trials"][0]["attempts"][0]["outcome"] == "finished"
    again = ExperimentState.from_json(stored)
    assert ExperimentStatus(again.status).is_finished()
    assert again.trials[0].trial_status is TrialStatus.TERMINATED


# -- storage faults -------------------------------------------------------------------------------
@pytest.mark.parametrize("stopping, config", [
    (False, {}), (False, {"max_failures": -1}), (True, {}), (False, {"fail_fast": True})])
def test_a_storage_fault_pauses_the_trial_stops_the_experiment_and_is_not_counted(stopping, config):
    end = AttemptEnd(error={"kind": "storage", "type": "StorageFault", "iteration": 4,
                            "message": "writing /x/result.json failed: no space left"},
                     exit_code=1)
    failure = classify_end(end, attempt=1, iteration=3, now=0.0).failure
    assert failure.kind == "storage" and not failure.counted and failure.iteration == 4
    decision = _decide(_trial(failure), stopping=stopping, **config)
    # Retrying into the same full disk helps nobody: the whole experiment stops, resumable.
    assert decision.status is TrialStatus.PAUSED
    assert decision.stop_experiment == "storage fault"
    assert experiment_status(decision.stop_experiment, ["PAUSED"]).value == "INTERRUPTED"
