"""The detached supervisor: the process that hosts an experiment's controller for
:func:`ftnb.launch` (and ``%ftrun``), so the experiment outlives the kernel that started it.

The caller (a notebook kernel) checks its input, then :func:`start` spawns
``python -m ftnb.supervisor`` in a new session (restarting, interrupting or culling the kernel
sends it nothing), with stdout and stderr in a log file. The caller's trainable, search space and
configs travel in a private, cloudpickled launch file that the supervisor deletes once read; its
``ftnb.put`` objects are adopted (:func:`ftnb.objects.adopt`), so they live as long as the
supervisor. The supervisor runs the same ``Tuner`` as a script would (``ftnb.run``'s start or
resume), holding the experiment's owner lease: a second launch sees a live owner and attaches.

A pipe tells the caller how the start went: one JSON line once the controller runs (the
experiment directory and ``owner.json`` exist), or the exception that stopped it before, which
the caller raises as its own. ``supervisor.json`` in the experiment directory records the
supervisor (pid, host, log); the log moves to ``<experiment>/supervisor.log`` on local storage
(on object stores it stays local and is uploaded when the supervisor ends).

SIGTERM (and SIGINT) stop the experiment the way Ctrl+C stops ``fit()``: trials end at their next
report, the state is saved INTERRUPTED, resumable. A killed supervisor takes its trials with it
(they die with their parent); ``%ftresume`` or ``%ftrun`` of the same name resumes the experiment.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["LaunchSpec", "SupervisorError", "SupervisorStart", "start"]

#: How long :func:`start` waits for the supervisor to be running (it imports what the
#: trainable needs, torch included, before it can start).
START_TIMEOUT_S = 300.0
_LOG_TAIL_LINES = 15


class SupervisorError(RuntimeError):
    """The supervisor process could not start the experiment (details from its log)."""


@dataclass
class LaunchSpec:
    """What the supervisor runs: ``ftnb.run``'s arguments (start, or resume when it exists)."""

    trainable: Any
    name: str
    param_space: Optional[dict] = None
    storage_path: Optional[str] = None
    tune_config: Any = None
    run_config: Any = None
    resources_per_trial: Any = None
    restart_errored: bool = False
    allow_different_trainable: bool = False
    origin: Optional[dict] = None
    sys_path: list = field(default_factory=lambda: list(sys.path))
    cwd: str = field(default_factory=os.getcwd)


@dataclass
class SupervisorStart:
    """What :func:`start` learnt: the running supervisor and its experiment."""

    pid: int
    path: str
    log: str
    resuming: Optional[str]
    process: subprocess.Popen


# -- the caller's side ---------------------------------------------------------------------------
def start(spec: LaunchSpec, timeout_s: float = START_TIMEOUT_S) -> SupervisorStart:
    """Spawn the supervisor for ``spec`` and return once its controller runs; raise what
    stopped it otherwise (the same exception type the caller would get from ``ftnb.run``)."""
    import cloudpickle

    header = json.dumps({"sys_path": spec.sys_path, "cwd": spec.cwd}).encode() + b"\n"
    payload = cloudpickle.dumps(spec)
    fd, spec_path = tempfile.mkstemp(prefix="ftnb-launch-", suffix=".pkl")  # mode 0600
    with os.fdopen(fd, "wb") as f:
        f.write(header + payload)
    log_fd, log_path = tempfile.mkstemp(prefix=f"ftnb-supervisor-{spec.name}-", suffix=".log")
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "ftnb.supervisor", spec_path, str(write_end), log_path],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            pass_fds=(write_end,),
            start_new_session=True,
            cwd=spec.cwd,
            env=_supervisor_env(),
        )
    except BaseException:
        os.close(read_end)
        _remove(spec_path)
        raise
    finally:
        os.close(write_end)
        os.close(log_fd)
    # Reap it when it ends, so a finished supervisor is never a zombie of a long-lived kernel.
    threading.Thread(target=process.wait, name="ftnb-supervisor-reaper", daemon=True).start()
    try:
        message = _read_message(read_end, process, timeout_s)
    finally:
        os.close(read_end)
    if message is None:
        _remove(spec_path)
        try:  # it closed the pipe, or the time ran out: has it exited?
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(process.pid, signal.SIGKILL)  # nobody would be told what it does next
        why = (f"exited with code {code}" if code is not None
               else f"did not start within {timeout_s:.0f} s and was killed")
        raise SupervisorError(
            f"ftnb: the supervisor process {why} before the experiment {spec.name!r} started. "
            f"The end of its log ({log_path}):\n{_tail(log_path)}"
        )
    if "error" in message:
        raise _exception_from(message)
    return SupervisorStart(process.pid, message["path"], message["log"], message.get("resuming"),
                           process)


def _supervisor_env() -> dict:
    env = dict(os.environ)
    # A kernel's inline plotting backend needs the kernel; in trials it would fail on import.
    if env.get("MPLBACKEND", "").startswith("module://matplotlib_inline"):
        del env["MPLBACKEND"]
    return env


def _read_message(fd: int, process: subprocess.Popen, timeout_s: float) -> Optional[dict]:
    deadline = time.monotonic() + timeout_s
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # the supervisor closed the pipe: it said what it had to, or died
            break
        data += chunk
        if data.endswith(b"\n"):
            break
    if not data.strip():
        return None
    try:
        return json.loads(data.decode("utf-8").splitlines()[0])
    except (ValueError, IndexError):
        return None


def _exception_from(message: dict) -> BaseException:
    import cloudpickle

    try:
        exc = cloudpickle.loads(base64.b64decode(message["error"]))
        if isinstance(exc, BaseException):
            return exc
    except Exception:
        pass
    return SupervisorError(f"{message.get('type', 'Error')}: {message.get('message', '')}")


def _tail(path: str, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- the supervisor's side -----------------------------------------------------------------------
class _Announcer:
    """A controller listener: once the experiment runs, record the supervisor in the
    experiment directory, move the log there, and tell the caller (once)."""

    def __init__(self, pipe: Any, log_path: str, resuming: Optional[str]) -> None:
        self.pipe = pipe
        self.log_path = log_path
        self.resuming = resuming
        self.paths: Any = None
        self.log: Any = None  # the log as a StagedFile of the experiment's supervisor.log
        self.record: dict = {}
        self.final_status = "ended"

    def on_experiment_end(self, state: Any) -> None:
        self.final_status = state.status.lower()

    def on_experiment_start(self, state: Any) -> None:
        from .storage.lease import host_id, pid_start_time

        paths = self.paths
        storage = paths.storage
        # Where the storage has the log written through the OS: its own supervisor.log on a
        # local disk (the log moves there), else where it is now (uploaded at the end).
        self.log = storage.staged_file(paths.supervisor_log, local_path=self.log_path)
        if self.log.local_path != self.log_path:
            self.log_path = _move_log(self.log_path, self.log.local_path)
        self.record = {
            "pid": os.getpid(),
            "pid_start": pid_start_time(os.getpid()),
            "host": socket.gethostname(),
            "host_id": host_id(),
            "log": self.log_path,
            "started": time.time(),
            "python": sys.executable,
        }
        storage.write_json_atomic(paths.supervisor, self.record)
        self.send({"path": paths.uri, "log": self.log_path, "resuming": self.resuming})

    def send(self, message: dict) -> None:
        if self.pipe is None:
            return
        try:
            self.pipe.write(json.dumps(message) + "\n")
            self.pipe.close()
        except (OSError, ValueError):
            pass  # the caller is gone (its kernel died): nobody to tell
        self.pipe = None

    def finish(self, outcome: str) -> None:
        if not self.record:  # the experiment never started: nothing of ours is there
            return
        storage = self.paths.storage
        try:
            storage.write_json_atomic(self.paths.supervisor,
                                      dict(self.record, ended=time.time(), outcome=outcome))
            sys.stdout.flush()
            sys.stderr.flush()
            self.log.publish()
        except Exception as exc:
            print(f"ftnb: could not record the supervisor's end: {exc}", file=sys.stderr)


def _move_log(old: str, new: str) -> str:
    """Continue the log at ``new``: copy what was written so far, then point stdout and stderr
    there (the caller gave the supervisor a temporary file before the folder existed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(old, "rb") as src, open(new, "ab") as dst:
            dst.write(src.read())
        fd = os.open(new, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        print(f"ftnb: keeping the log at {old} ({exc})", flush=True)
        return old
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _remove(old)
    return new


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"supervisor received {signal.Signals(signum).name}")


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    spec_path, pipe_fd, log_path = argv[0], int(argv[1]), argv[2]
    pipe = os.fdopen(pipe_fd, "w")
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    announcer = _Announcer(pipe, log_path, None)
    print(f"ftnb supervisor pid {os.getpid()} on {socket.gethostname()}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    try:
        with open(spec_path, "rb") as f:
            header, payload = f.read().split(b"\n", 1)
        _remove(spec_path)
        where = json.loads(header)
        # Before unpickling: functions pickled by reference import from the caller's path.
        sys.path[:] = [p for p in where["sys_path"] if p != ""] + [""]
        os.chdir(where["cwd"])
        import cloudpickle

        from .objects import bind_objects
        from .start_or_resume import start_or_resume
        from .storage import ExperimentPaths, Storage, default_storage_path

        spec: LaunchSpec = cloudpickle.loads(payload)
        space = spec.param_space
        if space is not None:
            space, _ = bind_objects(space, adopt_refs=True)  # ours now: they outlive the kernel
        tuner, resuming = start_or_resume(
            spec.trainable, name=spec.name, param_space=space, storage_path=spec.storage_path,
            tune_config=spec.tune_config, run_config=spec.run_config,
            resources_per_trial=spec.resources_per_trial, restart_errored=spec.restart_errored,
            allow_different_trainable=spec.allow_different_trainable, caller="ftnb.launch")
        if resuming:
            print(resuming, flush=True)
        announcer.resuming = resuming
        rc = tuner.run_config
        announcer.paths = tuner.restore_plan.paths if tuner.restore_plan is not None else (
            ExperimentPaths.of(Storage(rc.storage_path or default_storage_path(),
                                       rc.storage_filesystem), spec.name))
        tuner.origin = spec.origin
        tuner.listeners.append(announcer)
        tuner.fit()
    except BaseException as exc:
        if announcer.pipe is not None:
            _report_error(announcer, exc)
            return 1
        if isinstance(exc, KeyboardInterrupt):
            print(f"ftnb: supervisor stopped ({exc or 'interrupted'}); the experiment is "
                  "saved INTERRUPTED and can be resumed.", flush=True)
            announcer.finish("interrupted")
            return 1
        import traceback

        traceback.print_exc()
        announcer.finish(f"error: {type(exc).__name__}: {exc}")
        return 1
    status = announcer.final_status
    print(f"ftnb: experiment {spec.name!r} {status}; supervisor exiting.", flush=True)
    announcer.finish(status)
    return 0


def _report_error(announcer: _Announcer, exc: BaseException) -> None:
    import traceback

    import cloudpickle

    traceback.print_exc()
    try:
        blob = base64.b64encode(cloudpickle.dumps(exc)).decode("ascii")
    except Exception:
        blob = ""
    announcer.send({"error": blob, "type": type(exc).__name__, "message": str(exc)})


if __name__ == "__main__":
    sys.exit(main())
