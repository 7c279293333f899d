"""``WorkerGroup``: N stateful workers, kept going on the healthy ones.

A group maps calls over its workers (``fn(obj, *args, **kwargs)``, ``obj`` built in the worker by
the factory). A worker that crashes (any signal, the OOM killer, a lost node), raises, or exceeds
``call_timeout_s`` gives a failed :class:`WorkerResult` while the others' results come back
normally; a worker whose call raised or timed out is killed (its state may be corrupt), as
RLlib's actor manager does. A failed worker is recreated in its slot (within ``max_restarts``)
as soon as the failure is seen: by the map that got it, by :meth:`WorkerGroup.fetch_ready`, by
a map finding a worker that died while idle. Its new process or actor starts then, without
blocking, while the caller works on the results; the next call waits only for the rest of its
start (up to ``RECREATE_WAIT_S``, then goes on without the workers still starting, which join
a later call) and hands it the latest state (``get_state()``, called in the caller by that
call, pushed into the worker's ``set_state``) before it takes work. A recreated worker whose
start fails is started again by the next call; closing the group ends the workers still
starting too. More than
``consecutive_failure_tolerance`` consecutive calls with no healthy result raise
:class:`WorkerGroupError`, which a trainable lets through so the trial is retried from its
checkpoint.

Where the workers run is the ``executor``'s, as for trials (``RunConfig(executor=...)``):

- ``"local"``: processes of this machine, children of the process that made the group (a
  trial's process, a script, a kernel), which the kernel kills when that process dies.
- ``"ray"``: Ray actors spread over a cluster's nodes (``pip install 'ftnb[ray]'``), owned by
  the process that made the group, which Ray kills with it. A lost node fails its workers'
  calls with kind ``node_lost``; they are recreated on the nodes left.
- None (the default): ``"ray"`` inside a Ray actor (a trial run by the Ray executor), else
  ``"local"``. A plain script or notebook passes ``executor="ray"``: it uses the cluster Ray is
  connected to (``ray.init(address)`` first), else the one at ``RAY_ADDRESS``, else a new
  local Ray instance.

Both run the same policy here; a backend (:mod:`ftnb.elastic.backend`) only starts, calls,
kills and classifies workers. Factories, functions and states travel by value (cloudpickle),
so notebook-defined ones work.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .backend import (
    NOT_STARTED,
    START_TIMEOUT_S,
    WorkerSlot,
    is_time,
    worker_backend,
)
from .group_arguments import checked_arguments

__all__ = ["WorkerGroup", "WorkerGroupError", "WorkerResult"]

#: How long a map waits for the workers being recreated before it goes on without those still
#: starting (on Ray: not placed yet, no node having room); they join a later map.
RECREATE_WAIT_S = 30.0


class WorkerGroupError(RuntimeError):
    """The group cannot go on: no worker came up (``validate=True``), or no worker gave a
    healthy result for more than ``consecutive_failure_tolerance`` calls in a row, or every
    worker failed and ``max_restarts`` is used up. Let it propagate from a trainable: the trial
    is then retried from its latest checkpoint (``FailureConfig(max_failures)``)."""


@dataclass(frozen=True)
class WorkerResult:
    """One worker's answer to one call: ``value`` when ``ok``, else ``error``, a dict with
    ``kind`` (``exception``, ``oom``, ``signal``, ``exit``, ``timeout``, ``lost``: it failed
    during an earlier call; on Ray also ``node_lost`` and ``preemption``), ``type``,
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
class _Call:
    """One map / map_async call over the group: the worker calls not answered yet, and
    whether one was healthy (the unit of ``consecutive_failure_tolerance``)."""

    waiting: set
    kinds: Counter
    ok: bool = False


class WorkerGroup:
    """``num_workers`` workers, each holding ``factory()`` (or ``factory(index)``) in a process
    or Ray actor of its own (see the module docstring). A context manager: leaving it ends the
    workers.

    Args:
        factory: builds the worker's object, in the worker. It gets the worker's index if it
            takes an argument (an optional one too); :func:`~ftnb.elastic.worker_index` gives
            it anywhere in the worker.
        num_workers: how many workers (slots; a recreated worker keeps its slot's index).
        resources_per_worker: ``{"cpu": n, "gpu": m}``, on Ray also custom resources
            (``{"cpu": 1, "accelerator_x": 1}``). Locally ``cpu`` sets the worker's thread count
            (``OMP_NUM_THREADS``) and ``gpu`` hands out the GPUs the caller sees, round-robin
            (``CUDA_VISIBLE_DEVICES``); on Ray they are the actor's ``num_cpus``, ``num_gpus``
            and ``resources``. Default: 1 CPU.
        max_restarts: how many times, over the whole group, failed workers may be recreated
            (-1: without limit); a recreation counts when it begins, as the failure is seen
            (``stats["worker_restarts"]``), also one whose start then fails.
        consecutive_failure_tolerance: how many consecutive calls (``map``, ``map_async``)
            with no healthy result are tolerated; one more raises :class:`WorkerGroupError`.
        call_timeout_s: a call taking longer fails with kind ``timeout`` and its worker is
            killed (None: no limit).
        validate: construction fails unless every worker comes up; False starts with those
            that did (the others are recreated at once, joining the first call).
        get_state: called in the caller by the first call (``map``, ``map_async``) that a
            recreated worker takes, before it takes it (once for all the workers recreated by
            then); its value is passed to the worker object's ``set_state``. So a worker
            replaced while the caller updated its model gets the updated state.
        max_in_flight_per_worker: the bound on a worker's calls not yet fetched
            (:meth:`map_async`).
        executor: where the workers run, ``"local"`` or ``"ray"``, named as in
            ``RunConfig(executor=...)``; None: ``"ray"`` inside a Ray actor (a trial on the Ray
            executor), else ``"local"``.
        spare_workers: on Ray, how many warm spares to keep: actors started ahead, with the
            factory loaded, so a failed worker's slot takes one at once (it builds its object,
            ``factory(index)``, and takes the state) instead of waiting for a new actor's
            process to start (about 2 s of CPU: several seconds on a loaded node); a new spare
            then starts in the background (from the next call, once the takeover is done).
            Without a spare that start begins too when the failure is seen, so a caller that
            spends longer than it on the results before its next call barely waits; spares are
            for callers that call again at once. The cost: each spare holds
            ``resources_per_worker`` on the cluster (GPUs too) and a Ray worker process's
            memory (about 150 MB plus what the factory's modules import) for as long as the
            group lives, without doing work. None are kept once ``max_restarts`` is used up.
            Locally a worker starts by a fork in about 0.1 s, so none are kept. Default 0.

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
        executor: Optional[str] = None,
        spare_workers: int = 0,
    ) -> None:
        self._closed = True  # until there are workers to close
        checked = checked_arguments(
            factory, num_workers, resources_per_worker=resources_per_worker,
            max_restarts=max_restarts,
            consecutive_failure_tolerance=consecutive_failure_tolerance,
            call_timeout_s=call_timeout_s, get_state=get_state,
            max_in_flight_per_worker=max_in_flight_per_worker, executor=executor,
            spare_workers=spare_workers)
        self._factory = checked.factory
        self.num_workers = num_workers
        self.max_restarts = max_restarts
        self.consecutive_failure_tolerance = consecutive_failure_tolerance
        self.call_timeout_s = call_timeout_s
        self.max_in_flight_per_worker = max_in_flight_per_worker
        self.executor = checked.executor
        self.spare_workers = spare_workers
        self._get_state = get_state
        self._slots = [WorkerSlot(i) for i in range(num_workers)]
        self._ids = itertools.count()
        self._ready: list[WorkerResult] = []  # results fetched, not yet handed out
        self._calls: dict[int, _Call] = {}  # worker call id -> the group call it belongs to
        self._restarts = 0
        # Slots whose new worker started since a map last waited for recreated workers: the
        # next map waits (up to RECREATE_WAIT_S) for the rest of their start.
        self._unwaited: set[WorkerSlot] = set()
        self._spares_due = False  # a slot took a spare (or a new actor) since the last top-up
        self._failures: Counter = Counter()
        self._last_error: Optional[dict] = None
        self._consecutive_failures = 0
        self._backend = worker_backend(self.executor, checked.resources, checked.custom)
        self._closed = False
        self._launch(self._slots)
        errors = self._settle(START_TIMEOUT_S)
        if errors and (validate or len(errors) == num_workers):
            self.close()
            shown = "; ".join(f"worker {i}: {_describe(e)}" for i, e in errors)
            raise WorkerGroupError(
                f"WorkerGroup: {len(errors)} of {num_workers} workers failed to start "
                f"({shown}). Fix: make the factory work on every worker, or pass "
                "validate=False to start with those that came up."
            )
        self._replace(self._failed())
        self._keep_spares()

    # -- the public surface ----------------------------------------------------------------------
    @property
    def healthy(self) -> list[int]:
        """The indexes of the workers that are up."""
        return [s.index for s in self._slots if s.healthy]

    @property
    def stats(self) -> dict:
        """Numbers to report: workers healthy, restarts so far, failures by kind
        (``failures_<kind>``), consecutive calls without a healthy result; with
        ``spare_workers``, the spares up (``workers_spare``)."""
        stats = {"workers_healthy": len(self.healthy), "workers": self.num_workers,
                 "worker_restarts": self._restarts,
                 "worker_failures": sum(self._failures.values()),
                 "consecutive_failures": self._consecutive_failures}
        if self.spare_workers:
            stats["workers_spare"] = 0 if self._closed else self._backend.spares_ready()
        for kind, count in sorted(self._failures.items()):
            stats[f"worker_failures_{kind}"] = count
        return stats

    def map(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[WorkerResult]:
        """Call ``fn(obj, *args, **kwargs)`` on every healthy worker and wait for all of them;
        the results in worker order, failures included. The workers recreated since the last
        call (their start begun when their failure was seen) take the state first and join
        it."""
        if self._pending():
            raise RuntimeError(
                "WorkerGroup.map() while map_async() calls are unfetched. Fix: fetch_ready() "
                "them first (or use map_async for both)."
            )
        self._recreate_failed()
        wanted = self._send([s for s in self._slots if s.healthy], fn, args, kwargs)
        results: list[WorkerResult] = []
        while wanted:
            for result in self._collect(timeout=None):
                if result.call_id in wanted:
                    wanted.discard(result.call_id)
                    results.append(result)
        results.sort(key=lambda r: r.index)
        self._count(results)
        return results

    def map_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """Send ``fn(obj, *args, **kwargs)`` to every healthy worker that has fewer than
        ``max_in_flight_per_worker`` calls unfetched; returns how many calls were sent.
        Collect them with :meth:`fetch_ready`. The call counts for
        ``consecutive_failure_tolerance`` once all of its results are fetched."""
        self._recreate_failed()
        slots = [s for s in self._slots
                 if s.healthy and len(s.in_flight) < self.max_in_flight_per_worker]
        return len(self._send(slots, fn, args, kwargs))

    def fetch_ready(self, timeout_s: float = 0.0) -> list[WorkerResult]:
        """The results of :meth:`map_async` calls that are done, waiting up to ``timeout_s``
        for the first one."""
        results = self._collect(timeout=timeout_s)
        self._count(results)
        return results

    def close(self) -> None:
        """End every worker (its object's ``close()`` is called if it has one)."""
        if self._closed:
            return
        self._closed = True
        self._backend.close(self._slots)
        for slot in self._slots:
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
    def _launch(self, slots: list[WorkerSlot], recreated: bool = False) -> None:
        """Begin starting the workers of ``slots``; returns at once (:meth:`_settle` sees them
        come up)."""
        now = time.monotonic()
        for slot in slots:
            slot.healthy, slot.in_flight, slot.starting_since = False, {}, now
            slot.needs_state = recreated and self._get_state is not None
        self._backend.start(slots, self._factory)

    def _replace(self, slots: list[WorkerSlot]) -> None:
        """Begin recreating the failed workers of ``slots`` (within ``max_restarts``) without
        waiting for them: their processes or actors start while the caller works on the
        results of the call that saw the failure, and the next map waits only for the rest of
        their start. The state is pushed by that map (``get_state()`` is the caller's state
        then, not at the failure)."""
        if self._closed:
            return
        if self.max_restarts >= 0:
            slots = slots[:max(0, self.max_restarts - self._restarts)]
        if not slots:
            return
        self._restarts += len(slots)
        self._launch(slots, recreated=True)
        self._unwaited.update(slots)
        self._spares_due = True

    def _failed(self) -> list[WorkerSlot]:
        """The slots without a worker, up or starting."""
        return [s for s in self._slots if not s.healthy and s.starting_since is None]

    def _keep_spares(self) -> None:
        """As many spares as ``spare_workers``, but no more than the restarts left."""
        count = self.spare_workers
        if self.max_restarts >= 0:
            count = min(count, max(0, self.max_restarts - self._restarts))
        self._backend.keep_spares(count, self._factory)

    def _settle(self, wait_s: float) -> list[tuple[int, dict]]:
        """The starting workers that came up become healthy; the failures (those that failed,
        or took longer than START_TIMEOUT_S), waiting up to ``wait_s`` for them."""
        starting = [s for s in self._slots if s.starting_since is not None]
        if not starting:
            return []
        up, failed = self._backend.started(starting, wait_s)
        for slot in up:
            slot.starting_since, slot.healthy = None, True
        errors = {slot.index: error for slot, error in failed}
        now = time.monotonic()
        for slot in starting:
            if slot.starting_since is not None and slot.index not in errors \
                    and now - slot.starting_since >= START_TIMEOUT_S:
                self._backend.kill(slot)
                errors[slot.index] = {"kind": "timeout", "type": None, "traceback": None,
                                      "message": f"did not come up in {START_TIMEOUT_S:.0f} s"
                                                 + (" (no node with room for it?)"
                                                    if self.executor == "ray" else "")}
        for slot in starting:
            if slot.index in errors:
                slot.starting_since = None
                self._note_failure(errors[slot.index])
        return sorted(errors.items())

    def _recreate_failed(self) -> None:
        """Before a map: the recreated workers that came up take the latest state (pushed
        before they take work). A map waits up to RECREATE_WAIT_S for the workers whose start
        began since the last map (its own recreations, and those begun when a failure was
        seen), then goes on without those still starting (on Ray: no node has room yet),
        which join a later map."""
        if self._closed:
            raise RuntimeError("this WorkerGroup is closed")
        self._settle(0.0)
        for slot in self._slots:
            # A worker that died while idle (killed between calls) is recreated now, not found
            # dead by the call it would miss.
            if slot.healthy and not slot.in_flight:
                error = self._backend.died_idle(slot)
                if error is not None:
                    self._fail(slot, error)
        self._replace(self._failed())  # their new worker's start failed, or none was left
        fresh, self._unwaited = self._unwaited, set()
        if fresh:
            self._settle(RECREATE_WAIT_S)
        if not self.healthy and any(s.starting_since is not None for s in self._slots):
            self._settle(START_TIMEOUT_S)  # nothing to work with: wait for them
        pending = [s for s in self._slots if s.healthy and s.needs_state]
        if pending:
            import cloudpickle

            state = cloudpickle.dumps(self._get_state())  # type: ignore[misc]
            for slot in pending:
                slot.needs_state = False
            for slot, error in self._backend.push_state(pending, state):
                self._fail(slot, error)
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
        self._replace(self._failed())  # starts that failed while this map waited: again now
        if self._spares_due:
            # After the takeovers, which a spare's start would slow down.
            self._spares_due = False
            self._keep_spares()

    def _send(self, slots: list[WorkerSlot], fn: Callable[..., Any], args: tuple,
              kwargs: dict) -> set:
        """One group call: ``fn`` sent to each of ``slots``; its worker call ids. A worker
        found dead on sending gives its failed result through ``_ready`` (the next
        :meth:`_collect`), so no call goes unanswered."""
        payload = _call_payload(fn, args, kwargs)
        ids = {next(self._ids) for _ in slots}
        call = _Call(set(ids), Counter())
        for slot, call_id in zip(slots, sorted(ids)):
            self._calls[call_id] = call
            error = self._backend.send(slot, call_id, payload)
            if error is not None:
                self._ready.extend(self._fail(slot, error, first=call_id))
                continue
            # A call queued behind another one (map_async) starts when that one ends: its
            # clock starts then (_collect), or a worker doing two calls of 0.6 x the timeout
            # would time out.
            slot.in_flight[call_id] = self._deadline() if not slot.in_flight else NOT_STARTED
        return ids

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
            deadlines = [d for s in busy for d in s.in_flight.values() if is_time(d)]
            wait = min([*deadlines, *([end] if end is not None else [])], default=None)
            results: list[WorkerResult] = []
            for slot, call_id, ok, value in self._backend.wait(
                    busy, None if wait is None else max(0.0, wait - now)):
                if not slot.healthy or (call_id is not None and call_id not in slot.in_flight):
                    continue  # failed already: its calls have their results
                if call_id is None:
                    results.extend(self._fail(slot, value))
                    continue
                del slot.in_flight[call_id]
                following = next(iter(slot.in_flight), None)
                if following is not None and slot.in_flight[following] is NOT_STARTED:
                    slot.in_flight[following] = self._deadline()
                if ok:
                    results.append(WorkerResult(slot.index, True, value, None, call_id))
                else:
                    results.extend(self._fail(slot, value, first=call_id))
            now = time.monotonic()
            for slot in busy:
                expired = [c for c, d in slot.in_flight.items() if is_time(d) and d <= now]
                if expired and slot.healthy:
                    error = {"kind": "timeout", "type": None, "traceback": None,
                             "message": f"the call took longer than call_timeout_s="
                                        f"{self.call_timeout_s}"}
                    results.extend(self._fail(slot, error))
            if results or (end is not None and time.monotonic() >= end):
                return results

    def _fail(self, slot: WorkerSlot, error: dict,
              first: Optional[int] = None) -> list[WorkerResult]:
        """Mark ``slot`` failed (its worker killed) and begin recreating it (:meth:`_replace`);
        a failed result for each of its calls."""
        slot.healthy = False
        self._backend.kill(slot)
        self._note_failure(error)
        calls = ([first] if first is not None else []) + list(slot.in_flight)
        slot.in_flight.clear()
        self._replace([slot])
        lost = dict(error, kind="lost", message="the worker failed during an earlier call")
        return [WorkerResult(slot.index, False, None, error if i == 0 else lost, call_id)
                for i, call_id in enumerate(calls)]

    def _note_failure(self, error: dict) -> None:
        self._failures[error.get("kind") or "exception"] += 1
        self._last_error = error

    def _count(self, results: list[WorkerResult]) -> None:
        """Count each group call whose results are all in: one without a healthy result adds
        to the consecutive failures, one with a healthy result resets them."""
        for result in results:
            call = self._calls.pop(result.call_id, None)  # type: ignore[arg-type]
            if call is None:
                continue
            call.waiting.discard(result.call_id)
            call.ok = call.ok or result.ok
            if not result.ok:
                call.kinds[(result.error or {}).get("kind")] += 1
            if call.waiting:
                continue
            if call.ok:
                self._consecutive_failures = 0
                continue
            self._consecutive_failures += 1
            if self._consecutive_failures > self.consecutive_failure_tolerance:
                raise WorkerGroupError(
                    f"WorkerGroup: {self._consecutive_failures} consecutive calls without a "
                    f"healthy result (consecutive_failure_tolerance="
                    f"{self.consecutive_failure_tolerance}); the last one's failures: "
                    f"{dict(call.kinds)}. In a trainable, let this error through: the trial is "
                    "retried from its latest checkpoint."
                )


def _call_payload(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    from ..objects.cell_source import dumps

    if not callable(fn):
        raise TypeError(f"WorkerGroup.map(fn={fn!r}): fn must be a function fn(worker, ...).")
    return dumps((fn, args, kwargs))


def _describe(error: dict) -> str:
    what = f"{error.get('type')}: {error.get('message')}" if error.get("type") \
        else error.get("message")
    return f"{error.get('kind')} {what}"
