"""Any metric value (issue 31, item 9), as Ray Tune takes it: a reported value that is not JSON
(Ellipsis, an object, an array, a function) never fails the trial; the driver's callbacks and
the Result get it as Ray's do (the object itself when it pickles, else its text); result.json
keeps its text form (an array as its list); ranking uses the numbers of the ranked metric only,
and a ranked metric reported as text is a clear error."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import ftnb
from ftnb.core.records import encode_metrics
from ftnb.storage import json_line


class Model:
    """A picklable object a trainable reports."""

    def __init__(self, size):
        self.size = size

    def __eq__(self, other):
        return isinstance(other, Model) and other.size == self.size

    def __str__(self):
        return f"Model({self.size})"


def test_values_that_are_not_json_are_kept_and_written_as_text():
    row = encode_metrics({"e": ..., "m": Model(3), "f": lambda: 1, "a": np.arange(3),
                          "nested": {"x": ...}, "n": np.float32(0.5)})
    assert row["e"] is Ellipsis and row["m"] == Model(3) and row["n"] == 0.5
    assert isinstance(row["f"], str) and row["f"].startswith("<function")  # it cannot travel
    written = json.loads(json_line(row))
    assert written["e"] == "Ellipsis" and written["m"] == "Model(3)"
    assert written["a"] == [0, 1, 2] and written["nested"] == {"x": "Ellipsis"}


def _reports_anything(config):
    import numpy

    for step in range(3):
        ftnb.report({"score": config["score"] + step, "extra": ..., "model": Model(step),
                     "weights": numpy.ones(2) * step, "note": f"step {step}",
                     "fn": lambda: step})


class Seen(ftnb.Callback):
    def __init__(self):
        self.results = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.results.append(result)


def test_a_ray_script_reporting_any_value_runs_and_ranks_by_numbers(tmp_path):
    seen = Seen()
    results = ftnb.Tuner(
        _reports_anything, param_space={"score": ftnb.grid_search([1, 5])},
        tune_config=ftnb.TuneConfig(metric="score", mode="max"),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="any", verbose=2,
                                  callbacks=[seen]),
    ).fit()
    assert not results.errors
    assert len(seen.results) == 6
    last = [r for r in seen.results if r["training_iteration"] == 3][0]
    assert last["extra"] is Ellipsis and last["model"] == Model(2)
    assert list(last["weights"]) == [2.0, 2.0] and last["fn"].startswith("<function")
    best = results.get_best_result()
    assert best.config["score"] == 5
    assert best.metrics["extra"] is Ellipsis and best.metrics["model"] == Model(2)
    with open(os.path.join(best.path, "result.json")) as f:
        rows = [json.loads(line) for line in f]
    assert rows[-1]["extra"] == "Ellipsis" and rows[-1]["weights"] == [2.0, 2.0]
    assert rows[-1]["model"] == "Model(2)"
    again = ftnb.ResultGrid.from_path(str(tmp_path / "any"))  # read back: the text forms
    assert again.get_best_result("score", "max").metrics["extra"] == "Ellipsis"
    with pytest.raises(ValueError, match=r"get_best_result\('note'\).*as text \('step 2'\)"):
        results.get_best_result("note", "max")


def _text_metric(config):
    ftnb.report({"acc": "high"})


def _usage_error(tmp_path, trainable, name, **tune):
    """Run ``trainable`` in one trial; its one error, a usage error; and the results."""
    results = ftnb.Tuner(
        trainable, tune_config=ftnb.TuneConfig(**tune),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=name, verbose=0),
    ).fit()
    (error,) = results.errors
    assert error.kind == "usage"
    return error.message, results


def test_a_ranked_metric_reported_as_text_is_a_clear_error(tmp_path):
    message, _ = _usage_error(tmp_path, _text_metric, "text", metric="acc", mode="max")
    assert "TuneConfig(metric='acc') ranks the trials" in message
    assert "'high'" in message and "Fix" in message


def _text_later(config):
    ftnb.report({"acc": 0.5, "note": "fine"})
    ftnb.report({"acc": "high", "note": "any value"})
    ftnb.report({"acc": 0.9})


def test_a_ranked_metric_reported_as_text_later_is_the_same_clear_error(tmp_path):
    message, results = _usage_error(tmp_path, _text_later, "later", metric="acc", mode="max")
    assert "TuneConfig(metric='acc') ranks the trials" in message
    assert "'high'" in message and "Fix: report a number" in message
    (result,) = results
    assert result.metrics["training_iteration"] == 2  # it ended at the text report, persisted


def test_a_metric_only_a_scheduler_ranks_by_is_checked_too(tmp_path):
    from ftnb.schedulers import ASHAScheduler

    message, _ = _usage_error(tmp_path, _text_metric, "sched",
                              scheduler=ASHAScheduler(metric="acc", mode="max"))
    assert "ASHAScheduler(metric='acc') ranks the trials" in message
    assert "'high'" in message
