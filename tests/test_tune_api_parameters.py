"""``ftnb.with_parameters`` and ``ftnb.with_resources`` used as Ray Tune's docs show (issue 18),
on real trials in their own processes: the large object goes through ftnb.put once, never into
a config; a restore must give it again (the same script run again after a SIGKILLed driver does,
a restore without it is refused before anything runs); each trial gets the resources asked for,
by a dict or a function of its config, and ``get_context().get_trial_resources()`` says so."""

from __future__ import annotations

import pytest
from killed_driver import kill_when, run_to_end, trial_with_reports
from scripted import result_rows

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths


def train(config, data):
    """Reports the sum of ``data`` scaled by config["x"], with a checkpoint at each report;
    ``config["n"]`` reports ``config["sleep"]`` seconds apart, resuming after its checkpoint."""
    import os
    import tempfile
    import time

    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "step")) as f:
                start = int(f.read())
    for step in range(start + 1, config.get("n", 1) + 1):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            ftnb.report({"total": sum(data["values"]) * config["x"], "step": step},
                        checkpoint=ftnb.Checkpoint.from_directory(d))
        time.sleep(config.get("sleep", 0.0))


def _resources(config):
    """Reports what the trial was given."""
    ftnb.report({"given": ftnb.get_context().get_trial_resources(), "x": config["x"]})


def test_with_parameters_shares_the_object_and_keeps_it_out_of_configs(tmp_path):
    data = {"values": list(range(1000)), "tag": "x" * 10_000}
    results = ftnb.Tuner(
        ftnb.with_parameters(train, data=data),
        param_space={"x": ftnb.grid_search([1, 2])},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="params", verbose=0),
    ).fit()
    assert not results.errors
    assert sorted(r.metrics["total"] for r in results) == [499500, 999000]
    for result in results:
        params = (tmp_path / "params" / result.trial_id / "params.json").read_text()
        assert "tag" not in params and "xxxx" not in params
    state = ExperimentState.load(ExperimentPaths.at(str(tmp_path / "params")))
    assert state.trainable == "train" and state.settings["with_parameters"] == ["data"]


PARAMS_DRIVER = """
import sys, ftnb
from test_tune_api_parameters import train

data = {"values": [1, 2, 3]}
ftnb.run(ftnb.with_parameters(train, data=data), name="resume", storage_path=sys.argv[1],
         param_space={"x": 1, "n": 30, "sleep": 0.05},
         run_config=ftnb.RunConfig(verbose=0))
print("DONE")
"""


def test_a_sigkilled_driver_resumes_with_the_objects_given_again(tmp_path):
    exp = tmp_path / "resume"
    kill_when(tmp_path, PARAMS_DRIVER, [str(tmp_path)],
              lambda: trial_with_reports(exp, range(3, 30)), "three reports")
    with pytest.raises(TypeError, match="missing a required argument: 'data'"):
        ftnb.Tuner.restore(str(exp), train)  # the plain function cannot take the object

    def train_with_default(config, data=None):
        pass

    train_with_default.__name__ = "train"
    with pytest.raises(ftnb.RestoreError, match=r"with_parameters\(train, data=\.\.\.\)"):
        ftnb.Tuner.restore(str(exp), train_with_default)
    assert "DONE" in run_to_end(tmp_path, PARAMS_DRIVER, [str(tmp_path)])
    (trial_dir,) = [d.parent for d in exp.glob("*/result.json")]
    rows = result_rows(str(trial_dir))
    assert [r["training_iteration"] for r in rows] == list(range(1, 31))
    assert {r["total"] for r in rows} == {6}
    assert len({r["attempt"] for r in rows}) == 2


def test_with_resources_by_dict_and_by_function_of_the_config(tmp_path):
    fixed = ftnb.Tuner(
        ftnb.with_resources(_resources, {"cpu": 0.5}),
        param_space={"x": ftnb.grid_search([1, 2])},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="fixed", verbose=0),
    ).fit()
    assert [r.metrics["given"] for r in fixed] == [{"cpu": 0.5, "gpu": 0.0}] * 2
    by_config = ftnb.Tuner(
        ftnb.with_resources(_resources, lambda config: {"CPU": config["x"] / 4}),
        param_space={"x": ftnb.grid_search([1, 2])},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="by_config", verbose=0),
    ).fit()
    given = sorted((r.metrics["x"], r.metrics["given"]["cpu"]) for r in by_config)
    assert given == [(1, 0.25), (2, 0.5)]


def test_bad_wrappers_are_refused_naming_the_argument():
    def two(config, data):
        pass

    with pytest.raises(TypeError, match=r"with_parameters\(two, model\)"):
        ftnb.with_parameters(two, model=1)
    with pytest.raises(ValueError, match="tpu"):
        ftnb.with_resources(_resources, {"tpu": 1})
    with pytest.raises(ValueError, match="resources_per_trial"):
        ftnb.Tuner(ftnb.with_resources(_resources, {"cpu": 1}), resources_per_trial={"cpu": 2})
