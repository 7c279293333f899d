"""Bad input: a clear error naming the argument, the value and the fix, before any trial starts,
and never a half-written experiment directory."""

from __future__ import annotations

import os

import pytest

import ftnb
from ftnb.state import ExperimentState
from ftnb.storage import ExperimentPaths


def _ok(config):
    ftnb.report({"x": 1})


def _run(tmp_path, trainable=_ok, **kw):
    run = kw.pop("run", {})
    return ftnb.Tuner(
        trainable,
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="bad", verbose=0, **run),
        **kw,
    ).fit()


def assert_nothing_written(tmp_path):
    assert not (tmp_path / "bad").exists()


def test_trainable_not_callable(tmp_path):
    with pytest.raises(TypeError, match=r"Tuner\(trainable=\.\.\.\) must be a function.*got int: 3"):
        ftnb.Tuner(3)
    with pytest.raises(TypeError, match="not `train\\(\\)`"):
        ftnb.Tuner(None)


@pytest.mark.parametrize("value", [-2, -10])
def test_max_failures_below_minus_one(value):
    with pytest.raises(ValueError, match=rf"max_failures={value}.*-1 for unlimited"):
        ftnb.FailureConfig(max_failures=value)


def test_max_failures_wrong_type():
    with pytest.raises(TypeError, match="max_failures"):
        ftnb.FailureConfig(max_failures=1.5)


@pytest.mark.parametrize("value", [0, -1])
def test_num_samples_below_one(value):
    with pytest.raises(ValueError, match=rf"num_samples={value}.*>= 1"):
        ftnb.TuneConfig(num_samples=value)


@pytest.mark.parametrize("space", [[1, 2], "lr=0.1", 3])
def test_param_space_not_a_dict(tmp_path, space):
    with pytest.raises(TypeError, match="param_space must be a dict"):
        ftnb.Tuner(_ok, param_space=space)


def test_stop_not_dict_or_callable():
    with pytest.raises(TypeError, match=r"RunConfig\(stop=\.\.\.\).*training_iteration"):
        ftnb.RunConfig(stop=[10])
    with pytest.raises(TypeError, match="thresholds must be numbers"):
        ftnb.RunConfig(stop={"loss": "low"})


def test_other_config_errors():
    with pytest.raises(ValueError, match="checkpoint_score_order"):
        ftnb.CheckpointConfig(checkpoint_score_order="best")
    with pytest.raises(ValueError, match="num_to_keep"):
        ftnb.CheckpointConfig(num_to_keep=0)
    with pytest.raises(ValueError, match="mode"):
        ftnb.TuneConfig(mode="maximize")
    with pytest.raises(ValueError, match="single folder name"):
        ftnb.RunConfig(name="a/b")
    with pytest.raises(TypeError, match="failure_config"):
        ftnb.RunConfig(failure_config={"max_failures": 3})


def test_report_outside_a_trial():
    with pytest.raises(RuntimeError, match=r"ftnb.report\(\) was called outside a trial.*Tuner"):
        ftnb.report({"x": 1})
    with pytest.raises(RuntimeError, match="outside a trial"):
        ftnb.get_checkpoint()
    with pytest.raises(RuntimeError, match="outside a trial"):
        ftnb.get_context()


def _report_list(config):
    ftnb.report([1, 2])


def _report_object(config):
    ftnb.report({"model": object()})


def _report_reserved(config):
    ftnb.report({"training_iteration": 3})


@pytest.mark.parametrize(
    "trainable,pattern",
    [
        (_report_list, r"report\(metrics=\.\.\.\) needs a dict.*got list"),
        (_report_object, r"metric 'model' has a value of type object that cannot be written as JSON"),
        (_report_reserved, r"'training_iteration', which ftnb fills in itself"),
    ],
)
def test_bad_report_is_a_usage_error_not_retried(tmp_path, trainable, pattern):
    results = _run(tmp_path, trainable, run={"failure_config": ftnb.FailureConfig(max_failures=3)})
    assert results.num_errors == 1
    error = results.errors[0]
    assert error.kind == "usage"
    assert __import__("re").search(pattern, error.message), error.message
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    assert len(state.trials[0].attempts) == 1


def test_storage_path_not_writable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=r"storage_path=.*a_file/sub.*is not writable.*Fix"):
        ftnb.Tuner(
            _ok, run_config=ftnb.RunConfig(storage_path=str(blocker / "sub"), verbose=0)
        ).fit()


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_bad_storage_outage_limit(tmp_path, monkeypatch, value):
    monkeypatch.setenv("FTNB_STORAGE_OUTAGE_S", value)
    with pytest.raises(ValueError, match=rf"FTNB_STORAGE_OUTAGE_S='{value}' is not a number of "
                                         r"seconds >= 0\. Fix"):
        _run(tmp_path)
    assert_nothing_written(tmp_path)
    with pytest.raises(ValueError, match="FTNB_STORAGE_OUTAGE_S"):
        ftnb.Tuner.restore(str(tmp_path / "bad"), _ok)


def test_bad_storage_call_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_STORAGE_CALL_TIMEOUT_S", "0.5")
    with pytest.raises(ValueError, match=r"FTNB_STORAGE_CALL_TIMEOUT_S='0.5' is not a number of "
                                         r"seconds >= 1\. Fix"):
        _run(tmp_path)
    assert_nothing_written(tmp_path)


def test_resources_that_never_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_GPUS", "1")
    with pytest.raises(ValueError, match=r"can never be satisfied.*1 GPU"):
        _run(tmp_path, resources_per_trial={"gpu": 3})
    assert_nothing_written(tmp_path)
    with pytest.raises(ValueError, match="can never be satisfied"):
        _run(tmp_path, resources_per_trial={"cpu": 10_000})
    assert_nothing_written(tmp_path)
    with pytest.raises(ValueError, match="resources_per_trial"):
        ftnb.Tuner(_ok, resources_per_trial={"cpus": 1})


def test_unpicklable_trainable(tmp_path):
    import threading

    lock = threading.Lock()

    def train(config):
        with lock:
            ftnb.report({"x": 1})

    with pytest.raises(TypeError, match="cannot be sent to a trial process"):
        _run(tmp_path, train)
    assert_nothing_written(tmp_path)


def test_existing_experiment_is_not_mixed(tmp_path):
    _run(tmp_path)
    before = sorted(os.listdir(tmp_path / "bad"))
    with pytest.raises(ValueError, match="already exists.*would mix two experiments"):
        _run(tmp_path)
    assert sorted(os.listdir(tmp_path / "bad")) == before


def test_state_file_fallback_and_newer_version(tmp_path):
    results = _run(tmp_path)
    paths = ExperimentPaths.at(results.experiment_path)
    good = ExperimentState.load(paths)
    with open(paths.state, "w") as f:
        f.write('{"format": "ftnb.experiment", "trunc')  # a torn state file
    state = ExperimentState.load(paths)  # falls back to the previous generation
    assert [t.trial_id for t in state.trials] == [t.trial_id for t in good.trials]
    assert ftnb.ResultGrid.from_path(results.experiment_path)[0].metrics["x"] == 1
    import json

    newer = good.to_json()
    newer["format_version"] = 999
    with open(paths.state, "w") as f:
        json.dump(newer, f)
    from ftnb.state import StateFormatError

    with pytest.raises(StateFormatError, match="newer than this ftnb.*upgrade"):
        ExperimentState.load(paths)
