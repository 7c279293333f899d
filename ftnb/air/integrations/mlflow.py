"""Ray's ``ray.air.integrations.mlflow.MLflowLoggerCallback``: one MLflow run per trial, logged
from the driver (``pip install 'ftnb[mlflow]'``, the tracking client ``mlflow-skinny``).

    from ftnb.air.integrations.mlflow import MLflowLoggerCallback

    ftnb.Tuner(train, param_space={"lr": ftnb.loguniform(1e-4, 1e-1)},
               run_config=ftnb.RunConfig(callbacks=[MLflowLoggerCallback(
                   tracking_uri="http://mlflow.example:5000", experiment_name="sweep")])).fit()

Each trial's run has the trial's config as params, every numeric metric of each report at step
``training_iteration``, and the tags given plus ``trial_name``. Exactly once (see
:mod:`ftnb.logger`): the run's id is kept in the trial's folder (``mlflow_run.json``), so a
restored experiment goes on logging to the same run, with each iteration in it once, the
iterations the dead driver did not deliver included.

Ray's ``setup_mlflow`` (MLflow set up inside the trainable, which logs with the module it
returns) is here too: :mod:`ftnb.air.integrations.mlflow_setup`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from ...logger import (
    IterationLogger,
    numeric_metrics,
    require,
    step_of,
    trial_name,
)
from .mlflow_setup import MLflowNoop, log_params, setup_mlflow

__all__ = ["MLflowLoggerCallback", "MLflowNoop", "log_params", "setup_mlflow"]

_log = logging.getLogger("ftnb")

#: The trial folder's record of its run: {"run_id", "experiment_id", "tracking_uri", "ended"}.
_RECORD = "mlflow_run.json"
#: Row keys that are not logged as metrics (the time of a point is its timestamp).
_NOT_METRICS = ("timestamp", "attempt")
#: MLflow's limit: metrics per ``log_batch`` call.
_MAX_METRICS = 1000
#: Tags that find a trial's run again when its record was not written (the driver died between
#: creating the run and writing the record).
_TRIAL_TAG, _EXPERIMENT_TAG = "ftnb_trial_id", "ftnb_experiment"


class MLflowLoggerCallback(IterationLogger):
    """Log each trial to its own MLflow run (Ray Tune's ``MLflowLoggerCallback``).

    Args:
        tracking_uri: where runs go: a tracking server (``http://...``, ``databricks``), or a
            local store (``file:///path/mlruns``; MLflow 3 asks for
            ``MLFLOW_ALLOW_FILE_STORE=true`` there). None: ``MLFLOW_TRACKING_URI`` or
            MLflow's default.
        registry_uri: MLflow's model registry URI.
        experiment_name: the MLflow experiment (created if it does not exist). None:
            ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_EXPERIMENT_NAME`` when set, else the ftnb
            experiment's name.
        tags: tags set on every trial's run (``trial_name`` is added).
        tracking_token: a token for the tracking server (set as ``MLFLOW_TRACKING_TOKEN``).
        save_artifact: when a trial ends, upload its folder (results, checkpoints) as the
            run's artifacts.
        log_params_on_trial_end: log the config as params when the trial ends, not when it
            starts.
    """

    def __init__(self, tracking_uri: Optional[str] = None, *, registry_uri: Optional[str] = None,
                 experiment_name: Optional[str] = None, tags: Optional[dict] = None,
                 tracking_token: Optional[str] = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False) -> None:
        for name, value in (("tracking_uri", tracking_uri), ("registry_uri", registry_uri),
                            ("experiment_name", experiment_name),
                            ("tracking_token", tracking_token)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"MLflowLoggerCallback({name}={value!r}) must be a non-empty "
                                f"string or None. Fix: {name}='...'.")
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"MLflowLoggerCallback(tags={tags!r}) must be a dict of tag names "
                            "to values. Fix: tags={'team': 'vision'}.")
        for name, value in (("save_artifact", save_artifact),
                            ("log_params_on_trial_end", log_params_on_trial_end)):
            if not isinstance(value, bool):
                raise TypeError(f"MLflowLoggerCallback({name}={value!r}) must be True or False.")
        require("mlflow", "mlflow", "MLflowLoggerCallback")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.tracking_token = tracking_token
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end

    # -- the sink ------------------------------------------------------------------------------
    def _open(self, **info: Any) -> None:
        from mlflow.tracking import MlflowClient

        if self.tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token
        self._client = MlflowClient(tracking_uri=self.tracking_uri,
                                    registry_uri=self.registry_uri)
        self._experiment_id = self._experiment()
        self._runs: dict[str, str] = {}  # trial id -> run id
        self._status: dict[str, str] = {}  # trial id -> the run's MLflow status

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        client = self._client
        env_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if self.experiment_name is None and env_id:
            try:
                return client.get_experiment(env_id).experiment_id
            except MlflowException:
                pass  # no such experiment there: by name, as Ray does
        name = (self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                or (self._paths.name if self._paths is not None else "ftnb"))
        found = client.get_experiment_by_name(name)
        if found is None:
            try:
                return client.create_experiment(name)
            except MlflowException:  # created meanwhile by another driver
                found = client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise ValueError(
                f"MLflowLoggerCallback(experiment_name={name!r}): that MLflow experiment is "
                "deleted. Fix: restore it (`mlflow experiments restore`), delete it for good "
                "(`mlflow gc`), or choose another experiment_name.")
        return found.experiment_id

    def _run_id(self, trial: Any, create: bool) -> Optional[str]:
        """The trial's run: the one this driver uses, the one in the trial's record, one tagged
        with the trial (restored experiments only), or a new one when ``create``."""
        run_id = self._runs.get(trial.trial_id)
        if run_id is not None:
            return run_id
        run = None
        record = self.read_record(trial, _RECORD)
        if record:
            run = self._existing_run(record.get("run_id"))
        if run is None and self._restored:
            run = self._tagged_run(trial)
        if run is None:
            if not create:
                return None
            run = self._new_run(trial)
        elif not record or record.get("run_id") != run.info.run_id:
            self._write(trial, run.info.run_id, ended=False)
        self._runs[trial.trial_id] = run.info.run_id
        self._status[trial.trial_id] = run.info.status
        return run.info.run_id

    def _existing_run(self, run_id: Optional[str]) -> Any:
        from mlflow.exceptions import MlflowException

        if not run_id:
            return None
        try:
            run = self._client.get_run(run_id)
        except MlflowException:
            return None  # gone, or another tracking store than the one logged to
        return run if run.info.lifecycle_stage != "deleted" else None

    def _tagged_run(self, trial: Any) -> Any:
        runs = self._client.search_runs(
            [self._experiment_id], filter_string=f"tags.{_TRIAL_TAG} = '{trial.trial_id}'",
            max_results=100)
        experiment = self._paths.uri if self._paths is not None else ""
        return next((r for r in runs if r.data.tags.get(_EXPERIMENT_TAG) == experiment), None)

    def _new_run(self, trial: Any) -> Any:
        name = trial_name(trial)
        tags = {**{str(k): str(v) for k, v in self.tags.items()}, "trial_name": name,
                _TRIAL_TAG: trial.trial_id,
                _EXPERIMENT_TAG: self._paths.uri if self._paths is not None else ""}
        run = self._client.create_run(self._experiment_id, run_name=name, tags=tags)
        self._write(trial, run.info.run_id, ended=False)
        if not self.log_params_on_trial_end:
            self._log_params(run.info.run_id, trial.config, logged={})
        return run

    def _write(self, trial: Any, run_id: str, ended: bool) -> None:
        self.write_record(trial, _RECORD, {
            "run_id": run_id, "experiment_id": self._experiment_id,
            "tracking_uri": self._client.tracking_uri, "ended": ended})

    def _log_params(self, run_id: str, config: Any, logged: dict) -> None:
        log_params(self._client, run_id, config, logged)

    def _log_rows(self, run_id: str, rows: list[dict], held: Optional[dict] = None) -> None:
        """Log the rows' metrics at their iterations, less the (metric, iteration) points in
        ``held``."""
        from mlflow.entities import Metric

        held = held or {}
        now = int(time.time() * 1000)
        metrics = []
        for row in rows:
            step = step_of(row)
            stamp = int(row["timestamp"] * 1000) if row.get("timestamp") else now
            for key, value in numeric_metrics(row, _NOT_METRICS).items():
                if step not in held.get(key, ()):
                    metrics.append(Metric(key, float(value), stamp, step))
        for i in range(0, len(metrics), _MAX_METRICS):
            self._client.log_batch(run_id, metrics=metrics[i:i + _MAX_METRICS])

    def _held(self, run_id: str) -> dict[str, set[int]]:
        """The run's points: metric -> iterations."""
        client = self._client
        return {key: {m.step for m in client.get_metric_history(run_id, key)}
                for key in client.get_run(run_id).data.metrics}

    def _replay(self, trial: Any, rows: list[dict]) -> int:
        run_id = self._run_id(trial, create=bool(rows))
        if run_id is None:
            return 0
        held = self._held(run_id)
        if not self.log_params_on_trial_end:  # a driver that died before logging them
            self._log_params(run_id, trial.config, self._client.get_run(run_id).data.params)
        self._log_rows(run_id, rows, held)
        return max([step_of(r) for r in rows] + [max(s) for s in held.values() if s], default=0)

    def _ended_before(self, trial: Any) -> bool:
        record = self.read_record(trial, _RECORD)
        return bool(record and record.get("ended"))

    # -- Ray's hooks ---------------------------------------------------------------------------
    def log_trial_start(self, trial: Any) -> None:
        run_id = self._run_id(trial, create=True)
        if self._status.get(trial.trial_id) != "RUNNING":  # ended, and now run again
            self._client.update_run(run_id, status="RUNNING")
            self._status[trial.trial_id] = "RUNNING"
            self._write(trial, run_id, ended=False)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        self._log_rows(self._run_id(trial, create=True), [result])

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        run_id = self._run_id(trial, create=True)
        if self.should_save_artifact and self._paths is not None:
            trial_paths = self._paths.trial(trial.dir_name)
            with trial_paths.storage.local_folder(trial_paths.dir) as local:
                self._client.log_artifacts(run_id, local)
        if self.log_params_on_trial_end:
            self._log_params(run_id, trial.config, self._client.get_run(run_id).data.params)
        status = "FAILED" if failed else "FINISHED"
        self._client.set_terminated(run_id, status=status)
        self._status[trial.trial_id] = status
        self._write(trial, run_id, ended=True)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # Trials that did not end (the experiment was stopped): their runs are KILLED until
        # the experiment is resumed, which sets them RUNNING again.
        if self._off:
            return
        for trial in trials:
            if self._status.get(trial.trial_id) == "RUNNING":
                self._client.set_terminated(self._runs[trial.trial_id], status="KILLED")
                self._status[trial.trial_id] = "KILLED"

