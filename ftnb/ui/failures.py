"""How a failure reads in every UI: the one wording of a group attempt's failure.

A group attempt (``num_workers`` ranks that start, fail and restart as one) records which rank
failed first (:attr:`FailureRecord.rank`: the cause, whose error, exit or hang the record's
other fields describe), how every rank ended (:attr:`FailureRecord.ranks`) and how long the
restart took (:attr:`FailureRecord.recovered_s`). The widget, ``ftnb status``, ``ftnb watch``,
the terminal reporter and the snapshot's JSON all say it with the functions here, so they never
word it differently::

    rank 1 failed first (the cause): exception RuntimeError: boom
    rank 0: peer (RuntimeError: Connection closed by peer)
    restarted in 1.2 s

A single-worker failure (``rank`` None) reads as it always did, its
:meth:`~ftnb.core.records.FailureRecord.summary`: :func:`group_lines` is empty for it.
Part of the read model (:mod:`ftnb.ui.read_model`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional

from ..core.records import FailureKind, FailureRecord, TrialRecord, TrialStatus
from ..wording import plural

__all__ = [
    "RankEnd",
    "cause_line",
    "errored_trial_lines",
    "collateral_lines",
    "failure_json",
    "failure_what",
    "group_failures_text",
    "group_lines",
    "is_group_failure",
    "rank_ends",
    "restart_text",
    "shorten_keeping_rank",
]

#: Traceback lines a text view shows of each group failure's cause (its end: the exception and
#: the innermost frames); the trial's ``error.txt`` and ``ftnb status --json`` have it whole.
TRACEBACK_TAIL_LINES = 6
#: Trials whose latest group failure a text view details; the others are counted.
MAX_TRIALS_DETAILED = 10


@dataclass(frozen=True)
class RankEnd:
    """How one rank of a failed group attempt ended: ``ended`` is ``error``, ``peer`` (it failed
    because a peer did), ``signal``, ``exit``, ``hung``, ``stopped`` (ended by ftnb with the
    group) or ``clean``; ``detail`` says more (its error's first line, a signal, a code)."""

    rank: int
    ended: str
    detail: str = ""

    def text(self) -> str:
        """``rank 0: peer (RuntimeError: Connection closed by peer)``."""
        return f"rank {self.rank}: {self.ended}" + (f" ({self.detail})" if self.detail else "")


def is_group_failure(failure: FailureRecord) -> bool:
    """Whether ``failure`` ended a group attempt (it names its first failing rank)."""
    return failure.rank is not None


def rank_ends(failure: FailureRecord) -> list[RankEnd]:
    """Every rank's end, in rank order (entries that are not well-formed are left out: a record
    is read, never trusted to be whole)."""
    out = []
    for entry in failure.ranks or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("rank"), int):
            continue
        detail = " ".join(str(entry.get("detail") or "").split())
        out.append(RankEnd(entry["rank"], str(entry.get("ended") or "?"), detail))
    return sorted(out, key=lambda e: e.rank)


def failure_what(failure: FailureRecord) -> str:
    """What went wrong, on one line without the kind: ``RuntimeError: boom``, a signal's name,
    ``code 3``, or the message."""
    if failure.type:
        what = f"{failure.type}: {failure.message}" if failure.message else failure.type
    else:
        what = failure.message or failure.signal or (
            f"code {failure.exit_code}" if failure.exit_code is not None else "")
    return " ".join(str(what).split())


def cause_line(failure: FailureRecord) -> str:
    """The first failing rank and what it did: ``rank 1 failed first (the cause): exception
    RuntimeError: boom``; a hang says so (``rank 1 hung first (the cause): ...``). "" for a
    single-worker failure."""
    if not is_group_failure(failure):
        return ""
    rank = failure.rank
    what = failure_what(failure)
    if failure.kind == FailureKind.HANG.value:  # its message names the rank already
        return f"rank {rank} hung first (the cause): {what.removeprefix(f'rank {rank} ')}"
    return f"rank {rank} failed first (the cause): {failure.kind} {what}".rstrip()


def collateral_lines(failure: FailureRecord) -> list[str]:
    """How the other ranks ended, in rank order; ranks that ended alike are one line
    (``ranks 2, 3: stopped (ended by ftnb with the group)``)."""
    groups: list[tuple[str, str, list[int]]] = []
    for end in rank_ends(failure):
        if end.rank == failure.rank:
            continue
        if groups and groups[-1][:2] == (end.ended, end.detail):
            groups[-1][2].append(end.rank)
        else:
            groups.append((end.ended, end.detail, [end.rank]))
    lines = []
    for ended, detail, ranks in groups:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        lines.append(f"{who}: {ended}" + (f" ({detail})" if detail else ""))
    return lines


def restart_text(failure: FailureRecord, trial: Optional[TrialRecord] = None) -> str:
    """``restarted in 1.2 s`` once the next attempt reported (every rank past its first step
    from the checkpoint); ``restarting`` while the trial is on its way back (its latest failure,
    the trial PENDING or RUNNING); else "" (it did not restart: errored, stopped)."""
    if failure.recovered_s is not None:
        return f"restarted in {failure.recovered_s:.1f} s"
    if trial is not None and trial.failures and trial.failures[-1] == failure \
            and trial.status in (TrialStatus.PENDING, TrialStatus.RUNNING):
        return "restarting"
    return ""


def group_lines(failure: FailureRecord, trial: Optional[TrialRecord] = None) -> list[str]:
    """A group failure in a few lines: the cause, the other ranks, the restart. Empty for a
    single-worker failure (its summary says all)."""
    if not is_group_failure(failure):
        return []
    restart = restart_text(failure, trial)
    return [cause_line(failure), *collateral_lines(failure), *([restart] if restart else [])]


def shorten_keeping_rank(failure: FailureRecord, limit: int) -> str:
    """``failure.summary()`` cut to ``limit`` characters; a group failure's is cut in its message
    so that its end (``in rank 1 (attempt 2, iter 4)``) stays."""
    text = failure.summary()
    if len(text) <= limit:
        return text
    tail = f" in rank {failure.rank} (attempt {failure.attempt}, iter {failure.iteration})"
    if is_group_failure(failure) and text.endswith(tail) and len(tail) + 4 <= limit:
        return text[: limit - len(tail) - 3] + "..." + tail
    return text[: limit - 3] + "..."


def failure_json(failure: FailureRecord, trial: Optional[TrialRecord] = None) -> dict:
    """A failure as the snapshot's JSON gives it: the record's fields (``rank``, ``ranks``,
    ``recovered_s`` among them) and how the UIs word it: ``summary``, ``cause`` (None for a
    single-worker failure), ``collateral`` (the other ranks' lines) and ``restart``
    (:func:`restart_text`, None when there is nothing to say)."""
    data = dataclasses.asdict(failure)
    data["summary"] = failure.summary()
    data["cause"] = cause_line(failure) or None
    data["collateral"] = collateral_lines(failure)
    data["restart"] = restart_text(failure, trial) or None
    return data


def group_failures_text(trials: Iterable[TrialRecord], indent: str = "  ",
                        traceback_lines: int = TRACEBACK_TAIL_LINES,
                        max_trials: int = MAX_TRIALS_DETAILED) -> str:
    """The latest group failure of each trial that has one, as text under a table (``ftnb
    status``, the text view): the cause with the end of its traceback, the other ranks, the
    restart. "" when no trial's latest failure was a group's (single-worker experiments)."""
    latest = [(t, t.failures[-1]) for t in trials
              if t.failures and is_group_failure(t.failures[-1])]
    if not latest:
        return ""
    # The ones that need attention first: errored, then the most recent.
    latest.sort(key=lambda tf: (tf[0].status != TrialStatus.ERRORED, -tf[1].time))
    out = [f"Group failures (the latest of each trial; {plural(len(latest), 'trial')}):"]
    for trial, failure in latest[:max_trials]:
        out.append(f"{indent}{trial.trial_id} attempt {failure.attempt} "
                   f"(iter {failure.iteration}), {plural(len(failure.ranks) or 1, 'rank')}:")
        inner = indent * 2
        lines = group_lines(failure, trial)
        out.append(inner + lines[0])
        tb = (failure.traceback or "").rstrip().splitlines()
        if tb and traceback_lines > 0:
            shown = tb[-traceback_lines:]
            if len(shown) < len(tb):
                out.append(f"{inner}  | ... ({len(tb) - len(shown)} traceback lines above; "
                           "the trial's error.txt has them all)")
            out += [f"{inner}  | {line}" for line in shown]
        out += [inner + line for line in lines[1:]]
    if len(latest) > max_trials:
        out.append(f"{indent}... and {plural(len(latest) - max_trials, 'more trial')} with a "
                   "group failure")
    return "\n".join(out)


def errored_trial_lines(trials: Iterable[TrialRecord], indent: str = "  ") -> list[str]:
    """What ended each ERRORED trial, one line each (``  3f2a1_00001 ERRORED: exception
    ValueError: ...``, its last failure): the end of an experiment that errored, as ``ftnb
    run`` and ``%ftrun --wait`` print it."""
    return [f"{indent}{trial.trial_id} ERRORED: {trial.failures[-1].summary()}"
            for trial in trials if trial.status == TrialStatus.ERRORED and trial.failures]
