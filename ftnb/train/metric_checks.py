"""What a trainable's reports must hold: the metric that ranks the trials, as a number, and
every key a stop criterion names. Each check returns the problem in words (None: no problem);
the session raises it as a :class:`ftnb.session.UsageError` that ends the trial."""

from __future__ import annotations

import difflib
import os
from typing import Any, Mapping, Optional

from ..config import metric_value
from ..schedulers.stop_criterion import DONE
from ..storage import AUTO_KEYS
from ..storage.result_log import flatten_row

__all__ = ["LENIENT_METRIC_ENV", "metric_missing_problem", "metric_text_problem",
           "stop_keys_problem"]

#: Ray Tune's switch, honoured the same way: set to 1, a trial may leave TuneConfig.metric out of
#: its first reports (a validation metric that only every N-th report carries).
LENIENT_METRIC_ENV = "TUNE_DISABLE_STRICT_METRIC_CHECKING"

_MISSING = object()


def metric_text_problem(metric: str, ranker: str, row: dict) -> Optional[str]:
    """When ``row`` gives ``metric``, which ``ranker`` ranks the trials by, as text (only
    numbers can rank; other metrics may hold any value)."""
    value = row[metric] if metric in row else metric_value(row, metric)
    if not isinstance(value, str):
        return None
    return (f"{ranker} ranks the trials, but this trainable reports it as text "
            f"({value[:60]!r}), not a number. Fix: report a number (e.g. float(...)), or "
            "rank by another metric (other metrics may hold any value).")


def metric_missing_problem(metric: str, row: dict) -> Optional[str]:
    """When ``metric`` (TuneConfig.metric) is not in the first report, or is text there (it
    ranks the trials: only numbers can)."""
    text = metric_text_problem(metric, f"TuneConfig(metric={metric!r})", row)
    if text:
        return text
    flat = flatten_row(row)
    if metric in row or metric in flat or os.environ.get(LENIENT_METRIC_ENV) == "1":
        return None
    reported = sorted(k for k in flat if k not in AUTO_KEYS)
    close = difflib.get_close_matches(metric, reported, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"TuneConfig(metric={metric!r}) is not a metric this trainable reports; its first "
            f"report has: {', '.join(reported) or 'no metrics'}{hint}. Fix: run the experiment "
            "again (under a new name) with TuneConfig(metric=...) naming one of them, or report "
            f"{metric!r} in every result ({LENIENT_METRIC_ENV}=1 accepts one that only later "
            "reports carry, as in Ray Tune).")


def stop_keys_problem(stop: Any, row: dict) -> Optional[str]:
    """When a dict of stop thresholds names a metric ``row`` does not report."""
    if not isinstance(stop, Mapping):
        return None
    missing = [k for k in stop if k != DONE and metric_value(row, k, _MISSING) is _MISSING]
    if not missing:
        return None
    reported = ", ".join(sorted(flatten_row(row)))
    return (f"RunConfig(stop=...) names {missing[0]!r}, which this trainable does not "
            f"report (it reports: {reported}; nested metrics are named 'outer/inner', as in "
            "Ray Tune). Fix: use one of the reported metrics in stop, or report it.")
