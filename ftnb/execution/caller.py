"""Attempts run in the calling thread: ``ScalingConfig(num_workers=0)``, Ray Train's local mode.

The controller's thread is the caller's (``TorchTrainer.fit()``, ``Tuner.fit()``): when the
controller polls, this executor runs the attempt it was given to its end, right there, then
hands over every event the attempt sent. So the training loop runs in the caller's process and
thread: a breakpoint, ``pdb.set_trace()`` or a debugger's stepping work as in any function, and
the loop sees the caller's modules and objects themselves (nothing is pickled).

What that costs, on purpose (a debugging mode, as Ray's):

* One attempt at a time (``has_room`` is False while one is held), and the live status, the
  hang watch and stop requests act only between attempts, since the controller is the one
  running the loop. A scheduler that waits for its decision at a report cannot answer: the
  front doors refuse it before anything starts.
* What the loop prints goes to the caller's ``sys.stdout``/``sys.stderr`` (where ``pdb``
  talks), not to the trial's ``stdout``/``stderr`` files.
* Ctrl+C lands in the loop; it ends the attempt as interrupted (never a failure) and the
  controller saves the experiment as resumable, as with any executor.
"""

from __future__ import annotations

import signal
from typing import Any, Optional

from .contract import AttemptEvent, AttemptSpec, ExitEvent, StartedEvent
from .inprocess import InProcessExecutor, _Attempt, _ThreadChannel
from .resources import ResourcePool

__all__ = ["CallerExecutor"]


class _CallerChannel(_ThreadChannel):
    """An attempt's channel when it runs in the controller's own thread: nothing can answer a
    report that waits for a decision, and output is the caller's."""

    def decision(self, iteration: int) -> str:
        raise RuntimeError(  # the front doors refuse such schedulers in local mode
            "ScalingConfig(num_workers=0) runs the loop in the caller's thread, where no "
            "scheduler decision can be waited for. Fix: num_workers=1 with a scheduler.")

    def output(self, stream: str, text: str) -> None:  # the caller's streams are not routed
        return


class CallerExecutor(InProcessExecutor):
    """Runs each attempt in the thread that polls it (see the module docstring)."""

    name = "caller"

    def __init__(self, *, pool: Optional[ResourcePool] = None, output_events: bool = False
                 ) -> None:
        super().__init__(pool=pool, output_events=False)
        self._pending: list[_Attempt] = []
        self._interrupted: set[str] = set()

    def has_room(self, resources: Any, num_workers: int = 1) -> bool:
        return not self._attempts and super().has_room(resources, num_workers)

    def start(self, spec: AttemptSpec) -> None:
        if self._closed:
            raise RuntimeError("this executor was shut down: it starts nothing more")
        self.check_fits(spec.resources, spec.num_workers)
        if spec.trial_id in self._attempts:
            raise ValueError(f"trial {spec.trial_id!r} already has a running attempt here")
        (allocation,) = self._allocate(spec)
        attempt = _Attempt(spec, allocation, output_events=False)
        self._attempts[spec.trial_id] = attempt
        self._pending.append(attempt)

    def poll(self, timeout: float) -> list[AttemptEvent]:
        while self._pending:
            self._run_here(self._pending.pop(0))
        return super().poll(0 if not self._events.empty() else timeout)

    def _run_here(self, attempt: _Attempt) -> None:
        from .attempt import EXIT_ERROR, report_exception, run_attempt
        from .inprocess import _KilledGuard

        channel = _CallerChannel(self._events, attempt)
        channel.send(StartedEvent(*attempt.ids, pids=()))
        code: Optional[int] = EXIT_ERROR
        try:
            code = run_attempt(attempt.spec, channel, this_thread_only=True,
                               guard=_KilledGuard(attempt), passthrough=(KeyboardInterrupt,))
        except KeyboardInterrupt:
            # The controller stops every trial next: this one then ends as interrupted.
            self._interrupted.add(attempt.spec.trial_id)
            raise
        except BaseException as exc:  # ftnb's own code failed: the attempt fails, not the caller
            report_exception(channel, attempt.ids, exc, "exception")
        self._end(attempt, ExitEvent.of_one(*attempt.ids, code))

    def request_stop(self, trial_id: str) -> None:
        if trial_id in self._interrupted:  # Ctrl+C ended its loop already
            self.kill(trial_id)
        super().request_stop(trial_id)

    def kill(self, trial_id: str) -> None:
        attempt = self._attempts.get(trial_id)
        if attempt is None:
            return
        attempt.killed.set()
        self._interrupted.discard(trial_id)
        self._pending = [a for a in self._pending if a is not attempt]
        self._end(attempt, ExitEvent.of_one(*attempt.ids, -signal.SIGKILL))
