"""Ray's ``ray.air.integrations.mlflow.setup_mlflow``: MLflow set up *inside* the trainable, which
then logs what it likes with the module it returns (``pip install 'ftnb[mlflow]'``)::

    from ftnb.air.integrations.mlflow import setup_mlflow

    def train(config):
        mlflow = setup_mlflow(config, experiment_name="sweep",
                              tracking_uri="file:///data/mlruns",
                              create_experiment_if_not_exists=True)
        for step in range(10):
            mlflow.log_metric("loss", 1 / (step + 1), step=step)
            ftnb.report({"loss": 1 / (step + 1)})

One MLflow run per trial, named after the trial, with the config (less its ``"mlflow"`` key) as
params; ended when the attempt ends (FINISHED, FAILED when the trainable raised, KILLED when it
was preempted or fenced out). A retry of the trial (and a restored experiment) goes on in the
same run: its id is kept in the trial's folder (``mlflow_setup_run.json``), the run is set
RUNNING again, and what the retry logs is added to it. Steps the retry repeats (it resumed
from a checkpoint older than the failure) are logged again: MLflow keeps both points of such
a step, and shows the later one.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ...logger import require, shown_config

__all__ = ["MLflowNoop", "log_params", "setup_mlflow"]

#: The trial folder's record of its run: {"run_id", "experiment_id", "tracking_uri"}.
_RECORD = "mlflow_setup_run.json"
#: setup_mlflow's settings, as keyword arguments and as keys of ``config["mlflow"]``, with
#: their defaults.
_DEFAULTS = {"tracking_uri": None, "registry_uri": None, "experiment_id": None,
             "experiment_name": None, "tracking_token": None, "artifact_location": None,
             "run_name": None, "create_experiment_if_not_exists": False, "tags": None,
             "rank_zero_only": True}
#: MLflow's limits: params per ``log_batch`` call, characters of a param value.
_MAX_PARAMS, _MAX_PARAM_CHARS = 100, 6000
#: The MLflow status of a run, by how the attempt ended (None: the trainable raised).
_END_STATUS = {"finished": "FINISHED", "stopped": "FINISHED", None: "FAILED"}


def log_params(client: Any, run_id: str, config: Any, logged: dict) -> None:
    """Log ``config`` (flattened) as the run's params through ``client`` (an
    ``MlflowClient``), less those ``logged`` already (MLflow refuses to change a param: a
    config that changed, with PBT, keeps its first values)."""
    from mlflow.entities import Param

    from ...storage.result_log import flatten_row

    config = shown_config(config)
    flat = flatten_row(config) if isinstance(config, dict) else {"config": config}
    params = [Param(key, str(value)[:_MAX_PARAM_CHARS]) for key, value in flat.items()
              if key not in logged]
    for i in range(0, len(params), _MAX_PARAMS):
        client.log_batch(run_id, params=params[i:i + _MAX_PARAMS])


class MLflowNoop:
    """What ``setup_mlflow`` returns on the ranks that do not log (all but rank 0 of a group,
    with ``rank_zero_only``): any attribute is another one, any call does nothing and returns
    None, so ``mlflow.log_metric(...)`` runs unchanged on every rank."""

    def __getattr__(self, name: str) -> "MLflowNoop":
        if name.startswith("__"):  # copy, pickle and friends look for these
            raise AttributeError(name)
        return MLflowNoop()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def setup_mlflow(config: Optional[dict] = None, tracking_uri: Optional[str] = None,
                 registry_uri: Optional[str] = None, experiment_id: Optional[str] = None,
                 experiment_name: Optional[str] = None, tracking_token: Optional[str] = None,
                 artifact_location: Optional[str] = None, run_name: Optional[str] = None,
                 create_experiment_if_not_exists: bool = False, tags: Optional[dict] = None,
                 rank_zero_only: bool = True) -> Any:
    """Start this trial's MLflow run and return the ``mlflow`` module that logs to it (Ray's
    ``setup_mlflow``, with its arguments and defaults).

    Args:
        config: the trial's config: logged as the run's params, less its ``"mlflow"`` key,
            whose dict may hold any of the arguments below (an argument given here wins).
        tracking_uri, registry_uri: where runs go (a server, ``file:///path``; MLflow 3 asks
            for ``MLFLOW_ALLOW_FILE_STORE=true`` with a file store). None: MLflow's default.
        experiment_id, experiment_name: the MLflow experiment: the first that exists of the
            id, then the name (then ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_EXPERIMENT_NAME``);
            defaults, as Ray's: the trial's id and the trial's name.
        create_experiment_if_not_exists: create ``experiment_name`` (at
            ``artifact_location``) when no such experiment exists; False: that is an error.
        tracking_token: a token for the tracking server (set as ``MLFLOW_TRACKING_TOKEN``).
        run_name: the run's name (default: the trial's name).
        tags: tags of the run (``trial_name`` is added).
        rank_zero_only: in a group (TorchTrainer), only rank 0 logs; the other ranks get a
            :class:`MLflowNoop`. False: every rank starts a run of its own.

    Outside a trial it sets up MLflow the same way, without a trial's defaults.
    """
    given = {"tracking_uri": tracking_uri, "registry_uri": registry_uri,
             "experiment_id": experiment_id, "experiment_name": experiment_name,
             "tracking_token": tracking_token, "artifact_location": artifact_location,
             "run_name": run_name,
             "create_experiment_if_not_exists": create_experiment_if_not_exists,
             "tags": tags, "rank_zero_only": rank_zero_only}
    settings = _settings(config, given)
    require("mlflow", "mlflow", "setup_mlflow")
    session = _session_here()
    context = session.context if session is not None else None
    if settings["rank_zero_only"] and context is not None and context.world_rank != 0:
        return MLflowNoop()
    import mlflow
    from mlflow.tracking import MlflowClient

    if settings["tracking_token"]:
        os.environ["MLFLOW_TRACKING_TOKEN"] = settings["tracking_token"]
    if settings["tracking_uri"]:
        mlflow.set_tracking_uri(settings["tracking_uri"])
    if settings["registry_uri"]:
        mlflow.set_registry_uri(settings["registry_uri"])
    client = MlflowClient()
    experiment = _experiment(client, settings, context)
    params = {k: v for k, v in (config or {}).items() if k != "mlflow"}
    run_id = _start_run(mlflow, client, experiment, settings, session, params)
    if session is not None:
        session.end_hooks.append(_run_ender(mlflow, client, run_id))
    return mlflow


def _settings(config: Any, given: dict) -> dict:
    """The arguments, with ``config["mlflow"]``'s for those left at their defaults; checked."""
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"setup_mlflow(config={config!r}) must be the trial's config dict or "
                        "None. Fix: setup_mlflow(config) inside train(config).")
    from_config = (config or {}).get("mlflow") or {}
    if not isinstance(from_config, dict):
        raise TypeError(f"setup_mlflow: config['mlflow'] = {from_config!r} must be a dict of "
                        "setup_mlflow's arguments. Fix: {'mlflow': {'experiment_name': '...'}}.")
    unknown = sorted(set(from_config) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"setup_mlflow: config['mlflow'] has unknown keys {unknown}. Fix: use "
                         f"only setup_mlflow's arguments: {', '.join(_DEFAULTS)}.")
    settings = {key: (from_config[key] if given[key] == default and key in from_config
                      else given[key]) for key, default in _DEFAULTS.items()}
    for key in ("tracking_uri", "registry_uri", "experiment_id", "experiment_name",
                "tracking_token", "artifact_location", "run_name"):
        value = settings[key]
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"setup_mlflow({key}={value!r}) must be a non-empty string or "
                            f"None. Fix: {key}='...'.")
    if settings["tags"] is not None and not isinstance(settings["tags"], dict):
        raise TypeError(f"setup_mlflow(tags={settings['tags']!r}) must be a dict of tag "
                        "names to values. Fix: tags={'team': 'vision'}.")
    for key in ("create_experiment_if_not_exists", "rank_zero_only"):
        if not isinstance(settings[key], bool):
            raise TypeError(f"setup_mlflow({key}={settings[key]!r}) must be True or False.")
    return settings


def _session_here() -> Any:
    """The running attempt's session; None outside a trial."""
    from ...session import current_session

    try:
        return current_session("setup_mlflow")
    except RuntimeError:
        return None


def _experiment(client: Any, settings: dict, context: Any) -> str:
    """The id of the experiment the run goes to (see :func:`setup_mlflow`)."""
    from mlflow.exceptions import MlflowException

    wanted_id = (settings["experiment_id"] or os.environ.get("MLFLOW_EXPERIMENT_ID")
                 or (context.trial_id if context is not None else None))
    name = (settings["experiment_name"] or os.environ.get("MLFLOW_EXPERIMENT_NAME")
            or (context.trial_name if context is not None else None))
    if wanted_id:
        try:
            found = client.get_experiment(wanted_id)
        except MlflowException:
            found = None  # no such id there: by name, as Ray does
        if found is not None and found.lifecycle_stage != "deleted":
            return found.experiment_id
    found = client.get_experiment_by_name(name) if name else None
    if found is not None and found.lifecycle_stage == "deleted":
        raise ValueError(f"setup_mlflow(experiment_name={name!r}): that MLflow experiment is "
                         "deleted. Fix: restore it (`mlflow experiments restore`), delete it "
                         "for good (`mlflow gc`), or choose another experiment_name.")
    if found is not None:
        return found.experiment_id
    if not (settings["create_experiment_if_not_exists"] and name):
        raise ValueError(
            f"setup_mlflow: no MLflow experiment with id {wanted_id!r} or name {name!r} at "
            f"{client.tracking_uri}. Fix: pass experiment_name='...' with "
            "create_experiment_if_not_exists=True, or the id or name of an existing one.")
    try:
        return client.create_experiment(name, artifact_location=settings["artifact_location"])
    except MlflowException:  # another trial created it meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _start_run(mlflow: Any, client: Any, experiment: str, settings: dict,
               session: Any, params: dict) -> str:
    """Start the trial's run, or resume the one its earlier attempts logged to (rank 0 keeps
    its id in the trial's folder); log the ``params`` it does not hold yet."""
    context = session.context if session is not None else None
    record_path = (session.paths.logger_record(_RECORD)
                   if session is not None and context.world_rank == 0 else None)
    run_id = _recorded_run(client, session, record_path, experiment)
    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        return run_id  # called again in the same attempt
    mlflow.set_experiment(experiment_id=experiment)
    if run_id is not None:
        mlflow.start_run(run_id=run_id)
    else:
        name = settings["run_name"] or (context.trial_name if context is not None else None)
        tags = {str(k): str(v) for k, v in (settings["tags"] or {}).items()}
        if context is not None:
            tags.update(trial_name=context.trial_name, ftnb_trial_id=context.trial_id)
        run_id = mlflow.start_run(experiment_id=experiment, run_name=name,
                                  tags=tags).info.run_id
        if record_path is not None:
            session.storage.write_json_atomic(record_path, {
                "run_id": run_id, "experiment_id": experiment,
                "tracking_uri": client.tracking_uri})
    if params:
        log_params(client, run_id, params, client.get_run(run_id).data.params)
    return run_id


def _recorded_run(client: Any, session: Any, record_path: Optional[str],
                  experiment: str) -> Optional[str]:
    """The run an earlier attempt of this trial started, when it is in the same tracking
    store and experiment and not deleted."""
    import json

    from mlflow.exceptions import MlflowException

    if record_path is None:
        return None
    try:
        record = json.loads(session.storage.read_bytes(record_path))
    except FileNotFoundError:
        return None
    if (record.get("tracking_uri") != client.tracking_uri
            or record.get("experiment_id") != experiment):
        return None
    try:
        run = client.get_run(record["run_id"])
    except MlflowException:
        return None
    return run.info.run_id if run.info.lifecycle_stage != "deleted" else None


def _run_ender(mlflow: Any, client: Any, run_id: str) -> Any:
    def end_mlflow_run(outcome: Optional[str]) -> None:
        status = _END_STATUS.get(outcome, "KILLED")
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            mlflow.end_run(status=status)
        else:
            client.set_terminated(run_id, status=status)

    return end_mlflow_run
