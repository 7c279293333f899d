"""Ray Tune's stoppers (``ray.tune.stopper``): objects that decide when a trial, or the whole
experiment, is done. Pass one as ``RunConfig(stop=...)``::

    import ftnb as tune
    from ftnb.stopper import MaximumIterationStopper, TrialPlateauStopper, CombinedStopper

    stop = CombinedStopper(MaximumIterationStopper(max_iter=20),
                           TrialPlateauStopper(metric="loss"))
    tune.Tuner(train, run_config=tune.RunConfig(stop=stop)).fit()

Where they run. A stopper that only looks at one trial's own results
(:class:`MaximumIterationStopper`, :class:`TrialPlateauStopper`) is evaluated inside the trial's
process right after each report is persisted, so the trial ends exactly at the report that met
it, as in Ray Tune. Every stopper (those too, and any :class:`Stopper` subclass) is also run in
the driver, which sees every trial's results: ``stop_all()`` and a cross-trial decision
(:class:`ExperimentPlateauStopper`, :class:`TimeoutStopper`, your own subclass) stop trials from
there. A stopper that stops single trials from the driver (a :class:`Stopper` subclass,
:class:`ExperimentPlateauStopper`: :func:`decides_in_driver`) makes every report wait for the
driver's decision, so such a trial also ends exactly at the result that met it, as in Ray Tune
(a round trip per report: about 0.65x the report throughput of a run without one);
``stop_all()`` and :class:`TimeoutStopper` stop the other trials at their next report.

Fault tolerance: a stopper holds no state that a crash can lose. When an experiment is resumed
(after a driver SIGKILL too), the driver's stopper is fed every persisted result again, in the
order they were reported, and a trial attempt's stopper the trial's own results up to the
checkpoint it resumes from; :class:`TimeoutStopper` counts the time the experiment's drivers
already ran (the experiment state's driver sessions). A trial a stopper ended is TERMINATED with
the note ``"stopped by <Stopper>"``, shown STOPPED (not as completed) everywhere.
"""

from __future__ import annotations

import copy
import datetime
import math
import numbers
import statistics
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any, Optional, Union

from .config import metric_value

if TYPE_CHECKING:
    from .core.records import ExperimentState, TrialRecord
    from .storage import ExperimentPaths

__all__ = [
    "CombinedStopper",
    "ExperimentPlateauStopper",
    "MaximumIterationStopper",
    "Stopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
]


class Stopper:
    """Base class of a stopper (Ray Tune's ``tune.Stopper``).

    Override ``__call__(trial_id, result) -> bool`` (True: stop that trial) and
    ``stop_all() -> bool`` (True: stop every trial and start no more). Both run in the driver,
    which sees every trial's results::

        class CustomStopper(ftnb.Stopper):
            def __init__(self):
                self.should_stop = False

            def __call__(self, trial_id, result):
                if not self.should_stop and result["mean_accuracy"] > 0.96:
                    self.should_stop = True
                return self.should_stop

            def stop_all(self):
                return self.should_stop
    """

    #: Whether the decision depends on the trial's own results only: then it is also evaluated
    #: in the trial's process, so the trial ends exactly at the report that met it.
    _ftnb_in_trial = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        """Whether the trial ``trial_id`` should stop, given its latest ``result``."""
        raise NotImplementedError

    def stop_all(self) -> bool:
        """Whether the whole experiment should stop."""
        raise NotImplementedError

    def _ftnb_replay(self, trial_id: str, rows: list) -> None:
        """Feed results reported before a restore, without acting on them."""
        for row in rows:
            self(trial_id, row)

    def _ftnb_resume(self, elapsed_s: float) -> None:
        """The experiment's drivers already ran ``elapsed_s`` seconds (for time budgets)."""

    def _ftnb_reason(self) -> str:
        """Which stopper decided, for the trial's note."""
        return type(self).__name__


class MaximumIterationStopper(Stopper):
    """Stop each trial once it reached ``max_iter`` iterations (``training_iteration``)."""

    _ftnb_in_trial = True

    def __init__(self, max_iter: int) -> None:
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"MaximumIterationStopper(max_iter={max_iter!r}) is invalid. "
                             "Fix: a whole number >= 1, e.g. max_iter=10.")
        self._max_iter = max_iter

    def __call__(self, trial_id: str, result: dict) -> bool:
        return (result.get("training_iteration") or 0) >= self._max_iter

    def _ftnb_replay(self, trial_id: str, rows: list) -> None:
        pass  # the decision needs no history

    def stop_all(self) -> bool:
        return False


class TrialPlateauStopper(Stopper):
    """Stop a trial once its ``metric`` plateaued: the standard deviation of its last
    ``num_results`` values is below ``std``, after at least ``grace_period`` results (and, with
    ``metric_threshold``, once the value is better than it in the direction of ``mode``)."""

    _ftnb_in_trial = True

    def __init__(self, metric: str, std: float = 0.01, num_results: int = 4,
                 grace_period: int = 4, metric_threshold: Optional[float] = None,
                 mode: Optional[str] = None) -> None:
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError(
                f"TrialPlateauStopper(metric_threshold={metric_threshold!r}, mode={mode!r}): "
                "with a metric_threshold, mode says which side of it may stop. "
                'Fix: mode="min" or mode="max".')
        self._metric = metric
        self._std = std
        self._num_results = num_results
        self._grace_period = grace_period
        self._metric_threshold = metric_threshold
        self._mode = mode
        self._results: dict[str, deque] = defaultdict(lambda: deque(maxlen=self._num_results))
        self._count: dict[str, int] = defaultdict(int)

    def __call__(self, trial_id: str, result: dict) -> bool:
        value = metric_value(result, self._metric)
        self._results[trial_id].append(value)
        self._count[trial_id] += 1
        if self._count[trial_id] < self._grace_period:
            return False
        if self._metric_threshold is not None and isinstance(value, numbers.Real):
            if self._mode == "min" and value > self._metric_threshold:
                return False
            if self._mode == "max" and value < self._metric_threshold:
                return False
        values = self._results[trial_id]
        if len(values) < self._num_results:
            return False
        if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            return False
        return statistics.pstdev(values) < self._std

    def stop_all(self) -> bool:
        return False

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)  # the defaultdicts' lambdas do not pickle
        state["_results"] = dict(self._results)
        state["_count"] = dict(self._count)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        results = defaultdict(lambda: deque(maxlen=self._num_results))
        results.update(state["_results"])
        self._results = results
        self._count = defaultdict(int, state["_count"])


class TimeoutStopper(Stopper):
    """Stop the whole experiment once it ran ``timeout`` (seconds, or a ``datetime.timedelta``).

    Counted over every driver that ran it: after a crash and a restore, the time already spent
    is not granted again."""

    def __init__(self, timeout: Union[int, float, datetime.timedelta]) -> None:
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if (not isinstance(timeout, numbers.Real) or isinstance(timeout, bool)
                or not timeout > 0 or math.isinf(timeout)):
            raise ValueError(f"TimeoutStopper(timeout={timeout!r}) is invalid. Fix: a number "
                             "of seconds > 0 or a datetime.timedelta.")
        self._timeout_seconds = float(timeout)
        self._elapsed_before = 0.0
        self._start: Optional[float] = None

    def _ftnb_resume(self, elapsed_s: float) -> None:
        self._elapsed_before = elapsed_s
        self._start = time.time()

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        if self._start is None:
            self._start = time.time()
        return self._elapsed_before + (time.time() - self._start) >= self._timeout_seconds


class ExperimentPlateauStopper(Stopper):
    """Stop the whole experiment once the ``top`` best values of ``metric`` across all trials
    have a standard deviation of at most ``std``, for ``patience`` results in a row."""

    def __init__(self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min",
                 patience: int = 0) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"ExperimentPlateauStopper(mode={mode!r}) is invalid. "
                             'Fix: mode="min" or mode="max".')
        if isinstance(top, bool) or not isinstance(top, int) or top <= 1:
            raise ValueError(f"ExperimentPlateauStopper(top={top!r}) is invalid. Fix: a whole "
                             "number > 1 (how many of the best results to compare).")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"ExperimentPlateauStopper(patience={patience!r}) is invalid. "
                             "Fix: a whole number >= 0.")
        if not isinstance(std, numbers.Real) or not std > 0:
            raise ValueError(f"ExperimentPlateauStopper(std={std!r}) is invalid. "
                             "Fix: a number > 0.")
        self._metric = metric
        self._std = std
        self._top = top
        self._mode = mode
        self._patience = patience
        self._top_values: list = []
        self._iter = 0

    def __call__(self, trial_id: str, result: dict) -> bool:
        value = metric_value(result, self._metric)
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value:
            values = sorted(self._top_values + [value])
            self._top_values = values[: self._top] if self._mode == "min" else values[-self._top:]
        self._iter = self._iter + 1 if self.has_plateaued() else 0
        return self.stop_all()

    def has_plateaued(self) -> bool:
        """Whether the ``top`` best values are within ``std`` of each other."""
        return (len(self._top_values) == self._top
                and statistics.pstdev(self._top_values) <= self._std)

    def stop_all(self) -> bool:
        return self.has_plateaued() and self._iter >= self._patience


class CombinedStopper(Stopper):
    """Stop when any of ``stoppers`` says so (a trial, or the whole experiment)."""

    def __init__(self, *stoppers: Stopper) -> None:
        for stopper in stoppers:
            if not isinstance(stopper, Stopper):
                raise TypeError(f"CombinedStopper(...) takes ftnb stoppers; got {stopper!r}. "
                                "Fix: CombinedStopper(MaximumIterationStopper(10), ...).")
        self._stoppers = stoppers
        self._ftnb_in_trial = all(s._ftnb_in_trial for s in stoppers)
        self._decided: Optional[Stopper] = None

    def __call__(self, trial_id: str, result: dict) -> bool:
        # Every stopper sees every result (no short cut), so their histories stay whole.
        said = [s for s in self._stoppers if s(trial_id, result)]
        self._decided = said[0] if said else None
        return bool(said)

    def stop_all(self) -> bool:
        said = [s for s in self._stoppers if s.stop_all()]
        if said:
            self._decided = said[0]
        return bool(said)

    def _ftnb_replay(self, trial_id: str, rows: list) -> None:
        for stopper in self._stoppers:
            stopper._ftnb_replay(trial_id, rows)

    def _ftnb_resume(self, elapsed_s: float) -> None:
        for stopper in self._stoppers:
            stopper._ftnb_resume(elapsed_s)

    def _ftnb_reason(self) -> str:
        return self._decided._ftnb_reason() if self._decided else "CombinedStopper"


def split_stop(stop: Any, time_budget_s: Optional[float]) -> tuple[Any, Optional[Stopper]]:
    """``RunConfig(stop=...)`` and ``TuneConfig(time_budget_s=...)`` as (what each trial process
    evaluates after a report, the stopper the driver runs or None)."""
    driver: list[Stopper] = []
    in_trial = stop
    if isinstance(stop, Stopper):
        driver.append(stop)
        # A copy: the driver's stopper accumulates every trial's results, and each attempt
        # must start from its own trial's history only.
        in_trial = copy.deepcopy(_in_trial_part(stop))
    if time_budget_s is not None:
        driver.append(TimeoutStopper(time_budget_s))
    if not driver:
        return in_trial, None
    return in_trial, driver[0] if len(driver) == 1 else CombinedStopper(*driver)


def _in_trial_part(stopper: Stopper) -> Optional[Stopper]:
    """The part of ``stopper`` that a trial's process can decide alone (None: nothing)."""
    if stopper._ftnb_in_trial:
        return stopper
    if isinstance(stopper, CombinedStopper):
        parts = [p for p in map(_in_trial_part, stopper._stoppers) if p is not None]
        return parts[0] if len(parts) == 1 else CombinedStopper(*parts) if parts else None
    return None


def decides_in_driver(stopper: Stopper) -> bool:
    """Whether ``stopper`` stops single trials from the driver (a :class:`Stopper` subclass's
    ``__call__``, :class:`ExperimentPlateauStopper`): then every report waits for the driver's
    decision, so that the trial ends exactly at the result that met it. An in-trial stopper
    decides in the trial's process; :class:`TimeoutStopper` only stops the whole experiment."""
    if isinstance(stopper, CombinedStopper):
        return any(decides_in_driver(part) for part in stopper._stoppers)
    return not stopper._ftnb_in_trial and not isinstance(stopper, TimeoutStopper)


class DriverStopping:
    """The controller's listener that runs a stopper in the driver: it feeds it every result
    (the persisted ones again on a restore) and stops the trials it names, or all of them."""

    def __init__(self, stopper: Stopper, paths: "ExperimentPaths") -> None:
        self.stopper = stopper
        self.paths = paths
        #: The controller it acts on, set once the controller exists.
        self.controller: Any = None
        self._stopping_all = False
        #: Per trial: (training_iteration, stops, reason) of the row it showed before
        #: persisting it (a class trainable's checkpoint query), for that row's report.
        self._previewed: dict[str, tuple] = {}

    def on_experiment_start(self, state: "ExperimentState") -> None:
        from .core.records import FINISHED_STATUSES

        past = state.driver_sessions[:-1]
        self.stopper._ftnb_resume(sum(max(0.0, end - start) for start, end in past))
        replay = []
        for trial in state.trials:
            done = trial.status in FINISHED_STATUSES
            upto = math.inf if done else (trial.latest_checkpoint or {}).get("iteration", 0)
            for row in self.paths.trial(trial.dir_name).read_results():
                if (row.get("training_iteration") or 0) <= upto:
                    replay.append((row.get("timestamp") or 0.0, trial, row))
        replay.sort(key=lambda entry: entry[0])
        decided: dict[str, str] = {}
        for _, trial, row in replay:
            if self.stopper(trial.trial_id, row):
                decided[trial.trial_id] = self.stopper._ftnb_reason()
        # A decision the previous driver made (or was about to) and did not carry out.
        for trial in state.trials:
            if trial.trial_id in decided:
                self._stop(trial, decided[trial.trial_id])
        self._check_all(state)

    def on_result_preview(self, state: "ExperimentState", trial: "TrialRecord",
                          row: dict) -> None:
        """A class trainable's row before it is persisted (ftnb.core.checkpoint_queries): the
        stopper sees it now, once; its verdict is marked in the row and kept for the row's
        persisted report."""
        from .core.checkpoint_queries import STOPS_HERE

        stops = bool(self.stopper(trial.trial_id, row))
        reason = self.stopper._ftnb_reason() if stops else None
        self._previewed[trial.trial_id] = (row.get("training_iteration"), stops, reason)
        if stops:
            row[STOPS_HERE] = True

    def on_result(self, state: "ExperimentState", trial: "TrialRecord", row: dict) -> None:
        previewed = self._previewed.pop(trial.trial_id, None)
        if previewed is not None and previewed[0] == row.get("training_iteration"):
            stops, reason = previewed[1], previewed[2]
        else:
            stops = bool(self.stopper(trial.trial_id, row))
            reason = self.stopper._ftnb_reason() if stops else None
        if stops:
            self._stop(trial, reason)
        self._check_all(state)

    def on_tick(self, state: "ExperimentState") -> None:
        self._check_all(state)

    def _check_all(self, state: "ExperimentState") -> None:
        if self._stopping_all or not self.stopper.stop_all():
            return
        self._stopping_all = True
        reason = self.stopper._ftnb_reason()
        end_search = getattr(self.controller, "end_search", None)
        if end_search is not None:  # a searcher makes no more trials (num_samples=-1)
            end_search(f"stopped by {reason}")
        for trial in state.trials:
            self._stop(trial, reason)

    def _stop(self, trial: "TrialRecord", reason: str) -> None:
        from .core.records import TrialStatus

        note = f"stopped by {reason}"
        if trial.status == TrialStatus.ERRORED:
            return
        if trial.status == TrialStatus.TERMINATED:
            # It ended at that report by itself (an in-trial stopper): say who ended it.
            if not trial.note and trial.attempts and trial.attempts[-1].outcome == "stopped":
                trial.note = note
            return
        self.controller.stop_trial(trial.trial_id, note)
