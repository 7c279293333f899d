"""Training loops for the data-parallel tests (tests/test_torch_trainer.py): a small DDP model
that checkpoints every step and leaves files the tests read: ``pid-<attempt>-<rank>`` (the
rank's process), ``progress-<rank>`` (``<attempt> <step>``), ``shard-<name>-<rank>.json``. A
file ``raise-<rank>`` makes that rank raise at its next step (once: it removes the file)."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time

import ftnb
import ftnb.torch  # noqa: F401  (get_device in gpu_loop)


def ddp_loop(config: dict) -> None:
    import torch
    import torch.distributed as dist

    import ftnb.torch

    ctx = ftnb.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.attempt
    folder = pathlib.Path(config["dir"])
    (folder / f"pid-{attempt}-{rank}").write_text(str(os.getpid()))
    assert dist.is_initialized() and dist.get_world_size() == ctx.get_world_size()
    assert os.environ["RANK"] == str(rank) and os.environ["WORLD_SIZE"] == str(ctx.get_world_size())
    assert os.environ["MASTER_PORT"] and os.environ["LOCAL_RANK"] == str(ctx.get_local_rank())
    torch.manual_seed(0)
    model = ftnb.torch.prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as path:
            saved = torch.load(os.path.join(path, "state.pt"))
        model.module.load_state_dict(saved["model"])
        start = saved["step"]
    for step in range(start, config["steps"]):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        flag = folder / f"raise-{rank}"
        if flag.exists():
            flag.unlink()
            raise ValueError(f"planned failure in rank {rank} at step {step + 1}")
        time.sleep(config.get("sleep", 0.05))
        saved_dir = None
        if rank == 0:
            saved_dir = tempfile.mkdtemp()
            torch.save({"model": model.module.state_dict(), "step": step + 1},
                       os.path.join(saved_dir, "state.pt"))
        ftnb.report({"loss": float(loss), "step": step + 1},
                    checkpoint=ftnb.Checkpoint.from_directory(saved_dir) if saved_dir else None)
        (folder / f"progress-{rank}").write_text(f"{attempt} {step + 1}")


def shard_loop(config: dict) -> None:
    """Write this rank's share of every dataset, as a list of the items' ids."""
    ctx = ftnb.get_context()
    rank = ctx.get_world_rank()
    folder = pathlib.Path(config["dir"])
    for name in config["names"]:
        shard = ftnb.get_dataset_shard(name)
        if name == "frame":
            ids = [int(v) for v in shard["id"]]
        elif name == "torch":
            ids = [int(shard[i][0]) for i in range(len(shard))]
        else:
            ids = [int(v) for v in shard]
        (folder / f"shard-{name}-{rank}.json").write_text(json.dumps(ids))
    ftnb.report({"done": 1})


def gpu_loop(config: dict) -> None:
    """Each rank on its own GPU with NCCL; rank 1 runs out of GPU memory in the first attempt."""
    import torch
    import torch.distributed as dist

    ctx = ftnb.get_context()
    rank, attempt = ctx.get_world_rank(), ctx.attempt
    folder = pathlib.Path(config["dir"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    (folder / f"gpu-{attempt}-{rank}.json").write_text(json.dumps({
        "visible": visible, "count": torch.cuda.device_count(),
        "backend": dist.get_backend(), "device": str(ftnb.torch.get_device())}))
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, config["steps"]):
        value = torch.ones(1, device="cuda") * (rank + 1)
        dist.all_reduce(value)
        if step == 2 and rank == 1 and attempt == 1:
            torch.empty(1 << 45, dtype=torch.uint8, device="cuda")  # 32 TiB: a CUDA OOM
        saved = tempfile.mkdtemp()
        open(os.path.join(saved, "step"), "w").write(str(step + 1))
        ftnb.report({"sum": float(value.item())}, checkpoint=ftnb.Checkpoint.from_directory(saved))


def slow_shard_loop(config: dict) -> None:
    """Reports ``len(shard)`` every 0.1 s for ``steps`` steps, checkpointing each."""
    shard = ftnb.get_dataset_shard("train")
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as path:
            start = int(open(os.path.join(path, "step")).read())
    for step in range(start, config["steps"]):
        time.sleep(0.1)
        saved = tempfile.mkdtemp()
        open(os.path.join(saved, "step"), "w").write(str(step + 1))
        ftnb.report({"n": len(shard)}, checkpoint=ftnb.Checkpoint.from_directory(saved))
