"""When the controller's loop is interrupted (Ctrl+C, an error in a listener, the lease lost):
its trials stopped and the experiment left resumable (:func:`interrupt_loop`), and the line that
resumes it, said once (:func:`say_interrupted`, which marks the exception with
:data:`RESUME_LINE_PRINTED` so that a script that does not catch it ends on that line).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from ..storage.lease import LeaseLostError
from .records import ExperimentStatus, TrialStatus

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["RESUME_LINE_PRINTED", "interrupt_loop", "say_interrupted"]

#: Set (True) on a KeyboardInterrupt once the controller printed the line that resumes the
#: experiment: a script that does not catch it has nothing more to say.
RESUME_LINE_PRINTED = "_ftnb_resume_line_printed"


def say_interrupted(exc: KeyboardInterrupt, name: str, resume_hint: str, what: str) -> None:
    """Print the line that resumes the interrupted experiment ``name`` (``what`` says what was
    done), and mark ``exc`` so that a script that does not catch it ends on that line."""
    print(f"\nftnb: experiment {name!r} interrupted; {what}. Resume it with:\n    {resume_hint}",
          file=sys.stderr, flush=True)
    setattr(exc, RESUME_LINE_PRINTED, True)  # see Tuner.fit


def interrupt_loop(controller: "Controller", exc: BaseException) -> None:
    """The loop of ``controller`` was interrupted by ``exc``: stop every trial, mark the
    experiment INTERRUPTED and persist, so it can be resumed.

    When another driver took the experiment over, kill the trials and write nothing."""
    c = controller
    c.stopping = c.stopping or "interrupted"
    if isinstance(exc, LeaseLostError) or (c.lease is not None and c.lease.lost):
        _abandon(c)
        return
    try:
        for trial_id in list(c.live):
            c.request_stop(trial_id)
        deadline = time.time() + min(10.0, c.failure_config.preemption_grace_period_s)
        while c.live and time.time() < deadline:
            c.handle_events()
        for trial_id in list(c.live):
            c.executor.kill(trial_id)
        deadline = time.time() + 5
        while c.live and time.time() < deadline:
            c.handle_events(answer=False)
        for trial in c.state.trials:
            if trial.status == TrialStatus.RUNNING:
                trial.status = TrialStatus.PAUSED.value
        c.state.status = ExperimentStatus.INTERRUPTED.value
        c.save(final=True)
    except BaseException:
        pass  # the original exception matters more; the state on disk stays resumable
    if isinstance(exc, KeyboardInterrupt) and c.resume_hint:
        say_interrupted(exc, c.state.name, c.resume_hint,
                        "its trials were stopped and its state saved")


def _abandon(controller: "Controller") -> None:
    """Another driver owns the experiment now: kill our trials and write nothing more."""
    for trial_id in list(controller.live):
        try:
            controller.executor.kill(trial_id)
        except Exception:
            pass
    controller.live.clear()
