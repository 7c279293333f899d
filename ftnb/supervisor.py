"""The detached supervisor: the process that hosts an experiment's controller for
:func:`ftnb.launch` (and ``%ftrun``), so the experiment outlives the kernel that started it.

The caller (a notebook kernel) checks its input, then :func:`start` spawns
``python -m ftnb.supervisor`` in a new session (restarting, interrupting or culling the kernel
sends it nothing), with stdout and stderr in a log file. The caller's trainable, search space and
configs travel in a private, cloudpickled launch file that the supervisor deletes once read; its
``ftnb.put`` objects are adopted (:func:`ftnb.objects.adopt`), so they live as long as the
supervisor. The supervisor runs the same ``Tuner`` as a script would (``ftnb.run``'s start or
resume), holding the experiment's owner lease: a second launch sees a live owner and attaches.

A reply tells the caller how the start went (a pipe here): one JSON line once the controller
runs (the experiment directory and ``owner.json`` exist), or the exception that stopped it
before, which the caller raises as its own. ``supervisor.json`` in the experiment directory
records the supervisor (pid, host, log, launcher, the Ray actor's name). The log continues
``<experiment>/supervisor.log``, after what earlier supervisors of the experiment wrote there (a
resume adds to it): on local storage it moves there. On object stores it moves to a local file
started from the stored copy (:meth:`~ftnb.storage.growing_files.StagedFile.resume`) and is
uploaded while the supervisor runs, every ``$FTNB_OUTPUT_PUBLISH_S`` seconds (default 5) when it
grew, as at most its last 8 MiB, and whole when the supervisor ends
(:class:`~ftnb.storage.growing_files.PeriodicPublisher`): a supervisor SIGKILLed, killed for
memory or culled with its server leaves all but its last seconds of log where ``ftnb status``
and ``ftnb logs`` read it. Once another driver owns the experiment, nothing more is uploaded.
The local copy is removed once uploaded whole at the end (the stored copy is the log from then
on); a SIGKILLed supervisor's is removed by the next process of this user on the machine that
stages a file (:func:`~ftnb.storage.growing_files.sweep_staging_folders`).

Where the supervisor runs is a launcher's choice (:mod:`ftnb.launchers`): :func:`start` here
(``local``), an admin's command template (``command``: the launch file in a folder the command's
host sees, the reply in a file next to it instead of the pipe), or a detached Ray actor
(``ray``: :func:`host` in a thread of the actor, the reply by a method call). Every supervisor
keeps multiprocessing's temporary folder (``pymp-*``: the fork server's socket) in a folder
named after itself (:func:`ftnb.launchers.temp_folders.private_temp_folder`), which the next
launch removes if a SIGKILL left it behind (:mod:`ftnb.launchers.temp_folders`).

SIGTERM (and SIGINT) stop the experiment the way Ctrl+C stops ``fit()``: trials end at their next
report, the state is saved INTERRUPTED, resumable. A killed supervisor takes its trials with it
(they die with their parent); ``%ftresume`` or ``%ftrun`` of the same name resumes the experiment.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

__all__ = ["LaunchSpec", "Reply", "SupervisorError", "SupervisorStart", "host", "launch_bytes",
           "load_launch", "start", "supervisor_command", "write_launch_file"]

#: How long :func:`start` waits for the supervisor to be running (it imports what the
#: trainable needs, torch included, before it can start).
START_TIMEOUT_S = 300.0
_LOG_TAIL_LINES = 15
#: The environment a supervisor elsewhere (a command's host, a Ray actor) does not get from
#: its caller: ftnb's own settings travel in the launch file, except these, which describe the
#: caller's machine or choose the launcher itself.
_NOT_CARRIED = ("FTNB_HOST_ID", "FTNB_LAUNCHER", "FTNB_LAUNCHER_COMMAND", "FTNB_LAUNCH_DIR")


class SupervisorError(RuntimeError):
    """The supervisor process could not start the experiment (details from its log)."""


def _carried_environment() -> dict:
    return {k: v for k, v in os.environ.items()
            if k.startswith("FTNB_") and k not in _NOT_CARRIED}


@dataclass
class LaunchSpec:
    """What the supervisor runs: ``ftnb.run``'s arguments (start, or resume when it exists).

    ``launcher`` names where it runs (recorded in ``supervisor.json``); ``env``: the caller's
    ``FTNB_*`` settings, set in the supervisor where its own environment lacks them."""

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
    launcher: str = "local"
    env: dict = field(default_factory=_carried_environment)


@dataclass
class SupervisorStart:
    """What a launcher learnt: the running supervisor and its experiment.

    ``pid`` and ``host``: the supervisor's process; ``process``: it, when it is this process's
    child (the ``local`` launcher), else None; ``where``: one line for the user."""

    pid: Optional[int]
    path: str
    log: str
    resuming: Optional[str]
    process: Optional[subprocess.Popen] = None
    host: str = ""
    where: str = ""


# -- the caller's side ---------------------------------------------------------------------------
def launch_bytes(spec: LaunchSpec) -> bytes:
    """What a supervisor reads to run ``spec`` (:func:`load_launch`): a JSON line (the caller's
    ``sys.path`` and working directory, needed before unpickling), then the cloudpickled spec."""
    from .objects.cell_source import dumps

    header = json.dumps({"sys_path": spec.sys_path, "cwd": spec.cwd}).encode() + b"\n"
    return header + dumps(spec)


def write_launch_file(spec: LaunchSpec, folder: Optional[str] = None) -> str:
    """Write :func:`launch_bytes` of ``spec`` to a new private file (mode 0600) in ``folder``
    (default the temporary folder) and return its path."""
    data = launch_bytes(spec)
    fd, spec_path = tempfile.mkstemp(prefix=f"ftnb-launch-{_file_safe(spec.name)}-",
                                     suffix=".pkl", dir=folder)  # mode 0600
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return spec_path


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40]


def supervisor_command(launch_file: str, log: str, *, reply_fd: Optional[int] = None,
                       reply_file: Optional[str] = None, python: Optional[str] = None) -> list:
    """The command line of a supervisor (``python -m ftnb.supervisor ...``) that reads
    ``launch_file``, writes its output to ``log`` and replies on the pipe ``reply_fd`` or in
    the file ``reply_file``."""
    argv = [python or sys.executable, "-m", "ftnb.supervisor", "--launch-file", launch_file,
            "--log", log]
    if reply_fd is not None:
        argv += ["--reply-fd", str(reply_fd)]
    if reply_file is not None:
        argv += ["--reply-file", reply_file]
    return argv


def start(spec: LaunchSpec, timeout_s: float = START_TIMEOUT_S) -> SupervisorStart:
    """Spawn the supervisor for ``spec`` on this machine and return once its controller runs;
    raise what stopped it otherwise (the same exception type the caller would get from
    ``ftnb.run``)."""
    spec_path = write_launch_file(spec)
    log_fd, log_path = tempfile.mkstemp(prefix=f"ftnb-supervisor-{_file_safe(spec.name)}-",
                                        suffix=".log")
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            supervisor_command(spec_path, log_path, reply_fd=write_end),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            pass_fds=(write_end,),
            start_new_session=True,
            cwd=spec.cwd,
            env=supervisor_env(),
        )
    except BaseException:
        os.close(read_end)
        _remove(spec_path)
        raise
    finally:
        os.close(write_end)
        os.close(log_fd)
    reap_in_background(process)
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
            f"The end of its log ({log_path}):\n{log_tail(log_path)}"
        )
    return started_from(message, process.pid, socket.gethostname(), process)


def started_from(message: dict, pid: Optional[int], host_name: str,
                 process: Optional[subprocess.Popen] = None) -> SupervisorStart:
    """The :class:`SupervisorStart` a supervisor's reply says, or raise the exception it
    carries."""
    if "error" in message:
        raise _exception_from(message)
    pid = message.get("pid", pid)
    host_name = message.get("host", host_name)
    return SupervisorStart(pid, message["path"], message["log"], message.get("resuming"),
                           process, host_name, f"pid {pid} on {host_name}")


def reap_in_background(process: subprocess.Popen) -> None:
    """Reap ``process`` when it ends, so that it is never a zombie of a long-lived kernel."""
    threading.Thread(target=process.wait, name="ftnb-supervisor-reaper", daemon=True).start()


def supervisor_env() -> dict:
    """The environment a supervisor started from here gets: this one, less what only works in
    a kernel."""
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
    return parse_message(data)


def parse_message(data: bytes) -> Optional[dict]:
    """A supervisor's reply (its first line), or None when there is none (it died first)."""
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


def log_tail(path: str, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the file ``path`` (what a failed start shows)."""
    from .storage.paths import read_last_lines

    try:
        return "\n".join(read_last_lines(path, lines)) or "(empty)"
    except OSError as exc:
        return f"(unreadable: {exc})"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- the supervisor's side -----------------------------------------------------------------------
class Reply:
    """How a supervisor tells its caller how the start went, once: a pipe (``local``), a file
    (``command``: written atomically next to the launch file), or a callback (``ray``)."""

    def __init__(self, fd: Optional[int] = None, path: Optional[str] = None,
                 callback: Optional[Callable[[dict], None]] = None) -> None:
        self.pipe = os.fdopen(fd, "w") if fd is not None else None
        self.path = path
        self.callback = callback
        self.pending = fd is not None or path is not None or callback is not None

    def send(self, message: dict) -> None:
        if not self.pending:
            return
        self.pending = False
        line = json.dumps(message) + "\n"
        try:
            if self.pipe is not None:
                self.pipe.write(line)
                self.pipe.close()
            if self.path is not None:
                partial = f"{self.path}.partial"
                with open(partial, "w") as f:
                    f.write(line)
                os.replace(partial, self.path)
            if self.callback is not None:
                self.callback(message)
        except (OSError, ValueError):
            pass  # the caller is gone (its kernel died): nobody to tell


class _Announcer:
    """A controller listener: once the experiment runs, record the supervisor in the
    experiment directory, move the log there (publishing it while it grows on object stores),
    and tell the caller (once)."""

    def __init__(self, reply: Reply, log_path: str, resuming: Optional[str],
                 launcher: str = "local", extra: Optional[dict] = None) -> None:
        self.reply = reply
        self.log_path = log_path
        self.resuming = resuming
        self.launcher = launcher
        self.extra = dict(extra or {})
        self.paths: Any = None
        self.log: Any = None  # the log as a StagedFile of the experiment's supervisor.log
        self.publisher: Any = None  # publishes it while the supervisor runs (object stores)
        self.token: Optional[str] = None  # the owner lease's token while the experiment runs
        self.record: dict = {}
        self.final_status = "ended"

    def on_experiment_end(self, state: Any) -> None:
        self.final_status = state.status.lower()

    def on_experiment_start(self, state: Any) -> None:
        from .storage.growing_files import PeriodicPublisher
        from .storage.lease import read_lease
        from .system.processes import host_id, pid_start_time

        paths = self.paths
        storage = paths.storage
        # The log continues supervisor.log: on a local disk the file itself, elsewhere a local
        # file started from the stored copy, which earlier supervisors of the experiment wrote.
        self.log = storage.staged_file(paths.supervisor_log)
        try:
            self.log.resume()
        except Exception as exc:  # the log is a convenience; never fail the experiment for it
            print(f"ftnb: the log continues without the earlier supervisors' ({exc})",
                  flush=True)
        if self.log.local_path != self.log_path:
            self.log_path = _move_log(self.log_path, self.log.local_path)
        if self.log.local_path != self.log_path:  # it could not move: publish it where it is
            self.log.discard()  # (the folder made for it, with the earlier supervisors' log)
            self.log = storage.staged_file(paths.supervisor_log, local_path=self.log_path)
        owner = read_lease(paths)  # ours: the controller holds the lease while it runs
        self.token = owner.token if owner is not None else None
        self.publisher = PeriodicPublisher([self.log], check=self._check_owner)
        self.record = {
            "pid": os.getpid(),
            "pid_start": pid_start_time(os.getpid()),
            "host": socket.gethostname(),
            "host_id": host_id(),
            "log": self.log_path,
            "started": time.time(),
            "python": sys.executable,
            "launcher": self.launcher,
            **self.extra,
        }
        storage.write_json_atomic(paths.supervisor, self.record)
        self.send({"path": paths.uri, "log": self.log_path, "resuming": self.resuming,
                   "pid": os.getpid(), "host": socket.gethostname()})

    def _check_owner(self) -> None:
        """Raise :class:`~ftnb.storage.lease.FencedError` once another driver owns the
        experiment: it continues the log, which this supervisor must not publish over."""
        from .storage.lease import FencedError, read_lease

        owner = read_lease(self.paths)
        if self.token is not None and (owner is None or owner.token != self.token):
            raise FencedError(f"another driver runs the experiment at {self.paths.uri}")

    def send(self, message: dict) -> None:
        self.reply.send(message)

    @property
    def replied(self) -> bool:
        return not self.reply.pending

    def finish(self, outcome: str) -> None:
        if not self.record:  # the experiment never started: nothing of ours is there
            return
        storage = self.paths.storage
        try:
            storage.write_json_atomic(self.paths.supervisor,
                                      dict(self.record, ended=time.time(), outcome=outcome))
            sys.stdout.flush()
            sys.stderr.flush()
            self.publisher.close()
            # Uploaded whole: the local copy goes (what this process prints from here on, on
            # its way out, is not kept). Where the upload failed the copy stays.
            self.publisher.discard()
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
    except OSError as exc:
        print(f"ftnb: keeping the log at {old} ({exc})", flush=True)
        return old
    if not log_to(new):
        return old
    _remove(old)
    return new


def log_to(path: str) -> bool:
    """Point this process's stdout and stderr (the file descriptors: its children's too) at
    the end of the file ``path``; False (and a line saying why) if it cannot be opened."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        print(f"ftnb: cannot write the log {path} ({exc})", flush=True)
        return False
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return True


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"supervisor received {signal.Signals(signum).name}")


def load_launch(data: bytes) -> LaunchSpec:
    """The spec of a launch file's contents (:func:`write_launch_file`), after taking the
    caller's ``sys.path`` and working directory (functions pickled by reference import from
    there) and the ``FTNB_*`` settings this environment lacks."""
    import cloudpickle

    header, payload = data.split(b"\n", 1)
    where = json.loads(header)
    sys.path[:] = [p for p in where["sys_path"] if p != ""] + [
        p for p in sys.path if p not in where["sys_path"]] + [""]
    if os.path.isdir(where["cwd"]):
        os.chdir(where["cwd"])
    else:  # another machine, which does not have the caller's folder
        print(f"ftnb: the caller's working directory {where['cwd']} is not here; "
              f"working in {os.getcwd()}", flush=True)
    spec: LaunchSpec = cloudpickle.loads(payload)
    for key, value in spec.env.items():
        os.environ.setdefault(key, value)
    return spec


def host(data: bytes, reply: Reply, log_path: str, *, launcher: str = "local",
         extra: Optional[dict] = None, takeover_from: Optional[Callable[[Any], bool]] = None
         ) -> int:
    """Run the experiment of the launch file contents ``data``, replying on ``reply`` once it
    runs (or with what stopped it); return the exit code. The body of every supervisor: this
    process's (:func:`main`) and the Ray actor's (:mod:`ftnb.launchers.ray`).

    ``takeover_from(paths)``: whether the experiment's current owner is a previous incarnation
    of this supervisor (a Ray actor restarted after its death), whose lease it takes over."""
    announcer = _Announcer(reply, log_path, None, launcher, extra)
    spec: Optional[LaunchSpec] = None
    try:
        spec = load_launch(data)
        from .objects import bind_objects
        from .storage import ExperimentPaths, Storage, default_storage_path
        from .tuner import start_or_resume

        rc = spec.run_config
        paths = ExperimentPaths.of(
            Storage(spec.storage_path or default_storage_path(),
                    getattr(rc, "storage_filesystem", None)), spec.name)
        takeover = bool(takeover_from is not None and paths.has_state() and takeover_from(paths))
        space = spec.param_space
        if space is not None:
            space, _ = bind_objects(space, adopt_refs=True)  # ours now: they outlive the kernel
        tuner, resuming = start_or_resume(
            spec.trainable, name=spec.name, param_space=space, storage_path=spec.storage_path,
            tune_config=spec.tune_config, run_config=rc,
            resources_per_trial=spec.resources_per_trial, restart_errored=spec.restart_errored,
            allow_different_trainable=spec.allow_different_trainable, takeover=takeover,
            caller="ftnb.launch")
        if resuming:
            print(resuming, flush=True)
        announcer.resuming = resuming
        announcer.paths = tuner.restore_plan.paths if tuner.restore_plan is not None else paths
        tuner.origin = spec.origin
        tuner.listeners.append(announcer)
        tuner.fit()
    except BaseException as exc:
        if not announcer.replied:
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


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m ftnb.supervisor --launch-file PATH --log PATH (--reply-fd N | --reply-file
    PATH) [--launcher NAME]``: what :func:`start` and the ``command`` launcher run."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ftnb.supervisor",
                                     description="Host an ftnb experiment (see ftnb.launch).")
    parser.add_argument("--launch-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--reply-fd", type=int)
    parser.add_argument("--reply-file")
    parser.add_argument("--launcher", default="local")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    reply = Reply(fd=args.reply_fd, path=args.reply_file)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log_to(args.log)  # (already so when started by start(); a command's output is elsewhere)
    print(f"ftnb supervisor pid {os.getpid()} on {socket.gethostname()}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    from .launchers.temp_folders import private_temp_folder, sweep_temp_folders

    sweep_temp_folders()
    private_temp_folder()
    try:
        with open(args.launch_file, "rb") as f:
            data = f.read()
    except OSError as exc:
        # A command launcher's caller that gave up waiting removes the launch file: then there
        # is nothing to run, and nobody to tell.
        print(f"ftnb: no launch file ({exc}); nothing to run.", flush=True)
        return 1
    _remove(args.launch_file)
    return host(data, reply, args.log, launcher=args.launcher)


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
