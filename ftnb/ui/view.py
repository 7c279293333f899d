"""The view model every UI renders: built from an experiment's state alone.

The terminal table, ``ftnb status``, and later the notebook widget and the JupyterLab panel all
show the same rows, so they never disagree about what happened.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..core.records import (
    AttemptOutcome,
    ExperimentState,
    ExperimentStatus,
    TrialRecord,
    TrialStatus,
)
from ..storage import AUTO_KEYS
from ..wording import plural
from .failures import shorten_keeping_rank

__all__ = [
    "STOPPED",
    "ExperimentView",
    "TrialRow",
    "format_duration",
    "format_value",
    "params_label",
    "planned_workers",
    "plural",
    "render_table",
    "retries",
    "run_times",
    "shown_status",
]

_AUTO = frozenset(AUTO_KEYS)  # not metrics: ftnb fills them in on every row

#: When a table is cut, the trials shown first (lower first).
URGENCY = {TrialStatus.ERRORED: 0, TrialStatus.RUNNING: 1, ExperimentStatus.INTERRUPTED: 1, TrialStatus.PAUSED: 2,
           TrialStatus.PENDING: 3, TrialStatus.TERMINATED: 4}


#: How a view shows a trial a user (or a restore) stopped before it completed: stored as
#: TERMINATED, like one that completed, with the stop's reason as its note.
STOPPED = "STOPPED"

#: Outcomes after which the next attempt is a retry; after the others (a stop, a driver gone)
#: it is a resume, not a retry.
RETRIED_AFTER = frozenset(
    {AttemptOutcome.FAILED.value, AttemptOutcome.PREEMPTED.value, AttemptOutcome.NODE_LOST.value})


def retries(trial: TrialRecord) -> int:
    """Attempts of ``trial`` that followed a failed, preempted or lost one (an attempt after a
    pause and a resume is no retry)."""
    attempts = trial.attempts
    return sum(1 for before in attempts[:-1] if before.outcome in RETRIED_AFTER)


def shown_status(trial: TrialRecord) -> str:
    """The trial's status as views show it: :data:`STOPPED` for a TERMINATED trial that was
    stopped (its note says why) before it completed, else its status."""
    if (trial.status == TrialStatus.TERMINATED and trial.note
            and not (trial.attempts and trial.attempts[-1].outcome == AttemptOutcome.FINISHED)):
        return STOPPED
    return trial.status


def params_label(params: dict) -> str:
    """A trial's varying hyperparameters on one line (``lr=0.01, layers=2``), as legends and
    hovers name it; "" when none vary."""
    return ", ".join(f"{k}={format_value(v)}" for k, v in params.items())


@dataclass
class TrialRow:
    trial_id: str
    status: str
    iteration: int
    attempts: int
    failures: int
    preemptions: int
    last_error: str
    metrics: dict
    params: dict
    #: Ranks of the trial's attempts: its latest attempt's ``num_workers`` (a trial not started
    #: yet: the experiment's, :func:`planned_workers`); 1 for an ordinary trial.
    num_workers: int = 1
    #: Attempts that followed a failure (:func:`retries`): a resume after a pause is none.
    retries: int = 0
    #: Its status as views show it (:func:`shown_status`: a stopped trial is ``STOPPED``).
    shown_status: str = ""
    #: An elastic group's re-forms, as its record has them (``{"reason", "old_size",
    #: "new_size", "time", "attempt", "mode"}``, see ftnb.core.resizing).
    resizes: list = field(default_factory=list)
    #: Why it stopped, or (an elastic group PENDING) what it waits for.
    note: Optional[str] = None


@dataclass
class ExperimentView:
    name: str
    status: str
    path: str
    counts: dict
    total_failures: int
    total_preemptions: int
    #: Wall-clock time since the experiment was created (until it ended, or its driver's last
    #: sign of life).
    elapsed_s: float
    #: Time its drivers actually ran it: the wall time less the gaps when no driver did (it was
    #: stopped, or its driver died, until a resume).
    running_s: float = 0.0
    rows: list[TrialRow] = field(default_factory=list)
    metric_columns: list[str] = field(default_factory=list)
    param_columns: list[str] = field(default_factory=list)

    @classmethod
    def from_state(
        cls,
        state: ExperimentState,
        path: str = "",
        metric: Optional[str] = None,
        max_metrics: int = 3,
    ) -> "ExperimentView":
        from ..search import flatten_dict

        param_columns = list(state.settings.get("varying_keys") or [])
        metric = metric or state.settings.get("metric")
        metric_columns: list[str] = [metric] if metric else []
        for trial in state.trials:
            for key in (trial.last_result or {}):
                if len(metric_columns) >= max_metrics:
                    break
                if key not in _AUTO and key not in metric_columns:
                    metric_columns.append(key)
        rows = []
        ranks = planned_workers(state)
        for trial in state.trials:
            flat_config = flatten_dict(trial.config) if isinstance(trial.config, dict) else {}
            last = trial.last_result or {}
            rows.append(
                TrialRow(
                    trial_id=trial.trial_id,
                    status=trial.status,
                    iteration=trial.iteration,
                    attempts=len(trial.attempts),
                    failures=trial.num_failures,
                    preemptions=trial.num_preemptions,
                    last_error=_last_error(trial),
                    metrics={k: last.get(k) for k in metric_columns},
                    params={k: flat_config.get(k) for k in param_columns},
                    num_workers=trial.attempts[-1].num_workers if trial.attempts else ranks,
                    retries=retries(trial),
                    shown_status=shown_status(trial),
                    resizes=list(trial.resizes),
                    note=trial.note,
                )
            )
        end = state.updated if state.status != ExperimentStatus.RUNNING else time.time()
        running_s, elapsed_s = run_times(state, end)
        return cls(
            name=state.name,
            status=state.status,
            path=path,
            counts=state.counts(),
            total_failures=sum(t.num_failures for t in state.trials),
            total_preemptions=sum(t.num_preemptions for t in state.trials),
            elapsed_s=elapsed_s,
            running_s=running_s,
            rows=rows,
            metric_columns=metric_columns,
            param_columns=param_columns,
        )

    def with_end(self, end: float, state: ExperimentState) -> "ExperimentView":
        """The same view with its times counted up to ``end`` (now, for a running experiment;
        the last sign of life, for one whose driver died)."""
        running_s, elapsed_s = run_times(state, end)
        return replace(self, running_s=running_s, elapsed_s=elapsed_s)

    @property
    def total_retries(self) -> int:
        """Attempts that followed a failure, over every trial (resumes after a pause aside)."""
        return sum(r.retries for r in self.rows)

    @property
    def is_group(self) -> bool:
        """Whether its trials are groups of ranks (data-parallel): the views then show how
        many."""
        return any(r.num_workers > 1 for r in self.rows)

    def ranks_text(self) -> str:
        """``2 ranks per trial`` (``1-4 ranks per trial`` when they differ); "" when every
        trial is one process."""
        if not self.is_group:
            return ""
        low, high = min(r.num_workers for r in self.rows), max(r.num_workers for r in self.rows)
        if low != high:
            return f"{low}-{high} ranks per trial"
        return f"{plural(high, 'rank')} per trial"

    def times_text(self) -> str:
        """``run time 0:01:23``, and the wall time when it is longer (a driver was down)."""
        text = f"run time {format_duration(self.running_s)}"
        if self.elapsed_s - self.running_s >= 1.0:
            text += f", wall {format_duration(self.elapsed_s)}"
        return text

    def summary(self) -> str:
        """One line: status, trials by status, ranks per trial (data-parallel trials only),
        failures, preemptions and times."""
        counts = ", ".join(f"{n} {s}" for s, n in self.counts.items() if n)
        ranks = f"{self.ranks_text()} | " if self.is_group else ""
        return (
            f"Experiment {self.name}: {self.status} | {counts} | {ranks}"
            f"{plural(self.total_failures, 'failure')}, "
            f"{plural(self.total_preemptions, 'preemption')} | {self.times_text()}"
        )


def planned_workers(state: ExperimentState) -> int:
    """The ranks a trial of the experiment gets: its settings' ``num_workers`` (recorded since
    group attempts exist), else the most any attempt had, else 1."""
    given = state.settings.get("num_workers")
    if isinstance(given, int) and not isinstance(given, bool) and given >= 1:
        return given
    return max((a.num_workers for t in state.trials for a in t.attempts), default=1)


def run_times(state: ExperimentState, end: float) -> tuple[float, float]:
    """``(running_s, wall_s)`` of an experiment whose current (or last) driver session lasts
    until ``end``.

    The running time adds up the driver sessions the state records
    (:attr:`ExperimentState.driver_sessions`); a state written before they were recorded counts
    as one session from its creation. The wall time runs from the creation to ``end``.
    """
    sessions = state.driver_sessions or [[state.created, state.updated]]
    running = sum(max(0.0, last - start) for start, last in sessions[:-1])
    running += max(0.0, end - sessions[-1][0])
    wall = max(0.0, end - state.created)
    return min(running, wall), wall


def _last_error(trial: TrialRecord) -> str:
    if not trial.failures:
        return ""
    return shorten_keeping_rank(trial.failures[-1], 60)


def format_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def render_table(view: ExperimentView, max_rows: int = 50) -> str:
    """The view as a plain-text table (terminal, ``ftnb status``, non-notebook displays)."""
    group = view.is_group  # a column of ranks only where trials are groups
    header = ["trial_id", "status", *(["ranks"] if group else []), "iter", "attempts",
              "failures"]
    header += view.param_columns + view.metric_columns + ["last error"]
    rows = view.rows
    if len(rows) > max_rows:
        # Keep what needs attention when rows are cut: errored and running trials first.
        rows = sorted(rows, key=lambda r: URGENCY.get(r.status, 5))[:max_rows]
    lines = []
    for row in rows:
        failures = str(row.failures) + (f" (+{row.preemptions}p)" if row.preemptions else "")
        cells = [row.trial_id, row.shown_status or row.status,
                 *([ranks_cell(row)] if group else []),
                 str(row.iteration), str(row.attempts), failures]
        cells += [format_value(row.params.get(k)) for k in view.param_columns]
        cells += [format_value(row.metrics.get(k)) for k in view.metric_columns]
        cells.append(row.last_error)
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h)
              for i, h in enumerate(header)]
    out = [view.summary()]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.append(sep)
    out.append("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    out.append(sep)
    for cells in lines:
        out.append("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |")
    out.append(sep)
    if len(view.rows) > max_rows:
        out.append(f"... and {plural(len(view.rows) - max_rows, 'more trial')}")
    out += resize_lines(rows)
    out += [f"{row.trial_id}: {row.note}" for row in rows
            if row.status == TrialStatus.PENDING and row.note]
    return "\n".join(out)


def ranks_cell(row: TrialRow) -> str:
    """A trial's ranks as a table shows them: ``2``, or for an elastic group that re-formed its
    sizes so far, ``3 (3>2>3)``."""
    if not row.resizes:
        return str(row.num_workers)
    sizes = [row.resizes[0].get("old_size")] + [r.get("new_size") for r in row.resizes]
    return f"{row.num_workers} ({'>'.join(str(s) for s in sizes)})"


def resize_lines(rows: list[TrialRow], per_trial: int = 5) -> list[str]:
    """The re-forms of the elastic groups among ``rows``, a line each (the last ``per_trial`` of
    a trial), e.g. ``3f2a1_00000 attempt 2: 3 -> 2 ranks (rank lost, cold) at 10:31:07``."""
    lines = []
    for row in rows:
        for entry in row.resizes[-per_trial:]:
            when = time.strftime("%H:%M:%S", time.localtime(entry.get("time") or 0))
            lines.append(f"{row.trial_id} attempt {entry.get('attempt')}: "
                         f"{entry.get('old_size')} -> {entry.get('new_size')} ranks "
                         f"({entry.get('reason')}, {entry.get('mode', 'cold')}) at {when}")
    return ["Group re-forms:", *lines] if lines else []
