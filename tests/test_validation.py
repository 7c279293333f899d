"""Asynchronous validation (issue 29, Ray Train 2.60's names): TorchTrainer(validation_config=
ValidationConfig(fn, task_config)) and report(..., validation=True): the validation runs in a
process of its own while training goes on, its metrics are merged into the report's row and
rank the checkpoints; a validation that raises is recorded on its row; one pending when the
driver is SIGKILLed runs again in the re-run, and is recorded once."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

import ftnb
from ftnb.config import CheckpointConfig
from ftnb.core.policy import checkpoints_to_delete
from ftnb.train.validation import merged_row, pending_validations, validation_request
from procs import pid_alive, run_script, wait_for
from scripted import result_rows

DRIVER = """
import json, sys
import ftnb
from validation_loops import train_loop, validate

args = json.loads(sys.argv[1])
result = ftnb.TorchTrainer(
    train_loop, train_loop_config={"side": args["side"], "n": args["n"], "mode": args["mode"]},
    scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
    torch_config=ftnb.TorchConfig(backend="gloo"),
    validation_config=ftnb.ValidationConfig(validate, task_config=ftnb.ValidationTaskConfig(
        fn_kwargs={"side": args["side"], "crash_step": args["crash_step"],
                   "gate": args["gate"]})),
    run_config=ftnb.RunConfig(
        name="val", storage_path=args["storage"], verbose=0,
        checkpoint_config=ftnb.CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min")),
).fit()
best = result.get_best_checkpoint("val_loss", "min")
print("RESULT", json.dumps({
    "metrics": result.metrics, "best": best.path if best else None,
    "ranked": [c.path for c, _ in result.best_checkpoints], "status": "ok"}), flush=True)
"""


def _run(tmp_path, n: int, crash_step: int = 0, gate: str = "train_done", mode: str = "SYNC"):
    side = tmp_path / "side"
    side.mkdir(exist_ok=True)
    return side, run_script(tmp_path, DRIVER, json.dumps(
        {"storage": str(tmp_path / "exp"), "side": str(side), "n": n,
         "crash_step": crash_step, "gate": gate, "mode": mode}))


def _trial_dir(tmp_path) -> str:
    exp = tmp_path / "exp" / "val"
    dirs = [d for d in os.listdir(exp) if os.path.isfile(exp / d / "params.json")]
    assert len(dirs) == 1, dirs
    return str(exp / dirs[0])


def _result(out: str) -> dict:
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_validation_runs_beside_training_is_merged_ranks_checkpoints_and_records_a_crash(
        tmp_path):
    """2 gloo ranks, 4 reports with validation=True; each validation waits for the file that
    rank 0 writes after its last report returned, so training that waited for a validation
    would never get there. Each row gets its validation's metrics (the validated ``loss``
    wins), once; step 3's validation raises: its row records the error and the run succeeds;
    the checkpoints are ranked by val_loss (step 2 best), retention keeping the best. ASYNC
    uploads: a validation starts once its checkpoint is whole."""
    side, proc = _run(tmp_path, n=4, crash_step=3, mode="ASYNC")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    result = _result(out)
    # Ordering: step 1's validation started when only step 1 was reported, and ended after
    # all 4 were (steps 2-4 ran while it waited for train_done); so did those that ended.
    started = {s: (side / f"val_started.{s}").read_text().split(" ", 1) for s in (1, 2, 3, 4)}
    assert json.loads(started[1][1]) == [1]
    for step in (1, 2, 4):
        assert json.loads((side / f"val_done.{step}").read_text()) == [1, 2, 3, 4]
    val_pids = {pid for pid, _ in started.values()}
    rank_pids = {(side / f"rank.{r}").read_text().split()[0] for r in (0, 1)}
    trial = _trial_dir(tmp_path)
    rows = result_rows(trial)
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
    assert all(r["attempt"] == 1 for r in rows)
    # a process of its own each: not a rank's, not the driver's
    assert len(val_pids) == 4 and not val_pids & (rank_pids | {str(proc.pid)})
    for r in rows:
        step = r["training_iteration"]
        if step == 3:
            assert r["validation"]["status"] == "error"
            assert "ValueError: validation of step 3 crashed on purpose" in \
                r["validation"]["error"]
            assert "val_loss" not in r and r["loss"] == pytest.approx(1 / 3)
        else:
            assert r["validation"] == {"status": "done", "fn_kwargs": {
                "side": str(side), "crash_step": 3, "gate": "train_done"}}
            assert r["val_loss"] == abs(step - 2) + 0.5 and r["val_step"] == step
            assert r["loss"] == -1.0  # the validated value wins on a shared key
    with open(os.path.join(trial, "progress.csv")) as f:
        assert "val_loss" in f.readline()  # the mirror has the merged columns too
    names = {r["training_iteration"]: r["checkpoint_dir_name"] for r in rows}
    kept = sorted(n for n in os.listdir(trial) if n.startswith("checkpoint_"))
    # num_to_keep=2 by val_loss (min): step 2 (0.5) and the latest (step 4) stay
    assert kept == sorted([names[2], names[4]]), kept
    assert os.path.basename(result["best"]) == names[2]
    assert [os.path.basename(p) for p in result["ranked"]][0] == names[2]
    assert result["metrics"]["val_loss"] == 2.5 and result["metrics"]["training_iteration"] == 4


def test_validation_pending_when_the_driver_is_sigkilled_runs_again_once(tmp_path):
    """The driver SIGKILLed while the validations of 3 persisted checkpoints wait (the first
    inside fn, held by a gate file; the others queued): the rows stay ``pending`` and the
    validation's process ends with its trial's; the re-run (same trainer, same name) runs each
    again and records it once."""
    side, proc = _run(tmp_path, n=3, gate="open.val")
    try:
        wait_for(lambda: (side / "train_done").exists() and (side / "val_started.1").exists(),
                 timeout=180, what="training done, step 1's validation started")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    val_pid = int((side / "val_started.1").read_text().split(" ", 1)[0])
    wait_for(lambda: not pid_alive(val_pid), timeout=30,
             what="the validation's process, ended with its trial's")
    trial = _trial_dir(tmp_path)
    rows = result_rows(trial)
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    assert [r["validation"]["status"] for r in rows] == ["pending"] * 3
    (side / "open.val").write_text("")
    _, proc = _run(tmp_path, n=3, gate="open.val")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    rows2 = result_rows(trial)
    assert [r["training_iteration"] for r in rows2] == [1, 2, 3]
    for r in rows2:
        step = r["training_iteration"]
        assert r["validation"]["status"] == "done", r
        assert r["val_loss"] == abs(step - 2) + 0.5 and r["attempt"] == 1
        # ran to its end exactly once; step 1's started twice (cut off, then run again)
        assert len((side / f"val_done.{step}").read_text().splitlines()) == 1
    assert len((side / "val_started.1").read_text().splitlines()) == 2
    assert os.path.basename(_result(out)["best"]) == rows2[1]["checkpoint_dir_name"]


def test_a_tuner_over_a_trainer_ranks_trials_by_a_validated_metric(tmp_path):
    """Tuner(TorchTrainer(validation_config=...), TuneConfig(metric="val_loss")): the first
    report has no val_loss yet (its validation brings it), which is not a usage error; the
    trials are ranked by the validated values."""
    from validation_loops import score, small_loop

    trainer = ftnb.TorchTrainer(
        small_loop, scaling_config=ftnb.ScalingConfig(num_workers=0),
        validation_config=ftnb.ValidationConfig(score))
    grid = ftnb.Tuner(
        trainer, param_space={"train_loop_config": {"x": ftnb.grid_search([1, 2])}},
        tune_config=ftnb.TuneConfig(metric="val_loss", mode="min"),
        run_config=ftnb.RunConfig(name="tuned", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert grid.num_errors == 0, [str(r.error) for r in grid]
    for result in grid:
        assert [r["val_loss"] for r in result.rows] == [-1.0, -2.0]
    assert grid.get_best_result().metrics["val_loss"] == -2.0


# ---- bad input, and the pure parts --------------------------------------------------------------


def _validate(checkpoint, **kwargs):
    return {}


def _asks_validation(config):
    with tempfile.TemporaryDirectory() as d:
        ftnb.report({"loss": 1.0}, checkpoint=ftnb.Checkpoint.from_directory(d),
                    validation=True)


def test_validation_without_a_validation_config_fails_the_trial_before_any_write(tmp_path):
    grid = ftnb.run(_asks_validation, name="noconfig", storage_path=str(tmp_path),
                    run_config=ftnb.RunConfig(verbose=0))
    (result,) = list(grid)
    assert "report(validation=True) but the trainer has no validation function" in \
        str(result.error)
    assert "validation_config=ftnb.ValidationConfig(fn=validate)" in str(result.error)
    assert result_rows(result.path) == []
    assert not [f for f in os.listdir(result.path) if f.startswith("checkpoint_")]


@pytest.mark.unit
def test_bad_input_names_the_argument_the_value_and_the_fix():
    with pytest.raises(TypeError, match=r"ValidationConfig\(fn=...\).*got int: 3.*Fix"):
        ftnb.ValidationConfig(fn=3)
    with pytest.raises(TypeError, match=r"task_config=...\).*Fix"):
        ftnb.ValidationConfig(_validate, task_config={"a": 1})
    with pytest.raises(TypeError, match=r"fn_kwargs=.*must be JSON.*Fix"):
        ftnb.ValidationTaskConfig(fn_kwargs={"data": object()})
    with pytest.raises(TypeError, match=r"validation_config=...\).*Fix"):
        ftnb.TorchTrainer(lambda: None, validation_config=_validate)
    config = ftnb.ValidationConfig(_validate, ftnb.ValidationTaskConfig(fn_kwargs={"a": 1}))
    with pytest.raises(ValueError, match=r"validation=True\) but the trainer has no validation"
                                         r".*Fix: TorchTrainer\(.*validation_config="):
        validation_request(True, None, True, {})
    with pytest.raises(ValueError, match=r"validation=True\) without a checkpoint.*Fix"):
        validation_request(True, config, False, {})
    with pytest.raises(ValueError, match=r"validation='yes'\) must be True.*Fix"):
        validation_request("yes", config, True, {})
    with pytest.raises(ValueError, match=r"metric named 'validation'.*Fix"):
        validation_request(True, config, True, {"validation": 1})
    assert validation_request(False, None, False, {}) is None
    assert validation_request(True, config, True, {}) == {"a": 1}
    # a report's task config replaces the trainer's defaults, as in Ray
    assert validation_request(ftnb.ValidationTaskConfig(fn_kwargs={"b": 2}), config, None,
                              {}) == {"b": 2}


@pytest.mark.unit
def test_an_outcome_is_merged_once_and_pending_checkpoints_are_kept():
    row = {"training_iteration": 2, "loss": 1.0, "checkpoint_dir_name": "checkpoint_000001",
           "validation": {"status": "pending", "fn_kwargs": {"a": 1}}}
    assert pending_validations([row, {"training_iteration": 1}]) == [
        ("checkpoint_000001", {"a": 1})]
    done = merged_row(row, {"metrics": {"val": 3, "loss": 0.5, "training_iteration": 99}},
                      reserved={"training_iteration"})
    assert done == {"training_iteration": 2, "loss": 0.5, "val": 3,
                    "checkpoint_dir_name": "checkpoint_000001",
                    "validation": {"status": "done", "fn_kwargs": {"a": 1}}}
    assert merged_row(done, {"metrics": {"val": 4}}) is None  # never twice
    failed = merged_row(row, {"error": "ValueError: x"})
    assert failed["validation"]["status"] == "error" and pending_validations([failed]) == []
    # retention keeps a checkpoint whose validation is pending (its score is not known yet)
    entries = [{"dir_name": "a", "iteration": 1, "validation_pending": True},
               {"dir_name": "b", "iteration": 2, "score": 1.0},
               {"dir_name": "c", "iteration": 3, "score": 2.0}]
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="s")
    assert [c["dir_name"] for c in checkpoints_to_delete(entries, config)] == ["b"]
