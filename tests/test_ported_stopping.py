"""Exact stopping (issue 31, item 6), as Ray's custom-stopper scripts use it, on real trial
processes: a Stopper subclass deciding in the driver ends a trial at exactly the result that
met it (every report waits for its decision; before, a trial stopped at iteration 8 ran on),
with or without a scheduler, also after a driver SIGKILL and a re-run; ``stop_all`` ends the
others; a stop function is exact too (it decides in the trial);
``FailureConfig(fail_fast=True)`` kills the other running trials at once."""

from __future__ import annotations

import pytest
from killed_driver import killed_then_rerun, trial_with_reports
from scripted import result_rows

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.schedulers import ASHAScheduler
from ftnb.storage import ExperimentPaths
from ftnb.stopper import CombinedStopper, MaximumIterationStopper, TimeoutStopper, \
    decides_in_driver


class StopAt(ftnb.Stopper):
    """Stops each trial at its config's ``stop_at`` iteration (read from the result), in the
    driver; counts what it saw."""

    def __init__(self):
        self.seen = 0

    def __call__(self, trial_id, result):
        self.seen += 1
        return result["training_iteration"] >= result["stop_at"]

    def stop_all(self):
        return False


class CustomStopper(ftnb.Stopper):
    """Ray's doc example: once one trial reaches the accuracy, stop it and every other."""

    def __init__(self):
        self.should_stop = False

    def __call__(self, trial_id, result):
        if not self.should_stop and result["mean_accuracy"] >= 0.5:
            self.should_stop = True
        return self.should_stop

    def stop_all(self):
        return self.should_stop


def fast(config):
    """Reports as fast as it can, with a checkpoint every fifth iteration."""
    import json
    import os
    import tempfile
    import time

    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "step.json")) as f:
                start = json.load(f)["step"]
    for step in range(start + 1, 400):
        time.sleep(config.get("sleep", 0))
        metrics = {"mean_accuracy": step * config.get("rate", 0.0),
                   "stop_at": config.get("stop_at", 10**6)}
        if step % 5 == 0:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
                ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(folder))
        else:
            ftnb.report(metrics)


def _iterations(result):
    return list(result.metrics_dataframe["training_iteration"])


@pytest.mark.parametrize("stopper, expected", [
    (StopAt(), True),
    (MaximumIterationStopper(3), False),
    (TimeoutStopper(60), False),
    (CombinedStopper(TimeoutStopper(60), StopAt()), True),
    (CombinedStopper(TimeoutStopper(60), MaximumIterationStopper(3)), False),
])
def test_which_stoppers_decide_in_the_driver(stopper, expected):
    assert decides_in_driver(stopper) is expected


@pytest.mark.parametrize("scheduler", [None, "asha"])
def test_a_driver_side_stopper_ends_each_trial_at_that_result(tmp_path, scheduler):
    stopper = StopAt()
    results = ftnb.Tuner(
        fast, param_space={"stop_at": ftnb.grid_search([8, 13])},
        tune_config=ftnb.TuneConfig(
            metric="mean_accuracy", mode="max",
            scheduler=ASHAScheduler(max_t=1000, grace_period=500) if scheduler else None),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="exact", verbose=0,
                                  stop=stopper),
    ).fit()
    assert not results.errors
    assert sorted(_iterations(r) for r in results) == [list(range(1, 9)), list(range(1, 14))]
    assert stopper.seen == 8 + 13  # each result once, none after its trial stopped
    state = ExperimentState.load(ExperimentPaths.at(str(tmp_path / "exact")))
    assert {t.note for t in state.trials} == {"stopped by StopAt"}


def test_rays_custom_stopper_example(tmp_path):
    results = ftnb.Tuner(
        fast, param_space={"rate": ftnb.grid_search([0.1, 0.001]), "sleep": 0.01},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="custom", verbose=0,
                                  stop=CustomStopper()),
    ).fit()
    by_rate = {r.config["rate"]: r for r in results}
    assert _iterations(by_rate[0.1]) == [1, 2, 3, 4, 5]  # 0.5 reached at 5: it ends there
    assert len(_iterations(by_rate[0.001])) < 399  # stop_all ended the other one


def _stop_at_seven(trial_id, result):
    return result["training_iteration"] >= 7


def test_a_stop_function_is_exact(tmp_path):
    results = ftnb.Tuner(
        fast, run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="fn", verbose=0,
                                        stop=_stop_at_seven)).fit()
    assert _iterations(results[0]) == list(range(1, 8))


DRIVER = """
import sys, ftnb
from test_ported_stopping import StopAt, fast

ftnb.run(fast, name="killed", storage_path=sys.argv[1],
         param_space={"stop_at": ftnb.grid_search([30, 40]), "sleep": 0.03},
         run_config=ftnb.RunConfig(verbose=0, stop=StopAt()))
print("DONE")
"""


def test_a_sigkilled_driver_re_run_stops_each_trial_exactly(tmp_path):
    exp = tmp_path / "killed"
    killed_then_rerun(tmp_path, DRIVER, [str(tmp_path)],
                      lambda: trial_with_reports(exp, range(12, 29)), "twelve reports")
    lengths = sorted([r["training_iteration"] for r in result_rows(str(p.parent))]
                     for p in exp.glob("*/result.json"))
    assert lengths == [list(range(1, 31)), list(range(1, 41))]


def failing_or_steady(config):
    import time

    for step in range(1, 400):
        time.sleep(config["sleep"])
        if config["fail_at"] == step:
            raise RuntimeError("failing on purpose")
        ftnb.report({"step": step})


def test_fail_fast_kills_the_other_running_trials_at_once(tmp_path):
    results = ftnb.Tuner(
        failing_or_steady,
        param_space={"fail_at": ftnb.grid_search([5, 0]), "sleep": 0.05},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="ff", verbose=0,
                                  failure_config=ftnb.FailureConfig(fail_fast=True)),
    ).fit()
    state = ExperimentState.load(ExperimentPaths.at(str(tmp_path / "ff")))
    by_fail = {t.config["fail_at"]: t for t in state.trials}
    assert by_fail[5].status == "ERRORED"
    other = by_fail[0]
    assert other.status == "PAUSED"  # resumable, as a clean stop leaves it
    assert other.attempts[-1].outcome == "interrupted"  # killed, not ended at a report
    failed_at = by_fail[5].failures[-1].time
    rows = result_rows(str(tmp_path / "ff" / other.dir_name))
    # Nothing recorded after the failure was known, beyond a report already in flight.
    assert sum(r["timestamp"] > failed_at for r in rows) <= 1
    assert len(results) == 2
