"""Unit tests of the owner lease (ftnb/storage/lease.py) and the ``Driver:`` line of ``ftnb status``.

Real processes and real files throughout: a second driver is a child Python process that holds a
lease and answers commands on stdin; "another machine" is a different ``$FTNB_HOST_ID``; a stale
heartbeat is written into ``owner.json`` rather than waited for. The end-to-end behaviour (a
SIGKILLed or hung driver under ``ftnb.run`` / ``Tuner.restore``) is in test_driver_crash.py and
test_restore.py; this file pins down the pieces.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict

import pytest

import ftnb
from ftnb.cli import main
from ftnb.lifecycle.own import take_over_now
from ftnb.storage.lease import (
    DEFAULT_TTL_S,
    ExperimentLockedError,
    Fence,
    FencedError,
    Lease,
    LeaseInfo,
    LeaseLostError,
    process_name,
    read_lease,
)
from ftnb.system.processes import host_id, pid_start_time
from ftnb.execution.process_tree import end_strays_of
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths
from procs import REPO, TESTS, pid_alive, processes_named, wait_for

HOST = socket.gethostname()


@pytest.fixture(autouse=True)
def _clean_lease_env(monkeypatch):
    """Every test starts on "this machine" with the default TTL, whatever the caller's shell."""
    monkeypatch.delenv("FTNB_HOST_ID", raising=False)
    monkeypatch.delenv("FTNB_LEASE_TTL_S", raising=False)
    monkeypatch.delenv("FTNB_LEASE_HEARTBEAT_S", raising=False)


# -- helpers -----------------------------------------------------------------------------------
HOLDER = r"""
import sys
from ftnb.storage.lease import Lease, LeaseLostError
from ftnb.storage import ExperimentPaths

lease = Lease.acquire(ExperimentPaths.at(sys.argv[1]))
print("READY", lease.token, flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "check":
        try:
            lease.check()
            print("OK", flush=True)
        except LeaseLostError as exc:
            print("LOST", lease.lost is not None, str(exc).replace("\n", " "), flush=True)
    elif command == "release":
        lease.release()
        print("RELEASED", flush=True)
"""


class Holder:
    """A child Python process that acquires the lease of ``exp`` and then waits on stdin."""

    def __init__(self, exp, env=None):
        full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]),
                        PYTHONUNBUFFERED="1")
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(exp)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=full_env, cwd=REPO,
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue = queue.Queue()
        self._seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self.line()
        assert ready.startswith("READY "), ready
        self.token = ready.split()[1]

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, timeout=30.0) -> str:
        """The child's next answer (other output, e.g. a traceback, is kept for the failure)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"holder {self.pid} said nothing for {timeout}s: "
                                     f"{self._seen}") from None
            if line is None:
                raise AssertionError(f"holder {self.pid} exited: " + "\n".join(self._seen))
            self._seen.append(line)
            if line.split(" ", 1)[0] in ("READY", "OK", "LOST", "RELEASED"):
                return line

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.line()

    def kill(self):
        """SIGKILL the holder and collect it (so its pid is gone, not a zombie)."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


@pytest.fixture
def holders():
    """``start(exp, env=None)`` -> a :class:`Holder`; every one is killed at the end."""
    started: list[Holder] = []

    def start(exp, env=None):
        holder = Holder(exp, env)
        started.append(holder)
        return holder

    yield start
    for holder in started:
        holder.stop()


@pytest.fixture
def exp(tmp_path):
    """A local experiment folder that does not exist yet."""
    return tmp_path / "exp"


def _paths(exp) -> ExperimentPaths:
    return ExperimentPaths.at(str(exp))


def _owner(exp) -> dict:
    return json.loads((exp / "owner.json").read_text())


def _write_owner(exp, **fields) -> LeaseInfo:
    """Write owner.json atomically (temp file + rename, like ftnb), as a driver with ``fields``
    would have; the rest describes a lease of this process on this machine."""
    now = time.time()
    info = LeaseInfo(token=uuid.uuid4().hex, epoch=1, host=HOST, host_id=host_id(),
                     pid=os.getpid(), pid_start=pid_start_time(os.getpid()), acquired=now,
                     heartbeat=now, ttl_s=60.0)
    for key, value in fields.items():
        setattr(info, key, value)
    exp.mkdir(parents=True, exist_ok=True)
    tmp = exp / f".owner.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(asdict(info)) + "\n")
    os.replace(tmp, exp / "owner.json")
    return info


def _raises(fn, exc_type) -> bool:
    try:
        fn()
    except exc_type:
        return True
    return False


def _sleeper(name=None) -> subprocess.Popen:
    """A live child process (blocked on stdin), optionally named ``name`` in /proc/PID/comm."""
    code = "import sys\n"
    if name:
        code += f"open('/proc/self/comm', 'w').write({name!r})\n"
    code += "print('up', flush=True)\nsys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


# -- acquire, refuse, take over ------------------------------------------------------------------
def test_acquire_on_an_empty_folder_writes_epoch_1_for_this_process(exp):
    lease = Lease.acquire(_paths(exp))
    try:
        owner = _owner(exp)
        assert owner["epoch"] == 1 and lease.info.epoch == 1
        assert owner["token"] == lease.token and len(lease.token) == 32
        assert owner["pid"] == os.getpid()
        assert owner["pid_start"] == pid_start_time(os.getpid())
        assert owner["host_id"] == host_id() and owner["host"] == HOST
        assert owner["released"] is False
        assert owner["ttl_s"] == DEFAULT_TTL_S == 30.0 and owner["heartbeat_s"] == 5.0
        assert owner["acquired"] == owner["heartbeat"]
        assert lease.previous is None and lease.lost is None
        lease.check()  # ours
        assert read_lease(_paths(exp)).liveness() == (
            True, f"its process {os.getpid()} on this machine ({HOST}) is running")
    finally:
        lease.release()


def test_ttl_comes_from_the_environment_and_is_clamped(exp, monkeypatch):
    for value, expected in (("7.5", 7.5), ("0.01", 1.0), ("soon", 30.0)):
        monkeypatch.setenv("FTNB_LEASE_TTL_S", value)
        lease = Lease.acquire(_paths(exp))
        assert lease.info.ttl_s == _owner(exp)["ttl_s"] == expected, value
        lease.release()


def test_live_owner_refuses_a_second_driver_until_it_takes_over(exp, holders):
    holder = holders(exp)
    first = _owner(exp)
    assert first["pid"] == holder.pid and first["epoch"] == 1 and first["token"] == holder.token
    before = (exp / "owner.json").read_bytes()

    with pytest.raises(ExperimentLockedError) as err:
        Lease.acquire(_paths(exp), what="restore")
    message = str(err.value)
    assert f"Cannot restore the experiment at {exp}" in message
    assert f"pid {holder.pid} on {HOST}" in message
    assert f"its process {holder.pid} on this machine ({HOST}) is running" in message
    assert "takeover=True" in message and f"ftnb status {exp}" in message
    assert (exp / "owner.json").read_bytes() == before  # a refusal writes nothing
    assert holder.ask("check") == "OK"

    lease = Lease.acquire(_paths(exp), takeover=True)
    try:
        owner = _owner(exp)
        assert owner["epoch"] == 2 and owner["pid"] == os.getpid()
        assert owner["token"] == lease.token != holder.token
        assert lease.previous.token == holder.token and lease.previous.pid == holder.pid
        # The first holder, still running, finds out at its next check.
        answer = holder.ask("check")
        assert answer.startswith("LOST True "), answer
        assert f"pid {os.getpid()} on {HOST}" in answer and "took over" in answer
        assert holder.ask("check").startswith("LOST True ")  # and stays lost
        # Its release() after the takeover leaves the new owner's lease alone.
        assert holder.ask("release") == "RELEASED"
        assert _owner(exp)["token"] == lease.token and _owner(exp)["released"] is False
        lease.check()
    finally:
        lease.release()


def test_check_raises_lease_lost_once_another_driver_took_over(exp):
    first = Lease.acquire(_paths(exp))
    first.check()
    second = Lease.acquire(_paths(exp), takeover=True)
    with pytest.raises(LeaseLostError, match=rf"another driver \(pid {os.getpid()} .*took over"):
        first.check()
    assert first.lost is not None and "took over" in first.lost
    second.check()
    # owner.json removed by hand: also lost, and the message says so.
    third = Lease.acquire(_paths(exp), takeover=True)
    (exp / "owner.json").unlink()
    with pytest.raises(LeaseLostError, match="removed owner.json"):
        third.check()
    assert third.info.epoch == 3


def test_a_killed_owner_is_free_at_once_on_the_same_machine(exp, holders):
    holder = holders(exp, env={"FTNB_LEASE_TTL_S": "600"})  # a TTL nobody waits for
    assert _raises(lambda: Lease.acquire(_paths(exp)), ExperimentLockedError)
    holder.kill()
    assert read_lease(_paths(exp)).liveness() == (
        False, f"its process {holder.pid} on this machine has exited")
    started = time.monotonic()
    lease = Lease.acquire(_paths(exp))  # no takeover needed
    assert time.monotonic() - started < 5
    assert lease.info.epoch == 2 and lease.previous.token == holder.token
    lease.release()


def test_a_killed_owner_not_yet_collected_by_its_parent_is_dead(exp, holders):
    """A SIGKILLed driver whose parent has not called wait() yet is a zombie: it is dead."""
    holder = holders(exp)
    os.kill(holder.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(holder.pid), timeout=10, what="the holder to become a zombie")
    assert holder.proc.returncode is None  # not collected: /proc/PID still exists
    assert os.path.exists(f"/proc/{holder.pid}/stat")
    assert read_lease(_paths(exp)).liveness()[0] is False
    Lease.acquire(_paths(exp)).release()


def test_a_reused_pid_counts_as_dead(exp):
    other = _sleeper()
    try:
        start = pid_start_time(other.pid)
        assert start not in (None, -1)
        _write_owner(exp, pid=other.pid, pid_start=start)  # that very process: alive
        assert read_lease(_paths(exp)).liveness()[0] is True
        assert _raises(lambda: Lease.acquire(_paths(exp)), ExperimentLockedError)

        _write_owner(exp, pid=other.pid, pid_start=start + 1)  # a later process with its pid
        alive, why = read_lease(_paths(exp)).liveness()
        assert not alive and why == f"its process {other.pid} on this machine has exited (pid reused)"
        lease = Lease.acquire(_paths(exp))
        assert lease.previous.pid == other.pid and lease.info.epoch == 2
        lease.release()
        assert pid_alive(other.pid)  # nobody touched the process that now has the pid
    finally:
        _end(other)


# -- another machine: the heartbeat --------------------------------------------------------------
def test_another_machine_s_owner_lives_while_its_heartbeat_is_fresh(exp, holders, monkeypatch):
    holder = holders(exp, env={"FTNB_HOST_ID": "machine-a", "FTNB_LEASE_TTL_S": "30"})
    monkeypatch.setenv("FTNB_HOST_ID", "machine-b")
    owner = read_lease(_paths(exp))
    assert owner.host_id == "machine-a" and owner.ttl_s == 30.0
    alive, why = owner.liveness()
    assert alive and f"runs on {HOST} (pid {holder.pid})" in why and "heartbeat" in why
    # Its pid means nothing here: even dead, it counts as alive until the heartbeat is stale.
    holder.kill()
    with pytest.raises(ExperimentLockedError, match="heartbeat is .* old"):
        Lease.acquire(_paths(exp))
    assert owner.liveness(now=owner.heartbeat + 29.9)[0] is True
    assert owner.liveness(now=owner.heartbeat + 30.0)[0] is False

    stale = _write_owner(exp, token=owner.token, host_id="machine-a", pid=holder.pid,
                         pid_start=owner.pid_start, ttl_s=30.0, heartbeat=time.time() - 31)
    alive, why = read_lease(_paths(exp)).liveness()
    assert not alive and why.startswith(f"it ran on {HOST} and has sent no heartbeat for 3")
    lease = Lease.acquire(_paths(exp))  # free without takeover
    assert lease.previous.token == stale.token and lease.info.host_id == "machine-b"
    lease.release()


def test_a_driver_elsewhere_without_heartbeats_is_silent_before_it_is_dead(exp, monkeypatch):
    """Two missed beats: silent, with the seconds until it counts as dead; TTL: dead."""
    info = _write_owner(exp, host_id="machine-a", ttl_s=30.0, heartbeat_s=5.0)
    beat = info.heartbeat
    assert info.verdict(now=beat + 10.0).silent_s is None  # two beats late: not yet
    verdict = info.verdict(now=beat + 12.0)
    assert verdict.alive and verdict.silent and not verdict.alive_here
    assert verdict.silent_s == pytest.approx(12.0) and verdict.dead_in_s == pytest.approx(18.0)
    assert "silent for 12 s" in verdict.why and "counts as dead in 18 s" in verdict.why
    assert not info.verdict(now=beat + 30.0).alive
    # A lease written before heartbeat_s was recorded beats every TTL / 6.
    old = LeaseInfo.from_json({k: v for k, v in asdict(info).items() if k != "heartbeat_s"})
    assert old.beat_interval_s == 5.0 and old.verdict(now=beat + 10.5).silent


def test_another_pid_namespace_of_this_machine_is_named(exp, monkeypatch):
    name, boot, _ = host_id().split("/")
    info = _write_owner(exp, host_id=f"{name}/{boot}/pid:[1]", heartbeat=time.time() - 20)
    verdict = info.verdict()
    assert verdict.silent and "in another PID namespace" in verdict.why


def test_a_stopped_driver_on_this_machine_is_silent_and_can_be_taken_over(exp, holders):
    holder = holders(exp, env={"FTNB_LEASE_TTL_S": "600"})
    verdict = read_lease(_paths(exp)).verdict()
    assert verdict.alive_here and not verdict.silent
    with pytest.raises(ExperimentLockedError, match=rf"pid {holder.pid} .*alive on this machine"):
        take_over_now(_paths(exp))
    assert _owner(exp)["token"] == holder.token  # refused: nothing written
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        # (The signal is delivered asynchronously: wait until /proc says it is stopped.)
        verdict = wait_for(lambda: (v := read_lease(_paths(exp)).verdict()).silent and v,
                           what="the holder to be stopped")
        assert verdict.alive and not verdict.alive_here
        assert verdict.dead_in_s is None and "stopped (SIGSTOP" in verdict.why
        previous = take_over_now(_paths(exp))
    finally:
        if holder.proc.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
    assert previous.token == holder.token
    # A stopped driver of this machine is killed (it could hold the lease lock mid-beat).
    assert holder.proc.wait(timeout=10) == -signal.SIGKILL
    owner = _owner(exp)
    assert owner["epoch"] == 2 and owner["released"] is True  # fenced, and free to resume
    assert take_over_now(_paths(exp)) is None  # nothing left to take


def test_the_heartbeat_interval_comes_from_the_environment_and_is_clamped(exp, monkeypatch):
    monkeypatch.setenv("FTNB_LEASE_TTL_S", "30")
    for value, expected in (("1", 1.0), ("0.01", 0.2), ("20", 10.0), ("often", 5.0)):
        monkeypatch.setenv("FTNB_LEASE_HEARTBEAT_S", value)
        lease = Lease.acquire(_paths(exp))
        assert lease.info.beat_interval_s == _owner(exp)["heartbeat_s"] == expected, value
        lease.release()


def test_the_heartbeat_thread_refreshes_the_lease(exp, monkeypatch):
    monkeypatch.setenv("FTNB_LEASE_TTL_S", "1")  # a beat every 0.2 s
    lease = Lease.acquire(_paths(exp))
    acquired = _owner(exp)["heartbeat"]
    lease.start_heartbeat()
    try:
        wait_for(lambda: _owner(exp)["heartbeat"] > acquired, timeout=5, what="a heartbeat")
        # Seen from another machine, the beats keep it alive past its TTL.
        monkeypatch.setenv("FTNB_HOST_ID", "elsewhere")
        # (Judged as one read: under I/O load a beat's fsync may make one reading stale.)
        wait_for(lambda: (info := read_lease(_paths(exp))).heartbeat > acquired + 1.0
                 and info.liveness()[0], timeout=10,
                 what="a live lease with heartbeats for longer than the TTL")
        assert _owner(exp)["token"] == lease.token and lease.lost is None
    finally:
        lease.release()
    owner = _owner(exp)
    assert owner["released"] is True and owner["token"] == lease.token
    assert not lease._thread.is_alive()


def test_the_heartbeat_thread_notices_a_takeover_and_stops_writing(exp, monkeypatch):
    monkeypatch.setenv("FTNB_LEASE_TTL_S", "1")
    first = Lease.acquire(_paths(exp))
    first.start_heartbeat()
    try:
        # Take over right after a beat, so the takeover does not land inside the next one.
        beat = _owner(exp)["heartbeat"]
        wait_for(lambda: _owner(exp)["heartbeat"] > beat, timeout=5, what="a heartbeat")
        second = Lease.acquire(_paths(exp), takeover=True)
        wait_for(lambda: first.lost, timeout=5, what="the old owner's heartbeat to notice")
        first._thread.join(timeout=5)
        assert not first._thread.is_alive()
        assert _owner(exp)["token"] == second.token
        with pytest.raises(LeaseLostError):
            first.check()
    finally:
        first.release()
    assert _owner(exp)["token"] == second.token and _owner(exp)["released"] is False
    second.release()


class _StalledRead:
    """Holds a reader of ``owner.json`` in the middle of reading it: ``owner.json`` is swapped for
    a FIFO, the next reader blocks in it, the path then gets a regular file back (so that other
    drivers see the real lease), and :meth:`finish` lets the stalled reader read ``content``.
    That models a driver descheduled (GC pause, swap, SIGSTOP, a slow NFS read) between reading
    owner.json and writing it, deterministically and without patching anything."""

    def __init__(self, exp):
        self.path = exp / "owner.json"
        self.content = self.path.read_bytes()
        fifo = exp / ".owner.fifo"
        os.mkfifo(fifo)
        os.replace(fifo, self.path)
        self.exp = exp

    def stall(self):
        """Wait until a reader is stuck in the FIFO; then give the path a regular file back."""
        self.fd = wait_for(self._open_writer, timeout=10, what="a reader to open owner.json")
        _write_owner_bytes(self.exp, self.content)
        return self

    def _open_writer(self):
        try:
            return os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader
        except OSError:
            return None

    def finish(self):
        os.write(self.fd, self.content)
        os.close(self.fd)


def _write_owner_bytes(exp, data: bytes) -> None:
    tmp = exp / f".owner.{uuid.uuid4().hex}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, exp / "owner.json")


def _take_over_in_a_thread(exp):
    """Take the lease over from another thread; returns (thread, box with the new Lease)."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(Lease.acquire(_paths(exp),
                                                                      takeover=True)))
    thread.start()
    # A correct lease may make the takeover wait for the stalled read-check-write; give it a
    # moment, but go on either way (the stalled reader is only let go below).
    thread.join(timeout=2)
    return thread, box


def test_a_heartbeat_stalled_mid_write_never_overwrites_a_takeover(exp, monkeypatch):
    monkeypatch.setenv("FTNB_LEASE_TTL_S", "1")
    old = Lease.acquire(_paths(exp))
    old.start_heartbeat()
    try:
        stalled = _StalledRead(exp).stall()  # the old owner's next beat is stuck reading it
        thread, box = _take_over_in_a_thread(exp)
        stalled.finish()  # the beat goes on with what it read: the old lease
        thread.join(timeout=30)
        new = box[0]
        wait_for(lambda: old.lost or _owner(exp)["token"] == old.token, timeout=10,
                 what="the old owner's heartbeat to notice the takeover, or to overwrite it")
        assert _owner(exp)["token"] == new.token, "the old owner's heartbeat overwrote the takeover"
        assert old.lost is not None
        new.check()
    finally:
        old.release()


def test_a_release_stalled_mid_write_never_overwrites_a_takeover(exp):
    old = Lease.acquire(_paths(exp))
    stalled = _StalledRead(exp)
    releasing = threading.Thread(target=old.release)
    releasing.start()
    try:
        stalled.stall()  # its read of owner.json is stuck in the FIFO
        thread, box = _take_over_in_a_thread(exp)
        stalled.finish()
        thread.join(timeout=30)
        releasing.join(timeout=30)
        new = box[0]
        owner = _owner(exp)
        assert owner["token"] == new.token, "the old owner's release overwrote the takeover"
        assert owner["released"] is False
        new.check()
    finally:
        releasing.join(timeout=30)


# -- release ---------------------------------------------------------------------------------------
def test_a_released_lease_is_free(exp, holders):
    lease = Lease.acquire(_paths(exp))
    lease.release()
    owner = _owner(exp)
    assert owner["released"] is True and owner["token"] == lease.token
    assert read_lease(_paths(exp)).liveness() == (False, "it ended (finished or interrupted) and released the experiment")
    lease.release()  # twice is harmless
    # A live process that released is no owner either.
    holder = holders(exp)
    assert _owner(exp)["epoch"] == 2
    assert holder.ask("release") == "RELEASED" and _owner(exp)["released"] is True
    again = Lease.acquire(_paths(exp))
    assert again.info.epoch == 3 and again.previous.pid == holder.pid
    again.release()


@pytest.mark.parametrize("noticed", [False, True], ids=["unnoticed", "after-check"])
def test_release_after_a_takeover_writes_nothing(exp, noticed):
    first = Lease.acquire(_paths(exp))
    second = Lease.acquire(_paths(exp), takeover=True)
    if noticed:
        assert _raises(first.check, LeaseLostError)
    before = (exp / "owner.json").read_bytes()
    first.release()
    assert (exp / "owner.json").read_bytes() == before
    assert _owner(exp)["token"] == second.token and _owner(exp)["released"] is False
    second.check()
    second.release()


# -- the trial side: Fence ---------------------------------------------------------------------------
def test_fence_passes_for_the_owner_and_stops_a_superseded_trial_at_once(exp):
    lease = Lease.acquire(_paths(exp))
    spec = lease.fence_spec()
    assert spec == {"token": lease.token, "host_id": host_id(), "ttl_s": DEFAULT_TTL_S}
    fence = Fence(_paths(exp), spec, interval_s=3600)  # on a local disk the interval is moot
    for _ in range(3):
        fence.check()
    newer = Lease.acquire(_paths(exp), takeover=True)
    with pytest.raises(FencedError, match=rf"now run by another driver \(pid {os.getpid()} "):
        fence.check()
    Fence(_paths(exp), newer.fence_spec()).check()
    (exp / "owner.json").unlink()
    with pytest.raises(FencedError, match="nobody"):
        Fence(_paths(exp), newer.fence_spec()).check()


def test_fence_stops_a_trial_whose_driver_released(exp):
    lease = Lease.acquire(_paths(exp))
    fence = Fence(_paths(exp), lease.fence_spec())
    fence.check()
    lease.release()
    with pytest.raises(FencedError, match="released"):
        fence.check()


def test_fence_on_a_local_disk_rereads_only_a_changed_file(exp):
    lease = Lease.acquire(_paths(exp))
    fence = Fence(_paths(exp), lease.fence_spec(), interval_s=3600)
    fence.check()
    path = exp / "owner.json"
    # Rewritten in place with the same size and mtime (ftnb never does this): the same stat, so
    # the fence answers from what it read before, without reading the file.
    st = os.stat(path)
    foreign = path.read_text().replace(lease.token, uuid.uuid4().hex)
    with open(path, "r+") as f:
        f.write(foreign)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_ino == st.st_ino
    fence.check()
    # Replaced (a new file, as every ftnb write is): read, and the trial stops right away.
    _write_owner(exp, token=uuid.uuid4().hex)
    with pytest.raises(FencedError, match="now run by another driver"):
        fence.check()


def test_fence_of_a_trial_on_another_machine_needs_a_recent_heartbeat(exp, monkeypatch):
    monkeypatch.setenv("FTNB_HOST_ID", "machine-a")
    monkeypatch.setenv("FTNB_LEASE_TTL_S", "10")
    lease = Lease.acquire(_paths(exp))
    spec = lease.fence_spec()
    local_fence = Fence(_paths(exp), spec)  # a trial on the driver's machine
    monkeypatch.setenv("FTNB_HOST_ID", "machine-b")
    remote_fence = Fence(_paths(exp), spec)  # a trial on another machine
    remote_fence.check()

    def beat(age):
        _write_owner(exp, token=lease.token, host_id="machine-a", ttl_s=10.0,
                     heartbeat=time.time() - age)

    beat(2)  # younger than ttl/2
    remote_fence.check()
    local_fence.check()
    beat(6)  # older than ttl/2: stop before a new driver may take over at ttl
    with pytest.raises(FencedError, match=r"no heartbeat for [6-9] s"):  # 6, or a stall more
        remote_fence.check()
    local_fence.check()  # on the driver's machine the heartbeat does not matter
    beat(0)
    remote_fence.check()


# -- ending an old owner's trial processes (ftnb.execution.process_tree, since storage kills none) -
NAMED_FAMILY = r"""
import os, signal, sys
with open("/proc/self/comm", "w") as f:
    f.write(sys.argv[1])
child = os.fork()
if child == 0:  # the grandchild: it inherits the name
    signal.pause()
    os._exit(0)
print(os.getpid(), child, flush=True)
signal.pause()
"""


def test_end_strays_of_kills_an_owner_s_named_processes_and_their_children():
    token = uuid.uuid4().hex
    name = process_name(token)
    assert name == f"ftnb.{token[:10]}" and len(name) <= 15
    family = subprocess.Popen([sys.executable, "-c", NAMED_FAMILY, name],
                              stdout=subprocess.PIPE, text=True)
    unrelated = _sleeper(process_name(uuid.uuid4().hex))
    grandchild = None
    try:
        child, grandchild = map(int, family.stdout.readline().split())
        assert child == family.pid
        assert sorted(processes_named(name)) == sorted([child, grandchild])

        reaped = end_strays_of(token)
        assert sorted(reaped) == sorted([child, grandchild])
        # Gone (or zombies left for their parents to collect) by the time it returns.
        assert not pid_alive(child) and not pid_alive(grandchild)
        assert family.wait(timeout=10) == -signal.SIGKILL
        assert processes_named(name) == []
        assert pid_alive(unrelated.pid)  # another owner's process is left alone
        # Nothing of it runs any more (a grandchild nobody collects may linger as a zombie).
        assert not [pid for pid in end_strays_of(token) if pid_alive(pid)]
    finally:
        _end(family)
        if grandchild is not None and pid_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)
        _end(unrelated)


def test_end_strays_of_never_kills_the_caller():
    token = uuid.uuid4().hex
    with open("/proc/self/comm") as f:
        mine = f.read().strip()
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(process_name(token))
        assert end_strays_of(token) == []
    finally:
        with open("/proc/self/comm", "w") as f:
            f.write(mine)


# -- ftnb status: the Driver line ---------------------------------------------------------------
def tiny(config):
    ftnb.report({"score": float(config["x"])})


@pytest.fixture(scope="module")
def finished_experiment(tmp_path_factory):
    """A real, finished experiment whose driver released its lease."""
    root = tmp_path_factory.mktemp("finished")
    ftnb.Tuner(tiny, param_space={"x": ftnb.grid_search([1, 2])},
               run_config=ftnb.RunConfig(storage_path=str(root), name="tiny", verbose=0)).fit()
    return root / "tiny"


@pytest.fixture
def experiment(finished_experiment, tmp_path):
    """A copy of the finished experiment to doctor."""
    return shutil.copytree(finished_experiment, tmp_path / "tiny")


def _set_status(exp, status):
    for name in ("experiment_state.json", "experiment_state.prev.json"):
        data = json.loads((exp / name).read_text())
        data["status"] = status
        (exp / name).write_text(json.dumps(data))


def _status_output(exp, capsys) -> tuple[str, list[str]]:
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    return out, [line for line in out.splitlines() if line.startswith("Driver:")]


def test_status_of_a_finished_released_experiment_has_no_driver_line(experiment, capsys):
    owner = _owner(experiment)
    assert owner["released"] is True and owner["pid"] == os.getpid()
    out, driver = _status_output(experiment, capsys)
    assert driver == [] and "Resume" not in out and "Updated " in out


def test_status_names_a_live_driver(experiment, capsys):
    _set_status(experiment, "RUNNING")
    lease = Lease.acquire(_paths(experiment), what="restore")
    try:
        _, driver = _status_output(experiment, capsys)
        assert len(driver) == 1, driver
        assert driver[0].startswith(f"Driver: pid {os.getpid()} on {HOST}, since ")
        assert driver[0].endswith(
            f", alive (its process {os.getpid()} on this machine ({HOST}) is running)")
        # The same from another process (the command, as a user runs it).
        proc = subprocess.run([sys.executable, "-m", "ftnb", "status", str(experiment)],
                              capture_output=True, text=True, timeout=60, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=REPO))
        assert proc.returncode == 0, proc.stderr
        assert driver[0] in proc.stdout.splitlines()
    finally:
        lease.release()


@pytest.mark.parametrize("status", ["RUNNING", "INTERRUPTED"])
def test_status_of_an_experiment_whose_driver_died_says_how_to_resume(
        experiment, holders, capsys, status):
    holder = holders(experiment)
    holder.kill()
    _set_status(experiment, status)
    _, driver = _status_output(experiment, capsys)
    assert driver == [
        f"Driver: pid {holder.pid} on {HOST}, since {_since(experiment)}, gone (its process "
        f"{holder.pid} on this machine has exited). Resume with "
        f"ftnb.Tuner.restore({str(experiment)!r}, <trainable>).fit(), or run the same "
        "ftnb.run(...) again"
    ]


def _set_trials_running(exp):
    """The trials as a driver killed mid-run leaves them: RUNNING in the state and trial.json."""
    for name in ("experiment_state.json", "experiment_state.prev.json"):
        data = json.loads((exp / name).read_text())
        for trial in data["trials"]:
            trial["status"] = "RUNNING"
        (exp / name).write_text(json.dumps(data))
    for record in exp.glob("*/trial.json"):
        data = json.loads(record.read_text())
        data["status"] = "RUNNING"
        record.write_text(json.dumps(data))


def test_a_dead_drivers_experiment_and_trials_read_as_interrupted(experiment, holders, capsys):
    _set_status(experiment, "RUNNING")
    _set_trials_running(experiment)
    stored = (experiment / "experiment_state.json").read_bytes()
    holder = holders(experiment)
    # While its driver lives, it is RUNNING, trials included.
    out, _ = _status_output(experiment, capsys)
    assert out.startswith("Experiment tiny: RUNNING | 2 RUNNING |"), out
    holder.kill()
    out, _ = _status_output(experiment, capsys)
    assert out.startswith("Experiment tiny: INTERRUPTED | 2 INTERRUPTED |"), out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "_0000" in line]
    assert len(rows) == 2 and all("| INTERRUPTED |" in row for row in rows), rows
    assert main(["ls", str(experiment.parent)]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["tiny", "INTERRUPTED"] in [row[:2] for row in listed], listed
    # Only the reading says so: the state still says RUNNING, for the restore to resume.
    assert (experiment / "experiment_state.json").read_bytes() == stored
    state = ExperimentState.load(_paths(experiment)).merge_trial_records(_paths(experiment))
    assert state.status == "RUNNING" and {t.status for t in state.trials} == {"RUNNING"}


def test_status_of_a_driver_on_a_silent_machine_says_how_to_resume(experiment, capsys):
    _set_status(experiment, "RUNNING")
    _write_owner(experiment, host_id="machine-a", host="machine-a", ttl_s=60.0,
                 heartbeat=time.time() - 120)
    _, driver = _status_output(experiment, capsys)
    assert len(driver) == 1
    assert "gone (it ran on machine-a and has sent no heartbeat for 12" in driver[0]
    assert f"Resume with ftnb.Tuner.restore({str(experiment)!r}, <trainable>)" in driver[0]
    # Fresh heartbeat: alive, however dead its pid looks from here.
    _write_owner(experiment, host_id="machine-a", host="machine-a", pid=2 ** 22 + 1)
    _, driver = _status_output(experiment, capsys)
    assert len(driver) == 1 and ", alive (it runs on machine-a" in driver[0]


@pytest.mark.parametrize("status", ["FINISHED", "ERRORED"])
def test_status_of_a_stopped_experiment_whose_driver_died_has_no_driver_line(
        experiment, holders, capsys, status):
    holder = holders(experiment)
    holder.kill()  # died after the final state, before it released the lease
    _set_status(experiment, status)
    _, driver = _status_output(experiment, capsys)
    assert driver == []


def _since(exp) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_owner(exp)["acquired"]))


# -- on S3 -------------------------------------------------------------------------------------------
@pytest.mark.s3
def test_lease_on_s3_refuses_a_live_owner_and_takes_over(s3_storage):
    url, fs = s3_storage
    paths = ExperimentPaths.at(url + "/exp", fs)
    assert not paths.storage.is_local
    first = Lease.acquire(paths)
    owner = json.loads(fs.cat_file(paths.storage.join(paths.dir, "owner.json")))
    assert owner["epoch"] == 1 and owner["token"] == first.token and owner["pid"] == os.getpid()
    first.check()
    fence = Fence(paths, first.fence_spec(), interval_s=3600)
    fence.check()

    with pytest.raises(ExperimentLockedError, match=rf"pid {os.getpid()} .*takeover=True"):
        Lease.acquire(ExperimentPaths.at(url + "/exp", fs))
    assert read_lease(paths).token == first.token

    second = Lease.acquire(ExperimentPaths.at(url + "/exp", fs), takeover=True)
    assert second.info.epoch == 2 and second.previous.token == first.token
    assert read_lease(paths).token == second.token
    # Off a local disk, check() reads owner.json at most once a second: it notices soon.
    wait_for(lambda: _raises(first.check, LeaseLostError), timeout=10,
             what="the old owner to notice the takeover")
    assert first.lost is not None
    fence.check()  # within its interval, the fence answers from its last read...
    with pytest.raises(FencedError):
        fence.check(force=True)  # ...and a forced check reads
    first.release()
    assert read_lease(paths).token == second.token and not read_lease(paths).released
    second.release()
    assert read_lease(paths).released


@pytest.mark.s3
def test_two_simultaneous_acquires_on_s3_have_one_winner(s3_storage, monkeypatch):
    url, fs = s3_storage
    # Without the settle delay: on S3 the acquisition is a compare-and-swap (test_lease_s3.py).
    monkeypatch.setattr(Lease, "SETTLE_S", 0.0)
    barrier = threading.Barrier(2)
    outcomes: list = []

    def acquire():
        barrier.wait(timeout=30)
        try:
            outcomes.append(Lease.acquire(ExperimentPaths.at(url + "/race", fs)))
        except ExperimentLockedError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=acquire) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    winners = [o for o in outcomes if isinstance(o, Lease)]
    assert len(outcomes) == 2 and len(winners) == 1, outcomes
    assert read_lease(ExperimentPaths.at(url + "/race", fs)).token == winners[0].token
    winners[0].release()
