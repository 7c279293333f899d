"""Synchronous HyperBand (Li et al., 2016), Ray Tune's ``HyperBandScheduler``.

Trials are added to brackets in turn (Ray's band layout: a band holds ``s_max + 1`` brackets,
bracket ``s`` takes ``ceil((s_max + 1) / (s + 1) * eta ** s)`` trials starting with a budget of
``max_t * eta ** -s``). A trial that reaches its bracket's current milestone is PAUSED: it ends
its attempt there (keeping its checkpoints; not a failure) and waits for the rest of its
bracket. When the last one arrives, successive halving keeps the best ``1/eta`` (they are
resumed from their latest checkpoint, up to the next milestone, ``eta`` times further) and
stops the others. A bracket's last milestone ends its trials (``max_t``).

The milestones are the trial's decision points: its report there waits for the decision, so
it pauses (or stops) exactly there; report a checkpoint at each milestone, or a resumed trial
redoes the iterations since its last one. The whole layout (bands, brackets, who is in them,
what they reported at their milestone, who waits to be resumed) is JSON in the experiment
state.
"""

from __future__ import annotations

import math
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

__all__ = ["HyperBandScheduler"]



class _Bracket:
    """One bracket of successive halving: its trials (ids), what each reported last
    (``[time, value]``, None before its first report), and its current milestone."""

    def __init__(self, s: int, max_trials: int, init_t: float, max_t: float, eta: float,
                 stop_last_trials: bool) -> None:
        self.s = s
        self.n = max_trials
        self.r = init_t
        self.cumul_r = init_t
        self.halves = s
        self.max_t = max_t
        self.eta = eta
        self.stop_last_trials = stop_last_trials
        self.live: dict[str, Optional[list]] = {}
        self.all_trials: list[str] = []
        self.to_unpause: list[str] = []
        self.being_processed = False
        self.completed_progress = 0.0
        self.total_work = self._total_work(max_trials, init_t, s)

    def _total_work(self, n: float, r: float, s: int) -> float:
        work = 0.0
        for _ in range(s + 1):
            work += int(n) * int(r)
            n = int(math.ceil(n / self.eta))
            r = int(min(r * self.eta, self.max_t))
        return work or 1.0

    # -- Ray's bracket rules -----------------------------------------------------------------
    def filled(self) -> bool:
        return len(self.live) == self.n

    def add_trial(self, trial_id: str) -> None:
        self.live[trial_id] = None
        self.all_trials.append(trial_id)

    @staticmethod
    def _time(result: Optional[list]) -> float:
        return 0.0 if result is None else result[0]

    def cur_iter_done(self) -> bool:
        return all(self._time(r) >= self.cumul_r for r in self.live.values())

    def finished(self) -> bool:
        if not self.stop_last_trials:
            return False
        return self.halves == 0 and self.cur_iter_done()

    def continue_trial(self, trial_id: str) -> bool:
        result = self.live[trial_id]
        if not self.stop_last_trials and self.halves == 0:
            return True
        return self._time(result) < self.cumul_r

    def successive_halving(self, metric_op: float) -> tuple[list, list]:
        if self.halves == 0 and not self.stop_last_trials:
            return list(self.live), []
        self.halves -= 1
        self.n = int(math.ceil(self.n / self.eta))
        self.r = int(min(self.r * self.eta, self.max_t))
        self.cumul_r = self.r

        def score(trial_id: str) -> float:
            value = self.live[trial_id][1] if self.live[trial_id] else None
            return metric_op * value if value is not None else -math.inf

        # (A stable sort of the trials in the order they joined: ties are decided the same way
        # after any restore.)
        ranked = sorted(self.live, key=score)
        return ranked[-self.n:], ranked[:-self.n]

    def update(self, trial_id: str, time: float, value: Optional[float]) -> None:
        before = self._time(self.live[trial_id])
        self.completed_progress += max(0.0, time - before)
        self.live[trial_id] = [time, value]
        if trial_id in self.to_unpause:
            self.to_unpause.remove(trial_id)

    def cleanup_trial(self, trial_id: str) -> None:
        self.live.pop(trial_id, None)
        if trial_id in self.to_unpause:
            self.to_unpause.remove(trial_id)

    def completion_percentage(self) -> float:
        return self.completed_progress / self.total_work

    def milestones(self) -> list[float]:
        out, r = [], self.r
        for _ in range(self.halves + 1):
            out.append(r)
            r = int(min(r * self.eta, self.max_t))
        return sorted(set(out))

    # -- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"s": self.s, "n": self.n, "r": self.r, "cumul_r": self.cumul_r,
                "halves": self.halves, "live": dict(self.live), "all": list(self.all_trials),
                "to_unpause": list(self.to_unpause), "progress": self.completed_progress}

    @classmethod
    def from_json(cls, data: dict, max_t: float, eta: float, stop_last_trials: bool,
                  init: tuple[int, float]) -> "_Bracket":
        bracket = cls(int(data["s"]), init[0], init[1], max_t, eta, stop_last_trials)
        bracket.n, bracket.r, bracket.cumul_r = data["n"], data["r"], data["cumul_r"]
        bracket.halves = int(data["halves"])
        bracket.live = {k: (list(v) if v is not None else None)
                        for k, v in data["live"].items()}
        bracket.all_trials = list(data["all"])
        bracket.to_unpause = list(data["to_unpause"])
        bracket.completed_progress = float(data.get("progress") or 0.0)
        return bracket


class HyperBandScheduler(FIFOScheduler):
    """Synchronous HyperBand with Ray Tune's arguments and band layout.

    Args:
        time_attr: what measures progress (``training_iteration`` by default).
        metric, mode: what to compare, and whether higher or lower is better (None: TuneConfig's).
        max_t: a trial's largest budget in ``time_attr``.
        reduction_factor: ``eta``: each halving keeps the best ``1/eta`` and gives them ``eta``
            times the budget.
        stop_last_trials: stop a bracket's trials at its last milestone (True, Ray's default).

    PAUSE means: the trial ends its attempt at the milestone's report, keeps its checkpoints,
    and is resumed from the latest when its bracket moves on (never counted as a failure).
    """

    def __init__(self, time_attr: str = "training_iteration", metric: Optional[str] = None,
                 mode: Optional[str] = None, max_t: float = 81, reduction_factor: float = 3,
                 stop_last_trials: bool = True) -> None:
        owner = type(self).__name__
        _checked_time_attr(owner, time_attr, "'training_iteration'")
        self._metric = _checked_metric(owner, metric)
        self._mode = _checked_mode(owner, mode)
        _checked_number(owner, "max_t", max_t)
        _checked_number(owner, "reduction_factor", reduction_factor, minimum=1)
        if not isinstance(stop_last_trials, bool):
            raise TypeError(f"{owner}(stop_last_trials={stop_last_trials!r}) must be True or "
                            "False.")
        self._time_attr = time_attr
        self._eta = reduction_factor
        self._max_t_attr = max_t
        self._stop_last_trials = stop_last_trials
        self._s_max_1 = int(round(math.log(max_t) / math.log(reduction_factor))) + 1
        #: Bands of brackets (indices into ``_brackets``; None: a bracket too small to exist).
        self._hyperbands: list[list[Optional[int]]] = [[]]
        self._brackets: list[_Bracket] = []
        self._current: Optional[int] = None  # the bracket new trials join
        self._trial_info: dict[str, int] = {}  # trial id -> its bracket
        #: Why each trial it stopped was stopped: [milestone, value] (None: the last milestone).
        self._stopped: dict[str, Optional[list]] = {}
        self._num_stopped = 0

    def _ftnb_settings(self) -> Optional[dict]:
        if type(self) is not HyperBandScheduler:
            return None
        return self._settings()

    def _settings(self) -> dict:
        """The arguments that rebuild this scheduler."""
        return {"time_attr": self._time_attr, "metric": self._metric, "mode": self._mode,
                "max_t": self._max_t_attr, "reduction_factor": self._eta,
                "stop_last_trials": self._stop_last_trials}

    @property
    def _metric_op(self) -> float:
        return -1.0 if self._mode == "min" else 1.0

    def _get_n0(self, s: int) -> int:
        return int(math.ceil(self._s_max_1 / (s + 1) * self._eta ** s))

    def _get_r0(self, s: int) -> int:
        return int(self._max_t_attr * self._eta ** (-s))

    # -- adding trials -------------------------------------------------------------------------
    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"HyperBandScheduler has no metric and mode to compare trials by: "
                f"metric={self._metric!r}, mode={self._mode!r}. Fix: pass them to the scheduler "
                "or to TuneConfig(metric='loss', mode='min').")
        if trial.trial_id in self._trial_info:
            return
        current = self._brackets[self._current] if self._current is not None else None
        if current is None or current.filled():
            while True:
                band = self._hyperbands[-1]
                if len(band) == self._s_max_1:
                    band = []
                    self._hyperbands.append(band)
                s = self._next_bracket_s(band)
                if self._get_r0(s) == 0:
                    band.append(None)  # too small a budget: Ray skips it the same way
                    continue
                bracket = _Bracket(s, self._get_n0(s), self._get_r0(s), self._max_t_attr,
                                   self._eta, self._stop_last_trials)
                self._brackets.append(bracket)
                band.append(len(self._brackets) - 1)
                self._current = len(self._brackets) - 1
                break
        self._brackets[self._current].add_trial(trial.trial_id)  # type: ignore[index]
        self._trial_info[trial.trial_id] = self._current  # type: ignore[assignment]

    # -- results -------------------------------------------------------------------------------
    def on_trial_result(self, tune_controller: SchedulerController, trial: Trial,
                        result: dict) -> str:
        index = self._trial_info.get(trial.trial_id)
        time = _number(metric_value(result, self._time_attr))
        if index is None or time is None or trial.trial_id not in self._brackets[index].live:
            return TrialScheduler.CONTINUE
        bracket = self._brackets[index]
        value = _number(metric_value(result, self._metric)) if self._metric else None
        bracket.update(trial.trial_id, time, value)
        if bracket.continue_trial(trial.trial_id):
            return TrialScheduler.CONTINUE
        return self._at_milestone(tune_controller, bracket, trial.trial_id)

    # -- hooks (HyperBandForBOHB's differences) --------------------------------------------------
    def _next_bracket_s(self, band: list) -> int:
        """The ``s`` of the next bracket of ``band`` (the brackets it holds so far): Ray's
        HyperBand goes from the least aggressive (``s = 0``, every trial gets ``max_t``) on."""
        return len(band)

    def _at_milestone(self, tune_controller: SchedulerController, bracket: _Bracket,
                      trial_id: str) -> str:
        """``trial_id`` reached its bracket's milestone: halve the bracket when its last trial
        is there (the trial's answer), else PAUSE it to wait for the others."""
        return self._process_bracket(tune_controller, bracket, trial_id)

    def _process_bracket(self, tune_controller: SchedulerController, bracket: _Bracket,
                         current: Optional[str]) -> str:
        action = TrialScheduler.PAUSE
        if not bracket.cur_iter_done():
            return action
        if bracket.finished():
            for trial_id in list(bracket.live):
                if trial_id != current:
                    self._stop_other(tune_controller, trial_id, None)
            if current is not None:
                self._stopped[current] = None
            return TrialScheduler.STOP
        bracket.being_processed = True
        milestone = bracket.cumul_r
        good, bad = bracket.successive_halving(self._metric_op)
        self._num_stopped += len(bad)
        for trial_id in bad:
            result = bracket.live.get(trial_id)
            why = [milestone, result[1] if result else None]
            if trial_id == current:
                bracket.cleanup_trial(trial_id)
                self._stopped[trial_id] = why
                action = TrialScheduler.STOP
            else:
                self._stop_other(tune_controller, trial_id, why)
        for trial_id in good:
            if not bracket.continue_trial(trial_id):
                continue
            if trial_id == current:
                action = TrialScheduler.CONTINUE
            elif trial_id not in bracket.to_unpause:
                bracket.to_unpause.append(trial_id)
        bracket.being_processed = False
        return action

    def _stop_other(self, tune_controller: SchedulerController, trial_id: str,
                    why: Optional[list]) -> None:
        bracket = self._brackets[self._trial_info[trial_id]]
        bracket.cleanup_trial(trial_id)
        self._stopped[trial_id] = why
        trial = tune_controller.get_trial(trial_id)
        tune_controller.stop_trial(trial, self.stop_note(trial))

    def on_trial_remove(self, tune_controller: SchedulerController,
                        trial: Trial) -> None:
        index = self._trial_info.get(trial.trial_id)
        if index is None:
            return
        bracket = self._brackets[index]
        if trial.trial_id not in bracket.live:
            return
        bracket.cleanup_trial(trial.trial_id)
        if not bracket.finished() and not bracket.being_processed:
            self._process_bracket(tune_controller, bracket, None)

    def on_trial_complete(self, tune_controller: SchedulerController, trial: Trial,
                          result: Optional[dict]) -> None:
        self.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: SchedulerController,
                       trial: Trial) -> None:
        self.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: SchedulerController
                            ) -> Optional[Trial]:
        for band in self._hyperbands:
            brackets = [self._brackets[i] for i in band if i is not None]
            for bracket in sorted(brackets, key=lambda b: b.completion_percentage()):
                for trial_id in list(bracket.live):
                    trial = tune_controller.get_trial(trial_id)
                    status = tune_controller.status_of(trial)
                    if (status == "PAUSED" and trial_id in bracket.to_unpause) or (
                            status == "PENDING"):
                        return trial
        # Trials it does not know (none, when every trial was added): the experiment's order.
        pending = tune_controller.next_pending_trial()
        if pending is not None and pending.trial_id not in self._trial_info:
            return pending
        return None

    def decision_points(self, trial: Trial) -> Optional[DecisionPoints]:
        index = self._trial_info.get(trial.trial_id)
        if index is None:
            return None
        bracket = self._brackets[index]
        return DecisionPoints(self._time_attr, milestones=tuple(bracket.milestones()))

    def stop_note(self, trial: Trial) -> Optional[str]:
        why = self._stopped.get(trial.trial_id)
        if why is None:
            return None  # its bracket's last milestone: it ran its budget
        milestone, value = why
        shown = f"{value:.6g}" if isinstance(value, (int, float)) else "none"
        return (f"stopped by {type(self).__name__} at {self._time_attr}={milestone:g}: "
                f"{self._metric}={shown} not among its bracket's best")

    def debug_string(self) -> str:
        lines = [f"Using HyperBand: num_stopped={self._num_stopped} total_brackets="
                 f"{len(self._brackets)}"]
        for i, band in enumerate(self._hyperbands):
            lines.append(f"Round #{i}:")
            for index in band:
                if index is None:
                    continue
                b = self._brackets[index]
                lines.append(f"  Bracket(Max Size (n)={b.n}, Milestone (r)={b.cumul_r}, "
                             f"completed={100 * b.completion_percentage():.1f}%): "
                             f"{len(b.live)} live")
        return "\n".join(lines)

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {"hyperbands": [list(b) for b in self._hyperbands],
                "brackets": [b.to_json() for b in self._brackets],
                "current": self._current, "trial_info": dict(self._trial_info),
                "stopped": dict(self._stopped), "num_stopped": self._num_stopped}

    def set_state(self, state: dict) -> None:
        self._hyperbands = [list(b) for b in state.get("hyperbands") or [[]]]
        self._brackets = []
        for data in state.get("brackets") or []:
            s = int(data["s"])
            self._brackets.append(_Bracket.from_json(
                data, self._max_t_attr, self._eta, self._stop_last_trials,
                (self._get_n0(s), self._get_r0(s))))
        self._current = state.get("current")
        self._trial_info = {k: int(v) for k, v in (state.get("trial_info") or {}).items()}
        self._stopped = dict(state.get("stopped") or {})
        self._num_stopped = int(state.get("num_stopped") or 0)
