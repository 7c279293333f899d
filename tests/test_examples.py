"""``examples/resumable.py`` does what its docstring says: SIGKILLed mid-sweep and run again
with the same command, it finishes every trial with each ``training_iteration`` once, and it
keeps only the checkpoints it needs to resume (two per trial, not one per step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from procs import REPO, STARTED, wait_for

EXAMPLE = os.path.join(REPO, "examples", "resumable.py")


def _start(tmp_path, steps: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, EXAMPLE, "--storage-path", str(tmp_path / "results"), "--name", "sweep1",
         "--steps", str(steps)],
        cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    STARTED.append(proc)
    return proc


def _trial_dirs(tmp_path):
    root = tmp_path / "results" / "sweep1"
    return sorted(p for p in root.iterdir() if (p / "result.json").exists()) \
        if root.exists() else []


def _iterations(trial_dir):
    with open(trial_dir / "result.json") as f:
        return [json.loads(line)["training_iteration"] for line in f if line.strip()]


def test_resumable_example_survives_a_sigkill_and_keeps_two_checkpoints(tmp_path):
    steps = 12
    first = _start(tmp_path, steps)
    # Killed once some trial has checkpointed a few steps (none has finished yet).
    wait_for(lambda: any(len(_iterations(d)) >= 3 for d in _trial_dirs(tmp_path)),
             timeout=120, what="a trial's third report")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)

    again = _start(tmp_path, steps)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    assert "best lr=" in out

    dirs = _trial_dirs(tmp_path)
    assert len(dirs) == 4
    for trial_dir in dirs:
        assert _iterations(trial_dir) == list(range(1, steps + 1)), trial_dir.name
        kept = [p.name for p in trial_dir.iterdir() if p.name.startswith("checkpoint_")]
        assert len(kept) == 2, (trial_dir.name, kept)
