"""ftnb demo: a sweep that survives crashes, on local processes and local storage.

Eight trials train a tiny model (pure Python, no GPU needed), two at a time, checkpointing
every other step. Some are sabotaged on their first attempt:

* two raise an exception,
* two are SIGKILLed (as the out-of-memory killer or a dead node would),
* one exits with sys.exit(3),
* one is preempted (SIGTERM): it checkpoints on request and does not count as a failure,
* one has a deterministic bug: it fails again and again at the same step, so it is stopped
  after its second identical failure instead of burning its retries,
* one fails on every attempt with a different error and runs out of its retry budget.

Run it:  python examples/demo.py [--storage-path PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time

import ftnb
from ftnb.wording import ftnb_command


SABOTAGE = {
    0: None,
    1: ("raise", 3),
    2: ("sigkill", 5),
    3: ("exit", 4),
    4: ("sigterm", 6),
    5: ("sigkill", 2),
    6: ("bug", 3),
    7: ("always", 2),
}


def train(config: dict) -> None:
    ctx = ftnb.get_context()
    weight, start = 0.0, 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "model.json")) as f:
                saved = json.load(f)
        weight, start = saved["weight"], saved["step"]
        print(f"resuming from step {start}")
    plan = SABOTAGE[config["trial"]]
    for step in range(start + 1, config["steps"] + 1):
        time.sleep(0.15)  # one "epoch"
        weight += config["lr"] * (1.0 - weight)  # converges towards 1.0
        if plan and step == plan[1]:
            how = plan[0]
            if how == "raise" and ctx.attempt == 1:
                raise RuntimeError("CUDA error: an illegal memory access (injected)")
            if how == "sigkill" and ctx.attempt == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "exit" and ctx.attempt == 1:
                sys.exit(3)
            if how == "sigterm" and ctx.attempt == 1:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
            if how == "bug":
                raise ValueError("shapes (32, 10) and (5,) not aligned")
            if how == "always":
                raise RuntimeError(f"flaky data source (attempt {ctx.attempt})")
        metrics = {"loss": round(1.0 - weight, 5)}
        if step % 2 == 0 or ctx.should_checkpoint:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "model.json"), "w") as f:
                    json.dump({"weight": weight, "step": step}, f)
                ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))
        else:
            ftnb.report(metrics)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "ftnb_demo"))
    parser.add_argument("--name", default=None)
    args = parser.parse_args()

    results = ftnb.Tuner(
        train,
        param_space={
            "trial": ftnb.grid_search(list(SABOTAGE)),
            "lr": ftnb.loguniform(0.05, 0.5),
            "steps": 10,
        },
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2, metric="loss", mode="min", seed=7),
        run_config=ftnb.RunConfig(
            name=args.name or time.strftime("demo_%Y-%m-%d_%H-%M-%S"),
            storage_path=args.storage_path,
            failure_config=ftnb.FailureConfig(max_failures=2),
            checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2),
        ),
    ).fit()

    print("\nResults:")
    df = results.get_dataframe()
    columns = ["trial_id", "status", "training_iteration", "loss", "config/trial", "config/lr"]
    print(df[columns].to_string(index=False))
    best = results.get_best_result()
    print(f"\nBest trial: {best.trial_id} (lr={best.config['lr']:.3f}, loss={best.metrics['loss']})")
    print(f"Errored trials: {results.num_errors}")
    for error in results.errors:
        print(f"  {error}")
    print(f"\nEverything is in {results.experiment_path}; try: "
          f"{ftnb_command()} status {shlex.quote(results.experiment_path)}")
    # The demo succeeds when every survivable failure was survived and exactly the two
    # hopeless trials (the deterministic bug and the one past its budget) are ERRORED.
    expected_errors = 2
    survived = results.num_terminated == len(SABOTAGE) - expected_errors
    return 0 if survived and results.num_errors == expected_errors else 1


if __name__ == "__main__":
    sys.exit(main())
