"""The controller's parts that decide without processes, as tables: the stop criterion, which
attempts hang, what a report and a first report after a failure change in a trial's record,
what the failure policy is told of an ended attempt, and the scheduler bookkeeping's typed
answers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ftnb.core.attempt_ends import attempt_end
from ftnb.core.live_attempt import LiveAttempt, hung_attempts, record_recovery, take_result
from ftnb.core.records import AttemptRecord, FailureRecord, TrialRecord
from ftnb.core.scheduling import SchedulerAnswer, SchedulerBookkeeping
from ftnb.schedulers.stop_criterion import stop_met
from ftnb.execution.contract import ErrorEvent, ExitEvent, RankExit


@pytest.mark.parametrize("row, stop, expected", [
    ({"training_iteration": 3}, {"training_iteration": 3}, True),
    ({"training_iteration": 2}, {"training_iteration": 3}, False),
    ({"loss": 0.5}, {"training_iteration": 3}, False),  # not reported: not met
    ({"done": True}, {"done": 1}, True),  # Ray: done ends the trial, and True >= 1
    ({"training_iteration": 9}, lambda trial_id, row: True, False),  # judged by the trial
    (None, {"training_iteration": 1}, False),
    ({"training_iteration": 1}, None, False),
])
def test_the_stop_criterion(row, stop, expected):
    assert stop_met(row, stop) is expected


@pytest.mark.parametrize("fields, expected", [
    ({"heard_at": 0.0}, {"a": 12.0}),
    ({"heard_at": 9.0}, {}),  # reported lately
    ({"heard_at": None}, {}),  # not started yet
    ({"heard_at": 0.0, "stop_requested_at": 1.0}, {}),  # its grace period applies
    ({"heard_at": 0.0, "preempted": True}, {}),
    ({"heard_at": 0.0, "outcome": "finished"}, {}),  # its trainable returned
    ({"heard_at": 0.0, "silent_for_s": 11.0}, {}),  # already killed for it
])
def test_which_attempts_hang(fields, expected):
    live = {"a": LiveAttempt(1, **fields)}
    assert hung_attempts(live, now=12.04, timeout_s=5.0) == expected


def test_a_report_with_a_checkpoint_becomes_the_latest():
    trial = TrialRecord(trial_id="t", dir_name="t", config={}, next_checkpoint_index=1)
    assert not take_result(trial, {"training_iteration": 1}, "score")
    assert trial.iteration == 1 and trial.latest_checkpoint is None
    row = {"training_iteration": 2, "checkpoint_dir_name": "checkpoint_000004",
           "time_total_s": 3.5, "score": 0.25}
    assert take_result(trial, row, "score")
    assert trial.latest_checkpoint == {"dir_name": "checkpoint_000004", "iteration": 2,
                                       "time_total_s": 3.5, "score": 0.25}
    assert trial.checkpoints == [trial.latest_checkpoint]
    assert trial.next_checkpoint_index == 5 and trial.last_result is row


@pytest.mark.parametrize("failed_attempt, recovered_s, expected", [
    (1, None, 4.0),  # the attempt before failed: the restart took 4 s
    (0, None, None),  # an older failure
    (1, 2.0, 2.0),  # already recorded
])
def test_the_time_a_restart_took(failed_attempt, recovered_s, expected):
    failure = FailureRecord(attempt=failed_attempt, time=10.0, iteration=3, kind="signal",
                            recovered_s=recovered_s)
    trial = TrialRecord(trial_id="t", dir_name="t", config={}, failures=[failure],
                        attempts=[AttemptRecord(1, 0.0), AttemptRecord(2, 11.0)])
    record_recovery(trial, now=14.0)
    assert failure.recovered_s == expected


def test_an_ended_group_names_its_first_failing_rank():
    live = LiveAttempt(1, stop_requested_at=None)
    live.errors[0] = ErrorEvent("t", 1, type="RuntimeError", message="peer closed", rank=0)
    live.errors[1] = ErrorEvent("t", 1, type="ValueError", message="bad", rank=1)
    exit_event = ExitEvent("t", 1, (RankExit(0, 1, collateral=True), RankExit(1, 1)), 1)
    end, error = attempt_end(live, exit_event)
    assert error is live.errors[1]
    assert end.rank == 1 and end.exit_code == 1 and not end.hung
    assert [entry["rank"] for entry in end.ranks] == [0, 1]
    one, _ = attempt_end(LiveAttempt(1), ExitEvent.of_one("t", 1, -9))
    assert one.rank is None and one.ranks == () and one.exit_code == -9


class _Scheduler:
    def __init__(self, decision):
        self.decision = decision

    def on_trial_add(self, view, trial):
        pass

    def on_trial_result(self, view, trial, row):
        return self.decision

    def stop_note(self, trial):
        return "stopped by the rule"


def _bookkeeping(decision, stop=None, stopping=None, live=None):
    persisted = []
    controller = SimpleNamespace(run_config=SimpleNamespace(stop=stop), live=live or {},
                                 stopping=stopping, dirty=False,
                                 persist_trial=persisted.append)
    scheduler = None if decision is None else _Scheduler(decision)
    return SchedulerBookkeeping(controller, scheduler), persisted


@pytest.mark.parametrize("decision, awaits, live, stopping, expected", [
    (None, True, LiveAttempt(1), None, "continue"),  # no scheduler: a waiting report goes on
    (None, False, LiveAttempt(1), None, None),
    ("CONTINUE", True, LiveAttempt(1), None, "continue"),
    ("CONTINUE", True, LiveAttempt(1), "stopped", "stop"),  # the experiment is stopping
    ("CONTINUE", False, LiveAttempt(1, stop_requested_at=1.0), None, "stop"),
    ("PAUSE", True, LiveAttempt(1), None, "pause"),
    ("STOP", False, LiveAttempt(1), None, "stop"),
])
def test_the_scheduler_answers_a_report(decision, awaits, live, stopping, expected):
    book, persisted = _bookkeeping(decision, stopping=stopping, live={"t": live})
    trial = TrialRecord(trial_id="t", dir_name="t", config={}, iteration=4)
    answer = book.on_result(trial, {"training_iteration": 4}, awaits)
    if expected is None:
        assert answer is None
        return
    assert answer == SchedulerAnswer("t", 4, expected)
    if decision == "STOP":
        assert book.decided["t"] == {"decision": "STOP", "iteration": 4,
                                     "note": "stopped by the rule"}
        assert trial.note == "stopped by the rule" and persisted == [trial]
        assert book.stopped("t")
    if decision == "PAUSE":
        assert book.decided["t"] == {"decision": "PAUSE", "iteration": 4} and live.pausing
    if decision is not None:
        assert book.fed["t"] == 4


def test_a_result_meeting_the_stop_criterion_is_fed_not_decided():
    book, _ = _bookkeeping("STOP", stop={"training_iteration": 4})
    trial = TrialRecord(trial_id="t", dir_name="t", config={}, iteration=4)
    assert book.on_result(trial, {"training_iteration": 4}, False) is None
    assert book.fed == {"t": 4} and book.decided == {}
