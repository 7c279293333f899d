"""The README's code runs as written: the Quick start on a CPU-only machine with no cloud
credentials, and CI runs exactly the README's test command."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_ci_runs_the_readmes_test_command():
    commands = [line for line in _code_blocks(README[:README.index("\n## ")], "bash")[0]
                .splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(commands[0] + " ") for line in ci), (
        "the README's first command (the demo) is not in .ci/run")
    assert commands[1] in ci, "the README's test command is not in .ci/run"


@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path):
    pytest.importorskip("torch", reason="the quick start uses torch (ftnb[torch])")
    blocks = _code_blocks(_section("Quick start"), "python")
    assert len(blocks) == 1
    script = tmp_path / "quick_start.py"
    script.write_text(blocks[0])
    # Nothing that needs a GPU or a bucket (those are comments).
    code = [line.split("#", 1)[0] for line in blocks[0].splitlines()]
    assert not any("s3://" in line or '"gpu"' in line for line in code)
    env = dict(os.environ, FTNB_STORAGE_PATH=str(tmp_path / "results"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("{'lr': ") and "Checkpoint(" in last, proc.stdout
    experiments = [p for p in (tmp_path / "results").iterdir() if not p.name.startswith(".")]
    assert len(experiments) == 1
    trials = [p for p in experiments[0].iterdir() if (p / "result.json").exists()]
    assert len(trials) == 4
    for trial in trials:  # 20 epochs each, and the 2 best checkpoints kept
        assert len((trial / "result.json").read_text().splitlines()) == 20
        assert len(list(trial.glob("checkpoint_*"))) == 2
