"""Attempts as threads of this process: the executor contract without processes, for fast tests.

It keeps the whole contract of :mod:`ftnb.execution.contract` (the same events in the same order,
resources from a pool, stop requests, kills, shutdown) and runs the same attempt body as the
process executor (:func:`ftnb.execution.attempt.run_attempt`), so a test of the controller can run
dozens of attempts in a fraction of a second. What a thread cannot do, it does not pretend to:

* The spec is copied with cloudpickle, as it would travel to a process (a trainable that changes
  its config changes its own copy; an unpicklable spec fails the same way).
* Resources are counted, not enforced: every thread sees this process's GPUs and environment.
* Output: what an attempt's thread prints to ``sys.stdout``/``sys.stderr`` becomes output
  events (whole lines), while any attempt runs; threads the trainable starts print as usual.
  There are no stdout/stderr files in the trial's folder.
* ``kill`` ends the attempt for the controller at once: its exit event (a SIGKILL) is queued
  before ``kill`` returns, its resources are released when that event is polled, every later
  event of the attempt is dropped, and an exception (:class:`AttemptKilled`) is raised in its
  thread. That exception lands when the thread next runs Python code (a thread blocked in a
  long C call, such as ``time.sleep(60)``, keeps blocking until it returns); any report it makes
  after the kill is fenced before it writes. A write already past its fence check completes.
* There is no preemption (SIGTERM goes to the whole process), and a trainable must not end the
  process (``os._exit``, signals).
"""

from __future__ import annotations

import ctypes
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .contract import (
    AttemptEvent,
    AttemptSpec,
    ExitEvent,
    OutputEvent,
    StartedEvent,
)
from .one_machine import OneMachineExecutor
from .resources import Allocation, ResourcePool

__all__ = ["AttemptKilled", "InProcessExecutor"]


class AttemptKilled(BaseException):
    """Raised in the thread of an attempt that :meth:`InProcessExecutor.kill` ended."""


@dataclass
class _Attempt:
    spec: AttemptSpec
    allocation: Allocation
    output_events: bool
    thread: Optional[threading.Thread] = None
    # Held while an event is queued and while the attempt is ended, so that nothing of it is
    # queued after its exit event.
    lock: threading.Lock = field(default_factory=threading.Lock)
    ended: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)
    #: The controller's answers to reports that wait for one, by iteration.
    decisions: dict = field(default_factory=dict)
    decided: threading.Condition = field(default_factory=threading.Condition)
    partial: dict = field(default_factory=lambda: {"stdout": "", "stderr": ""})

    @property
    def ids(self) -> tuple[str, int]:
        return (self.spec.trial_id, self.spec.attempt)


@dataclass(frozen=True)
class _Ended:
    """Queued after the attempt's last event: the executor releases it when it is polled."""

    attempt: _Attempt
    exit: ExitEvent


class _ThreadChannel:
    """An attempt's channel to the executor (see ftnb.execution.attempt.AttemptChannel)."""

    def __init__(self, events: "queue.Queue[Any]", attempt: _Attempt) -> None:
        self.events = events
        self.attempt = attempt

    def send(self, event: AttemptEvent) -> None:
        with self.attempt.lock:
            if not self.attempt.ended:
                self.events.put(event)

    def stop_requested(self) -> bool:
        return self.attempt.stop.is_set()

    def decision(self, iteration: int) -> str:
        attempt = self.attempt
        with attempt.decided:
            # (A timed wait: a kill's exception lands in Python code between two waits.)
            while iteration not in attempt.decisions:
                if attempt.ended:
                    return "stop"
                attempt.decided.wait(0.1)
            return attempt.decisions.pop(iteration)

    def output(self, stream: str, text: str) -> None:
        """``text`` printed by the attempt's thread: hand over its whole lines."""
        if not self.attempt.output_events:
            return
        pending = self.attempt.partial[stream] + text
        cut = pending.rfind("\n") + 1
        self.attempt.partial[stream] = pending[cut:]
        if cut:
            self.send(OutputEvent(*self.attempt.ids, stream=stream, text=pending[:cut]))


class _KilledGuard:
    """The attempt's own fence: once killed, it writes nothing more."""

    def __init__(self, attempt: _Attempt) -> None:
        self.attempt = attempt

    def check(self, force: bool = False) -> None:
        if self.attempt.killed.is_set():
            from ..storage.lease import FencedError

            raise FencedError("the executor killed this attempt; it writes nothing more")


class InProcessExecutor(OneMachineExecutor):
    """Runs each attempt in a thread of this process (see the module docstring).

    ``pool``: the CPUs and GPUs to count (default: what this machine has). ``output_events``:
    hand what attempts print over as output events (else it is dropped).
    """

    name = "inprocess"

    def __init__(self, *, pool: Optional[ResourcePool] = None, output_events: bool = True) -> None:
        super().__init__(pool)
        self._output_events = output_events
        self._events: "queue.Queue[Any]" = queue.Queue()
        self._attempts: dict[str, _Attempt] = {}
        self._threads: list[threading.Thread] = []  # killed ones may run on for a while
        self._routing = False

    # -- starting --------------------------------------------------------------------------------
    def start(self, spec: AttemptSpec) -> None:
        payload, (allocation,) = self._admit(spec)
        attempt = _Attempt(spec, allocation, self._output_events)
        if not self._routing:
            _route_output(True)
            self._routing = True
        attempt.thread = threading.Thread(
            target=self._run, args=(attempt, payload), name=f"ftnb-attempt-{spec.trial_id}",
            daemon=True,
        )
        self._attempts[spec.trial_id] = attempt
        self._threads = [t for t in self._threads if t.is_alive()] + [attempt.thread]
        attempt.thread.start()

    def _run(self, attempt: _Attempt, payload: bytes) -> None:
        import cloudpickle

        from .attempt import EXIT_ERROR, report_exception, run_attempt

        channel = _ThreadChannel(self._events, attempt)
        _sink.channel = channel
        code: Optional[int] = EXIT_ERROR
        try:
            channel.send(StartedEvent(*attempt.ids, pids=()))
            try:
                spec = cloudpickle.loads(payload)
            except BaseException as exc:  # as in a process: the trainable could not be loaded
                report_exception(channel, attempt.ids, exc, "exception")
                return
            code = run_attempt(spec, channel, this_thread_only=True,
                               guard=_KilledGuard(attempt), passthrough=(AttemptKilled,))
        except AttemptKilled:
            pass  # its exit event is queued already
        except BaseException as exc:  # ftnb's own code failed: the attempt fails, not the process
            report_exception(channel, attempt.ids, exc, "exception")
        finally:
            _sink.channel = None
            self._end(attempt, ExitEvent.of_one(*attempt.ids, code))

    def _end(self, attempt: _Attempt, exit_event: ExitEvent) -> bool:
        with attempt.lock:
            if attempt.ended:
                return False
            attempt.ended = True
            self._events.put(_Ended(attempt, exit_event))
            return True

    def running(self) -> list[str]:
        return list(self._attempts)

    # -- events ----------------------------------------------------------------------------------
    def poll(self, timeout: float) -> list[AttemptEvent]:
        if not self._attempts and self._events.empty():
            time.sleep(min(timeout, 0.05))
            return []
        items = []
        try:
            items.append(self._events.get(timeout=timeout))
            while True:
                items.append(self._events.get_nowait())
        except queue.Empty:
            pass
        events: list[AttemptEvent] = []
        for item in items:
            if isinstance(item, _Ended):
                self._attempts.pop(item.attempt.spec.trial_id, None)
                self._pool.release(item.attempt.allocation)
                events.append(item.exit)
            else:
                events.append(item)
        return events

    # -- stopping --------------------------------------------------------------------------------
    def request_stop(self, trial_id: str) -> None:
        attempt = self._attempts.get(trial_id)
        if attempt is not None:
            attempt.stop.set()

    def decide(self, trial_id: str, iteration: int, decision: str) -> None:
        attempt = self._attempts.get(trial_id)
        if attempt is None:
            return
        with attempt.decided:
            attempt.decisions[iteration] = decision
            attempt.decided.notify_all()

    def kill(self, trial_id: str) -> None:
        attempt = self._attempts.get(trial_id)
        if attempt is None:
            return
        attempt.killed.set()
        if self._end(attempt, ExitEvent.of_one(*attempt.ids, -signal.SIGKILL)):
            _raise_in_thread(attempt.thread, AttemptKilled)

    def shutdown(self) -> None:
        self._closed = True
        for trial_id in list(self._attempts):
            self.kill(trial_id)
        while self._attempts:
            self.poll(0)
        # What a killed thread prints before it ends still goes to its (dropped) output.
        deadline = time.monotonic() + 2.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        if self._routing:
            _route_output(False)
            self._routing = False


def _raise_in_thread(thread: Optional[threading.Thread], exc_type: type) -> None:
    """Raise ``exc_type`` in ``thread`` when it next runs Python code."""
    if thread is None or thread.ident is None or not thread.is_alive():
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                               ctypes.py_object(exc_type))


# ---- output: sys.stdout/sys.stderr routed by thread ---------------------------------------------

_sink = threading.local()  # .channel: the _ThreadChannel of the attempt this thread runs
_routing_lock = threading.Lock()
_routing_users = 0


class _RoutedStream:
    """Stands in for ``sys.stdout``/``sys.stderr``: an attempt's thread writes to its attempt,
    every other thread to the stream it replaced."""

    def __init__(self, stream: str, original: Any) -> None:
        self._stream = stream
        self._original = original

    def write(self, text: str) -> int:
        channel = getattr(_sink, "channel", None)
        if channel is None:
            return self._original.write(text)
        channel.output(self._stream, text)
        return len(text)

    def flush(self) -> None:
        if getattr(_sink, "channel", None) is None:
            self._original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def _route_output(on: bool) -> None:
    """Count an executor in (``on``) or out; the first in puts the routed streams in place, the
    last out puts back what they replaced (unless someone replaced them since)."""
    global _routing_users
    with _routing_lock:
        _routing_users += 1 if on else -1
        if on and _routing_users == 1:
            sys.stdout = _RoutedStream("stdout", sys.stdout)  # type: ignore[assignment]
            sys.stderr = _RoutedStream("stderr", sys.stderr)  # type: ignore[assignment]
        elif not on and _routing_users == 0:
            for name in ("stdout", "stderr"):
                current = getattr(sys, name)
                if isinstance(current, _RoutedStream):
                    setattr(sys, name, current._original)
