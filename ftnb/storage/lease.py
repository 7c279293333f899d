"""The owner lease: one driver runs an experiment at a time, and nothing of a dead or superseded
driver writes into the experiment once another driver owns it.

The lease is ``owner.json`` in the experiment folder::

    {"token": "9f3c...", "epoch": 4, "host": "gpu-7", "host_id": "gpu-7/<boot id>/<pid ns>",
     "pid": 8123, "pid_start": 1234567, "acquired": ..., "heartbeat": ..., "ttl_s": 30,
     "heartbeat_s": 5, "released": false}

* A driver **acquires** it before it touches the experiment (a new experiment, or a restore). A
  lease held by a live owner is refused (:class:`ExperimentLockedError`) unless the caller asks
  to take over. Every change of ``owner.json`` (acquiring, a heartbeat, releasing) is a
  read-check-write that no other can split: on local disks it is serialized with ``flock`` on
  ``.owner.lock``; on S3 the write is a compare-and-swap (``If-Match`` the ETag read, or
  ``If-None-Match: *`` for a new lease: :meth:`Storage.write_if`), so of two simultaneous
  acquisitions one is refused at once, and a heartbeat or release refused because a takeover
  landed after its read finds the new token and stops (:class:`LeaseLostError`). An
  acquisition refused because the lease it read beat (or was released) meanwhile judges it
  again, once. On other object stores (GCS, and an S3 server that does not honour the
  conditions, found out by a probe) there is neither: the winner of an acquisition is
  whoever's token reads back after a settle delay (:attr:`Lease.SETTLE_S`), and a takeover
  landing between a heartbeat's read and its PUT is overwritten: both drivers write until the
  new one's next heartbeat finds the old token and stops it.
* **Liveness.** On the owner's own machine (same host id: hostname, boot id and PID namespace)
  the owner is alive exactly while its process is (pid and start time). From another machine it
  is alive while its heartbeat is younger than ``ttl_s``; the owner refreshes it every
  ``heartbeat_s`` (``ttl_s / 6`` unless ``$FTNB_LEASE_HEARTBEAT_S`` says otherwise) from a
  thread, and stops (:class:`LeaseLostError`) when it finds another token.
* **Silence** (:meth:`LeaseInfo.verdict`). A driver whose death cannot be proven from here (it
  runs on another machine, or in another PID namespace of this one: a container, a spawner's
  namespace) and that has sent no heartbeat for two of its intervals is *silent*: it still
  counts as alive until ``ttl_s``, but every view says for how long it has been silent and
  when it will count as dead, and offers the takeover. A driver on this machine whose process
  is stopped (SIGSTOP, Ctrl+Z) is silent too, and never counts as dead while it exists.
* **Taking over** (``Lease.acquire(takeover=True)``, what ``Tuner.restore(takeover=True)`` and
  ``ftnb resume --takeover`` do through :func:`ftnb.lifecycle.own.take_over_now`): at once, with
  a new epoch and token, unless the driver is provably alive on this machine (same host id,
  its process there and neither a zombie nor stopped): that one is refused
  (:func:`refuse_takeover_of_live_driver`). A driver stopped on this machine is killed first,
  by the lifecycle (:func:`ftnb.lifecycle.own.end_stopped_driver`; storage kills nothing; its
  trials die with it): it may be stopped inside a heartbeat,
  holding the lease lock, and continued it could only be a driver without a lease. Taking over a
  driver that is in fact alive on another machine is safe: fencing makes it stop writing (a
  driver there stopped inside a heartbeat holds the lock of a shared disk until it is
  continued or killed, and the takeover waits for it, saying so after 5 s).
* **Fencing.** Every trial process carries its driver's token and checks it
  (:class:`Fence`) before it persists anything; a trial whose token was replaced, or whose
  driver on another machine went silent for half the TTL, ends without writing. On the same
  machine the new owner also ends the old owner's trial processes, named ``ftnb.<token
  prefix>`` (:func:`process_name`), and what they started: not here (storage kills no trial)
  but in :func:`ftnb.lifecycle.own.end_strays_of_driver`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..system.processes import command_line, host_id, is_stopped, pid_start_time, process_state
from . import LEASE_FILE, ExperimentPaths, is_transient
from ..wording import ftnb_command

__all__ = [
    "ExperimentLockedError",
    "Fence",
    "FencedError",
    "Lease",
    "LeaseInfo",
    "LeaseLostError",
    "Liveness",
    "fence_out",
    "process_name",
    "refuse_takeover_of_live_driver",
]

DEFAULT_TTL_S = 30.0
#: A heartbeat every TTL / 6 by default: a driver counts as silent after two missed beats and
#: as dead after six.
BEATS_PER_TTL = 6
#: How many heartbeat intervals without one make a driver *silent* (one late beat, on a slow
#: object store, does not).
SILENT_AFTER_BEATS = 2


def _ttl() -> float:
    try:
        return max(1.0, float(os.environ.get("FTNB_LEASE_TTL_S", DEFAULT_TTL_S)))
    except ValueError:
        return DEFAULT_TTL_S


def _heartbeat_interval(ttl_s: float) -> float:
    """``$FTNB_LEASE_HEARTBEAT_S`` (clamped between 0.2 s and a third of the TTL, so that a
    driver is silent before it is dead), else ``ttl_s / 6``."""
    default = ttl_s / BEATS_PER_TTL
    try:
        value = float(os.environ.get("FTNB_LEASE_HEARTBEAT_S", default))
    except ValueError:
        value = default
    return max(0.2, min(value, ttl_s / (SILENT_AFTER_BEATS + 1)))


class ExperimentLockedError(RuntimeError):
    """The experiment is owned by a live driver: it cannot be run twice at once."""


class LeaseLostError(RuntimeError):
    """This driver's lease was taken over by another driver: it must stop writing."""


class FencedError(RuntimeError):
    """A trial process found that its driver no longer owns the experiment."""


def process_name(token: str) -> str:
    """The name (``/proc/PID/comm``, 15 characters at most) of an owner's trial processes."""
    return f"ftnb.{token[:10]}"


@dataclass(frozen=True)
class Liveness:
    """A lease's owner as seen from this process (:meth:`LeaseInfo.verdict`).

    ``alive``: it counts as alive (a new driver needs a takeover); ``why``: one line saying so.
    ``silent_s``: how long it has been silent, when it is (no heartbeat for two of its
    intervals, its death not provable from here; or stopped on this machine), else None.
    ``dead_in_s``: in how many seconds a silent driver will count as dead (None when it never
    will on its own: a stopped process on this machine). ``alive_here``: provably alive on this
    machine (its process runs), so a takeover is refused.
    """

    alive: bool
    why: str
    silent_s: Optional[float] = None
    dead_in_s: Optional[float] = None
    alive_here: bool = False

    @property
    def silent(self) -> bool:
        """Alive as far as anyone can prove, but silent: the views offer the takeover."""
        return self.alive and self.silent_s is not None


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
    #: How often its owner refreshes the heartbeat (None in leases written before it was
    #: recorded: ``ttl_s / 6``).
    heartbeat_s: Optional[float] = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict) -> "LeaseInfo":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def beat_interval_s(self) -> float:
        """How often its owner refreshes the heartbeat."""
        return float(self.heartbeat_s or self.ttl_s / BEATS_PER_TTL)

    def liveness(self, now: Optional[float] = None) -> tuple[bool, str]:
        """(alive, why) as seen from this process (:meth:`verdict` in short)."""
        verdict = self.verdict(now)
        return verdict.alive, verdict.why

    def verdict(self, now: Optional[float] = None) -> Liveness:
        """Whether its owner counts as alive, why, and whether it is silent (see
        :class:`Liveness`), as seen from this process at ``now`` (default: now)."""
        now = time.time() if now is None else now
        if self.released:
            return Liveness(False, "it ended (finished or interrupted) and released the experiment")
        age = max(0.0, now - self.heartbeat)
        if self.host_id == host_id():
            state = process_state(self.pid, self.pid_start)
            if state == "exited":
                return Liveness(False, f"its process {self.pid} on this machine has exited")
            if state == "reused":
                return Liveness(False, f"its process {self.pid} on this machine has exited "
                                       "(pid reused)")
            if is_stopped(self.pid):
                # Not provably alive: it beats no more and may never be continued; not dead
                # either: SIGCONT would wake it (and fencing would then stop it).
                return Liveness(True, (
                    f"its process {self.pid} on this machine ({self.host}) is stopped (SIGSTOP "
                    f"or Ctrl+Z) and has been silent for {age:.0f} s; it counts as dead only "
                    "once it exits"), silent_s=age)
            return Liveness(True, f"its process {self.pid} on this machine ({self.host}) is "
                                  "running", alive_here=True)
        if age >= self.ttl_s:
            return Liveness(False, f"it ran on {self.host} and has sent no heartbeat for "
                                   f"{age:.0f} s")
        if age > SILENT_AFTER_BEATS * self.beat_interval_s:
            dead_in = self.ttl_s - age
            return Liveness(True, (
                f"it runs on {self._where()} (pid {self.pid}) but has been silent for "
                f"{age:.0f} s (a heartbeat is due every {self.beat_interval_s:g} s); it counts "
                f"as dead in {dead_in:.0f} s"), silent_s=age, dead_in_s=dead_in)
        return Liveness(True, (
            f"it runs on {self.host} (pid {self.pid}) and its heartbeat is {age:.0f} s old "
            f"(it counts as dead after {self.ttl_s:.0f} s without one)"))

    def _where(self) -> str:
        """Its machine; "another PID namespace of this machine" when only that differs (a
        container, a spawner's namespace), where its pid cannot be checked from here."""
        mine, theirs = host_id().split("/"), self.host_id.split("/")
        if len(mine) == len(theirs) == 3 and mine[:2] == theirs[:2] and mine[2] != theirs[2]:
            return f"{self.host} in another PID namespace (a container?)"
        return self.host

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired))
        return f"pid {self.pid} on {self.host}, since {started}"


def refuse_if_owned(paths: ExperimentPaths, what: str) -> Optional[LeaseInfo]:
    """The current lease, after raising :class:`ExperimentLockedError` if a live driver holds
    it (``what``: the refused action, for the message)."""
    current = read_lease(paths)
    _refuse_live(paths, current, what)
    return current


def _refuse_live(paths: ExperimentPaths, current: Optional[LeaseInfo], what: str) -> None:
    """Raise :class:`ExperimentLockedError` if ``current`` is a live driver's lease."""
    if current is not None:
        alive, why = current.liveness()
        if alive:
            raise ExperimentLockedError(_locked_message(paths, current, why, what))


def read_lease(paths: ExperimentPaths) -> Optional[LeaseInfo]:
    """The current lease, or None when there is none (or it is unreadable)."""
    try:
        return _parse_lease(paths.storage.read_bytes(paths.lease))
    except FileNotFoundError:
        return None


def _read_lease_versioned(paths: ExperimentPaths) -> tuple[Optional[LeaseInfo], Optional[str]]:
    """The current lease (as :func:`read_lease`) and the version of ``owner.json`` it was read
    from, for a conditional write of the next one (:meth:`Storage.write_if`)."""
    data, version = paths.storage.read_versioned(paths.lease)
    return _parse_lease(data), version


def _parse_lease(data: Optional[bytes]) -> Optional[LeaseInfo]:
    if data is None:
        return None
    try:
        return LeaseInfo.from_json(json.loads(data))
    except (ValueError, TypeError):
        return None


def _lease_json(info: LeaseInfo) -> str:
    return json.dumps(asdict(info)) + "\n"


def _new_lease_info(current: Optional[LeaseInfo]) -> LeaseInfo:
    """A lease for this process, one epoch past ``current`` (the lease it replaces, if any)."""
    now = time.time()
    ttl = _ttl()
    return LeaseInfo(
        token=uuid.uuid4().hex,
        epoch=(current.epoch + 1) if current is not None else 1,
        host=socket.gethostname(),
        host_id=host_id(),
        pid=os.getpid(),
        pid_start=pid_start_time(os.getpid()),
        acquired=now,
        heartbeat=now,
        ttl_s=ttl,
        command=command_line(),
        heartbeat_s=_heartbeat_interval(ttl),
    )


def live_lease(paths: ExperimentPaths) -> Optional[LeaseInfo]:
    """The lease of the driver that owns the experiment now, or None when no live driver does."""
    current = read_lease(paths)
    return current if current is not None and current.liveness()[0] else None


def refuse_takeover_of_live_driver(paths: ExperimentPaths, current: Optional[LeaseInfo] = None,
                                   what: str = "take over") -> None:
    """Raise :class:`ExperimentLockedError` if the experiment's driver is provably alive on this
    machine (same host id, its process there and neither a zombie nor stopped): taking over
    from it would only start a second driver beside a working one. ``current``: the lease, if
    read already."""
    current = current if current is not None else read_lease(paths)
    if current is None:
        return
    verdict = current.verdict()
    if verdict.alive_here:
        raise ExperimentLockedError(
            f"Cannot {what} the experiment at {paths.uri}: its driver ({current.describe()}) "
            f"is alive on this machine: {verdict.why}. A takeover is for a driver whose death "
            "cannot be proven (its machine or container is gone, or it is stopped). Fix: stop "
            f"it (`{ftnb_command()} stop {paths.uri}`), or kill {current.pid} if it hangs, then resume."
        )


def fence_out(paths: ExperimentPaths, previous: Optional[LeaseInfo]) -> None:
    """Once the lease of ``previous`` (a driver that did not release it) is taken: make sure
    none of its trials writes any more. Its trials on another machine check the lease before
    every write (at most every second on object stores): wait that long. Those of this machine
    the caller ends (:func:`ftnb.lifecycle.own.end_strays_of_driver`)."""
    if previous is None or previous.released:
        return
    if previous.host_id != host_id():
        time.sleep(max(0.5, paths.storage.poll_interval_s))


class Lease:
    """A driver's hold on an experiment; see the module docstring."""

    SETTLE_S = 0.5  # storage without lock or compare-and-swap: the wait before reading back
    LOCK_WAIT_NOTE_S = 5.0  # how long to wait for the lease lock before saying so

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
        # Acquisitions are serialized where the storage has a lock (a local or NFS disk), and
        # are a compare-and-swap of owner.json where it has conditional writes (S3); elsewhere
        # the winner is whoever's token reads back after a settle delay. A driver of another
        # machine stopped inside a heartbeat holds that lock until it runs again: say so,
        # rather than wait in silence.
        waiting = threading.Timer(cls.LOCK_WAIT_NOTE_S, _say_waiting_for_lock, (paths,))
        waiting.daemon = True
        waiting.start()
        for last_try in (False, True):
            with contextlib.ExitStack() as stack:
                stack.callback(waiting.cancel)
                serialized = stack.enter_context(storage.exclusive_lock(paths.lease_lock))
                waiting.cancel()
                current, version = _read_lease_versioned(paths)
                if not takeover:
                    _refuse_live(paths, current, what)
                info = _new_lease_info(current)
                # A new experiment's folder may not exist yet, and a filesystem with real
                # folders (an sftp server, a DirFileSystem over a disk) does not create parents
                # on a write.
                storage.makedirs(storage.parent(paths.lease))
                written = storage.write_if(paths.lease, _lease_json(info), version)
                if serialized:
                    # A driver killed while it wrote owner.json left its temporary file behind;
                    # only a holder of this lock writes one, so none is being written now.
                    storage.remove_leftover_temps(storage.parent(paths.lease),
                                                  frozenset({LEASE_FILE}))
            if written is None:  # no compare-and-swap here
                if not serialized:
                    cls._settle(paths, info)
                break
            if written:
                break
            # owner.json changed between the read and the conditional write. The lease read
            # beat (or was released) meanwhile: judge it again, once. Another token: another
            # driver acquired it first.
            won = read_lease(paths)
            if last_try or won is None or current is None or won.token != current.token:
                raise ExperimentLockedError(_lost_race_message(paths, won))
        return cls(paths, info, current)

    @classmethod
    def _settle(cls, paths: ExperimentPaths, info: LeaseInfo) -> None:
        """On storage with neither a lock nor conditional writes: wait :attr:`SETTLE_S`, then
        raise :class:`ExperimentLockedError` unless our token reads back (the last of
        simultaneous writers wins)."""
        time.sleep(cls.SETTLE_S)
        won = read_lease(paths)
        if won is None or won.token != info.token:
            raise ExperimentLockedError(_lost_race_message(paths, won))

    # -- while running -------------------------------------------------------------------------
    def start_heartbeat(self) -> None:
        interval = self.info.beat_interval_s
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

        A take-over can never land between the read and the write and be overwritten: on
        local disks both happen under the acquisition lock; on S3 the write is conditional on
        owner.json being unchanged since the read, and a refused write reads it again (a
        takeover's token: the lease is lost). On other object stores there is no such guard:
        there the window is one read and one PUT.
        """
        storage = self.paths.storage
        with storage.exclusive_lock(self.paths.lease_lock):
            while True:
                current, version = _read_lease_versioned(self.paths)
                if current is None or current.token != self.token:
                    self._mark_lost(current)
                    return False
                self.info.heartbeat = time.time()
                self.info.released = released
                if storage.write_if(self.paths.lease, _lease_json(self.info),
                                    version) is not False:
                    return True
                # Refused: owner.json changed since the read. Read it again: another token is
                # a takeover; ours is a write of this driver's (a release beside a heartbeat),
                # to write over.

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


def _say_waiting_for_lock(paths: ExperimentPaths) -> None:
    """One line on stderr: an acquisition has waited :attr:`Lease.LOCK_WAIT_NOTE_S` for the
    lease lock, and who holds it."""
    import sys

    current = read_lease(paths)
    who = f"its driver ({current.describe()})" if current is not None else "another driver"
    print(f"ftnb: waiting for the lease lock of {paths.uri} (.owner.lock), which {who} has "
          f"held for over {Lease.LOCK_WAIT_NOTE_S:g} s: a driver stopped inside a heartbeat "
          "(SIGSTOP, a frozen container or machine) holds it until it runs again or is "
          "killed; this goes on then.", file=sys.stderr, flush=True)


def _lost_race_message(paths: ExperimentPaths, won: Optional[LeaseInfo]) -> str:
    other = won.describe() if won else "another driver"
    return (f"Another driver ({other}) took the experiment at {paths.uri} at the same moment. "
            "Only one driver may run an experiment; let that one run.")


def _locked_message(paths: ExperimentPaths, current: LeaseInfo, why: str, what: str) -> str:
    return (
        f"Cannot {what} the experiment at {paths.uri}: it is being run by another driver "
        f"({current.describe()}); {why}. Two drivers must never run one experiment at once. "
        f"Fix: wait for it to finish (or stop it), watch it with `{ftnb_command()} status "
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

