"""PBT sweeps a demanding user's script runs, and what they must leave, checked from the
experiment's folder alone (tests/test_pbt_ray.py, tests/test_pbt_groups.py).

The trainables grow w by the config's lr at each iteration and report ``score`` (w), ``lr``
and ``cpu`` (the config's, as the trainable read them), ``loaded`` (on an attempt's first
report: what its checkpoint held, ``{"w", "by"}``; else None) and ``cpu_given`` (the CPUs the
attempt was given: on Ray, what Ray assigned its actor), with a checkpoint at every report.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import pytest
from ray_trainables import wait_for_release

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.schedulers import PopulationBasedTraining, pbt_history
from ftnb.storage import ExperimentPaths

#: The trials' lr, the best first: each later trial reaches a perturbation point worse than those
#: before it, so it is the bottom one then and exploits (a sweep that exploits for sure).
LRS = [1.0, 0.3, 0.2, 0.1]


def pbt(mutations: dict | None = None, **kwargs) -> PopulationBasedTraining:
    """PBT every 2 iterations, the bottom quarter exploiting the top quarter, lr (by default)
    scaled by 1.2 or 0.8."""
    return PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.25,
        resample_probability=0.0,
        hyperparam_mutations=mutations or {"lr": ftnb.uniform(0.01, 10.0)}, **kwargs)


def _restored() -> tuple[float, dict | None]:
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is None:
        return 0.0, None
    with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as f:
        loaded = json.load(f)
    return loaded["w"], loaded


def _cpu_given() -> float:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # (in a Ray actor: Ray's own word)
        return ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)
    return ftnb.get_context().get_trial_resources()["cpu"]


def _checkpoint(w: float, iteration: int | None = None) -> tuple[str, ftnb.Checkpoint]:
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"w": w, "by": ftnb.get_context().get_trial_id()}
                  | ({} if iteration is None else {"it": iteration}), f)
    return folder, ftnb.Checkpoint.from_directory(folder)


def _hold(marks: pathlib.Path) -> None:
    """The first caller (of all trials) writes its Ray node to ``marks/held`` and waits for
    ``marks/release``; later callers go on."""
    try:  # (a claim that stays: held.tmp is renamed away, so it cannot be the claim)
        os.close(os.open(marks / "held.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    (marks / "held.tmp").write_text(sys.modules["ray"].get_runtime_context().get_node_id())
    os.rename(marks / "held.tmp", marks / "held")  # (whole when seen)
    wait_for_release(marks)


def train(config: dict) -> None:
    """Until stopped: sleep ``config["sleep"]``, w += lr, report with a checkpoint. Each report
    first leaves the node it runs on (Ray) and its attempt in ``config["marks"]/<trial_id>``.
    With ``config["hold_at"]`` (an iteration), the first trial to run that iteration (of any
    attempt) leaves its node in ``marks/held`` and waits there until ``marks/release`` exists
    (120 s at most): a trial that is surely running on a known node, for a test to remove."""
    context = ftnb.get_context()
    w, loaded = _restored()
    iteration = loaded["it"] if loaded else 0
    cpu = _cpu_given()
    while True:
        time.sleep(config["sleep"])
        w += config["lr"]
        iteration += 1
        if iteration == config.get("hold_at"):
            _hold(pathlib.Path(config["marks"]))
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            node = sys.modules["ray"].get_runtime_context().get_node_id()
            pathlib.Path(config["marks"], context.get_trial_id()).write_text(
                f"{node} {context.attempt}")
        folder, checkpoint = _checkpoint(w, iteration)
        try:
            ftnb.report({"score": w, "lr": config["lr"], "loaded": loaded, "cpu_given": cpu,
                         "cpu": config.get("cpu")}, checkpoint=checkpoint)
        finally:
            shutil.rmtree(folder)  # (persisted by report; it raises where the trial ends)
        loaded = None


def group_train(config: dict) -> None:
    """``train`` in each rank of a gloo group: every rank restores the checkpoint (rank 0 writes
    it) and leaves what it started with in ``config["marks"]/<trial>-<attempt>-<rank>.json``;
    each report carries every rank's w (an all_gather), so the ranks are seen in step."""
    import torch
    import torch.distributed as dist

    context = ftnb.get_context()
    rank = context.get_world_rank()
    w, loaded = _restored()
    name = f"{context.get_trial_id()}-{context.attempt}-{rank}.json"
    pathlib.Path(config["marks"], name).write_text(json.dumps(
        {"lr": config["lr"], "loaded": loaded}))
    while True:
        time.sleep(config["sleep"])
        w += config["lr"]
        ranks_w = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
        dist.all_gather(ranks_w, torch.tensor([w], dtype=torch.float64))
        folder, checkpoint = _checkpoint(w) if rank == 0 else (None, None)
        try:
            ftnb.report({"score": w, "lr": config["lr"], "loaded": loaded,
                         "ranks_w": [float(x) for x in ranks_w]}, checkpoint=checkpoint)
        finally:
            if folder is not None:
                shutil.rmtree(folder)
        loaded = None


def flip_cpu(config: dict) -> dict:
    """PBT's custom_explore_fn for the resource tests: the CPUs asked for go 0.5 <-> 0.25."""
    return {**config, "cpu": 0.75 - config["cpu"]}


def check_exploits(exp, iterations: int, lr_of=lambda config: config["lr"],
                   failure_kinds: tuple = ()) -> tuple[ExperimentState, list, dict]:
    """Assert, for the PBT experiment at ``exp`` whose trials ran ``iterations`` iterations:

    * every trial TERMINATED, its result rows iterations 1..``iterations`` once, each attempt's
      rows consecutive from the iteration it started at (none counted twice in an attempt);
    * failures only of ``failure_kinds`` (an exploit is never one);
    * each exploit in the history carried out once and whole: an attempt starts from its copy
      at its iteration once the attempt before it ended there (another one from the copy only
      after a failure), and the next row restored the donor's checkpoint (w and writer) and
      ran with the new config (``lr_of(config)``), as did every row up to the next exploit;
    * no staged copy left; each copy among the trial's checkpoints once.

    Returns (the state, the history's entries, the rows by trial id)."""
    paths = ExperimentPaths.at(str(exp))
    state = ExperimentState.load(paths)
    entries = pbt_history(str(exp))["global"]
    trials = {t.trial_id: t for t in state.trials}
    rows = {tid: paths.trial(t.dir_name).read_results() for tid, t in trials.items()}
    by_trial: dict = {}
    for entry in entries:
        by_trial.setdefault(entry["trial_id"], []).append(entry)
    for tid, trial in trials.items():
        assert trial.status == "TERMINATED", (tid, trial.status, trial.failures)
        assert {f.kind for f in trial.failures} <= set(failure_kinds), (tid, trial.failures)
        assert [r["training_iteration"] for r in rows[tid]] == list(
            range(1, iterations + 1)), tid
        attempts = {a.number: a for a in trial.attempts}
        by_attempt: dict = {}
        for row in rows[tid]:
            by_attempt.setdefault(row["attempt"], []).append(row["training_iteration"])
        assert sorted(by_attempt) == list(by_attempt), (tid, by_attempt)  # in attempt order
        for number, its in by_attempt.items():
            start = attempts[number].start_iteration
            assert its == list(range(start + 1, start + 1 + len(its))), (tid, number, its)
        assert not [n for n in paths.storage.listdir(paths.trial(trial.dir_name).dir)
                    if "pbt_exploit" in n], tid
        failed = {f.attempt for f in trial.failures}
        mine = by_trial.get(tid, [])
        assert len({e["iteration"] for e in mine}) == len(mine), mine
        trial_rows = {r["training_iteration"]: r for r in rows[tid]}
        for n, entry in enumerate(mine):
            i = entry["iteration"]
            starts = [a for a in trial.attempts
                      if (a.restored_from, a.start_iteration) == (entry["checkpoint"], i)]
            # One restart for the exploit, after the attempt that ended at its report; another
            # from the same copy only after a failure (a lost node).
            assert starts and attempts[starts[0].number - 1].end_iteration == i, (
                tid, entry, trial.attempts)
            assert all(a.number - 1 in failed for a in starts[1:]), (tid, entry, trial.attempts)
            after = trial_rows[i + 1]
            assert after["loaded"]["by"] == written_by(entry, entries, rows)[0], (entry, after)
            assert after["loaded"]["w"] == pytest.approx(
                written_by(entry, entries, rows)[1]), (entry, after)
            new_lr = lr_of(entry["config"])
            assert new_lr != pytest.approx(lr_of(entry["donor_config"]))  # (explored)
            end = mine[n + 1]["iteration"] if n + 1 < len(mine) else iterations
            assert [trial_rows[k]["lr"] for k in range(i + 1, end + 1)] == pytest.approx(
                [new_lr] * (end - i)), (tid, entry)
            assert after["score"] == pytest.approx(after["loaded"]["w"] + new_lr)
        copies = [c["iteration"] for c in trial.checkpoints if c.get("exploited_from")]
        assert copies == [e["iteration"] for e in mine], (tid, copies)
        if mine:
            assert lr_of(trial.config) == pytest.approx(lr_of(mine[-1]["config"]))
        else:
            assert len({r["lr"] for r in rows[tid]}) == 1, tid  # its own lr throughout
    return state, entries, rows


def written_by(entry: dict, entries: list, rows: dict) -> tuple[str, float]:
    """Who wrote the checkpoint an exploit (``entry``) copied, and its w: the donor at the
    checkpoint's iteration (its row's score), or, when that checkpoint is the copy the donor
    itself continued from after an exploit (not reported from since), what that copy held."""
    for earlier in entries:
        if (earlier["trial_id"], earlier["checkpoint"]) == (entry["donor_id"],
                                                            entry["donor_checkpoint"]):
            return written_by(earlier, entries, rows)
    donor_rows = {r["training_iteration"]: r for r in rows[entry["donor_id"]]}
    return entry["donor_id"], donor_rows[entry["donor_checkpoint_iteration"]]["score"]
