"""What the Ray executor (:mod:`ftnb.execution.ray`) keeps of each attempt it runs
(:class:`RayAttempt`) and of each of its ranks (:class:`RayRank`), from the driver's side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .contract import AttemptSpec, ErrorEvent
from .group_failures import GroupFailures

__all__ = ["RayAttempt", "RayRank"]


@dataclass
class RayRank:
    """One rank of an attempt on Ray: its actor, where it runs, the calls in flight to it (Ray
    object refs) and how it ended."""

    index: int
    actor: Any
    node_id: Optional[str] = None
    ip: Optional[str] = None
    pid: Optional[int] = None
    server_pid: int = 0  # its actor's output pump, which ends the rank's strays once it died
    where_ref: Any = None
    run_ref: Any = None
    events_ref: Any = None
    exit_code: Optional[int] = None
    exited: bool = False
    node_lost: bool = False
    error: Optional[ErrorEvent] = None
    killed_by_us: bool = False
    preempted: bool = False  # its actor died on a node going away: it exits as preempted
    probe_ref: Any = None  # its actor is gone and Ray has not said why yet: the probe asks
    probe_exc: Optional[BaseException] = None  # (what Ray raised first)
    probe_until: float = 0.0  # (time.monotonic()) when the probe gives up

    @property
    def probing(self) -> bool:
        return self.probe_exc is not None and not self.exited


@dataclass
class RayAttempt:
    """One attempt the Ray executor runs: its ranks, their resources and placement group, and
    its group's failures and drain (see :mod:`ftnb.execution.ray`)."""

    spec: AttemptSpec
    payload: bytes
    ranks: list[RayRank]
    resources: dict
    placement_group: Any = None
    ready_ref: Any = None  # the placement group's readiness
    running: bool = False
    started_sent: bool = False
    failures: GroupFailures = field(default_factory=GroupFailures)  # and the cause, once known
    objects: dict = field(default_factory=dict)  # ftnb.put ref id -> the Ray object of its object
    told_to_leave: bool = False  # a rank's node is draining: every rank was told
    drain_deadline: Optional[float] = None  # (time.time()) when that node goes
    preempted_seen: bool = False  # a PreemptedEvent was handed over

    @property
    def group(self) -> bool:
        return len(self.ranks) > 1
