"""What a running trial knows of itself: :class:`TrialContext`, as ``ftnb.get_context()``
returns it inside a trial (ids, names, folders, the attempt, the rank in a group, the resources
given, and whether to checkpoint now)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..execution.placement_groups import PlacementGroupFactory

__all__ = ["TrialContext"]


@dataclass
class TrialContext:
    """Facts about the running trial, as returned by :func:`ftnb.get_context`.

    Attributes and Ray-style getters (``get_trial_id()`` etc.) are both provided.
    """

    trial_id: str
    trial_name: str
    experiment_name: str
    experiment_path: str
    trial_dir: str
    attempt: int
    world_rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    #: What the trial asked for (``{"cpu": 1.0, "gpu": 0.0}``): resources_per_trial or
    #: ftnb.with_resources, per rank for a group.
    resources: Optional[dict] = None
    _session: Any = None

    @property
    def should_checkpoint(self) -> bool:
        """True once the process has been asked to stop (SIGTERM: preemption, or a stop
        request): report a checkpoint now and it will be resumed from there."""
        s = self._session
        return bool(s and (s.preempted or s.stop_requested))

    @property
    def preempted(self) -> bool:
        """True once the trial process received SIGTERM (its machine or slot is going away)."""
        return bool(self._session and self._session.preempted)

    def get_trial_id(self) -> str:
        return self.trial_id

    def get_trial_name(self) -> str:
        return self.trial_name

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_trial_dir(self) -> str:
        return self.trial_dir

    def get_world_rank(self) -> int:
        """This rank's place in its group (0 for an ordinary trial)."""
        return self.world_rank

    def get_world_size(self) -> int:
        """How many ranks the group has (1 for an ordinary trial)."""
        return self.world_size

    def get_local_rank(self) -> int:
        """This rank's place among the group's ranks on its node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """How many of the group's ranks run on this node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """The index of this rank's node among the group's nodes."""
        return self.node_rank

    def get_experiment_path(self) -> str:
        return self.experiment_path

    def get_trial_resources(self) -> "PlacementGroupFactory":
        """The resources this trial (each rank of a group) was given: Ray Tune's
        ``get_trial_resources()``, a ``PlacementGroupFactory`` of one bundle
        (``.required_resources``: ``{"CPU": 2.0}``), which is also the dict
        ``{"cpu": 2.0, "gpu": 0.0}``. A ResourceChangingScheduler's change
        shows here from the attempt it restarts the trial with."""
        from ..execution.placement_groups import PlacementGroupFactory

        given = self.resources if self.resources is not None else {"cpu": 1.0, "gpu": 0.0}
        return PlacementGroupFactory.from_amounts(float(given.get("cpu", 0.0)),
                                                  float(given.get("gpu", 0.0)))
