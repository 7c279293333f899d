"""What the controller tracks about a running attempt beyond its persisted record:
:class:`LiveAttempt` (lost with the driver, by design: a restore starts every attempt anew),
which of them hang (:func:`hung_attempts`, over :mod:`ftnb.core.hang_watch`'s rule), and what
a report of one changes in its trial's record (:func:`take_result`, :func:`record_recovery`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from ..config import metric_value
from ..execution.contract import AttemptEvent, DoneEvent, ErrorEvent, EventKind, StartedEvent
from ..storage import checkpoint_index
from .hang_watch import silent_attempts
from .records import AttemptRecord, TrialRecord

__all__ = ["LiveAttempt", "hung_attempts", "record_recovery", "take_result"]


@dataclass
class LiveAttempt:
    """What the controller tracks about a running attempt, beyond the persisted record."""

    attempt: int
    errors: dict[int, ErrorEvent] = field(default_factory=dict)  # by rank, first each
    outcome: Optional[str] = None
    preempted: bool = False
    stop_requested_at: Optional[float] = None
    reported: bool = False  # a result of this attempt arrived
    #: The scheduler paused the trial: its attempt ends at a report, the trial waits PAUSED.
    pausing: bool = False
    #: An elastic group asked to checkpoint and re-form bigger (ftnb.core.resizing).
    resizing: bool = False
    #: When (time.monotonic()) the attempt's process started (None: not yet; on Ray it may
    #: wait for room) or last reported: FailureConfig(hang_timeout_s) counts from there; and
    #: how long it had been silent, once killed for it.
    heard_at: Optional[float] = None
    silent_for_s: Optional[float] = None

    def hear(self, event: AttemptEvent, record: AttemptRecord, now: float) -> None:
        """Take what ``event`` (started, error, preempted, done) says of this attempt, whose
        record is ``record``; ``now`` is time.monotonic()'s."""
        kind = event.kind
        if kind is EventKind.STARTED:
            assert isinstance(event, StartedEvent)
            record.pid = event.pids[0] if event.pids else None
            self.heard_at = now
            if len(event.pids) > 1:
                record.pids = list(event.pids)
        elif kind is EventKind.ERROR:
            assert isinstance(event, ErrorEvent)
            self.errors.setdefault(event.rank, event)
        elif kind is EventKind.PREEMPTED:
            self.preempted = True
        elif kind is EventKind.DONE:
            assert isinstance(event, DoneEvent)
            self.outcome = event.outcome


def hung_attempts(live: Mapping[str, LiveAttempt], *, now: float,
                  timeout_s: Optional[float]) -> dict[str, float]:
    """The running attempts (by trial id) silent for longer than ``timeout_s``
    (FailureConfig(hang_timeout_s)), each with how long, rounded to a tenth of a second: the
    controller kills them and their ends are failures of kind ``hang``.

    Not watched: an attempt asked to stop or preempted (its grace period applies), one whose
    trainable returned (ending is ftnb's part), one already killed for hanging."""
    watched = {trial_id: attempt.heard_at if attempt.stop_requested_at is None
               and not attempt.preempted and attempt.outcome is None
               and attempt.silent_for_s is None else None
               for trial_id, attempt in live.items()}
    return {trial_id: round(silent_for_s, 1) for trial_id, silent_for_s
            in silent_attempts(watched, now=now, timeout_s=timeout_s).items()}


#: The key of a trial's message that records a validation's outcome (not a new result):
#: ``{VALIDATION_RECORD: checkpoint name, "row": the report's row with it merged}``.
VALIDATION_RECORD = "__ftnb_validation__"


def validation_pending(row: Mapping) -> bool:
    """Whether ``row`` asked for a validation that has not ended (ftnb.train.validation)."""
    state = row.get("validation")
    return isinstance(state, dict) and state.get("status") == "pending"


def take_validation(trial: TrialRecord, message: Mapping, score_attribute: Optional[str]) -> bool:
    """Record in ``trial`` the validated row of one of its checkpoints: its score (by
    ``score_attribute``) and, when it is the last result, ``last_result``. Returns whether the
    checkpoint is still kept (the retention policy then applies again)."""
    row = dict(message["row"])
    name = message[VALIDATION_RECORD]
    if trial.last_result and trial.last_result.get("checkpoint_dir_name") == name:
        trial.last_result = row
    for entry in trial.checkpoints:
        if entry["dir_name"] == name:
            entry.pop("validation_pending", None)
            if score_attribute:
                entry["score"] = metric_value(row, score_attribute)
            if trial.latest_checkpoint and trial.latest_checkpoint.get("dir_name") == name:
                trial.latest_checkpoint = dict(entry)
            return True
    return False


def take_result(trial: TrialRecord, row: dict, score_attribute: Optional[str]) -> bool:
    """Record in ``trial`` its stored report ``row``: its iteration, its last result and, when
    the row names one, its new latest checkpoint (scored by ``score_attribute``, if given).
    Returns whether a checkpoint was added (the retention policy then applies)."""
    trial.iteration = row.get("training_iteration", trial.iteration)
    trial.last_result = row
    name = row.get("checkpoint_dir_name")
    if not name:
        return False
    entry = {
        "dir_name": name,
        "iteration": trial.iteration,
        "time_total_s": row.get("time_total_s", 0.0),
    }
    if score_attribute:
        entry["score"] = metric_value(row, score_attribute)
    if validation_pending(row):
        entry["validation_pending"] = True  # kept by retention until its score is known
    trial.checkpoints.append(entry)
    trial.latest_checkpoint = entry
    index = checkpoint_index(name)
    if index is not None:
        trial.next_checkpoint_index = max(trial.next_checkpoint_index, index + 1)
    return True


def record_recovery(trial: TrialRecord, now: float) -> None:
    """An attempt's first report (at ``now``, time.time()'s): if it follows a failure of the
    attempt before, record how long the restart took (from the failure to this first step from
    the checkpoint)."""
    if not trial.failures:
        return
    failure = trial.failures[-1]
    if failure.attempt == trial.attempts[-1].number - 1 and failure.recovered_s is None:
        failure.recovered_s = round(max(0.0, now - failure.time), 3)
