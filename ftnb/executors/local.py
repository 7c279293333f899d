"""Local OS processes: the embedded default executor.

Each attempt runs in its own process, forked from a fork server that has already imported ftnb
(and the heavy modules the caller has imported, such as torch), so starting an attempt costs a
fork rather than a Python start-up. Each attempt is the leader of its own process group: stopping
it kills everything it started (data-loader workers included), and Ctrl+C in a terminal reaches
the controller only, which then stops the trials itself.

Trial processes die with their controller: each asks the kernel for SIGKILL when its parent (the
fork server) exits, and the fork server exits when the controller's process does. So a SIGKILLed
driver leaves no ghost trial writing into the experiment directory.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from .base import AttemptLaunch, Event, ExitInfo

__all__ = ["LocalProcessExecutor"]

# Imported once in the fork server so that every attempt starts with them in memory.
_ALWAYS_PRELOAD = [
    "ftnb", "ftnb.executors.local", "ftnb.session", "ftnb.objects", "ftnb.lease", "cloudpickle",
    "fsspec",
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


@dataclass
class _Running:
    launch: AttemptLaunch
    process: Any
    conn: Any
    oom_before: int
    started: float
    conn_open: bool = True


class LocalProcessExecutor:
    """Runs each attempt in its own local process (see the module docstring)."""

    def __init__(self) -> None:
        self._running: dict[str, _Running] = {}

    def start(self, launch: AttemptLaunch) -> None:
        ctx = _fork_server_context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(
            target=_attempt_main,
            args=(launch, child_conn),
            name=f"{_TRIAL_PROCESS_PREFIX}{launch.trial_id}",
            daemon=False,
        )
        oom_before = _oom_kill_count()
        process.start()
        child_conn.close()
        self._running[launch.trial_id] = _Running(
            launch, process, parent_conn, oom_before, time.time()
        )

    def running(self) -> list[str]:
        return list(self._running)

    def poll(self, timeout: float) -> list[Event]:
        if not self._running:
            time.sleep(min(timeout, 0.05))
            return []
        waitables: dict[Any, _Running] = {}
        for run in self._running.values():
            if run.conn_open:
                waitables[run.conn] = run
            waitables[run.process.sentinel] = run
        ready = multiprocessing.connection.wait(list(waitables), timeout)
        events: list[Event] = []
        exited: list[_Running] = []
        for obj in ready:
            run = waitables[obj]
            if obj is run.conn:
                events.extend(self._drain(run))
            elif run not in exited:
                exited.append(run)
        for run in exited:
            # Everything the attempt sent before it died is still in the socket: read it first,
            # so the exit event is always the attempt's last.
            events.extend(self._drain(run))
            events.append(self._finish(run))
        return events

    def _drain(self, run: _Running) -> list[Event]:
        events = []
        launch = run.launch
        while run.conn_open:
            try:
                if not run.conn.poll(0):
                    break
                kind, data = run.conn.recv()
            except (EOFError, OSError):
                run.conn_open = False
                break
            events.append(Event(launch.trial_id, launch.attempt, kind, data))
        return events

    def _finish(self, run: _Running) -> Event:
        run.process.join(5)
        code = run.process.exitcode
        _kill_group(run.process.pid)  # whatever the trainable started dies with it
        oom = code == -signal.SIGKILL and _oom_kill_count() > run.oom_before
        try:
            run.conn.close()
        except OSError:
            pass
        self._running.pop(run.launch.trial_id, None)
        return Event(run.launch.trial_id, run.launch.attempt, "exit", ExitInfo(code, oom))

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
        for trial_id in list(self._running):
            self.kill(trial_id)
        deadline = time.time() + 10
        while self._running and time.time() < deadline:
            self.poll(0.1)


def _kill_group(pid: Optional[int]) -> None:
    if not pid:
        return
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            continue


# ---- inside the trial process ------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
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


def _name_process(token: Optional[str]) -> None:
    """Name the process after its driver's lease (``ftnb.<token prefix>`` in ``ps`` and
    ``/proc/PID/comm``, inherited by the processes it forks), so that a driver taking the
    experiment over can find and kill a dead driver's trials (:func:`ftnb.lease.reap_processes`)."""
    if not token:
        return
    from ..lease import process_name

    try:
        with open("/proc/self/comm", "w") as f:
            f.write(process_name(token))
    except OSError:
        pass


def _redirect_output(stdout_path: Optional[str], stderr_path: Optional[str]) -> None:
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        if path:
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass


def _attempt_main(launch: AttemptLaunch, conn: Any) -> None:
    """Entry point of a trial process: run one attempt and report how it ended."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _die_with_parent()
    _name_process(launch.env.get("FTNB_LEASE_TOKEN"))
    # Ctrl+C in a terminal is for the controller, which stops the trials cleanly itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
    from .._attempt import run_attempt

    code = run_attempt(launch.payload, conn)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
