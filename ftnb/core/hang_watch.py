"""Which running attempts count as hung: ``FailureConfig(hang_timeout_s)``.

A pure decision over what the controller tracks (when it last heard from each attempt), so that
it is tested by tables without processes; the controller kills what this returns, and the end
is classified as ``hang`` (:func:`ftnb.core.policy.classify_end`). The watch lives in the
controller, which sees the reports of every executor: it covers local processes, groups and Ray
alike.

    >>> silent_attempts({"a": 0.0, "b": 8.0, "c": None}, now=10.0, timeout_s=5.0)
    {'a': 10.0}
"""

from __future__ import annotations

from typing import Mapping, Optional

__all__ = ["silent_attempts"]


def silent_attempts(heard_at: Mapping[str, Optional[float]], *, now: float,
                    timeout_s: Optional[float]) -> dict[str, float]:
    """The attempts (by trial id) not heard from for more than ``timeout_s`` seconds, each with
    how long it has been silent.

    ``heard_at``: per running attempt, when it started or last reported (one clock with
    ``now``), or None for one not watched (it was asked to stop, whose own deadline then
    applies, or it was already killed for hanging). ``timeout_s`` None: nothing ever hangs.
    """
    if timeout_s is None:
        return {}
    return {trial_id: now - heard for trial_id, heard in heard_at.items()
            if heard is not None and now - heard > timeout_s}
