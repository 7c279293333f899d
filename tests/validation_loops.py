"""The training loop and validation functions of tests/test_validation.py (importable by the
trial's processes and by the validation's own process)."""

from __future__ import annotations

import json
import os
import tempfile
import time

import ftnb


def _note(side: str, name: str, text: str = "") -> None:
    with open(os.path.join(side, name), "a") as f:
        f.write(text + "\n")


def train_loop(config: dict) -> None:
    """``n`` steps on two gloo ranks; rank 0 reports a checkpoint (state.json) with
    ``validation=True``, rank 1 reports none (its validation flag is ignored, as in Ray). After
    its first report, rank 0 waits until the validation of step 1 has started; after its last
    report returned, it writes ``train_done``, which a validation waits for: so the steps after
    the first run while step 1's validation runs, and a report that waited for a validation
    would never return."""
    import torch
    import torch.distributed as dist

    side = config["side"]
    rank = ftnb.get_context().get_world_rank()
    _note(side, f"rank.{rank}", str(os.getpid()))
    restored = ftnb.get_checkpoint()
    start = _step_of(restored) if restored is not None else 0
    for step in range(start, config["n"]):
        t = torch.ones(1)
        dist.all_reduce(t)  # a real gloo group
        metrics = {"loss": 1.0 / (step + 1), "ranks": int(t.item())}
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step + 1}, f)
                ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d),
                            validation=True, checkpoint_upload_mode=config["mode"])
            _note(side, f"reported.{step + 1}")
            if step == 0:
                _wait_for(os.path.join(side, "val_started.1"))
        else:
            ftnb.report(metrics, validation=True)
    if rank == 0:
        _note(side, "train_done")


def _step_of(checkpoint: ftnb.Checkpoint) -> int:
    with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
        return json.load(f)["step"]


def _reported(side: str) -> list[int]:
    return sorted(int(n.split(".")[1]) for n in os.listdir(side) if n.startswith("reported."))


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after 60 s")
        time.sleep(0.05)


def validate(checkpoint: ftnb.Checkpoint, side: str, crash_step: int = 0,
             gate: str = "train_done") -> dict:
    """Waits (60 s at most) for the file ``gate`` in ``side``, then scores the checkpoint:
    val_loss = |step - 2| + 0.5 (step 2 is the best, not the last); raises at ``crash_step``."""
    step = _step_of(checkpoint)
    # (its pid, and the steps reported when it started and when it ended)
    _note(side, f"val_started.{step}", f"{os.getpid()} {json.dumps(_reported(side))}")
    _wait_for(os.path.join(side, gate))  # training must get there without this validation
    if step == crash_step:
        raise ValueError(f"validation of step {step} crashed on purpose")
    _note(side, f"val_done.{step}", json.dumps(_reported(side)))
    return {"val_loss": abs(step - 2) + 0.5, "loss": -1.0, "val_step": step}


def small_loop(config: dict) -> None:
    """Two reports with a checkpoint and ``validation=True``, no process group."""
    for step in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            ftnb.report({"loss": float(step)}, checkpoint=ftnb.Checkpoint.from_directory(d),
                        validation=True)


def score(checkpoint: ftnb.Checkpoint, offset: float = 0.0) -> dict:
    return {"val_loss": offset - _step_of(checkpoint)}
