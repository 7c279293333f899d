"""ScalingConfig(num_workers=0), Ray Train's local mode: the training loop runs in the calling
process and thread, with report / get_checkpoint / get_context working and no process group;
its results and checkpoints are recorded like any trial's."""

from __future__ import annotations

import json
import os
import tempfile
import threading

import pytest

import ftnb

SEEN: dict = {}


def loop(config):
    import torch.distributed as dist

    context = ftnb.get_context()
    SEEN.update(pid=os.getpid(), thread=threading.get_ident(), world_size=context.get_world_size(),
                rank=context.get_world_rank(), process_group=dist.is_initialized(),
                config=dict(config))
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = int(open(os.path.join(folder, "step")).read())
    SEEN.setdefault("starts", []).append(start)
    for step in range(start, config["steps"]):
        if step == config.get("fail_at") and not SEEN.get("failed"):
            SEEN["failed"] = True
            raise RuntimeError("boom in local mode")
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "step"), "w") as f:
            f.write(str(step + 1))
        ftnb.report({"step": step}, checkpoint=ftnb.Checkpoint.from_directory(folder))


@pytest.fixture(autouse=True)
def _fresh_seen():
    SEEN.clear()
    yield
    SEEN.clear()


def _trainer(tmp_path, name, **config):
    return ftnb.TorchTrainer(
        loop, train_loop_config={"steps": 3, **config},
        scaling_config=ftnb.ScalingConfig(num_workers=0),
        run_config=ftnb.RunConfig(name=name, storage_path=str(tmp_path), verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)))


def test_the_loop_runs_in_the_callers_process_and_thread(tmp_path):
    result = _trainer(tmp_path, "local").fit()
    assert SEEN["pid"] == os.getpid() and SEEN["thread"] == threading.get_ident()
    assert SEEN["world_size"] == 1 and SEEN["rank"] == 0 and SEEN["process_group"] is False
    assert result.metrics["step"] == 2 and result.metrics["training_iteration"] == 3
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000002")
    trial_dir = next(p for p in (tmp_path / "local").iterdir() if (p / "trial.json").exists())
    rows = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]
    record = json.loads((trial_dir / "trial.json").read_text())
    assert record["status"] == "TERMINATED" and len(record["attempts"]) == 1
    # Outside the loop there is no session again.
    with pytest.raises(Exception):
        ftnb.report({"x": 1})


def test_a_failure_retries_from_the_latest_checkpoint_in_the_caller(tmp_path):
    result = _trainer(tmp_path, "retry", fail_at=2).fit()
    assert SEEN["starts"] == [0, 2] and SEEN["pid"] == os.getpid()
    assert result.metrics["step"] == 2
    trial_dir = next(p for p in (tmp_path / "retry").iterdir() if (p / "trial.json").exists())
    record = json.loads((trial_dir / "trial.json").read_text())
    assert len(record["attempts"]) == 2 and len(record["failures"]) == 1
    assert record["failures"][0]["kind"] == "exception"


def test_a_tuner_of_local_mode_trainers_runs_each_trial_in_the_caller(tmp_path):
    pids = []

    def tracked(config):
        pids.append((os.getpid(), ftnb.get_context().get_world_size()))
        ftnb.report({"lr": config["lr"]})

    trainer = ftnb.TorchTrainer(tracked, scaling_config=ftnb.ScalingConfig(num_workers=0))
    grid = ftnb.Tuner(trainer, param_space={"train_loop_config": {"lr": ftnb.grid_search([1, 2])}},
                      run_config=ftnb.RunConfig(name="sweep", storage_path=str(tmp_path),
                                                verbose=0)).fit()
    assert sorted(r.metrics["lr"] for r in grid) == [1, 2] and not grid.errors
    assert pids == [(os.getpid(), 1)] * 2


def test_local_mode_refuses_another_executor_and_a_scheduler(tmp_path):
    trainer = ftnb.TorchTrainer(loop, scaling_config=ftnb.ScalingConfig(num_workers=0),
                                run_config=ftnb.RunConfig(name="x", storage_path=str(tmp_path),
                                                          executor="inprocess"))
    with pytest.raises(ValueError, match=r"num_workers=0\) with RunConfig\(executor='inprocess'"
                                         r"\).*Fix: ScalingConfig\(num_workers=1\)"):
        trainer.fit()
    from ftnb.schedulers import ASHAScheduler

    tuner = ftnb.Tuner(ftnb.TorchTrainer(loop, scaling_config=ftnb.ScalingConfig(num_workers=0)),
                       tune_config=ftnb.TuneConfig(scheduler=ASHAScheduler(metric="step",
                                                                           mode="max")),
                       run_config=ftnb.RunConfig(name="y", storage_path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"TuneConfig\(scheduler=ASHAScheduler.*Fix:"):
        tuner.fit()
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_a_local_mode_run_resumes_as_local_mode(tmp_path):
    trainer = _trainer(tmp_path, "again")
    trainer.fit()
    restored = ftnb.TorchTrainer.restore(str(tmp_path / "again"))
    assert restored.scaling_config.num_workers == 0 and restored.scaling_config.local_mode


CTRL_C_SCRIPT = '''
import os, sys, time
import ftnb

def loop(config):
    for step in range(10_000):
        if step == 2:
            open(config["ready"], "w").close()
        ftnb.report({"step": step})
        time.sleep(0.05)

ftnb.TorchTrainer(loop, train_loop_config={"ready": sys.argv[2]},
                  scaling_config=ftnb.ScalingConfig(num_workers=0),
                  run_config=ftnb.RunConfig(name="ctrlc", storage_path=sys.argv[1],
                                            verbose=0)).fit()
'''


def test_ctrl_c_in_the_loop_interrupts_the_run_resumably(tmp_path):
    import signal
    import subprocess
    import sys

    from procs import wait_for

    script = tmp_path / "ctrlc.py"
    script.write_text(CTRL_C_SCRIPT)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, timeout=120, what="the loop to run in the script's process")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "interrupted" in err and "Resume it with" in err, err
    state = json.loads((tmp_path / "runs" / "ctrlc" / "experiment_state.json").read_text())
    assert state["status"] == "INTERRUPTED", state["status"]
    trial_dir = next(p for p in (tmp_path / "runs" / "ctrlc").iterdir()
                     if (p / "trial.json").exists())
    record = json.loads((trial_dir / "trial.json").read_text())
    assert record["failures"] == [] and record["status"] in ("PAUSED", "PENDING"), record
