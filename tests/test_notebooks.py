"""The tutorial notebooks (``notebooks/*.ipynb``) run top to bottom under nbval, in a real
kernel, and their outputs must match the committed ones (run ids, paths, pids, durations and
timestamps sanitized by ``notebooks/sanitize.cfg``; only widget and timing cells are tagged
``nbval-ignore-output``). Each notebook runs in its own ``pytest --nbval`` subprocess, so the
README's ``python -m pytest -q`` runs them without enabling nbval for the rest of the suite.

To re-record a notebook's outputs after changing it, run ``python notebooks/record.py NAME.ipynb``
(top to bottom in a fresh kernel, saved in place without widget state) and commit it.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from procs import REPO

NOTEBOOKS_DIR = os.path.join(REPO, "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOKS_DIR, "*.ipynb")))
SANITIZE = os.path.join(NOTEBOOKS_DIR, "sanitize.cfg")
IGNORE_TAG = "nbval-ignore-output"
# Per notebook under nbval; they take well under a minute each on 2 cores.
NOTEBOOK_TIMEOUT_S = 300
MAX_NOTEBOOK_BYTES = 1_000_000  # outputs of a real run, without embedded widget state


def _cells(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["cells"]


def test_the_tutorials_are_there():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names[:6] == ["01_quick_start.ipynb", "02_trial_fault_tolerance.ipynb",
                         "03_restore_and_resume.ipynb", "04_storage.ipynb",
                         "05_data_parallel.ipynb", "06_elastic_rollouts.ipynb"], names
    assert os.path.isfile(SANITIZE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_committed_with_the_outputs_of_a_run(path):
    """Every code cell ran, in order, without an error; most outputs are compared."""
    assert os.path.getsize(path) < MAX_NOTEBOOK_BYTES, "widget state or a huge output was saved"
    code = [c for c in _cells(path) if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), f"cells not run top to bottom: {counts}"
    for cell in code:
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", "".join(cell["source"])
    ignored = [c for c in code if IGNORE_TAG in c.get("metadata", {}).get("tags", [])]
    compared = [c for c in code if c not in ignored and c.get("outputs")]
    assert len(compared) >= len(ignored), "most outputs should be compared, not ignored"


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 60)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_and_matches_its_outputs(path, tmp_path):
    pytest.importorskip("nbval", reason="nbval is not installed (pip install -e '.[dev]')")
    pytest.importorskip("ipykernel")
    # The notebooks' temporary folders go under tmp_path, so one that fails partway (before its
    # clean-up cell) leaves nothing behind.
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    # A stray storage default must not change where the notebooks write.
    env.pop("FTNB_STORAGE_PATH", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--nbval", "--nbval-sanitize-with", SANITIZE, "--nbval-cell-timeout", "180",
           "--basetemp", str(tmp_path / "basetemp"), path]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=NOTEBOOK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")
        out = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
        pytest.fail(f"{os.path.basename(path)} did not finish in {NOTEBOOK_TIMEOUT_S} s:\n"
                    f"{out[-6000:]}")
    assert proc.returncode == 0, f"nbval failed for {os.path.basename(path)}:\n" \
                                 f"{proc.stdout[-12000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:]
