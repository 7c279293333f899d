"""The contract between a :class:`~ftnb.elastic.WorkerGroup` and where its workers run.

The group holds all the policy (which calls go where, timeouts, failures, restarts, states,
tolerance); a backend only starts, calls, kills and classifies workers:
:class:`~ftnb.elastic.local_workers.LocalWorkers` (processes of this machine) and
:class:`~ftnb.elastic.ray_workers.RayWorkers` (Ray actors spread over a cluster's nodes).

Rules every backend follows:

- A worker answers its calls one at a time, in the order they were sent (the group starts a
  queued call's timeout when the one before it is answered).
- ``wait`` hands over answers ``(slot, call_id, ok, value or error)`` and deaths
  ``(slot, None, False, error)``; a slot's answers come before its death. An error is a dict
  with ``kind`` (a :class:`~ftnb.core.records.FailureKind` value, ``timeout`` or ``lost``),
  ``type``, ``message`` and ``traceback``.
- A worker whose call failed is ended by the group (``kill``), never by the backend.
- Workers die with the process that made the group (its owner), however that process ends.

Backends are chosen by name (``WorkerGroup(executor="ray")``) from
:data:`ftnb.registry.ELASTIC_BACKENDS`; a third party adds one with
:func:`ftnb.registry.register_elastic_backend`, a class built as ``cls(resources, custom)``
(``resources``: a :class:`~ftnb.execution.resources.TrialResources` per worker; ``custom``: the
other resources asked for, by name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

__all__ = ["Answer", "START_TIMEOUT_S", "WorkerBackend", "WorkerSlot", "backend_name",
           "worker_backend"]

#: How long a new worker may take to come up (be placed, build its object) before it counts
#: as failed.
START_TIMEOUT_S = 120.0


@dataclass(eq=False)  # a slot is itself: hashed by identity
class WorkerSlot:
    """One worker's place in a group: its index stays when the worker is recreated;
    ``handle`` is the backend's (a process and its pipe, an actor)."""

    index: int
    handle: Any = None
    healthy: bool = False
    starting_since: Optional[float] = None  # (monotonic) while its worker is starting
    needs_state: bool = False
    # call id -> deadline (monotonic), None (no timeout) or NOT_STARTED (queued behind another)
    in_flight: dict = field(default_factory=dict)


#: The deadline of a call queued behind another one in its worker: set when that one ends.
NOT_STARTED = object()


def is_time(deadline: Any) -> bool:
    """Whether an ``in_flight`` deadline is a time (not None, not :data:`NOT_STARTED`)."""
    return deadline is not None and deadline is not NOT_STARTED


#: ``(slot, call_id, ok, value or error)``; ``call_id`` None: the worker died (``error``).
Answer = tuple[WorkerSlot, Optional[int], bool, Any]


class WorkerBackend(Protocol):
    """How a group's workers are started, called, killed and classified."""

    name: str

    def start(self, slots: list[WorkerSlot], factory: bytes) -> None:
        """Begin starting a worker in each slot (``factory``: the cloudpickled ``(factory,
        takes_index, needs_set_state)``), a spare's if one is kept; returns at once."""

    def started(self, slots: list[WorkerSlot], timeout: float
                ) -> tuple[list[WorkerSlot], list[tuple[WorkerSlot, dict]]]:
        """Of ``slots`` (starting), those that came up and those that failed (already ended)
        with their errors, waiting up to ``timeout`` for all of them; the others are still
        starting (not placed yet, or building their object)."""

    def keep_spares(self, count: int, factory: bytes) -> None:
        """Keep ``count`` spare workers (started, the factory loaded, no object built yet) for
        :meth:`start` to hand a slot at once, starting the missing ones in the background and
        ending those over ``count``; a backend whose workers start fast may keep none."""

    def spares_ready(self) -> int:
        """How many spares are up (ready to take a slot at once)."""

    def push_state(self, slots: list[WorkerSlot], state: bytes) -> list[tuple[WorkerSlot, dict]]:
        """Hand ``state`` (cloudpickled) to each worker's ``set_state`` and wait for them; the
        failed ones with their errors."""

    def send(self, slot: WorkerSlot, call_id: int, payload: bytes) -> Optional[dict]:
        """Send a call (``payload``: the cloudpickled ``(fn, args, kwargs)``, the same object
        for every worker of one map); the error when the worker is found dead."""

    def wait(self, slots: list[WorkerSlot], timeout: Optional[float]) -> list[Answer]:
        """What the busy ``slots`` answered, waiting up to ``timeout`` (None: until one)."""

    def died_idle(self, slot: WorkerSlot) -> Optional[dict]:
        """The error of an idle worker found dead (killed between calls), else None."""

    def kill(self, slot: WorkerSlot) -> None:
        """End the worker now (its calls go unanswered)."""

    def close(self, slots: list[WorkerSlot]) -> None:
        """End the workers, letting the healthy ones call their object's ``close()`` first."""


def backend_name(executor: Any) -> str:
    """The backend ``WorkerGroup(executor=...)`` means: a registered name as it is; None: Ray
    inside a Ray actor, else local. Raises ``ValueError`` naming the known ones."""
    from ..registry import ELASTIC_BACKENDS

    if executor is None:
        from ..system.processes import in_ray_worker

        return "ray" if in_ray_worker() else "local"
    if executor not in ELASTIC_BACKENDS:
        raise ValueError(ELASTIC_BACKENDS.unknown(
            executor, shown=f"WorkerGroup(executor={executor!r})",
            also=" (as in RunConfig(executor=...)), or None (Ray inside a Ray actor, else local)"))
    return executor


def worker_backend(name: str, resources: Any, custom: dict) -> WorkerBackend:
    """A new backend of the kind registered as ``name`` (see :func:`backend_name`). Raises
    ``ImportError`` with the ``pip install`` that brings what it needs."""
    from ..registry import ELASTIC_BACKENDS

    return ELASTIC_BACKENDS.load(name, shown=f"WorkerGroup(executor={name!r})")(resources, custom)
