"""Ray's nodes going away, as the Ray executor (:mod:`ftnb.execution.ray`) and the Ray worker
backend (:mod:`ftnb.elastic.ray_workers`) see it.

A node that dies takes its actors with it. Their connections can break before the GCS's health
checks call the node dead, and Ray then raises with no cause while the node still reads alive
(:func:`death_untold`): the actor is probed (:func:`probe_death`, :func:`settle_death`) until
Ray says why or the node reads dead, so a lost node is not taken for a killed process. A node
drained for preemption (``ray drain-node``, a cloud autoscaler) is in the GCS's list of draining
nodes (:func:`draining_nodes`), which :class:`DrainWatch` reads for the executor.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Optional

if TYPE_CHECKING:
    from .ray_attempts import RayAttempt

__all__ = ["DEATH_SETTLE_S", "DRAIN_CHECK_S", "DrainWatch", "dead_node_named", "death_untold",
           "draining_nodes", "probe_death", "settle_death"]

#: How long an actor gone with no cause told waits for Ray to say why (see :func:`death_untold`).
DEATH_SETTLE_S = 60.0
#: How often the executor asks the GCS which nodes are being drained.
DRAIN_CHECK_S = 0.5


def dead_node_named(exc: Optional[BaseException]) -> Optional[str]:
    """The node Ray names when it cancelled an actor because its node died before the actor
    ran (so it never said where it was): the attempt lost its node, it did not fail."""
    import re

    found = re.search(r"its node has died\. Node Id: ([0-9a-f]+)", str(exc or ""))
    return found.group(1) if found else None


def death_untold(ray: Any, exc: Optional[BaseException]) -> bool:
    """Ray raised ``exc`` before it knew why the actor is gone: its connection to the actor
    broke (``ActorUnavailableError``), or it gave up waiting for the cause (an
    ``ActorDiedError`` that names none). A node lost under load does this: its actors' sockets
    close before the GCS's health checks call the node dead, so "its node is alive" is not yet
    news. Asking the actor again (:func:`probe_death`) gets the cause once Ray has it."""
    unavailable = getattr(ray.exceptions, "ActorUnavailableError", None)
    if unavailable is not None and isinstance(exc, unavailable):
        return True
    died = getattr(ray.exceptions, "ActorDiedError", None)
    return died is not None and isinstance(exc, died) and \
        str(exc).strip() == getattr(died, "BASE_ERROR_MSG", None)


def probe_death(actor: Any) -> Any:
    """A call that fails with the actor's cause of death once Ray knows it."""
    return actor.__ray_ready__.remote()


def settle_death(ray: Any, actor: Any, exc: BaseException, node_alive: Any,
                 timeout: float = DEATH_SETTLE_S) -> BaseException:
    """Why ``actor`` died, when ``exc`` did not say (:func:`death_untold`): blocks until Ray
    raises a told cause for a probe (returned), ``node_alive()`` turns False (``exc`` returned:
    the caller sees the node gone) or ``timeout`` passes (``exc``). For callers that can wait;
    the executor probes without blocking its loop."""
    deadline = time.monotonic() + timeout
    probe = probe_death(actor)
    while time.monotonic() < deadline and node_alive():
        ready, _ = ray.wait([probe], timeout=0.2)
        if not ready:
            continue
        try:
            ray.get(probe)
        except ray.exceptions.RayActorError as later:
            if not death_untold(ray, later):
                return later
            time.sleep(0.1)
            probe = probe_death(actor)
            continue
        except Exception:
            return exc
        return exc  # it answered: alive after all (its call's failure stays what it was)
    return exc


def draining_nodes() -> dict[str, int]:
    """The nodes being drained, ``{node id (hex): deadline in ms since the epoch, 0: none}``.

    Ray has no public API for this in 2.x: this is the GCS call Ray Train's preemption watcher
    and Ray Data use (``ray._private.state``); if it moves, drains go unnoticed here (a rank
    on a node that then dies still ends as preempted when Ray says so), nothing fails."""
    try:
        import ray._private.state

        return dict(ray._private.state.state.get_draining_nodes())
    except Exception:
        return {}


class DrainWatch:
    """The nodes being drained (the GCS asked at most every ``check_s`` seconds), and what
    that means for the attempts with a rank on one: every rank of such an attempt is told to
    leave (a group checkpoints together), and those still running at the node's deadline are
    killed; their deaths then end the attempt as preempted."""

    def __init__(self, check_s: float = DRAIN_CHECK_S) -> None:
        self.check_s = check_s
        #: node id -> its drain deadline (ms since the epoch; 0: none).
        self.draining: dict[str, int] = {}
        self._checked_at = 0.0

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.draining

    def watch(self, ray: Any, attempts: Iterable["RayAttempt"]) -> None:
        """Tell the running ``attempts`` on nodes being drained, and end those still running
        at their node's deadline."""
        now = time.monotonic()
        if now - self._checked_at >= self.check_s:
            self._checked_at = now
            self.draining = draining_nodes()
        if not self.draining:
            return
        for attempt in attempts:
            if not attempt.running:
                continue
            if not attempt.told_to_leave:
                deadlines = [self.draining[rank.node_id] for rank in attempt.ranks
                             if not rank.exited and rank.node_id in self.draining]
                if not deadlines:
                    continue
                attempt.told_to_leave = True
                if any(deadlines):
                    attempt.drain_deadline = min(d for d in deadlines if d) / 1000.0
                for rank in attempt.ranks:  # a group checkpoints together: every rank is told
                    if not rank.exited:
                        rank.actor.preempt.remote()
            elif attempt.drain_deadline is not None and time.time() >= attempt.drain_deadline:
                attempt.drain_deadline = None
                for rank in attempt.ranks:  # (their deaths end the attempt as preempted)
                    if not rank.exited:
                        try:
                            ray.kill(rank.actor, no_restart=True)
                        except Exception:
                            pass
