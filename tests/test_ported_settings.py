"""Settings a Ray Tune script passes (issue 31, item 2), run as Ray's scripts run them on real
trial processes: ``TuneConfig(reuse_actors=...)`` is accepted; ``RunConfig(stop={"done": True,
...})`` and boolean thresholds; ``done`` is Ray's reserved "this trial is finished" key: a
function trainable that reports it, or a class Trainable whose ``step()`` returns it, ends
TERMINATED at that result (not STOPPED), with a scheduler or without."""

from __future__ import annotations

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.schedulers import ASHAScheduler
from ftnb.schedulers.stop_criterion import is_done, threshold_met
from ftnb.storage import ExperimentPaths
from ftnb.ui.view import shown_status


@pytest.mark.parametrize("row, stop, expected", [
    ({"done": True}, None, True),
    ({"done": False, "training_iteration": 5}, None, False),
    ({"done": True}, {"done": True}, True),
    ({"converged": True}, {"converged": True}, True),
    ({"converged": False}, {"converged": True}, False),
    ({"acc": 0.95}, {"acc": 0.9, "done": True}, True),
    ({"acc": "high"}, {"acc": 0.9}, False),  # not a number: never meets a threshold
    ({"outer": {"acc": 1}}, {"outer/acc": 1}, True),
    ({"done": "yes"}, None, False),  # only a bool or a number says done
])
def test_thresholds_and_done_as_ray_judges_them(row, stop, expected):
    assert threshold_met(row, stop) is expected


def test_done_is_a_bool_or_a_number():
    assert is_done({"done": 1}) and not is_done({"done": 0}) and not is_done({})


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_reuse_actors_must_be_a_bool(value):
    with pytest.raises(TypeError, match=r"reuse_actors=.*True or False"):
        ftnb.TuneConfig(reuse_actors=value)


def test_reuse_actors_is_accepted():
    assert ftnb.TuneConfig(reuse_actors=True).reuse_actors is True
    assert ftnb.TuneConfig(reuse_actors=None).reuse_actors is None


def test_a_threshold_that_is_not_a_number_or_bool_is_named():
    with pytest.raises(TypeError, match=r"'acc': 'high'.*numbers or booleans"):
        ftnb.RunConfig(stop={"acc": "high"})


def _reports_done(config):
    for step in range(1, 50):
        ftnb.report({"mean_accuracy": step / 10, "converged": step >= config["converge_at"],
                     "done": step == config["done_at"]})


class _Steps(ftnb.Trainable):
    def setup(self, config):
        self.at = 0
        self.done_at = config["done_at"]

    def step(self):
        self.at += 1
        return {"mean_accuracy": self.at / 10, "done": self.at >= self.done_at}


def _rows(result):
    return list(result.metrics_dataframe["training_iteration"])


def _statuses(path):
    state = ExperimentState.load(ExperimentPaths.at(str(path)))
    return sorted(shown_status(t) for t in state.trials)


@pytest.mark.parametrize("scheduler", [None, "asha"])
def test_a_ray_script_with_done_and_boolean_thresholds(tmp_path, scheduler):
    cases = [{"done_at": 3, "converge_at": 40}, {"done_at": 40, "converge_at": 4},
             {"done_at": 40, "converge_at": 40}]
    results = ftnb.Tuner(
        _reports_done,
        param_space={"case": ftnb.grid_search(cases), "done_at": ftnb.sample_from(
            lambda spec: spec.config["case"]["done_at"]), "converge_at": ftnb.sample_from(
            lambda spec: spec.config["case"]["converge_at"])},
        tune_config=ftnb.TuneConfig(reuse_actors=True, metric="mean_accuracy", mode="max",
                                    scheduler=ASHAScheduler(max_t=100, grace_period=50)
                                    if scheduler else None),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="done", verbose=0,
                                  stop={"done": True, "converged": True,
                                        "mean_accuracy": 2.5}),
    ).fit()
    assert not results.errors
    by_case = {(r.config["done_at"], r.config["converge_at"]): _rows(r) for r in results}
    assert by_case == {(3, 40): [1, 2, 3], (40, 4): [1, 2, 3, 4], (40, 40): list(range(1, 26))}
    assert _statuses(tmp_path / "done") == ["TERMINATED"] * 3
    done = next(r for r in results if r.config["done_at"] == 3)
    assert done.metrics["done"] is True


def test_a_class_trainable_whose_step_returns_done_is_terminated(tmp_path):
    results = ftnb.Tuner(
        _Steps, param_space={"done_at": ftnb.grid_search([2, 5])},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="steps", verbose=0,
                                  stop={"done": True}),
    ).fit()
    assert sorted(_rows(r)[-1] for r in results) == [2, 5]
    assert _statuses(tmp_path / "steps") == ["TERMINATED"] * 2
