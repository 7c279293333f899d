"""The JupyterLab panel (labextension/) as it is built and installed: its TypeScript unit tests
(``npm test``), the wheel that ships it, and ``jupyter labextension list`` in this environment.

Skipped, saying why, without node/npm or before ``cd labextension && npm ci && npm run build``
(.ci/run does both before the tests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from procs import REPO

LABEXTENSION = os.path.join(REPO, "labextension")
BUILT = os.path.join(LABEXTENSION, "build", "ftnb-jupyterlab")
NAME = "ftnb-jupyterlab"


def _needs_node_modules() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the panel's TypeScript tests need them")
    if not os.path.isdir(os.path.join(LABEXTENSION, "node_modules")):
        pytest.skip("labextension/node_modules is missing: cd labextension && npm ci")


def _needs_build() -> None:
    if not os.path.isfile(os.path.join(BUILT, "package.json")):
        pytest.skip("the panel is not built: cd labextension && npm ci && npm run build")


@pytest.mark.timeout(180)
def test_the_panel_model_unit_tests_pass():
    _needs_node_modules()
    proc = subprocess.run(["npm", "test", "--silent"], cwd=LABEXTENSION, check=False,
                          capture_output=True, text=True, timeout=170,
                          env=dict(os.environ, NO_COLOR="1", FORCE_COLOR="0"))
    # Colours anyway where the runner decides so (CI=true): read the text without them.
    output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    assert proc.returncode == 0, output[-6000:]
    passed = re.search(r"Tests\s+(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 10, output[-3000:]


def test_the_build_is_a_federated_extension_with_a_style_and_remote_entry():
    _needs_build()
    with open(os.path.join(BUILT, "package.json")) as f:
        meta = json.load(f)
    assert meta["name"] == NAME
    build = meta["jupyterlab"]["_build"]
    # The module federation entry JupyterLab loads, exposing the plugin and its style.
    assert os.path.isfile(os.path.join(BUILT, build["load"])), build
    assert build["extension"] == "./extension" and build["style"] == "./style", build


@pytest.mark.slow
def test_jupyter_labextension_list_shows_the_panel_enabled():
    """What the README's install command gives (pip install -e ... copies the build into this
    environment's share/jupyter/labextensions): run it again after rebuilding the panel."""
    _needs_build()
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                          check=False, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NO_COLOR="1"))
    listing = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    line = next((x for x in listing.splitlines() if NAME in x), None)
    assert line is not None, (
        f"{NAME} is not installed in {sys.prefix}: pip install -e . after building "
        f"labextension/\n{listing}")
    assert "enabled" in line and "OK" in line and "(python, ftnb)" in line, line


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_ships_the_panel_and_enables_the_server_extension(tmp_path):
    _needs_build()
    pytest.importorskip("hatch_jupyter_builder",
                        reason="hatch-jupyter-builder is not installed (pip install '.[dev]')")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), REPO],
        check=False, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("ftnb-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = f"ftnb-0.1.0.data/data/share/jupyter/labextensions/{NAME}/"
    assert data + "package.json" in names and data + "install.json" in names
    assert any(n.startswith(data + "static/remoteEntry.") for n in names)
    assert "ftnb-0.1.0.data/data/etc/jupyter/jupyter_server_config.d/ftnb.json" in names
    # No source of the panel, and nothing of node's, goes into the wheel.
    assert not [n for n in names if "node_modules" in n or n.startswith("labextension/")]
