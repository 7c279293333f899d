"""Elastic data-parallel training on the local executor (ScalingConfig(num_workers=(min, max))):
real gloo groups of real processes. A rank SIGKILLed: the group re-forms with the ranks that
survived (a failure counted, as Ray counts it), then grows back to max once the resize monitor
finds room, without a failure; a group starts at min when only min fit and grows when a
competing trial ends. Iterations are done exactly once; every re-form is in trial.json and in
`ftnb status`; datasets are re-split over every world size."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import ftnb

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")]


def shrink_then_grow(config):
    """Checkpoints every step. Rank 1 of the first 3-rank group SIGKILLs itself at step 2;
    the loop ends after two steps at full size following a shrink (or, as a safety net, when
    two minutes have passed: the test then fails on the missing growth). Each rank writes its
    dataset shard and world size per step to config["out"].

    The safety net is a deadline, not a step count: on a fast machine 200 steps at size 2 ended
    before the resize monitor's first look (1 s), and the group never grew back."""
    import signal
    import tempfile
    import time

    import torch
    import torch.distributed as dist

    from ftnb.torch import get_device

    ctx = ftnb.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    full = config.get("full", 3)  # the group's max (tests/test_gpu.py: the GPUs there are)
    state = {"step": 0, "shrunk": False, "full_after": 0}
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = json.load(open(os.path.join(folder, "state.json")))
    shard = list(ftnb.get_dataset_shard("train"))
    deadline = time.monotonic() + config.get("deadline_s", 120)
    while True:
        total = torch.ones(1, device=get_device())  # (NCCL reduces CUDA tensors only)
        dist.all_reduce(total)
        assert int(total.item()) == size == dist.get_world_size()
        with open(os.path.join(config["out"], f"{state['step']}.{rank}.json"), "w") as f:
            json.dump({"size": size, "shard": shard, "pid": os.getpid()}, f)
        if state["step"] == 2 and size == full and rank == 1 and not state["shrunk"]:
            os.kill(os.getpid(), getattr(signal, config.get("signal", "SIGKILL")))
        state["shrunk"] = state["shrunk"] or size < full
        if state["shrunk"] and size == full:
            state["full_after"] += 1
        state["step"] += 1
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "state.json"), "w") as f:
            json.dump(state, f)
        ftnb.report({"step": state["step"] - 1, "size": size},
                    checkpoint=ftnb.Checkpoint.from_directory(folder))
        if state["full_after"] >= 2 or time.monotonic() > deadline:
            return
        if state["shrunk"] and size < full:
            time.sleep(0.02)  # a step of real work; keeps the checkpoints few while it waits


def _trial_dir(experiment):
    return next(p for p in experiment.iterdir() if (p / "trial.json").exists())


def _rows(trial_dir):
    return [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]


def test_a_lost_rank_shrinks_the_group_then_it_grows_back(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    data = list(range(10))
    result = ftnb.TorchTrainer(
        shrink_then_grow, train_loop_config={"out": str(out)}, datasets={"train": data},
        scaling_config=ftnb.ScalingConfig(num_workers=(2, 3), resources_per_worker={"CPU": 0.5},
                                          elastic_resize_monitor_interval_s=1.0),
        run_config=ftnb.RunConfig(name="elastic", storage_path=str(tmp_path / "runs"), verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    trial_dir = _trial_dir(tmp_path / "runs" / "elastic")
    record = json.loads((trial_dir / "trial.json").read_text())
    sizes = [a["num_workers"] for a in record["attempts"]]
    outcomes = [a["outcome"] for a in record["attempts"]]
    assert sizes == [3, 2, 3] and outcomes == ["failed", "resized", "finished"], record["attempts"]
    # The SIGKILL is one failure, counted; the growth is none.
    assert [(f["kind"], f["counted"]) for f in record["failures"]] == [("signal", True)]
    reforms = [(r["reason"], r["old_size"], r["new_size"], r["mode"]) for r in record["resizes"]]
    assert reforms == [("rank lost", 3, 2, "cold"), ("capacity returned", 2, 3, "cold")]
    # Every iteration exactly once, each at the size the loop saw.
    rows = _rows(trial_dir)
    assert [r["step"] for r in rows] == list(range(len(rows)))
    seen = [r["size"] for r in rows]
    assert seen[:2] == [3, 3] and 2 in seen and seen[-2:] == [3, 3], seen
    assert result.metrics["training_iteration"] == len(rows)
    # At every size, the shards of the ranks cover the dataset once.
    by_step: dict = {}
    for path in out.iterdir():
        step, rank, _ = path.name.split(".")
        by_step.setdefault(int(step), {})[int(rank)] = json.loads(path.read_text())
    for step, ranks in by_step.items():
        size = ranks[0]["size"]
        if len(ranks) == size:
            shards = [ranks[r]["shard"] for r in range(size)]
            assert sorted(x for s in shards for x in s) == data, (step, shards)
    assert {ranks[0]["size"] for ranks in by_step.values()} == {2, 3}
    # `ftnb status` shows the re-forms.
    shown = subprocess.run([sys.executable, "-m", "ftnb", "status",
                            str(tmp_path / "runs" / "elastic")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "Group re-forms:" in shown.stdout
    assert "attempt 2: 3 -> 2 ranks (rank lost, cold)" in shown.stdout
    assert "3 (3>2>3)" in shown.stdout  # the ranks column: its sizes so far
    assert "attempt 3: 2 -> 3 ranks (capacity returned, cold)" in shown.stdout


def grow_when_room(config):
    """Reports until it has done config["full_steps"] steps at world size 2."""
    import tempfile
    import time

    import torch
    import torch.distributed as dist

    size = ftnb.get_context().get_world_size()
    state = {"step": 0, "at_two": 0}
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = json.load(open(os.path.join(folder, "state.json")))
    while state["at_two"] < config["full_steps"] and state["step"] < 400:
        total = torch.ones(1)
        dist.all_reduce(total)
        assert int(total.item()) == size
        state["step"] += 1
        state["at_two"] += size == 2
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "state.json"), "w") as f:
            json.dump(state, f)
        ftnb.report({"size": size}, checkpoint=ftnb.Checkpoint.from_directory(folder))
        time.sleep(0.05)


def test_a_group_starts_at_min_and_grows_when_a_competing_trial_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_CPUS", "3")  # two groups of 2 ranks of 1 CPU never both fit
    trainer = ftnb.TorchTrainer(
        grow_when_room,
        scaling_config=ftnb.ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=1),
    )
    grid = ftnb.Tuner(
        trainer, param_space={"train_loop_config": {"full_steps": ftnb.grid_search([1, 4])}},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=ftnb.RunConfig(name="compete", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert not grid.errors
    state = ftnb.Tuner.restore(str(tmp_path / "compete"), grow_when_room).get_results()
    first, second = sorted(state, key=lambda r: r.config["train_loop_config"]["full_steps"])
    records = {}
    for trial_dir in (tmp_path / "compete").iterdir():
        if (trial_dir / "trial.json").exists():
            record = json.loads((trial_dir / "trial.json").read_text())
            records[record["config"]["train_loop_config"]["full_steps"]] = record
    # The first trial took 2 of the 3 CPUs; the second started with the 1 left (its min)...
    assert [a["num_workers"] for a in records[1]["attempts"]] == [2]
    late = records[4]
    assert [a["num_workers"] for a in late["attempts"]] == [1, 2], late["attempts"]
    assert [a["outcome"] for a in late["attempts"]] == ["resized", "finished"]
    # ...and grew once the first one ended: no failure.
    assert late["failures"] == []
    assert [(r["reason"], r["old_size"], r["new_size"]) for r in late["resizes"]] == [
        ("capacity at start", 2, 1), ("capacity returned", 1, 2)]
    rows = _rows(_trial_dir_of(tmp_path / "compete", late))
    assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert rows[0]["size"] == 1 and rows[-1]["size"] == 2
    assert first.metrics["size"] == 2 and second.metrics["size"] == 2


def _trial_dir_of(experiment, record):
    return experiment / record["dir_name"]


def test_a_min_that_never_fits_is_refused_before_anything_is_written(tmp_path):
    trainer = ftnb.TorchTrainer(
        shrink_then_grow, scaling_config=ftnb.ScalingConfig(num_workers=(64, 128)),
        run_config=ftnb.RunConfig(name="huge", storage_path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"ScalingConfig\(num_workers=\(64, 128\)\).*min of 64 "
                                         r"ranks never fits.*Fix:"):
        trainer.fit()
    assert not (tmp_path / "huge").exists()


def test_an_elastic_run_is_restored_elastic():
    from ftnb.train.torch_trainer import trainer_from_settings

    settings = {"num_workers": 2, "elastic": {"max_workers": 4, "resize_interval_s": 5.0},
                "resources_per_trial": {"cpu": 1}, "trainer": {"kind": "TorchTrainer"}}
    scaling = trainer_from_settings(shrink_then_grow, settings).scaling_config
    assert scaling.num_workers == (2, 4) and scaling.elastic_resize_monitor_interval_s == 5.0


def test_an_elastic_group_on_an_executor_that_cannot_resize_is_refused(tmp_path):
    trainer = ftnb.TorchTrainer(
        shrink_then_grow, scaling_config=ftnb.ScalingConfig(num_workers=(1, 2)),
        run_config=ftnb.RunConfig(name="nowhere", storage_path=str(tmp_path),
                                  executor="inprocess"))
    with pytest.raises(ValueError, match=r"num_workers=\(1, 2\)\) on the 'inprocess' executor: "
                                         r"elastic groups run on the local and Ray executors.*Fix"):
        trainer.fit()
    assert not (tmp_path / "nowhere").exists()


def test_a_hung_rank_is_lost_too(tmp_path):
    """A rank stopped (SIGSTOP) in the group: found by the collective timeout, it is replaced and
    the group goes on with the two that remain, one failure of kind hang counted."""
    out = tmp_path / "out"
    out.mkdir()
    ftnb.TorchTrainer(
        shrink_then_grow, train_loop_config={"out": str(out), "signal": "SIGSTOP"},
        datasets={"train": list(range(6))},
        scaling_config=ftnb.ScalingConfig(num_workers=(2, 3), resources_per_worker={"CPU": 0.5},
                                          collective_timeout_s=5,
                                          elastic_resize_monitor_interval_s=1.0),
        run_config=ftnb.RunConfig(name="hung", storage_path=str(tmp_path / "runs"), verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    record = json.loads((_trial_dir(tmp_path / "runs" / "hung") / "trial.json").read_text())
    assert [a["num_workers"] for a in record["attempts"]] == [3, 2, 3], record["attempts"]
    assert [(f["kind"], f["counted"]) for f in record["failures"]] == [("hang", True)]
    assert record["resizes"][0]["reason"] == "rank lost"
    rows = _rows(_trial_dir(tmp_path / "runs" / "hung"))
    assert [r["step"] for r in rows] == list(range(len(rows)))
