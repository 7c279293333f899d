"""The commands ftnb prints for the user run as printed, in a shell where the venv is not
activated (the README's first command installs into ``.venv`` and never activates it): the
resume line ``ftnb stop`` prints, the ``Fix:`` of a CLI error, and the demo's last line. With
the venv's ``ftnb`` not on PATH, a bare ``ftnb ...`` would be "command not found"; ftnb prints
its console script's path instead (relative under the current folder)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import ftnb
from clirun import JOBS, literal, write
from procs import wait_for

pytestmark = pytest.mark.timeout(240)

BIN = os.path.dirname(sys.executable)


def _shell_env(storage) -> dict:
    """A user's shell after the README's first command: the venv's bin not on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTNB_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and os.path.abspath(p) != BIN) or "/usr/bin:/bin"
    env["FTNB_STORAGE_PATH"] = str(storage)
    return env


def _sh(line: str, cwd, env, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``line`` as the user would paste it into their shell."""
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_the_shell_of_these_tests_has_no_ftnb_on_path(tmp_path):
    done = _sh("command -v ftnb || echo none", tmp_path, _shell_env(tmp_path))
    assert done.stdout.strip() == "none", done.stdout  # else the test below proves nothing


def test_the_resume_line_of_a_stop_and_a_fix_run_as_printed(tmp_path):
    work = tmp_path / "work"
    write(work, "jobs.py", JOBS)
    env = _shell_env(tmp_path / "store")
    python = shlex.quote(sys.executable)  # (CI's path holds spaces)
    space = literal({"x": {"grid_search": [1]}, "gate": str(work / "gate")})
    done = _sh(f"{python} -m ftnb run jobs.py:gated -p '{space}' -n printed --detach", work, env)
    assert done.returncode == 0, done.stderr
    handle = ftnb.attach("printed", storage_path=str(tmp_path / "store"))
    wait_for(lambda: handle.state().trials and handle.state().trials[0].iteration >= 1, 60,
             "the trial to report")

    stopped = _sh(f"{python} -m ftnb stop printed --json", work, env)
    assert stopped.returncode == 0, stopped.stderr
    line = json.loads(stopped.stdout)["resume_line"]
    assert line.endswith(" resume printed") and not line.startswith("ftnb "), line
    (work / "gate").write_text("open")
    resumed = _sh(line, work, env)  # exactly as printed
    assert resumed.returncode == 0, (line, resumed.stderr)
    assert handle.status() == "FINISHED" and handle.state().trials[0].status == "TERMINATED"

    # An error's Fix names a command: it runs as printed too.
    store = shlex.quote(str(tmp_path / "store"))
    missing = _sh(f"{python} -m ftnb status nope --storage {store}", work, env)
    assert missing.returncode != 0
    fix = re.search(r"Fix: `([^`]+)`", missing.stderr)
    assert fix and not fix.group(1).startswith("ftnb "), missing.stderr
    listed = _sh(fix.group(1), work, env)
    assert listed.returncode == 0 and "printed" in listed.stdout, (fix.group(1), listed.stderr)


def test_a_console_script_under_the_current_folder_is_printed_relative(tmp_path):
    """From the folder that holds the venv (the README's case) the line is
    ``.venv/bin/ftnb ...``-like: relative, and it runs from there."""
    venv_parent = os.path.dirname(os.path.dirname(BIN))
    env = _shell_env(tmp_path)
    done = _sh(f"{shlex.quote(sys.executable)} -c 'from ftnb.wording import ftnb_command; "
               f"print(ftnb_command())'", venv_parent, env)
    command = done.stdout.strip()
    assert done.returncode == 0 and not os.path.isabs(command), (command, done.stderr)
    version = _sh(f"{command} --version", venv_parent, env)
    assert version.returncode == 0 and version.stdout.startswith("ftnb "), version.stderr
