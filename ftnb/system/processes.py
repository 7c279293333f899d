"""Processes of this machine as ``/proc`` tells them, and this machine's identity.

A pid alone does not name a process: pids are reused. Every check here that matters pairs the pid
with the process's start time (:func:`pid_start_time`), so a later process that got the same pid
is never taken for the one meant (:func:`process_state` says "reused"), and never killed in its
place (:func:`kill_and_wait`).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sys
import time
from typing import Optional

__all__ = [
    "command_line",
    "host_id",
    "in_ray_worker",
    "is_stopped",
    "kill_and_wait",
    "pid_exists",
    "pid_start_time",
    "process_state",
    "process_status",
]


def pid_scope_tag() -> str:
    """8 hex digits naming where this process's pids mean something: the machine and its pid
    namespace.

    Folders named after processes (``ftnb.put``'s object files, supervisors' temporary folders,
    staged output) may be shared between machines (FTNB_OBJECT_STORE on NFS) or containers (a
    mounted /tmp): a sweep only judges those whose owner's pid it can look up.
    """
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    scope = f"{socket.gethostname()}\0{namespace}"
    return hashlib.blake2b(scope.encode("utf-8"), digest_size=4).hexdigest()


def host_id() -> str:
    """What identifies this machine (and PID namespace) for pid checks: hostname, boot id and
    PID namespace.

    ``$FTNB_HOST_ID`` overrides it (two containers that share a hostname and kernel, or tests).
    """
    override = os.environ.get("FTNB_HOST_ID")
    if override:
        return override
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass
    return "/".join(parts)


def process_status(pid: int) -> Optional[str]:
    """The state letter of this machine's process ``pid`` in ``/proc/PID/stat`` (``R``, ``S``,
    ``T`` stopped, ``t`` traced, ``Z`` zombie, ...), None when it cannot be read (gone, or not
    Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: the state follows the last ')'.
    state = data[data.rfind(b")") + 2:data.rfind(b")") + 3]
    return state.decode("ascii", "replace") or None


def pid_start_time(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), which
    tells a live process from a later one that reused its pid. None if it does not exist (or is
    a zombie); -1 if it exists but /proc does not say when it started."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None if not pid_exists(pid) else -1
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[:1] in ([b"Z"], [b"X"]):
        return None  # a zombie is dead: only its exit status is left for its parent to collect
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return -1


def process_state(pid: int, pid_start: Optional[int]) -> str:
    """What became of the process ``pid`` of this machine that started at ``pid_start`` (None:
    unknown): "running", "exited", or "reused" (its pid now names a later process)."""
    start = pid_start_time(pid)
    if start is None:
        return "exited"
    if pid_start is not None and start not in (-1, pid_start):
        return "reused"
    return "running"


def is_stopped(pid: int) -> bool:
    """Whether this machine's process ``pid`` is stopped (SIGSTOP, Ctrl+Z) or traced."""
    return process_status(pid) in ("T", "t")


def pid_exists(pid: int) -> bool:
    """Whether some process (a zombie included) has the pid ``pid`` on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def kill_and_wait(pid: int, pid_start: Optional[int], timeout_s: float = 10.0) -> None:
    """SIGKILL this machine's process ``pid`` if it is still the one that started at
    ``pid_start``, and wait until it is gone or a zombie (its files, and locks, closed), at most
    ``timeout_s``."""
    if process_state(pid, pid_start) != "running":
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + timeout_s
    while pid_start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def command_line() -> str:
    """This process's command line (at most 300 characters), for messages that say who holds
    what; empty where /proc cannot tell."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:300]
    except OSError:
        return ""


def in_ray_worker() -> bool:
    """Whether this process is a Ray actor (a trial on the Ray executor is one); never imports
    ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return ray.get_runtime_context().get_actor_id() is not None
    except Exception:
        return False
