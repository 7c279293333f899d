"""The process that copies local trials' output from their pipes to their files.

Each rank of a local attempt writes its stdout and stderr into pipes. Their read ends are
handed (``SCM_RIGHTS`` over a Unix socket) to a pump server: a small process per
:class:`~ftnb.execution.local.LocalProcessExecutor`, started once with it (like the fork
server, not per attempt), which runs a :class:`~ftnb.execution.output_pump.PumpedOutput` per
pipe into the trial's capped file. It is not the driver, so a driver that stops running
(SIGSTOP, a debugger, a hung driver, a driver "on another machine" taken over by a new one)
stops neither the copying nor the trials: a trial never blocks on a full pipe, a fenced ghost
trial reaches its next fenced write and stops, and its last words (the fencing error, a
segfault's traceback) reach its file.

Protocol (``SOCK_SEQPACKET``, one JSON object a message):

* driver -> server: ``{"op": "pump", "id": N, "path": P, "max_bytes": M}`` with the pipe's
  read end attached; ``{"op": "give_up", "id": N}``: stop waiting for that pipe's writers (a
  process that escaped its attempt's end holds it); ``{"op": "sweep", "marker": M, "name": N,
  "cgroup": C}``: once the driver is gone, end that attempt's processes first (the "driver" is
  then a Ray actor hosting one rank, see :mod:`ftnb.execution.ray_rank_processes`).
* server -> driver: ``{"op": "ended", "id": N}`` once the pipe is closed (or given up) and
  everything read from it is in the file, which is closed.

Lifetime: the server lives as long as the driver's end of the socket is open. At its EOF (the
driver exited, however: a SIGKILL included) it goes on copying the pipes it has until they
close (the trials die with their fork server), :data:`DRAIN_AFTER_DRIVER_S` at most, then exits.
It runs in its own session (Ctrl+C and Ctrl+Z in the driver's terminal are not for it) and
without ``FTNB_ATTEMPT`` (no attempt's end sweeps it). ``PumpServer(detached=True)`` makes it
nobody's child (its first process forks it and exits): a Ray worker's children die with it.

Threading: :class:`PumpServer` (the driver's side) is used from the executor's thread; a lock
guards it all the same.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

from .output_pump import PumpedOutput, widen_pipe
from .process_tree import ATTEMPT_VARIABLE

__all__ = ["DRAIN_AFTER_DRIVER_S", "PumpServer", "serve"]

#: How long the server goes on copying open pipes once its driver is gone.
DRAIN_AFTER_DRIVER_S = 10.0
#: How long a given-up pump takes to say it ended (its thread polls every 0.2 s).
_GIVE_UP_S = 1.0
_MESSAGE = 64 << 10


class PumpServer:
    """The driver's handle on its pump server, started by the constructor.

    >>> server = PumpServer()
    >>> ident = server.pump(read_fd, "/exp/trial/stdout", 64 << 20)  # read_fd is now its
    >>> server.wait_ended([ident], timeout=5.0)
    True
    """

    def __init__(self, detached: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != ATTEMPT_VARIABLE}
        here = os.path.dirname(os.path.abspath(__file__))
        # The server needs this module and output_pump alone: its parent packages are stubs,
        # so it starts in milliseconds, without ftnb's imports (hundreds of them).
        code = (f"import sys, types\n"
                f"for name, path in (('ftnb', {os.path.dirname(here)!r}), "
                f"('ftnb.execution', {here!r})):\n"
                f"    sys.modules[name] = types.ModuleType(name); "
                f"sys.modules[name].__path__ = [path]\n"
                f"from ftnb.execution.pump_server import serve\n"
                f"serve({theirs.fileno()}, detached={detached!r})\n")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code], pass_fds=(theirs.fileno(),), env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if detached else subprocess.DEVNULL,
                start_new_session=True)
        finally:
            theirs.close()
        self._pid = self.process.pid
        if detached:  # the server is the grandchild, which says its pid; its parent exits
            try:
                assert self.process.stdout is not None
                self._pid = int(self.process.stdout.readline() or 0)
            except ValueError:
                self._pid = 0
            finally:
                if self.process.stdout is not None:
                    self.process.stdout.close()
                self.process.wait()
        self._detached = detached
        self._sock: Optional[socket.socket] = ours
        self._lock = threading.Lock()
        self._next = 0
        self._ended: set[int] = set()

    @property
    def pid(self) -> int:
        return self._pid

    def alive(self) -> bool:
        if self._detached:
            return self._sock is not None and _pid_running(self._pid)
        return self._sock is not None and self.process.poll() is None

    def sweep_at_exit(self, marker: str, name: Optional[str], cgroup: Optional[str]) -> None:
        """Once this process is gone (however it ended: a SIGKILL included), the server ends
        the processes of the attempt ``marker`` (this rank's, exactly), named ``name`` or in
        the cgroup folder ``cgroup``, before it finishes the pipes: for a process that hosts
        an attempt and is killed with it (a Ray actor), whose strays nobody else would end."""
        with self._lock:
            self._send({"op": "sweep", "marker": marker, "name": name, "cgroup": cgroup})

    def pump(self, read_fd: int, path: str, max_bytes: int) -> int:
        """Hand the pipe's read end ``read_fd`` to the server (it is closed here) to copy into
        ``path``, capped at ``max_bytes``. Returns its id, for :meth:`wait_ended`."""
        try:
            widen_pipe(read_fd)  # room for the output while the server reads the message
            with self._lock:
                if self._sock is None:
                    raise OSError("the output pump server is closed")
                self._next += 1
                ident = self._next
                message = json.dumps({"op": "pump", "id": ident, "path": path,
                                      "max_bytes": max_bytes}).encode()
                socket.send_fds(self._sock, [message], [read_fd])
        finally:
            os.close(read_fd)
        return ident

    def give_up(self, idents: list[int]) -> None:
        """Stop waiting for these pipes' writers."""
        with self._lock:
            for ident in idents:
                if ident not in self._ended:
                    self._send({"op": "give_up", "id": ident})

    def wait_ended(self, idents: list[int], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for these pipes to be closed and their files
        complete; then give up on the others, waiting a moment more for them. Whether all
        ended in time. Their ids are forgotten either way."""
        wanted = set(idents)
        deadline = time.monotonic() + timeout
        with self._lock:
            done = self._receive_until(wanted, deadline)
            if not done:
                for ident in wanted - self._ended:
                    self._send({"op": "give_up", "id": ident})
                self._receive_until(wanted, time.monotonic() + _GIVE_UP_S)
            self._ended -= wanted
        return done

    def _receive_until(self, wanted: set[int], deadline: float) -> bool:
        while not wanted <= self._ended:
            left = deadline - time.monotonic()
            if self._sock is None or left <= 0:
                return False
            if not select.select([self._sock], [], [], left)[0]:
                continue
            try:
                data = self._sock.recv(_MESSAGE)
            except OSError:
                data = b""
            if not data:  # the server died: nobody will say more
                self._sock.close()
                self._sock = None
                return False
            message = json.loads(data)
            if message.get("op") == "ended":
                self._ended.add(message["id"])
        return True

    def _send(self, message: dict) -> None:
        if self._sock is None:
            return
        try:
            self._sock.send(json.dumps(message).encode())
        except OSError:
            pass

    def close(self) -> None:
        """Let the server go: it finishes the pipes it has, then exits (see the module)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        try:  # at once when its pipes are closed (the attempts ended): reaped here
            self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass


def _pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def _detach() -> None:
    """In the server's first process: fork; the parent says the child's pid and exits, so the
    server is nobody's child (a Ray worker's children are killed with it, and it must outlive
    the worker to end its strays)."""
    child = os.fork()
    if child:
        os.write(1, f"{child}\n".encode())
        os._exit(0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _sweep(message: Optional[dict]) -> None:
    """The attempt's processes, once the process that hosted it is gone (see
    :meth:`PumpServer.sweep_at_exit`)."""
    if not message:
        return
    from .process_tree import AttemptCgroup, kill_marked

    if message.get("cgroup"):
        AttemptCgroup(message["cgroup"]).end()
    kill_marked(message["marker"], message.get("name"), exact=True)


def serve(fd: int, detached: bool = False) -> None:
    """The server's main loop, on the socket ``fd`` (see the module)."""
    import signal

    if detached:
        _detach()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    sweep: Optional[dict] = None
    send_lock = threading.Lock()
    pumps: dict[int, PumpedOutput] = {}
    pumps_lock = threading.Lock()

    def ended(ident: int, pump: PumpedOutput) -> None:
        pump.release()
        with pumps_lock:
            pumps.pop(ident, None)
        with send_lock:
            try:
                sock.send(json.dumps({"op": "ended", "id": ident}).encode())
            except OSError:
                pass  # the driver is gone

    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        message = json.loads(data)
        ident = message.get("id")
        if message.get("op") == "pump" and fds:
            for extra in fds[1:]:
                os.close(extra)
            try:
                pump = PumpedOutput(fds[0], message["path"], max_bytes=message["max_bytes"],
                                    name=f"pump-{ident}",
                                    on_end=lambda p, i=ident: ended(i, p))
            except OSError as exc:  # the file cannot be opened: the pipe is still drained
                print(f"ftnb: could not write a trial's output to {message['path']}: {exc}",
                      file=sys.stderr)
                pump = PumpedOutput(fds[0], os.devnull, max_bytes=message["max_bytes"],
                                    on_end=lambda p, i=ident: ended(i, p))
            with pumps_lock:
                if not pump.ended:
                    pumps[ident] = pump
        elif message.get("op") == "sweep":
            sweep = message
        elif message.get("op") == "give_up":
            with pumps_lock:
                pump = pumps.get(ident)
            if pump is not None:
                pump.give_up()
        else:
            for extra in fds:
                os.close(extra)
    # The driver is gone: its trials die with its fork server, closing their pipes (an
    # attempt's host that is gone leaves its processes to be ended here: then they close).
    _sweep(sweep)
    deadline = time.monotonic() + DRAIN_AFTER_DRIVER_S
    while time.monotonic() < deadline:
        with pumps_lock:
            if not pumps:
                break
        time.sleep(0.05)
    with pumps_lock:
        left = list(pumps.values())
    for pump in left:
        pump.give_up()
    deadline = time.monotonic() + _GIVE_UP_S
    while time.monotonic() < deadline:
        with pumps_lock:
            if not pumps:
                break
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)
