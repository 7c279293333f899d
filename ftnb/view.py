"""The view model every UI renders: built from an experiment's state alone.

The terminal table, ``ftnb status``, and later the notebook widget and the JupyterLab panel all
show the same rows, so they never disagree about what happened.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .state import ExperimentState, TrialRecord

__all__ = ["ExperimentView", "TrialRow", "format_duration", "format_value", "render_table"]

_AUTO = {
    "training_iteration",
    "trial_id",
    "time_this_iter_s",
    "time_total_s",
    "timestamp",
    "attempt",
    "checkpoint_dir_name",
}

#: When a table is cut, the trials shown first (lower first).
URGENCY = {"ERRORED": 0, "RUNNING": 1, "INTERRUPTED": 1, "PAUSED": 2, "PENDING": 3,
           "TERMINATED": 4}


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


@dataclass
class ExperimentView:
    name: str
    status: str
    path: str
    counts: dict
    total_failures: int
    total_preemptions: int
    elapsed_s: float
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
        from .search import flatten_dict

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
                )
            )
        end = state.updated if state.status != "RUNNING" else time.time()
        return cls(
            name=state.name,
            status=state.status,
            path=path,
            counts=state.counts(),
            total_failures=sum(t.num_failures for t in state.trials),
            total_preemptions=sum(t.num_preemptions for t in state.trials),
            elapsed_s=max(0.0, end - state.created),
            rows=rows,
            metric_columns=metric_columns,
            param_columns=param_columns,
        )

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts.items() if n)
        return (
            f"Experiment {self.name}: {self.status} | {counts} | "
            f"{self.total_failures} failures, {self.total_preemptions} preemptions | "
            f"{format_duration(self.elapsed_s)}"
        )


def _last_error(trial: TrialRecord) -> str:
    if not trial.failures:
        return ""
    text = trial.failures[-1].summary()
    return text if len(text) <= 60 else text[:57] + "..."


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
    header = ["trial_id", "status", "iter", "attempts", "failures"]
    header += view.param_columns + view.metric_columns + ["last error"]
    rows = view.rows
    if len(rows) > max_rows:
        # Keep what needs attention when rows are cut: errored and running trials first.
        rows = sorted(rows, key=lambda r: URGENCY.get(r.status, 5))[:max_rows]
    lines = []
    for row in rows:
        failures = str(row.failures) + (f" (+{row.preemptions}p)" if row.preemptions else "")
        cells = [row.trial_id, row.status, str(row.iteration), str(row.attempts), failures]
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
        out.append(f"... and {len(view.rows) - max_rows} more trials")
    return "\n".join(out)
