"""Local OS processes: the embedded default executor.

Each attempt runs in its own process, forked from a fork server that has already imported ftnb
(and the heavy modules the caller has imported, such as torch), so starting an attempt costs a
fork rather than a Python start-up. Each attempt is the leader of its own process group: stopping
it kills everything it started (data-loader workers included), and Ctrl+C in a terminal reaches
the controller only, which then stops the trials itself.

Trial processes die with their controller: each asks the kernel for SIGKILL when its parent (the
fork server) exits, and the fork server exits when the controller's process does. So a SIGKILLed
driver leaves no ghost trial writing into the experiment directory.

Everything of the machine is here, none of it in the controller: the CPU/GPU pool and each
attempt's share of it (``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``), the trial's environment
(this process's, plus ``FTNB_TRIAL_ID`` and the lease token), its ``sys.path`` and working
directory (the caller's), its stdout and stderr files (in the trial's folder on a local disk;
staged locally and published when the attempt ends on object stores) and the tailing of them into
output events, and the sweep of ``ftnb.put`` files that a killed attempt could not remove.
An attempt is one process: a group of ranks (``num_workers > 1``) is refused at start.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .contract import (
    AttemptEvent,
    AttemptSpec,
    ExitEvent,
    OutputEvent,
)
from .one_machine import OneMachineExecutor
from .resources import Allocation, ResourcePool
from .trial_process import ProcessLaunch, attempt_main

if TYPE_CHECKING:
    from ..storage import StagedFile

__all__ = ["LocalProcessExecutor"]

# Imported once in the fork server so that every attempt starts with them in memory.
_ALWAYS_PRELOAD = [
    "ftnb", "ftnb.execution.local", "ftnb.execution.attempt", "ftnb.session", "ftnb.objects", "ftnb.storage.lease",
    "cloudpickle", "fsspec",
]
# Imported in the fork server too when the caller has already imported them: a notebook that
# trains with torch will have trials that need torch, and importing it once saves seconds a trial.
_PRELOAD_IF_LOADED = ["numpy", "pandas", "torch", "sklearn", "s3fs"]

_context_lock = threading.Lock()
_context: Optional[Any] = None


_TRIAL_PROCESS_PREFIX = "ftnb-trial-"


def _skip_main_for_trials() -> None:
    """Trial processes must not re-run the caller's ``__main__``.

    multiprocessing re-imports the parent's main script in every child so that pickled
    references to its functions resolve. ftnb sends the trainable by value, so that is pure
    cost (every import at the top of the script, per trial) and, worse, a script without an
    ``if __name__ == "__main__":`` guard would start its experiment again in every trial.
    """
    import multiprocessing.spawn as spawn

    original = spawn.get_preparation_data
    if getattr(original, "_ftnb", False):
        return

    def get_preparation_data(name: str) -> dict:
        data = original(name)
        if name.startswith(_TRIAL_PROCESS_PREFIX):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._ftnb = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def _fork_server_context() -> Any:
    """The process-wide fork-server context, started on first use and reused afterwards."""
    global _context
    with _context_lock:
        if _context is None:
            _skip_main_for_trials()
            ctx = multiprocessing.get_context("forkserver")
            preload = list(_ALWAYS_PRELOAD)
            preload += [m for m in _PRELOAD_IF_LOADED if m in sys.modules]
            extra = os.environ.get("FTNB_PRELOAD", "")
            preload += [m.strip() for m in extra.split(",") if m.strip()]
            ctx.set_forkserver_preload(preload)
            _context = ctx
        return _context


def _oom_kill_count() -> int:
    """How many processes the kernel's OOM killer has killed (machine-wide and in our cgroup)."""
    total = 0
    for path, key in (("/proc/vmstat", "oom_kill"), ("/sys/fs/cgroup/memory.events", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        total += int(value)
        except (OSError, ValueError):
            pass
    return total


class _OutputTail:
    """Whole lines appended to a file since the attempt started (the files are appended to
    across attempts: only what this attempt writes is handed over)."""

    def __init__(self, stream: str, path: str) -> None:
        self.stream = stream
        self.path = path
        try:
            self.offset = os.path.getsize(path)
        except OSError:
            self.offset = 0

    def read(self) -> Optional[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return None
        # Only whole lines: a half-written line is handed over when it is complete.
        end = data.rfind(b"\n") + 1
        if not end:
            return None
        self.offset += end
        return data[:end].decode("utf-8", "replace")


@dataclass
class _Running:
    launch: ProcessLaunch
    process: Any
    conn: Any
    oom_before: int
    allocation: Allocation
    outputs: list["StagedFile"]
    tails: list[_OutputTail] = field(default_factory=list)
    conn_open: bool = True


class LocalProcessExecutor(OneMachineExecutor):
    """Runs each attempt in its own process on this machine (see the module docstring).

    ``pool``: the CPUs and GPUs to hand out (default: what this machine has, see
    :mod:`ftnb.execution.resources`). ``output_events``: tail the trials' stdout and stderr into
    :class:`~ftnb.execution.contract.OutputEvent` (they are written to the trial's files either way).
    """

    name = "local"

    def __init__(self, *, pool: Optional[ResourcePool] = None, output_events: bool = True) -> None:
        super().__init__(pool)
        self._output_events = output_events
        self._running: dict[str, _Running] = {}
        # Per trial folder: where its output is staged on an object store, kept across its
        # attempts (each appends), removed at shutdown.
        self._staging: dict[tuple[str, str], str] = {}

    # -- starting --------------------------------------------------------------------------------
    def start(self, spec: AttemptSpec) -> None:
        payload, allocation = self._admit(spec)
        try:
            self._spawn(spec, payload, allocation)
        except BaseException:
            self._pool.release(allocation)
            raise

    def _spawn(self, spec: AttemptSpec, payload: bytes, allocation: Allocation) -> None:
        from ..storage import ExperimentPaths

        trial_paths = ExperimentPaths(spec.storage, spec.experiment_dir).trial(spec.trial_dir_name)
        key = (spec.experiment_dir, spec.trial_dir_name)
        stdout = spec.storage.staged_file(trial_paths.stdout, self._staging.get(key))
        if stdout.staged:
            self._staging[key] = os.path.dirname(stdout.local_path)
        stderr = spec.storage.staged_file(trial_paths.stderr, self._staging.get(key))
        token = spec.fence.token if spec.fence is not None else None
        launch = ProcessLaunch(
            trial_id=spec.trial_id,
            attempt=spec.attempt,
            payload=payload,
            env=_trial_environment(spec, allocation),
            stdout_path=stdout.local_path,
            stderr_path=stderr.local_path,
            sys_path=list(sys.path),
            cwd=os.getcwd(),
            lease_token=token,
        )
        tails = []
        if self._output_events:
            tails = [_OutputTail("stdout", stdout.local_path),
                     _OutputTail("stderr", stderr.local_path)]
        ctx = _fork_server_context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=attempt_main,
            args=(launch, child_conn),
            name=f"{_TRIAL_PROCESS_PREFIX}{launch.trial_id}",
            daemon=False,
        )
        oom_before = _oom_kill_count()
        process.start()
        child_conn.close()
        self._running[launch.trial_id] = _Running(
            launch, process, parent_conn, oom_before, allocation, [stdout, stderr], tails
        )

    def running(self) -> list[str]:
        return list(self._running)

    # -- events ----------------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[AttemptEvent]:
        if not self._running:
            time.sleep(min(timeout, 0.05))
            return []
        waitables: dict[Any, _Running] = {}
        for run in self._running.values():
            if run.conn_open:
                waitables[run.conn] = run
            waitables[run.process.sentinel] = run
        ready = multiprocessing.connection.wait(list(waitables), timeout)
        events: list[AttemptEvent] = []
        exited: list[_Running] = []
        for obj in ready:
            run = waitables[obj]
            if obj is run.conn:
                events.extend(self._drain(run))
            elif run not in exited:
                exited.append(run)
        for run in self._running.values():
            if run not in exited:
                events.extend(self._output(run))
        for run in exited:
            # Everything the attempt sent or wrote before it died is still in the socket and
            # its files: hand it over first, so the exit event is always the attempt's last.
            events.extend(self._drain(run))
            events.extend(self._output(run))
            events.append(self._finish(run))
        return events

    def _drain(self, run: _Running) -> list[AttemptEvent]:
        events = []
        while run.conn_open:
            try:
                if not run.conn.poll(0):
                    break
                events.append(run.conn.recv())
            except (EOFError, OSError):
                run.conn_open = False
                break
        return events

    def _output(self, run: _Running) -> list[AttemptEvent]:
        events: list[AttemptEvent] = []
        for tail in run.tails:
            text = tail.read()
            if text:
                events.append(OutputEvent(run.launch.trial_id, run.launch.attempt,
                                          stream=tail.stream, text=text))
        return events

    def _finish(self, run: _Running) -> AttemptEvent:
        run.process.join(5)
        code = run.process.exitcode
        _kill_group(run.process.pid)  # whatever the trainable started dies with it
        oom = code == -signal.SIGKILL and _oom_kill_count() > run.oom_before
        try:
            run.conn.close()
        except OSError:
            pass
        self._running.pop(run.launch.trial_id, None)
        self._pool.release(run.allocation)
        for output in run.outputs:
            try:
                output.publish()
            except Exception as exc:  # output is a convenience; never fail a trial for it
                print(f"ftnb: could not upload {output.local_path} to {output.path}: {exc}",
                      file=sys.stderr)
        if code is not None and code < 0:
            # A killed trial could not delete what it ftnb.put(): free that memory now, not at
            # the next put on this machine (its retry may need it).
            from ..objects import sweep_orphans

            sweep_orphans()
        return ExitEvent.of_one(run.launch.trial_id, run.launch.attempt, code, oom)

    # -- stopping --------------------------------------------------------------------------------
    def request_stop(self, trial_id: str) -> None:
        run = self._running.get(trial_id)
        if run is None or not run.conn_open:
            return
        try:
            run.conn.send(("stop", None))
        except (OSError, BrokenPipeError):
            pass

    def kill(self, trial_id: str) -> None:
        run = self._running.get(trial_id)
        if run is not None and run.process.pid:
            _kill_group(run.process.pid)

    def shutdown(self) -> None:
        self._closed = True
        for trial_id in list(self._running):
            self.kill(trial_id)
        deadline = time.time() + 10
        while self._running and time.time() < deadline:
            self.poll(0.1)
        for folder in self._staging.values():
            shutil.rmtree(folder, ignore_errors=True)
        self._staging.clear()


def _trial_environment(spec: AttemptSpec, allocation: Allocation) -> dict[str, str]:
    """This process's environment, with the attempt's share of the machine and its identity."""
    env = dict(os.environ)
    env.update(allocation.env())
    if "OMP_NUM_THREADS" in os.environ:  # the user's own setting wins over the pool's default
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    env["FTNB_TRIAL_ID"] = spec.trial_id
    if spec.fence is not None:
        env["FTNB_LEASE_TOKEN"] = spec.fence.token
    return env


def _kill_group(pid: Optional[int]) -> None:
    if not pid:
        return
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            continue
