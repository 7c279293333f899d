"""A sweep that is simply run again after any interruption, and picks up where it stopped.

    python examples/resumable.py --storage-path ~/ftnb_results --name sweep1

Kill it (Ctrl+C, SIGKILL, a preempted machine, a culled notebook server) and run the same
command again: finished trials are kept, interrupted ones continue from their latest
checkpoint, and every ``training_iteration`` is in ``result.json`` exactly once. The shared
array travels to the trials once (``ftnb.put``) and is re-created by the script on each run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

import ftnb


def train(config: dict) -> None:
    data = config["data"]  # the array from ftnb.put, memory-mapped, shared by every trial
    step, weight = 0, 0.0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:  # resuming: after a failure, or after the driver died
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                saved = json.load(f)
        step, weight = saved["step"], saved["weight"]
    while step < config["steps"]:
        step += 1
        time.sleep(config["seconds_per_step"])
        weight += config["lr"] * (float(data.mean()) - weight)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step, "weight": weight}, f)
            ftnb.report({"loss": (1.0 - weight) ** 2},
                        checkpoint=ftnb.Checkpoint.from_directory(d))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storage-path", default=os.path.expanduser("~/ftnb_results"))
    parser.add_argument("--name", default="resumable")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    results = ftnb.run(
        train,
        name=args.name,
        storage_path=args.storage_path,
        param_space={
            "lr": ftnb.grid_search([0.05, 0.1, 0.2, 0.4]),
            "steps": args.steps,
            "seconds_per_step": 0.1,
            "data": ftnb.put(np.ones(1_000_000)),
        },
        tune_config=ftnb.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
        # Two checkpoints per trial are enough to resume from (a trial checkpoints each step).
        run_config=ftnb.RunConfig(failure_config=ftnb.FailureConfig(max_failures=2),
                                  checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2)),
    )
    best = results.get_best_result()
    print(f"best lr={best.config['lr']} loss={best.metrics['loss']:.4f}")


if __name__ == "__main__":
    main()
