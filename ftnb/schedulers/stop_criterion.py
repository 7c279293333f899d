"""``RunConfig(stop=...)`` given as a dict of thresholds or a function: its record in the
experiment state, and whether a result meets it (``ftnb.config`` checks it).

As in Ray Tune (``Trial.should_stop``): a result with ``done`` true ends its trial whatever the
criterion ("this trial is finished", Ray's reserved key: a class trainable's ``step()`` or a
function trainable's ``report()`` may set it); otherwise the trial ends at the first result
whose value of a named metric is ``>=`` its threshold. A threshold may be a number or a bool
(``{"done": True}``, ``{"converged": True}``: ``True >= True``), compared as Python does; a
value that is not a number (a string, an object) never meets a threshold. A function or a
Stopper judges a result in the trial's process, where it keeps its state (:func:`stop_met`).

    >>> threshold_met({"training_iteration": 3}, {"training_iteration": 3})
    True
    >>> threshold_met({"loss": 0.1, "done": True}, {"training_iteration": 99})
    True
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Optional

from ..storage.result_log import flatten_row

__all__ = ["DONE", "describe_stop", "is_done", "stop_met", "threshold_met"]

#: Ray Tune's reserved key: a result that carries it true is the trial's last.
DONE = "done"


def is_done(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` says its trial is finished (``"done": True``, Ray's reserved key)."""
    done = row.get(DONE)
    return isinstance(done, (bool, numbers.Real)) and bool(done)


def _value(row: Mapping[str, Any], name: str) -> Any:
    if name in row:
        return row[name]
    return flatten_row(dict(row)).get(name)


def threshold_met(row: Any, stop: Any) -> bool:
    """Whether the reported ``row`` ends its trial under the dict criterion ``stop`` (Ray's
    ``done`` included). A function or a Stopper is not judged here (None counts as no dict)."""
    if not row:
        return False
    if is_done(row):
        return True
    if not isinstance(stop, Mapping):
        return False
    for key, threshold in stop.items():
        value = _value(row, key)
        if isinstance(value, numbers.Real) and isinstance(threshold, numbers.Real) \
                and value >= threshold:
            return True
    return False


def stop_met(row: Any, stop: Any, trial_id: Optional[str] = None) -> bool:
    """Whether the reported ``row`` ends its trial under ``RunConfig(stop=...)`` (``stop``): a
    dict of thresholds, or a function or Stopper, asked only with the trial's ``trial_id`` (in
    the trial's process, where it sees every row once); or ``row`` says ``done`` (Ray's key).

    >>> stop_met({"training_iteration": 3}, {"training_iteration": 3})
    True
    >>> stop_met({"training_iteration": 9}, lambda trial_id, row: True)  # not asked here
    False
    """
    if callable(stop):
        if trial_id is None:
            return threshold_met(row, None)
        return bool(stop(trial_id, row)) or is_done(row)
    return threshold_met(row, stop)


def describe_stop(stop: Any) -> Any:
    """A JSON-able description of a stop criterion, for the experiment state."""
    if stop is None:
        return None
    if callable(stop):
        return {"function": getattr(stop, "__qualname__", repr(stop))}
    return dict(stop)
