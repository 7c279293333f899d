"""``setup_mlflow`` inside the trainable (issue 31, item 8), as Ray's docs use it: real MLflow with
a local file store, read back with ``MlflowClient``. One run per trial with the config as
params and what the trainable logged; a retry goes on in the same run; in a group only rank 0
logs; bad arguments are refused with the fix."""

from __future__ import annotations

import os

import pytest

import ftnb

mlflow = pytest.importorskip("mlflow", reason="needs ftnb[mlflow]")

from ftnb.air.integrations.mlflow import MLflowNoop, setup_mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A file store that MLflow 3 accepts, and no tracking settings from outside the test."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    yield f"file://{tmp_path / 'mlruns'}"
    # setup_mlflow called here (outside a trial) set this process's tracking URI, as Ray's does.
    mlflow.set_tracking_uri(None)


def _runs(store, experiment):
    client = MlflowClient(tracking_uri=store)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def _points(store, run, key):
    client = MlflowClient(tracking_uri=store)
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def _logs_three_steps(config):
    mlflow = setup_mlflow(config)
    for step in range(3):
        mlflow.log_metric("loss", config["lr"] * step, step=step)
        ftnb.report({"loss": config["lr"] * step})


def test_each_trial_logs_to_its_own_run_named_after_it(tmp_path, store):
    MlflowClient(tracking_uri=store).create_experiment("sweep")
    space = {"lr": ftnb.grid_search([1.0, 2.0]),
             "mlflow": {"tracking_uri": store, "experiment_name": "sweep"}}
    results = ftnb.Tuner(_logs_three_steps, param_space=space, run_config=ftnb.RunConfig(
        name="exp", storage_path=str(tmp_path), verbose=0)).fit()
    assert not results.errors
    runs = {run.info.run_name: run for run in _runs(store, "sweep")}
    names = {r.config["lr"]: os.path.basename(r.path) for r in results}
    assert sorted(runs) == sorted(names.values())
    for lr, name in names.items():
        run = runs[name]
        assert run.info.status == "FINISHED"
        assert run.data.params == {"lr": str(lr)}  # the config, less its "mlflow" settings
        assert _points(store, run, "loss") == [(0, 0.0), (1, lr), (2, 2 * lr)]
        assert run.data.tags["trial_name"] == name


def _fails_once_after_a_checkpoint(config):
    mlflow = setup_mlflow(config, tracking_uri=config["store"], experiment_name="retry",
                          create_experiment_if_not_exists=True, tags={"team": "t"})
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = int(open(os.path.join(folder, "step")).read()) + 1
    for step in range(start, 4):
        mlflow.log_metric("step", step, step=step)
        folder = os.path.join(config["scratch"], f"{ftnb.get_context().attempt}-{step}")
        os.makedirs(folder)
        with open(os.path.join(folder, "step"), "w") as f:
            f.write(str(step))
        ftnb.report({"step": step}, checkpoint=ftnb.Checkpoint.from_directory(folder))
        if step == 1 and checkpoint is None:
            raise RuntimeError("the first attempt fails after step 1")


def test_a_retry_goes_on_in_the_same_run(tmp_path, store):
    results = ftnb.Tuner(
        _fails_once_after_a_checkpoint,
        param_space={"store": store, "scratch": str(tmp_path / "scratch")},
        run_config=ftnb.RunConfig(name="exp", storage_path=str(tmp_path), verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1))).fit()
    assert not results.errors and results[0].metrics["step"] == 3
    (run,) = _runs(store, "retry")
    assert run.info.status == "FINISHED" and run.data.tags["team"] == "t"
    assert _points(store, run, "step") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    assert (tmp_path / "exp" / os.path.basename(results[0].path)
            / "mlflow_setup_run.json").exists()


def _raises(config):
    mlflow = setup_mlflow(config, tracking_uri=config["store"], experiment_name="failing",
                          create_experiment_if_not_exists=True)
    mlflow.log_metric("x", 1.0)
    raise ValueError("boom")


def test_a_trial_that_raises_ends_its_run_failed(tmp_path, store):
    results = ftnb.Tuner(_raises, param_space={"store": store}, run_config=ftnb.RunConfig(
        name="exp", storage_path=str(tmp_path), verbose=0)).fit()
    assert len(results.errors) == 1
    (run,) = _runs(store, "failing")
    assert run.info.status == "FAILED" and run.data.metrics == {"x": 1.0}


def _each_rank_logs(config):
    mlflow = setup_mlflow(config, tracking_uri=config["store"], experiment_name="group",
                          rank_zero_only=config["rank_zero_only"])
    rank = ftnb.get_context().get_world_rank()
    assert isinstance(mlflow, MLflowNoop) == (config["rank_zero_only"] and rank != 0)
    mlflow.log_metric(f"rank{rank}", 1.0)
    ftnb.report({"done": 1})


@pytest.mark.parametrize("rank_zero_only", [True, False])
def test_a_group_logs_from_rank_0_only_unless_asked(tmp_path, store, rank_zero_only):
    MlflowClient(tracking_uri=store).create_experiment("group")
    trainer = ftnb.TorchTrainer(
        _each_rank_logs,
        train_loop_config={"store": store, "rank_zero_only": rank_zero_only},
        scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ftnb.RunConfig(name="ranks", storage_path=str(tmp_path), verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)))
    trainer.fit()
    runs = _runs(store, "group")
    logged = sorted(key for run in runs for key in run.data.metrics)
    assert logged == (["rank0"] if rank_zero_only else ["rank0", "rank1"])
    assert len(runs) == (1 if rank_zero_only else 2)


def test_bad_arguments_are_refused_with_the_fix(store):
    with pytest.raises(TypeError, match=r"config='lr'.*Fix: setup_mlflow\(config\)"):
        setup_mlflow("lr")
    with pytest.raises(ValueError, match=r"unknown keys \['tracking'\].*tracking_uri"):
        setup_mlflow({"mlflow": {"tracking": store}})
    with pytest.raises(TypeError, match=r"config\['mlflow'\] = 'x' must be a dict"):
        setup_mlflow({"mlflow": "x"})
    with pytest.raises(TypeError, match=r"tags=\['a'\]\) must be a dict"):
        setup_mlflow(tags=["a"])
    with pytest.raises(TypeError, match=r"rank_zero_only='yes'\) must be True or False"):
        setup_mlflow(rank_zero_only="yes")
    with pytest.raises(TypeError, match=r"experiment_name=''\) must be a non-empty string"):
        setup_mlflow({"mlflow": {"experiment_name": ""}})
    with pytest.raises(ValueError, match=r"no MLflow experiment.*'nope'.*"
                                         r"create_experiment_if_not_exists=True"):
        setup_mlflow(tracking_uri=store, experiment_name="nope")


def test_outside_a_trial_it_sets_up_a_run_as_ray_does(store):
    module = setup_mlflow({"a": 1}, tracking_uri=store, experiment_name="here",
                          create_experiment_if_not_exists=True, run_name="by_hand")
    try:
        assert module is mlflow and mlflow.active_run().info.run_name == "by_hand"
        mlflow.log_metric("m", 2.0)
    finally:
        mlflow.end_run()
    (run,) = _runs(store, "here")
    assert run.data.params == {"a": "1"} and run.data.metrics == {"m": 2.0}


def test_an_argument_given_wins_over_the_configs_mlflow_settings(store):
    config = {"a": 1, "mlflow": {"tracking_uri": store, "experiment_name": "from_config",
                                 "create_experiment_if_not_exists": True}}
    setup_mlflow(config, experiment_name="given")
    mlflow.end_run()
    assert len(_runs(store, "given")) == 1 and _runs(store, "from_config") == []
