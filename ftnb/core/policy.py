"""The failure and retention policy: pure functions over records that return decisions.

Nothing here touches a process, a file or a clock: the controller passes in what happened (an
:class:`AttemptEnd`), the trial's record and the user's configs, gets back a small decision, and
carries it out. So every rule (retry from the checkpoint, errored, not counted, repeated error,
fail-fast, which checkpoints to delete) is tested by tables of cases, without processes.

    >>> end = AttemptEnd(exit_code=-9)
    >>> ending = classify_end(end, attempt=2, iteration=7, now=0.0)
    >>> ending.outcome, ending.failure.kind, ending.failure.signal
    ('failed', 'signal', 'SIGKILL')
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ..config import CheckpointConfig, FailureConfig
from ..execution.contract import EXIT_PREEMPTED
from .records import (
    AttemptOutcome,
    ExperimentStatus,
    FailureKind,
    FailureRecord,
    TrialRecord,
    TrialStatus,
)

__all__ = [
    "STORAGE_FAULT",
    "AttemptEnd",
    "Ending",
    "FailureDecision",
    "checkpoints_to_delete",
    "classify_end",
    "decide_after_failure",
    "experiment_status",
    "is_repeated_error",
    "signal_name",
]



#: Why an experiment stops when its storage refused a write (``Controller.stopping``).
STORAGE_FAULT = "storage fault"


@dataclass(frozen=True)
class AttemptEnd:
    """What is known when an attempt has ended: what it said about itself, and how it exited.

    ``outcome`` is the attempt's own word ("finished", "stopped", "preempted") when it ended on
    its own terms; ``error`` the error it reported (a dict with kind, type, message, traceback,
    iteration, exit_code); ``preempted`` whether it said it was being preempted;
    ``exit_code`` how its process ended (negative: killed by that signal; None: unknown);
    ``oom_killed`` whether the kernel's OOM killer did it; ``stop_requested`` whether the
    controller had asked it to stop (a stop request, or a kill after the grace period);
    ``node_lost`` the executor's word that the machine running it is gone (``node`` names it).
    """

    outcome: Optional[str] = None
    error: Optional[dict] = None
    preempted: bool = False
    exit_code: Optional[int] = None
    oom_killed: bool = False
    stop_requested: bool = False
    node_lost: bool = False
    node: Optional[str] = None
    #: In a group: the first failing rank (the cause: ``error``, ``exit_code`` and ``oom_killed``
    #: are its), whether it hung, and how every rank ended (FailureRecord.ranks' entries).
    rank: Optional[int] = None
    hung: bool = False
    ranks: tuple = ()
    #: Set when the controller killed the attempt because it had not reported for this many
    #: seconds (FailureConfig(hang_timeout_s)): it hung, however its process then ended.
    silent_for_s: Optional[float] = None

    @property
    def signal_number(self) -> Optional[int]:
        return -self.exit_code if self.exit_code is not None and self.exit_code < 0 else None


@dataclass(frozen=True)
class Ending:
    """How an attempt ended: its recorded ``outcome`` (finished | stopped | interrupted |
    preempted | node_lost | failed), the :class:`FailureRecord` to record if any, and whether the controller
    stopped it."""

    outcome: AttemptOutcome
    failure: Optional[FailureRecord] = None
    stopped_by_controller: bool = False


def classify_end(end: AttemptEnd, *, attempt: int, iteration: int, now: float) -> Ending:
    """Classify an ended attempt (number ``attempt``, at ``iteration``) into an :class:`Ending`.

    A trial that finished, or that the controller stopped without an error, has no failure.
    A SIGTERM (or an attempt that said it was preempted and exited with 143) is a preemption,
    not counted against ``max_failures``; a lost node is counted, as in Ray Tune. Otherwise the error the trial reported is the failure;
    failing that, the signal (SIGKILL by the OOM killer is ``oom``) or the exit code.
    """
    sig = end.signal_number
    if end.outcome == AttemptOutcome.FINISHED:
        return Ending(AttemptOutcome.FINISHED)
    if end.silent_for_s is not None:
        # Killed for hanging: its signal (SIGKILL, or a SIGTERM it got meanwhile) is ours.
        return Ending(AttemptOutcome.FAILED, FailureRecord(
            attempt=attempt, time=now, iteration=iteration, kind=FailureKind.HANG.value,
            message=f"it had not reported for {end.silent_for_s:g} s and was killed "
                    "(FailureConfig(hang_timeout_s))",
            exit_code=end.exit_code,
            signal=signal_name(sig) if sig is not None else None))
    if end.outcome == AttemptOutcome.STOPPED or (end.stop_requested and end.error is None):
        # Stopped by the controller: at a report, or killed after its grace period ran out.
        return Ending(AttemptOutcome.STOPPED if end.outcome == AttemptOutcome.STOPPED else AttemptOutcome.INTERRUPTED,
                      stopped_by_controller=True)
    if end.node_lost:
        where = f" ({end.node})" if end.node else ""
        return Ending(AttemptOutcome.NODE_LOST, FailureRecord(
            attempt=attempt, time=now, iteration=iteration, kind=FailureKind.NODE_LOST.value,
            message=f"the node running the attempt was lost{where}"))
    if (end.outcome == AttemptOutcome.PREEMPTED or sig == _signal.SIGTERM
            or (end.preempted and end.exit_code == EXIT_PREEMPTED)):
        return Ending(AttemptOutcome.PREEMPTED, FailureRecord(
            attempt=attempt, time=now, iteration=iteration, kind=FailureKind.PREEMPTION.value,
            signal="SIGTERM", message="preempted (SIGTERM)", counted=False))
    failure = _failure(end, attempt=attempt, iteration=iteration, now=now)
    if end.rank is not None:
        failure.rank = end.rank
        failure.ranks = [dict(entry) for entry in end.ranks]
    return Ending(AttemptOutcome.FAILED, failure)


def _failure(end: AttemptEnd, *, attempt: int, iteration: int, now: float) -> FailureRecord:
    if end.hung and end.error is None:
        return FailureRecord(
            attempt=attempt, time=now, iteration=iteration, kind=FailureKind.HANG.value,
            message=f"rank {end.rank} stopped making progress (stopped, deadlocked or cut off) "
                    "and was killed: see ScalingConfig(collective_timeout_s)",
            exit_code=end.exit_code, signal=signal_name(end.signal_number) if end.signal_number else None,
        )
    err = end.error
    if err is not None:
        kind = err.get("kind") or FailureKind.EXCEPTION.value
        return FailureRecord(
            attempt=attempt, time=now, iteration=max(iteration, err.get("iteration") or 0),
            kind=kind, type=err.get("type"), message=err.get("message", ""),
            traceback=err.get("traceback"), exit_code=err.get("exit_code", end.exit_code),
            counted=kind != FailureKind.STORAGE.value,
        )
    sig = end.signal_number
    if sig is not None:
        name = signal_name(sig)
        oom = " (the kernel's out-of-memory killer)" if end.oom_killed else ""
        return FailureRecord(
            attempt=attempt, time=now, iteration=iteration,
            kind=FailureKind.OOM.value if end.oom_killed else FailureKind.SIGNAL.value,
            signal=name, message=f"killed by {name}{oom}", exit_code=end.exit_code,
        )
    return FailureRecord(
        attempt=attempt, time=now, iteration=iteration, kind=FailureKind.EXIT.value,
        message=f"the trial process exited with code {end.exit_code}", exit_code=end.exit_code,
    )


def signal_name(sig: int) -> str:
    """``9`` -> ``"SIGKILL"``; an unknown number -> ``"signal 99"``."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass(frozen=True)
class FailureDecision:
    """What becomes of a trial whose attempt failed (or was preempted).

    ``status`` is PENDING (start it again from its latest checkpoint), PAUSED (the experiment is
    stopping: it resumes with the experiment) or ERRORED (with ``reason``);
    ``stop_experiment`` is "fail_fast" when the whole experiment must stop now, or
    :data:`STORAGE_FAULT` when the storage refused a write.
    """

    status: TrialStatus
    reason: Optional[str] = None
    stop_experiment: Optional[str] = None


def decide_after_failure(trial: TrialRecord, failure: FailureRecord, config: FailureConfig,
                         *, stopping: bool) -> FailureDecision:
    """Decide what a failed attempt means for ``trial``, whose ``failures`` already include
    ``failure``. ``stopping``: the experiment is being stopped (the trial pauses with it)."""
    if failure.kind == FailureKind.STORAGE.value:
        # Retrying into a full (read-only, forbidden) disk helps nobody, and the other trials
        # write to the same storage: the experiment stops, resumable once it is fixed.
        return FailureDecision(TrialStatus.PAUSED, stop_experiment=STORAGE_FAULT)
    if stopping:
        return FailureDecision(TrialStatus.PAUSED)
    if not failure.counted:
        return FailureDecision(TrialStatus.PENDING)  # not its fault: again, from its checkpoint
    reason = None
    if failure.kind == FailureKind.USAGE.value:
        reason = "ftnb's API was misused; retrying cannot help"
    elif config.stop_on_repeated_error and is_repeated_error(trial.failures, failure):
        reason = (
            f"the same error happened twice in a row at training_iteration "
            f"{failure.iteration} ({failure.type}: {failure.message}): it is deterministic, "
            "so retrying will not fix it (set FailureConfig(stop_on_repeated_error=False) "
            "to retry anyway)"
        )
    elif not config.allows_retry(trial.num_failures):
        n = trial.num_failures
        reason = (f"it failed {n} time{'' if n == 1 else 's'}, more than "
                  f"FailureConfig(max_failures={config.max_failures}) allows")
    if reason is None:
        return FailureDecision(TrialStatus.PENDING)
    return FailureDecision(TrialStatus.ERRORED, reason,
                           "fail_fast" if config.fail_fast else None)


def is_repeated_error(failures: Sequence[FailureRecord], failure: FailureRecord) -> bool:
    """Whether ``failure`` (the last of ``failures``) repeats the counted failure before it:
    the same raised error (kind, type, message) at the same iteration, with no successful
    attempt in between (preemptions and lost nodes in between do not break the run). Only raised errors
    repeat recognisably; a kill by a signal does not."""
    counted = [f for f in failures if f.counted]
    raised = (FailureKind.EXCEPTION.value, FailureKind.OOM.value)
    if len(counted) < 2 or failure.kind not in raised or failure.type is None:
        return False
    previous = counted[-2]
    consecutive = previous.attempt == failure.attempt - 1 or all(
        not f.counted
        for f in failures
        if previous.attempt < f.attempt < failure.attempt
    )
    return (
        consecutive
        and previous.kind == failure.kind
        and previous.type == failure.type
        and previous.message == failure.message
        and previous.iteration == failure.iteration
    )


def checkpoints_to_delete(checkpoints: Sequence[dict], config: CheckpointConfig) -> list[dict]:
    """The entries of ``checkpoints`` (oldest first: dir_name, iteration, score) that
    ``config`` says to delete. The latest is always kept (a retry starts from it); of the
    others, the worst by ``checkpoint_score_attribute`` go first (a missing or NaN score is the
    worst, ties go to the older), or the oldest when no attribute is set. One whose
    validation is pending (``validation_pending``) is kept, and not counted, until its score
    is known: ``num_to_keep`` applies to the others."""
    keep = config.num_to_keep
    known = [c for c in checkpoints if not c.get("validation_pending")]
    if keep is None or len(known) <= keep:
        return []
    candidates = [c for c in known if c is not checkpoints[-1]]
    if config.checkpoint_score_attribute:
        sign = 1 if config.checkpoint_score_order == "max" else -1

        def badness(c: dict) -> tuple:
            score = c.get("score")
            valid = isinstance(score, (int, float)) and score == score  # NaN is not valid
            return (1 if valid else 0, sign * score if valid else 0, c["iteration"])

        candidates.sort(key=badness)
    return candidates[: len(known) - keep]


def experiment_status(stopping: Optional[str], statuses: Iterable[str]) -> ExperimentStatus:
    """The status an experiment ends with: ERRORED when fail-fast stopped it or a trial errored,
    INTERRUPTED when it was stopped (resumable), else FINISHED."""
    if stopping == "fail_fast":
        return ExperimentStatus.ERRORED
    if stopping:
        return ExperimentStatus.INTERRUPTED
    if any(s == TrialStatus.ERRORED for s in statuses):
        return ExperimentStatus.ERRORED
    return ExperimentStatus.FINISHED
