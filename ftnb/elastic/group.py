"""``WorkerGroup``: N stateful workers in processes of their own, kept going on the healthy ones.

A group maps calls over its workers (``fn(obj, *args, **kwargs)``, ``obj`` built in the worker by
the factory). A worker that crashes (any signal, the OOM killer), raises, or exceeds
``call_timeout_s`` gives a failed :class:`WorkerResult` while the others' results come back
normally; a worker whose call raised or timed out is killed (its state may be corrupt), as
RLlib's actor manager does. Before the next call the failed workers are recreated (within
``max_restarts``) and handed the latest state (``get_state()`` in the caller, pushed into the
worker's ``set_state``) before they take work. More than ``consecutive_failure_tolerance``
consecutive calls with no healthy result raise :class:`WorkerGroupError`, which a trainable lets
through so the trial is retried from its checkpoint.

Workers are children of the process that made the group (a trial's process, a script, a
kernel): they ask the kernel to kill them when that process dies, so a SIGKILLed trial leaves
no orphan. Factories, functions and states travel by value (cloudpickle), so notebook-defined
ones work.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from .worker import worker_main

__all__ = ["WorkerGroup", "WorkerGroupError", "WorkerResult"]

#: How long a new worker may take to build its object before it counts as failed.
START_TIMEOUT_S = 120.0
#: The deadline of a call queued behind another one in its worker: set when that one ends.
_NOT_STARTED = object()
_context_lock = threading.Lock()
_context: Any = None


class WorkerGroupError(RuntimeError):
    """The group cannot go on: no worker came up (``validate=True``), or no worker gave a
    healthy result for more than ``consecutive_failure_tolerance`` calls in a row, or every
    worker failed and ``max_restarts`` is used up. Let it propagate from a trainable: the trial
    is then retried from its latest checkpoint (``FailureConfig(max_failures)``)."""


@dataclass(frozen=True)
class WorkerResult:
    """One worker's answer to one call: ``value`` when ``ok``, else ``error``, a dict with
    ``kind`` (``exception``, ``oom``, ``signal``, ``exit``, ``timeout``, ``lost``), ``type``,
    ``message`` and ``traceback``."""

    index: int
    ok: bool
    value: Any = None
    error: Optional[dict] = None
    call_id: Optional[int] = None

    def get(self) -> Any:
        """The value, or a RuntimeError describing the failure."""
        if self.ok:
            return self.value
        error = self.error or {}
        raise RuntimeError(f"worker {self.index} failed ({error.get('kind')}): "
                           f"{error.get('type') or ''} {error.get('message') or ''}".strip())


@dataclass
class _Slot:
    """One worker's place in the group: its index stays when its process is recreated."""

    index: int
    process: Any = None
    conn: Any = None
    healthy: bool = False
    needs_state: bool = False
    # call id -> deadline (monotonic), None (no timeout) or _NOT_STARTED (queued behind another)
    in_flight: dict = field(default_factory=dict)
    queued: deque = field(default_factory=deque)  # (call id, payload) not sent yet


def _process_context() -> Any:
    """The fork server of this process (started once): a worker starts by a fork of a process
    that has imported ftnb and what the caller uses, not by a Python start-up."""
    global _context
    with _context_lock:
        if _context is None:
            import sys

            from ..execution.local import skip_main_for_trials

            skip_main_for_trials()
            ctx = multiprocessing.get_context("forkserver")
            preload = ["ftnb.elastic.worker", "cloudpickle"]
            preload += [m for m in ("numpy", "torch", "gymnasium") if m in sys.modules]
            ctx.set_forkserver_preload(preload)
            _context = ctx
        return _context


def _takes_index(factory: Callable[..., Any]) -> bool:
    from ..config import signature_mismatch

    if signature_mismatch(factory, ()) is None:
        return False
    if signature_mismatch(factory, (0,)) is None:
        return True
    raise TypeError(
        f"WorkerGroup(factory={getattr(factory, '__name__', factory)!r}) must take no argument "
        "or one (the worker's index). Fix: def make_worker(index): ..."
    )


class WorkerGroup:
    """``num_workers`` workers, each holding ``factory()`` (or ``factory(index)``) in a process
    of its own (see the module docstring). A context manager: leaving it ends the workers.

    Args:
        factory: builds the worker's object, in the worker's process.
        num_workers: how many workers (slots; a recreated worker keeps its slot's index).
        resources_per_worker: ``{"cpu": n, "gpu": m}``; on this machine ``cpu`` sets the
            worker's thread count (``OMP_NUM_THREADS``) and ``gpu`` hands out the GPUs the caller
            sees, round-robin (``CUDA_VISIBLE_DEVICES``).
        max_restarts: how many times, over the whole group, failed workers may be recreated
            (-1: without limit).
        consecutive_failure_tolerance: how many consecutive calls with no healthy result are
            tolerated; one more raises :class:`WorkerGroupError`.
        call_timeout_s: a call taking longer fails with kind ``timeout`` and its worker is
            killed (None: no limit).
        validate: construction fails unless every worker comes up; False starts with those
            that did (the others are recreated before the first call).
        get_state: called in the caller before a recreated worker takes work; its value is
            passed to the worker object's ``set_state``.
        max_in_flight_per_worker: the bound on a worker's calls not yet fetched
            (:meth:`map_async`).

    Example:
        >>> with ftnb.WorkerGroup(make_env_runner, 4, call_timeout_s=30,  # doctest: +SKIP
        ...                       get_state=lambda: policy.state_dict()) as group:
        ...     for step in range(100):
        ...         results = group.map(lambda runner, w: runner.rollout(w), weights)
        ...         batches = [r.value for r in results if r.ok]
        ...         ftnb.report({"return": ..., **group.stats})
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        num_workers: int,
        *,
        resources_per_worker: Optional[dict] = None,
        max_restarts: int = -1,
        consecutive_failure_tolerance: int = 3,
        call_timeout_s: Optional[float] = None,
        validate: bool = True,
        get_state: Optional[Callable[[], Any]] = None,
        max_in_flight_per_worker: int = 2,
    ) -> None:
        import cloudpickle

        from ..execution.resources import TrialResources

        if not callable(factory):
            raise TypeError(
                f"WorkerGroup(factory={factory!r}) must be a function that builds a worker's "
                "object. Fix: WorkerGroup(make_worker, 4) (not make_worker())."
            )
        takes_index = _takes_index(factory)
        _check_whole("num_workers", num_workers, 1)
        _check_whole("max_restarts", max_restarts, -1)
        _check_whole("consecutive_failure_tolerance", consecutive_failure_tolerance, 0)
        _check_whole("max_in_flight_per_worker", max_in_flight_per_worker, 1)
        if call_timeout_s is not None and not (isinstance(call_timeout_s, (int, float))
                                               and not isinstance(call_timeout_s, bool)
                                               and call_timeout_s > 0):
            raise ValueError(
                f"WorkerGroup(call_timeout_s={call_timeout_s!r}) must be a number of seconds > 0"
                " or None. Fix: call_timeout_s=30."
            )
        if get_state is not None and not callable(get_state):
            raise TypeError(
                f"WorkerGroup(get_state={get_state!r}) must be a function returning the state "
                "to push into recreated workers. Fix: get_state=lambda: model.state_dict()."
            )
        try:
            self._resources = TrialResources.from_user(resources_per_worker)
        except (TypeError, ValueError) as exc:
            raise type(exc)(str(exc).replace("resources_per_trial", "resources_per_worker")) \
                from None
        try:
            self._factory = cloudpickle.dumps((factory, takes_index, get_state is not None))
        except Exception as exc:
            raise TypeError(
                f"WorkerGroup(factory=...) cannot be sent to a worker process: "
                f"{type(exc).__name__}: {exc}. Fix: create unpicklable things (open files, "
                "locks) inside the factory."
            ) from exc
        self.num_workers = num_workers
        self.max_restarts = max_restarts
        self.consecutive_failure_tolerance = consecutive_failure_tolerance
        self.call_timeout_s = call_timeout_s
        self.max_in_flight_per_worker = max_in_flight_per_worker
        self._get_state = get_state
        self._slots = [_Slot(i) for i in range(num_workers)]
        self._ids = itertools.count()
        self._ready: list[WorkerResult] = []  # results fetched, not yet handed out
        self._restarts = 0
        self._failures: Counter = Counter()
        self._last_error: Optional[dict] = None
        self._consecutive_failures = 0
        self._oom_before = 0
        self._closed = False
        self._gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        errors = self._start(self._slots)
        if errors and (validate or len(errors) == num_workers):
            self.close()
            shown = "; ".join(f"worker {i}: {_describe(e)}" for i, e in errors)
            raise WorkerGroupError(
                f"WorkerGroup: {len(errors)} of {num_workers} workers failed to start "
                f"({shown}). Fix: make the factory work on every worker, or pass "
                "validate=False to start with those that came up."
            )

    # -- the public surface ----------------------------------------------------------------------
    @property
    def healthy(self) -> list[int]:
        """The indexes of the workers that are up."""
        return [s.index for s in self._slots if s.healthy]

    @property
    def stats(self) -> dict:
        """Numbers to report: workers healthy, restarts so far, failures by kind
        (``failures_<kind>``), consecutive calls without a healthy result."""
        stats = {"workers_healthy": len(self.healthy), "workers": self.num_workers,
                 "worker_restarts": self._restarts,
                 "worker_failures": sum(self._failures.values()),
                 "consecutive_failures": self._consecutive_failures}
        for kind, count in sorted(self._failures.items()):
            stats[f"worker_failures_{kind}"] = count
        return stats

    def map(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[WorkerResult]:
        """Call ``fn(obj, *args, **kwargs)`` on every healthy worker (failed ones are recreated
        first) and wait for all of them; the results in worker order, failures included."""
        if self._pending():
            raise RuntimeError(
                "WorkerGroup.map() while map_async() calls are unfetched. Fix: fetch_ready() "
                "them first (or use map_async for both)."
            )
        self._recreate_failed()
        payload = _call_payload(fn, args, kwargs)
        wanted = {self._submit(slot, payload) for slot in self._slots if slot.healthy}
        results: list[WorkerResult] = []
        while wanted:
            for result in self._collect(timeout=None):
                if result.call_id in wanted:
                    wanted.discard(result.call_id)
                    results.append(result)
        results.sort(key=lambda r: r.index)
        self._count_step(results)
        return results

    def map_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Send ``fn(obj, *args, **kwargs)`` to every healthy worker that has fewer than
        ``max_in_flight_per_worker`` calls unfetched; returns how many calls were sent.
        Collect them with :meth:`fetch_ready`."""
        self._recreate_failed()
        payload = _call_payload(fn, args, kwargs)
        sent = 0
        for slot in self._slots:
            if slot.healthy and len(slot.in_flight) + len(slot.queued) < \
                    self.max_in_flight_per_worker:
                self._submit(slot, payload)
                sent += 1
        return sent

    def fetch_ready(self, timeout_s: float = 0.0) -> list[WorkerResult]:
        """The results of :meth:`map_async` calls that are done, waiting up to ``timeout_s``
        for the first one."""
        results = self._collect(timeout=timeout_s)
        if results:
            self._count_step(results)
        return results

    def close(self) -> None:
        """End every worker (its object's ``close()`` is called if it has one)."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            if slot.conn is not None and slot.healthy:
                try:
                    slot.conn.send(("close", None))
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for slot in self._slots:
            if slot.process is not None:
                slot.process.join(max(0.0, deadline - time.monotonic()))
                _kill(slot.process)
                slot.process.join(1)
            slot.healthy = False

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- workers ---------------------------------------------------------------------------------
    def _start(self, slots: Iterable[_Slot]) -> list[tuple[int, dict]]:
        """Start the workers of ``slots`` and wait until each is up or failed; the failures."""
        from ..execution.local import _oom_kill_count

        ctx = _process_context()
        self._oom_before = _oom_kill_count()
        starting = []
        for slot in slots:
            parent, child = ctx.Pipe(duplex=True)
            slot.process = ctx.Process(
                target=worker_main, args=(slot.index, self._factory, child, self._env(slot)),
                name=f"ftnb-worker-{slot.index}", daemon=False)
            slot.process.start()
            child.close()
            slot.conn, slot.healthy, slot.in_flight, slot.queued = parent, False, {}, deque()
            starting.append(slot)
        errors = []
        deadline = time.monotonic() + START_TIMEOUT_S
        for slot in starting:
            error = None
            ready = multiprocessing.connection.wait(
                [slot.conn], max(0.0, deadline - time.monotonic()))
            if not ready:
                error = {"kind": "timeout", "type": None,
                         "message": f"did not come up in {START_TIMEOUT_S:.0f} s",
                         "traceback": None}
            else:
                try:
                    kind, value = slot.conn.recv()
                    error = value if kind == "failed" else None
                except (EOFError, OSError):
                    error = self._death(slot)
            if error is None:
                slot.healthy = True
            else:
                _kill(slot.process)
                self._failures[error["kind"]] += 1
                self._last_error = error
                errors.append((slot.index, error))
        return errors

    def _env(self, slot: _Slot) -> dict:
        env = {"OMP_NUM_THREADS": str(max(1, int(self._resources.cpu)))}
        if self._resources.gpu and self._gpus:
            count = max(1, int(self._resources.gpu))
            start = (slot.index * count) % len(self._gpus)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(
                self._gpus[(start + i) % len(self._gpus)] for i in range(count))
        elif not self._resources.gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def _recreate_failed(self) -> None:
        """Recreate the failed workers (within ``max_restarts``) and push the latest state into
        them, before they take work."""
        if self._closed:
            raise RuntimeError("this WorkerGroup is closed")
        for slot in self._slots:
            # A worker that died while idle (killed between calls) is recreated now, not found
            # dead by the call it would miss. An idle worker sends nothing, so a readable pipe
            # means its end is closed: it died, even if its exit is not reported yet.
            if slot.healthy and not slot.in_flight and (
                    not slot.process.is_alive() or _readable(slot.conn)):
                self._fail(slot, self._death(slot))
        failed = [s for s in self._slots if not s.healthy]
        if self.max_restarts >= 0:
            failed = failed[:max(0, self.max_restarts - self._restarts)]
        if failed:
            self._restarts += len(failed)
            self._start(failed)
            for slot in failed:
                slot.needs_state = slot.healthy and self._get_state is not None
        pending = [s for s in self._slots if s.needs_state]
        if pending:
            import cloudpickle

            state = cloudpickle.dumps(self._get_state())  # type: ignore[misc]
            for slot in pending:
                self._push_state(slot, state)
        if not self.healthy:
            used_up = (f"max_restarts={self.max_restarts} is used up"
                       if self.max_restarts >= 0 and self._restarts >= self.max_restarts
                       else "the workers recreated failed too")
            last = f" The last failure: {_describe(self._last_error)}." if self._last_error \
                else ""
            raise WorkerGroupError(
                f"WorkerGroup: no worker is up: {used_up} ({self._restarts} restarts; failures "
                f"by kind: {dict(self._failures)}).{last} Fix: the cause of that failure"
                + (", or a higher max_restarts (-1: no limit)." if self.max_restarts >= 0
                   else ".")
            )

    def _push_state(self, slot: _Slot, state: bytes) -> None:
        slot.needs_state = False
        try:
            slot.conn.send(("state", state))
            reply = slot.conn.recv() if slot.conn.poll(START_TIMEOUT_S) else None
        except (EOFError, OSError):
            reply = None
        if reply is None or not reply[1]:
            error = reply[2] if reply else self._death(slot)
            self._fail(slot, error)

    def _submit(self, slot: _Slot, payload: bytes) -> int:
        """Send a call; a worker found dead on sending gives its failed result through
        ``_ready`` (the next :meth:`_collect`), so no call goes unanswered."""
        call_id = next(self._ids)
        try:
            slot.conn.send(("call", call_id, payload))
        except OSError:
            self._ready.extend(self._fail(slot, self._death(slot), first=call_id))
            return call_id
        # A call queued behind another one (map_async) starts when that one ends: its clock
        # starts then (_read), or a worker doing two calls of 0.6 x the timeout would time out.
        slot.in_flight[call_id] = self._deadline() if not slot.in_flight else _NOT_STARTED
        return call_id

    def _deadline(self) -> Optional[float]:
        return time.monotonic() + self.call_timeout_s if self.call_timeout_s else None

    def _pending(self) -> bool:
        return any(s.in_flight for s in self._slots) or bool(self._ready)

    def _collect(self, timeout: Optional[float]) -> list[WorkerResult]:
        """Results that arrived (calls answered, workers dead, calls timed out), waiting up to
        ``timeout`` (None: until at least one) for the first."""
        if self._ready:
            ready, self._ready = self._ready, []
            return ready
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            busy = [s for s in self._slots if s.in_flight]
            if not busy:
                return []
            now = time.monotonic()
            deadlines = [d for s in busy for d in s.in_flight.values() if _is_time(d)]
            wait = min([*deadlines, *([end] if end is not None else [])], default=None)
            wait_s = None if wait is None else max(0.0, wait - now)
            objects: dict[Any, _Slot] = {}
            for slot in busy:
                objects[slot.conn] = slot
                objects[slot.process.sentinel] = slot
            ready = multiprocessing.connection.wait(list(objects), wait_s)
            results: list[WorkerResult] = []
            for obj in ready:
                slot = objects[obj]
                if not slot.in_flight:
                    continue
                results.extend(self._read(slot))
            now = time.monotonic()
            for slot in busy:
                expired = [c for c, d in slot.in_flight.items() if _is_time(d) and d <= now]
                if expired and slot.healthy:
                    error = {"kind": "timeout", "type": None, "traceback": None,
                             "message": f"the call took longer than call_timeout_s="
                                        f"{self.call_timeout_s}"}
                    results.extend(self._fail(slot, error))
            if results or (end is not None and time.monotonic() >= end):
                return results

    def _read(self, slot: _Slot) -> list[WorkerResult]:
        results = []
        try:
            while slot.conn.poll(0):
                call_id, ok, value = slot.conn.recv()
                slot.in_flight.pop(call_id, None)
                following = next(iter(slot.in_flight), None)
                if following is not None and slot.in_flight[following] is _NOT_STARTED:
                    slot.in_flight[following] = self._deadline()
                if ok:
                    results.append(WorkerResult(slot.index, True, value, None, call_id))
                else:
                    results.extend(self._fail(slot, value, first=call_id))
                    return results
        except (EOFError, OSError):
            pass
        if not slot.process.is_alive() and slot.healthy:
            results.extend(self._fail(slot, self._death(slot)))
        return results

    def _death(self, slot: _Slot) -> dict:
        """How a worker process died (it sent no error of its own)."""
        from ..core.policy import signal_name
        from ..execution.local import _oom_kill_count

        slot.process.join(5)
        code = slot.process.exitcode
        if code is not None and code < 0:
            name = signal_name(-code)
            oom = code == -signal.SIGKILL and _oom_kill_count() > self._oom_before
            return {"kind": "oom" if oom else "signal", "type": None, "traceback": None,
                    "message": f"killed by {name}" + (" (the OOM killer)" if oom else ""),
                    "signal": name}
        return {"kind": "exit", "type": None, "traceback": None,
                "message": f"the worker process exited with code {code}"}

    def _fail(self, slot: _Slot, error: dict, first: Optional[int] = None) -> list[WorkerResult]:
        """Mark ``slot`` failed (its process killed); a failed result for each of its calls."""
        slot.healthy = False
        _kill(slot.process)
        self._failures[error.get("kind") or "exception"] += 1
        self._last_error = error
        calls = ([first] if first is not None else []) + list(slot.in_flight)
        slot.in_flight.clear()
        lost = dict(error, kind="lost", message="the worker failed during an earlier call")
        return [WorkerResult(slot.index, False, None, error if i == 0 else lost, call_id)
                for i, call_id in enumerate(calls)]

    def _count_step(self, results: list[WorkerResult]) -> None:
        if any(r.ok for r in results):
            self._consecutive_failures = 0
            return
        self._consecutive_failures += 1
        if self._consecutive_failures > self.consecutive_failure_tolerance:
            kinds = Counter((r.error or {}).get("kind") for r in results)
            raise WorkerGroupError(
                f"WorkerGroup: {self._consecutive_failures} consecutive calls without a healthy "
                f"result (consecutive_failure_tolerance={self.consecutive_failure_tolerance}); "
                f"the last one's failures: {dict(kinds)}. In a trainable, let this error "
                "through: the trial is retried from its latest checkpoint."
            )


def _readable(conn: Any) -> bool:
    try:
        return conn.poll(0)
    except (OSError, EOFError):
        return True


def _is_time(deadline: Any) -> bool:
    return deadline is not None and deadline is not _NOT_STARTED


def _call_payload(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    import cloudpickle

    if not callable(fn):
        raise TypeError(f"WorkerGroup.map(fn={fn!r}): fn must be a function fn(worker, ...).")
    return cloudpickle.dumps((fn, args, kwargs))


def _check_whole(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"WorkerGroup({name}={value!r}) must be a whole number >= {minimum}."
        )


def _describe(error: dict) -> str:
    what = f"{error.get('type')}: {error.get('message')}" if error.get("type") \
        else error.get("message")
    return f"{error.get('kind')} {what}"


def _kill(process: Any) -> None:
    if process is not None and process.pid and process.exitcode is None:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.join(5)
