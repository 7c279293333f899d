"""PopulationBasedTraining on the Ray executor, on the multi-node cluster of this machine
(``ray_cluster``), with a node removed mid-run: every exploit carried out once and whole (the
trial's next rows continue from the donor's checkpoint with the new config), no iteration
counted twice in an attempt. And resources given by a function of the config
(``ftnb.with_resources(train, lambda config: ...)``) follow the config an exploit gave: the
trial's next attempt gets the new config's resources (on Ray, its actor's CPUs; on local
processes, what ``get_trial_resources()`` says), and an exploit to a config whose resources can
never be had is not made."""

from __future__ import annotations

import json
import random

import pytest
from pbt_sweeps import LRS, check_exploits, flip_cpu, pbt, train
from procs import run_script, wait_for

import ftnb

ITERATIONS = 8
#: On Ray: the node goes at iteration 5, between the exploits at 2 and 4 and the one at 6, and
#: the trial it takes has iterations 5 to 8 ahead. (Each point of synchronous PBT restarts every
#: trial's actor: a perturbation point more costs four actor starts.)
RAY_ITERATIONS = 8


def _check_resources(entries: list, rows: dict) -> None:
    """Every row's attempt was given the CPUs its config asked for; every exploit flipped the
    CPUs of its donor's config, so some trial's next attempt asked for other CPUs than its
    last (the first exploit: all began with 0.5)."""
    assert entries and all(e["config"]["cpu"] == 0.75 - e["donor_config"]["cpu"]
                           for e in entries), entries
    for tid, its in rows.items():
        assert [r["cpu_given"] for r in its] == [r["cpu"] for r in its], (tid, its)
    assert any(r["cpu"] == 0.25 for its in rows.values() for r in its)


def _local_sweep(tmp_path, explore, iterations: int):
    """Resources by a function of the config, on local processes (no Ray needed), with
    ``explore`` as PBT's custom_explore_fn. Synchronous: the bottom trial at a point is sure to
    exploit (asynchronous, trials that start seconds apart on a loaded machine are never at a
    point together, and none is the bottom one there). Its results."""
    return ftnb.Tuner(
        ftnb.with_resources(train, lambda config: {"cpu": config["cpu"]}),
        param_space={"lr": ftnb.grid_search(LRS), "cpu": 0.5, "sleep": 0.02, "marks": ""},
        tune_config=ftnb.TuneConfig(metric="score", mode="max",
                                    scheduler=pbt(custom_explore_fn=explore, synch=True)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="pbt", verbose=0,
                                  stop={"training_iteration": iterations}),
    ).fit()


def test_an_exploit_gives_the_trials_next_attempt_the_resources_of_its_new_config(tmp_path):
    random.seed(4)
    results = _local_sweep(tmp_path, flip_cpu, ITERATIONS)
    assert not results.errors
    _, entries, rows = check_exploits(tmp_path / "pbt", ITERATIONS)
    _check_resources(entries, rows)


def _asks_too_much(config: dict) -> dict:
    return {**config, "cpu": 1000.0}


def test_an_exploit_to_a_config_whose_resources_can_never_be_had_is_not_made(tmp_path, capfd):
    """The explored config asks for more than the machine has: the trial goes on with its own
    config (a warning says why and the fix), rather than the experiment failing at its start.
    (Synchronous: the bottom trial at the point is sure to try.)"""
    results = _local_sweep(tmp_path, _asks_too_much, 4)
    assert not results.errors
    _, entries, rows = check_exploits(tmp_path / "pbt", 4)
    assert not entries
    assert all(r["cpu_given"] == 0.5 for its in rows.values() for r in its)
    err = capfd.readouterr().err
    assert "does not exploit" in err and "{'cpu': 1000.0" in err and "Fix:" in err, err


DRIVER = """
import json, sys
import ftnb
from ftnb.execution.ray import RayExecutor
from pbt_sweeps import LRS, flip_cpu, pbt, train

args = json.loads(sys.argv[1])
grid = ftnb.Tuner(
    ftnb.with_resources(train, lambda config: {"cpu": config["cpu"]}),
    param_space={"lr": ftnb.grid_search(LRS), "cpu": 0.5, "sleep": 0.25,
                 "marks": args["marks"], "hold_at": 5},
    tune_config=ftnb.TuneConfig(metric="score", mode="max",
                                # (synchronous: exploits are sure to happen, however far apart
                                # the actors started)
                                scheduler=pbt(custom_explore_fn=flip_cpu, synch=True)),
    run_config=ftnb.RunConfig(
        name="pbt", storage_path=args["storage"], verbose=0,
        executor=RayExecutor(args["address"], shared_storage=True),
        stop={"training_iteration": args["iterations"]},
        failure_config=ftnb.FailureConfig(max_failures=2)),
).fit()
print("DONE", sorted(r.metrics["training_iteration"] for r in grid), flush=True)
"""


@pytest.mark.ray
@pytest.mark.slow
def test_pbt_on_ray_with_a_node_removed_mid_run(tmp_path, ray_cluster):
    marks, storage = tmp_path / "marks", tmp_path / "results"
    marks.mkdir()
    process = run_script(tmp_path, DRIVER, json.dumps({
        "address": ray_cluster.address, "storage": str(storage), "marks": str(marks),
        "iterations": RAY_ITERATIONS}))
    exp = storage / "pbt"

    # The first trial at iteration 5 (after the exploits at 2 and 4, before the one at 6)
    # waits on its node until the node is gone: a node surely running a trial (in synchronous
    # PBT the trials wait at each point without an actor, so a node picked from the trials'
    # marks could be running none of them by the time it is removed).
    node_id = wait_for(lambda: (marks / "held").exists() and (marks / "held").read_text(),
                       300, "a trial held at iteration 5")
    node = next(n for n in ray_cluster.list_all_nodes() if n.node_id == node_id)
    ray_cluster.remove_node(node, allow_graceful=False)
    (marks / "release").touch()  # (its next attempt, elsewhere, goes on)
    ray_cluster.add_node(num_cpus=1)  # the next test finds three worker nodes again
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    assert f"DONE {[RAY_ITERATIONS] * len(LRS)}" in out, out
    state, entries, rows = check_exploits(exp, RAY_ITERATIONS, failure_kinds=("node_lost",))
    assert entries
    # The node went with the trials it ran: each restarted from its checkpoint, counted.
    lost = [f for t in state.trials for f in t.failures]
    assert lost and all(f.kind == "node_lost" and f.counted for f in lost), lost
    _check_resources(entries, rows)
