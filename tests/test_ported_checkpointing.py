"""Ray's SHOULD_CHECKPOINT and MyTrainableClass (issue 31, item 5), as Ray's own example
(tune/examples/custom_checkpointing_with_callback.py) uses them, on real trial processes: a
``Callback.on_trial_result`` that sets ``result[SHOULD_CHECKPOINT] = True`` makes the class
Trainable checkpoint with exactly that result (the callback sees each result once); a
``step()`` that returns it does too; a driver SIGKILLed after such a checkpoint resumes from it
with every iteration once. ``ftnb.utils.mock_trainable.MyTrainableClass`` runs as Ray's."""

from __future__ import annotations

import json
import math
import os

from killed_driver import killed_then_rerun, trial_with_reports
from scripted import result_rows

import ftnb
from ftnb.result import SHOULD_CHECKPOINT
from ftnb.utils.mock_trainable import MOCK_ERROR_KEY, MyTrainableClass


class EveryThird(ftnb.Callback):
    """Ray's SmartCheckpointCallback, reduced: a checkpoint at every third iteration."""

    def __init__(self):
        self.seen = []
        self.checkpoints = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.seen.append(result["training_iteration"])
        if result["training_iteration"] % 3 == 0:
            result[SHOULD_CHECKPOINT] = True

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self.checkpoints.append(trial.last_result["training_iteration"])


class Optimization(ftnb.Trainable):
    """Ray's OptimizationTrainable: its state is its step; checkpoints are JSON files."""

    def setup(self, config):
        self.current_step = 0
        self.sleep = config.get("sleep", 0)

    def step(self):
        import time

        time.sleep(self.sleep)
        self.current_step += 1
        result = {"mean_loss": 1 / self.current_step, "step": self.current_step}
        if self.current_step in self.config.get("ask_at", ()):
            result[SHOULD_CHECKPOINT] = True
        return result

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "checkpoint.json"), "w") as f:
            json.dump({"step": self.current_step}, f)

    def load_checkpoint(self, checkpoint):
        with open(os.path.join(checkpoint, "checkpoint.json")) as f:
            self.current_step = json.load(f)["step"]


def _checkpointed(result):
    rows = result.metrics_dataframe
    if "checkpoint_dir_name" not in rows:
        return []
    return list(rows["training_iteration"][rows["checkpoint_dir_name"].notna()])


def _steps_in(result, dir_name):
    path = os.path.join(result.path, dir_name, "checkpoint.json")
    with open(path) as f:
        return json.load(f)["step"]


def test_a_callback_that_sets_should_checkpoint_checkpoints_that_result(tmp_path):
    callback = EveryThird()
    results = ftnb.Tuner(
        Optimization, param_space={"width": ftnb.randint(10, 100)},
        tune_config=ftnb.TuneConfig(metric="mean_loss", mode="min", num_samples=2),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="smart", verbose=0, callbacks=[callback],
            stop={"training_iteration": 7},
            checkpoint_config=ftnb.CheckpointConfig(checkpoint_frequency=0)),
    ).fit()
    assert not results.errors
    for result in results:
        assert _checkpointed(result) == [3, 6]
        assert list(result.metrics_dataframe["training_iteration"]) == list(range(1, 8))
        rows = result_rows(result.path)
        assert _steps_in(result, rows[5]["checkpoint_dir_name"]) == 6  # the state after step 6
    assert sorted(callback.seen) == sorted(list(range(1, 8)) * 2)  # each result once
    assert sorted(callback.checkpoints) == [3, 3, 6, 6]
    assert results.get_best_result().checkpoint is not None


def test_a_step_that_returns_should_checkpoint_checkpoints_that_result(tmp_path):
    results = ftnb.Tuner(
        Optimization, param_space={"ask_at": [2, 5]},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="asked", verbose=0,
                                  stop={"training_iteration": 6}),
    ).fit()
    (result,) = results
    assert _checkpointed(result) == [2, 5]
    assert SHOULD_CHECKPOINT not in result.metrics_dataframe


DRIVER = """
import sys, ftnb
from test_ported_checkpointing import EveryThird, Optimization

ftnb.run(Optimization, name="killed", storage_path=sys.argv[1],
         param_space={"sleep": 0.05},
         run_config=ftnb.RunConfig(verbose=0, callbacks=[EveryThird()],
                                   stop={"training_iteration": 20}))
print("DONE")
"""


def test_a_sigkilled_driver_resumes_from_the_checkpoint_a_callback_asked_for(tmp_path):
    exp = tmp_path / "killed"
    killed_then_rerun(tmp_path, DRIVER, [str(tmp_path)],
                      lambda: trial_with_reports(exp, range(8, 19)), "eight reports")
    (trial_dir,) = [d.parent for d in exp.glob("*/result.json")]
    rows = result_rows(str(trial_dir))
    assert [r["training_iteration"] for r in rows] == list(range(1, 21))
    assert [r["step"] for r in rows] == list(range(1, 21))  # resumed from step 6 or later
    assert len({r["attempt"] for r in rows}) == 2
    assert [r["training_iteration"] for r in rows if r.get("checkpoint_dir_name")] == \
        [3, 6, 9, 12, 15, 18]


def test_my_trainable_class_runs_as_in_ray(tmp_path):
    results = ftnb.Tuner(
        MyTrainableClass,
        param_space={"width": ftnb.grid_search([10, 20]), "height": 50, MOCK_ERROR_KEY: True},
        tune_config=ftnb.TuneConfig(metric="episode_reward_mean", mode="max"),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="mock", verbose=0,
            stop={"training_iteration": 4},
            failure_config=ftnb.FailureConfig(max_failures=1),
            checkpoint_config=ftnb.CheckpointConfig(checkpoint_frequency=1)),
    ).fit()
    assert not results.errors  # it failed once on purpose, then ran on from its checkpoint
    for result in results:
        rows = result.metrics_dataframe
        assert list(rows["training_iteration"]) == [1, 2, 3, 4]
        assert list(rows["attempt"]) == [1, 2, 2, 2]
        expected = [50 * math.tanh(t / result.config["width"]) for t in (1, 2, 3, 4)]
        assert list(rows["episode_reward_mean"]) == expected
    assert results.get_best_result().config["width"] == 10
