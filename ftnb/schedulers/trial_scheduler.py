"""The trial scheduler interface (Ray Tune's ``TrialScheduler``) and the default, FIFO.

A scheduler is policy: the controller tells it what happens (a trial added, a result, a trial
ended) and carries out what it answers (go on, stop the trial, pause it). It never touches a
process. Two things are ftnb's own:

* :meth:`TrialScheduler.decision_points`: the reports at which the scheduler may decide (ASHA's
  rungs, for instance). Those reports, and only those, wait in ``ftnb.report()`` for the
  decision, so a trial the scheduler stops ends exactly there; every other report returns as
  soon as it is persisted.
* :meth:`TrialScheduler.get_state` / :meth:`TrialScheduler.set_state`: the scheduler's state as
  plain JSON, saved in the experiment's state before each decision is carried out, never a
  pickle. A restore (after a driver SIGKILL too) rebuilds the scheduler from it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional, Protocol

from .decision_points import DecisionPoints


__all__ = ["FIFOScheduler", "SchedulerController", "Trial", "TrialScheduler"]

#: What a scheduler is given of a trial: its record (``ftnb.core.records.TrialRecord``), with
#: ``trial_id``, ``config``, ``status``, ``last_result`` and ``iteration``, as Ray's ``Trial``.
Trial = Any


class SchedulerController(Protocol):
    """What a scheduler may ask of the controller (Ray passes its ``TuneController`` as
    ``tune_controller``; ftnb passes this narrower view of its own)."""

    def get_trials(self) -> list[Trial]:
        """Every trial of the experiment, in order."""
        ...

    def get_trial(self, trial_id: str) -> Trial:
        """The trial ``trial_id``."""
        ...

    def status_of(self, trial: Trial) -> str:
        """The trial's status as a scheduler sees it: ``PAUSED`` as soon as it was told to
        pause (its attempt may still be ending), else its record's."""
        ...

    def stop_trial(self, trial: Trial, note: Optional[str] = None) -> None:
        """End the trial: a paused or pending one at once, a running one at its next report.
        ``note`` says why (None: the scheduler's :meth:`TrialScheduler.stop_note`)."""
        ...

    def pause_trial(self, trial: Trial) -> None:
        """Pause a running trial at its next report (it keeps its checkpoints and is resumed
        from the latest when :meth:`TrialScheduler.choose_trial_to_run` picks it)."""
        ...

    def next_pending_trial(self) -> Optional[Trial]:
        """The PENDING trial the experiment would start next (its own order), or None."""
        ...

    def may_add_trials(self) -> bool:
        """Whether the experiment may still add trials (its search algorithm is not done): a
        scheduler that waits for a bracket to fill (HyperBandForBOHB) waits for them."""
        ...


def _number(value: Any) -> Optional[float]:
    """``value`` when it is a number a scheduler can compare (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _checked_time_attr(owner: str, time_attr: Any, examples: str) -> str:
    if not isinstance(time_attr, str) or not time_attr:
        raise TypeError(f"{owner}(time_attr={time_attr!r}) must be the name of a reported, "
                        f"increasing number, e.g. {examples}.")
    return time_attr


def _checked_mode(owner: str, mode: Any) -> Optional[str]:
    if mode not in (None, "min", "max"):
        raise ValueError(f"{owner}(mode={mode!r}) is invalid. Fix: mode='min' or mode='max' "
                         "(or None to take TuneConfig's).")
    return mode


def _checked_metric(owner: str, metric: Any) -> Optional[str]:
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise TypeError(f"{owner}(metric={metric!r}) must be the name of a reported metric "
                        "(str), e.g. metric='loss', or None to take TuneConfig's.")
    return metric


def _checked_number(owner: str, name: str, value: Any, *, minimum: float = 0.0,
                    above: bool = True, whole: bool = False) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and whole:
        ok = float(value).is_integer()
    if ok:
        ok = value > minimum if above else value >= minimum
    if not ok:
        what = "a whole number" if whole else "a number"
        relation = ">" if above else ">="
        raise ValueError(f"{owner}({name}={value!r}) is invalid. Fix: {what} {relation} "
                         f"{minimum:g}.")
    return int(value) if whole else value


class TrialScheduler:
    """Base class of a trial scheduler (Ray Tune's ``tune.schedulers.TrialScheduler``).

    Override what you need; every hook gets the controller's view (``tune_controller``, see
    :class:`SchedulerController`) and the trial's record (``trial.trial_id``, ``trial.config``,
    ``trial.status``, ``trial.last_result``). :meth:`on_trial_result` answers
    :attr:`CONTINUE`, :attr:`PAUSE` or :attr:`STOP`.

    To survive a restore, keep the state in JSON-able values and return it from
    :meth:`get_state` (restored with :meth:`set_state`); a restore needs the scheduler passed
    again (``TuneConfig(scheduler=...)`` to ``ftnb.run``, or ``Tuner.restore(...,
    scheduler=...)``) unless it is one of ftnb's, which are rebuilt from the state.
    """

    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"
    #: Ray's "nothing to do" answer, taken as CONTINUE.
    NOOP = "NOOP"

    _metric: Optional[str] = None
    _mode: Optional[str] = None

    @property
    def metric(self) -> Optional[str]:
        return self._metric

    @property
    def mode(self) -> Optional[str]:
        return self._mode

    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              **spec: Any) -> bool:
        """Take ``TuneConfig``'s metric and mode where the scheduler was given none; False
        (the controller then raises) when both name a metric and they differ."""
        if self._metric and metric and self._metric != metric:
            return False
        if self._mode and mode and self._mode != mode:
            return False
        if metric and not self._metric:
            self._metric = metric
        if mode and not self._mode:
            self._mode = mode
        return True

    # -- Ray Tune's hooks ----------------------------------------------------------------------
    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        """A trial joined the experiment (before it starts)."""

    def on_trial_error(self, tune_controller: SchedulerController,
                       trial: Trial) -> None:
        """The trial ended ERRORED."""

    def on_trial_result(self, tune_controller: SchedulerController, trial: Trial,
                        result: dict) -> str:
        """A report of the trial was persisted: :attr:`CONTINUE`, :attr:`PAUSE` or
        :attr:`STOP`. At a decision point the trial waits for this answer and ends exactly
        there when it is not CONTINUE; elsewhere it ends at its next report."""
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: SchedulerController, trial: Trial,
                          result: Optional[dict]) -> None:
        """The trial ended TERMINATED (finished, or stopped by anyone); ``result``: its last."""

    def on_trial_remove(self, tune_controller: SchedulerController,
                        trial: Trial) -> None:
        """The trial left the experiment without completing (Ray calls it for stopped trials;
        ftnb calls :meth:`on_trial_complete` for those)."""

    def choose_trial_to_run(self, tune_controller: SchedulerController
                            ) -> Optional[Trial]:
        """The PENDING or PAUSED trial to start (or resume) next, or None: none now."""
        return tune_controller.next_pending_trial()

    def debug_string(self) -> str:
        """One line about the scheduler's state, for logs."""
        return f"Using {type(self).__name__} scheduling algorithm."

    # -- ftnb's own ----------------------------------------------------------------------------
    def decision_points(self, trial: Trial) -> Optional[DecisionPoints]:
        """The trial's reports that wait for :meth:`on_trial_result`'s answer (None: none,
        every report returns at once and a STOP or PAUSE takes effect at the next report)."""
        return None

    def stop_note(self, trial: Trial) -> Optional[str]:
        """Why the scheduler stopped ``trial``, as its record's note (views show the trial
        ``STOPPED``, not completed); None when the stop completes it (it ran its budget)."""
        return f"stopped by {type(self).__name__}"

    def get_state(self) -> dict:
        """The scheduler's state as JSON-able values (saved in the experiment state before each
        decision is carried out). Default: nothing."""
        return {}

    def set_state(self, state: dict) -> None:
        """Take back what :meth:`get_state` returned (on a restore)."""

    def save(self, checkpoint_path: str) -> None:
        """Write :meth:`get_state` to ``checkpoint_path`` as JSON (Ray's method; ftnb saves the
        state itself, in the experiment state)."""
        with open(checkpoint_path, "w") as f:
            json.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        """Read what :meth:`save` wrote."""
        with open(checkpoint_path) as f:
            self.set_state(json.load(f))

    def _ftnb_settings(self) -> Optional[dict]:
        """The arguments that rebuild this scheduler (ftnb's schedulers; None: a class of the
        user's, which a restore needs passed again)."""
        return None


class FIFOScheduler(TrialScheduler):
    """Runs trials in the order they were added, each to its end (the default)."""

    def __init__(self) -> None:
        pass

    def _ftnb_settings(self) -> Optional[dict]:
        return {} if type(self) is FIFOScheduler else None
