"""Asynchronous successive halving (ASHA), Ray Tune's ``AsyncHyperBandScheduler``.

Each bracket has rungs at ``grace_period * reduction_factor ** k`` (of ``time_attr``), below
``max_t``. The first report of a trial at or past a rung records its metric there; if it is
worse than the rung's cutoff (the ``1 - 1/reduction_factor`` quantile of what the rung has
recorded so far, NaN ignored, linear interpolation as ``numpy.nanpercentile``), the trial is
stopped right there. A trial reaching ``max_t`` is stopped as having run its budget
(``stop_last_trials``). These are Ray's rules, with the same rungs and cutoffs.

ftnb's own: the rungs are the trial's decision points (its reports there wait for the
decision, so a stopped trial's last row is at its rung), the state is JSON, and a trial's
bracket is drawn from its id (the same after any restore).
"""

from __future__ import annotations

import math
import random
import zlib
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

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]


def nan_percentile(values: list, q: float) -> float:
    """``numpy.nanpercentile(values, q)`` (linear interpolation, NaN ignored; NaN when no
    value is left), without numpy.

    >>> nan_percentile([1.0, 2.0, 3.0, 4.0], 75)
    3.25
    """
    data = sorted(v for v in values if not (isinstance(v, float) and math.isnan(v)))
    if not data:
        return math.nan
    position = (len(data) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)



class _Bracket:
    """One bracket: rungs (milestone, {trial_id: recorded value}), highest milestone first."""

    def __init__(self, min_t: float, max_t: float, reduction_factor: float, s: int,
                 stop_last_trials: bool) -> None:
        self.rf = reduction_factor
        max_rungs = int(math.log(max_t / min_t) / math.log(reduction_factor) - s + 1)
        self.rungs: list[tuple[float, dict]] = [
            (min_t * reduction_factor ** (k + s), {}) for k in reversed(range(max_rungs))]
        self.stop_last_trials = stop_last_trials

    def cutoff(self, recorded: dict) -> Optional[float]:
        if not recorded:
            return None
        return nan_percentile(list(recorded.values()), (1 - 1 / self.rf) * 100)

    def on_result(self, trial_id: str, cur_iter: float, cur_rew: Optional[float]
                  ) -> tuple[str, Optional[tuple[float, float, float]]]:
        """The decision, and (milestone, value, cutoff) when it stops the trial at a rung."""
        action = TrialScheduler.CONTINUE
        for milestone, recorded in self.rungs:
            if cur_iter >= milestone and trial_id in recorded and not self.stop_last_trials:
                break  # decided at this rung already (rungs are highest first)
            if cur_iter < milestone or trial_id in recorded:
                continue
            cutoff = self.cutoff(recorded)
            stopped = None
            if cutoff is not None and cur_rew is not None and cur_rew < cutoff:
                action = TrialScheduler.STOP
                stopped = (milestone, cur_rew, cutoff)
            if cur_rew is not None:
                recorded[trial_id] = cur_rew
            return action, stopped
        return action, None

    def milestones(self) -> list[float]:
        return sorted(m for m, _ in self.rungs)


class AsyncHyperBandScheduler(FIFOScheduler):
    """ASHA (Li et al., 2018), with Ray Tune's arguments and rules.

    Args:
        time_attr: what measures a trial's progress (a reported, increasing number):
            ``training_iteration`` (default) or ``time_total_s``, or a metric of yours.
        metric, mode: what to compare and whether higher (``"max"``) or lower (``"min"``) is
            better; None takes ``TuneConfig(metric=..., mode=...)``.
        max_t: a trial's budget in ``time_attr``: it is stopped once it reaches it.
        grace_period: no trial is stopped before this much ``time_attr`` (the first rung).
        reduction_factor: rungs are this factor apart; at each, the best ``1/reduction_factor``
            go on.
        brackets: how many brackets (each trial drawn into one; the later start at higher
            rungs).
        stop_last_trials: stop trials at ``max_t`` (True, Ray's default).

    Example::

        from ftnb.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(max_t=27, grace_period=1, reduction_factor=3)
        ftnb.Tuner(train, param_space=space,
                   tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=50,
                                               scheduler=scheduler)).fit()

    A trial's reports at its rungs wait for the decision (report a checkpoint there if the
    trial may be resumed); the others return at once.
    """

    def __init__(self, time_attr: str = "training_iteration", metric: Optional[str] = None,
                 mode: Optional[str] = None, max_t: float = 100, grace_period: float = 1,
                 reduction_factor: float = 4, brackets: int = 1,
                 stop_last_trials: bool = True) -> None:
        owner = type(self).__name__
        _checked_time_attr(owner, time_attr, "'training_iteration' or 'time_total_s'")
        self._metric = _checked_metric(owner, metric)
        self._mode = _checked_mode(owner, mode)
        _checked_number(owner, "max_t", max_t)
        _checked_number(owner, "grace_period", grace_period)
        _checked_number(owner, "reduction_factor", reduction_factor, minimum=1)
        _checked_number(owner, "brackets", brackets, minimum=1, above=False, whole=True)
        if grace_period > max_t:
            raise ValueError(f"{owner}(grace_period={grace_period!r}, max_t={max_t!r}): the "
                             "grace period must not exceed max_t. Fix: grace_period <= max_t.")
        if not isinstance(stop_last_trials, bool):
            raise TypeError(f"{owner}(stop_last_trials={stop_last_trials!r}) must be True or "
                            "False.")
        self._time_attr = time_attr
        self._max_t = max_t
        self._grace_period = grace_period
        self._reduction_factor = reduction_factor
        self._stop_last_trials = stop_last_trials
        self._brackets = [_Bracket(grace_period, max_t, reduction_factor, s, stop_last_trials)
                          for s in range(int(brackets))]
        self._trial_bracket: dict[str, int] = {}
        #: Why each trial it stopped was stopped: [milestone, value, cutoff], or None (max_t).
        self._stopped: dict[str, Optional[list]] = {}
        self._num_stopped = 0

    # -- settings ------------------------------------------------------------------------------
    def _ftnb_settings(self) -> Optional[dict]:
        if type(self) not in (AsyncHyperBandScheduler, ASHAScheduler):
            return None
        return {"time_attr": self._time_attr, "metric": self._metric, "mode": self._mode,
                "max_t": self._max_t, "grace_period": self._grace_period,
                "reduction_factor": self._reduction_factor, "brackets": len(self._brackets),
                "stop_last_trials": self._stop_last_trials}

    @property
    def _metric_op(self) -> float:
        return -1.0 if self._mode == "min" else 1.0

    # -- hooks ---------------------------------------------------------------------------------
    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"{type(self).__name__} has no metric and mode to compare trials by: "
                f"metric={self._metric!r}, mode={self._mode!r}. Fix: pass them to the scheduler "
                "or to TuneConfig(metric='loss', mode='min').")
        self._add(trial.trial_id)

    def _add(self, trial_id: str) -> int:
        if trial_id not in self._trial_bracket:
            self._trial_bracket[trial_id] = self._draw_bracket(trial_id)
        return self._trial_bracket[trial_id]

    def _draw_bracket(self, trial_id: str) -> int:
        # Ray's weights (a bracket with more rungs is likelier), drawn from the trial's id: the
        # same bracket after any restore, whoever adds it first.
        sizes = [len(b.rungs) for b in self._brackets]
        weights = [math.e ** (size - max(sizes)) for size in sizes]
        rng = random.Random(zlib.crc32(trial_id.encode("utf-8")))
        return rng.choices(range(len(self._brackets)), weights=weights)[0]

    def on_trial_result(self, tune_controller: SchedulerController, trial: Trial,
                        result: dict) -> str:
        trial_id = trial.trial_id
        cur_iter = _number(metric_value(result, self._time_attr))
        value = metric_value(result, self._metric) if self._metric else None
        if cur_iter is None or value is None:
            return TrialScheduler.CONTINUE
        if trial_id in self._stopped:
            return TrialScheduler.STOP  # decided before (a report redone after a restore)
        if cur_iter >= self._max_t and self._stop_last_trials:
            self._stopped[trial_id] = None
            action = TrialScheduler.STOP
        else:
            number = _number(value)
            reward = self._metric_op * number if number is not None else None
            bracket = self._brackets[self._add(trial_id)]
            action, where = bracket.on_result(trial_id, cur_iter, reward)
            if action == TrialScheduler.STOP and where is not None:
                milestone, reward, cutoff = where
                self._stopped[trial_id] = [milestone, self._metric_op * reward,
                                           self._metric_op * cutoff]
        self._num_stopped += action == TrialScheduler.STOP
        return action

    def on_trial_complete(self, tune_controller: SchedulerController, trial: Trial,
                          result: Optional[dict]) -> None:
        pass  # its rung entries stay: later trials are compared with them

    def decision_points(self, trial: Trial) -> Optional[DecisionPoints]:
        milestones = self._brackets[self._add(trial.trial_id)].milestones()
        if self._stop_last_trials:
            milestones.append(self._max_t)
        return DecisionPoints(self._time_attr, milestones=tuple(sorted(set(milestones))))

    def stop_note(self, trial: Trial) -> Optional[str]:
        where = self._stopped.get(trial.trial_id)
        if where is None:
            return None  # it reached max_t: it ran its budget
        milestone, value, cutoff = where
        return (f"stopped by {type(self).__name__} at {self._time_attr}={milestone:g}: "
                f"{self._metric}={value:.6g} worse than the rung's cutoff {cutoff:.6g}")

    def debug_string(self) -> str:
        lines = [f"Using AsyncHyperBand: num_stopped={self._num_stopped}"]
        for i, bracket in enumerate(self._brackets):
            rungs = ", ".join(f"Iter {m:.3f}: {len(r)} recorded" for m, r in bracket.rungs)
            lines.append(f"Bracket {i}: {rungs}")
        return "\n".join(lines)

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {
            "brackets": [[[m, dict(r)] for m, r in b.rungs] for b in self._brackets],
            "trial_bracket": dict(self._trial_bracket),
            "stopped": dict(self._stopped),
            "num_stopped": self._num_stopped,
        }

    def set_state(self, state: dict) -> None:
        brackets = state.get("brackets") or []
        if len(brackets) != len(self._brackets):
            raise ValueError(f"{type(self).__name__}: the saved state has {len(brackets)} "
                             f"brackets, this scheduler {len(self._brackets)}")
        for bracket, saved in zip(self._brackets, brackets):
            by_milestone = {float(m): dict(r) for m, r in saved}
            bracket.rungs = [(m, by_milestone.get(float(m), {})) for m, _ in bracket.rungs]
        self._trial_bracket = {k: int(v) for k, v in (state.get("trial_bracket") or {}).items()}
        self._stopped = dict(state.get("stopped") or {})
        self._num_stopped = int(state.get("num_stopped") or 0)


class ASHAScheduler(AsyncHyperBandScheduler):
    """Ray Tune's alias of :class:`AsyncHyperBandScheduler`."""
