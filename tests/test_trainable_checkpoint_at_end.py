"""``CheckpointConfig(checkpoint_at_end=True)`` for a class trainable ended by a stopper (issue
18): as in Ray Tune, which saves a checkpoint at every STOP decision, the trial's last report
carries its final checkpoint, whether the stopper decided in the trial (a
``MaximumIterationStopper``, a ``TrialPlateauStopper``) or in the driver (any ``Stopper``
subclass), and an in-trial stopper still sees each result once."""

from __future__ import annotations

import time

import pytest

import ftnb
from ftnb.stopper import MaximumIterationStopper, TrialPlateauStopper
from ftnb.trainable_class import _saved


class Counter(ftnb.Trainable):
    """Counts its iterations (``loss`` stays at config["loss"]); saves the count as a dict."""

    def setup(self, config):
        self.count = 0

    def step(self):
        self.count += 1
        time.sleep(self.config.get("sleep", 0.0))
        return {"count": self.count, "loss": self.config.get("loss", 1.0)}

    def save_checkpoint(self, checkpoint_dir):
        return {"count": self.count}

    def load_checkpoint(self, checkpoint):
        self.count = checkpoint["count"]


class StopAtThree(ftnb.Stopper):
    """A driver-side stopper (a Stopper subclass): stop a trial once it reported iteration 3."""

    def __call__(self, trial_id, result):
        return result["training_iteration"] >= 3

    def stop_all(self):
        return False


def _rows(tmp_path, name, stop, at_end=True, **config):
    (result,) = ftnb.Tuner(
        Counter, param_space=config,
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name=name, verbose=0, executor="inprocess", stop=stop,
            checkpoint_config=ftnb.CheckpointConfig(checkpoint_at_end=at_end)),
    ).fit()
    assert result.error is None
    rows = result.metrics_dataframe.to_dict("records")
    iterations = [int(r["training_iteration"]) for r in rows]
    checkpointed = [int(r["training_iteration"]) for r in rows
                    if isinstance(r.get("checkpoint_dir_name"), str)]
    return iterations, checkpointed, result


@pytest.mark.parametrize("stop, last", [
    (MaximumIterationStopper(max_iter=4), 4),
    # The loss never moves: a plateau after 3 results (exactly 3: the stopper sees each once).
    (TrialPlateauStopper(metric="loss", num_results=3, grace_period=3), 3),
])
def test_an_in_trial_stopper_ends_the_trial_with_its_final_checkpoint(tmp_path, stop, last):
    iterations, checkpointed, result = _rows(tmp_path, "in_trial", stop)
    assert iterations == list(range(1, last + 1))
    assert checkpointed == [last]  # the report that met the stopper carries the checkpoint
    with result.checkpoint.as_directory() as folder:
        assert _saved(folder) == {"count": last}  # what save_checkpoint returned at the end


def test_a_driver_side_stopper_ends_the_trial_with_its_final_checkpoint(tmp_path):
    # The driver decides after iteration 3; the trial ends at its next report, with the
    # checkpoint (the step takes long enough for the stop request to arrive during it).
    iterations, checkpointed, _ = _rows(tmp_path, "driver", StopAtThree(), sleep=0.3)
    assert iterations[-1] in (3, 4) and iterations == list(range(1, iterations[-1] + 1))
    assert checkpointed == [iterations[-1]]


def test_no_final_checkpoint_unless_asked(tmp_path):
    iterations, checkpointed, _ = _rows(tmp_path, "not_asked", MaximumIterationStopper(3),
                                        at_end=False)
    assert iterations == [1, 2, 3] and checkpointed == []


def test_a_class_trial_a_scheduler_stops_has_its_final_checkpoint_on_its_last_row(tmp_path):
    """ASHA decides at its rungs (1, 3 with grace_period=1, reduction_factor=3, max_t=9): the
    worse trials end at a rung, and with checkpoint_at_end their last row carries a checkpoint
    (Ray saves one at every STOP); a trial that continues gets one at each rung it passed."""
    grid = ftnb.Tuner(
        Counter, param_space={"loss": ftnb.grid_search([1.0, 2.0, 3.0, 4.0])},
        tune_config=ftnb.TuneConfig(
            max_concurrent_trials=1,
            scheduler=ftnb.ASHAScheduler(metric="loss", mode="min", max_t=9, grace_period=1,
                                         reduction_factor=3)),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="asha", verbose=0, executor="inprocess",
            checkpoint_config=ftnb.CheckpointConfig(checkpoint_at_end=True)),
    ).fit()
    stopped = 0
    for result in grid:
        rows = result.metrics_dataframe.to_dict("records")
        last = int(rows[-1]["training_iteration"])
        checkpointed = [int(r["training_iteration"]) for r in rows
                        if isinstance(r.get("checkpoint_dir_name"), str)]
        assert checkpointed and checkpointed[-1] == last, (result.config, checkpointed, last)
        assert _saved(result.checkpoint.path) == {"count": last}
        stopped += last < 9
    assert stopped >= 2  # the scheduler ended some trials early, each with its checkpoint


class CountingStopAtThree(ftnb.Stopper):
    """StopAtThree that appends each training_iteration it is shown to a file."""

    def __init__(self, path):
        self.path = path

    def __call__(self, trial_id, result):
        with open(self.path, "a") as f:
            f.write(f"{result['training_iteration']}\n")
        return result["training_iteration"] >= 3

    def stop_all(self):
        return False


def test_a_driver_side_stopper_sees_each_row_once_when_asked_before_the_report(tmp_path):
    # The trial asks before each report whether the stopper ends it there (so that the report
    # carries the final checkpoint): the stopper decides on that preview, and the persisted row
    # is not shown to it again.
    seen = tmp_path / "seen.txt"
    iterations, checkpointed, result = _rows(tmp_path, "once", CountingStopAtThree(str(seen)))
    assert iterations == [1, 2, 3] and checkpointed == [3]
    assert seen.read_text().split() == ["1", "2", "3"]
    with result.checkpoint.as_directory() as folder:
        assert _saved(folder) == {"count": 3}
