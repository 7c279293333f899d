"""Trainables for the ResourceChangingScheduler tests (tests/test_resource_changing.py), in a
module of their own so that a driver script run by those tests imports them too."""

from __future__ import annotations

import json
import os
import tempfile
import time

import ftnb


def grows(config: dict) -> None:
    """Runs (its settings in ``config``, or in ``config["case"]``) at least ``config["n"]``
    iterations, and on until it was given
    ``config["until_cpu"]`` CPUs (at most ``config["cap"]`` iterations), checkpointing at every
    report. Each report says the CPUs it was given; each iteration done is a line of
    ``executed.log`` in the trial folder ("attempt iteration"), so that tests count iterations
    done twice."""
    config = {**config, **(config.get("case") or {})}
    ctx = ftnb.get_context()
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "it.json")) as f:
            start = json.load(f)["it"]
    until = config.get("until_cpu", 0.0)
    for it in range(start + 1, config.get("cap", 400) + 1):
        given = ctx.get_trial_resources()
        time.sleep(config.get("sleep", 0.02))
        with open(os.path.join(ctx.trial_dir, "executed.log"), "a") as log:
            log.write(f"{ctx.attempt} {it}\n")
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "it.json"), "w") as f:
            json.dump({"it": it}, f)
        done = it >= config["n"] and given.required_resources["CPU"] >= until
        extra = {"ray_cpu": _ray_cpus()} if config.get("ray") else {}
        ftnb.report({**extra, "cpu": given.required_resources["CPU"],
                     "bundles": len(given.bundles),
                     "score": config.get("score", 0) * it, "done": done},
                    checkpoint=ftnb.Checkpoint.from_directory(folder))
        if done:
            return


def _ray_cpus() -> float:
    """The CPUs Ray says this actor holds (in a Ray actor)."""
    import ray

    return ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)


def executed(trial_dir: str) -> list[int]:
    """The iterations ``grows`` did in ``trial_dir``, in order (every attempt's)."""
    path = os.path.join(trial_dir, "executed.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [int(line.split()[1]) for line in f if line.strip()]
