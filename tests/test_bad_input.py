"""Bad input: a clear error naming the argument, the value and the fix, before any trial starts,
and never a half-written experiment directory."""

from __future__ import annotations

import os

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths


def _ok(config):
    ftnb.report({"x": 1})


def _run(tmp_path, trainable=_ok, **kw):
    run = kw.pop("run", {})
    return ftnb.Tuner(
        trainable,
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="bad", verbose=0, **run),
        **kw,
    ).fit()


def assert_nothing_written(tmp_path):
    assert not (tmp_path / "bad").exists()


def test_trainable_not_callable(tmp_path):
    with pytest.raises(TypeError, match=r"Tuner\(trainable=\.\.\.\) must be a function.*got int: 3"):
        ftnb.Tuner(3)
    with pytest.raises(TypeError, match="not `train\\(\\)`"):
        ftnb.Tuner(None)


@pytest.mark.parametrize("call, words", [
    (lambda: ftnb.Tuner(_ok, {"x": 1}),
     ["Tuner(trainable, {'x': 1}) was given {'x': 1} by position",
      "Fix: Tuner(trainable, param_space={'x': 1})"]),
    (lambda: ftnb.Tuner(_ok, ftnb.RunConfig(name="n")),
     ["Fix: Tuner(trainable, run_config=RunConfig(...))"]),
    (lambda: ftnb.Tuner(_ok, "lr"),
     ["Tuner(trainable, <keyword>='lr')", "one of param_space, tune_config, run_config"]),
    (lambda: ftnb.run(_ok, {"x": 1}), ["Fix: ftnb.run(trainable, param_space={'x': 1})"]),
    (lambda: ftnb.launch(_ok, {"x": 1}), ["Fix: ftnb.launch(trainable, param_space={'x': 1})"]),
    (lambda: ftnb.Tuner.restore("/nowhere", _ok, {"x": 1}),
     ["Tuner.restore takes only path and trainable by position",
      "Fix: Tuner.restore(path, trainable, param_space={'x': 1})"]),
])
def test_keyword_arguments_given_by_position_name_their_keyword(call, words):
    with pytest.raises(TypeError) as raised:
        call()
    for word in words:
        assert word in str(raised.value)
    assert "positional argument" not in str(raised.value)


@pytest.mark.parametrize("value", [-2, -10])
def test_max_failures_below_minus_one(value):
    with pytest.raises(ValueError, match=rf"max_failures={value}.*-1 for unlimited"):
        ftnb.FailureConfig(max_failures=value)


def test_max_failures_wrong_type():
    with pytest.raises(TypeError, match="max_failures"):
        ftnb.FailureConfig(max_failures=1.5)


@pytest.mark.parametrize("value", [0, -2])
def test_num_samples_below_one(value):
    # (-1 is Ray's "sample until time_budget_s or a stopper ends it": tests/test_searchers.py)
    with pytest.raises(ValueError, match=rf"num_samples={value}.*>= 1.*or -1 to sample until"):
        ftnb.TuneConfig(num_samples=value)


@pytest.mark.parametrize("space", [[1, 2], "lr=0.1", 3])
def test_param_space_not_a_dict(tmp_path, space):
    with pytest.raises(TypeError, match="param_space must be a dict"):
        ftnb.Tuner(_ok, param_space=space)


def test_stop_not_dict_or_callable():
    with pytest.raises(TypeError, match=r"RunConfig\(stop=\.\.\.\).*training_iteration"):
        ftnb.RunConfig(stop=[10])
    with pytest.raises(TypeError, match="thresholds must be numbers"):
        ftnb.RunConfig(stop={"loss": "low"})


def test_names_too_long_for_a_file_name_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError) as raised:
        ftnb.Tuner(_ok, run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="n" * 300))
    for words in ["RunConfig(name='nnnnnnnnnnnnnnnnnnnn'...) is too long (300 characters)",
                  "a file name can have at most 255 bytes", "up to 232 letters",
                  "Fix: a shorter name, such as 'nnnn"]:
        assert words in str(raised.value)
    ftnb.RunConfig(name="n" * 232)  # the longest that fits
    with pytest.raises(ValueError, match="is too long"):
        ftnb.RunConfig(name="n" * 233)
    with pytest.raises(ValueError, match="Fix: a shorter name, such as 'ééé"):
        ftnb.RunConfig(name="é" * 40)  # each is percent-quoted in the listing index: 6 bytes
    with pytest.raises(ValueError, match=r"RunConfig\(storage_path=\.\.\.\) has a folder name "
                                         r"300 bytes long.*no file or folder name can be longer "
                                         r"than 255 bytes"):
        ftnb.run(_ok, name="fits", storage_path=str(tmp_path / ("d" * 300) / "runs"))
    with pytest.raises(ValueError, match="is too long"):
        ftnb.launch(_ok, name="n" * 300, storage_path=str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    # The longest name runs, its listing entry written.
    ftnb.Tuner(_ok, run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="n" * 232,
                                              verbose=0, executor="inprocess")).fit()
    assert (tmp_path / ".ftnb-index" / ("n" * 232 + ".json")).exists()


def test_other_config_errors():
    with pytest.raises(ValueError, match="checkpoint_score_order"):
        ftnb.CheckpointConfig(checkpoint_score_order="best")
    with pytest.raises(ValueError, match="num_to_keep"):
        ftnb.CheckpointConfig(num_to_keep=0)
    with pytest.raises(ValueError, match="mode"):
        ftnb.TuneConfig(mode="maximize")
    with pytest.raises(ValueError, match="single folder name"):
        ftnb.RunConfig(name="a/b")
    with pytest.raises(TypeError, match="failure_config"):
        ftnb.RunConfig(failure_config={"max_failures": 3})


def test_report_outside_a_trial():
    with pytest.raises(RuntimeError, match=r"ftnb.report\(\) was called outside a trial.*Tuner"):
        ftnb.report({"x": 1})
    with pytest.raises(RuntimeError, match="outside a trial"):
        ftnb.get_checkpoint()
    with pytest.raises(RuntimeError, match="outside a trial"):
        ftnb.get_context()


def _report_list(config):
    ftnb.report([1, 2])


def _report_reserved(config):
    ftnb.report({"training_iteration": 3})


def _return_a_value(config):
    return 0.25  # meant as the score, but nothing was reported


@pytest.mark.parametrize(
    "trainable,pattern",
    [
        (_report_list, r"report\(metrics=\.\.\.\) needs a dict.*got list"),
        (_report_reserved, r"'training_iteration', which ftnb fills in itself"),
        (_return_a_value, r"_return_a_value returned float 0\.25 and reported nothing.*"
                          r"Fix: ftnb\.report\(\{'score': value\}\)"),
    ],
)
def test_bad_report_is_a_usage_error_not_retried(tmp_path, trainable, pattern):
    results = _run(tmp_path, trainable, run={"failure_config": ftnb.FailureConfig(max_failures=3)})
    assert results.num_errors == 1
    error = results.errors[0]
    assert error.kind == "usage"
    assert __import__("re").search(pattern, error.message), error.message
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    assert len(state.trials[0].attempts) == 1


def _yield_a_value(config):
    yield 0.25  # Ray reports it as '_metric'; ftnb asks for a named metric


def test_a_yielded_value_that_is_not_a_dict_is_a_usage_error(tmp_path):
    results = _run(tmp_path, _yield_a_value)
    (error,) = results.errors
    assert error.kind == "usage"
    assert "_yield_a_value yielded float 0.25, not a dict of metrics" in error.message
    assert "Fix: yield a dict (yield {'score': value})" in error.message


def _yield_reports(config):
    for step in range(3):
        yield {"loss": 1.0 / (step + 1)}  # Ray's generator trainables: each yield is a report


def test_a_generator_trainable_reports_each_yielded_dict(tmp_path):
    results = _run(tmp_path, _yield_reports, tune_config=ftnb.TuneConfig(metric="loss", mode="min"))
    assert not results.errors
    (result,) = results
    assert result.metrics["training_iteration"] == 3
    assert result.metrics["loss"] == pytest.approx(1 / 3)


def _reports_then_returns(config):
    ftnb.report({"loss": 2.0})
    return 0.5


def test_a_value_returned_after_reports_is_a_warning_in_the_trial_output(tmp_path):
    results = _run(tmp_path, _reports_then_returns)
    assert not results.errors
    (result,) = results
    assert result.metrics["loss"] == 2.0 and result.metrics["training_iteration"] == 1
    with open(os.path.join(result.path, "stderr")) as f:
        said = f.read()
    assert ("ftnb: warning: _reports_then_returns returned float 0.5, not a dict of metrics, so "
            "it is not kept. Fix: return a dict (return {'score': value})") in said


def test_storage_path_not_writable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=r"storage_path=.*a_file/sub.*is not writable.*Fix"):
        ftnb.Tuner(
            _ok, run_config=ftnb.RunConfig(storage_path=str(blocker / "sub"), verbose=0)
        ).fit()


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_bad_storage_outage_limit(tmp_path, monkeypatch, value):
    monkeypatch.setenv("FTNB_STORAGE_OUTAGE_S", value)
    with pytest.raises(ValueError, match=rf"FTNB_STORAGE_OUTAGE_S='{value}' is not a number of "
                                         r"seconds >= 0\. Fix"):
        _run(tmp_path)
    assert_nothing_written(tmp_path)
    with pytest.raises(ValueError, match="FTNB_STORAGE_OUTAGE_S"):
        ftnb.Tuner.restore(str(tmp_path / "bad"), _ok)


def test_bad_storage_call_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_STORAGE_CALL_TIMEOUT_S", "0.5")
    with pytest.raises(ValueError, match=r"FTNB_STORAGE_CALL_TIMEOUT_S='0.5' is not a number of "
                                         r"seconds >= 1\. Fix"):
        _run(tmp_path)
    assert_nothing_written(tmp_path)


def test_resources_that_never_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_GPUS", "1")
    with pytest.raises(ValueError, match=r"can never be satisfied.*1 GPU"):
        _run(tmp_path, resources_per_trial={"gpu": 3})
    assert_nothing_written(tmp_path)
    with pytest.raises(ValueError, match="can never be satisfied"):
        _run(tmp_path, resources_per_trial={"cpu": 10_000})
    assert_nothing_written(tmp_path)
    with pytest.raises(ValueError, match="resources_per_trial"):
        ftnb.Tuner(_ok, resources_per_trial={"cpus": 1})


def test_unpicklable_trainable(tmp_path):
    import threading

    lock = threading.Lock()

    def train(config):
        with lock:
            ftnb.report({"x": 1})

    with pytest.raises(TypeError, match="cannot be sent to a trial process"):
        _run(tmp_path, train)
    assert_nothing_written(tmp_path)


def test_existing_experiment_is_not_mixed(tmp_path):
    # A finished one is set aside whole before the new run starts (an unfinished one is
    # refused: test_restore's test_fit_again_on_existing_experiment_points_to_restore).
    _run(tmp_path)
    before = sorted(os.listdir(tmp_path / "bad"))
    _run(tmp_path)
    (earlier,) = [p for p in os.listdir(tmp_path) if p.startswith("bad-")]
    assert sorted(os.listdir(tmp_path / earlier)) == before


def test_state_file_fallback_and_newer_version(tmp_path):
    results = _run(tmp_path)
    paths = ExperimentPaths.at(results.experiment_path)
    good = ExperimentState.load(paths)
    with open(paths.state, "w") as f:
        f.write('{"format": "ftnb.experiment", "trunc')  # a torn state file
    state = ExperimentState.load(paths)  # falls back to the previous generation
    assert [t.trial_id for t in state.trials] == [t.trial_id for t in good.trials]
    assert ftnb.ResultGrid.from_path(results.experiment_path)[0].metrics["x"] == 1
    import json

    newer = good.to_json()
    newer["format_version"] = 999
    with open(paths.state, "w") as f:
        json.dump(newer, f)
    from ftnb.core.records import StateFormatError

    with pytest.raises(StateFormatError, match="newer than this ftnb.*upgrade"):
        ExperimentState.load(paths)


# -- issue 12: bad input that was accepted without a word ----------------------------------------
def _folder_bytes(folder) -> dict:
    """Every file under ``folder`` and its bytes: equal snapshots mean nothing was written."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def _reports_loss(config):
    for step in range(3):
        ftnb.report({"loss": 1.0 / (step + 1), "val": {"acc": 0.5}})


def test_metric_not_reported_is_named_at_the_first_report(tmp_path):
    results = _run(tmp_path, _reports_loss, tune_config=ftnb.TuneConfig(metric="los", mode="min"),
                   run={"failure_config": ftnb.FailureConfig(max_failures=3)})
    error = results.errors[0]
    assert error.kind == "usage", error  # not retried: the next attempt would report the same
    assert error.message == (
        "TuneConfig(metric='los') is not a metric this trainable reports; its first report "
        "has: loss, val/acc (did you mean 'loss'?). Fix: run the experiment again (under a new "
        "name) with TuneConfig(metric=...) naming one of them, or report 'los' in every result "
        "(TUNE_DISABLE_STRICT_METRIC_CHECKING=1 accepts one that only later reports carry, as "
        "in Ray Tune)."
    )
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    assert len(state.trials[0].attempts) == 1
    # Stopped at its first report.
    assert [r["training_iteration"] for r in results[0].rows] == [1]


def test_reported_metric_passes_and_ray_switch_allows_a_late_one(tmp_path, monkeypatch):
    nested = _run(tmp_path, _reports_loss, tune_config=ftnb.TuneConfig(metric="val/acc",
                                                                        mode="max"))
    assert nested.num_errors == 0 and nested.num_terminated == 1
    monkeypatch.setenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    late = ftnb.Tuner(_reports_loss, tune_config=ftnb.TuneConfig(metric="los", mode="min"),
                      run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="late",
                                                verbose=0)).fit()
    assert late.num_errors == 0 and late.num_terminated == 1


def test_mode_without_metric_is_refused(tmp_path):
    with pytest.raises(ValueError) as err:
        _run(tmp_path, tune_config=ftnb.TuneConfig(mode="min"))
    assert str(err.value) == (
        "TuneConfig(mode='min') was given without a metric: mode says whether a higher or lower "
        "value of the metric is better. Fix: TuneConfig(metric='loss', mode='min'), naming a "
        "metric your trainable reports, or leave mode out."
    )
    assert_nothing_written(tmp_path)


def test_metric_without_mode_warns_once_where_it_is_written(tmp_path):
    with pytest.warns(UserWarning) as warned:
        config = ftnb.TuneConfig(metric="x")
    assert [str(w.message) for w in warned] == [
        "TuneConfig(metric='x') has no mode, so nothing can be ranked by it (get_best_result() "
        "will need mode=...). Fix: TuneConfig(metric='x', mode='min') (or 'max')."
    ]
    assert warned[0].filename == __file__  # the user's line, not ftnb's
    assert_nothing_written(tmp_path)
    results = _run(tmp_path, tune_config=config)  # accepted, as Ray Tune accepts it
    assert results.get_best_result() is results[0] or (
        results.get_best_result().trial_id == results[0].trial_id)  # one trial: Ray returns it
    assert results.get_best_result(mode="max").metrics["x"] == 1
    # Restoring rebuilds the stored TuneConfig without warning again.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ftnb.Tuner.restore(results.experiment_path, _ok)


def _other(config):
    ftnb.report({"x": 2})


def _fails(config):
    raise RuntimeError("boom")


def test_restore_with_another_trainable_is_refused(tmp_path):
    results = _run(tmp_path, _fails)  # ERRORED: resumable, so every resume path checks
    exp = results.experiment_path
    before = _folder_bytes(exp)
    expected = (
        f"Cannot resume {exp} with the trainable '_other': the experiment was run by '_fails', "
        "and resuming its trials with other code would mix two programs in one experiment. "
        "Fix: pass _fails again, or pass allow_different_trainable=True if _other is the same "
        "training under another name (a fixed version, say)."
    )
    for attempt in (
        lambda: ftnb.Tuner.restore(exp, _other),
        lambda: ftnb.run(_other, name="bad", storage_path=str(tmp_path)),
        lambda: ftnb.launch(_other, name="bad", storage_path=str(tmp_path), quiet=True),
    ):
        with pytest.raises(ftnb.RestoreError) as err:
            attempt()
        assert str(err.value) == expected
        assert (err.value.recorded, err.value.given) == ("_fails", "_other")
        assert _folder_bytes(exp) == before
    with pytest.raises(TypeError, match=r"allow_different_trainable='yes'\) must be True or"):
        ftnb.Tuner.restore(exp, _other, allow_different_trainable="yes")
    # Forced: the errored trial runs again with the new code.
    again = ftnb.run(_other, name="bad", storage_path=str(tmp_path),
                     run_config=ftnb.RunConfig(verbose=0), allow_different_trainable=True)
    assert again.num_errors == 0 and again[0].metrics["x"] == 2


def _diverges(config):
    ftnb.report({"loss": float("nan"), "acc": float("inf"),
                 "deep": {"a": float("-inf"), "hist": [1.0, float("nan")]}})
    ftnb.report({"loss": float("nan"), "acc": config["acc"]})


def _strict_json(line: bytes):
    import json

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(line, parse_constant=refuse)


def test_nan_and_infinite_metrics_keep_result_json_strict(tmp_path):
    import math

    import pandas as pd

    results = _run(tmp_path, _diverges, param_space={"acc": ftnb.grid_search([1.0, 2.0])},
                   tune_config=ftnb.TuneConfig(metric="loss", mode="min"))
    result = results[0]
    path = os.path.join(result.path, "result.json")
    with open(path, "rb") as f:
        lines = f.read().splitlines()
    first = _strict_json(lines[0])  # what jq, pandas and strict parsers see
    assert (first["loss"], first["acc"], first["deep"]) == (None, None,
                                                            {"a": None, "hist": [1.0, None]})
    assert [_strict_json(line)["loss"] for line in lines] == [None, None]
    frame = pd.read_json(path, lines=True)
    assert frame["loss"].isna().all()
    progress = pd.read_csv(os.path.join(result.path, "progress.csv"))
    assert progress["loss"].isna().all() and progress["acc"].tolist() == [math.inf, 1.0]
    assert progress["deep/a"].tolist()[0] == -math.inf
    # ftnb's own readers get every value back exactly.
    row = result.rows[0]
    assert math.isnan(row["loss"]) and row["acc"] == math.inf and row["deep"]["a"] == -math.inf
    assert row["deep"]["hist"][0] == 1.0 and math.isnan(row["deep"]["hist"][1])
    assert "__ftnb_nonfinite__" not in row
    with pytest.raises(ValueError) as err:
        results.get_best_result(scope="all")
    assert str(err.value).startswith(
        "get_best_result('loss'): every value of 'loss' is NaN, so no trial can be ranked by it")
    with pytest.raises(ValueError, match=r"every trial's last value of 'loss' is NaN.*Fix: "):
        results.get_best_result()
    assert results.get_best_result("acc", "max").metrics["acc"] == 2.0
    with pytest.raises(ValueError, match=r"'deep/a' has no finite value|reported"):
        results.get_best_result("deep/a", "max")


def test_result_rows_with_bare_nan_tokens_are_still_read(tmp_path):
    import math

    results = _run(tmp_path)
    trial = results[0]
    path = os.path.join(trial.path, "result.json")
    with open(path, "a") as f:  # what an older ftnb (and Ray) wrote
        f.write('{"x": NaN, "y": -Infinity, "training_iteration": 2}\n')
    rows = ftnb.ResultGrid.from_path(results.experiment_path)[0].rows
    assert math.isnan(rows[1]["x"]) and rows[1]["y"] == -math.inf


def test_result_log_rewrite_keeps_nonfinite_values(tmp_path):
    import math

    from ftnb.storage.result_log import ResultLog
    from ftnb.storage import Storage, TrialPaths

    paths = TrialPaths(Storage(str(tmp_path)), str(tmp_path))
    log = ResultLog(paths, existing=[])
    log.append({"loss": float("nan"), "training_iteration": 1})
    log.append({"loss": float("inf"), "training_iteration": 2})
    log.close()
    ResultLog(paths).rewrite(paths.read_results()[:1])  # what a restart from a checkpoint does
    rows = paths.read_results()
    assert len(rows) == 1 and math.isnan(rows[0]["loss"])


@pytest.mark.parametrize("mode", ["r", "rb"])
def test_read_mode_open_file_in_param_space_is_refused(tmp_path, mode):
    data = tmp_path / "data.txt"
    data.write_text("a,b\n")
    with open(data, mode) as f:
        for space, where in (({"f": f}, "f"), ({"f": ftnb.grid_search([f, None])},
                                                "f/grid_search[0]")):
            with pytest.raises(TypeError) as err:
                _run(tmp_path, param_space=space)
            assert str(err.value).startswith(
                f"param_space[{where!r}] holds a _io.")
            assert (f"open file ({str(data)!r}, mode {mode!r}) is a handle, not data; pass its "
                    "path instead" in str(err.value))
            assert "Fix: create it inside the trainable" in str(err.value)
            assert_nothing_written(tmp_path)
    # In-memory buffers are data, and still travel.
    import io

    results = _run(tmp_path, _reads_buffer, param_space={"buf": io.StringIO("kept")})
    assert results[0].metrics["text"] == "kept"


def _reads_buffer(config):
    ftnb.report({"text": config["buf"].getvalue()})


def _no_args():
    pass


def _two_args(config, data):
    pass


def _keyword_only(*, config):
    pass


@pytest.mark.parametrize("trainable,signature", [
    (_no_args, "() (too many positional arguments)"),
    (_two_args, "(config, data) (missing a required argument: 'data')"),
    (_keyword_only, "(*, config) (too many positional arguments)"),
])
def test_trainable_with_wrong_signature_is_refused_before_anything_runs(tmp_path, trainable,
                                                                          signature):
    name = trainable.__name__
    expected = (
        f"Tuner(trainable={name}) cannot be called as {name}(config), the way each trial calls "
        f"it with its config dict: its signature is {signature}. Fix: define it as "
        f"`def {name}(config): ...`; give it other inputs through param_space (or "
        "functools.partial)."
    )
    with pytest.raises(TypeError) as err:
        _run(tmp_path, trainable)
    assert str(err.value) == expected
    with pytest.raises(TypeError, match=rf"ftnb.launch\(trainable={name}\) cannot be called"):
        ftnb.launch(trainable, name="bad", storage_path=str(tmp_path))
    with pytest.raises(TypeError, match=rf"Tuner\(trainable={name}\) cannot be called"):
        ftnb.run(trainable, name="bad", storage_path=str(tmp_path))
    assert_nothing_written(tmp_path)


class _CallableTrainable:
    def __call__(self, config, extra=1):
        ftnb.report({"x": extra})


def test_trainables_that_can_take_a_config_are_accepted(tmp_path):
    import functools

    for trainable in (_CallableTrainable(), functools.partial(_two_args, data=1),
                      lambda *args: None, lambda config, **kw: None, print):
        ftnb.Tuner(trainable)
    assert _run(tmp_path, _CallableTrainable())[0].metrics["x"] == 1


def test_stop_function_with_wrong_signature_is_refused(tmp_path):
    with pytest.raises(TypeError) as err:
        _run(tmp_path, run={"stop": lambda result: True})
    assert str(err.value) == (
        "RunConfig(stop=<lambda>) cannot be called as <lambda>(trial_id, result): its "
        "signature is (result) (too many positional arguments). Fix: define it as "
        "`def stop(trial_id, result): ...`, returning True when the trial should stop."
    )
    assert_nothing_written(tmp_path)
    ftnb.RunConfig(stop=lambda trial_id, result, *rest: False)
    results = _run(tmp_path, _reports_loss, run={"stop": lambda *args: True})
    assert [r["training_iteration"] for r in results[0].rows] == [1]


def test_attach_of_an_unknown_name_says_where_it_looked_and_how_to_look_elsewhere(tmp_path):
    from ftnb.handle import ExperimentNotFoundError

    with pytest.raises(ExperimentNotFoundError) as info:
        ftnb.attach("nope", storage_path=str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"No ftnb experiment named 'nope' under {tmp_path} (")
    assert f"`ftnb ls {tmp_path}` lists them" in message
    assert "give the storage path it is under (storage_path=..., --storage)" in message
    # Not `%ftls`: in a notebook the magics may list another storage path than this one.
    assert "%ftls" not in message
