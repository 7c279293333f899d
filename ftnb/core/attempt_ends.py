"""What an ended attempt tells the failure policy: :func:`attempt_end` gathers what the
controller heard of it and how its processes exited into a
:class:`~ftnb.core.policy.AttemptEnd`; for a group attempt (a TorchTrainer's workers) the cause
is the rank that failed first, and the failure records how each rank ended
(:func:`rank_entries`) and, for ``error.txt``, where the failing rank's output is with its last
lines (:func:`rank_output_text`).
"""

from __future__ import annotations

from typing import Optional

from ..execution.contract import ErrorEvent, ExitEvent, is_peer_error
from ..storage import TrialPaths
from . import policy
from .live_attempt import LiveAttempt
from .records import FailureRecord

__all__ = ["attempt_end", "rank_entries", "rank_output_text"]


def attempt_end(live: LiveAttempt,
                exit_event: ExitEvent) -> tuple[policy.AttemptEnd, Optional[ErrorEvent]]:
    """What the failure policy is told of the attempt ``live`` that ended with ``exit_event``,
    and the error event taken as its cause (None: it reported none)."""
    group = len(exit_event.ranks) > 1
    cause = exit_event.cause
    if group:
        # The cause is the rank that failed first: its error, or (killed, hung) its exit.
        first = exit_event.first_failing_rank
        error = live.errors.get(first) if first is not None else next(
            iter(live.errors.values()), None)
    else:
        error = live.errors.get(exit_event.first_failing_rank) or next(
            iter(live.errors.values()), None)
    end = policy.AttemptEnd(
        outcome=live.outcome,
        error=error.as_failure() if error is not None else None,
        preempted=live.preempted,
        exit_code=exit_event.exit_code, oom_killed=exit_event.oom_killed,
        stop_requested=live.stop_requested_at is not None,
        silent_for_s=live.silent_for_s,
        node_lost=exit_event.node_lost, node=exit_event.node,
        rank=exit_event.first_failing_rank if group else None,
        hung=bool(group and cause is not None and cause.hung),
        ranks=tuple(rank_entries(exit_event, live.errors)) if group else (),
    )
    return end, error


def rank_output_text(paths: TrialPaths, failure: FailureRecord, count: int = 20) -> str:
    """For error.txt of a group's failure: the failing rank's output files and their last
    ``count`` lines (its stderr without the traceback error.txt already shows)."""
    rank = failure.rank or 0
    traceback = (failure.traceback or "").rstrip().splitlines()
    text = []
    for stream, path in (("stdout", paths.rank_stdout(rank)), ("stderr", paths.rank_stderr(rank))):
        lines = paths.last_lines(path, count + (len(traceback) + 1 if stream == "stderr" else 0))
        while lines and not lines[-1].strip():
            lines.pop()
        ends_in_traceback = (stream == "stderr" and bool(traceback)
                             and lines[-len(traceback):] == traceback)
        if ends_in_traceback:
            lines = lines[:-len(traceback)]
        lines = lines[-count:]
        head = f"Rank {rank}'s {stream}: {paths.storage.uri(path)}"
        if lines:
            after = " (then the traceback above)" if ends_in_traceback else ""
            last = f"{len(lines)} lines" if len(lines) > 1 else "line"
            text += ["", f"{head}, its last {last}{after}:", *lines]
        else:
            text += ["", head + (" (the traceback above)" if ends_in_traceback
                                 else " (nothing printed)")]
    return "\n".join(text) + "\n"


def rank_entries(exit_event: ExitEvent, errors: dict[int, ErrorEvent]) -> list[dict]:
    """How each rank of a group attempt ended (:attr:`FailureRecord.ranks`), in rank order."""
    entries = []
    for rank_exit in exit_event.ranks:
        error = errors.get(rank_exit.rank)
        if rank_exit.hung:
            ended, detail = "hung", "stopped making progress; killed"
        elif error is not None:
            what = f"{error.type}: {error.message}" if error.type else error.message
            detail = what.strip().splitlines()[0][:200] if what.strip() else ""
            ended = "peer" if is_peer_error(error.type, error.message) else "error"
        elif rank_exit.collateral:
            ended, detail = "stopped", "ended by ftnb with the group"
        elif rank_exit.exit_code == 0:
            ended, detail = "clean", ""
        elif rank_exit.signal_number is not None:
            ended, detail = "signal", policy.signal_name(rank_exit.signal_number)
        else:
            ended, detail = "exit", f"code {rank_exit.exit_code}"
        entries.append({"rank": rank_exit.rank, "ended": ended, "detail": detail})
    return entries
