"""A node drained for preemption on a real Ray cluster (``ray_cluster``), as a cloud autoscaler
drains a spot instance it is about to lose (the GCS's ``DrainNode``, reason PREEMPTION, with a
deadline): the trial on it is told in time, takes a just-in-time checkpoint and restarts on
another node from it; one that does not checkpoint when told is ended at the deadline; a
``TorchTrainer`` group with a rank on the drained node is told on every rank, checkpoints
together and restarts on the nodes left. Either way it is a preemption, not counted against
``max_failures``, and no iteration is done twice."""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

from procs import run_script, state_trials, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = """
import json, sys
import ftnb
from ftnb.execution.ray import RayExecutor
import ray_trainables

args = json.loads(sys.argv[1])
executor = RayExecutor(args["address"], shared_storage=True)
config = {"dir": args["dir"], "steps": args["steps"], "sleep": args["sleep"],
          "every": args["every"], "ignore_told": args["ignore_told"],
          "hold_at": args.get("hold_at")}  # (see ray_trainables)
run_config = ftnb.RunConfig(
    name="run", storage_path=args["storage"], verbose=0, executor=executor,
    failure_config=ftnb.FailureConfig(max_failures=0))  # a counted failure would end it
grid = ftnb.run(ray_trainables.leaves_when_told, name="run", param_space=config,
                run_config=run_config)
print("DONE", grid[0].metrics["training_iteration"], flush=True)
"""


class Run:
    def __init__(self, tmp_path: pathlib.Path, cluster, **args) -> None:
        self.folder = tmp_path / "marks"
        self.folder.mkdir(exist_ok=True)
        self.storage = tmp_path / "results"
        self.tmp_path = tmp_path
        self.args = {"address": cluster.address, "dir": str(self.folder),
                     "storage": str(self.storage), "sleep": 0.2, "every": 1000,
                     "ignore_told": False, **args}

    def start(self, driver: str = DRIVER):
        self.process = run_script(self.tmp_path, driver, json.dumps(self.args))
        return self

    def finish(self, timeout: float = 120) -> str:
        out, _ = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, out
        return out

    def progress(self, rank: int = 0):
        try:
            attempt, step, node, pid = (self.folder / f"progress-{rank}").read_text().split()
        except (OSError, ValueError):
            return None
        return int(attempt), int(step), node, int(pid)

    def wait_step(self, attempt: int, step: int, timeout: float = 60, rank: int = 0):
        return wait_for(lambda: (p := self.progress(rank)) and p[:2] >= (attempt, step) and p,
                        timeout, f"rank {rank} at step {step} of attempt {attempt}")

    def trial(self) -> dict:
        (trial,) = state_trials(self.storage / "run")
        return trial

    def trial_dir(self) -> pathlib.Path:
        return self.storage / "run" / self.trial()["dir_name"]

    def iterations(self) -> list[int]:
        return [json.loads(line)["training_iteration"]
                for line in (self.trial_dir() / "result.json").read_text().splitlines()
                if line.strip()]


def _drain(cluster, node_id: str, deadline_s: float) -> float:
    """Drain ``node_id`` for preemption, as an autoscaler does (what ``ray drain-node`` calls);
    returns when, by ``time.time()``."""
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=cluster.address)
    now = time.time()
    accepted, why = gcs.drain_node(node_id, autoscaler_pb2.DRAIN_NODE_REASON_PREEMPTION,
                                   "spot instance reclaimed (test)",
                                   int((now + deadline_s) * 1000))
    assert accepted, why
    return now


def _reclaim(cluster, node_id: str) -> None:
    """What the cloud does by the drain's deadline: the machine goes. The tests call it once the
    trial's next attempt runs on other nodes: nothing of the trial is left on the drained one, so
    waiting for the deadline itself (up to 15 s) would test nothing more (what the deadline does
    to an attempt still there, ending it, is the test of a trial that ignores being told, where
    it has passed by then). A node added back keeps three worker nodes for the next test."""
    node = next(node for node in cluster.list_all_nodes() if node.node_id == node_id)
    cluster.remove_node(node, allow_graceful=False)  # (its raylet may have left once idle)
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()


def _attempts_of_one_uncounted_preemption(run: Run) -> tuple[dict, dict]:
    """The trial finished after one preemption, not counted against max_failures: its two
    attempts."""
    trial = run.trial()
    assert trial["status"] == "TERMINATED"
    (failure,) = trial["failures"]
    assert failure["kind"] == "preemption" and not failure["counted"]
    first, second = trial["attempts"]
    assert first["outcome"] == "preempted"
    return first, second


def test_a_drained_nodes_trial_checkpoints_in_time_and_resumes_elsewhere(tmp_path, ray_cluster):
    steps, deadline_s = 20, 8.0
    # Held at step 3 until its node is drained: surely running there, with steps left to be
    # told in (as in tests/test_ray_cluster.py).
    run = Run(tmp_path, ray_cluster, steps=steps, hold_at=3).start()
    _, _, node_id, _ = run.wait_step(1, 3)
    drained_at = _drain(ray_cluster, node_id, deadline_s)
    (run.folder / "release").touch()
    run.wait_step(2, 1)  # the next attempt reports, on another node
    _reclaim(ray_cluster, node_id)
    out = run.finish()
    assert f"DONE {steps}" in out

    first, second = _attempts_of_one_uncounted_preemption(run)
    told_attempt, told_step, told_time = (tmp_path / "marks" / "told").read_text().split()
    assert (int(told_attempt), int(told_step)) == (1, first["end_iteration"])
    assert second["start_iteration"] == first["end_iteration"]  # from the just-in-time one
    assert second["restored_from"] is not None
    assert run.progress()[2] != node_id
    assert run.iterations() == list(range(1, steps + 1))

    checkpoint = run.trial_dir() / second["restored_from"]
    saved_at = max(os.path.getmtime(p) for p in checkpoint.rglob("*"))
    drain_to_checkpoint = saved_at - drained_at
    print(f"drain -> just-in-time checkpoint persisted: {drain_to_checkpoint:.2f} s "
          f"(told at step {told_step}, {float(told_time) - drained_at:.2f} s after the drain)")
    assert drain_to_checkpoint < deadline_s


def test_a_trial_that_does_not_checkpoint_when_told_is_ended_at_the_deadline(tmp_path,
                                                                            ray_cluster):
    steps, every, deadline_s = 15, 5, 2.0  # (a checkpoint every 5 steps)
    # Step 9 waits (a step that never ends): its next checkpoint, at 10, surely does not come
    # before the deadline, however late the drain or the end at the deadline on a loaded machine.
    run = Run(tmp_path, ray_cluster, steps=steps, every=every, ignore_told=True,
              hold_at=2 * every - 1).start()
    _, _, node_id, _ = run.wait_step(1, every + 1)
    drained_at = _drain(ray_cluster, node_id, deadline_s)
    run.wait_step(2, 1, timeout=deadline_s + 30)
    _reclaim(ray_cluster, node_id)
    out = run.finish()
    assert f"DONE {steps}" in out

    first, second = _attempts_of_one_uncounted_preemption(run)
    assert first["ended"] >= drained_at + deadline_s - 0.1  # it ran until the deadline
    assert first["end_iteration"] > every and second["start_iteration"] == every
    assert not (tmp_path / "marks" / "told").exists()
    assert run.progress()[2] != node_id
    assert run.iterations() == list(range(1, steps + 1))


GROUP_DRIVER = """
import json, os, pathlib, sys, tempfile, time
import ftnb
from ftnb.execution.ray import RayExecutor
from ray_trainables import wait_for_release


def group_leaves_when_told(config):
    # Each rank notes when it is told (told-<rank>); the group checkpoints once every rank
    # was told (an all_reduce of the flags), so a rank never told keeps it from checkpointing.
    import torch
    import torch.distributed as dist
    import ray

    folder = pathlib.Path(config["dir"])
    ctx = ftnb.get_context()
    rank = ctx.get_world_rank()
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, config["steps"]):
        time.sleep(config["sleep"])
        told = ctx.should_checkpoint
        if told and not (folder / f"told-{rank}").exists():
            (folder / f"told-{rank}").write_text(f"{ctx.attempt} {step + 1}")
        everyone = torch.tensor([1.0 if told else 0.0])
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
        checkpoint = None
        if rank == 0 and everyone.item() == 1.0:
            saved = tempfile.mkdtemp()
            open(os.path.join(saved, "step"), "w").write(str(step + 1))
            checkpoint = ftnb.Checkpoint.from_directory(saved)
        (folder / f"progress-{rank}").write_text(
            f"{ctx.attempt} {step + 1} {ray.get_runtime_context().get_node_id()} {os.getpid()}")
        ftnb.report({"step": step + 1}, checkpoint=checkpoint)  # ends a told attempt
        if ctx.attempt == 1 and step + 1 == config.get("hold_at"):
            wait_for_release(folder)  # (as ray_trainables' trainables do)


args = json.loads(sys.argv[1])
result = ftnb.TorchTrainer(
    group_leaves_when_told,
    train_loop_config={"dir": args["dir"], "steps": args["steps"], "sleep": args["sleep"],
                       "hold_at": args.get("hold_at")},
    scaling_config=ftnb.ScalingConfig(num_workers=2),
    run_config=ftnb.RunConfig(
        name="run", storage_path=args["storage"], verbose=0,
        executor=RayExecutor(args["address"], shared_storage=True),
        failure_config=ftnb.FailureConfig(max_failures=0))).fit()  # a counted failure ends it
print("DONE", result.metrics["training_iteration"], flush=True)
"""


def test_a_group_with_a_rank_on_a_drained_node_checkpoints_together_and_restarts(tmp_path,
                                                                                ray_cluster):
    pytest.importorskip("torch")
    steps, deadline_s = 15, 15.0
    # Both ranks held at step 3 until the node is drained (as in the test above).
    run = Run(tmp_path, ray_cluster, steps=steps, hold_at=3).start(GROUP_DRIVER)
    rank0 = run.wait_step(1, 3, rank=0, timeout=120)
    rank1 = run.wait_step(1, 3, rank=1)
    assert rank0[2] != rank1[2]  # one CPU a node: the ranks are on two nodes
    drained = rank1[2]  # rank 0's node stays: it must be told all the same
    _drain(ray_cluster, drained, deadline_s)
    (run.folder / "release").touch()
    run.wait_step(2, 1, rank=1, timeout=deadline_s + 60)  # the next attempt runs
    _reclaim(ray_cluster, drained)
    out = run.finish()
    assert f"DONE {steps}" in out

    first, second = _attempts_of_one_uncounted_preemption(run)
    told = [(tmp_path / "marks" / f"told-{rank}").read_text().split() for rank in (0, 1)]
    assert all(attempt == "1" for attempt, _ in told)  # every rank was told, in attempt 1
    # The group checkpointed at the first step every rank knew, and went on from there.
    assert first["end_iteration"] == max(int(step) for _, step in told)
    assert second["start_iteration"] == first["end_iteration"]
    assert second["restored_from"] is not None and second["num_workers"] == 2
    assert drained not in {run.progress(rank)[2] for rank in (0, 1)}
    assert run.iterations() == list(range(1, steps + 1))
