"""The owner lease: one driver runs an experiment at a time, and nothing of a dead or superseded
driver writes into the experiment once another driver owns it.

The lease is ``owner.json`` in the experiment folder::

    {"token": "9f3c...", "epoch": 4, "host": "gpu-7", "host_id": "gpu-7/<boot id>/<pid ns>",
     "pid": 8123, "pid_start": 1234567, "acquired": ..., "heartbeat": ..., "ttl_s": 60,
     "released": false}

* A driver **acquires** it before it touches the experiment (a new experiment, or a restore). A
  lease held by a live owner is refused (:class:`ExperimentLockedError`) unless the caller asks
  to take over. On local disks the read-check-write is serialized with ``flock`` on
  ``.owner.lock``; on object stores (no compare-and-swap) the winner is whoever's token reads
  back after a settle delay.
* **Liveness.** On the owner's own machine (same host id: hostname, boot id and PID namespace)
  the owner is alive exactly while its process is (pid and start time). From another machine it
  is alive while its heartbeat is younger than ``ttl_s``; the owner refreshes it every
  ``ttl_s / 6`` from a thread, and stops (:class:`LeaseLostError`) when it finds another token.
* **Fencing.** Every trial process carries its driver's token and checks it
  (:class:`Fence`) before it persists anything; a trial whose token was replaced, or whose
  driver on another machine went silent for half the TTL, ends without writing. On the same
  machine the new owner also kills the old owner's trial processes outright
  (:func:`reap_processes`): they are named ``ftnb.<token prefix>``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import ExperimentPaths, is_transient

__all__ = [
    "ExperimentLockedError",
    "Fence",
    "FencedError",
    "Lease",
    "LeaseInfo",
    "LeaseLostError",
    "host_id",
    "process_name",
    "reap_processes",
]

DEFAULT_TTL_S = 60.0


def _ttl() -> float:
    try:
        return max(1.0, float(os.environ.get("FTNB_LEASE_TTL_S", DEFAULT_TTL_S)))
    except ValueError:
        return DEFAULT_TTL_S


class ExperimentLockedError(RuntimeError):
    """The experiment is owned by a live driver: it cannot be run twice at once."""


class LeaseLostError(RuntimeError):
    """This driver's lease was taken over by another driver: it must stop writing."""


class FencedError(RuntimeError):
    """A trial process found that its driver no longer owns the experiment."""


def host_id() -> str:
    """What identifies this machine (and PID namespace) for pid checks.

    ``$FTNB_HOST_ID`` overrides it (two containers that share a hostname and kernel, or tests).
    """
    override = os.environ.get("FTNB_HOST_ID")
    if override:
        return override
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            with open(path) as f:
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
    tells a live process from a later one that reused its pid. None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None if not _pid_exists(pid) else -1
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


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_name(token: str) -> str:
    """The name (``/proc/PID/comm``, 15 characters at most) of an owner's trial processes."""
    return f"ftnb.{token[:10]}"


@dataclass
class LeaseInfo:
    """The contents of ``owner.json``."""

    token: str
    epoch: int
    host: str
    host_id: str
    pid: int
    pid_start: Optional[int]
    acquired: float
    heartbeat: float
    ttl_s: float
    released: bool = False
    command: str = ""
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict) -> "LeaseInfo":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def liveness(self, now: Optional[float] = None) -> tuple[bool, str]:
        """(alive, why) as seen from this process."""
        now = time.time() if now is None else now
        if self.released:
            return False, "it ended (finished or interrupted) and released the experiment"
        if self.host_id == host_id():
            state = process_state(self.pid, self.pid_start)
            if state == "exited":
                return False, f"its process {self.pid} on this machine has exited"
            if state == "reused":
                return False, f"its process {self.pid} on this machine has exited (pid reused)"
            return True, f"its process {self.pid} on this machine ({self.host}) is running"
        age = now - self.heartbeat
        if age < self.ttl_s:
            return True, (
                f"it runs on {self.host} (pid {self.pid}) and its heartbeat is {age:.0f} s old "
                f"(it counts as dead after {self.ttl_s:.0f} s without one)"
            )
        return False, f"it ran on {self.host} and has sent no heartbeat for {age:.0f} s"

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        return f"pid {self.pid} on {self.host}, since {started}"


def refuse_if_owned(paths: ExperimentPaths, what: str) -> Optional[LeaseInfo]:
    """The current lease, after raising :class:`ExperimentLockedError` if a live driver holds
    it (``what``: the refused action, for the message)."""
    current = read_lease(paths)
    if current is not None:
        alive, why = current.liveness()
        if alive:
            raise ExperimentLockedError(_locked_message(paths, current, why, what))
    return current


def read_lease(paths: ExperimentPaths) -> Optional[LeaseInfo]:
    """The current lease, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads(paths.storage.read_bytes(paths.lease))
        return LeaseInfo.from_json(data)
    except (FileNotFoundError, ValueError, TypeError):
        return None


def live_lease(paths: ExperimentPaths) -> Optional[LeaseInfo]:
    """The lease of the driver that owns the experiment now, or None when no live driver does."""
    current = read_lease(paths)
    return current if current is not None and current.liveness()[0] else None


class Lease:
    """A driver's hold on an experiment; see the module docstring."""

    SETTLE_S = 0.5  # object stores: how long to wait before reading our write back

    def __init__(self, paths: ExperimentPaths, info: LeaseInfo,
                 previous: Optional[LeaseInfo]) -> None:
        self.paths = paths
        self.info = info
        self.previous = previous
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._watcher = _LeaseWatcher(paths, interval_s=1.0)

    @property
    def token(self) -> str:
        return self.info.token

    # -- acquiring -----------------------------------------------------------------------------
    @classmethod
    def acquire(cls, paths: ExperimentPaths, *, takeover: bool = False,
                what: str = "run") -> "Lease":
        """Become the experiment's owner, or raise :class:`ExperimentLockedError`."""
        storage = paths.storage
        # Acquisitions are serialized where the storage has a lock (a local or NFS disk); on
        # object stores the winner is whoever's token reads back after a settle delay.
        with storage.exclusive_lock(paths.lease_lock) as serialized:
            current = read_lease(paths) if takeover else refuse_if_owned(paths, what)
            now = time.time()
            info = LeaseInfo(
                token=uuid.uuid4().hex,
                epoch=(current.epoch + 1) if current is not None else 1,
                host=socket.gethostname(),
                host_id=host_id(),
                pid=os.getpid(),
                pid_start=pid_start_time(os.getpid()),
                acquired=now,
                heartbeat=now,
                ttl_s=_ttl(),
                command=_command_line(),
            )
            # A new experiment's folder may not exist yet, and a filesystem with real folders
            # (an sftp server, a DirFileSystem over a disk) does not create parents on a write.
            storage.makedirs(storage.parent(paths.lease))
            storage.write_atomic(paths.lease, json.dumps(asdict(info)) + "\n")
        if not serialized:
            time.sleep(cls.SETTLE_S)
            won = read_lease(paths)
            if won is None or won.token != info.token:
                other = won.describe() if won else "another driver"
                raise ExperimentLockedError(
                    f"Another driver ({other}) took the experiment at {paths.uri} at the same "
                    "moment. Only one driver may run an experiment; let that one run."
                )
        return cls(paths, info, current)

    # -- while running -------------------------------------------------------------------------
    def start_heartbeat(self) -> None:
        interval = max(0.2, self.info.ttl_s / 6)
        self._thread = threading.Thread(
            target=self._beat, args=(interval,), name="ftnb-lease-heartbeat", daemon=True
        )
        self._thread.start()

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                if not self._write_if_ours(released=False):
                    return
            except Exception:  # a storage hiccup: try again at the next beat
                continue

    def _write_if_ours(self, released: bool) -> bool:
        """Refresh (or release) the lease if it is still ours; False once it is not.

        Under the acquisition lock on local disks, so a take-over can never land between the
        read and the write and be overwritten. Object stores have no such lock: there the
        window is one read and one PUT.
        """
        with self.paths.storage.exclusive_lock(self.paths.lease_lock):
            current = read_lease(self.paths)
            if current is None or current.token != self.token:
                self._mark_lost(current)
                return False
            self.info.heartbeat = time.time()
            self.info.released = released
            self._write()
            return True

    def _write(self) -> None:
        self.paths.storage.write_atomic(self.paths.lease, json.dumps(asdict(self.info)) + "\n")

    def _mark_lost(self, current: Optional[LeaseInfo]) -> None:
        who = current.describe() if current else "someone who removed owner.json"
        self.lost = (
            f"another driver ({who}) took over the experiment at {self.paths.uri}; this one "
            "stopped its trials and wrote nothing more"
        )

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if another driver owns the experiment now.

        Called before every write that could harm a new owner. Cheap on a local disk (a
        ``stat``; the file is re-read only when it changed); at most once a second elsewhere.
        """
        if self.lost is None:
            current = self._watcher.read()
            if current is None or current.token != self.token:
                self._mark_lost(current)
        if self.lost is not None:
            raise LeaseLostError(self.lost)

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.lost is not None:
            return
        try:
            self._write_if_ours(released=True)
        except Exception:
            pass  # a lease we could not release expires (or its pid dies) on its own

    def fence_spec(self) -> dict:
        """What a trial process needs to check that its driver still owns the experiment."""
        return {"token": self.token, "host_id": self.info.host_id, "ttl_s": self.info.ttl_s}


class _LeaseWatcher:
    """Reads ``owner.json`` cheaply and often: on a local disk a ``stat`` per call and a read
    only when the file changed; elsewhere a read at most every ``interval_s`` (or when forced),
    the last one's answer standing in between."""

    def __init__(self, paths: ExperimentPaths, interval_s: float) -> None:
        self.paths = paths
        self.interval_s = interval_s
        self._key: Any = None
        self._info: Optional[LeaseInfo] = None
        self._last = float("-inf")

    def read(self, force: bool = False) -> Optional[LeaseInfo]:
        try:
            version = self.paths.storage.cheap_version(self.paths.lease)
        except FileNotFoundError:
            return None
        if version is not None:
            if version != self._key:
                self._key, self._info = version, read_lease(self.paths)
            return self._info
        now = time.monotonic()
        if force or now - self._last >= self.interval_s:
            self._last = now
            try:
                self._info = read_lease(self.paths)
            except Exception as exc:
                if not is_transient(exc) or self._info is None:
                    raise
                # Storage is not answering: nobody can take the experiment over through it
                # either, and our own writes wait for it (ftnb.storage); keep the last answer.
        return self._info


def _command_line() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:300]
    except OSError:
        return ""


def _locked_message(paths: ExperimentPaths, current: LeaseInfo, why: str, what: str) -> str:
    return (
        f"Cannot {what} the experiment at {paths.uri}: it is being run by another driver "
        f"({current.describe()}); {why}. Two drivers must never run one experiment at once. "
        "Fix: wait for it to finish (or stop it), watch it with `ftnb status "
        f"{paths.uri}`, or, if you know that driver is gone (its machine died), take it over "
        "with Tuner.restore(path, trainable, takeover=True) or ftnb.run(..., takeover=True)."
    )


# -- trial side ---------------------------------------------------------------------------------
class Fence:
    """A trial process's check that its driver still owns the experiment.

    ``check()`` reads ``owner.json`` (on a local disk only when it changed, so every report can
    afford it; elsewhere at most every ``interval_s``, and always when ``force``) and raises
    :class:`FencedError` when the token is not the one the trial was started with, or when a
    driver on another machine has been silent for half its TTL (the new owner waits the whole
    TTL before it takes over, so the trial stops first).
    """

    def __init__(self, paths: ExperimentPaths, spec: dict, interval_s: float = 1.0) -> None:
        self.paths = paths
        self.token = spec["token"]
        self.same_host = spec.get("host_id") == host_id()
        self.ttl_s = float(spec.get("ttl_s") or DEFAULT_TTL_S)
        self._watcher = _LeaseWatcher(paths, interval_s)

    def check(self, force: bool = False) -> None:
        info = self._watcher.read(force)
        if info is None or info.token != self.token:
            who = info.describe() if info else "nobody (owner.json is gone)"
            raise FencedError(
                f"the experiment at {self.paths.uri} is now run by another driver ({who}); this "
                "trial process belongs to the previous one and stops without writing"
            )
        if info.released:
            raise FencedError("the driver released the experiment; this trial stops")
        if not self.same_host and time.time() - info.heartbeat > self.ttl_s / 2:
            raise FencedError(
                f"the driver on {info.host} has sent no heartbeat for "
                f"{time.time() - info.heartbeat:.0f} s; this trial stops before another driver "
                "takes the experiment over"
            )


def reap_processes(token: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process on this machine named after ``token`` (a previous owner's trial
    processes and their children) and wait until they are gone. Returns their pids."""
    name = process_name(token).encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/comm", "rb") as f:
                if f.read().strip() == name:
                    found.append(int(entry))
        except OSError:
            continue
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    for pid in found:
        # None once the process is gone or a zombie (dead, waiting for its parent).
        while pid_start_time(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
    return found

