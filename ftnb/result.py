"""Result and ResultGrid: what ``fit()`` returns, read from the experiment directory."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .checkpoint import Checkpoint
from .core.records import ExperimentState, TrialRecord, TrialStatus
from .storage import ExperimentPaths
from .storage.result_log import flatten_row

if TYPE_CHECKING:
    import pandas

__all__ = ["Result", "ResultGrid", "TrialError"]


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


class Result:
    """One trial's outcome.

    Attributes:
        metrics: the last reported result (a dict; empty if the trial never reported).
        config: the trial's config (the live objects when returned by ``fit()``).
        checkpoint: the latest checkpoint, or None.
        error: a :class:`TrialError` if the trial is ERRORED, else None.
        path: the trial's folder.
        status: the trial's status string.
    """

    def __init__(
        self, paths: ExperimentPaths, trial: TrialRecord, config: Any, metric: Optional[str],
        mode: Optional[str],
    ) -> None:
        self._paths = paths
        self._trial = trial
        self._trial_paths = paths.trial(trial.dir_name)
        self.trial_id = trial.trial_id
        self.status = trial.status
        self.config = config
        self.metrics: dict = dict(trial.last_result or {})
        self.path = self._trial_paths.uri
        self.error: Optional[TrialError] = (
            TrialError(trial) if trial.status == TrialStatus.ERRORED else None
        )
        self._metric, self._mode = metric, mode
        self._rows: Optional[list[dict]] = None

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
    def status(self) -> str:
        """The experiment's status: FINISHED, ERRORED, INTERRUPTED or RUNNING."""
        return self._state.status

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

        ``scope="last"`` compares each trial's last reported value, ``"all"`` its best value
        over all reports.
        """
        metric = metric or self._metric
        mode = mode or self._mode
        if not metric or mode not in ("max", "min"):
            raise ValueError(
                f"get_best_result needs a metric and a mode ('max' or 'min'); got metric="
                f"{metric!r}, mode={mode!r}. Fix: pass them, e.g. get_best_result('loss', 'min'), "
                "or set TuneConfig(metric=..., mode=...)."
            )
        if scope not in ("last", "all"):
            raise ValueError(f"get_best_result(scope={scope!r}): use 'last' or 'all'.")
        best, best_value = None, None
        for result in self._results:
            if scope == "last":
                values = [result.metrics.get(metric)]
            else:
                values = [r.get(metric) for r in result.rows]
            for value in values:
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                if filter_nan_and_inf and not math.isfinite(value):
                    continue
                if best_value is None or (value > best_value if mode == "max" else value < best_value):
                    best, best_value = result, value
        if best is None:
            raise ValueError(self._no_best_message(metric, scope))
        return best

    def _no_best_message(self, metric: str, scope: str) -> str:
        """Why no trial has a usable value of ``metric`` (NaN and infinities left out)."""
        values = []
        for result in self._results:
            rows = [result.metrics] if scope == "last" else result.rows
            values += [row[metric] for row in rows if metric in row]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        fix = ("Fix: look at the trials' rows (Result.metrics_dataframe), or pass "
               "filter_nan_and_inf=False to rank by them anyway.")
        subject = (f"every value of {metric!r}" if scope == "all"
                   else f"every trial's last value of {metric!r}")
        if numbers and all(v != v for v in numbers):
            return (f"get_best_result({metric!r}): {subject} is NaN, so no trial can be ranked "
                    f"by it (did the training diverge?). {fix}")
        if numbers:
            return (f"get_best_result({metric!r}): {metric!r} has no finite value ({subject} "
                    f"is NaN or infinite), so no trial can be ranked by it. {fix}")
        reported = sorted({k for r in self._results for k in r.metrics})
        return f"No trial reported a usable value of {metric!r}. Reported metrics: {reported}."

    def get_dataframe(self) -> "pandas.DataFrame":
        """A row per trial: its last result (flattened) plus ``config/...`` columns."""
        import pandas as pd

        records = []
        for result in self._results:
            row = flatten_row(result.metrics)
            row["trial_id"] = result.trial_id
            row["status"] = result.status
            config = result.config if isinstance(result.config, dict) else {}
            row.update(flatten_row(config, prefix="config/"))
            row["logdir"] = result.path
            records.append(row)
        return pd.DataFrame(records)

    def __repr__(self) -> str:
        from .ui.view import plural

        return (
            f"ResultGrid({self.experiment_path!r}: {plural(len(self), 'trial')}, "
            f"{self.num_terminated} terminated, {self.num_errors} errored)"
        )
