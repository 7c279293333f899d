"""``ftnb stop``, ``ftnb rm`` and ``ftnb status NAME`` as real processes against real
experiments: a detached run stopped (one trial, then all) and resumed, rm refusing a live
experiment and asking before it removes, names resolved under the storage path."""

from __future__ import annotations

import os
import pty
import subprocess

import pytest

import ftnb
from clirun import FTNB, cli_in, literal, one_line_error, strict_json
from procs import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cli(tmp_path):
    yield from cli_in(tmp_path)


def _launch_gated(cli, name, xs=(1, 2)):
    space = literal({"x": {"grid_search": list(xs)}, "gate": str(cli.cwd / "gate")})
    done = cli("run", "jobs.py:gated", "-p", space, "-n", name, "--detach", "--concurrency",
               str(len(xs)))
    assert done.returncode == 0, done.stderr
    handle = ftnb.attach(name, storage_path=str(cli.storage))
    wait_for(lambda: all(t.status == "RUNNING" and t.iteration >= 1
                         for t in handle.state().trials), timeout=60, what="the trials to run")
    return handle


def test_stop_a_trial_then_the_experiment_then_resume_it(cli):
    handle = _launch_gated(cli, "stopped")
    first, second = handle.state().trials

    done = cli("stop", "stopped", "--trial", first.trial_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ftnb: stopped trial {first.trial_id} of stopped (STOPPED)"
    statuses = {t.trial_id: t.status for t in handle.state().trials}
    assert statuses == {first.trial_id: "TERMINATED", second.trial_id: "RUNNING"}

    done = cli("stop", "stopped", "--json")
    assert done.returncode == 0, done.stderr
    data = strict_json(done.stdout)
    assert data == {"name": "stopped", "path": handle.path, "trial_id": None,
                    "was_running": True, "stopped": True, "status": "INTERRUPTED",
                    "resume_line": "ftnb resume stopped"}
    assert not handle.is_live()
    again = cli("stop", "stopped")
    assert again.returncode == 0
    assert "is not running (INTERRUPTED); nothing to stop" in again.stdout
    one_line_error(cli("stop", "stopped", "--trial", "nope").stderr, "has no trial 'nope'")

    cli.open_gate()
    done = cli("resume", "stopped", "--detach")
    assert done.returncode == 0, done.stderr
    assert "ftnb: resuming experiment 'stopped'" in done.stdout
    done = cli("watch", "stopped", "--json")
    assert done.returncode == 0
    assert strict_json(done.stdout.splitlines()[-1])["status"] == "FINISHED"
    trials = {t.trial_id: t for t in handle.state().trials}
    assert len(trials[first.trial_id].attempts) == 1  # a stopped trial is done
    assert len(trials[second.trial_id].attempts) == 2


def test_rm_refuses_a_live_experiment_and_asks_before_removing_a_finished_one(cli):
    handle = _launch_gated(cli, "doomed", xs=(1,))
    folder = handle.path
    done = cli("rm", "doomed", "--yes")
    assert done.returncode == 2
    one_line_error(done.stderr, "'doomed' is running", "ftnb stop doomed")
    assert os.path.isdir(folder) and handle.is_live()

    cli.open_gate()
    handle.wait(timeout=60)
    done = cli("rm", "doomed")  # stdin is not a terminal: it cannot ask, so nothing is removed
    assert done.returncode == 1
    one_line_error(done.stderr, "not removed", "--yes")
    assert os.path.isdir(folder)

    for answer, code, kept in ((b"n\n", 1, True), (b"y\n", 0, False)):
        leader, follower = pty.openpty()
        proc = subprocess.Popen([FTNB, "rm", "doomed"], cwd=cli.cwd, env=cli.env,
                                stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.close(follower)
        try:
            os.write(leader, answer)
            out, err = proc.communicate(timeout=60)
        finally:
            os.close(leader)
        assert proc.returncode == code, err
        assert b"Remove experiment 'doomed' (FINISHED, 1 trial)" in err
        assert os.path.isdir(folder) is kept
    assert out.decode().strip() == f"ftnb: removed experiment 'doomed' ({folder})"
    one_line_error(cli("status", "doomed").stderr, "no experiment named 'doomed'")


def test_rm_json_and_rm_by_path(cli):
    assert cli("run", "jobs.py:quick", "-p", '{"x": 1}', "-n", "gone",
               "--verbose", "0").returncode == 0
    path = str(cli.storage / "gone")
    done = cli("rm", path, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert strict_json(done.stdout) == {"name": "gone", "path": path, "removed": True}
    assert not os.path.exists(path) and os.path.isdir(cli.storage)
    # Only experiments: a folder that is not one is left alone.
    (cli.storage / "notes").mkdir()
    done = cli("rm", str(cli.storage / "notes"), "--yes")
    assert done.returncode == 2 and os.path.isdir(cli.storage / "notes")


def test_status_finds_a_name_under_the_storage_path_as_attach_does(cli, tmp_path):
    assert cli("run", "jobs.py:quick", "-p", "jobs.py:space", "-n", "named",
               "--verbose", "0").returncode == 0
    by_name = cli("status", "named")
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout.startswith("Experiment named: FINISHED")
    # --storage instead of the environment; a path as before; a relative folder as before.
    elsewhere = dict(cli.env)
    del elsewhere["FTNB_STORAGE_PATH"]
    for args, cwd in ((["named", "--storage", str(cli.storage)], cli.cwd),
                      ([str(cli.storage / "named")], cli.cwd),
                      (["named"], cli.storage)):
        done = subprocess.run([FTNB, "status", *args], cwd=cwd, env=elsewhere, text=True,
                              capture_output=True, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout == by_name.stdout
    done = cli("status", "nmaed")
    assert done.returncode == 2 and done.stdout == ""
    one_line_error(done.stderr, f"no experiment named 'nmaed' under {cli.storage}",
                   "$FTNB_STORAGE_PATH", "Did you mean 'named'?", f"ftnb ls {cli.storage}")
    done = cli("status", "named", "--storage", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    one_line_error(done.stderr, "storage path", "does not exist")
