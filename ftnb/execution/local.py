"""Local OS processes: the embedded default executor.

Each attempt runs in its own process, forked from a fork server that has already imported ftnb (and
the heavy modules the caller has imported, such as torch), so starting an attempt costs a fork
rather than a Python start-up (:mod:`ftnb.execution.fork_server`). Each attempt is the leader of
its own process group, and nothing it starts outlives it: data-loader workers, a server in a new
session and a double-forked daemon end with the attempt, however it ends
(:mod:`ftnb.execution.process_tree`: each trial process is the subreaper of what it starts and
carries ``FTNB_ATTEMPT`` in its environment). Ctrl+C in a terminal reaches the controller only,
which then stops the trials itself.

Trial processes die with their controller: each asks the kernel for SIGKILL when its parent (the
fork server) exits, and the fork server exits when the controller's process does. So a SIGKILLed
driver leaves no ghost trial writing into the experiment directory; what the trials had started
is ended by the driver that takes the experiment over (:func:`ftnb.lifecycle.own.take_over`).
A trial dead of SIGKILL is out of memory only when the kernel says so of its own pid
(:mod:`ftnb.execution.oom`).

Everything of the machine is here, none of it in the controller: the CPU/GPU pool and each
attempt's share of it (``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``), the trial's environment
(this process's, plus ``FTNB_TRIAL_ID`` and the lease token), its ``sys.path`` and working
directory (the caller's), its stdout and stderr files (in the trial's folder on a local disk;
staged locally, published when the attempt ends and then removed on object stores, a retry
starting from the stored copies; in a group, each rank its own, rank 0's the trial's plain
``stdout``/``stderr``), written through pipes that the
executor's pump server (a process of its own, :mod:`ftnb.execution.pump_server`: a stopped
driver stops no trial) streams to them, capped, rank 0's tailed into output events
(:mod:`ftnb.execution.output_pump`), and the sweep of ``ftnb.put`` files that a killed
attempt could not remove.
An attempt is one process, or for a group (``num_workers > 1``) one process per rank, each with
its own allocation (its own GPU), the rank's variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``...) and a fresh rendezvous store per attempt
(:mod:`ftnb.execution.rank_group`). A group fails as one: the first rank to fail (an exception,
a signal, an exit, a stopped process for longer than the collective timeout) is the cause, the
others are killed at once (a peer's error, such as a reset connection, waits a moment for the
failure that caused it), and one exit event reports every rank.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .contract import (
    AttemptEvent,
    AttemptSpec,
    DoneEvent,
    ErrorEvent,
    ExitEvent,
    OutputEvent,
    PreemptedEvent,
    RankExit,
    StartedEvent,
    is_peer_error,
)
from .fork_server import TRIAL_PROCESS_PREFIX, fork_server_context
from .group_failures import GroupFailures
from .one_machine import OneMachineExecutor
from .output_pump import FileTail, output_max_bytes
from .oom import cgroup_oom_kills, oom_killed
from .process_tree import (
    ATTEMPT_VARIABLE,
    CGROUP_VARIABLE,
    AttemptCgroup,
    kill_marked,
    kill_tree,
)
from .pump_server import PumpServer
from .resources import Allocation, ResourcePool
from ..storage.lease import process_name
from .trial_process import ProcessLaunch, attempt_main, rank_launches

if TYPE_CHECKING:
    from ..storage import StagedFile

__all__ = ["LocalProcessExecutor"]

#: Per stream of rank 0, the most of its output read from its file for the listeners in one
#: poll, and the most left waiting: older output is skipped (the files have it).
_SHOWN_PER_POLL = 256 << 10
_SHOWN_BACKLOG = 1 << 20
#: How long an ended attempt's pipes are drained before its exit is reported (a process that
#: escaped its end and holds them is not waited for).
_OUTPUT_CLOSE_S = 5.0


#: How long the first failing rank may take to exit on its own (its traceback printed, its
#: files flushed) once the rest of its group is ended.
_ROOT_EXIT_S = 2.0


@dataclass
class _Rank:
    """One process of an attempt (rank ``index`` of its group; 0 for a single worker)."""

    index: int
    process: Any
    conn: Any
    allocation: Allocation
    conn_open: bool = True
    started: bool = False
    exit_code: Optional[int] = None
    exited: bool = False
    error: Optional[ErrorEvent] = None
    killed_by_us: bool = False  # ended because another rank failed first
    stopped_since: Optional[float] = None


@dataclass
class _Running:
    launch: ProcessLaunch  # rank 0's
    ranks: list[_Rank]
    started_at: float  # time.monotonic() before its processes were forked
    outputs: list["StagedFile"]
    timeout_s: float
    #: The pump server's ids of each rank's stdout and stderr pipes, and rank 0's files' tails
    #: for the listeners.
    pumps: list[int] = field(default_factory=list)
    tails: list[FileTail] = field(default_factory=list)
    started_sent: bool = False
    failures: GroupFailures = field(default_factory=GroupFailures)  # and the cause, once known
    kill_cause_at: Optional[float] = None
    cgroup: Optional[AttemptCgroup] = None  # where this machine gives one
    cgroup_oom_kills: Optional[int] = None  # counted there, read before it is removed
    staging_key: tuple[str, str] = ("", "")  # (experiment folder, trial folder)

    @property
    def group(self) -> bool:
        return len(self.ranks) > 1

    @property
    def allocations(self) -> list[Allocation]:
        return [rank.allocation for rank in self.ranks]


class LocalProcessExecutor(OneMachineExecutor):
    """Runs each attempt in its own process on this machine, a group attempt in one process per
    rank (see the module docstring).

    ``pool``: the CPUs and GPUs to hand out (default: what this machine has, see
    :mod:`ftnb.execution.resources`). ``output_events``: tail the trials' stdout and stderr into
    :class:`~ftnb.execution.contract.OutputEvent` (they are written to the trial's files either way).
    """

    name = "local"
    runs_groups = True

    def __init__(self, *, pool: Optional[ResourcePool] = None, output_events: bool = True) -> None:
        super().__init__(pool)
        self._output_events = output_events
        self._running: dict[str, _Running] = {}
        self._pump_server: Optional[PumpServer] = None
        # Per trial folder, on an object store: where its output is staged while an attempt
        # runs. Removed when the attempt's files are published whole (the next attempt starts
        # from the stored copies); kept, with the files not published, when an upload failed:
        # the next attempt continues them, shutdown tries them again.
        self._staging: dict[tuple[str, str], str] = {}
        self._unpublished: dict[tuple[str, str], list["StagedFile"]] = {}

    # -- starting --------------------------------------------------------------------------------
    def start(self, spec: AttemptSpec) -> None:
        payload, allocations = self._admit(spec)
        try:
            self._spawn(spec, payload, allocations)
        except BaseException:
            for allocation in allocations:
                self._pool.release(allocation)
            raise

    def _spawn(self, spec: AttemptSpec, payload: bytes, allocations: list[Allocation]) -> None:
        """Start the attempt's processes, one per allocation, in its cgroup where this machine
        gives one: a group starts whole or not at all."""
        key = (spec.experiment_dir, spec.trial_dir_name)
        max_bytes = output_max_bytes()  # (a bad $FTNB_OUTPUT_MAX_BYTES: before anything starts)
        files = self._output_files(spec, len(allocations), max_bytes)
        ctx = fork_server_context()
        launches = rank_launches(spec, payload, allocations)
        cgroup = AttemptCgroup.create(launches[0].env[ATTEMPT_VARIABLE])
        if cgroup is not None:
            for launch in launches:
                launch.env[CGROUP_VARIABLE] = cgroup.folder
        tails = []
        if self._output_events:  # rank 0's, as on Ray: the others' are in their own files
            tails = [FileTail(stream, output.local_path, backlog=_SHOWN_BACKLOG, keep_first=True)
                     for stream, output in zip(("stdout", "stderr"), files[0])]
        pump_server = self._pumps()
        started_at = time.monotonic()
        ranks: list[_Rank] = []
        pumps: list[int] = []
        try:
            for index, (launch, allocation) in enumerate(zip(launches, allocations)):
                ranks.append(self._start_rank(ctx, index, launch, allocation, files[index],
                                              pump_server, pumps, max_bytes))
        except BaseException:
            pump_server.give_up(pumps)
            for rank in ranks:  # a group starts whole or not at all
                _end_rank(rank.process.pid)
                rank.process.join(5)
            if cgroup is not None:
                cgroup.end()
            raise
        self._running[spec.trial_id] = _Running(
            launches[0], ranks, started_at, [output for pair in files for output in pair],
            spec.collective_timeout_s, pumps, tails, cgroup=cgroup, staging_key=key
        )

    def _output_files(self, spec: AttemptSpec, world: int,
                      max_bytes: int) -> list[list["StagedFile"]]:
        """Each rank's ``[stdout, stderr]`` (rank 0's are the trial's own files): on an object
        store, staged in the trial's staging folder and continued from the earlier attempts'."""
        from ..storage import ExperimentPaths

        trial_paths = ExperimentPaths(spec.storage, spec.experiment_dir).trial(spec.trial_dir_name)
        key = (spec.experiment_dir, spec.trial_dir_name)
        self._unpublished.pop(key, None)  # (this attempt's files stand for those)
        files = []
        for index in range(world):
            pair = []
            for path in (trial_paths.rank_stdout(index), trial_paths.rank_stderr(index)):
                output = spec.storage.staged_file(path, self._staging.get(key))
                if output.staged:
                    self._staging[key] = os.path.dirname(output.local_path)
                    try:  # earlier attempts' output, whole (a file holds at most max_bytes)
                        output.resume(keep_bytes=max_bytes)
                    except Exception as exc:  # output is a convenience; never fail a trial
                        print(f"ftnb: {output.path} starts without the earlier attempts' "
                              f"output ({exc})", file=sys.stderr)
                pair.append(output)
            files.append(pair)
        return files

    def _start_rank(self, ctx: Any, index: int, launch: ProcessLaunch, allocation: Allocation,
                    outputs: list["StagedFile"], pump_server: PumpServer, pumps: list[int],
                    max_bytes: int) -> _Rank:
        """Fork rank ``index``'s process, its output going through pipes that ``pump_server``
        streams to ``outputs`` (their ids added to ``pumps`` as they are made, so a failed
        start gives them all up)."""
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        suffix = f"-rank{index}" if launch.place is not None else ""
        # The rank writes its output into pipes that the pump server streams to its
        # files (capped); the listeners get rank 0's from its files.
        writers = []
        for output in outputs:
            reader, writer = ctx.Pipe(duplex=False)
            writers.append(writer)
            read_fd = os.dup(reader.fileno())
            reader.close()
            pumps.append(pump_server.pump(read_fd, output.local_path, max_bytes))
        process = ctx.Process(
            target=attempt_main,
            args=(launch, child_conn, tuple(writers)),
            name=f"{TRIAL_PROCESS_PREFIX}{launch.trial_id}{suffix}",
            daemon=False,
        )
        try:
            process.start()
        finally:
            for writer in writers:
                writer.close()
        child_conn.close()
        return _Rank(index, process, parent_conn, allocation)

    def _pumps(self) -> PumpServer:
        """The pump server, started at the first attempt (again if it died)."""
        if self._pump_server is None or not self._pump_server.alive():
            if self._pump_server is not None:
                self._pump_server.close()
            self._pump_server = PumpServer()
        return self._pump_server

    def running(self) -> list[str]:
        return list(self._running)

    # -- events ----------------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[AttemptEvent]:
        if not self._running:
            time.sleep(min(timeout, 0.05))
            return []
        waitables: dict[Any, tuple[_Running, _Rank, bool]] = {}
        for run in self._running.values():
            if run.group:  # the liveness check runs at least every 0.25 s
                timeout = min(timeout, 0.25)
            for rank in run.ranks:
                if rank.conn_open:
                    waitables[rank.conn] = (run, rank, True)
                if not rank.exited:
                    waitables[rank.process.sentinel] = (run, rank, False)
        ready = multiprocessing.connection.wait(list(waitables), timeout)
        events: list[AttemptEvent] = []
        exiting: list[tuple[_Running, _Rank]] = []
        for obj in ready:
            run, rank, is_conn = waitables[obj]
            if is_conn:
                events.extend(self._drain(run, rank))
            else:
                exiting.append((run, rank))
        for run, rank in exiting:
            # Everything the rank sent before it died is still in the socket: hand it over
            # first, so the exit event is always the attempt's last.
            events.extend(self._drain(run, rank))
            self._rank_exited(run, rank)
        now = time.monotonic()
        for run in list(self._running.values()):
            if run.group:
                self._supervise(run, now)
            events.extend(self._output(run))
            if all(rank.exited for rank in run.ranks):
                for rank in run.ranks:
                    events.extend(self._drain(run, rank))
                exit_event = self._finish(run)
                events.extend(self._output(run))  # the end of its output, then its exit
                self._discard_outputs(run.staging_key, run.outputs)  # (read for the last time)
                events.append(exit_event)
        return events

    def _drain(self, run: _Running, rank: _Rank) -> list[AttemptEvent]:
        events: list[AttemptEvent] = []
        while rank.conn_open:
            try:
                if not rank.conn.poll(0):
                    break
                message = rank.conn.recv()
            except (EOFError, OSError):
                rank.conn_open = False
                break
            events.extend(self._take(run, rank, message))
        return events

    def _take(self, run: _Running, rank: _Rank, message: Any) -> list[AttemptEvent]:
        """What a rank's message means for the attempt: events to hand over (a group's
        started and done events are the group's, not each rank's)."""
        if isinstance(message, tuple):  # ("rendezvous", port): rank 0's store is up
            kind, value = message
            if kind == "rendezvous":
                self._send_all(run, ("rendezvous", ("127.0.0.1", value)), but=rank)
            return []
        if isinstance(message, StartedEvent):
            rank.started = True
            if run.started_sent or not all(r.started for r in run.ranks):
                return []
            run.started_sent = True
            pids = tuple(r.process.pid for r in run.ranks)
            return [StartedEvent(message.trial_id, message.attempt, pids=pids)]
        if isinstance(message, ErrorEvent):
            rank.error = rank.error or message
            if run.group:
                self._note_failure(run, rank.index, is_peer_error(message.type, message.message))
        elif isinstance(message, PreemptedEvent) and run.group:
            # One rank's slot is going away: every rank checkpoints at the next report, together.
            self._send_all(run, ("preempt", None), but=rank)
        elif isinstance(message, DoneEvent) and run.group and rank.index != 0:
            return []  # rank 0 speaks for the group
        return [message]

    def _send_all(self, run: _Running, message: tuple, but: Optional[_Rank] = None) -> None:
        for rank in run.ranks:
            if rank is not but and rank.conn_open and not rank.exited:
                try:
                    rank.conn.send(message)
                except (OSError, BrokenPipeError):
                    pass

    def _rank_exited(self, run: _Running, rank: _Rank) -> None:
        rank.process.join(5)
        rank.exit_code = rank.process.exitcode
        rank.exited = True
        _kill_group(rank.process.pid)  # whatever the rank started dies with it
        if run.group and rank.exit_code != 0 and not rank.killed_by_us and rank.error is None:
            self._note_failure(run, rank.index, peer=False)  # killed, or exited by itself

    # -- a group fails as one --------------------------------------------------------------------
    def _note_failure(self, run: _Running, index: int, peer: bool) -> None:
        """Rank ``index`` failed (``peer``: with a peer's error). A failure of its own is the
        cause at once; a peer's error waits a moment for the failure that caused it."""
        cause = run.failures.note(index, peer, time.monotonic())
        if cause is not None:
            self._decide(run, cause)

    def _supervise(self, run: _Running, now: float) -> None:
        """The group's liveness check, and its end once a rank failed: the others are killed."""
        if run.failures.cause is None:
            stopped = []
            for rank in run.ranks:
                if rank.exited:
                    continue
                if _is_stopped(rank.process.pid):
                    rank.stopped_since = rank.stopped_since or now
                    stopped.append((rank.index, rank.stopped_since))
                else:
                    rank.stopped_since = None
            if (cause := run.failures.check(now, stopped, run.timeout_s)) is not None:
                self._decide(run, cause)
        if run.failures.cause is None:
            return
        for rank in run.ranks:
            if rank.exited or rank.killed_by_us:
                continue
            if rank.index != run.failures.cause:
                rank.killed_by_us = True
                _end_rank(rank.process.pid)
            elif run.kill_cause_at is not None and now >= run.kill_cause_at:
                run.kill_cause_at = None
                _end_rank(rank.process.pid)

    def _decide(self, run: _Running, index: int) -> None:
        """Act on the cause decided: a hung rank is killed now, one that failed gets a moment
        to exit on its own (the others are ended by :meth:`_supervise`)."""
        cause = run.ranks[index]
        if run.failures.hung == index:
            _end_rank(cause.process.pid)
        elif not cause.exited:
            run.kill_cause_at = time.monotonic() + _ROOT_EXIT_S

    def _output(self, run: _Running) -> list[AttemptEvent]:
        """Rank 0's output for the listeners: at most _SHOWN_PER_POLL per stream and poll."""
        events: list[AttemptEvent] = []
        for tail in run.tails:
            text = tail.read(_SHOWN_PER_POLL)
            if text:
                events.append(OutputEvent(run.launch.trial_id, run.launch.attempt,
                                          stream=tail.stream, text=text))
        return events

    def _finish(self, run: _Running) -> AttemptEvent:
        self._end_strays(run)
        # Its pipes close once it and what it started are gone: their last bytes reach the
        # files before these are published.
        if self._pump_server is not None:
            self._pump_server.wait_ended(run.pumps, _OUTPUT_CLOSE_S)
        for rank in run.ranks:
            try:
                rank.conn.close()
            except OSError:
                pass
            self._pool.release(rank.allocation)
        self._running.pop(run.launch.trial_id, None)
        for output in run.outputs:
            try:
                output.publish()
            except Exception as exc:  # output is a convenience; never fail a trial for it
                print(f"ftnb: could not upload {output.local_path} to {output.path}: {exc}",
                      file=sys.stderr)
        if any(rank.exit_code is not None and rank.exit_code < 0 for rank in run.ranks):
            # A killed trial could not delete what it ftnb.put(): free that memory now, not at
            # the next put on this machine (its retry may need it).
            from ..objects import sweep_orphans

            sweep_orphans()
        trial_id, attempt = run.launch.trial_id, run.launch.attempt

        def oom(rank: _Rank) -> bool:
            return (rank.exit_code == -signal.SIGKILL and not rank.killed_by_us
                    and rank.index != run.failures.hung and rank.process.pid is not None
                    and oom_killed(rank.process.pid, run.started_at, run.cgroup_oom_kills))

        if not run.group:
            rank = run.ranks[0]
            return ExitEvent.of_one(trial_id, attempt, rank.exit_code, oom(rank))
        exits = tuple(RankExit(rank.index, rank.exit_code, oom(rank),
                               hung=rank.index == run.failures.hung,
                               collateral=rank.killed_by_us) for rank in run.ranks)
        return ExitEvent(trial_id, attempt, exits, run.failures.first_failing_rank(exits))

    def _discard_outputs(self, key: tuple[str, str], outputs: list["StagedFile"]) -> bool:
        """Remove the staged copies of a trial's output that are published whole, and their
        folder once it holds none; keep the others (an upload failed) for the next attempt or
        shutdown. Whether none is left."""
        folder = self._staging.get(key)
        kept = [output for output in outputs if not output.discard()]
        if kept:
            self._unpublished[key] = kept
            return False
        self._unpublished.pop(key, None)
        if folder is not None:
            self._staging.pop(key, None)
            try:
                os.rmdir(folder)
            except OSError:
                pass  # (gone already: its first file made it, and removed it with itself)
        return True

    # -- stopping --------------------------------------------------------------------------------
    def request_stop(self, trial_id: str) -> None:
        run = self._running.get(trial_id)
        if run is not None:
            self._send_all(run, ("stop", None))

    def request_resize(self, trial_id: str) -> None:
        """An elastic group re-forms: every rank checkpoints at its next report with a
        checkpoint and ends there, as when one rank's slot is preempted."""
        run = self._running.get(trial_id)
        if run is not None:
            self._send_all(run, ("preempt", None))

    def decide(self, trial_id: str, iteration: int, decision: str) -> None:
        run = self._running.get(trial_id)
        if run is None:
            return
        rank = run.ranks[0]  # it alone reports; it tells the others how the group ends
        if rank.conn_open and not rank.exited:
            try:
                rank.conn.send(("decision", (iteration, decision)))
            except (OSError, BrokenPipeError):
                pass

    def kill(self, trial_id: str) -> None:
        run = self._running.get(trial_id)
        if run is None:
            return
        for rank in run.ranks:
            if rank.process.pid:
                _end_rank(rank.process.pid)

    def _end_strays(self, run: _Running) -> None:
        """The attempt is over: end what its processes started and left behind (their orphans
        went to the fork server when a rank died before it could end them itself), sparing
        the processes of the attempts still running."""
        if run.cgroup is not None:
            run.cgroup_oom_kills = cgroup_oom_kills(run.cgroup.folder)
            run.cgroup.end()
            if run.cgroup.removed:
                # Every process of the attempt was in it (a rank joins before its trainable
                # runs; what it starts is born there) and it is gone: nothing is left to look
                # for, which spares a look at every process of the machine per attempt.
                return
        launch = run.launch
        live = [rank.process.pid for other in self._running.values() if other is not run
                for rank in other.ranks if not rank.exited and rank.process.pid]
        kill_marked(launch.env.get(ATTEMPT_VARIABLE, "") or "-",
                    process_name(launch.lease_token) if launch.lease_token else None, spare=live)

    def shutdown(self) -> None:
        self._closed = True
        for trial_id in list(self._running):
            self.kill(trial_id)
        deadline = time.time() + 10
        while self._running and time.time() < deadline:
            self.poll(0.1)
        for key, outputs in list(self._unpublished.items()):  # uploads that failed: again
            for output in outputs:
                try:
                    output.publish()
                except Exception:
                    pass
            if not self._discard_outputs(key, outputs):
                print(f"ftnb: output not uploaded is kept in {self._staging.pop(key, None)}",
                      file=sys.stderr)
        for folder in self._staging.values():  # attempts that never started: stored copies
            shutil.rmtree(folder, ignore_errors=True)
        self._staging.clear()
        self._unpublished.clear()
        if self._pump_server is not None:
            self._pump_server.close()
            self._pump_server = None


def _is_stopped(pid: Optional[int]) -> bool:
    """Whether the process is stopped (SIGSTOP, a debugger): Linux's ``/proc/PID/stat`` state
    ``T`` or ``t``; False where that cannot be read."""
    from ..system.processes import process_status

    return bool(pid) and process_status(pid) in ("T", "t")


def _end_rank(pid: Optional[int]) -> None:
    """SIGKILL a live rank's process and everything it started: its tree first (the rank is a
    subreaper, so a setsid or double-forked daemon is still in it), then its process group."""
    if pid:
        kill_tree(pid)
    _kill_group(pid)


def _kill_group(pid: Optional[int]) -> None:
    if not pid:
        return
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            continue
