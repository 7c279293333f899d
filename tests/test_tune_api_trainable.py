"""The class API (issue 18): ``ftnb.Trainable`` with setup/step/save_checkpoint/load_checkpoint/
cleanup and ``CheckpointConfig(checkpoint_frequency, checkpoint_at_end)``, used as Ray Tune's
docs show, on real trials in their own processes: checkpoints where asked, a failed attempt
resumed in a new process from the latest checkpoint through load_checkpoint."""

from __future__ import annotations

import os
import time

import pytest
from killed_driver import kill_when, run_to_end, trial_with_reports
from scripted import result_rows

import ftnb


class Counter(ftnb.Trainable):
    """Counts up by config["step"]; fails once at iteration config["fail_at"] on its first
    attempt; saves its count as a dict; cleanup leaves a file per attempt in config["marks"]."""

    def setup(self, config):
        self.count = 0
        self.marks = config["marks"]

    def step(self):
        if (self.iteration + 1 == self.config.get("fail_at")
                and ftnb.get_context().attempt == 1):
            raise RuntimeError("step failed")
        self.count += self.config["step"]
        time.sleep(self.config.get("sleep", 0.0))
        return {"count": self.count, "done": self.iteration + 1 >= self.config.get("n", 10**6)}

    def save_checkpoint(self, checkpoint_dir):
        return {"count": self.count}

    def load_checkpoint(self, checkpoint):
        self.count = checkpoint["count"]

    def cleanup(self):
        name = f"{self.trial_id}_{ftnb.get_context().attempt}"
        open(os.path.join(self.marks, name), "w").close()


class FolderCounter(Counter):
    """The same, saving its count as a file in the checkpoint's folder."""

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "count"), "w") as f:
            f.write(str(self.count))

    def load_checkpoint(self, checkpoint):
        with open(os.path.join(checkpoint, "count")) as f:
            self.count = int(f.read())


def _fit(tmp_path, name, trainable, config, **checkpointing):
    marks = tmp_path / f"{name}_marks"
    marks.mkdir()
    return ftnb.Tuner(
        trainable,
        param_space={"step": 1, "marks": str(marks), **config},
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name=name, verbose=0, stop={"training_iteration": 5},
            failure_config=ftnb.FailureConfig(max_failures=1),
            checkpoint_config=ftnb.CheckpointConfig(**checkpointing)),
    ).fit(), marks


@pytest.mark.parametrize("trainable", [Counter, FolderCounter])
def test_a_failed_step_resumes_from_the_latest_checkpoint(tmp_path, trainable):
    results, marks = _fit(tmp_path, "resume", trainable, {"fail_at": 4},
                          checkpoint_frequency=2, checkpoint_at_end=True)
    (result,) = results
    assert not results.errors
    rows = result.metrics_dataframe
    assert list(rows["training_iteration"]) == [1, 2, 3, 4, 5]  # 3 redone, once in the log
    assert list(rows["count"]) == [1, 2, 3, 4, 5]  # the count came back from iteration 2
    assert list(rows["attempt"]) == [1, 1, 2, 2, 2]
    checkpointed = rows["checkpoint_dir_name"].notna()
    assert list(rows["training_iteration"][checkpointed]) == [2, 4, 5]  # every 2, and the end
    assert sorted(os.listdir(marks)) == [f"{result.trial_id}_1", f"{result.trial_id}_2"]


def test_done_ends_the_trial_and_no_checkpoint_unless_asked(tmp_path):
    results, _ = _fit(tmp_path, "done", Counter, {"n": 3})
    rows = results[0].metrics_dataframe
    assert list(rows["training_iteration"]) == [1, 2, 3]
    assert "checkpoint_dir_name" not in rows or rows["checkpoint_dir_name"].isna().all()
    assert Counter({"marks": str(tmp_path)}).reset_config({"step": 2}) is False


def test_checkpoint_frequency_is_refused_for_a_function_trainable(tmp_path):
    def train(config):
        pass

    with pytest.raises(ValueError, match="class trainable"):
        ftnb.Tuner(train, run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), checkpoint_config=ftnb.CheckpointConfig(
                checkpoint_frequency=2)))


CLASS_DRIVER = """
import sys, ftnb
from test_tune_api_trainable import Counter

ftnb.run(Counter, name="killed", storage_path=sys.argv[1],
         param_space={"step": 1, "marks": sys.argv[2], "n": 25, "sleep": 0.05},
         run_config=ftnb.RunConfig(verbose=0, checkpoint_config=ftnb.CheckpointConfig(
             checkpoint_frequency=3)))
print("DONE")
"""


def test_a_sigkilled_driver_resumes_a_class_trainable_through_load_checkpoint(tmp_path):
    exp, marks = tmp_path / "killed", tmp_path / "marks"
    marks.mkdir()
    args = [str(tmp_path), str(marks)]
    kill_when(tmp_path, CLASS_DRIVER, args, lambda: trial_with_reports(exp, range(7, 25)),
              "seven reports")
    assert "DONE" in run_to_end(tmp_path, CLASS_DRIVER, args)
    (trial_dir,) = [d.parent for d in exp.glob("*/result.json")]
    rows = result_rows(str(trial_dir))
    assert [r["training_iteration"] for r in rows] == list(range(1, 26))
    assert [r["count"] for r in rows] == list(range(1, 26))
    assert len({r["attempt"] for r in rows}) == 2
