"""Trainables of the checkpoint-upload tests (issue 29), importable by driver scripts and trial
processes. They talk to the test through files in ``config["side"]``, a local folder:

* ``pid.<attempt>``: the trial process's pid;
* ``returned.<attempt>``: one line per report that returned (its step);
* ``uploading.<dir_name>``: a gated upload has written part of its files and waits for
  ``open.<dir_name>`` (or ``open.all``) before it writes the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time

import ftnb


def _note(side: str, name: str, text: str) -> None:
    with open(os.path.join(side, name), "a") as f:
        f.write(text + "\n")


def gated_upload(side: str):
    """A checkpoint_upload_fn that writes the checkpoint's state.json to the trial's folder
    under dir_name, then waits for the test to open its gate, then writes the other files."""

    def upload(checkpoint: ftnb.Checkpoint, dir_name: str) -> ftnb.Checkpoint:
        dest = os.path.join(ftnb.get_context().get_trial_dir(), dir_name)
        os.makedirs(dest, exist_ok=True)
        with checkpoint.as_directory() as src:
            shutil.copy(os.path.join(src, "state.json"), dest)
            _note(side, f"uploading.{dir_name}", "1")
            while not (os.path.exists(os.path.join(side, f"open.{dir_name}"))
                       or os.path.exists(os.path.join(side, "open.all"))):
                time.sleep(0.02)
            for name in os.listdir(src):
                if name != "state.json":
                    shutil.copy(os.path.join(src, name), dest)
        return ftnb.Checkpoint(dest)

    return upload


def async_train(config: dict) -> None:
    """``n`` steps, each reporting a checkpoint (``size`` random bytes and state.json) with
    ``mode``; ``gated``: through :func:`gated_upload`; ``kill_after``: SIGKILL itself right after
    that step's report returned, in its first attempt."""
    side = config["side"]
    attempt = ftnb.get_context().attempt
    _note(side, f"pid.{attempt}", str(os.getpid()))
    start = 0
    restored = ftnb.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["step"]
            assert os.path.getsize(os.path.join(d, "weights.bin")) == config["size"]
    mode = ftnb.CheckpointUploadMode[config.get("mode", "ASYNC")]
    upload_fn = gated_upload(side) if config.get("gated") else None
    for step in range(start, config["n"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step + 1}, f)
            with open(os.path.join(d, "weights.bin"), "wb") as f:
                f.write(os.urandom(config["size"]))
            started = time.monotonic()
            ftnb.report({"step": step + 1, "resumed_from": start},
                        checkpoint=ftnb.Checkpoint.from_directory(d),
                        checkpoint_upload_mode=mode, checkpoint_upload_fn=upload_fn)
            inside = time.monotonic() - started
        # (the TemporaryDirectory is gone here: an ASYNC upload must not need it)
        _note(side, f"returned.{attempt}", json.dumps({"step": step + 1, "inside_s": inside}))
        if attempt == 1 and config.get("kill_after") == step + 1:
            os.kill(os.getpid(), signal.SIGKILL)


def group_loop(config: dict) -> None:
    """Every rank of a TorchTrainer group reports an ASYNC checkpoint each step
    (``state.rank<r>.json``: merged into one folder); ``bad_rank``: that rank passes an unknown
    upload mode at step 2."""
    ctx = ftnb.get_context()
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as d:
            start = json.load(open(os.path.join(d, f"state.rank{ctx.get_world_rank()}.json")))[
                "step"]
    for step in range(start, config["n"]):
        mode = ftnb.CheckpointUploadMode.ASYNC
        if step + 1 == 2 and ctx.get_world_rank() == config.get("bad_rank"):
            mode = "LATER"
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"state.rank{ctx.get_world_rank()}.json"), "w") as f:
                json.dump({"step": step + 1, "rank": ctx.get_world_rank()}, f)
            ftnb.report({"step": step + 1, "rank": ctx.get_world_rank()},
                        checkpoint=ftnb.Checkpoint.from_directory(d),
                        checkpoint_upload_mode=mode)


def dcp_loop(config: dict) -> None:
    """Each rank of a 2-rank gloo group saves its part of the state with
    torch.distributed.checkpoint into its own temporary folder and reports it (``mode``); the
    files merge into one checkpoint. After a planned failure of rank 1 (first attempt, step 3)
    every rank restores the whole folder with dcp.load and writes what it loaded to ``side``.
    ``clash``: every rank also writes ``same.txt`` (two ranks, one file name: an error)."""
    import torch
    import torch.distributed.checkpoint as dcp

    ctx = ftnb.get_context()
    rank, attempt, side = ctx.get_world_rank(), ctx.attempt, config["side"]
    start = 0
    restored = ftnb.get_checkpoint()
    if restored is not None:
        state = {f"w{rank}": torch.zeros(4), "step": torch.tensor(0)}
        with restored.as_directory() as d:
            dcp.load(state, checkpoint_id=d)
            files = sorted(os.listdir(d))
        start = int(state["step"])
        _note(side, f"loaded.{attempt}.{rank}",
              json.dumps({"step": start, "w": state[f"w{rank}"].tolist(), "files": files}))
    for step in range(start, config["n"]):
        if attempt == 1 and rank == 1 and step + 1 == 3:
            raise ValueError("planned failure of rank 1 at step 3")
        state = {f"w{rank}": torch.full((4,), float(10 * rank + step + 1)),
                 "step": torch.tensor(step + 1)}
        with tempfile.TemporaryDirectory() as d:
            dcp.save(state, checkpoint_id=d)
            if config.get("clash"):
                open(os.path.join(d, "same.txt"), "w").write(str(rank))
            ftnb.report({"step": step + 1, "rank": rank},
                        checkpoint=ftnb.Checkpoint.from_directory(d),
                        checkpoint_upload_mode=ftnb.CheckpointUploadMode[config["mode"]])
