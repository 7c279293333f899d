"""Ray: attempts as Ray actors on a cluster's nodes (``pip install 'ftnb[ray]'``).

Each attempt runs in a Ray actor of its own (a fresh worker process, killed when the attempt
ends) with the resources it asked for; a group's ranks run in one actor each, placed together by
a placement group (one bundle per rank), their rendezvous address being rank 0's node. The body
is the same as everywhere (:func:`ftnb.execution.attempt.run_attempt`): the attempt persists its
own results to the experiment's storage, which every node must reach (S3/GCS, or a path shared
by NFS that the user declares so: ``RayExecutor(shared_storage=True)`` or
``FTNB_SHARED_STORAGE=1``); a local path on a cluster of several nodes is refused before
anything starts.

Each rank's stdout and stderr go to its files in the trial's folder (``stdout``, ``stderr``,
``stdout.rank1``...), over all attempts. On an object store they are written on the rank's
node and published from the actor: every ``$FTNB_OUTPUT_PUBLISH_S`` seconds (default 5; the
driver's value is passed on) when they grew, as their last 8 MiB at most, and whole when the
attempt body returns (:class:`~ftnb.storage.growing_files.PeriodicPublisher`). A rank
SIGKILLed or lost with its node keeps what was published before (its last seconds of output
are lost); the next attempt continues the files from the published copies (their last 8 MiB).
An attempt replaced by a later one (a ghost on a node taken for lost) publishes nothing more.
Once published whole, the node's copies are removed (after their last lines were handed over
as events); a killed actor's are removed by the next actor that stages output on that node
(:func:`~ftnb.storage.growing_files.sweep_staging_folders`).

Events come back by long polls: each actor holds its attempt's events until the executor's
pending ``next_events`` call takes them. A node that dies takes its actors with it: their
attempt ends with a ``node_lost`` exit event, which is noticed as fast as Ray's health checks
allow (``health_check_period_ms`` x ``health_check_failure_threshold``: about 14 s by default,
1.5 s with 500 ms x 3; see docs/how-to/ray-clusters.md). Its actors' connections can break
before that, and Ray then raises with no cause while the node still reads alive
(:func:`~ftnb.execution.ray_nodes.death_untold`); the rank is then probed, without holding up
the other attempts, until Ray says why or the node reads dead, so a lost node is not taken for
a killed process.

A node drained for preemption (``ray drain-node`` / the GCS's ``DrainNode`` with reason
PREEMPTION and a deadline, as cloud autoscalers do) is seen by the executor's poll (the GCS's
list of draining nodes, asked at most every half second): every rank of an attempt with a rank
on it is told (``session.preempted``: ``should_checkpoint`` turns True, the next report with a
checkpoint ends the attempt), and a rank still running at the deadline is killed. Either way
the attempt ends as a preemption (not counted against ``max_failures``), also when the node
dies under it first: a told rank, or one whose actor Ray says was preempted, exits with
:data:`~ftnb.execution.contract.EXIT_PREEMPTED`, not as a lost node.

``ftnb.put`` refs work on any node, wherever the attempt meets them: in its config, its
datasets, or the trainable's own code (a closure or a global of a notebook's function, which
cloudpickle ships by value). Pickling the attempt notes every ref it meets; the executor puts
each ref's object into Ray's object store once (cached by ref id for its life), and the actor
hands those objects to ``ftnb.get`` (:func:`ftnb.objects.store.supply`) before the attempt
body runs, so no ref reads the file of the machine that put it. As with Ray, numpy arrays (and
DataFrame blocks) arrive zero-copy and read-only: copy one before writing into it.

This module is the driver's side. What runs in the actor is :mod:`ftnb.execution.ray_actor`;
what the executor keeps of each attempt and rank, :mod:`ftnb.execution.ray_attempts`; nodes
that die or are drained, :mod:`ftnb.execution.ray_nodes`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from ..storage.growing_files import PUBLISH_INTERVAL_ENV, publish_interval_s
from .contract import (
    EXIT_PREEMPTED,
    AttemptEvent,
    AttemptSpec,
    Capacity,
    DoneEvent,
    ErrorEvent,
    ExitEvent,
    NoRoomError,
    PreemptedEvent,
    RankExit,
    StartedEvent,
    is_peer_error,
)
from .rank_group import RankPlace
from .ray_actor import AttemptActor, dump_attempt
from .ray_attempts import RayAttempt, RayRank
from .ray_nodes import DEATH_SETTLE_S, DrainWatch, dead_node_named, death_untold, probe_death
from .resources import TrialResources

if TYPE_CHECKING:
    from ..storage import Storage

__all__ = ["RayExecutor"]

SHARED_STORAGE_ENV = "FTNB_SHARED_STORAGE"
#: Settings of the driver's environment that its actors take over: the output files' cap
#: and whether attempts get cgroups.
_DRIVER_CHOICES = ("FTNB_OUTPUT_MAX_BYTES", "FTNB_ATTEMPT_CGROUPS")
_LONG_POLL_S = 1.0
_EPS = 1e-9


class RayExecutor:
    """Runs attempts as Ray actors on a cluster (see the module docstring).

    ``address``: the cluster (default ``RAY_ADDRESS``, else the one this process is connected
    to, else a new local instance). ``shared_storage``: the storage path is on a filesystem
    every node mounts (NFS); default ``FTNB_SHARED_STORAGE=1``. ``output_events``: hand rank 0's
    output over as it is written (every rank's is in its own files in the trial's folder).
    """

    name = "ray"
    runs_groups = True

    def __init__(self, address: Optional[str] = None, *, shared_storage: Optional[bool] = None,
                 output_events: bool = True, pool: Any = None,
                 init_options: Optional[dict] = None) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        if shared_storage is None:
            shared_storage = os.environ.get(SHARED_STORAGE_ENV, "") in ("1", "true", "yes")
        self.shared_storage = shared_storage
        self._output_events = output_events
        self._init_options = dict(init_options or {})
        self._running: dict[str, RayAttempt] = {}
        self._closed = False
        self._actor_class: Any = None
        self._nodes_cache: tuple[float, list] = (0.0, [])
        self._ray_objects: dict[str, Any] = {}  # ftnb.put ref id -> its object in Ray's store
        self._drains = DrainWatch()  # the nodes being drained

    # -- the cluster -----------------------------------------------------------------------------
    def _ray(self) -> Any:
        import ray

        if not ray.is_initialized():
            options = dict(log_to_driver=False, ignore_reinit_error=True)
            options.update(self._init_options)
            ray.init(address=self.address, **options)
        if self._actor_class is None:
            self._actor_class = ray.remote(AttemptActor)
        return ray

    def _nodes(self) -> list[dict]:
        """The alive nodes' resources (cached for a second)."""
        now = time.monotonic()
        if now - self._nodes_cache[0] > 1.0:
            ray = self._ray()
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._nodes_cache = (now, nodes)
        return self._nodes_cache[1]

    def capacity(self) -> Capacity:
        cpus = sum(n["Resources"].get("CPU", 0.0) for n in self._nodes())
        gpus = int(sum(n["Resources"].get("GPU", 0.0) for n in self._nodes()))
        return Capacity(cpus, tuple(str(i) for i in range(gpus)))

    def check_fits(self, resources: TrialResources, num_workers: int = 1) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be a whole number >= 1.")
        nodes = self._nodes()
        fits_one = any(n["Resources"].get("CPU", 0.0) + _EPS >= resources.cpu
                       and n["Resources"].get("GPU", 0.0) + _EPS >= resources.gpu
                       for n in nodes)
        total = self.capacity()
        fits_all = (total.cpus + _EPS >= resources.cpu * num_workers
                    and total.gpus + _EPS >= resources.gpu * num_workers)
        if fits_one and fits_all:
            return
        what = (f"ScalingConfig(num_workers={num_workers}, resources_per_worker="
                f"{resources._short_repr()})" if num_workers > 1
                else f"resources_per_trial={resources._short_repr()}")
        raise ValueError(
            f"{what} can never be satisfied on this Ray cluster: its {len(nodes)} alive nodes have "
            f"{total.cpus:g} CPUs and {total.gpus} GPUs in all, at most "
            f"{max((n['Resources'].get('CPU', 0.0) for n in nodes), default=0):g} CPUs on one "
            "node. Fix: ask for less, or add nodes to the cluster."
        )

    def check_storage(self, storage: "Storage") -> None:
        """Refuse a local path when the cluster has several nodes, unless declared shared."""
        if self.shared_storage or not storage.is_local:
            return
        nodes = self._nodes()
        if len(nodes) > 1:
            raise ValueError(
                f"storage_path={storage.uri(storage.root)!r} is a local path, but the Ray "
                f"cluster has {len(nodes)} nodes and trials on the others could not write "
                "there. Fix: use storage every node reaches (s3://..., gs://...), or, if that "
                "path is a shared filesystem (NFS) mounted at the same place on every node, "
                f"declare it: RayExecutor(shared_storage=True) or {SHARED_STORAGE_ENV}=1."
            )

    def _used(self) -> tuple[float, float]:
        cpu = sum(a.resources["CPU"] for a in self._running.values())
        gpu = sum(a.resources["GPU"] for a in self._running.values())
        return cpu, gpu

    def has_room(self, resources: TrialResources, num_workers: int = 1) -> bool:
        self.check_fits(resources, num_workers)
        # A draining node takes nothing new: its resources are not room (but they still count
        # for check_fits, as a drained node is usually replaced).
        nodes = [n for n in self._nodes() if n["NodeID"] not in self._drains]
        cpus = sum(n["Resources"].get("CPU", 0.0) for n in nodes)
        gpus = int(sum(n["Resources"].get("GPU", 0.0) for n in nodes))
        cpu, gpu = self._used()
        return (cpu + resources.cpu * num_workers <= cpus + _EPS
                and gpu + resources.gpu * num_workers <= gpus + _EPS)

    def running(self) -> list[str]:
        return list(self._running)

    # -- starting --------------------------------------------------------------------------------
    def start(self, spec: AttemptSpec) -> None:
        if self._closed:
            raise RuntimeError("this executor was shut down: it starts nothing more")
        ray = self._ray()
        self.check_fits(spec.resources, spec.num_workers)
        self.check_storage(spec.storage)
        if spec.trial_id in self._running:
            raise ValueError(f"trial {spec.trial_id!r} already has a running attempt here")
        if not self.has_room(spec.resources, spec.num_workers):
            raise NoRoomError(f"no room for trial {spec.trial_id!r} on the Ray cluster now")
        payload, refs = dump_attempt(spec)
        objects = {ref_id: found for ref_id, ref in refs.items()
                   if (found := self._ray_object(ray, ref)) is not None}
        n = spec.num_workers
        res = spec.resources
        env = {"FTNB_TRIAL_ID": spec.trial_id}
        if spec.fence is not None:
            env["FTNB_LEASE_TOKEN"] = spec.fence.token
        if "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, int(res.cpu)))
        if os.environ.get(PUBLISH_INTERVAL_ENV):  # the actors publish output as often
            env[PUBLISH_INTERVAL_ENV] = str(publish_interval_s())
        for name in _DRIVER_CHOICES:  # (the driver's choices hold on every node)
            if os.environ.get(name):
                env[name] = os.environ[name]
        options: dict = dict(num_cpus=res.cpu, num_gpus=res.gpu, max_restarts=0,
                             max_concurrency=4)
        placement = ready = None
        if n > 1:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"CPU": res.cpu, **({"GPU": res.gpu} if res.gpu else {})}
            placement = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
            ready = placement.ready()
        ranks = []
        for index in range(n):
            rank_options = dict(options)
            if placement is not None:
                rank_options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement, placement_group_bundle_index=index)
            actor = self._actor_class.options(**rank_options).remote(
                env, list(sys.path), os.getcwd())
            rank = RayRank(index, actor)
            rank.where_ref = actor.where.remote()
            ranks.append(rank)
        self._running[spec.trial_id] = RayAttempt(
            spec, payload, ranks, {"CPU": res.cpu * n, "GPU": res.gpu * n}, placement, ready,
            objects=objects)

    def _ray_object(self, ray: Any, ref: Any) -> Any:
        """The Ray object holding ``ref``'s object: put once (from this machine's store), then
        the same for every attempt of this executor's life. None when the object is gone here
        too: the attempt's own ``ftnb.get`` then fails with the reason and the fix."""
        from ..objects import ObjectUnavailableError, get

        found = self._ray_objects.get(ref.id)
        if found is None:
            try:
                found = self._ray_objects[ref.id] = ray.put(get(ref))
            except ObjectUnavailableError:
                return None
        return found

    # -- events ----------------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[AttemptEvent]:
        if not self._running:
            time.sleep(min(timeout, 0.05))
            return []
        ray = self._ray()
        refs: dict[Any, tuple[RayAttempt, Optional[RayRank], str]] = {}
        for attempt in self._running.values():
            if attempt.ready_ref is not None and not attempt.running:
                refs[attempt.ready_ref] = (attempt, None, "ready")
            for rank in attempt.ranks:
                if rank.exited:
                    continue
                for ref, kind in ((rank.where_ref, "where"), (rank.run_ref, "run"),
                                  (rank.events_ref, "events"), (rank.probe_ref, "probe")):
                    if ref is not None:
                        refs[ref] = (attempt, rank, kind)
        if any(a.group and a.failures.settling for a in self._running.values()) or \
                any(r.probing for a in self._running.values() for r in a.ranks):
            timeout = min(timeout, 0.25)  # (to end the settle window, or a probe, on time)
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout) if refs else ([], [])
        if ready:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        events: list[AttemptEvent] = []
        for ref in ready:
            attempt, rank, kind = refs[ref]
            if attempt.spec.trial_id not in self._running:
                continue
            if rank is not None and ref is not {"where": rank.where_ref, "run": rank.run_ref,
                                                "events": rank.events_ref,
                                                "probe": rank.probe_ref}[kind]:
                continue  # taken already (a run's end takes its last long poll with it)
            events.extend(self._take_ready(ray, attempt, rank, kind, ref))
        self._drains.watch(ray, self._running.values())
        now = time.monotonic()
        for attempt in list(self._running.values()):
            for rank in attempt.ranks:
                if not rank.probing:
                    continue
                if now >= rank.probe_until or \
                        rank.node_id not in {n["NodeID"] for n in self._nodes()}:
                    events.extend(self._rank_gone(ray, attempt, rank, rank.probe_exc, told=True))
                elif rank.probe_ref is None:
                    rank.probe_ref = probe_death(rank.actor)
            if attempt.group:
                self._supervise(ray, attempt, now)
            if attempt.running and all(rank.exited for rank in attempt.ranks):
                events.extend(self._finish(ray, attempt))
            elif not attempt.running and any(rank.exited for rank in attempt.ranks):
                # A rank's actor died before the attempt body started (its node was lost, or
                # Ray cancelled or refused its creation): the attempt ends now, as one.
                for rank in attempt.ranks:
                    if not rank.exited:
                        rank.exited = rank.killed_by_us = True
                        rank.exit_code = -9
                events.extend(self._finish(ray, attempt))
        return events

    def _take_ready(self, ray: Any, attempt: RayAttempt, rank: Optional[RayRank], kind: str,
                    ref: Any) -> list[AttemptEvent]:
        if kind == "ready":
            attempt.ready_ref = None
            self._maybe_run(attempt)
            return []
        assert rank is not None
        if kind == "where":
            rank.where_ref = None
            try:
                rank.node_id, rank.ip, rank.pid, rank.server_pid = ray.get(ref)
            except Exception as exc:
                return self._rank_gone(ray, attempt, rank, exc)
            return self._maybe_run(attempt)
        if kind == "probe":  # Ray says now why the rank's actor is gone (see _rank_gone)
            rank.probe_ref = None
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                return self._rank_gone(ray, attempt, rank, exc)
            except Exception:
                pass
            return self._rank_gone(ray, attempt, rank, rank.probe_exc, told=True)
        if kind == "events":
            rank.events_ref = None
            try:
                batch = ray.get(ref)
            except Exception:
                return []  # its run ref says how it ended
            out = [e for message in batch for e in self._message(attempt, rank, message)]
            if not rank.exited:
                rank.events_ref = rank.actor.next_events.remote(_LONG_POLL_S)
            return out
        # kind == "run": the rank's attempt body returned (or its actor died)
        rank.run_ref = None
        events: list[AttemptEvent] = []
        try:
            rank.exit_code = int(ray.get(ref))
            batch: list = []
            try:  # what it sent before it returned: the long poll in flight, then the rest
                if rank.events_ref is not None:
                    batch += ray.get(rank.events_ref, timeout=10)
                batch += ray.get(rank.actor.next_events.remote(0.0), timeout=10)
            except Exception:
                pass
            rank.events_ref = None
            events = [e for message in batch for e in self._message(attempt, rank, message)]
        except Exception as exc:
            return self._rank_gone(ray, attempt, rank, exc)
        rank.exited = True
        if attempt.group and rank.exit_code != 0 and not rank.killed_by_us and rank.error is None:
            self._note_failure(attempt, rank.index, peer=False)
        return events

    def _rank_gone(self, ray: Any, attempt: RayAttempt, rank: RayRank,
                   exc: Optional[BaseException] = None, told: bool = False) -> list[AttemptEvent]:
        """The rank's actor died: its node was lost (or drained: preempted), or its process was
        killed. When Ray could not say why yet and its node still reads alive
        (:func:`~ftnb.execution.ray_nodes.death_untold`), a probe asks until Ray knows, the
        node reads dead or :data:`~ftnb.execution.ray_nodes.DEATH_SETTLE_S` passes (``told``:
        that happened): a node lost under load is not taken for a killed process, which would
        count against ``max_failures``."""
        alive = {n["NodeID"] for n in self._nodes_fresh()}
        if not told and not attempt.told_to_leave and rank.node_id in alive and \
                death_untold(ray, exc):
            if rank.probe_exc is None:
                rank.probe_exc = exc
                rank.probe_until = time.monotonic() + DEATH_SETTLE_S
                rank.probe_ref = probe_death(rank.actor)
                if attempt.group and not rank.killed_by_us:  # (it failed: only why is unknown)
                    self._note_failure(attempt, rank.index, peer=False)
            # else: the probe was answered "unavailable" again; poll asks again in a moment
            return []
        rank.probe_ref = None
        rank.exited = True
        events: list[AttemptEvent] = []
        if attempt.told_to_leave or getattr(exc, "preempted", False):
            # Its node went away as announced (Ray says so, or we had told it): a preemption.
            rank.preempted = True
            rank.exit_code = EXIT_PREEMPTED
            if not attempt.preempted_seen:  # what the controller needs to call it so
                attempt.preempted_seen = True
                spec = attempt.spec
                events.append(PreemptedEvent(spec.trial_id, spec.attempt, rank=rank.index))
        elif dead_node_named(exc) is not None or rank.node_id not in (None, *alive):
            rank.node_lost = True
            rank.exit_code = None
        else:
            rank.exit_code = -9
            if not attempt.running and exc is not None and rank.error is None:
                # It never ran a line: say what Ray said (an actor whose creation Ray cancelled,
                # a runtime environment it could not set up), not just "killed".
                spec = attempt.spec
                rank.error = ErrorEvent(
                    spec.trial_id, spec.attempt, type=type(exc).__name__,
                    message=f"Ray could not start this attempt's actor: {exc}",
                    rank=rank.index)
                events.append(rank.error)
        if attempt.group and not rank.killed_by_us and rank.probe_exc is None:
            self._note_failure(attempt, rank.index, peer=False)
        return events

    def _nodes_fresh(self) -> list[dict]:
        self._nodes_cache = (0.0, [])
        return self._nodes()

    def _maybe_run(self, attempt: RayAttempt) -> list[AttemptEvent]:
        """Once every rank is placed (its node known): start the attempt body on each."""
        if attempt.running or attempt.ready_ref is not None:
            return []
        if any(rank.node_id is None for rank in attempt.ranks):
            return []
        attempt.running = True
        n = len(attempt.ranks)
        nodes: dict[str, list[RayRank]] = {}
        for rank in attempt.ranks:
            nodes.setdefault(rank.node_id or "", []).append(rank)
        node_order = list(dict.fromkeys(rank.node_id for rank in attempt.ranks))
        master = attempt.ranks[0].ip or "127.0.0.1"
        for rank in attempt.ranks:
            place = None
            if n > 1:
                peers = nodes[rank.node_id or ""]
                place = RankPlace(rank=rank.index, world_size=n,
                                  local_rank=peers.index(rank), local_world_size=len(peers),
                                  node_rank=node_order.index(rank.node_id))
            rank.run_ref = rank.actor.run.remote(attempt.payload, attempt.objects, place, master,
                                                 self._output_events and rank.index == 0)
            rank.events_ref = rank.actor.next_events.remote(_LONG_POLL_S)
        attempt.started_sent = True
        spec = attempt.spec
        return [StartedEvent(spec.trial_id, spec.attempt,
                             pids=tuple(rank.pid or 0 for rank in attempt.ranks))]

    def _message(self, attempt: RayAttempt, rank: RayRank, message: Any) -> list[AttemptEvent]:
        if isinstance(message, tuple):
            if message[0] == "rendezvous":
                for other in attempt.ranks:
                    if other is not rank:
                        other.actor.give_rendezvous.remote(rank.ip or "127.0.0.1", message[1])
            return []
        if isinstance(message, ErrorEvent):
            rank.error = rank.error or message
            if attempt.group:
                self._note_failure(attempt, rank.index, is_peer_error(message.type,
                                                                      message.message))
        elif isinstance(message, PreemptedEvent):
            attempt.preempted_seen = True
            if attempt.group:
                for other in attempt.ranks:
                    if other is not rank and not other.exited:
                        other.actor.preempt.remote()
        elif isinstance(message, DoneEvent) and attempt.group and rank.index != 0:
            return []
        if isinstance(message, StartedEvent):
            return []  # the executor says when the whole attempt runs
        return [message]

    # -- a group fails as one --------------------------------------------------------------------
    def _note_failure(self, attempt: RayAttempt, index: int, peer: bool) -> None:
        attempt.failures.note(index, peer, time.monotonic())

    def _supervise(self, ray: Any, attempt: RayAttempt, now: float) -> None:
        attempt.failures.check(now)
        if attempt.failures.cause is None:
            return
        for rank in attempt.ranks:
            if not rank.exited and not rank.killed_by_us and rank.index != attempt.failures.cause:
                rank.killed_by_us = True
                ray.kill(rank.actor, no_restart=True)

    def _finish(self, ray: Any, attempt: RayAttempt) -> list[AttemptEvent]:
        spec = attempt.spec
        self._running.pop(spec.trial_id, None)
        for rank in attempt.ranks:
            try:
                ray.kill(rank.actor, no_restart=True)
            except Exception:
                pass
        _wait_gone([rank for rank in attempt.ranks if rank.ip == _this_ip()])
        if attempt.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(attempt.placement_group)
            except Exception:
                pass
        node_lost = any(rank.node_lost and not rank.killed_by_us for rank in attempt.ranks)
        lost_node = next((r.ip for r in attempt.ranks if r.node_lost), None)
        if not attempt.group:
            rank = attempt.ranks[0]
            event = ExitEvent.of_one(spec.trial_id, spec.attempt, rank.exit_code)
            return [ExitEvent(spec.trial_id, spec.attempt, event.ranks,
                              event.first_failing_rank, node_lost, lost_node)]
        exits = tuple(RankExit(rank.index, rank.exit_code, collateral=rank.killed_by_us)
                      for rank in attempt.ranks)
        return [ExitEvent(spec.trial_id, spec.attempt, exits,
                          attempt.failures.first_failing_rank(exits), node_lost, lost_node)]

    # -- stopping --------------------------------------------------------------------------------
    def request_stop(self, trial_id: str) -> None:
        attempt = self._running.get(trial_id)
        if attempt is None:
            return
        for rank in attempt.ranks:
            if not rank.exited:
                rank.actor.request_stop.remote()

    def request_resize(self, trial_id: str) -> None:
        """An elastic group re-forms: every rank checkpoints at its next report with a
        checkpoint and ends there, as when its node is drained (not told to leave: a node
        lost meanwhile is still a lost node)."""
        attempt = self._running.get(trial_id)
        if attempt is not None:
            for rank in attempt.ranks:
                if not rank.exited:
                    rank.actor.preempt.remote()

    def decide(self, trial_id: str, iteration: int, decision: str) -> None:
        attempt = self._running.get(trial_id)
        if attempt is None or not attempt.ranks or attempt.ranks[0].exited:
            return
        attempt.ranks[0].actor.decide.remote(iteration, decision)

    def kill(self, trial_id: str) -> None:
        attempt = self._running.get(trial_id)
        if attempt is None:
            return
        ray = self._ray()
        for rank in attempt.ranks:
            try:
                ray.kill(rank.actor, no_restart=True)
            except Exception:
                pass
        if not attempt.running:  # never placed: it ends here, with nothing run
            attempt.running = True
            for rank in attempt.ranks:
                rank.exited, rank.exit_code = True, -9

    def shutdown(self) -> None:
        self._closed = True
        if not self._running:
            return
        for trial_id in list(self._running):
            self.kill(trial_id)
        deadline = time.time() + 10
        while self._running and time.time() < deadline:
            self.poll(0.1)
        self._running.clear()
        self._ray_objects.clear()  # (Ray frees an object once nothing refers to it)


def _this_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _wait_gone(ranks: list, timeout: float = 5.0) -> None:
    """Wait (a moment) for the processes of ``ranks`` on this machine to be gone, and their
    pump servers (which end what a killed actor left, then finish its output files): an
    attempt's processes are released by the time its exit event is handed over."""
    from ..system.processes import process_status

    deadline = time.monotonic() + timeout
    for pid in [pid for rank in ranks for pid in (rank.pid, rank.server_pid)]:
        while pid and time.monotonic() < deadline:
            if process_status(pid) in (None, "Z", "X"):
                break
            time.sleep(0.01)
