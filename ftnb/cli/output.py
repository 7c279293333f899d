"""What the ``ftnb`` command prints: strict JSON, aligned columns, times, one experiment's
JSON (everything its text view shows)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from typing import Any, Optional

__all__ = ["columns", "experiment_json", "finite", "local_time", "print_json"]


def print_json(obj: Any, *, indent: Optional[int] = 1) -> None:
    """Print ``obj`` as strict JSON (jq, JavaScript): NaN and infinities become null.
    ``indent=None``: one line (JSON Lines)."""
    text = json.dumps(finite(obj), indent=indent, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (recursively)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def columns(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    """``rows`` under ``header``, aligned; the columns numbered in ``right`` right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(header)] + [line(r) for r in rows])


def local_time(t: Optional[float]) -> str:
    """A timestamp as local ``YYYY-mm-dd HH:MM:SS`` ("-" for none)."""
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def experiment_json(view: Any, state: Any, *, driver: Optional[dict],
                    resume_line: Optional[str], supervisor_log: Optional[str]) -> dict:
    """One experiment as JSON: the view model (:class:`ftnb.view.ExperimentView`) with each
    row's last error in full (the table cuts it) and its last failure (traceback included),
    plus what the text view adds: when it was updated, its driver, the line that resumes it
    (None unless it is interrupted), its supervisor's log."""
    data = dataclasses.asdict(view)
    trials = {t.trial_id: t for t in state.trials}
    for row in data["rows"]:
        trial = trials.get(row["trial_id"])
        failure = trial.failures[-1] if trial is not None and trial.failures else None
        row["last_error"] = failure.summary() if failure is not None else ""
        row["last_failure"] = dataclasses.asdict(failure) if failure is not None else None
        reason = (trial.error or {}).get("reason") if trial is not None else None
        row["error_reason"] = reason
    data["updated"] = state.updated
    data["driver"] = driver
    data["resume_line"] = resume_line
    data["supervisor_log"] = supervisor_log
    return data
