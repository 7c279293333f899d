"""PopulationBasedTraining over TorchTrainer groups (``Tuner(TorchTrainer(...), param_space=
{"train_loop_config": ...})``) on local processes, 2 gloo ranks a trial: an exploit is one
restart of the whole group, never a failure, and every rank of the new attempt restores the
donor's checkpoint and runs with the new config."""

from __future__ import annotations

import json
import random

import pytest
from pbt_sweeps import LRS, check_exploits, group_train, pbt, written_by

import ftnb

pytestmark = pytest.mark.slow

ITERATIONS = 6


def _lr(config: dict) -> float:
    return config["train_loop_config"]["lr"]


def test_pbt_over_groups_restarts_every_rank_from_the_donors_checkpoint(tmp_path):
    pytest.importorskip("torch")
    random.seed(5)
    marks = tmp_path / "marks"
    marks.mkdir()
    trainer = ftnb.TorchTrainer(
        group_train, scaling_config=ftnb.ScalingConfig(
            num_workers=2, resources_per_worker={"cpu": 0.25}))
    results = ftnb.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": ftnb.grid_search(LRS), "sleep": 0.05,
                                           "marks": str(marks)}},
        tune_config=ftnb.TuneConfig(metric="score", mode="max", scheduler=pbt(
            {"train_loop_config": {"lr": ftnb.uniform(0.01, 10.0)}})),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="pbt", verbose=0,
                                  stop={"training_iteration": ITERATIONS}),
    ).fit()
    assert not results.errors
    state, entries, rows = check_exploits(tmp_path / "pbt", ITERATIONS, lr_of=_lr)
    assert entries
    trials = {t.trial_id: t for t in state.trials}

    def started_with(trial_id: str, attempt: int) -> list:
        return [json.loads((marks / f"{trial_id}-{attempt}-{rank}.json").read_text())
                for rank in (0, 1)]

    for tid, trial in trials.items():
        assert all(a.num_workers == 2 for a in trial.attempts)
        for attempt in trial.attempts:  # the two ranks of each attempt started alike
            first, second = started_with(tid, attempt.number)
            assert first == second, (tid, attempt.number, first, second)
        # ... and stayed in step: each report saw the same w on both ranks.
        assert all(r["ranks_w"] == [r["score"]] * 2 for r in rows[tid]), tid
    for entry in entries:
        tid = entry["trial_id"]
        (attempt,) = [a for a in trials[tid].attempts
                      if (a.restored_from, a.start_iteration) == (entry["checkpoint"],
                                                                  entry["iteration"])]
        writer, w = written_by(entry, entries, rows)
        for rank, seen in enumerate(started_with(tid, attempt.number)):
            assert seen["lr"] == pytest.approx(_lr(entry["config"])), (rank, entry, seen)
            assert seen["loaded"] == {"by": writer, "w": pytest.approx(w)}, (rank, entry, seen)
