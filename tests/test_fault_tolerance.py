"""Trial-level fault tolerance with real processes and real signals."""

from __future__ import annotations

import json
import os

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths
from scripted import executed, scripted


def fit(tmp_path, param_space, *, max_failures=0, name="exp", **run_kw):
    failure = run_kw.pop("failure_config", None) or ftnb.FailureConfig(max_failures=max_failures)
    tune_kw = run_kw.pop("tune_kw", {})
    return ftnb.Tuner(
        scripted,
        param_space=param_space,
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2, **tune_kw),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name=name, verbose=0, failure_config=failure, **run_kw
        ),
    ).fit()


def load_state(results) -> ExperimentState:
    return ExperimentState.load(ExperimentPaths.at(results.experiment_path))


def iterations(result) -> list[int]:
    return [r["training_iteration"] for r in result.rows]


def test_sweep_survives_every_kind_of_crash(tmp_path):
    n = 8
    cases = [
        ("none", {}, 1),
        ("raise", {"1": [3, "raise"]}, 1),
        ("exit3", {"1": [5, "exit3"]}, 2),
        ("sigkill", {"1": [4, "sigkill"]}, 1),
        ("sigterm", {"1": [4, "sigterm"]}, 2),
        ("segfault", {"1": [2, "segfault"]}, 1),
        ("twice", {"1": [2, "raise"], "2": [6, "sigkill"]}, 3),
    ]
    space = {
        "case": ftnb.grid_search(
            [{"name": c, "faults": f, "ckpt_every": e, "n": n} for c, f, e in cases]
        )
    }

    def flatten_case(config):
        return config["case"]

    results = ftnb.Tuner(
        _case_trainable,
        param_space=space,
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="sweep", verbose=0,
            failure_config=ftnb.FailureConfig(max_failures=2),
        ),
    ).fit()
    state = load_state(results)
    assert results.num_errors == 0
    assert results.num_terminated == len(cases)
    for result, trial in zip(results, state.trials):
        case = flatten_case(result.config)
        name = case["name"]
        # Every trial ends with exactly the iterations asked, each reported once.
        assert iterations(result) == list(range(1, n + 1)), name
        kinds = [f.kind for f in trial.failures]
        expected = {
            "none": [],
            "raise": ["exception"],
            "exit3": ["exit"],
            "sigkill": ["signal"],
            "sigterm": ["preemption"],
            "segfault": ["signal"],
            "twice": ["exception", "signal"],
        }[name]
        assert kinds == expected, name
        if name == "exit3":
            assert trial.failures[0].exit_code == 3
        if name in ("sigkill", "twice"):
            assert trial.failures[-1].signal == "SIGKILL"
        if name == "segfault":
            assert trial.failures[0].signal == "SIGSEGV"
        if name == "raise":
            assert trial.failures[0].type == "ValueError"
            assert "injected failure at step 3" in trial.failures[0].traceback
            error_txt = open(os.path.join(result.path, "error.txt")).read()
            assert "ValueError: injected failure at step 3" in error_txt
        # Preemptions do not count against max_failures.
        assert trial.num_failures == len([k for k in expected if k != "preemption"])
        assert trial.num_preemptions == expected.count("preemption")
        assert len(trial.attempts) == len(expected) + 1
        # Each restart resumed from the latest checkpoint the failed attempt had persisted.
        for attempt in trial.attempts[1:]:
            first_row = next(r for r in result.rows if r["attempt"] == attempt.number)
            assert first_row["resumed_from"] == attempt.start_iteration
        # Work redone: only the iterations reported after the last checkpoint.
        every = case["ckpt_every"]
        done = executed(result.path)
        redone = len(done) - n
        assert redone == sum(f.lost_iterations for f in trial.failures), name
        for f in trial.failures:
            assert f.lost_iterations <= every - 1, name
        if name == "sigterm":
            # The preempted trial checkpointed on request, so nothing was redone at all.
            assert redone == 0
            assert trial.attempts[1].start_iteration == 4


def _case_trainable(config):
    scripted(config["case"])


def test_max_failures_exhausted_keeps_traceback(tmp_path):
    faults = {str(a): [2, "raise"] for a in range(1, 5)}
    results = fit(tmp_path, {"faults": faults, "n": 4}, max_failures=2)
    assert results.num_errors == 1
    error = results.errors[0]
    assert isinstance(error, ftnb.TrialError)
    assert error.type == "ValueError"
    assert "attempt 3" in error.message
    assert "Traceback" in error.traceback and "_fire" in error.traceback
    assert "more than FailureConfig(max_failures=2)" in error.reason
    trial = load_state(results).trials[0]
    assert trial.status == "ERRORED"
    assert len(trial.attempts) == 3
    error_txt = open(os.path.join(results[0].path, "error.txt")).read()
    assert error_txt.startswith("Attempt 3 failed")  # the last failure, in words
    assert "ValueError: injected failure at step 2 (attempt 3)" in error_txt


def test_unlimited_retries(tmp_path):
    # No checkpoints: each attempt starts over and fails one step later than the previous one.
    faults = {str(a): [a, "raise"] for a in range(1, 6)}
    results = fit(tmp_path, {"faults": faults, "n": 6, "ckpt_every": 0}, max_failures=-1)
    assert results.num_errors == 0
    trial = load_state(results).trials[0]
    assert len(trial.attempts) == 6
    assert trial.num_failures == 5
    assert iterations(results[0]) == [1, 2, 3, 4, 5, 6]


def test_repeated_error_stops_a_deterministic_bug(tmp_path):
    faults = {str(a): [3, "raise_same"] for a in range(1, 10)}
    results = fit(tmp_path, {"faults": faults, "n": 5}, max_failures=5)
    trial = load_state(results).trials[0]
    assert trial.status == "ERRORED"
    assert len(trial.attempts) == 2
    assert "same error happened twice" in results.errors[0].reason

    results = fit(
        tmp_path, {"faults": faults, "n": 5}, name="exp2",
        failure_config=ftnb.FailureConfig(max_failures=3, stop_on_repeated_error=False),
    )
    assert len(load_state(results).trials[0].attempts) == 4


def _out_of_memory(config):
    ctx = ftnb.get_context()
    ftnb.report({"step": 1})
    if config["error"] == "torch":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if ctx.attempt == 1 or config["error"] == "same":
        raise MemoryError  # no message, as Python raises it
    ftnb.report({"step": 2})


def test_out_of_memory_errors_are_recorded_as_oom(tmp_path):
    results = ftnb.Tuner(
        _out_of_memory,
        param_space={"error": ftnb.grid_search(["once", "same", "torch"])},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=3),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="oom", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=3)),
    ).fit()
    trials = {t.config["error"]: t for t in load_state(results).trials}
    once = trials["once"]
    assert once.status == "TERMINATED" and [f.kind for f in once.failures] == ["oom"]
    assert once.failures[0].summary() == "oom MemoryError (attempt 1, iter 1)"
    # A raised OOM at the same step with the same message is the repeated-error rule's case.
    same = trials["same"]
    assert same.status == "ERRORED" and len(same.attempts) == 2
    assert "same error happened twice" in same.error["reason"]
    cuda = trials["torch"].failures[0]
    assert (cuda.kind, cuda.type) == ("oom", "OutOfMemoryError")
    assert cuda.summary().startswith("oom OutOfMemoryError: CUDA out of memory.")


def test_preemption_is_not_a_failure_even_with_no_retries(tmp_path):
    results = fit(
        tmp_path, {"faults": {"1": [2, "sigterm"], "2": [4, "sigterm"]}, "n": 5, "ckpt_every": 0},
        max_failures=0,
    )
    trial = load_state(results).trials[0]
    assert trial.status == "TERMINATED"
    assert trial.num_failures == 0 and trial.num_preemptions == 2
    assert iterations(results[0]) == [1, 2, 3, 4, 5]
    # With ckpt_every=0 the only checkpoints are the ones asked for by should_checkpoint.
    assert [a.start_iteration for a in trial.attempts] == [0, 2, 4]


def test_fail_fast_stops_the_experiment_and_keeps_checkpoints(tmp_path):
    space = {
        "faults": ftnb.grid_search([{}, {"1": [1, "raise"]}, {}, {}]),
        "n": 200,
        "sleep": 0.02,
        # The first trial has reported thrice when the second fails (a loaded machine may start
        # it later than the second).
        "fault_after": [str(tmp_path / "exp" / "*_00000" / "result.json"), 3],
    }
    results = fit(
        tmp_path, space, failure_config=ftnb.FailureConfig(max_failures=0, fail_fast=True)
    )
    state = load_state(results)
    statuses = [t.status for t in state.trials]
    assert state.status == "ERRORED"
    assert statuses[1] == "ERRORED"
    assert statuses[0] == "PAUSED"  # it was running: stopped cleanly, resumable
    assert statuses[2:] == ["PENDING", "PENDING"]  # never started once fail_fast triggered
    paused = state.trials[0]
    assert 0 < paused.iteration < 200
    assert paused.latest_checkpoint is not None
    ckpt_dir = os.path.join(results[0].path, paused.latest_checkpoint["dir_name"])
    assert os.path.isfile(os.path.join(ckpt_dir, "state.json"))


def test_stop_dict_is_exact(tmp_path):
    results = fit(tmp_path, {"n": 50}, stop={"training_iteration": 7})
    assert iterations(results[0]) == list(range(1, 8))
    assert results[0].status == "TERMINATED"
    results = fit(tmp_path, {"n": 50}, stop={"score": 3}, name="by_metric")
    assert iterations(results[0]) == [1, 2, 3]


def _stop_at_four(trial_id, result):
    return result["training_iteration"] >= 4


def test_stop_callable(tmp_path):
    results = fit(tmp_path, {"n": 50}, stop=_stop_at_four)
    assert iterations(results[0]) == [1, 2, 3, 4]


def test_stop_with_unknown_metric_is_a_clear_error(tmp_path):
    results = fit(tmp_path, {"n": 5}, stop={"accuracy": 0.9}, max_failures=3)
    trial = load_state(results).trials[0]
    assert trial.status == "ERRORED"
    assert len(trial.attempts) == 1  # a usage error is never retried
    message = results.errors[0].message
    assert "'accuracy'" in message and "score" in message


def test_retention_oldest_first_keeps_latest(tmp_path):
    results = fit(tmp_path, {"n": 6}, checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2))
    names = sorted(n for n in os.listdir(results[0].path) if n.startswith("checkpoint_"))
    assert names == ["checkpoint_000004", "checkpoint_000005"]
    assert results[0].checkpoint.path.endswith("checkpoint_000005")


@pytest.mark.parametrize("order,kept", [("max", {5, 4}), ("min", {0, 5})])
def test_retention_by_score_never_deletes_latest(tmp_path, order, kept):
    config = ftnb.CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order=order
    )
    results = fit(tmp_path, {"n": 6}, checkpoint_config=config)
    names = {
        int(n.split("_")[1]) for n in os.listdir(results[0].path) if n.startswith("checkpoint_")
    }
    assert names == kept
    best = results[0].best_checkpoints
    assert len(best) == 2
    scores = [metrics["score"] for _, metrics in best]
    assert scores == sorted(scores, reverse=(order == "max"))


def test_checkpoint_score_attribute_never_reported(tmp_path):
    config = ftnb.CheckpointConfig(checkpoint_score_attribute="val_acc")
    results = fit(tmp_path, {"n": 3}, checkpoint_config=config, max_failures=2)
    assert results.num_errors == 1
    assert "val_acc" in results.errors[0].message
    assert len(load_state(results).trials[0].attempts) == 1


def test_result_files_and_dataframes(tmp_path):
    results = fit(
        tmp_path, {"slope": ftnb.grid_search([1.0, 2.0]), "n": 4},
        tune_kw={"metric": "score", "mode": "max"},
    )
    df = results.get_dataframe()
    assert len(df) == 2
    assert {"score", "training_iteration", "config/slope", "trial_id"} <= set(df.columns)
    assert sorted(df["score"]) == [4.0, 8.0]
    best = results.get_best_result()
    assert best.config["slope"] == 2.0
    assert results.get_best_result("score", "min").config["slope"] == 1.0
    mdf = best.metrics_dataframe
    assert list(mdf["training_iteration"]) == [1, 2, 3, 4]
    for key in ("time_total_s", "timestamp", "trial_id", "time_this_iter_s"):
        assert key in best.metrics
    # The per-trial files mirror Ray Tune's.
    trial_dir = best.path
    for name in ("params.json", "result.json", "progress.csv", "stdout", "stderr"):
        assert os.path.exists(os.path.join(trial_dir, name)), name
    assert json.load(open(os.path.join(trial_dir, "params.json")))["slope"] == 2.0
    import pandas as pd

    progress = pd.read_csv(os.path.join(trial_dir, "progress.csv"))
    assert list(progress["training_iteration"]) == [1, 2, 3, 4]
    # A torn last line (a process killed mid-write) is ignored by readers.
    with open(os.path.join(trial_dir, "result.json"), "a") as f:
        f.write('{"score": 99, "training_it')
    again = ftnb.ResultGrid.from_path(results.experiment_path)
    assert len(again[1].rows) == 4
    with best.checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "state.json")))["step"] == 4
    copy = best.checkpoint.to_directory(str(tmp_path / "copy"))
    assert json.load(open(os.path.join(copy, "state.json")))["step"] == 4


def test_nested_metrics_and_returned_dict(tmp_path):
    results = ftnb.Tuner(
        _nested, run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="n", verbose=0)
    ).fit()
    rows = results[0].rows
    assert rows[0]["val"] == {"loss": 0.5, "acc": 0.9}
    assert rows[-1]["final"] == 1  # a returned dict is the last result
    assert "val/loss" in results[0].metrics_dataframe.columns


def _nested(config):
    ftnb.report({"val": {"loss": 0.5, "acc": 0.9}})
    return {"final": 1}


def test_trial_output_reaches_caller_prefixed(tmp_path, capsys):
    ftnb.Tuner(
        _chatty, run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="c", verbose=1)
    ).fit()
    out = capsys.readouterr().out
    trial_id = load_state(ftnb.ResultGrid.from_path(str(tmp_path / "c"))).trials[0].trial_id
    assert f"({trial_id}) hello from the trial" in out
    assert "TERMINATED" in out  # the final status table
    assert open(tmp_path / "c" / trial_id / "stdout").read() == "hello from the trial\n"


def _chatty(config):
    print("hello from the trial")
    ftnb.report({"x": 1})


def test_experiment_files_are_readable_by_other_users(tmp_path):
    # Other users and the JupyterLab server read experiments: files follow the umask, as
    # open() does, rather than being owner-only.
    old = os.umask(0o022)
    try:
        results = fit(tmp_path, {"n": 2})
    finally:
        os.umask(old)
    trial_dir = results[0].path
    for path in (
        os.path.join(results.experiment_path, "experiment_state.json"),
        os.path.join(results.experiment_path, "experiment_state.prev.json"),
        os.path.join(trial_dir, "params.json"),
        os.path.join(trial_dir, "progress.csv"),
        os.path.join(trial_dir, "checkpoint_000001", ".ftnb_checkpoint.json"),
    ):
        assert os.stat(path).st_mode & 0o777 == 0o644, path
