"""Helpers for the tests of the ``ftnb`` command: run the installed entry point as a real
process, in a folder of the test's own, with its storage under the test's temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: The ``ftnb`` entry point that ``pip install`` made (``[project.scripts]``).
FTNB = os.path.join(os.path.dirname(sys.executable), "ftnb")

#: Trainables for the tests, written to ``jobs.py`` in the test's folder: the command imports
#: them from there (``jobs.py:gated``), and so do its trial processes.
JOBS = '''
import os, sys, time
import ftnb

def gated(config):
    """Prints and reports every 20 ms until the file config["gate"] exists, then once more."""
    i = 0
    while True:
        i += 1
        print(f"line {i} of {config['x']}", flush=True)
        ftnb.report({"loss": 1.0 / i, "x": config["x"]})
        if os.path.exists(config["gate"]):
            print("last line", flush=True)
            return
        time.sleep(0.02)

def quick(config):
    for i in range(3):
        print(f"step {i}", flush=True)
        ftnb.report({"loss": config["x"] / (i + 1)})

def renamed(config):
    quick(config)

def broken(config):
    """x == 2 fails; its loss is NaN (strict JSON must still hold)."""
    ftnb.report({"loss": float("nan")})
    if config["x"] == 2:
        raise ValueError("x=2 is broken " + "and says so at length " * 5)

space = {"x": ftnb.grid_search([1, 2])}
not_a_dict = [1, 2]
'''


class Cli:
    """Runs ``ftnb`` in ``cwd`` with ``$FTNB_STORAGE_PATH`` = ``storage``."""

    def __init__(self, cwd: Path, storage: Path) -> None:
        self.cwd = cwd
        self.storage = storage
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("FTNB_") or k in ("FTNB_NUM_CPUS", "FTNB_NUM_GPUS")}
        self.env.update(FTNB_STORAGE_PATH=str(storage), PYTHONUNBUFFERED="1")

    def __call__(self, *args: str, timeout: float = 120, stdin: object = None,
                 command: tuple = (FTNB,)) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *args], cwd=self.cwd, env=self.env, text=True,
                              capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL if stdin is None else stdin)

    def status_json(self, target: str) -> dict:
        """``ftnb status TARGET --json``, which must succeed, parsed."""
        done = self("status", target, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def start(self, *args: str, **kwargs) -> subprocess.Popen:
        options = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        options.update(kwargs)
        return subprocess.Popen([FTNB, *args], cwd=self.cwd, env=self.env, text=True, **options)

    def open_gate(self) -> None:
        """Let every ``gated`` trial of this test end (also what its teardown does, so that no
        detached experiment outlives a failed test)."""
        (self.cwd / "gate").write_text("open")


def cli_in(tmp_path: Path):
    """The body of each test file's ``cli`` fixture: ``jobs.py`` in a folder of its own, the
    storage beside it; at the end, the gate of its gated trials opened."""
    work = tmp_path / "work"
    write(work, "jobs.py", JOBS)
    cli = Cli(work, tmp_path / "store")
    try:
        yield cli
    finally:
        cli.open_gate()


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


def literal(space: dict) -> str:
    """A search space as ``--param-space`` takes it (a JSON literal)."""
    return json.dumps(space)


def strict_json(text: str):
    """Parse ``text`` as strict JSON: NaN or Infinity in it fail the test."""
    def refuse(name: str):
        raise AssertionError(f"not strict JSON: {name} in {text[:200]!r}")

    return json.loads(text, parse_constant=refuse)


def one_line_error(err: str, *fragments: str) -> str:
    """Assert that ``err`` is one ``ftnb: error:`` line holding every fragment; return it."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ftnb: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
