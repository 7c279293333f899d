"""``HyperBandForBOHB``: the HyperBand of BOHB (Falkner et al., 2018), Ray Tune's
``ray.tune.schedulers.HyperBandForBOHB``, paired with :class:`ftnb.search.bohb.TuneBOHB`.

It is :class:`~ftnb.schedulers.HyperBandScheduler` with Ray's three changes for BOHB:

* a band's brackets go from the most aggressive on (``s = s_max`` first: many trials, a small
  first budget), as BOHB's model learns most from many cheap evaluations;
* a trial at its bracket's milestone is PAUSED until the bracket is *filled* and every trial of
  it reached the milestone; only then are the best ``1/eta`` resumed from their checkpoints
  (the others stopped);
* when no trial runs and no new one can come (the search is over), the brackets that wait are
  halved with the trials they have.

The budget of a result (its ``time_attr`` at one of its bracket's milestones) is what
:class:`~ftnb.search.bohb.TuneBOHB` learns from (Ray puts it in the result as
``hyperband_info``; ftnb's searcher asks :meth:`HyperBandForBOHB.budget_of`, which depends only
on the trial's bracket, so a restore that tells the searcher a result again gets the same
budget). Its state is HyperBand's JSON, in the experiment state: after a driver SIGKILL and a
restore its brackets, pauses and decisions go on where they were.
"""

from __future__ import annotations

from typing import Optional

from ..storage.result_log import metric_value
from .hyperband import HyperBandScheduler, _Bracket
from .trial_scheduler import SchedulerController, Trial, TrialScheduler, _number

__all__ = ["HyperBandForBOHB"]


class HyperBandForBOHB(HyperBandScheduler):
    """HyperBand for BOHB, with :class:`~ftnb.schedulers.HyperBandScheduler`'s arguments
    (``time_attr``, ``metric``, ``mode``, ``max_t``, ``reduction_factor``,
    ``stop_last_trials``). Use it with :class:`ftnb.search.bohb.TuneBOHB`::

        from ftnb.schedulers.hb_bohb import HyperBandForBOHB
        from ftnb.search.bohb import TuneBOHB

        tune_config = ftnb.TuneConfig(
            metric="loss", mode="min", num_samples=20,
            search_alg=ConcurrencyLimiter(TuneBOHB(), max_concurrent=4),
            scheduler=HyperBandForBOHB(max_t=27, reduction_factor=3))

    Report a checkpoint at each milestone (or every iteration): a paused trial resumes from its
    latest one.
    """

    def _ftnb_settings(self) -> Optional[dict]:
        return self._settings() if type(self) is HyperBandForBOHB else None

    def _next_bracket_s(self, band: list) -> int:
        return self._s_max_1 - len(band) - 1

    def _at_milestone(self, tune_controller: SchedulerController, bracket: _Bracket,
                      trial_id: str) -> str:
        if not bracket.filled():
            return TrialScheduler.PAUSE  # (the bracket waits for its trials, paused)
        return self._process_bracket(tune_controller, bracket, trial_id)

    def choose_trial_to_run(self, tune_controller: SchedulerController) -> Optional[Trial]:
        trial = super().choose_trial_to_run(tune_controller)
        if trial is not None or tune_controller.may_add_trials() or any(
                tune_controller.status_of(t) == "RUNNING" for t in tune_controller.get_trials()):
            return trial
        # Nothing runs and no trial can join a bracket any more: the brackets that wait are
        # halved with the trials they have (Ray's), so that the best of them go on.
        for band in self._hyperbands:
            for index in band:
                bracket = self._brackets[index] if index is not None else None
                if bracket is None or not bracket.live or not bracket.cur_iter_done():
                    continue
                self._process_bracket(tune_controller, bracket, None)
                chosen = super().choose_trial_to_run(tune_controller)
                if chosen is not None:
                    return chosen
        return None

    # -- what TuneBOHB asks ------------------------------------------------------------------
    def budget_of(self, trial_id: str, result: dict) -> Optional[float]:
        """The budget ``result`` of ``trial_id`` was evaluated at (its ``time_attr``, when that
        is one of its bracket's milestones), else None: BOHB learns from those results only."""
        index = self._trial_info.get(trial_id)
        time = _number(metric_value(result, self._time_attr))
        if index is None or time is None:
            return None
        return time if time in self._milestones_of(self._brackets[index].s) else None

    def _milestones_of(self, s: int) -> set:
        """Every milestone a bracket ``s`` has, from its first budget to ``max_t``."""
        out, r = set(), self._get_r0(s)
        for _ in range(s + 1):
            out.add(r)
            r = int(min(r * self._eta, self._max_t_attr))
        return out

    def paused_trials(self) -> set:
        """The trials that wait at their bracket's milestone (not counted as running by
        TuneBOHB's ``max_concurrent``, as in Ray)."""
        out = set()
        for bracket in self._brackets:
            if bracket.halves == 0 and not bracket.stop_last_trials:
                continue  # (its trials run on past the last milestone)
            out.update(trial_id for trial_id, result in bracket.live.items()
                       if bracket._time(result) >= bracket.cumul_r)
        return out

    def debug_string(self) -> str:
        return super().debug_string().replace("Using HyperBand:", "Using HyperBandForBOHB:")

