"""The GPU suite (issue 28): what only a machine with NVIDIA GPUs can show. NCCL groups over the
GPUs present with one device per rank, a rank SIGKILLed and the group re-formed on its GPUs,
an elastic shrink and grow over GPUs (two or more), a CUDA out-of-memory error classified as
``oom``, and two trials sharing one GPU (``{"gpu": 0.5}``). Skipped without CUDA (CI has no GPU:
the CPU twins of these tests, with gloo, are test_elastic_training, test_torch_trainer and
test_oom_kills). On a GPU machine, from the repository root (under 8 minutes)::

    PYTHONPATH=. python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py

``FTNB_GPU_TESTS_SIMULATE=1`` runs the same tests on CPUs (gloo, no device checks, the OOM
raised by hand): it checks the tests' own code on a machine without a GPU, nothing more.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib

import pytest

import ftnb
from procs import state_trials

SIMULATE = os.environ.get("FTNB_GPU_TESTS_SIMULATE") == "1"


def _gpus() -> int:
    if SIMULATE:
        return 2
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _gpus()

pytestmark = [
    pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(300),
    pytest.mark.skipif(GPUS == 0, reason="needs an NVIDIA GPU (CUDA) and torch; "
                                         "FTNB_GPU_TESTS_SIMULATE=1 runs it on CPUs"),
]


def _scaling(num_workers, **kwargs):
    if SIMULATE:
        return ftnb.ScalingConfig(num_workers=num_workers, use_gpu=False,
                                  resources_per_worker={"CPU": 0.5}, **kwargs)
    return ftnb.ScalingConfig(num_workers=num_workers, use_gpu=True, **kwargs)


def _device_facts() -> dict:
    """This rank's device: its uuid (one physical GPU), the backend, what it sees."""
    import torch
    import torch.distributed as dist

    from ftnb.torch import get_device

    device = get_device()
    if not SIMULATE:
        assert device.type == "cuda", device
        assert torch.cuda.device_count() == 1  # one visible GPU a rank
        assert dist.get_backend() == "nccl", dist.get_backend()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    else:
        uuid = f"cpu-{os.getpid()}"
    return {"device": str(device), "uuid": uuid,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def gpu_steps(config):
    """A DDP-style loop: an all_reduce on this rank's device each step, a checkpoint each step
    (rank 0's), each rank's device facts to config["out"]. With config["kill_at"], the last rank
    of the first attempt SIGKILLs itself at that step."""
    import signal
    import tempfile

    import torch
    import torch.distributed as dist

    from ftnb.torch import get_device

    ctx = ftnb.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    device = get_device()
    step = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as folder:
            step = json.load(open(os.path.join(folder, "state.json")))["step"]
    facts = _device_facts()
    with open(os.path.join(config["out"], f"rank{rank}.attempt{ctx.attempt}.json"), "w") as f:
        json.dump(facts, f)
    while step < config["steps"]:
        total = torch.ones(1, device=device)
        dist.all_reduce(total)
        assert int(total.item()) == size
        if config.get("kill_at") == step and ctx.attempt == 1 and rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        step += 1
        folder = None
        if rank == 0:
            folder = tempfile.mkdtemp()
            json.dump({"step": step}, open(os.path.join(folder, "state.json"), "w"))
        ftnb.report({"step": step, "size": size},
                    checkpoint=ftnb.Checkpoint.from_directory(folder) if folder else None)


def _trainer(tmp_path, name, num_workers, steps=6, max_failures=0, **config):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return ftnb.TorchTrainer(
        gpu_steps, train_loop_config={"out": str(out), "steps": steps, **config},
        scaling_config=_scaling(num_workers),
        run_config=ftnb.RunConfig(name=name, storage_path=str(tmp_path / "runs"), verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=max_failures)))


def _facts(tmp_path, attempt=1) -> list[dict]:
    return [json.loads(p.read_text())
            for p in sorted((tmp_path / "out").glob(f"rank*.attempt{attempt}.json"))]


def _rows(tmp_path, name) -> list[dict]:
    (trial,) = state_trials(tmp_path / "runs" / name)
    path = tmp_path / "runs" / name / trial["dir_name"] / "result.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_an_nccl_group_gets_one_gpu_per_rank(tmp_path):
    n = min(GPUS, 4)
    result = _trainer(tmp_path, "nccl", n).fit()
    assert result.error is None, result.error
    facts = _facts(tmp_path)
    assert len(facts) == n
    assert len({f["uuid"] for f in facts}) == n, facts  # n physical GPUs, one a rank
    assert [r["step"] for r in _rows(tmp_path, "nccl")] == list(range(1, 7))


def test_a_killed_rank_restarts_the_group_on_its_gpus(tmp_path):
    n = min(GPUS, 4)
    result = _trainer(tmp_path, "killed", n, steps=8, max_failures=1, kill_at=3).fit()
    assert result.error is None, result.error
    (trial,) = state_trials(tmp_path / "runs" / "killed")
    assert [(f["kind"], f["counted"]) for f in trial["failures"]] == [("signal", True)]
    assert [r["step"] for r in _rows(tmp_path, "killed")] == list(range(1, 9))  # each once
    assert len(_facts(tmp_path, attempt=2)) == n  # the whole group again, on GPUs


@pytest.mark.skipif(GPUS < 2, reason="an elastic shrink and grow needs two GPUs or more")
def test_an_elastic_group_shrinks_on_a_lost_rank_and_grows_back_on_gpus(tmp_path):
    from test_elastic_training import shrink_then_grow

    out = tmp_path / "out"
    out.mkdir()
    top = min(GPUS, 3)
    result = ftnb.TorchTrainer(
        shrink_then_grow, train_loop_config={"out": str(out), "full": top},
        datasets={"train": list(range(12))},
        scaling_config=_scaling((top - 1, top), elastic_resize_monitor_interval_s=1.0),
        run_config=ftnb.RunConfig(name="elastic", storage_path=str(tmp_path / "runs"),
                                  verbose=0, failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    assert result.error is None, result.error
    (trial,) = state_trials(tmp_path / "runs" / "elastic")
    assert [a["num_workers"] for a in trial["attempts"]] == [top, top - 1, top], trial["attempts"]
    assert [(r["reason"], r["old_size"], r["new_size"]) for r in trial["resizes"]] == [
        ("rank lost", top, top - 1), ("capacity returned", top - 1, top)]


def cuda_oom(config):
    import torch

    ftnb.report({"step": 1})
    if SIMULATE:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # a petabyte: never fits


def test_a_cuda_out_of_memory_error_is_an_oom_failure(tmp_path):
    trainable = ftnb.with_resources(cuda_oom, {"cpu": 1, "gpu": 0 if SIMULATE else 1})
    grid = ftnb.Tuner(trainable, run_config=ftnb.RunConfig(
        name="oom", storage_path=str(tmp_path), verbose=0,
        failure_config=ftnb.FailureConfig(max_failures=0))).fit()
    assert grid[0].error is not None
    (trial,) = state_trials(tmp_path / "oom")
    assert [f["kind"] for f in trial["failures"]] == ["oom"], trial["failures"]


def half_a_gpu(config):
    """Says which GPU it has, then waits (60 s at most) for the other trial to say so too: both
    run at once on one GPU."""
    import time

    folder = pathlib.Path(config["out"])
    if SIMULATE:
        uuid = "cpu"
    else:
        import torch

        torch.ones(1, device="cuda")  # a CUDA context on it
        uuid = str(torch.cuda.get_device_properties(0).uuid)
    (folder / f"{config['x']}.json").write_text(json.dumps({"uuid": uuid}))
    deadline = time.monotonic() + 60
    while len(list(folder.glob("*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ftnb.report({"together": len(list(folder.glob("*.json"))) == 2})


def test_two_trials_share_one_gpu(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    trainable = ftnb.with_resources(half_a_gpu, {"cpu": 0.5, "gpu": 0 if SIMULATE else 0.5})
    grid = ftnb.Tuner(trainable, param_space={"out": str(out), "x": ftnb.grid_search([1, 2])},
                      tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
                      run_config=ftnb.RunConfig(name="shared", storage_path=str(tmp_path),
                                                verbose=0)).fit()
    assert [r.metrics.get("together") for r in grid] == [True, True], [r.error for r in grid]
    uuids = {json.loads(p.read_text())["uuid"] for p in out.glob("*.json")}
    assert len(uuids) == 1, uuids  # the same physical GPU
