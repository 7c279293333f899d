"""Which reports of a trial wait for its scheduler's decision: :class:`DecisionPoints`, part of
the executor contract (:attr:`ftnb.execution.contract.AttemptSpec.decision_points`), evaluated in
the trial's process at every report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

__all__ = ["DecisionPoints"]


@dataclass(frozen=True)
class DecisionPoints:
    """Which reports of an attempt wait for the controller's decision (a trial scheduler's
    decision points); every other report returns as soon as it is persisted.

    A report is one when it carries ``attr`` (a number: ``training_iteration``, ``time_total_s``
    or a metric the trainable reports) and either reaches a value of ``milestones`` that the
    trial's previous report had not reached (ASHA's rungs: the first report at or past each),
    or, with ``from_value`` set, reaches ``from_value`` (every report from there on: the median
    stopping rule's), or, with ``every`` set, reaches a multiple of ``every`` that the previous
    report had not (a perturbation interval); ``offset`` moves those multiples (the points are
    ``offset + n * every``, n >= 1: PBT's grid from its burn-in period on).

    ``stopper_only``: no scheduler decides at these points, only a driver-side stopper (every
    report waits so the trial ends exactly where the stopper says). A class trainable with
    ``checkpoint_at_end`` then asks the driver before each report whether the stopper ends it
    there (:mod:`ftnb.core.checkpoint_queries`), instead of checkpointing at every point.

    >>> points = DecisionPoints("training_iteration", milestones=(1, 3, 9))
    >>> [points.reached(prev, {"training_iteration": i}) for prev, i in ((0, 1), (1, 2), (2, 3))]
    [True, False, True]
    """

    attr: str
    milestones: tuple[float, ...] = ()
    from_value: Optional[float] = None
    every: Optional[float] = None
    offset: float = 0.0
    stopper_only: bool = False

    def value(self, row: Mapping[str, Any]) -> Optional[float]:
        """``attr`` in ``row`` as a number (None when it is not one)."""
        value = row.get(self.attr)
        if value is None and "/" in self.attr:
            from ..storage.result_log import metric_value

            value = metric_value(row, self.attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return value

    def reached(self, previous: Optional[float], row: Mapping[str, Any]) -> bool:
        """Whether ``row`` is a decision point, ``previous`` being ``attr`` in the trial's
        report before it (None: none, or it did not carry ``attr``)."""
        value = self.value(row)
        if value is None:
            return False
        if self.from_value is not None and value >= self.from_value:
            return True
        before = float("-inf") if previous is None else previous
        if self.every and (previous is None or (previous - self.offset) // self.every
                           < (value - self.offset) // self.every):
            return value - self.offset >= self.every
        return any(before < milestone <= value for milestone in self.milestones)
