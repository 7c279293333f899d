"""``MLflowLoggerCallback`` and ``WandbLoggerCallback`` (issue 18), as Ray's docs use them: MLflow
with a local file store read back with ``MlflowClient``, W&B in offline mode read back from the
run's own files. One run per trial with the config, one point per iteration after a retry from
a checkpoint, and after a SIGKILLed driver and a restore (the same run continued)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from fractions import Fraction

import pytest
from killed_driver import kill_when, run_to_end, trial_with_reports
from procs import STARTED, wait_for
from scripted import result_rows
from test_tune_api_callbacks import _counting

import ftnb

mlflow = pytest.importorskip("mlflow", reason="needs ftnb[mlflow]")
wandb = pytest.importorskip("wandb", reason="needs ftnb[wandb]")

from ftnb.air.integrations.mlflow import MLflowLoggerCallback  # noqa: E402
from ftnb.air.integrations.wandb import (  # noqa: E402
    WandbLoggerCallback,
    read_history,
    run_pieces,
)
from mlflow.tracking import MlflowClient  # noqa: E402

#: What both loggers need in any process that runs them in these tests: MLflow 3's file store
#: opted into, W&B offline and quiet, nothing reaching a network.
ENV = {"MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
       "WANDB_DISABLE_GIT": "true",
       "WANDB_ERROR_REPORTING": "false"}


@pytest.fixture
def tracking_env(monkeypatch, tmp_path):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield
    wandb.teardown()  # the wandb-core service this process started
    wait_for(lambda: not _wandb_services(os.getpid()), timeout=30,
             what="this process's wandb-core service to exit")


def _wandb_services(parent_pid: int) -> list[int]:
    """wandb-core processes started for ``parent_pid`` (its ``--pid``), still running."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and args and args[0].endswith("wandb-core") and any(
                a == str(parent_pid) and args[i - 1].lstrip("-") == "pid"
                for i, a in enumerate(args) if i):
            found.append(int(pid))
    return found


# -- readers -----------------------------------------------------------------------------------
def _mlflow_runs(store: str, experiment: str) -> list:
    client = MlflowClient(tracking_uri=f"file://{store}")
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def _points(store: str, run_id: str, key: str) -> list[tuple[int, float]]:
    client = MlflowClient(tracking_uri=f"file://{store}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _wandb_pieces(wandb_dir: str, run_id: str) -> list[str]:
    """The run's files, one per driver that logged to it, oldest first."""
    return run_pieces(os.path.join(wandb_dir, "wandb"), run_id)


def _wandb_points(wandb_dir: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(step, values[key]) for piece in _wandb_pieces(wandb_dir, run_id)
            for step, values in read_history(piece) if key in values]


def _record_kinds(piece: str) -> list[str]:
    from ftnb.air.integrations.wandb import _records
    from wandb.proto import wandb_internal_pb2

    kinds = []
    with open(piece, "rb") as f:
        for raw in _records(f.read()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            kinds.append(record.WhichOneof("record_type"))
    return kinds


def _trial_dirs(exp) -> list:
    return sorted(d.parent for d in exp.glob("*/result.json"))


# -- in one process ----------------------------------------------------------------------------
def test_one_run_per_trial_with_its_config_and_each_iteration_once(
        tmp_path, tracking_env, monkeypatch):
    monkeypatch.delenv("WANDB_DIR")  # W&B's files go to the trial's folder, as Ray's do
    store = str(tmp_path / "mlruns")
    results = ftnb.Tuner(
        _counting,
        # An object in the config (not JSON): shown by its repr.
        param_space={"n": 6, "fail_at": ftnb.grid_search([0, 5]), "opt": {"lr": 0.1},
                     "model": Fraction(1, 3)},
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="track", verbose=0, executor="inprocess",
            failure_config=ftnb.FailureConfig(max_failures=1),
            callbacks=[MLflowLoggerCallback(tracking_uri=f"file://{store}",
                                            experiment_name="sweep", tags={"team": "tune"},
                                            save_artifact=True),
                       WandbLoggerCallback(project="sweep", upload_checkpoints=True)]),
    ).fit()
    assert not results.errors and len(results) == 2
    exp = tmp_path / "track"
    expected_score = [(i, float(i)) for i in range(1, 7)]

    runs = _mlflow_runs(store, "sweep")
    assert len(runs) == 2
    by_trial = {r.data.tags["ftnb_trial_id"]: r for r in runs}
    for trial_dir in _trial_dirs(exp):
        trial_id = trial_dir.name
        run = by_trial[trial_id]
        record = json.loads((trial_dir / "mlflow_run.json").read_text())
        assert record["run_id"] == run.info.run_id and record["ended"] is True
        assert run.info.status == "FINISHED"
        assert run.data.tags["team"] == "tune" and run.data.tags["trial_name"] == trial_id
        fail_at = json.loads((trial_dir / "params.json").read_text())["fail_at"]
        assert run.data.params == {"n": "6", "fail_at": str(fail_at), "opt/lr": "0.1",
                                   "model": "Fraction(1, 3)"}
        assert _points(store, run.info.run_id, "score") == expected_score
        assert _points(store, run.info.run_id, "nested/half") == [
            (i, i / 2) for i in range(1, 7)]
        artifacts = MlflowClient(tracking_uri=f"file://{store}").list_artifacts(run.info.run_id)
        assert "result.json" in {a.path for a in artifacts}  # save_artifact: the trial's folder

        record = json.loads((trial_dir / "wandb_run.json").read_text())
        assert record["ended"] is True
        (piece,) = _wandb_pieces(str(trial_dir), record["run_id"])
        assert _wandb_points(str(trial_dir), record["run_id"], "score") == expected_score
        assert [step for step, _ in read_history(piece)] == list(range(1, 7))
        assert _record_kinds(piece).count("artifact") == 2  # the checkpoints at 3 and 6

    # One trial did iteration 4 twice (its retry went back to the checkpoint at 3), and each
    # logger above holds it once.
    attempts = [{r["attempt"] for r in result_rows(str(d))} for d in _trial_dirs(exp)]
    assert sorted(map(len, attempts)) == [1, 2]


def test_an_errored_trial_resumed_continues_its_runs_without_an_iteration_twice(
        tmp_path, tracking_env):
    # It fails at 5 (max_failures=0: ERRORED, its runs end FAILED); ftnb.run again resumes it
    # from its checkpoint at 3: iteration 4 is done again, and its runs go on from 5.
    store = str(tmp_path / "mlruns")

    def run():
        return ftnb.run(_counting, name="again", storage_path=str(tmp_path),
                        param_space={"n": 6, "fail_at": 5},
                        run_config=ftnb.RunConfig(verbose=0, executor="inprocess", callbacks=[
                            MLflowLoggerCallback(tracking_uri=f"file://{store}",
                                                 experiment_name="again"),
                            WandbLoggerCallback(project="again")]))

    assert len(run().errors) == 1
    (trial_dir,) = _trial_dirs(tmp_path / "again")
    (failed,) = _mlflow_runs(store, "again")
    assert failed.info.status == "FAILED"
    wandb_id = json.loads((trial_dir / "wandb_run.json").read_text())["run_id"]
    assert _wandb_points(str(tmp_path), wandb_id, "score") == [(i, float(i)) for i in (1, 2, 3, 4)]

    assert not run().errors
    rows = result_rows(str(trial_dir))
    assert [(r["training_iteration"], r["attempt"]) for r in rows] == [
        (1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
    (run_,) = _mlflow_runs(store, "again")  # the same run, FINISHED now
    assert run_.info.run_id == failed.info.run_id and run_.info.status == "FINISHED"
    expected = [(i, float(i)) for i in range(1, 7)]
    assert _points(store, run_.info.run_id, "score") == expected
    first, second = _wandb_pieces(str(tmp_path), wandb_id)  # one run id, a piece per driver
    assert [step for step, _ in read_history(second)] == [5, 6]
    assert _wandb_points(str(tmp_path), wandb_id, "score") == expected


def test_an_experiment_on_any_fsspec_filesystem_keeps_its_run_ids_there(tmp_path, tracking_env):
    import uuid

    import fsspec

    store, base = str(tmp_path / "mlruns"), f"memory://ftnb-{uuid.uuid4().hex}"
    results = ftnb.Tuner(_counting, param_space={"n": 4}, run_config=ftnb.RunConfig(
        storage_path=base, name="mem", verbose=0, executor="inprocess",
        callbacks=[MLflowLoggerCallback(tracking_uri=f"file://{store}", experiment_name="mem"),
                   WandbLoggerCallback(project="mem")])).fit()
    assert not results.errors
    fs = fsspec.filesystem("memory")
    trial_id = results[0].trial_id
    record = json.loads(fs.cat(f"{base}/mem/{trial_id}/mlflow_run.json"))
    assert _points(store, record["run_id"], "score") == [(i, float(i)) for i in range(1, 5)]
    record = json.loads(fs.cat(f"{base}/mem/{trial_id}/wandb_run.json"))
    assert _wandb_points(str(tmp_path), record["run_id"], "score") == [
        (i, float(i)) for i in range(1, 5)]
    fs.rm(base, recursive=True)


def test_a_run_whose_id_was_not_recorded_is_found_again_by_its_tags(tmp_path, tracking_env):
    # A driver that died between MLflow making the run and the run's id reaching the trial's
    # folder: the next driver finds the run by its tags instead of making a second one.
    store = str(tmp_path / "mlruns")

    def run():
        ftnb.run(_counting, name="orphan", storage_path=str(tmp_path), param_space={"n": 3},
                 run_config=ftnb.RunConfig(verbose=0, executor="inprocess", callbacks=[
                     MLflowLoggerCallback(tracking_uri=f"file://{store}",
                                          experiment_name="orphan")]))

    run()
    (trial_dir,) = _trial_dirs(tmp_path / "orphan")
    record = json.loads((trial_dir / "mlflow_run.json").read_text())
    (trial_dir / "mlflow_run.json").unlink()
    run()  # resumes the (finished) experiment: the restored driver catches up every trial
    (found,) = _mlflow_runs(store, "orphan")
    assert found.info.run_id == record["run_id"]
    assert json.loads((trial_dir / "mlflow_run.json").read_text()) == record
    assert _points(store, found.info.run_id, "score") == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_logger_that_cannot_start_says_so_once_and_the_experiment_goes_on(
        tmp_path, caplog):
    with caplog.at_level(logging.ERROR, logger="ftnb"):
        results = ftnb.Tuner(_counting, param_space={"n": 4}, run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="off", verbose=0, executor="inprocess",
            callbacks=[MLflowLoggerCallback(tracking_uri="nosuchstore://here")]),
        ).fit()
    assert not results.errors and len(results[0].metrics_dataframe) == 4
    errors = [r.getMessage() for r in caplog.records if "MLflowLoggerCallback" in r.getMessage()]
    assert len(errors) == 1 and "MLflowLoggerCallback.setup raised" in errors[0], errors
    assert "nosuchstore" in caplog.text  # MLflow's own words, with the traceback


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(TypeError, match="tags"):
        MLflowLoggerCallback(tags=["team"])
    with pytest.raises(TypeError, match="tracking_uri"):
        MLflowLoggerCallback(tracking_uri=5)
    with pytest.raises(ValueError, match="project"):
        WandbLoggerCallback()
    with pytest.raises(ValueError, match="api_key"):
        WandbLoggerCallback(project="p", api_key="k", api_key_file=str(tmp_path / "key"))
    with pytest.raises(ValueError, match="ftnb sets it"):
        WandbLoggerCallback(project="p", id="mine")
    with pytest.raises(TypeError, match="not an argument of wandb.init"):
        WandbLoggerCallback(project="p", colour="red")


def test_the_trackers_are_imported_only_when_used():
    code = ("import sys, ftnb, ftnb.logger, ftnb.air.integrations.mlflow, "
            "ftnb.air.integrations.wandb\n"
            "from ftnb.logger import MLflowLoggerCallback, WandbLoggerCallback\n"
            "assert ftnb.MLflowLoggerCallback is MLflowLoggerCallback\n"
            "MLflowLoggerCallback(); WandbLoggerCallback(project='p')\n"
            "print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- a SIGKILLed driver ------------------------------------------------------------------------
DRIVER = """
import os, sys, ftnb
from test_tune_api_callbacks import _counting

store, which = sys.argv[2], sys.argv[3]
if which == "mlflow":
    from ftnb.air.integrations.mlflow import MLflowLoggerCallback
    callback = MLflowLoggerCallback(tracking_uri="file://" + store, experiment_name="killed")
else:
    from ftnb.air.integrations.wandb import WandbLoggerCallback
    callback = WandbLoggerCallback(project="killed")
print("PID", os.getpid(), flush=True)
ftnb.run(_counting, name="killed", storage_path=sys.argv[1],
         param_space={"n": 16, "sleep": 0.2},
         run_config=ftnb.RunConfig(verbose=0, executor="inprocess", callbacks=[callback]))
print("DONE")
"""


def _logged(trial_dir, store: str, which: str) -> list[tuple[int, float]]:
    """The (iteration, score) points the trial's run holds so far."""
    try:
        record = json.loads((trial_dir / f"{which}_run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    if which == "mlflow":
        return _points(store, record["run_id"], "score")
    return _wandb_points(os.environ["WANDB_DIR"], record["run_id"], "score")


@pytest.mark.parametrize("which", ["mlflow", "wandb"])
def test_a_sigkilled_driver_continues_the_same_run_with_each_iteration_once(
        tmp_path, tracking_env, which):
    exp, store = tmp_path / "killed", str(tmp_path / "mlruns")
    args = [str(tmp_path), store, which]

    def logging_between_checkpoints():
        # Killed between checkpoints (at 3, 6, ...), once the run is logged to: the iterations
        # after the last checkpoint are done again, and the rows the dead driver had not logged
        # are logged by the next one. MLflow's store has 7 points or more by then; W&B's
        # offline file holds what its service wrote before it went with the driver (it
        # buffers: often nothing), and its folder says the run started.
        trial_dir = trial_with_reports(exp, (7, 8, 10, 11, 13, 14))
        if trial_dir is None or not (trial_dir / f"{which}_run.json").exists():
            return False
        if which == "mlflow":
            return len(_logged(trial_dir, store, which)) >= 7
        record = json.loads((trial_dir / "wandb_run.json").read_text())
        return bool(_wandb_pieces(os.environ["WANDB_DIR"], record["run_id"]))

    kill_when(tmp_path, DRIVER, args, logging_between_checkpoints, "the run logged to")
    killed = STARTED[-1].pid
    (trial_dir,) = _trial_dirs(exp)
    before = _logged(trial_dir, store, which)
    assert before == [(i, float(i)) for i in range(1, len(before) + 1)] and len(before) < 16
    if which == "wandb":  # the killed driver's wandb-core service goes with it
        wait_for(lambda: not _wandb_services(killed), timeout=30,
                 what="the killed driver's wandb-core service to exit")
    assert "DONE" in run_to_end(tmp_path, DRIVER, args)
    rows = result_rows(str(trial_dir))
    assert len({r["attempt"] for r in rows}) == 2  # it did go back to its checkpoint
    expected = [(i, float(i)) for i in range(1, 17)]
    if which == "mlflow":
        (run,) = _mlflow_runs(store, "killed")  # the same run continued
        assert run.info.status == "FINISHED"
        assert _points(store, run.info.run_id, "score") == expected
        assert _points(store, run.info.run_id, "nested/half") == [
            (i, i / 2) for i in range(1, 17)]
    else:
        record = json.loads((trial_dir / "wandb_run.json").read_text())
        assert record["ended"] is True
        wandb_dir = str(tmp_path)  # WANDB_DIR
        assert len(_wandb_pieces(wandb_dir, record["run_id"])) == 2  # one per driver, one id
        assert _wandb_points(wandb_dir, record["run_id"], "score") == expected
