"""binder/ works: its install steps, run as repo2docker runs them (``pip install -r
binder/requirements.txt`` then ``binder/postBuild`` from the repository root) in a fresh virtual
environment, give an environment in which the quick-start tutorial runs top to bottom.

There is no Docker here, so repo2docker itself is not run; the steps are the same. Skipped when
the package index cannot be reached."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import urllib.parse

import pytest

from procs import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

BINDER = os.path.join(REPO, "binder")
QUICK_START = os.path.join(REPO, "notebooks", "01_quick_start.ipynb")
_INSTALL_TIMEOUT_S = 900


def _reachable(url: str, timeout: float = 3.0) -> bool:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return True
    try:
        with socket.create_connection(
                (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)),
                timeout=timeout):
            return True
    except OSError:
        return False


def _requirements_for_here(dest) -> str:
    """binder/requirements.txt as pip will read it here: relative ``-c``/``-r`` paths made
    absolute, and an extra index this machine cannot reach (PyTorch's CPU wheels, when only the
    configured package index is reachable) left out, so pip does not spend minutes retrying it.
    Everything else is installed exactly as Binder would."""
    lines = []
    with open(os.path.join(BINDER, "requirements.txt")) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["--extra-index-url"] and not _reachable(words[1]):
                continue
            if words[:1] in (["-c"], ["-r"]):
                # pip splits an option's value as a shell would: quote a path with spaces
                target = os.path.normpath(os.path.join(BINDER, words[1]))
                line = f"{words[0]} {shlex.quote(target)}\n"
            lines.append(line)
    path = os.path.join(dest, "requirements.txt")
    with open(path, "w") as f:
        f.writelines(lines)
    return path


def _run(cmd: list[str], env: dict, timeout: float = _INSTALL_TIMEOUT_S, **kwargs):
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, **kwargs)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stdout[-4000:]}\n"
        f"{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def binder_env(tmp_path_factory):
    """A fresh venv after binder's install steps: (its bin folder, the environment to use)."""
    root = tmp_path_factory.mktemp("binder")
    venv, home = root / "venv", root / "home"
    home.mkdir()
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, timeout=300)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a virtual environment: {exc.stderr.decode()[-500:]}")
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VIRTUAL_ENV", "PYTHON", "JUPYTER", "FTNB_", "PYTEST"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", HOME=str(home),
               VIRTUAL_ENV=str(venv), PYTHONUNBUFFERED="1")
    python = str(bin_dir / "python")
    probe = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "-d",
                            str(root / "probe"), "hatchling"], env=env, capture_output=True,
                           text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"the package index cannot be reached: {probe.stderr[-500:]}")
    # repo2docker's environments come with a recent pip; older ones cannot resolve s3fs's pin.
    _run([python, "-m", "pip", "install", "-q", "-U", "pip"], env)
    _run([python, "-m", "pip", "install", "-q", "-r", _requirements_for_here(root)], env)
    _run(["bash", os.path.join(BINDER, "postBuild")], env)
    return bin_dir, env


def test_postbuild_installs_ftnb_and_opens_the_tutorials(binder_env):
    bin_dir, env = binder_env
    out = _run([str(bin_dir / "python"), "-c",
                "import ftnb, torch, plotly, ipywidgets, s3fs; print(ftnb.__file__)"], env)
    assert out.stdout.strip().startswith(os.path.join(REPO, "ftnb"))
    config = os.path.join(env["HOME"], ".jupyter", "jupyter_server_config.py")
    with open(config) as f:
        assert "/lab/tree/notebooks/01_quick_start.ipynb" in f.read()
    assert os.path.exists(bin_dir / "jupyter-lab")


def test_quick_start_runs_in_the_binder_environment(binder_env, tmp_path):
    bin_dir, env = binder_env
    _run([str(bin_dir / "jupyter"), "nbconvert", "--to", "notebook", "--execute",
          "--ExecutePreprocessor.timeout=180", "--ExecutePreprocessor.kernel_name=python3",
          "--output-dir", str(tmp_path), QUICK_START], env, timeout=600)
    with open(tmp_path / os.path.basename(QUICK_START)) as f:
        cells = json.load(f)["cells"]
    text = "".join(
        "".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
        for o in c.get("outputs", []) if o["output_type"] == "stream"
    )
    assert "4 trials: 4 finished, 0 errored" in text, text[-3000:]
    assert "reloaded model's loss equals the reported one: True" in text, text[-3000:]
