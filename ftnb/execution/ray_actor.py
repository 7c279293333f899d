"""What runs inside the Ray actor of one rank of an attempt (:class:`AttemptActor`), and how the
attempt travels to it (:func:`dump_attempt`, :func:`supply_objects`): the driver's side is
:class:`~ftnb.execution.ray.RayExecutor`, which says what the actors do (see its module).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

from ..storage.growing_files import PeriodicPublisher
from .contract import AttemptSpec, PreemptedEvent
from .rank_group import RankPlace, rank_environment

__all__ = ["AttemptActor", "adopt_driver_context", "dump_attempt", "supply_objects"]


def adopt_driver_context(env: dict, sys_path: list, cwd: Optional[str]) -> None:
    """In a Ray actor: the driver's environment variables, import path (its entries first) and
    working folder (where this node has it), so the driver's modules and relative paths work."""
    os.environ.update(env)
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)


class AttemptActor:
    """The actor side of one rank of one attempt (made a Ray actor class on first use)."""

    def __init__(self, env: dict, sys_path: list, cwd: Optional[str]) -> None:
        from .ray_rank_processes import RankProcesses

        adopt_driver_context(env, sys_path, cwd)
        self._processes = RankProcesses()  # (its pump server first: before any stray exists)
        self._events: list = []
        self._cond = threading.Condition()
        self._stop = False
        self._decisions: dict[int, str] = {}
        self._rendezvous: Optional[tuple[str, int]] = None
        self._session: Any = None
        self._preempt_asked = False
        self._tails: list = []

    # -- what the executor calls -----------------------------------------------------------------
    def where(self) -> tuple[str, str, int, int]:
        """This actor's node id and address, its pid and its pump server's."""
        import ray

        ctx = ray.get_runtime_context()
        return (ctx.get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
                self._processes.server_pid)

    def run(self, payload: bytes, objects: dict, place: Optional[RankPlace],
            master_addr: str, output_events: bool) -> int:
        import cloudpickle

        from ..storage import ExperimentPaths
        from .attempt import EXIT_ERROR, AttemptGuard, report_exception, run_attempt

        if place is not None:
            os.environ.update(rank_environment(place, master_addr))
        try:
            spec: AttemptSpec = cloudpickle.loads(payload)
        except BaseException as exc:
            report_exception(self, ("?", 0), exc, "exception")
            return EXIT_ERROR
        rank = place.rank if place is not None else 0
        try:
            supply_objects(objects)  # the attempt's ftnb.put refs, as Ray brought them here
        except BaseException as exc:
            report_exception(self, (spec.trial_id, spec.attempt), exc, "exception", rank=rank)
            return EXIT_ERROR
        # A node taken for lost may go on running this actor: once the trial has a later
        # attempt, this one writes nothing more (its output included).
        paths = ExperimentPaths(spec.storage, spec.experiment_dir).trial(spec.trial_dir_name)
        self._processes.begin(spec.fence.token if spec.fence is not None else None,
                              spec.trial_id, spec.attempt, rank)
        publisher = self._redirect(spec, output_events, rank, AttemptGuard(paths, spec.attempt))

        def on_session(session: Any) -> None:
            self._session = session
            if self._preempt_asked:  # told before the trainable ran
                self.preempt()

        try:
            return run_attempt(spec, self, rank=rank, place=place, on_session=on_session,
                               guard=AttemptGuard(paths, spec.attempt))
        finally:
            self._processes.end()  # its strays gone, its output in its files
            publisher.close()
            self._last_output()
            # Published whole and read: the node's copies go (a fenced attempt's are kept;
            # a killed actor's go with the next staging folder made on this node).
            publisher.discard()

    def _last_output(self) -> None:
        """The rank's output is complete in its files: their last lines become events here (the
        executor's last poll of this actor takes them), and nothing reads the files after."""
        from .contract import OutputEvent

        with self._cond:
            for tail in self._tails:
                for _ in range(8):  # (bounded: a tail reads at most its backlog, 1 MiB, each)
                    text = tail.read()
                    if not text:
                        break
                    trial_id, attempt = tail.ids
                    self._events.append(OutputEvent(trial_id, attempt, stream=tail.stream,
                                                    text=text))
            self._tails = []
            self._cond.notify_all()

    def next_events(self, timeout: float) -> list:
        from .contract import OutputEvent

        with self._cond:
            if not self._events:
                self._cond.wait(timeout)
            events, self._events = self._events, []
            # (Under the lock: two polls at once must not hand a line over twice.)
            for tail in self._tails:
                text = tail.read()
                if text:
                    trial_id, attempt = tail.ids
                    events.append(OutputEvent(trial_id, attempt, stream=tail.stream, text=text))
        return events

    def request_stop(self) -> None:
        self._stop = True

    def decide(self, iteration: int, decision: str) -> None:
        """The controller's answer to the report of ``iteration`` (see :meth:`decision`)."""
        with self._cond:
            self._decisions[iteration] = decision
            self._cond.notify_all()

    def preempt(self) -> None:
        """The node is going away (drained): checkpoint at the next report and leave."""
        with self._cond:  # (an RLock: send takes it too)
            self._preempt_asked = True
            session = self._session
            if session is not None and not session.preempted:
                session.preempted = True
                context = session.context
                self.send(PreemptedEvent(context.trial_id, context.attempt,
                                         iteration=session.iteration, rank=context.world_rank))

    def give_rendezvous(self, addr: str, port: int) -> None:
        with self._cond:
            self._rendezvous = (addr, port)
            self._cond.notify_all()

    # -- the AttemptChannel the attempt body talks to -------------------------------------------
    def send(self, event: Any) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def stop_requested(self) -> bool:
        return self._stop

    def decision(self, iteration: int) -> str:
        with self._cond:
            while iteration not in self._decisions:
                self._cond.wait(1.0)
            return self._decisions.pop(iteration)

    def rendezvous(self, port: Optional[int]) -> tuple[str, int]:
        if port is not None:
            self.send(("rendezvous", port))
            return os.environ.get("MASTER_ADDR", "127.0.0.1"), port
        with self._cond:
            while self._rendezvous is None:
                self._cond.wait(1.0)
            return self._rendezvous

    def _redirect(self, spec: AttemptSpec, output_events: bool, rank: int,
                  guard: Any) -> PeriodicPublisher:
        """The rank's stdout and stderr go to its files in the trial's folder (rank 0's: the
        trial's own ``stdout``/``stderr``). On object stores they are staged on this node,
        continued from what earlier attempts published, and published while the rank runs
        (the :class:`~ftnb.storage.growing_files.PeriodicPublisher` returned), while ``guard``
        lets this attempt write."""
        from ..storage import ExperimentPaths
        from .output_pump import FileTail

        paths = ExperimentPaths(spec.storage, spec.experiment_dir).trial(spec.trial_dir_name)
        stdout = spec.storage.staged_file(paths.rank_stdout(rank))
        stderr = spec.storage.staged_file(paths.rank_stderr(rank),
                                          os.path.dirname(stdout.local_path)
                                          if stdout.staged else None)
        for output in (stdout, stderr):
            try:
                output.resume()
            except Exception:  # output is a convenience; never fail a trial for it
                pass
        if output_events:
            for stream, output in (("stdout", stdout), ("stderr", stderr)):
                tail = FileTail(stream, output.local_path)
                tail.ids = (spec.trial_id, spec.attempt)  # type: ignore[attr-defined]
                self._tails.append(tail)
        self._processes.redirect(stdout.local_path, stderr.local_path)
        return PeriodicPublisher([stdout, stderr], check=guard.check)


def dump_attempt(spec: AttemptSpec) -> tuple[bytes, dict]:
    """``spec`` pickled (cloudpickle), and every ``ftnb.put`` ref met on the way, by id: in the
    config and datasets, and in the trainable's closures and globals where cloudpickle ships
    the trainable by value (a notebook's function)."""
    import io

    from ..objects import ObjectRef
    from ..objects.cell_source import pickler_class

    refs: dict[str, ObjectRef] = {}

    class NotingRefs(pickler_class()):  # type: ignore[misc, valid-type]
        def persistent_id(self, obj: Any) -> None:
            if isinstance(obj, ObjectRef):
                refs[obj.id] = obj
            return None  # (pickled as it is: a small ref)

    out = io.BytesIO()
    NotingRefs(out).dump(spec)
    return out.getvalue(), refs


def supply_objects(objects: dict) -> None:
    """Hand ``ftnb.get`` the objects of the attempt's refs (``objects``: ref id -> Ray object
    ref), fetched from Ray's object store: no ref reads a file of the driver's machine."""
    if not objects:
        return
    import ray

    from ..objects.store import supply

    for ref_id, obj in zip(objects, ray.get(list(objects.values()))):
        supply(ref_id, obj)
