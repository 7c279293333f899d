"""Trainables for the Ray cluster tests (tests/test_ray_cluster.py): each step leaves
``progress-<rank>`` (``attempt step node_id pid``) in ``config["dir"]``. With
``config["hold_at"]`` (a step), ``stepper``, ``group_stepper`` and ``leaves_when_told`` wait in
attempt 1 at that step, its progress written, until ``release`` exists in ``config["dir"]``
(120 s at most): a trial surely running on a known node (and not done) when the test acts."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time

import ftnb


def _node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def wait_for_release(folder) -> None:
    """Wait until ``folder/release`` exists (a test's go-ahead), 120 s at most."""
    release = pathlib.Path(folder, "release")
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _hold(config: dict, step: int, attempt: int) -> None:
    if step == config.get("hold_at") and attempt == 1:
        wait_for_release(config["dir"])


def stepper(config: dict) -> None:
    """A checkpoint every step; ``steps`` steps of ``sleep`` seconds."""
    folder = pathlib.Path(config["dir"])
    ctx = ftnb.get_context()
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, config["steps"]):
        time.sleep(config.get("sleep", 0.2))
        saved = tempfile.mkdtemp()
        open(os.path.join(saved, "step"), "w").write(str(step + 1))
        ftnb.report({"step": step + 1}, checkpoint=ftnb.Checkpoint.from_directory(saved))
        (folder / f"progress-{ctx.get_world_rank()}").write_text(
            f"{ctx.attempt} {step + 1} {_node()} {os.getpid()}")
        _hold(config, step + 1, ctx.attempt)


def group_stepper(config: dict) -> None:
    """``stepper`` in a 2-rank gloo group, with an all_reduce each step."""
    import torch
    import torch.distributed as dist

    folder = pathlib.Path(config["dir"])
    ctx = ftnb.get_context()
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, config["steps"]):
        value = torch.ones(1)
        dist.all_reduce(value)
        assert int(value.item()) == ctx.get_world_size()
        time.sleep(config.get("sleep", 0.2))
        saved = None
        if ctx.get_world_rank() == 0:
            saved = tempfile.mkdtemp()
            open(os.path.join(saved, "step"), "w").write(str(step + 1))
        ftnb.report({"step": step + 1},
                    checkpoint=ftnb.Checkpoint.from_directory(saved) if saved else None)
        (folder / f"progress-{ctx.get_world_rank()}").write_text(
            f"{ctx.attempt} {step + 1} {_node()} {os.getpid()}")
        _hold(config, step + 1, ctx.attempt)


def leaves_when_told(config: dict) -> None:
    """``steps`` steps of ``sleep`` seconds; a checkpoint every ``every`` steps, and one at once
    when ``ftnb.get_context().should_checkpoint`` (its node is being drained), unless
    ``ignore_told``. A just-in-time checkpoint leaves ``told`` (``attempt step time``). With
    ``hold_at``, attempt 1 waits after that step's report, as in ``stepper``."""
    folder = pathlib.Path(config["dir"])
    ctx = ftnb.get_context()
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, config["steps"]):
        time.sleep(config.get("sleep", 0.2))
        told = ctx.should_checkpoint and not config.get("ignore_told")
        checkpoint = None
        if told or (step + 1) % config.get("every", 1) == 0:
            saved = tempfile.mkdtemp()
            open(os.path.join(saved, "step"), "w").write(str(step + 1))
            checkpoint = ftnb.Checkpoint.from_directory(saved)
        if told:
            (folder / "told").write_text(f"{ctx.attempt} {step + 1} {time.time()}")
        (folder / f"progress-{ctx.get_world_rank()}").write_text(
            f"{ctx.attempt} {step + 1} {_node()} {os.getpid()}")
        ftnb.report({"step": step + 1}, checkpoint=checkpoint)  # ends a told attempt
        _hold(config, step + 1, ctx.attempt)


def uses_objects(config: dict) -> None:
    """Reports what it sees of the ``ftnb.put`` objects ``array`` (numpy) and ``frame``
    (pandas) of its config, and where it runs."""
    array, frame = config["array"], config["frame"]
    for _ in range(3):
        time.sleep(0.2)
        ftnb.report({"array_sum": float(array.sum()), "frame_sum": float(frame["b"].sum()),
                     "rows": len(frame), "array_type": type(array).__name__,
                     "frame_type": type(frame).__name__, "node": _node(),
                     "value": config["lr"] * float(array[0])})


def loud_family_hangs_once(config: dict) -> None:
    """For tests/test_ray_edges.py: each attempt starts a family of stray processes
    (tests/stray_family.py, pids into ``config["pids"]``), notes the cgroup it runs in, prints
    ``config["lines"]`` lines of 100 bytes between a ``FIRST-attempt-N`` and a
    ``LAST-attempt-N`` line (attempt 2 and later: those two alone), and reports 3 steps with a
    checkpoint each; attempt 1 hangs after step 2."""
    import sys

    from stray_family import start_family_into

    ctx = ftnb.get_context()
    start_family_into(config["pids"])
    with open("/proc/self/cgroup") as f:
        cgroup = next(line.strip() for line in f if line.startswith("0::"))
    print(f"FIRST-attempt-{ctx.attempt}")
    if ctx.attempt == 1:
        for i in range(config["lines"]):
            sys.stdout.write(f"line {i:08d} ".ljust(99, "x") + "\n")
    print(f"LAST-attempt-{ctx.attempt}", flush=True)
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, 3):
        saved = tempfile.mkdtemp()
        open(os.path.join(saved, "step"), "w").write(str(step + 1))
        ftnb.report({"step": step + 1, "cgroup": cgroup},
                    checkpoint=ftnb.Checkpoint.from_directory(saved))
        if ctx.attempt == 1 and step + 1 == 2:
            time.sleep(600)  # hung: the hang watch ends it


def elastic_stepper(config: dict) -> None:
    """``group_stepper`` for an elastic group: a checkpoint every step; attempt 1 holds at
    ``hold_at`` (its node is removed there); the loop ends after two steps at full size
    (``full``) following a smaller group, or at a 240 s deadline (the test then fails on the
    sizes)."""
    import torch
    import torch.distributed as dist

    folder = pathlib.Path(config["dir"])
    ctx = ftnb.get_context()
    size = ctx.get_world_size()
    state = {"step": 0, "shrunk": False, "full_after": 0}
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            state = json.load(open(os.path.join(path, "state.json")))
    deadline = time.monotonic() + 240
    while True:
        value = torch.ones(1)
        dist.all_reduce(value)
        assert int(value.item()) == size == dist.get_world_size()
        time.sleep(config.get("sleep", 0.2))
        state["shrunk"] = state["shrunk"] or size < config["full"]
        if state["shrunk"] and size == config["full"]:
            state["full_after"] += 1
        state["step"] += 1
        saved = None
        if ctx.get_world_rank() == 0:
            saved = tempfile.mkdtemp()
            json.dump(state, open(os.path.join(saved, "state.json"), "w"))
        ftnb.report({"step": state["step"], "size": size},
                    checkpoint=ftnb.Checkpoint.from_directory(saved) if saved else None)
        (folder / f"progress-{ctx.get_world_rank()}").write_text(
            f"{ctx.attempt} {state['step']} {_node()} {os.getpid()}")
        _hold(config, state["step"], ctx.attempt)
        if state["full_after"] >= 2 or time.monotonic() > deadline:
            return
