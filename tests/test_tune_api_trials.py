"""Ray Tune's trial-level options (issue 18), used as Ray's docs show, on real trials in their
own processes: FailureConfig(fail_fast="raise"), TuneConfig(trial_name_creator=...,
trial_dirname_creator=...) kept across a retry, and Checkpoint metadata persisted with the
checkpoint and there again when a retried attempt restores it."""

from __future__ import annotations

import os
import tempfile

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths


def _fails_on_first_attempt(config):
    """Reports its name and a checkpoint with metadata, then raises on its first attempt; the
    retry reports the metadata of the checkpoint it resumed from."""
    context = ftnb.get_context()
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        ftnb.report({"name": context.get_trial_name(), "restored": checkpoint.get_metadata()})
        return
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "weights"), "w") as f:
            f.write("w")
        ckpt = ftnb.Checkpoint.from_directory(d)
        ckpt.set_metadata({"epoch": 1, "lr": config["lr"]})
        ckpt.update_metadata({"epoch": 2})
        ftnb.report({"name": context.get_trial_name()}, checkpoint=ckpt)
    if config.get("fail", True):
        raise ValueError(f"boom {config['lr']}")


def test_trial_names_folders_and_checkpoint_metadata_survive_a_retry(tmp_path):
    results = ftnb.Tuner(
        _fails_on_first_attempt,
        param_space={"lr": ftnb.grid_search([0.1, 0.2])},
        tune_config=ftnb.TuneConfig(
            trial_name_creator=lambda trial: f"lr{trial.config['lr']}_{trial.trial_id}",
            trial_dirname_creator=lambda trial: f"dir_{trial.experiment_tag}"),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="named", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    assert not results.errors
    exp = tmp_path / "named"
    assert sorted(p.name for p in exp.iterdir() if p.name.startswith("dir_")) == [
        "dir_0_lr=0.1", "dir_1_lr=0.2"]
    for result in results:
        lr = result.config["lr"]
        assert result.metrics["name"] == f"lr{lr}_{result.trial_id}"  # the retry's context
        assert result.metrics["restored"] == {"epoch": 2, "lr": lr}
        assert len(result.metrics_dataframe) == 2
        (checkpoint, _), = result.best_checkpoints
        assert checkpoint.get_metadata() == {"epoch": 2, "lr": lr}
    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert sorted(t.name for t in state.trials) == sorted(
        f"lr{t.config['lr']}_{t.trial_id}" for t in state.trials)
    assert all(len(t.attempts) == 2 for t in state.trials)


def test_fail_fast_raise_raises_the_trials_error(tmp_path):
    tuner = ftnb.Tuner(
        _fails_on_first_attempt,
        param_space={"lr": 0.5},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="raise", verbose=0,
                                  failure_config=ftnb.FailureConfig(fail_fast="raise")),
    )
    with pytest.raises(ValueError, match="boom 0.5") as caught:
        tuner.fit()
    assert isinstance(caught.value, ftnb.TrialError)
    assert caught.value.type == "ValueError"


def test_bad_trial_creators_are_refused_before_the_experiment_is_written(tmp_path):
    with pytest.raises(TypeError, match="trial_name_creator"):
        ftnb.TuneConfig(trial_name_creator="name")
    with pytest.raises(TypeError, match="fail_fast"):
        ftnb.FailureConfig(fail_fast="yes")
    tuner = ftnb.Tuner(
        _fails_on_first_attempt,
        param_space={"lr": ftnb.grid_search([0.1, 0.2])},
        tune_config=ftnb.TuneConfig(trial_dirname_creator=lambda trial: "same"),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="bad", verbose=0),
    )
    with pytest.raises(ValueError, match="'same' for both trial"):
        tuner.fit()
    assert not (tmp_path / "bad" / "experiment_state.json").exists()
    with pytest.raises(TypeError, match="needs a dict"):
        ftnb.Checkpoint.from_directory(str(tmp_path)).set_metadata(["not", "a", "dict"])
