"""A trainable whose failures are scripted by its config, for the fault-tolerance tests.

config:
    n: iterations to run.
    ckpt_every: checkpoint every k-th iteration (0: never).
    faults: {attempt number (str): [iteration, how]} where how is raise | exit3 | sigkill |
        sigterm | segfault | raise_same. The fault fires just before that iteration is reported.
    sleep: seconds per iteration.

Every reported step is appended to ``executed.log`` in the trial folder (one line per report,
"attempt step"), so tests can count iterations done twice.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

import ftnb


def scripted(config: dict) -> None:
    ctx = ftnb.get_context()
    n = config.get("n", 6)
    every = config.get("ckpt_every", 1)
    fault = (config.get("faults") or {}).get(str(ctx.attempt))
    start = 0
    ckpt = ftnb.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                start = json.load(f)["step"]
    log_path = os.path.join(ctx.trial_dir, "executed.log")
    for step in range(start + 1, n + 1):
        time.sleep(config.get("sleep", 0))
        if fault and fault[0] == step:
            _fire(fault[1], step, ctx.attempt)
        metrics = {"score": step * config.get("slope", 1.0), "resumed_from": start}
        want_ckpt = (every and step % every == 0) or ctx.should_checkpoint
        if os.path.isdir(ctx.trial_dir):  # local storage only
            with open(log_path, "a") as f:
                f.write(f"{ctx.attempt} {step}\n")
        if want_ckpt:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
                ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))
        else:
            ftnb.report(metrics)


def _fire(how: str, step: int, attempt: int) -> None:
    if how == "raise":
        raise ValueError(f"injected failure at step {step} (attempt {attempt})")
    if how == "raise_same":
        raise ValueError(f"deterministic bug at step {step}")
    if how == "exit3":
        sys.exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # let the handler run before the next report
        return
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)
    raise AssertionError(f"unknown fault {how!r}")


def executed(trial_dir: str) -> list[tuple[int, int]]:
    try:
        with open(os.path.join(trial_dir, "executed.log")) as f:
            return [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except FileNotFoundError:
        return []
