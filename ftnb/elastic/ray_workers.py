"""The Ray backend of :class:`~ftnb.elastic.WorkerGroup`: each worker a Ray actor of its own
(``pip install 'ftnb[ray]'``), spread over the cluster's nodes (the ``SPREAD`` strategy), with
the resources asked for (``num_cpus``, ``num_gpus``, custom resources).

A worker's actor answers its calls one at a time, in order; a second method, ``watch``, runs
in a concurrency group of its own and never returns, so its failure says that the actor died,
also while it was idle. A death is classified as a trial's is on the Ray executor
(:mod:`ftnb.execution.ray`): ``preemption`` when Ray says its node was drained for
preemption, ``node_lost`` when its node is no longer alive, ``oom`` when Ray's memory monitor
killed it, else ``signal`` (its process was killed). A worker whose call raised or timed out
is ended with ``ray.kill``, as RLlib does.

Starting an actor costs a Python process that imports Ray and registers with the cluster
(about 2 s of CPU, several seconds on a loaded node) before the factory runs. With spares
(``WorkerGroup(spare_workers=n)``) that is paid ahead: a spare is an actor of the same
resources, already started with the factory loaded; a failed slot takes one (it only builds
its object, ``factory(index)``, then takes the state) and a new spare starts in the
background. A spare found dead when it is taken is passed over; one that dies on being
taken (its node just lost) is replaced by a new actor, so a slot never fails for it.

The factory is put in Ray's object store once per group, not sent with each start; a map's
payload and a state sync are one ``ray.put`` each, whatever the number of workers.

Actors are owned by the process that made the group: when it dies (a trial's actor, a
script's driver) Ray kills them with it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ..system.processes import in_ray_worker
from .backend import START_TIMEOUT_S, Answer, WorkerSlot, is_time
from .worker import WorkerBody, describe_error, load_factory

__all__ = ["RayWorkers", "in_ray_worker"]

_EPS = 1e-9
_CLOSE_S = 5.0


class _WorkerActor:
    """A worker's actor (made a Ray actor class on first use): :meth:`start` for a slot's new
    worker; a spare is :meth:`boot`-ed, then :meth:`build`-s when it takes a slot."""

    def start(self, index: int, factory: bytes, env: dict, sys_path: list,
              cwd: Optional[str]) -> tuple[str, str, int, Optional[dict]]:
        """Build the worker's object; (node id, node address, pid, the error if building it
        failed)."""
        self.boot(factory, env, sys_path, cwd)
        return self.build(index)

    def boot(self, factory: bytes, env: dict, sys_path: list,
             cwd: Optional[str]) -> tuple[str, str, int]:
        """All of a start but building the object: the driver's context, the factory loaded
        (a failure to load it is :meth:`build`'s error); (node id, node address, pid)."""
        from ..execution.ray_actor import adopt_driver_context

        adopt_driver_context(env, sys_path, cwd)
        self.factory: Any = None
        self.boot_error: Optional[dict] = None
        try:
            self.factory = load_factory(factory)
        except BaseException as exc:
            self.boot_error = describe_error(exc)
        return _where()

    def build(self, index: int) -> tuple[str, str, int, Optional[dict]]:
        """Build the worker's object for slot ``index`` (after :meth:`boot`); as
        :meth:`start`."""
        error = self.boot_error
        if error is None:
            try:
                self.body = WorkerBody(index, self.factory)
            except BaseException as exc:
                error = describe_error(exc)
        self.factory = None
        return (*_where(), error)

    def call(self, payload: bytes) -> tuple[bool, Any]:
        return self.body.call(payload)

    def set_state(self, state: bytes) -> tuple[bool, Optional[dict]]:
        return self.body.set_state(state)

    def close(self) -> None:
        self.body.close()

    def watch(self) -> None:
        threading.Event().wait()  # fails (with the actor) only


def _where() -> tuple[str, str, int]:
    """This actor's node id, node address and pid."""
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()


@dataclass
class _Actor:
    actor: Any
    start_ref: Any = None
    node_id: Optional[str] = None
    ip: Optional[str] = None
    pid: Optional[int] = None
    watch_ref: Any = None
    calls: dict = field(default_factory=dict)  # call id -> its ObjectRef
    spare: bool = False  # it was a spare (booted before it took its slot)


class _Stored:
    """A value of the driver's and its copy in Ray's object store, put again only for another
    value (another object), so the workers of one map or start share one copy."""

    def __init__(self) -> None:
        self.value: Any = None
        self._ref: Any = None

    def ref(self, ray: Any, value: Any) -> Any:
        if value is not self.value:
            self.value, self._ref = value, ray.put(value)
        return self._ref


_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray.remote(concurrency_groups={"watch": 1})(_WorkerActor)
    return _ACTOR_CLASS


class RayWorkers:
    """Workers as Ray actors (see the module docstring). Connects to Ray if this process is
    not yet: to ``RAY_ADDRESS``, else a new local instance (as ``ray.init()``)."""

    name = "ray"

    def __init__(self, resources: Any, custom: dict) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False,
                     ignore_reinit_error=True)
        self._ray = ray
        self._check_fits(resources, custom)
        self._options = dict(num_cpus=resources.cpu, num_gpus=resources.gpu,
                             resources=dict(custom) or None, max_restarts=0,
                             scheduling_strategy="SPREAD")
        self._env = {"OMP_NUM_THREADS": str(max(1, int(resources.cpu)))}
        self._actor_class = _actor_class(ray)
        self._payload = _Stored()  # a map's payload: one copy per map, not one per worker
        self._factory = _Stored()  # one copy for every start
        self._spares: list[_Actor] = []  # oldest first

    def _check_fits(self, resources: Any, custom: dict) -> None:
        asked = {"CPU": resources.cpu, "GPU": resources.gpu, **custom}
        nodes = [n["Resources"] for n in self._ray.nodes() if n.get("Alive")]
        if any(all(n.get(k, 0.0) + _EPS >= v for k, v in asked.items() if v) for n in nodes):
            return
        shown = {k: v for k, v in asked.items() if v}
        raise ValueError(
            f"WorkerGroup(resources_per_worker=...) asks for {shown} per worker, which no "
            f"alive node of this Ray cluster has ({len(nodes)} nodes). Fix: ask for less, or "
            "add a node with those resources."
        )

    def start(self, slots: list[WorkerSlot], factory: bytes) -> None:
        for slot in slots:
            spare = self._take_spare()
            if spare is None:
                slot.handle = self._new_actor()
                slot.handle.start_ref = slot.handle.actor.start.remote(
                    slot.index, self._factory.ref(self._ray, factory), *self._context())
            else:
                slot.handle = spare
                spare.start_ref = spare.actor.build.remote(slot.index)

    def keep_spares(self, count: int, factory: bytes) -> None:
        while len(self._spares) > count:
            self._end(self._spares.pop())
        while len(self._spares) < count:
            spare = self._new_actor()
            spare.spare = True
            spare.start_ref = spare.actor.boot.remote(self._factory.ref(self._ray, factory),
                                                      *self._context())
            self._spares.append(spare)

    def spares_ready(self) -> int:
        if not self._spares:
            return 0
        ray = self._ray
        booted, _ = ray.wait([s.start_ref for s in self._spares],
                             num_returns=len(self._spares), timeout=0)
        dead, _ = ray.wait([s.watch_ref for s in self._spares],
                           num_returns=len(self._spares), timeout=0)
        return sum(s.start_ref in booted and s.watch_ref not in dead for s in self._spares)

    def _new_actor(self) -> _Actor:
        actor = self._actor_class.options(**self._options).remote()
        # Its watch runs from its start (a concurrency group of its own): a spare's death is
        # seen before it is taken.
        return _Actor(actor, watch_ref=actor.watch.options(concurrency_group="watch").remote())

    def _context(self) -> tuple[dict, list, str]:
        return self._env, list(sys.path), os.getcwd()

    def _take_spare(self) -> Optional[_Actor]:
        """The oldest spare that is not known dead (the dead ones are ended)."""
        while self._spares:
            spare = self._spares.pop(0)
            dead, _ = self._ray.wait([spare.watch_ref], timeout=0)
            if not dead:
                return spare
            self._end(spare)
        return None

    def started(self, slots: list[WorkerSlot], timeout: float
                ) -> tuple[list[WorkerSlot], list[tuple[WorkerSlot, dict]]]:
        ray = self._ray
        deadline = time.monotonic() + timeout
        up: list[WorkerSlot] = []
        failed: list[tuple[WorkerSlot, dict]] = []
        while slots:
            refs = {slot.handle.start_ref: slot for slot in slots}
            ready, _ = ray.wait(list(refs), num_returns=len(refs),
                                timeout=max(0.0, deadline - time.monotonic()))
            replaced = []
            for ref in ready:
                slot = refs[ref]
                handle = slot.handle
                try:
                    handle.node_id, handle.ip, handle.pid, error = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    # A spare that died as it was taken (its node just lost; a factory that
                    # kills its process kills the new actor's too, which then counts):
                    if handle.spare:
                        self.kill(slot)
                        slot.handle = None
                        self.start([slot], self._factory.value)
                        replaced.append(slot)
                        continue
                    error = self._error(slot, exc)
                except Exception as exc:
                    error = self._error(slot, exc)
                if error is not None:
                    self.kill(slot)
                    failed.append((slot, error))
                else:
                    up.append(slot)
            slots = replaced
            if time.monotonic() >= deadline:
                break
        return up, failed

    def push_state(self, slots: list[WorkerSlot], state: bytes) -> list[tuple[WorkerSlot, dict]]:
        ray = self._ray
        state_ref = ray.put(state)  # once, however many workers take it
        refs = {slot.handle.actor.set_state.remote(state_ref): slot for slot in slots}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=START_TIMEOUT_S)
        failed = []
        for ref, slot in refs.items():
            if ref not in ready:
                failed.append((slot, {"kind": "timeout", "type": None, "traceback": None,
                                      "message": "set_state did not return in "
                                                 f"{START_TIMEOUT_S:.0f} s"}))
                continue
            try:
                ok, error = ray.get(ref)
            except Exception as exc:
                ok, error = False, self._error(slot, exc)
            if not ok:
                failed.append((slot, error))
        return failed

    def send(self, slot: WorkerSlot, call_id: int, payload: bytes) -> Optional[dict]:
        ref = self._payload.ref(self._ray, payload)
        slot.handle.calls[call_id] = slot.handle.actor.call.remote(ref)
        return None

    def wait(self, slots: list[WorkerSlot], timeout: Optional[float]) -> list[Answer]:
        ray = self._ray
        refs: dict[Any, tuple[WorkerSlot, Optional[int]]] = {}
        for slot in slots:
            for call_id in slot.in_flight:
                if call_id in slot.handle.calls:
                    refs[slot.handle.calls[call_id]] = (slot, call_id)
        for slot in slots:
            refs[slot.handle.watch_ref] = (slot, None)
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
        if not ready:
            return []
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        answers: list[Answer] = []
        dead: set[WorkerSlot] = set()
        for ref, (slot, call_id) in refs.items():  # a slot's calls in order, then its watch
            if ref not in ready_set or slot in dead:
                continue
            if call_id is not None:
                del slot.handle.calls[call_id]
            try:
                value = ray.get(ref)
            except self._ray.exceptions.RayActorError as exc:
                dead.add(slot)
                # The map waits for a cause no longer than the slot's calls may take.
                deadline = min(filter(is_time, slot.in_flight.values()), default=None)
                answers.append((slot, None, False, self._error(slot, exc, deadline)))
                continue
            except Exception as exc:  # Ray could not return the value (unpicklable)
                answers.append((slot, call_id, False, describe_error(exc)))
                continue
            if call_id is not None:
                answers.append((slot, call_id, *value))
        return answers

    def died_idle(self, slot: WorkerSlot) -> Optional[dict]:
        ready, _ = self._ray.wait([slot.handle.watch_ref], timeout=0)
        if not ready:
            return None
        try:
            self._ray.get(ready[0])
        except Exception as exc:
            return self._error(slot, exc)
        return None

    def _error(self, slot: WorkerSlot, exc: BaseException,
               deadline: Optional[float] = None) -> dict:
        """What an exception of Ray's about a worker's actor means (see the module
        docstring). A death Ray has not explained yet is waited on until ``deadline`` (the
        ``time.monotonic()`` by which the slot's calls were due; None: up to
        ``DEATH_SETTLE_S``), so a map during which a worker dies still ends by the call
        timeout; unexplained by then, it reads as ``signal``."""
        ray = self._ray
        message = str(exc)
        if not isinstance(exc, ray.exceptions.RayActorError):
            return describe_error(exc)
        if getattr(exc, "actor_init_failed", False):
            return dict(describe_error(exc), kind="exception")
        from ..execution.ray_nodes import DEATH_SETTLE_S, dead_node_named, death_untold, settle_death

        node_id = slot.handle.node_id

        def alive() -> set:
            return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}

        if node_id is not None and death_untold(ray, exc) and node_id in alive():
            # Gone with no cause told, its node still listed (a node lost under load): wait
            # for Ray to say (see death_untold).
            wait_s = DEATH_SETTLE_S if deadline is None else \
                min(DEATH_SETTLE_S, max(0.0, deadline - time.monotonic()))
            exc = settle_death(ray, slot.handle.actor, exc, lambda: node_id in alive(),
                               timeout=wait_s)
            message = str(exc)
        if getattr(exc, "preempted", False):
            kind, what = "preemption", "its node was drained for preemption"
        elif dead_node_named(exc) is not None or (node_id is not None and
                                                   node_id not in alive()):
            lost = node_id or dead_node_named(exc) or ""
            kind, what = "node_lost", f"its node {lost[:12]} is gone"
        elif "low on memory" in message or "memory pressure" in message:
            kind, what = "oom", "Ray's memory monitor killed it"
        else:
            kind, what = "signal", "its process died (killed)"
        return {"kind": kind, "type": type(exc).__name__, "traceback": None,
                "message": f"the worker's actor died: {what}", "detail": message[-2000:],
                "node_id": node_id}

    def kill(self, slot: WorkerSlot) -> None:
        if slot.handle is not None:
            self._end(slot.handle)

    def _end(self, handle: _Actor) -> None:
        handle.calls.clear()
        try:
            self._ray.kill(handle.actor, no_restart=True)
        except Exception:
            pass

    def close(self, slots: list[WorkerSlot]) -> None:
        ray = self._ray
        closing = [slot.handle.actor.close.remote() for slot in slots
                   if slot.handle is not None and slot.healthy]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=_CLOSE_S)
        spares, self._spares = self._spares, []
        handles = spares + [slot.handle for slot in slots if slot.handle is not None]
        for handle in handles:
            if handle.pid is None and handle.start_ref is not None:
                # A spare, or a worker still starting (recreated when its slot's failed): its
                # process is known once it has booted.
                ready, _ = ray.wait([handle.start_ref], timeout=0)
                if ready:
                    try:
                        handle.node_id, handle.ip, handle.pid = ray.get(ready[0])[:3]
                    except Exception:
                        pass
            self._end(handle)
        # Wait (a moment) for the actors' processes on this machine to be gone, so a caller
        # that checks finds none left.
        from ..system.processes import process_status

        here = ray.util.get_node_ip_address()
        deadline = time.monotonic() + _CLOSE_S
        for handle in handles:
            while handle.pid and handle.ip == here and time.monotonic() < deadline:
                if process_status(handle.pid) in (None, "Z", "X"):
                    break
                time.sleep(0.01)
