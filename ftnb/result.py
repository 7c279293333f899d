"""Result and ResultGrid: what ``fit()`` returns, read from the experiment directory."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .checkpoint import Checkpoint
from .core.checkpoint_queries import SHOULD_CHECKPOINT
from .core.records import ExperimentState, ExperimentStatus, TrialRecord, TrialStatus
from .schedulers.stop_criterion import DONE
from .storage import ExperimentPaths
from .storage.result_log import flatten_row

if TYPE_CHECKING:
    import pandas

__all__ = ["DONE", "NoBestResultError", "Result", "ResultGrid", "SHOULD_CHECKPOINT", "TrialError"]

#: Ray Tune's result keys (``ray.tune.result``). ``DONE`` true in a result ends its trial
#: (TERMINATED); ``SHOULD_CHECKPOINT`` set true by a class Trainable's ``step()`` or by a
#: ``Callback.on_trial_result`` makes that trial checkpoint with this result.
TRAINING_ITERATION = "training_iteration"
TIME_TOTAL_S = "time_total_s"
TIME_THIS_ITER_S = "time_this_iter_s"
TIMESTAMP = "timestamp"
TRIAL_ID = "trial_id"

#: ``get_best_result(scope=...)``: how many of each trial's last values each averaging scope takes.
_AVERAGED_SCOPES = {"avg": None, "last-5-avg": 5, "last-10-avg": 10}
_SCOPES = ("last", "all", *_AVERAGED_SCOPES)


class TrialError(Exception):
    """Why a trial ended ERRORED: its last failure, and the reason it was not retried.

    Attributes: ``trial_id``, ``kind`` (exception, exit, signal, oom, usage), ``type`` and
    ``message`` of the exception, ``traceback`` (the trial's formatted traceback, if any),
    ``failures`` (every failure record of the trial).
    """

    def __init__(self, trial: TrialRecord) -> None:
        error = trial.error or {}
        failure = error.get("failure") or {}
        self.trial_id = trial.trial_id
        self.kind = failure.get("kind")
        self.type = failure.get("type")
        self.message = failure.get("message", "")
        self.traceback = failure.get("traceback")
        self.reason = error.get("reason", "")
        self.failures = list(trial.failures)
        what = f"{self.type}: {self.message}" if self.type else self.message
        super().__init__(
            f"Trial {trial.trial_id} is ERRORED ({self.reason}). Last failure: {self.kind} {what}"
        )


class NoBestResultError(ValueError, RuntimeError):
    """``get_best_result`` found no trial with a usable value of the metric. A ValueError, and
    a RuntimeError as in Ray Tune, so code written for either catches it."""


class TrialNotFoundError(FileNotFoundError, RuntimeError):
    """``Result.from_path`` was given a folder that is no trial of an ftnb experiment (a
    RuntimeError as in Ray Tune, and a FileNotFoundError)."""


def _metric_value(row: dict, metric: str) -> Any:
    """``row[metric]``, where ``metric`` may name a nested value as ``"outer/inner"`` (the
    columns of ``progress.csv`` and ``metrics_dataframe``, as in Ray Tune)."""
    if metric in row:
        return row[metric]
    return flatten_row(row).get(metric) if "/" in metric else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _better(value: float, best: Optional[float], mode: str) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet); a tie keeps ``best``."""
    return best is None or (value > best if mode == "max" else value < best)


def _check_mode(mode: Any, call: str) -> None:
    if mode not in ("max", "min"):
        raise ValueError(f"{call}(mode={mode!r}): use 'max' (higher is better) or 'min'.")


class Result:
    """One trial's outcome.

    Attributes:
        metrics: the last reported result (a dict; empty if the trial never reported).
        config: the trial's config (the live objects when returned by ``fit()``).
        checkpoint: the latest checkpoint, or None.
        error: a :class:`TrialError` if the trial is ERRORED, else None.
        path: the trial's folder (a path or URL that :attr:`filesystem` opens).
        status: the trial's status string.

    ``Result.from_path(path)`` reads one trial's folder.
    """

    def __init__(
        self, paths: ExperimentPaths, trial: TrialRecord, config: Any, metric: Optional[str],
        mode: Optional[str],
    ) -> None:
        self._paths = paths
        self._trial = trial
        self.trial_id = trial.trial_id
        self.status = trial.status
        self.config = config
        self.metrics: dict = dict(trial.last_result or {})
        self.error: Optional[TrialError] = (
            TrialError(trial) if trial.status == TrialStatus.ERRORED else None
        )
        self._metric, self._mode = metric, mode
        self._rows: Optional[list[dict]] = None

    @classmethod
    def from_path(cls, path: Any, storage_filesystem: Any = None) -> "Result":
        """The result of the trial whose folder is ``path`` (a local path or URL; the folder
        ``Result.path`` names), read through ``storage_filesystem`` if given (an fsspec
        filesystem, for credentials or an endpoint).

        Example: ``Result.from_path("~/ftnb_results/exp/3f2a1_00000").metrics``. A folder
        that is no trial of an ftnb experiment raises :class:`TrialNotFoundError`.
        """
        import dataclasses
        import json
        import os

        from .core.records import StateFormatError

        path = os.fspath(path)
        storage = ExperimentPaths.at(path, storage_filesystem).storage
        paths = ExperimentPaths(storage, storage.parent(storage.root))
        dir_name = storage.root.rstrip("/").replace(os.sep, "/").rsplit("/", 1)[-1]
        trial_paths = paths.trial(dir_name)
        settings: dict = {}
        try:
            state = ExperimentState.load(paths).merge_trial_records(paths)
        except (FileNotFoundError, StateFormatError, ValueError):
            trial = None  # a trial folder copied out of its experiment: its own record
        else:
            settings = state.settings
            trial = next((t for t in state.trials if t.dir_name == dir_name), None)
        if trial is None:
            try:
                trial = TrialRecord.from_json(json.loads(storage.read_bytes(trial_paths.record)))
            except (FileNotFoundError, ValueError, TypeError, KeyError, AttributeError):
                raise TrialNotFoundError(
                    f"Result.from_path({path!r}): no ftnb trial there (no {trial_paths.record} "
                    "and no experiment state naming it). Fix: pass a trial's folder, e.g. "
                    "Result.path, or read the whole experiment with ResultGrid.from_path."
                ) from None
        if trial.dir_name != dir_name:  # copied or renamed: its files are where it is now
            trial = dataclasses.replace(trial, dir_name=dir_name)
        result = cls(paths, trial, trial.config, settings.get("metric"), settings.get("mode"))
        result._settings = settings.get("checkpoint_config") or {}
        return result

    @property
    def _trial_paths(self) -> Any:
        # Made when asked: a grid of 10,000 results reads most of them for their metrics only.
        return self._paths.trial(self._trial.dir_name)

    @property
    def path(self) -> str:
        """The trial's folder: a local path, or a URL that :attr:`filesystem` opens."""
        return self._trial_paths.uri

    @property
    def filesystem(self) -> Any:
        """The fsspec filesystem the trial's folder is on: ``filesystem.open(path + "/...")``
        reads its files (as Ray Tune's ``Result.filesystem``)."""
        return self._paths.storage.fs

    def _checkpoint(self, dir_name: str) -> Checkpoint:
        return Checkpoint(self._trial_paths.checkpoint(dir_name), self._paths.storage.fs)

    @property
    def checkpoint(self) -> Optional[Checkpoint]:
        latest = self._trial.latest_checkpoint
        return self._checkpoint(latest["dir_name"]) if latest else None

    @property
    def rows(self) -> list[dict]:
        """Every acknowledged report, oldest first."""
        if self._rows is None:
            self._rows = self._trial_paths.read_results()
        return self._rows

    @property
    def metrics_dataframe(self) -> "pandas.DataFrame":
        """Every report as a row (nested metrics flattened to ``a/b`` columns)."""
        import pandas as pd

        return pd.DataFrame([flatten_row(r) for r in self.rows])

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict]]:
        """The kept checkpoints with the result reported alongside each, best first when
        ``checkpoint_score_attribute`` is set (oldest first otherwise)."""
        by_iter = {r.get("training_iteration"): r for r in self.rows}
        kept = list(self._trial.checkpoints)
        score_order = self._trial_settings("checkpoint_score_order") or "max"
        if any("score" in c for c in kept):
            def key(c: dict) -> float:
                s = c.get("score")
                if not isinstance(s, (int, float)) or s != s:
                    return math.inf
                return -s if score_order == "max" else s

            kept.sort(key=key)
        return [(self._checkpoint(c["dir_name"]), by_iter.get(c["iteration"], {})) for c in kept]

    def get_best_checkpoint(self, metric: str, mode: str) -> Optional[Checkpoint]:
        """The kept checkpoint whose result has the best ``metric`` (``mode``: ``"max"`` or
        ``"min"``; ``"outer/inner"`` names a nested metric). Checkpoints whose result lacks
        the metric, or has NaN, are left out; of equal ones the latest wins.

        Raises RuntimeError (as Ray Tune) when the trial kept no checkpoint or none has a
        value of ``metric``; ValueError for another ``mode``.
        """
        kept = self.best_checkpoints
        if not kept:
            raise RuntimeError(
                f"Result.get_best_checkpoint: trial {self.trial_id} kept no checkpoint. Fix: "
                "pass checkpoint=ftnb.Checkpoint.from_directory(...) to ftnb.report().")
        _check_mode(mode, "Result.get_best_checkpoint")
        by_age = sorted(kept, key=lambda c: (c[1].get("training_iteration") or 0))
        best, best_value = None, None
        for checkpoint, row in by_age:
            value = _metric_value(row, metric)
            if _is_number(value) and value == value and (
                    value == best_value or _better(value, best_value, mode)):
                best, best_value = checkpoint, value
        if best is None:
            reported = sorted({k for _, row in kept for k in flatten_row(row)})
            raise RuntimeError(
                f"Result.get_best_checkpoint({metric!r}): no kept checkpoint of trial "
                f"{self.trial_id} has a number for {metric!r} in its result. Fix: pass one of "
                f"the metrics reported with them: {reported}.")
        return best

    def _trial_settings(self, key: str) -> Any:
        return getattr(self, "_settings", {}).get(key)

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.metrics.items() if k not in ("timestamp", "trial_id")}
        return f"Result(trial_id={self.trial_id!r}, status={self.status}, metrics={shown})"


class ResultGrid:
    """The results of every trial of an experiment (``len``, indexing, iteration)."""

    def __init__(
        self,
        paths: ExperimentPaths,
        state: ExperimentState,
        configs: Optional[dict[str, Any]] = None,
    ) -> None:
        self._paths = paths
        self._state = state
        settings = state.settings
        self._metric = settings.get("metric")
        self._mode = settings.get("mode")
        self._results = []
        for trial in state.trials:
            config = (configs or {}).get(trial.trial_id, trial.config)
            result = Result(paths, trial, config, self._metric, self._mode)
            result._settings = settings.get("checkpoint_config") or {}
            self._results.append(result)

    @classmethod
    def from_path(cls, path: str, filesystem: Any = None) -> "ResultGrid":
        """Read the results of the experiment in the folder ``path`` (local path or URL)."""
        paths = ExperimentPaths.at(path, filesystem)
        return cls(paths, ExperimentState.load(paths).merge_trial_records(paths))

    @property
    def experiment_path(self) -> str:
        return self._paths.uri

    @property
    def status(self) -> ExperimentStatus:
        """The experiment's status: FINISHED, ERRORED, INTERRUPTED or RUNNING, an
        :class:`~ftnb.core.records.ExperimentStatus` as ``ExperimentHandle.status()`` returns
        (it compares equal to its name)."""
        return ExperimentStatus(self._state.status)

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Result:
        return self._results[index]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    @property
    def errors(self) -> list[TrialError]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self._results if r.status == TrialStatus.TERMINATED)

    def get_best_result(
        self,
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> Result:
        """The trial with the best ``metric`` (default: ``TuneConfig.metric``/``mode``).

        ``scope`` says which of each trial's reported values of the metric count: ``"last"``
        (the last one), ``"avg"`` (their mean), ``"last-5-avg"`` / ``"last-10-avg"`` (the
        mean of the last 5 / 10), ``"all"`` (its best one). ``"outer/inner"`` names a nested
        metric. NaN and infinities are left out (a mean with one of them is one), unless
        ``filter_nan_and_inf=False``. As in Ray Tune, an experiment of one trial returns it
        whatever its values, with no metric needed.

        Raises :class:`NoBestResultError` (a ValueError and a RuntimeError) when no trial
        has a usable value; ValueError without a metric and a mode.
        """
        if scope not in _SCOPES:
            raise ValueError(f"get_best_result(scope={scope!r}): use one of "
                             f"{', '.join(repr(s) for s in _SCOPES)}.")
        if mode is not None:
            _check_mode(mode, "get_best_result")
        if len(self._results) == 1:
            return self._results[0]
        metric = metric or self._metric
        mode = mode or self._mode
        if not metric or mode not in ("max", "min"):
            raise ValueError(
                f"get_best_result needs a metric and a mode ('max' or 'min'); got metric="
                f"{metric!r}, mode={mode!r}. Fix: pass them, e.g. get_best_result('loss', 'min'), "
                "or set TuneConfig(metric=..., mode=...)."
            )
        best, best_value = None, None
        for result in self._results:
            for value in self._scope_values(result, metric, scope):
                if filter_nan_and_inf and not math.isfinite(value):
                    continue
                if _better(value, best_value, mode):
                    best, best_value = result, value
        if best is None:
            raise NoBestResultError(self._no_best_message(metric, scope))
        return best

    @staticmethod
    def _scope_values(result: Result, metric: str, scope: str) -> list[float]:
        """The values of ``metric`` that rank ``result`` under ``scope``: its last value, the
        mean of its (last n) values, or all of them for ``"all"``."""
        last = _metric_value(result.metrics, metric)
        if scope == "last" and _is_number(last):
            return [last]  # from the trial's record: no need to read its rows
        every = [_metric_value(r, metric) for r in result.rows]
        text = next((v for v in [last, *every] if isinstance(v, str)), None)
        if text is not None:
            raise ValueError(
                f"get_best_result({metric!r}): trial {result.trial_id} reported {metric!r} as "
                f"text ({text[:60]!r}), so it cannot be ranked by it. Fix: rank by a metric "
                "reported as a number, or report this one as a number (e.g. float(...)).")
        values = [v for v in every if _is_number(v)]
        if scope == "all" or not values:
            return values
        if scope == "last":
            return values[-1:]  # its last report lacked the metric: the last value it had
        window = values[-(_AVERAGED_SCOPES[scope] or len(values)):]
        return [math.fsum(window) / len(window)]

    def _no_best_message(self, metric: str, scope: str) -> str:
        """Why no trial has a usable value of ``metric`` (NaN and infinities left out)."""
        numbers = [v for r in self._results for v in self._scope_values(r, metric, scope)]
        fix = ("Fix: look at the trials' rows (Result.metrics_dataframe), or pass "
               "filter_nan_and_inf=False to rank by them anyway.")
        subject = {"all": f"every value of {metric!r}",
                   "last": f"every trial's last value of {metric!r}",
                   "avg": f"every trial's mean of {metric!r}"}.get(
            scope, f"every trial's mean of its last {scope[5:-4]} values of {metric!r}")
        if numbers and all(v != v for v in numbers):
            return (f"get_best_result({metric!r}): {subject} is NaN, so no trial can be ranked "
                    f"by it (did the training diverge?). {fix}")
        if numbers:
            return (f"get_best_result({metric!r}): {metric!r} has no finite value ({subject} "
                    f"is NaN or infinite), so no trial can be ranked by it. {fix}")
        reported = sorted({k for r in self._results for k in r.metrics})
        return f"No trial reported a usable value of {metric!r}. Reported metrics: {reported}."

    def get_dataframe(
        self, filter_metric: Optional[str] = None, filter_mode: Optional[str] = None
    ) -> "pandas.DataFrame":
        """A row per trial: its last result (flattened) plus ``trial_id``, ``status``,
        ``config/...`` columns and ``logdir``.

        With ``filter_metric`` and ``filter_mode`` (``"max"`` or ``"min"``), each trial's row
        is instead its result with the best value of that metric (the first of equal ones; NaN
        left out; its last result if it has no such value), as in Ray Tune. Example:
        ``grid.get_dataframe(filter_metric="accuracy", filter_mode="max")``.
        """
        import pandas as pd

        if filter_mode is not None:
            _check_mode(filter_mode, "get_dataframe")
            if not filter_metric:
                raise ValueError(
                    f"get_dataframe(filter_mode={filter_mode!r}) needs filter_metric: the metric "
                    f"whose best value picks each trial's row. Fix: get_dataframe("
                    f"filter_metric='loss', filter_mode={filter_mode!r}).")
        records = []
        for result in self._results:
            chosen = result.metrics
            if filter_metric and filter_mode:
                chosen = self._best_row(result, filter_metric, filter_mode) or chosen
            row = flatten_row(chosen)
            row["trial_id"] = result.trial_id
            row["status"] = result.status
            config = result.config if isinstance(result.config, dict) else {}
            row.update(flatten_row(config, prefix="config/"))
            row["logdir"] = result.path
            records.append(row)
        return pd.DataFrame(records)

    @staticmethod
    def _best_row(result: Result, metric: str, mode: str) -> Optional[dict]:
        """``result``'s report with the best number for ``metric`` (NaN left out), or None."""
        best, best_value = None, None
        for row in result.rows:
            value = _metric_value(row, metric)
            if _is_number(value) and value == value and _better(value, best_value, mode):
                best, best_value = row, value
        return best

    def __repr__(self) -> str:
        from .ui.view import plural

        return (
            f"ResultGrid({self.experiment_path!r}: {plural(len(self), 'trial')}, "
            f"{self.num_terminated} terminated, {self.num_errors} errored)"
        )
