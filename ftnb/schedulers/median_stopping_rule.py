"""The median stopping rule (Golovin et al., 2017), Ray Tune's ``MedianStoppingRule``.

A trial is stopped at a report (once ``time_attr`` reached ``grace_period``) when its best
result so far is worse than the median of the other trials' running means up to that time,
given at least ``min_samples_required`` other trials got that far. Every report from
``grace_period`` on is a decision point: it waits for the decision, so a stopped trial ends
exactly at the report that decided it.
"""

from __future__ import annotations

import statistics
from typing import Optional

from ..storage.result_log import metric_value
from .decision_points import DecisionPoints
from .trial_scheduler import (
    FIFOScheduler,
    SchedulerController,
    Trial,
    TrialScheduler,
    _checked_metric,
    _checked_mode,
    _checked_number,
    _checked_time_attr,
    _number,
)

__all__ = ["MedianStoppingRule"]



class MedianStoppingRule(FIFOScheduler):
    """Stop trials that do worse than the median of the others (Ray Tune's rule and arguments).

    Args:
        time_attr: what measures progress (``time_total_s`` by default, as in Ray).
        metric, mode: what to compare, and whether higher or lower is better (None: TuneConfig's).
        grace_period: no trial is stopped before ``time_attr`` reaches this.
        min_samples_required: how many other trials must have got that far.
        min_time_slice: with too few other trials and trials waiting to run, a trial is paused
            (it yields to them) at most once per this much ``time_attr``.
        hard_stop: stop (True) or pause (False) a trial below the median; a paused one is
            resumed later from its latest checkpoint and never judged again.

    The state (each trial's ``(time_attr, metric)`` history, the trials stopped) is JSON in
    the experiment state; a report redone after a restart from a checkpoint replaces the one it
    redoes, so every iteration counts once.
    """

    def __init__(self, time_attr: str = "time_total_s", metric: Optional[str] = None,
                 mode: Optional[str] = None, grace_period: float = 60.0,
                 min_samples_required: int = 3, min_time_slice: float = 0,
                 hard_stop: bool = True) -> None:
        owner = type(self).__name__
        _checked_time_attr(owner, time_attr, "'time_total_s' or 'training_iteration'")
        self._metric = _checked_metric(owner, metric)
        self._mode = _checked_mode(owner, mode)
        _checked_number(owner, "grace_period", grace_period, above=False)
        _checked_number(owner, "min_samples_required", min_samples_required, minimum=1,
                        above=False, whole=True)
        _checked_number(owner, "min_time_slice", min_time_slice, above=False)
        if not isinstance(hard_stop, bool):
            raise TypeError(f"{owner}(hard_stop={hard_stop!r}) must be True or False.")
        self._time_attr = time_attr
        self._grace_period = grace_period
        self._min_samples_required = int(min_samples_required)
        self._min_time_slice = min_time_slice
        self._hard_stop = hard_stop
        #: Each trial's ``[time, value]`` pairs, in time order.
        self._results: dict[str, list] = {}
        self._stopped_trials: set[str] = set()
        self._last_pause: dict[str, float] = {}
        #: Why each stopped trial was stopped: [time, best, median].
        self._why: dict[str, list] = {}

    def _ftnb_settings(self) -> Optional[dict]:
        if type(self) is not MedianStoppingRule:
            return None
        return {"time_attr": self._time_attr, "metric": self._metric, "mode": self._mode,
                "grace_period": self._grace_period,
                "min_samples_required": self._min_samples_required,
                "min_time_slice": self._min_time_slice, "hard_stop": self._hard_stop}

    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"MedianStoppingRule has no metric and mode to compare trials by: "
                f"metric={self._metric!r}, mode={self._mode!r}. Fix: pass them to the scheduler "
                "or to TuneConfig(metric='loss', mode='min').")

    def _record(self, trial_id: str, time: float, value: float) -> None:
        history = self._results.setdefault(trial_id, [])
        while history and history[-1][0] >= time:
            history.pop()  # the trial went back to a checkpoint and redoes this
        history.append([time, value])

    def on_trial_result(self, tune_controller: SchedulerController, trial: Trial,
                        result: dict) -> str:
        trial_id = trial.trial_id
        time = _number(metric_value(result, self._time_attr))
        value = _number(metric_value(result, self._metric)) if self._metric else None
        if time is None or value is None:
            return TrialScheduler.CONTINUE
        if trial_id in self._stopped_trials:
            # Paused below the median (hard_stop=False) and resumed: it runs on as with FIFO.
            return TrialScheduler.CONTINUE
        self._record(trial_id, time, value)
        if time < self._grace_period:
            return TrialScheduler.CONTINUE
        others = [t for t, h in self._results.items() if t != trial_id and h[-1][0] >= time]
        if len(others) < self._min_samples_required:
            return self._on_insufficient_samples(tune_controller, trial_id, time)
        median = statistics.median(self._running_mean(t, time) for t in others)
        best = self._best_result(trial_id)
        worse = best < median if self._mode == "max" else best > median
        if not worse:
            return TrialScheduler.CONTINUE
        self._stopped_trials.add(trial_id)
        self._why[trial_id] = [time, best, median]
        return TrialScheduler.STOP if self._hard_stop else TrialScheduler.PAUSE

    def _on_insufficient_samples(self, tune_controller: SchedulerController, trial_id: str,
                                 time: float) -> str:
        pause = time - self._last_pause.get(trial_id, float("-inf")) > self._min_time_slice
        if pause:
            pause = any(tune_controller.status_of(t) in ("PENDING", "PAUSED")
                        for t in tune_controller.get_trials())
        if pause:
            self._last_pause[trial_id] = time
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def _running_mean(self, trial_id: str, time: float) -> float:
        scoped = [v for t, v in self._results[trial_id] if self._grace_period <= t <= time]
        return statistics.fmean(scoped) if scoped else float("nan")

    def _best_result(self, trial_id: str) -> float:
        values = [v for _, v in self._results[trial_id]]
        return max(values) if self._mode == "max" else min(values)

    def on_trial_complete(self, tune_controller: SchedulerController, trial: Trial,
                          result: Optional[dict]) -> None:
        if not result:
            return
        time = _number(metric_value(result, self._time_attr))
        value = _number(metric_value(result, self._metric)) if self._metric else None
        if time is not None and value is not None:
            self._record(trial.trial_id, time, value)

    def decision_points(self, trial: Trial) -> Optional[DecisionPoints]:
        return DecisionPoints(self._time_attr, from_value=self._grace_period)

    def stop_note(self, trial: Trial) -> Optional[str]:
        why = self._why.get(trial.trial_id)
        if why is None:
            return "stopped by MedianStoppingRule"
        time, best, median = why
        return (f"stopped by MedianStoppingRule at {self._time_attr}={time:g}: best "
                f"{self._metric}={best:.6g} worse than the median {median:.6g} of the others")

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={len(self._stopped_trials)}."

    def get_state(self) -> dict:
        return {"results": {k: [list(p) for p in v] for k, v in self._results.items()},
                "stopped": sorted(self._stopped_trials), "last_pause": dict(self._last_pause),
                "why": dict(self._why)}

    def set_state(self, state: dict) -> None:
        self._results = {k: [list(p) for p in v] for k, v in (state.get("results") or {}).items()}
        self._stopped_trials = set(state.get("stopped") or [])
        self._last_pause = dict(state.get("last_pause") or {})
        self._why = dict(state.get("why") or {})
