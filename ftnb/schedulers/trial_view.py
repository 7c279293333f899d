"""What a resources allocation function (:class:`~ftnb.schedulers.resource_changing_scheduler.
ResourceChangingScheduler`) is given, with Ray Tune's names: the controller as a
:class:`TuneController` (``ftnb.execution.tune_controller.TuneController``) and a trial as a
:class:`Trial` (``ftnb.experiment.Trial``).

Both are views: nothing in them changes the experiment but what the scheduler asks of the
controller through its documented methods.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from ..execution.placement_groups import PlacementGroupFactory
from .trial_scheduler import SchedulerController

__all__ = ["Trial", "TuneController"]

_FINISHED = ("TERMINATED", "ERRORED")


class TuneController(SchedulerController, Protocol):
    """What a trial scheduler and a resources allocation function may ask of the controller
    (Ray Tune's ``TuneController``, as ftnb offers it): everything of
    :class:`ftnb.schedulers.SchedulerController` (``get_trials()``, ``get_trial(trial_id)``,
    ``status_of(trial)``, ``stop_trial``, ``pause_trial``, ``next_pending_trial()``), and:"""

    def get_live_trials(self) -> list:
        """The trials that are not TERMINATED or ERRORED (Ray's name)."""
        ...

    def get_total_resources(self) -> dict:
        """Everything the executor has, used or not: ``{"CPU": 2.0, "GPU": 0.0}`` (Ray reads
        its cluster's totals)."""
        ...

    def get_trial_resources(self, trial: Any) -> PlacementGroupFactory:
        """What ``trial``'s next attempt asks for (per rank for a group)."""
        ...

    def resources_problem(self, resources: PlacementGroupFactory) -> Optional[str]:
        """Why a trial asking for ``resources`` could never start here (None: it could)."""
        ...

    def change_trial_resources(self, trial: Any, resources: PlacementGroupFactory,
                               by: str) -> None:
        """Make the PAUSED ``trial``'s next attempts ask for ``resources`` (recorded in its
        ``resource_changes``, saying ``by`` whom); nothing when they already do."""
        ...


class Trial:
    """A trial as a resources allocation function sees it (Ray Tune's ``Trial``):
    ``trial_id``, ``config``, ``status`` (``PAUSED`` already for one whose attempt is ending at
    a pause), ``last_result``, ``iteration``, ``placement_group_factory`` (what it asks for now)
    and ``is_finished()``; every other attribute of the trial's record (``attempts``,
    ``failures``, ``resource_changes``, ...) is read through. ``trial.record`` is the record."""

    def __init__(self, record: Any, tune_controller: TuneController) -> None:
        self.record = record
        self._controller = tune_controller

    @property
    def trial_id(self) -> str:
        return self.record.trial_id

    @property
    def status(self) -> str:
        return str(self._controller.status_of(self.record))

    @property
    def placement_group_factory(self) -> PlacementGroupFactory:
        """What the trial's next attempt asks for."""
        return self._controller.get_trial_resources(self.record)

    @property
    def resources(self) -> dict:
        """What the trial asks for, summed, as ``{"CPU": n, "GPU": m}``."""
        return self.placement_group_factory.required_resources

    @property
    def metric_analysis(self) -> dict:
        """Nothing kept (Ray's running statistics of each metric); the results are in
        ``last_result`` and the trial's ``result.json``."""
        return {}

    def is_finished(self) -> bool:
        return self.status in _FINISHED

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("record", "_controller"):
            raise AttributeError(name)
        return getattr(self.record, name)

    def __eq__(self, other: object) -> bool:
        other_id: Optional[str] = getattr(other, "trial_id", None)
        return isinstance(other, Trial) and other_id == self.trial_id

    def __hash__(self) -> int:
        return hash(self.trial_id)

    def __repr__(self) -> str:
        return f"Trial({self.trial_id!r}, status={self.status!r})"
