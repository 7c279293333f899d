"""The trial process's side of the local executor (:mod:`ftnb.execution.local`): what a forked
trial process does before, around and after the attempt body (:mod:`ftnb.execution.attempt`).

It becomes the leader of its own process group and the subreaper of what it starts, dies with
the fork server, takes its driver's lease name (so a driver taking the experiment over can find
it), ignores Ctrl+C (the controller stops it), writes its output to the trial's files, takes the
environment, import path and working directory it was given, talks to its executor through a
pipe, and ends every process it started before it exits (:mod:`ftnb.execution.process_tree`).
What travels to it, per rank, is a :class:`ProcessLaunch` (:func:`rank_launches`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from .contract import AttemptSpec, StartedEvent
from .process_tree import (
    ATTEMPT_VARIABLE,
    CGROUP_VARIABLE,
    attempt_marker,
    become_subreaper,
    end_descendants,
    join_cgroup,
)
from .rank_group import RankPlace, rank_environment

if TYPE_CHECKING:
    from .resources import Allocation

__all__ = ["PipeChannel", "ProcessLaunch", "attempt_main", "rank_launches"]


@dataclass
class ProcessLaunch:
    """What travels to the trial process: the spec, cloudpickled (the trainable by value), and
    the machine's side of the attempt."""

    trial_id: str
    attempt: int
    payload: bytes
    env: dict[str, str]
    stdout_path: Optional[str]
    stderr_path: Optional[str]
    # The caller's import path and working directory: modules and relative paths that work in
    # the notebook or script work in its trials too.
    sys_path: list[str]
    cwd: Optional[str]
    lease_token: Optional[str] = None
    #: This rank's place in a group attempt (None: a single-worker attempt).
    place: Optional[RankPlace] = None


def rank_launches(spec: AttemptSpec, payload: bytes,
                  allocations: list["Allocation"]) -> list[ProcessLaunch]:
    """What travels to each rank's process of the attempt ``spec`` (``payload``: the spec,
    cloudpickled), one per allocation, in rank order: its environment (this process's, its
    share of the machine, its identity and, in a group, its place), this process's import path
    and working directory. Its output goes to pipes the executor hands over."""
    token = spec.fence.token if spec.fence is not None else None
    world = spec.num_workers
    launches = []
    for index, allocation in enumerate(allocations):
        place = None
        env = _trial_environment(spec, allocation)
        if world > 1:
            place = RankPlace(rank=index, world_size=world, local_rank=index,
                              local_world_size=world, node_rank=0)
            env.update(rank_environment(place, "127.0.0.1"))
        launches.append(ProcessLaunch(
            trial_id=spec.trial_id,
            attempt=spec.attempt,
            payload=payload,
            env=env,
            stdout_path=None,  # its pipes, handed to the process
            stderr_path=None,
            sys_path=list(sys.path),
            cwd=os.getcwd(),
            lease_token=token,
            place=place,
        ))
    return launches


def _trial_environment(spec: AttemptSpec, allocation: "Allocation") -> dict[str, str]:
    """This process's environment, with the attempt's share of the machine and its identity."""
    env = dict(os.environ)
    env.update(allocation.env())
    if "OMP_NUM_THREADS" in os.environ:  # the user's own setting wins over the pool's default
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    env["FTNB_TRIAL_ID"] = spec.trial_id
    token = spec.fence.token if spec.fence is not None else None
    if token is not None:
        env["FTNB_LEASE_TOKEN"] = token
    # Inherited by every program the attempt runs: how its processes are found at its end.
    env[ATTEMPT_VARIABLE] = attempt_marker(token, spec.trial_id, spec.attempt)
    return env


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (the fork server) exits."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    except (OSError, AttributeError):
        pass  # not Linux: the controller's shutdown kills attempts instead


def release_fork_server() -> None:
    """Close this process's copy of its fork server's "alive" pipe.

    multiprocessing hands every child of a fork server the write end of the pipe whose EOF
    tells the server that its caller is gone. A child keeping it open keeps the server alive
    after a SIGKILLed caller, and with it the child (its PR_SET_PDEATHSIG is on the server): a
    trial that does not report (a long step, a hang) would outlive its killed driver. Closed,
    the server exits with the caller and the kernel kills its children.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _name_process(token: Optional[str]) -> None:
    """Name the process after its driver's lease (``ftnb.<token prefix>`` in ``ps`` and
    ``/proc/PID/comm``, inherited by the processes it forks), so that a driver taking the
    experiment over can find and kill a dead driver's trials
    (:func:`ftnb.execution.process_tree.end_strays_of`)."""
    if not token:
        return
    from ..storage.lease import process_name

    try:
        with open("/proc/self/comm", "w") as f:
            f.write(process_name(token))
    except OSError:
        pass


def _redirect_output(stdout: Union[str, int, None], stderr: Union[str, int, None]) -> None:
    """Make file descriptors 1 and 2 (what the process and its children print) a file, by
    path, or the write end of a pipe, by descriptor (closed here once duplicated)."""
    for fd, where in ((1, stdout), (2, stderr)):
        if isinstance(where, int):
            os.dup2(where, fd)
            os.close(where)
        elif where:
            target = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass


class PipeChannel:
    """The trial process's end of the pipe to its executor (see
    ftnb.execution.attempt.AttemptChannel). The executor sends ``(kind, value)`` messages:
    ``stop`` (end at the next report), ``preempt`` (a rank of the group got SIGTERM:
    ``on_preempt`` is called), ``rendezvous`` (rank 0's store address, for the other ranks) and
    ``decision`` (``(iteration, answer)``: the controller's answer to a report that waits)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._last_poll = 0.0
        self._stop = False
        self._rendezvous: Optional[tuple[str, int]] = None
        self._decisions: dict[int, str] = {}
        self._closed = False
        self.on_preempt: Optional[Any] = None

    def send(self, event: Any) -> None:
        self.conn.send(event)

    def _take(self, timeout: float = 0.0) -> None:
        try:
            if not self.conn.poll(timeout):
                return
            while True:
                kind, value = self.conn.recv()
                if kind == "stop":
                    self._stop = True
                elif kind == "preempt" and self.on_preempt is not None:
                    self.on_preempt()
                elif kind == "rendezvous":
                    self._rendezvous = (value[0], int(value[1]))
                elif kind == "decision":
                    self._decisions[int(value[0])] = str(value[1])
                if not self.conn.poll(0):
                    return
        except (EOFError, OSError):
            # The controller is gone; the fork server's exit will kill us, but stop anyway.
            self._stop = self._closed = True

    def stop_requested(self) -> bool:
        # Connection.poll builds a selector per call: look at most every 20 ms, not per report.
        now = time.monotonic()
        if not self._stop and now - self._last_poll >= 0.02:
            self._last_poll = now
            self._take()
        return self._stop

    def decision(self, iteration: int) -> str:
        while iteration not in self._decisions:
            if self._closed:
                return "stop"  # the controller is gone: end here, writing nothing more
            self._take(1.0)
        return self._decisions.pop(iteration)

    def rendezvous(self, port: Optional[int]) -> tuple[str, int]:
        if port is not None:  # rank 0: the executor hands it to the others
            self.send(("rendezvous", port))
            return os.environ.get("MASTER_ADDR", "127.0.0.1"), port
        while self._rendezvous is None:
            self._take(1.0)
            if self._closed and self._rendezvous is None:
                raise RuntimeError("the executor went away before the group's rendezvous")
        return self._rendezvous


def attempt_main(launch: ProcessLaunch, conn: Any, outputs: tuple = ()) -> None:
    """Entry point of a trial process: run one attempt and report how it ended. ``outputs``:
    the write ends (multiprocessing connections) of the pipes its stdout and stderr go to;
    none: the files ``launch`` names."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    join_cgroup(launch.env.get(CGROUP_VARIABLE))
    become_subreaper()
    release_fork_server()
    die_with_parent()
    _name_process(launch.lease_token)
    # Ctrl+C in a terminal is for the controller, which stops the trials cleanly itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if outputs:
        _redirect_output(*(os.dup(writer.fileno()) for writer in outputs))
        for writer in outputs:
            writer.close()
    else:
        _redirect_output(launch.stdout_path, launch.stderr_path)
    import faulthandler

    faulthandler.enable()  # a segfault leaves a Python traceback in the trial's stderr
    os.environ.clear()
    os.environ.update(launch.env)
    if launch.sys_path:
        sys.path[:] = launch.sys_path
    if launch.cwd:
        try:
            os.chdir(launch.cwd)
        except OSError:
            pass
    code = _run_launch(launch, PipeChannel(conn))
    sys.stdout.flush()
    sys.stderr.flush()
    end_descendants()  # setsid and double-forked daemons too: they are ours (the subreaper's)
    os._exit(code)


def _run_launch(launch: ProcessLaunch, channel: PipeChannel) -> int:
    import cloudpickle

    from .attempt import EXIT_ERROR, install_preemption_handler, report_exception, run_attempt

    channel.send(StartedEvent(launch.trial_id, launch.attempt, pids=(os.getpid(),)))
    try:
        spec: AttemptSpec = cloudpickle.loads(launch.payload)
    except BaseException as exc:  # the trainable could not be unpickled (a missing module...)
        report_exception(channel, (launch.trial_id, launch.attempt), exc, "exception")
        return EXIT_ERROR
    grace = spec.preemption_grace_period_s
    place = launch.place
    rank = place.rank if place is not None else 0

    def on_session(session: Any) -> None:
        install_preemption_handler(session, grace, channel, rank=rank)

        def preempt() -> None:  # a peer got SIGTERM: this rank checkpoints and leaves with it
            session.preempted = True

        channel.on_preempt = preempt

    return run_attempt(spec, channel, rank=rank, on_session=on_session, place=place)
