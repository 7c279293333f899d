"""``ftnb status`` (and the text view of the widget and the handle) say which launcher started
an experiment's supervisor and where it runs, in one line; ``--json`` gives the same fields;
``ftnb ls`` says it under its table for each experiment a supervisor runs.
Real detached supervisors (the local and the command launcher) as real processes."""

from __future__ import annotations

import json
import socket

import pytest

import ftnb
from clirun import cli_in, literal
from ftnb.storage import ExperimentPaths
from ftnb.ui.status import supervisor_line
from procs import wait_for


@pytest.fixture
def cli(tmp_path):
    yield from cli_in(tmp_path)


def _record(cli, name) -> dict:
    try:
        return json.loads((cli.storage / name / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("launcher", ["local", "command"])
def test_status_says_which_launcher_started_the_supervisor_and_where_it_runs(cli, launcher):
    name = f"where_{launcher}"
    gate = cli.cwd / "gate"
    options = (["--launcher-command", "setsid {command}"] if launcher == "command"
               else ["--detach"])
    done = cli("run", "jobs.py:gated", "-p", literal({"x": 1, "gate": str(gate)}), "-n", name,
               *options)
    assert done.returncode == 0, done.stdout + done.stderr
    record = wait_for(lambda: _record(cli, name), what="supervisor.json")
    where = f"pid {record['pid']} on {socket.gethostname()}"
    line = f"Supervisor: {launcher} launcher, {where}"

    text = cli("status", name).stdout
    assert [x for x in text.splitlines() if x.startswith("Supervisor:")] == [line], text
    data = cli.status_json(name)["supervisor"]
    assert data["launcher"] == launcher and data["pid"] == record["pid"]
    assert data["host"] == socket.gethostname() and data["line"] == line
    assert data["ended"] is None and data["actor"] is None
    handle = ftnb.attach(str(cli.storage / name))
    assert line in handle.text().splitlines()
    listing = cli("ls")
    assert f"{name}: {launcher} launcher, {where}" in listing.stdout.splitlines(), listing.stdout
    assert json.loads(cli("ls", "--json").stdout)[0]["supervisor"] == (
        f"{launcher} launcher, {where}")

    gate.write_text("open")
    handle.wait(timeout=60)
    ended = wait_for(lambda: cli.status_json(name)["supervisor"]["ended"] and
                     cli.status_json(name)["supervisor"], what="the supervisor's end")
    assert ended["outcome"] == "finished"
    text = cli("status", name).stdout
    assert f"{line}; ended " in text and "(finished)" in text
    assert f"{name}:" not in cli("ls").stdout  # ended: it runs nowhere


def test_a_ray_actor_supervisor_is_named_with_its_node(tmp_path):
    """What the ray launcher records (ftnb.launchers.ray: the actor, its namespace and node),
    worded in the one line; an experiment no supervisor ran has none."""
    record = {"pid": 811, "host": "node3", "launcher": "ray", "actor": "ftnb-sweep1-3f2a",
              "namespace": "ftnb", "node_id": "9c1e0b2f77aa5d0e41c3", "started": 1.0}
    assert supervisor_line(record) == (
        "Supervisor: ray launcher, actor ftnb-sweep1-3f2a (namespace ftnb) on node "
        "9c1e0b2f77aa, pid 811 on node3")
    assert supervisor_line({}) == ""

    grid = ftnb.Tuner(lambda config: ftnb.report({"x": 1}), run_config=ftnb.RunConfig(
        name="fg", storage_path=str(tmp_path), verbose=0)).fit()
    assert grid.num_errors == 0
    paths = ExperimentPaths.at(str(tmp_path / "fg"))
    handle = ftnb.attach(paths.uri)
    assert "Supervisor:" not in handle.text()
    paths.storage.write_json_atomic(paths.supervisor, record)
    snap = handle.monitor().poll()
    assert snap.supervisor_line in handle.text().splitlines()
    assert snap.experiment_json()["supervisor"]["actor"] == "ftnb-sweep1-3f2a"
