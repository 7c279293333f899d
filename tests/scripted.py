"""A trainable whose failures are scripted by its config, for the fault-tolerance tests.

config:
    n: iterations to run.
    ckpt_every: checkpoint every k-th iteration (0: never).
    faults: {attempt number (str): [iteration, how]} where how is raise | exit3 | sigkill |
        sigterm | segfault | raise_same. The fault fires just before that iteration is reported.
    sleep: seconds per iteration.
    gate: a file path: the last iteration waits until that file exists (tests decide when a
        trial may finish).
    fault_after: [glob, k]: the fault waits until a file matching glob (another trial's
        result.json) has k lines (a trial fails only once another has reported k times).

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
    start = restored_step()
    log_path = os.path.join(ctx.trial_dir, "executed.log")
    for step in range(start + 1, n + 1):
        time.sleep(config.get("sleep", 0))
        if step == n and config.get("gate"):
            _wait_for_file(config["gate"])
        if fault and fault[0] == step:
            if config.get("fault_after"):
                _wait_for_lines(*config["fault_after"])
            _fire(fault[1], step, ctx.attempt)
        metrics = {"score": step * config.get("slope", 1.0), "resumed_from": start}
        want_ckpt = (every and step % every == 0) or ctx.should_checkpoint
        if os.path.isdir(ctx.trial_dir):  # local storage only
            with open(log_path, "a") as f:
                f.write(f"{ctx.attempt} {step}\n")
        report_step(metrics, step, bool(want_ckpt))


def report_step(metrics: dict, step: int, checkpoint: bool) -> None:
    """``report(metrics)``, with a checkpoint holding ``step`` (see :func:`restored_step`)."""
    if not checkpoint:
        ftnb.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"step": step}, f)
        ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))


def _wait_for_file(path: str, timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        time.sleep(0.02)


def _wait_for_lines(pattern: str, lines: int, timeout_s: float = 120.0) -> None:
    import glob

    deadline = time.time() + timeout_s
    while True:
        for path in glob.glob(pattern):
            with open(path, "rb") as f:
                if f.read().count(b"\n") >= lines:
                    return
        if time.time() > deadline:
            raise TimeoutError(f"no file {pattern} reached {lines} lines")
        time.sleep(0.02)


def restored_step() -> int:
    """The step saved in the checkpoint this attempt resumes from (0 on a fresh start)."""
    ckpt = ftnb.get_checkpoint()
    if ckpt is None:
        return 0
    with ckpt.as_directory() as d:
        with open(os.path.join(d, "state.json")) as f:
            return json.load(f)["step"]


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


def scripted_case(config: dict) -> None:
    """``scripted`` with its settings in ``config["case"]`` (a dict chosen by a grid), so that
    one experiment holds trials that behave differently."""
    scripted({**config, **config["case"]})


def case_dirs(experiment_dir: str) -> dict[str, str]:
    """{case name: trial folder} of an experiment run with :func:`scripted_case`."""
    out = {}
    if not os.path.isdir(experiment_dir):
        return out
    for name in os.listdir(experiment_dir):
        params = os.path.join(experiment_dir, name, "params.json")
        if os.path.exists(params):
            with open(params) as f:
                out[json.load(f)["case"]["name"]] = os.path.join(experiment_dir, name)
    return out


def result_rows(trial_dir: str) -> list[dict]:
    from ftnb.storage import read_json_lines

    try:
        with open(os.path.join(trial_dir, "result.json"), "rb") as f:
            return read_json_lines(f.read())
    except FileNotFoundError:
        return []


def uses_objects(config: dict) -> None:
    """Reports what it sees of ``config["data"]`` (an array) and ``config["frame"]`` (a
    DataFrame), checkpointing every step, so tests can tell which objects a trial was given."""
    ctx = ftnb.get_context()
    start = restored_step()
    for step in range(start + 1, config.get("n", 8) + 1):
        time.sleep(config.get("sleep", 0.1))
        metrics = {
            "data_sum": float(config["data"].sum()),
            "frame_sum": float(config["frame"]["x"].sum()),
            "w": config["w"],
            "attempt_seen": ctx.attempt,
        }
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))


def puts_then_dies(config: dict) -> None:
    """Attempt 1 ftnb.put()s an array, writes the object file's path to ``config["note"]`` and
    SIGKILLs itself; attempt 2 reports whether that file was still there when it started."""
    import numpy as np

    if ftnb.get_context().attempt == 1:
        ref = ftnb.put(np.ones(1 << 20))
        with open(config["note"], "w") as f:
            f.write(ref.path)
        os.kill(os.getpid(), signal.SIGKILL)
    with open(config["note"]) as f:
        ftnb.report({"leftover": os.path.exists(f.read())})


class InterruptAfter:
    """A listener that interrupts the driver (KeyboardInterrupt, as Ctrl+C) once ``n`` trials
    completed: an in-process experiment stopped mid-run, to be restored."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_trial_complete(self, state, trial) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt
