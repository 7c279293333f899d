"""The local backend of :class:`~ftnb.elastic.WorkerGroup`: each worker a process of this machine,
forked from the fork server it shares with trial processes (:mod:`ftnb.execution.fork_server`: a
worker starts by a fork of a process that has imported ftnb and what the caller uses, not by a
Python start-up), talking to the group through a pipe
(:func:`~ftnb.elastic.worker.worker_main`). Workers ask the kernel to kill them when their
parent dies, so a SIGKILLed trial, script or kernel leaves no orphan; each is the subreaper of
what it starts, which ends with it (:mod:`ftnb.execution.process_tree`)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..execution.fork_server import WORKER_PROCESS_PREFIX, fork_server_context
from .backend import START_TIMEOUT_S, Answer, WorkerSlot
from .worker import worker_main

__all__ = ["LocalWorkers"]


@dataclass
class _Process:
    process: Any
    conn: Any
    started_at: float  # time.monotonic() before it was forked


class LocalWorkers:
    """Workers as processes of this machine (see the module docstring). ``resources``: a
    :class:`~ftnb.execution.resources.TrialResources`; ``cpu`` sets a worker's thread count
    (``OMP_NUM_THREADS``), ``gpu`` hands out the GPUs the caller sees, round-robin
    (``CUDA_VISIBLE_DEVICES``)."""

    name = "local"

    def __init__(self, resources: Any, custom: Optional[dict] = None) -> None:
        # (custom resources are Ray's: the group refuses them for local workers)
        self._resources = resources
        self._gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]

    def start(self, slots: list[WorkerSlot], factory: bytes) -> None:
        ctx = fork_server_context()  # (the trials' too: one per process)
        for slot in slots:
            parent, child = ctx.Pipe(duplex=True)
            started_at = time.monotonic()
            process = ctx.Process(target=worker_main,
                                  args=(slot.index, factory, child, self._env(slot.index)),
                                  name=f"{WORKER_PROCESS_PREFIX}{slot.index}", daemon=False)
            process.start()
            child.close()
            slot.handle = _Process(process, parent, started_at)

    def started(self, slots: list[WorkerSlot], timeout: float
                ) -> tuple[list[WorkerSlot], list[tuple[WorkerSlot, dict]]]:
        up: list[WorkerSlot] = []
        failed: list[tuple[WorkerSlot, dict]] = []
        waiting = {slot.handle.conn: slot for slot in slots}
        deadline = time.monotonic() + timeout
        while waiting:
            ready = multiprocessing.connection.wait(list(waiting),
                                                    max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                slot = waiting.pop(conn)
                try:
                    kind, value = conn.recv()
                    error = value if kind == "failed" else None
                except (EOFError, OSError):
                    error = self._death(slot)
                if error is None:
                    up.append(slot)
                else:
                    self.kill(slot)
                    failed.append((slot, error))
        return up, failed

    def _env(self, index: int) -> dict:
        env = {"OMP_NUM_THREADS": str(max(1, int(self._resources.cpu)))}
        if self._resources.gpu and self._gpus:
            count = max(1, int(self._resources.gpu))
            start = (index * count) % len(self._gpus)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(
                self._gpus[(start + i) % len(self._gpus)] for i in range(count))
        elif not self._resources.gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def keep_spares(self, count: int, factory: bytes) -> None:
        """None kept: a worker starts by a fork of the warm fork server, in about the time a
        spare would take to build its object."""

    def spares_ready(self) -> int:
        return 0

    def push_state(self, slots: list[WorkerSlot], state: bytes) -> list[tuple[WorkerSlot, dict]]:
        sent = []
        failed = []
        for slot in slots:
            try:
                slot.handle.conn.send(("state", state))
                sent.append(slot)
            except OSError:
                failed.append((slot, self._death(slot)))
        deadline = time.monotonic() + START_TIMEOUT_S
        for slot in sent:
            conn = slot.handle.conn
            try:
                reply = conn.recv() if conn.poll(max(0.0, deadline - time.monotonic())) else None
            except (EOFError, OSError):
                reply = None
            if reply is None or not reply[1]:
                failed.append((slot, reply[2] if reply else self._death(slot)))
        return failed

    def send(self, slot: WorkerSlot, call_id: int, payload: bytes) -> Optional[dict]:
        try:
            slot.handle.conn.send(("call", call_id, payload))
        except OSError:
            return self._death(slot)
        return None

    def wait(self, slots: list[WorkerSlot], timeout: Optional[float]) -> list[Answer]:
        objects: dict[Any, WorkerSlot] = {}
        for slot in slots:
            objects[slot.handle.conn] = slot
            objects[slot.handle.process.sentinel] = slot
        answers: list[Answer] = []
        for slot in dict.fromkeys(objects[o] for o in
                                  multiprocessing.connection.wait(list(objects), timeout)):
            conn, process = slot.handle.conn, slot.handle.process
            try:
                while conn.poll(0):
                    call_id, ok, value = conn.recv()
                    answers.append((slot, call_id, ok, value))
            except (EOFError, OSError):
                pass
            if not process.is_alive():
                answers.append((slot, None, False, self._death(slot)))
        return answers

    def died_idle(self, slot: WorkerSlot) -> Optional[dict]:
        # An idle worker sends nothing, so a readable pipe means its end is closed: it died,
        # even if its exit is not reported yet.
        if not slot.handle.process.is_alive() or _readable(slot.handle.conn):
            return self._death(slot)
        return None

    def _death(self, slot: WorkerSlot) -> dict:
        """How a worker process died (it sent no error of its own)."""
        from ..core.policy import signal_name
        from ..execution.oom import oom_killed

        process = slot.handle.process
        process.join(5)
        code = process.exitcode
        if code is not None and code < 0:
            name = signal_name(-code)
            oom = code == -signal.SIGKILL and oom_killed(process.pid, slot.handle.started_at)
            return {"kind": "oom" if oom else "signal", "type": None, "traceback": None,
                    "message": f"killed by {name}" + (" (the OOM killer)" if oom else ""),
                    "signal": name}
        return {"kind": "exit", "type": None, "traceback": None,
                "message": f"the worker process exited with code {code}"}

    def kill(self, slot: WorkerSlot) -> None:
        process = slot.handle.process if slot.handle is not None else None
        if process is not None and process.pid and process.exitcode is None:
            from ..execution.process_tree import kill_tree

            kill_tree(process.pid)  # what it started first, while it is still theirs
            process.join(5)

    def close(self, slots: list[WorkerSlot]) -> None:
        for slot in slots:
            if slot.handle is not None and slot.healthy:
                try:
                    slot.handle.conn.send(("close", None))
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for slot in slots:
            if slot.handle is not None:
                if slot.healthy:  # (one still starting is not told to close: it is killed)
                    slot.handle.process.join(max(0.0, deadline - time.monotonic()))
                self.kill(slot)


def _readable(conn: Any) -> bool:
    try:
        return conn.poll(0)
    except (OSError, EOFError):
        return True
