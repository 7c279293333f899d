"""Nested metrics as Ray Tune's tests use them (issue 18): results are flattened with ``/``, so
``stop={"test/test1/test2": 6}`` and ``checkpoint_score_attribute="nested/sub/attr"`` name a
value reported as nested dicts. Real trials in their own processes."""

from __future__ import annotations

import json
import os
import tempfile

import ftnb
from ftnb.config import metric_value


def _nested(config):
    for step, value in enumerate(config["values"], start=1):
        metrics = {"test": {"test1": {"test2": step}}, "nested": {"sub": {"attr": value}}}
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step.json"), "w") as f:
                json.dump(step, f)
            ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))


def _fit(tmp_path, name, values, stop=None, checkpoint_config=None):
    return ftnb.Tuner(
        _nested,
        param_space={"values": values},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=name, stop=stop, verbose=0,
                                  checkpoint_config=checkpoint_config),
    ).fit()


def _step(checkpoint) -> int:
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, "step.json")) as f:
            return json.load(f)


def test_metric_value_reads_flattened_names():
    row = {"a": {"b": {"c": 3}}, "x/y": 1, "e": {}}
    assert metric_value(row, "a/b/c") == 3
    assert metric_value(row, "x/y") == 1
    assert metric_value(row, "a/b") is None  # as in Ray: only leaves are metrics
    assert metric_value(row, "a/zz", "missing") == "missing"


def test_nested_stop_and_checkpoint_score(tmp_path):
    values = [5, 1, 4, 2, 3, 9, 9]
    results = _fit(
        tmp_path, "nested", values,
        stop={"test/test1/test2": 5},
        checkpoint_config=ftnb.CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="nested/sub/attr"),
    )
    result = results[0]
    assert result.error is None
    rows = result.metrics_dataframe
    assert list(rows["test/test1/test2"]) == [1, 2, 3, 4, 5]  # stopped at the report reaching 5
    assert result.metrics["test"]["test1"]["test2"] == 5
    # Kept: the latest (step 5, score 3) and the best of the others (step 1, score 5).
    kept = [(_step(c), m["nested"]["sub"]["attr"]) for c, m in result.best_checkpoints]
    assert kept == [(1, 5), (5, 3)]
    assert _step(result.get_best_checkpoint("nested/sub/attr", "max")) == 1


def test_nested_stop_naming_an_unreported_metric_lists_the_flattened_ones(tmp_path):
    results = _fit(tmp_path, "unknown", [1, 2], stop={"test/test1/nope": 1})
    message = results.errors[0].message
    assert "'test/test1/nope'" in message
    assert "test/test1/test2" in message and "nested/sub/attr" in message


def test_checkpoint_score_attribute_not_reported_lists_the_flattened_metrics(tmp_path):
    results = _fit(tmp_path, "unknown_score", [1, 2], checkpoint_config=ftnb.CheckpointConfig(
        checkpoint_score_attribute="nested/sub/missing"))
    message = results.errors[0].message
    assert "'nested/sub/missing'" in message and "nested/sub/attr" in message
