"""The data-parallel training loop of the rank-group workloads, run by every rank.

One function, :func:`group_loop`, for all three frameworks: ``ftnb.TorchTrainer`` and Ray
Train's ``TorchTrainer`` call it as their ``train_loop_per_worker``; under ``torchrun`` each
worker runs ``python -m bench.group_loop CONFIG_JSON``, which sets up the process group from the
variables torchrun sets (as the trainers do before they call the loop) and calls it. What
differs between frameworks is behind :func:`rank_api`: the rank, the checkpoint to resume from,
``report()``, and wrapping the model in DDP.

The loop trains a small MLP on a fixed batch (gloo, one thread per rank). Rank 0 saves a
checkpoint (model, optimizer, step; ``torch.save``) every ``checkpoint_every`` steps; every
rank calls ``report()`` every ``report_every`` steps. Under torchrun, ``report()`` is what a
plain script does: rank 0 appends the metrics to a file, and writes its checkpoint into a new
folder that it renames into place (``checkpoint_NNNNNN``, the two newest kept); a restarted
worker resumes from the newest such folder.

Events (``trainables.log_event``, in ``config["out_dir"]``): ``entry`` at the loop's first line,
``start`` (rank, pid, the step it resumes from) once the model, the optimizer and the
checkpoint are loaded, ``first_step`` once its first step (and that step's
report) is done, with ``config["log_checkpoints"]`` ``checkpointed`` (rank 0: a report with a
checkpoint returned), ``timing`` at the end (the steps/s figures of ``ddp_steps``: the time
from step ``timed_from`` on, and of each window between two reports). With
``config["stop_file"]``, the ranks agree every step (an all-reduce of one number) whether that
file exists, and all stop at the same step once it does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

from .trainables import log_event

STATE_FILE = "state.pt"
METRICS_FILE = "metrics.jsonl"
_CHECKPOINT_PREFIX = "checkpoint_"


class _RankAPI:
    """What the loop needs from its framework (see :func:`rank_api`)."""

    rank: int

    def checkpoint_dir(self) -> Any:
        """A context manager giving the folder of the checkpoint to resume from, or None."""
        raise NotImplementedError

    def report(self, metrics: dict, checkpoint_dir: Optional[str]) -> None:
        raise NotImplementedError

    def prepare_model(self, model: Any) -> Any:
        raise NotImplementedError


class _TrainerAPI(_RankAPI):
    """ftnb and Ray Train spell it the same way: ``get_context``, ``get_checkpoint``,
    ``report``, ``Checkpoint``, ``<module>.torch.prepare_model``."""

    def __init__(self, module: Any, prepare_model: Any) -> None:
        self.module = module
        self.rank = module.get_context().get_world_rank()
        self._prepare_model = prepare_model

    def checkpoint_dir(self) -> Any:
        import contextlib

        ckpt = self.module.get_checkpoint()
        return ckpt.as_directory() if ckpt is not None else contextlib.nullcontext(None)

    def report(self, metrics: dict, checkpoint_dir: Optional[str]) -> None:
        checkpoint = None
        if checkpoint_dir is not None:
            checkpoint = self.module.Checkpoint.from_directory(checkpoint_dir)
        self.module.report(metrics, checkpoint=checkpoint)

    def prepare_model(self, model: Any) -> Any:
        return self._prepare_model(model)


class _TorchrunAPI(_RankAPI):
    """A plain torchrun script: file checkpoints in ``config["checkpoint_root"]``."""

    def __init__(self, config: dict) -> None:
        import torch.distributed as dist

        self.rank = dist.get_rank()
        self.root = config["checkpoint_root"]
        self.metrics_path = os.path.join(self.root, METRICS_FILE)

    def _complete(self) -> list[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.startswith(_CHECKPOINT_PREFIX) and n[11:].isdigit())

    def checkpoint_dir(self) -> Any:
        import contextlib

        done = self._complete()
        return contextlib.nullcontext(os.path.join(self.root, done[-1]) if done else None)

    def report(self, metrics: dict, checkpoint_dir: Optional[str]) -> None:
        if self.rank != 0:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if checkpoint_dir is not None:
            final = os.path.join(self.root, f"{_CHECKPOINT_PREFIX}{metrics['step']:06d}")
            shutil.rmtree(final, ignore_errors=True)  # a step redone after a restart
            os.replace(checkpoint_dir, final)
            for old in self._complete()[:-2]:
                shutil.rmtree(os.path.join(self.root, old), ignore_errors=True)

    def prepare_model(self, model: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)


def rank_api(config: dict) -> _RankAPI:
    framework = config["framework"]
    if framework == "ftnb":
        import ftnb
        import ftnb.torch

        return _TrainerAPI(ftnb, ftnb.torch.prepare_model)
    if framework == "ray":
        import ray.train
        import ray.train.torch

        return _TrainerAPI(ray.train, ray.train.torch.prepare_model)
    if framework == "torchrun":
        return _TorchrunAPI(config)
    raise ValueError(f"unknown framework {framework!r}")


def _model(config: dict) -> Any:
    import torch

    width, layers = config["width"], []
    for _ in range(config["depth"]):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def _stop_agreed(stop_file: str) -> bool:
    """Whether any rank sees ``stop_file``: every rank gets the same answer at the same step."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def group_loop(config: dict) -> None:
    """``config["steps"]`` steps of DDP training (see the module docstring for the rest of
    ``config``: ``width``, ``depth``, ``batch``, ``step_s``, ``report_every``,
    ``checkpoint_every``, ``timed_from``, ``stop_file``)."""
    log_event(config, "entry")
    import torch

    torch.set_num_threads(1)  # the same for every framework: 2 ranks on 2 CPUs
    api = rank_api(config)
    rank = api.rank
    torch.manual_seed(0)
    model = _model(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first = 0
    with api.checkpoint_dir() as d:
        if d is not None:
            state = torch.load(os.path.join(d, STATE_FILE), weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            first = state["step"] + 1
    log_event(config, "start", rank=rank, resumed_from=first)
    model = api.prepare_model(model)  # DDP: rank 0's parameters are broadcast
    x = torch.randn(config["batch"], config["width"], generator=torch.Generator().manual_seed(rank))
    y = torch.randn(config["batch"], 10, generator=torch.Generator().manual_seed(100 + rank))
    loss_fn = torch.nn.MSELoss()
    report_every, checkpoint_every = config["report_every"], config["checkpoint_every"]
    stop_file, step_s = config.get("stop_file"), config.get("step_s", 0)
    timed_from = config.get("timed_from", 0)
    clock = time.perf_counter
    t_timed = clock() if first >= timed_from else None
    report_s: list[float] = []
    marks: list[float] = []  # when each timed report returned
    first_done = False
    for step in range(first, config["steps"]):
        if step == timed_from:
            t_timed = clock()
        if step_s:
            time.sleep(step_s)  # stands in for the rest of a real step
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        stop = bool(stop_file) and _stop_agreed(stop_file)
        if (step + 1) % report_every == 0 or stop or step == config["steps"] - 1:
            ckpt_dir = None
            if rank == 0 and checkpoint_every and (step + 1) % checkpoint_every == 0:
                ckpt_dir = tempfile.mkdtemp(prefix="ckpt-", dir=config.get("checkpoint_root"))
                torch.save({"model": _unwrapped(model).state_dict(),
                            "optimizer": optimizer.state_dict(), "step": step},
                           os.path.join(ckpt_dir, STATE_FILE))
            t = clock()
            api.report({"step": step, "loss": loss.item()}, ckpt_dir)
            report_s.append(clock() - t)
            if t_timed is not None:
                marks.append(clock())
            if ckpt_dir is not None:
                shutil.rmtree(ckpt_dir, ignore_errors=True)  # (torchrun's was moved away)
                if config.get("log_checkpoints"):
                    log_event(config, "checkpointed", step=step)
        if not first_done:
            first_done = True
            log_event(config, "first_step", rank=rank, step=step)
        if stop:
            break
    if t_timed is not None:
        report_s.sort()
        log_event(config, "timing", rank=rank, timed_steps=config["steps"] - timed_from,
                  elapsed_s=clock() - t_timed,
                  report_p50_s=report_s[len(report_s) // 2] if report_s else 0.0,
                  windows_s=[b - a for a, b in zip([t_timed] + marks, marks)])


def _unwrapped(model: Any) -> Any:
    return getattr(model, "module", model)


def main(argv: list[str]) -> int:
    """A torchrun worker: ``python -m bench.group_loop CONFIG_JSON``. Sets up the process
    group from torchrun's variables, as the trainers do before they call the loop."""
    import torch.distributed as dist

    config = json.loads(argv[0])
    dist.init_process_group("gloo")
    try:
        group_loop(config)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
