"""``ResultGrid`` and ``Result`` as Ray Tune's tests use them (issue 18): get_dataframe's
filter_metric/filter_mode, get_best_result's scopes, its error (a RuntimeError too), one trial
without a metric, and Result.filesystem / get_best_checkpoint / from_path."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

import ftnb
from ftnb.result import NoBestResultError, Result, TrialNotFoundError

NAN = float("nan")

# Twelve reports each. The best trial by each scope (mode="max"): last -> B (4), all -> A (50),
# avg -> A (50/12), last-10-avg -> C (3), last-5-avg -> D (4.7).
SERIES = {
    "A": [50] + [0] * 11,
    "B": [0] * 10 + [4, 4],
    "C": [0, 0] + [3] * 10,
    "D": [0] * 7 + [5, 5, 5, 5, 3.5],
}


def _series(config):
    """Reports config["case"]["values"] as ``score`` (and ``nested/acc`` = -score), with a
    checkpoint holding the step at every report when config["case"]["ckpt"]."""
    import os
    import tempfile

    config = config["case"]
    for step, value in enumerate(config["values"], start=1):
        metrics = {"score": value, "nested": {"acc": -value}}
        if not config.get("ckpt"):
            ftnb.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step.json"), "w") as f:
                json.dump(step, f)
            ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))


def _fit(tmp_path, name, series, metric=None, mode=None, ckpt=()):
    space = [{"name": k, "values": v, "ckpt": k in ckpt} for k, v in series.items()]
    return ftnb.Tuner(
        _series,
        param_space={"case": ftnb.grid_search(space) if len(space) > 1 else space[0]},
        tune_config=ftnb.TuneConfig(metric=metric, mode=mode),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=name, verbose=0),
    ).fit()


def _name(result: Result) -> str:
    return result.config["case"]["name"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("series"), "series", SERIES, "score", "max", ckpt="D")


@pytest.mark.parametrize("scope, best", [
    ("last", "B"), ("all", "A"), ("avg", "A"), ("last-10-avg", "C"), ("last-5-avg", "D"),
])
def test_get_best_result_scopes(grid, scope, best):
    assert _name(grid.get_best_result(scope=scope)) == best
    assert _name(grid.get_best_result("nested/acc", "min", scope=scope)) == best


def test_get_best_result_scopes_with_min(grid):
    assert [_name(grid.get_best_result("score", "min", scope=s))
            for s in ("last", "all", "avg", "last-10-avg", "last-5-avg")] == [
        "A", "A", "B", "A", "A"]  # ties keep the first trial


def test_a_bad_scope_or_mode_names_the_choices(grid):
    with pytest.raises(ValueError, match=r"scope='last-3-avg'\): use one of 'last', 'all', "
                                         r"'avg', 'last-5-avg', 'last-10-avg'"):
        grid.get_best_result(scope="last-3-avg")
    with pytest.raises(ValueError, match=r"mode='maximum'\): use 'max'"):
        grid.get_best_result("score", "maximum")


def test_get_dataframe_filtered_by_a_metric_takes_each_trials_best_row(grid):
    last = grid.get_dataframe().set_index("config/case/name")
    assert last["score"].to_dict() == {"A": 0, "B": 4, "C": 3, "D": 3.5}
    assert (last["training_iteration"] == 12).all()

    best = grid.get_dataframe(filter_metric="score", filter_mode="max").set_index("config/case/name")
    assert best["score"].to_dict() == {"A": 50, "B": 4, "C": 3, "D": 5}
    # The first of equal rows, as pandas' idxmax (Ray Tune's choice).
    assert best["training_iteration"].to_dict() == {"A": 1, "B": 11, "C": 3, "D": 8}
    assert list(best.columns) == list(last.columns)  # same columns: trial_id, status, logdir...

    lowest = grid.get_dataframe(filter_metric="score", filter_mode="min").set_index("config/case/name")
    assert lowest["training_iteration"].to_dict() == {"A": 2, "B": 1, "C": 1, "D": 1}
    nested = grid.get_dataframe(filter_metric="nested/acc", filter_mode="min")
    assert nested.set_index("config/case/name")["score"].to_dict() == best["score"].to_dict()
    # A metric no trial reported: each trial's last row; a metric alone: the last rows too.
    assert grid.get_dataframe(filter_metric="nope", filter_mode="max").equals(grid.get_dataframe())
    assert grid.get_dataframe(filter_metric="score").equals(grid.get_dataframe())


def test_get_dataframe_filter_mode_needs_a_metric_and_a_known_mode(grid):
    with pytest.raises(ValueError, match=r"get_dataframe\(filter_mode='max'\) needs filter_metric"):
        grid.get_dataframe(filter_mode="max")
    with pytest.raises(ValueError, match=r"get_dataframe\(mode='best'\): use 'max'"):
        grid.get_dataframe(filter_metric="score", filter_mode="best")


def test_no_best_result_is_a_runtime_error_too(tmp_path):
    grid = _fit(tmp_path, "nan", {"X": [NAN, NAN], "Y": [1.0, NAN]}, "score", "max")
    try:
        grid.get_best_result()
    except RuntimeError as err:  # Ray Tune's type, as ported scripts catch it
        assert isinstance(err, ValueError) and isinstance(err, NoBestResultError)
        assert str(err).startswith(
            "get_best_result('score'): every trial's last value of 'score' is NaN, so no trial "
            "can be ranked by it (did the training diverge?).")
    else:
        pytest.fail("no error")
    with pytest.raises(NoBestResultError, match=r"every trial's mean of 'score' is NaN"):
        grid.get_best_result(scope="avg")  # one NaN makes a mean NaN
    with pytest.raises(NoBestResultError, match=r"mean of its last 5 values of 'score' is NaN"):
        grid.get_best_result(scope="last-5-avg")
    assert _name(grid.get_best_result(scope="all")) == "Y"
    assert _name(grid.get_best_result("nested/acc", "max", scope="all")) == "Y"
    with pytest.raises(NoBestResultError, match=r"No trial reported a usable value of 'nope'"):
        grid.get_best_result("nope")
    several = _fit(tmp_path, "no_metric", {"X": [1], "Y": [2]})
    with pytest.raises(ValueError, match=r"needs a metric and a mode.*metric=None, mode=None"):
        several.get_best_result()


def test_one_trial_is_the_best_without_a_metric(tmp_path):
    grid = _fit(tmp_path, "one", {"X": [NAN]})
    assert grid.get_best_result() is grid[0]
    assert grid.get_best_result("score", "max", scope="avg") is grid[0]  # even NaN, as Ray


def test_result_filesystem_opens_its_path(grid):
    result = grid[0]
    with result.filesystem.open(f"{result.path}/result.json") as f:
        assert len(f.read().splitlines()) == 12


def test_get_best_checkpoint_by_the_metric_reported_with_each(grid):
    result = next(r for r in grid if _name(r) == "D")
    assert len(result.best_checkpoints) == 12

    def step(checkpoint):
        with checkpoint.as_directory() as d:
            return json.loads(Path(d, "step.json").read_text())

    assert step(result.get_best_checkpoint("score", "max")) == 11  # of equal ones, the latest
    assert step(result.get_best_checkpoint("score", "min")) == 7
    assert step(result.get_best_checkpoint("nested/acc", "min")) == 11
    with pytest.raises(RuntimeError, match=r"no kept checkpoint .* has a number for 'nope'.*"
                                           r"'nested/acc', 'score'"):
        result.get_best_checkpoint("nope", "max")
    with pytest.raises(ValueError, match=r"mode='best'\): use 'max'"):
        result.get_best_checkpoint("score", "best")
    without = next(r for r in grid if _name(r) == "A")
    with pytest.raises(RuntimeError, match=r"kept no checkpoint"):
        without.get_best_checkpoint("score", "max")


def test_result_from_path_reads_one_trial(grid, tmp_path):
    original = next(r for r in grid if _name(r) == "D")
    for path in (original.path, tmp_path / "copied"):
        if path != original.path:  # a trial folder copied out of its experiment
            shutil.copytree(original.path, path)
        result = Result.from_path(path)
        assert (result.trial_id, result.status, result.config) == (
            original.trial_id, original.status, original.config)
        assert result.metrics == original.metrics
        assert result.metrics_dataframe.equals(original.metrics_dataframe)
        assert len(result.best_checkpoints) == 12
        assert result.get_best_checkpoint("score", "max").path.endswith("checkpoint_000010")
    with pytest.raises(RuntimeError, match=r"no ftnb trial there") as err:
        Result.from_path(tmp_path / "missing")
    assert isinstance(err.value, (FileNotFoundError, TrialNotFoundError))
    assert math.isclose(Result.from_path(original.path).metrics["score"], 3.5)
