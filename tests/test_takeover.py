"""A driver whose death cannot be proven: the views say it is silent, for how long and when it
will count as dead, and offer the takeover, which resumes it at once (issue 19).

Real processes and signals throughout. The JupyterHub case: a driver in its own PID namespace
(``unshare --pid --fork --mount-proc``, as a container or a spawner's namespace) is SIGKILLed
with its namespace's PID 1; its lease's host id names that namespace, so from here its death
cannot be proven and it reads RUNNING until its TTL. A driver alive on this machine is never
taken over; a stopped one is, and when it is continued it finds its lease taken and stops
without writing (as does its trial on another machine: fencing).

The drivers beat every 0.3 s (``$FTNB_LEASE_HEARTBEAT_S``), so they are silent within a second
of their death, with a TTL (120 s) no test waits for.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest

import ftnb
from clirun import FTNB, cli_in, literal, one_line_error
from ftnb.storage import ExperimentPaths
from ftnb.storage.lease import process_name
from ftnb.system.processes import process_status
from procs import (TESTS, holds_a_lock, pid_alive, processes_named, run_script,
                   stop_outside_the_lease_lock, wait_for)
from scripted import result_rows, scripted

TTL_S = 120
SILENT_DRIVER_ENV = {"FTNB_LEASE_TTL_S": str(TTL_S), "FTNB_LEASE_HEARTBEAT_S": "0.3"}
SCRIPTED = f"{TESTS}/scripted.py:scripted"


@pytest.fixture
def cli(tmp_path):
    yield from cli_in(tmp_path)


def _unshare_prefix() -> list[str]:
    """The command that runs a program as PID 1 of a new PID namespace, or a skip."""
    for prefix in (["unshare", "--pid", "--fork", "--mount-proc"],
                   ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    pytest.skip("unshare cannot make a PID namespace here (not root, and user namespaces are "
                "not permitted): the container-kill case needs one")


def _namespace_init(unshare_pid: int) -> int:
    """The pid (seen from here) of PID 1 of the namespace ``unshare --fork`` made."""
    def child():
        try:
            with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as f:
                pids = f.read().split()
        except OSError:
            return None
        return int(pids[0]) if pids else None

    return wait_for(child, what="the namespace's PID 1")


def _exp(cli, name):
    return cli.storage / name


def _trial_dir(exp):
    """The experiment's one trial folder (not control/, which a stop request makes)."""
    dirs = [d for d in exp.iterdir() if (d / "params.json").exists()] if exp.exists() else []
    return dirs[0] if dirs else None


def _owner(exp) -> dict:
    try:
        return json.loads((exp / "owner.json").read_text())
    except (OSError, ValueError):
        return {}


def _silent(cli, name):
    data = cli.status_json(name)
    return data if data["driver_silent_s"] is not None else None


def _start_run(cli, name, space, env=None, prefix=()):
    """``ftnb run`` of the scripted trainable in the foreground (its output to a file)."""
    log = open(cli.cwd / f"{name}.log", "w")
    full_env = dict(cli.env, **(env or {}))
    proc = subprocess.Popen(
        [*prefix, FTNB, "run", SCRIPTED, "-p", literal(space), "-n", name, "--verbose", "0"],
        cwd=cli.cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True)
    log.close()
    return proc


def _at_its_gate(exp, n):
    """The trial's folder, once the trial waits at its gate (before its last iteration)."""
    trial = wait_for(lambda: _trial_dir(exp), what="the trial's folder")
    wait_for(lambda: len(result_rows(str(trial))) == n - 1, what="the trial at its gate")
    return trial


def _end(*procs) -> None:
    """Kill what a test started and left running (continued first, if it was stopped)."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def _assert_each_iteration_once(exp, n):
    rows = result_rows(str(_trial_dir(exp)))
    assert [r["training_iteration"] for r in rows] == list(range(1, n + 1)), rows
    attempts = [r["attempt"] for r in rows]
    assert attempts == sorted(attempts) and attempts[-1] > attempts[0]
    return rows


# -- a driver killed with its PID namespace --------------------------------------------------------
@pytest.fixture
def killed_in_namespace(cli):
    """An experiment whose ``ftnb run`` driver ran in its own PID namespace (with its trial)
    and was SIGKILLed through the namespace's PID 1 a few iterations in."""
    prefix = _unshare_prefix()
    name, n = "ns", 12
    proc = _start_run(cli, name, {"n": n, "sleep": 0.05}, SILENT_DRIVER_ENV, prefix)
    exp = _exp(cli, name)
    try:
        init = _namespace_init(proc.pid)
        trial = wait_for(lambda: _trial_dir(exp), what="the trial's folder")
        wait_for(lambda: len(result_rows(str(trial))) >= 3, what="a few results")
        token = _owner(exp)["token"]
        assert processes_named(process_name(token)), "its trial runs in the namespace"
        os.kill(init, signal.SIGKILL)  # what a container runtime does
        proc.wait(timeout=30)
        # The kernel killed every process of the namespace: the trial too.
        wait_for(lambda: not processes_named(process_name(token)), what="the trial to die")
        assert _owner(exp)["released"] is False  # nobody could say goodbye
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return name, n, exp


def test_a_driver_killed_with_its_pid_namespace_reads_silent_with_a_countdown_and_the_takeover(
        cli, killed_in_namespace):
    name, n, exp = killed_in_namespace
    data = wait_for(lambda: _silent(cli, name), what="the driver to read as silent")
    # Not dead yet (its TTL is 120 s): RUNNING, but silent, with when it will count as dead.
    assert data["status"] == "RUNNING"
    assert 0 < data["driver_silent_s"] < TTL_S
    assert 0 < data["driver_dead_in_s"] <= TTL_S - data["driver_silent_s"] + 1
    assert data["takeover"] == f"ftnb resume {name} --takeover"
    assert data["driver"]["alive"] is True and data["driver"]["gone"] is False
    assert "another PID namespace" in data["driver"]["why"]
    assert "counts as dead in" in data["driver"]["line"]

    text = cli("status", name).stdout
    assert "silent" in text and f"Take it over now with: ftnb resume {name} --takeover" in text
    listing = cli("ls").stdout
    assert "RUNNING (silent)" in listing and "its driver has been silent for" in listing

    # A plain resume is refused, and says how to take it over; a stop does not wait for a
    # driver that may never read its request.
    refused = cli("resume", name)
    assert refused.returncode != 0
    one_line_error(refused.stderr, "silent", f"ftnb resume {name} --takeover")
    stopped = cli("stop", name)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    one_line_error(stopped.stderr, "is not stopped yet", "its driver is silent", "silent for",
                   "counts as dead in", f"ftnb resume {name} --takeover")

    done = cli("resume", name, "--takeover", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"took experiment {name!r} over from its driver" in done.stdout
    assert "FINISHED" in done.stdout
    _assert_each_iteration_once(exp, n)
    after = cli.status_json(name)
    assert after["status"] == "FINISHED" and after["takeover"] is None


def test_the_handle_says_the_driver_is_silent_and_takes_it_over_when_asked(
        cli, killed_in_namespace, capsys, monkeypatch):
    name, n, exp = killed_in_namespace
    monkeypatch.setenv("FTNB_STORAGE_PATH", str(cli.storage))
    handle = ftnb.attach(name)
    wait_for(lambda: handle.monitor().poll().takeover, what="the snapshot to offer the takeover")
    snap = handle.monitor().poll()
    assert snap.status == "RUNNING" and snap.driver_status.silent
    assert snap.to_json()["experiment"]["driver_dead_in_s"] > 0

    assert handle.resume(scripted) is handle  # not without a takeover
    said = capsys.readouterr().out
    assert "still has a driver, silent" in said and "--takeover" in said
    assert handle.status() == "RUNNING"

    resumed = handle.resume(scripted, takeover=True, wait=True)
    said = capsys.readouterr().out
    assert f"took experiment {name!r} over" in said
    assert resumed.status() == "FINISHED"
    _assert_each_iteration_once(exp, n)


# -- a driver alive on this machine --------------------------------------------------------------
def test_a_takeover_of_a_driver_alive_on_this_machine_is_refused_naming_it(cli, tmp_path):
    gate = tmp_path / "gate"
    name = "alive"
    proc = _start_run(cli, name, {"n": 3, "sleep": 0.02, "gate": str(gate)}, SILENT_DRIVER_ENV)
    exp = _exp(cli, name)
    try:
        wait_for(lambda: _trial_dir(exp) and result_rows(str(_trial_dir(exp))),
                 what="a first result")
        owner = _owner(exp)
        assert owner["pid"] == proc.pid
        data = cli.status_json(name)
        assert data["takeover"] is None and data["driver_silent_s"] is None

        refused = cli("resume", name, "--takeover")
        assert refused.returncode != 0
        one_line_error(refused.stderr, f"pid {proc.pid}", "alive on this machine",
                       "is running", "ftnb stop")
        with pytest.raises(ftnb.ExperimentLockedError, match=f"pid {proc.pid}"):
            ftnb.attach(str(exp)).resume(scripted, takeover=True)
        with pytest.raises(ftnb.ExperimentLockedError, match="alive on this machine"):
            ftnb.Tuner.restore(str(exp), scripted, takeover=True)
        assert _owner(exp)["token"] == owner["token"]  # refusals wrote nothing
        assert pid_alive(proc.pid)
    finally:
        gate.write_text("open")
    assert proc.wait(timeout=60) == 0
    assert ftnb.attach(str(exp)).status() == "FINISHED"


# -- fencing: a stopped driver, taken over, then continued ----------------------------------------
@pytest.mark.parametrize("where", ["this machine", "another machine"])
def test_a_stopped_driver_taken_over_never_writes_again(cli, tmp_path, where):
    """The driver is SIGSTOPped with its trial waiting at its last iteration. On this machine
    the takeover kills both; from "another machine" (another host id) it can kill neither: the
    trial must stop by itself at its next report, and the old driver, continued after the new
    one finished, must stop without writing anything."""
    gate = tmp_path / "gate"
    name, n = "stopped", 6
    env = dict(SILENT_DRIVER_ENV)
    if where == "another machine":
        env["FTNB_HOST_ID"] = "machine-a"
    proc = _start_run(cli, name, {"n": n, "sleep": 0.02, "gate": str(gate)}, env)
    exp = _exp(cli, name)
    try:
        trial = _at_its_gate(exp, n)
        old_token = _owner(exp)["token"]
        old_trials = wait_for(lambda: processes_named(process_name(old_token)),
                              what="its trial process")
        stop_outside_the_lease_lock(proc.pid, exp)
        data = wait_for(lambda: _silent(cli, name), what="the stopped driver to read silent")
        if where == "this machine":
            assert "stopped (SIGSTOP" in data["driver"]["why"]
            assert data["driver_dead_in_s"] is None  # never dead on its own while it exists
        else:
            assert 0 < data["driver_dead_in_s"] < TTL_S

        resume = cli.start("resume", name, "--takeover")
        # Once the lease is ours, the gate opens: the old trial (if it still runs) tries to
        # report its last iteration and must be fenced; the new attempt reports it.
        wait_for(lambda: _owner(exp).get("token") not in (None, old_token) or resume.poll(),
                 timeout=60, what="the takeover")
        gate.write_text("open")
        out, err = resume.communicate(timeout=90)
        assert resume.returncode == 0, out + err
        assert "took experiment" in out and "FINISHED" in out
        rows = _assert_each_iteration_once(exp, n)
        assert rows[-1]["attempt"] > rows[0]["attempt"]  # the last one is the new attempt's
        wait_for(lambda: not any(pid_alive(p) for p in old_trials), what="the old trial to end")
        if where == "another machine":
            assert "now run by another driver" in (trial / "stderr").read_text()
        state_after = (exp / "experiment_state.json").read_bytes()
        rows_after = (trial / "result.json").read_bytes()
    finally:
        gate.write_text("open")
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    code = proc.wait(timeout=60)
    log = (cli.cwd / f"{name}.log").read_text()
    if where == "this machine":
        assert code == -signal.SIGKILL, log  # the takeover ended it
    else:
        assert code != 0 and "took over" in log, log  # it woke up, found its lease taken
    assert (exp / "experiment_state.json").read_bytes() == state_after
    assert (trial / "result.json").read_bytes() == rows_after
    assert ftnb.attach(str(exp)).status() == "FINISHED"


# -- the read model, without processes ------------------------------------------------------------
def test_the_takeover_line_is_worded_for_where_it_is_read(tmp_path):
    from ftnb.core.records import ExperimentState
    from ftnb.ui.read_model import ResumeContext, resume_line

    paths = ExperimentPaths.at(str(tmp_path / "exp"))
    state = ExperimentState(name="exp", trainable="mod.train")
    assert resume_line(paths, state, ResumeContext.PYTHON, takeover=True) == (
        f"ftnb.Tuner.restore({paths.uri!r}, mod.train, takeover=True).fit()")
    state.settings["origin"] = {"trainable": "train", "param_space": "space"}
    assert resume_line(paths, state, ResumeContext.MAGICS, takeover=True) == (
        f"%ftresume {paths.uri} --takeover")
    assert resume_line(paths, state, ResumeContext.PYTHON, takeover=True) == (
        f"ftnb.attach({paths.uri!r}).resume(train, param_space=space, takeover=True)")
    state.settings["origin"] = {"via": "cli"}
    assert resume_line(paths, state, ResumeContext.TERMINAL, takeover=True).endswith(
        " --takeover")


# -- Tuner.restore(takeover=True) of a driver stopped at any moment, a heartbeat's too -------------
_RESTORE = """
import sys
import ftnb
from scripted import scripted

grid = ftnb.Tuner.restore(sys.argv[1], scripted, takeover=True, verbose=0).fit()
print("RESTORED", ftnb.attach(sys.argv[1]).status())
"""


def _fast_beating_driver(cli, tmp_path, name, n, **env):
    """``(proc, exp, gate)``: an ``ftnb run`` driver beating every 0.2 s (the fastest), its
    trial to wait at the gate before iteration ``n``; ``env`` added to its environment."""
    gate = tmp_path / "gate"
    env = dict(SILENT_DRIVER_ENV, FTNB_LEASE_HEARTBEAT_S="0.2", **env)
    proc = _start_run(cli, name, {"n": n, "sleep": 0.02, "gate": str(gate)}, env)
    return proc, _exp(cli, name), gate


def _start_restore(cli, tmp_path, exp):
    """``Tuner.restore(exp, scripted, takeover=True).fit()`` in a process of its own."""
    return run_script(tmp_path, _RESTORE, str(exp),
                      env={k: v for k, v in cli.env.items() if k.startswith("FTNB_")})


def _stop_inside_the_lease_lock(proc, exp, timeout=30.0) -> bool:
    """SIGSTOP the driver the moment it is seen holding the lease lock (inside a heartbeat),
    again until it stays stopped there; False if that never happened within ``timeout``."""
    lock = exp / ".owner.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not holds_a_lock(proc.pid, lock):
            continue  # a busy poll: a heartbeat holds the lock for about a millisecond
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: process_status(proc.pid) == "T", what="the driver to stop")
        if holds_a_lock(proc.pid, lock):
            return True
        os.kill(proc.pid, signal.SIGCONT)
    return False


@pytest.mark.parametrize("moment", ["inside a heartbeat", "at random", "at random "])
def test_tuner_restore_takes_over_a_driver_stopped_at_any_moment(cli, tmp_path, moment):
    """The driver (a heartbeat every 0.2 s) is SIGSTOPped inside a heartbeat, holding the lease
    lock, or at a random moment; Tuner.restore(takeover=True) must take it over at once (it
    waited for that lock forever), end it (continued, it could only write without a lease),
    and finish the experiment with each iteration once."""
    n = 3
    proc, exp, gate = _fast_beating_driver(cli, tmp_path, "restored", n)
    restore = None
    try:
        _at_its_gate(exp, n)
        old_token = _owner(exp)["token"]
        if moment == "inside a heartbeat":
            if not _stop_inside_the_lease_lock(proc, exp):
                pytest.skip("never caught the driver inside a heartbeat")
        else:
            time.sleep(random.uniform(0, 0.4))  # a random moment, not a wait for a condition
            os.kill(proc.pid, signal.SIGSTOP)
        restore = _start_restore(cli, tmp_path, exp)
        wait_for(lambda: _owner(exp).get("token") not in (None, old_token)
                 or restore.poll() is not None, timeout=30, what="the takeover")
        gate.write_text("open")
        out, _ = restore.communicate(timeout=90)
        assert restore.returncode == 0, out
        assert "RESTORED FINISHED" in out
        _assert_each_iteration_once(exp, n)
        assert proc.wait(timeout=30) == -signal.SIGKILL  # the takeover ended it
    finally:
        gate.write_text("open")
        _end(proc, restore)


def test_tuner_restore_of_a_driver_of_another_machine_stopped_in_a_heartbeat_waits_saying_so(
        cli, tmp_path):
    """A driver of "another machine" (another host id: it cannot be killed from here) stopped
    inside a heartbeat holds the lease lock: Tuner.restore(takeover=True) says it waits for
    it; continued, the old driver finishes that heartbeat, then finds its lease taken and
    stops without writing, and the restore finishes the experiment, each iteration once."""
    name, n = "elsewhere", 3
    proc, exp, gate = _fast_beating_driver(cli, tmp_path, name, n, FTNB_HOST_ID="machine-a")
    restore = None
    try:
        _at_its_gate(exp, n)
        old_token = _owner(exp)["token"]
        if not _stop_inside_the_lease_lock(proc, exp):
            pytest.skip("never caught the driver inside a heartbeat")
        restore = _start_restore(cli, tmp_path, exp)
        said = []
        wait_for(lambda: said.append(restore.stdout.readline()) or
                 "waiting for the lease lock" in said[-1], timeout=60, what="the note")
        assert "stopped inside a heartbeat" in said[-1] and _owner(exp)["token"] == old_token
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: _owner(exp).get("token") not in (None, old_token), what="the takeover")
        gate.write_text("open")
        out, _ = restore.communicate(timeout=90)
        assert restore.returncode == 0, "".join(said) + out
        assert "RESTORED FINISHED" in out
        _assert_each_iteration_once(exp, n)
        state_after = (exp / "experiment_state.json").read_bytes()
        code = proc.wait(timeout=60)
        log = (cli.cwd / f"{name}.log").read_text()
        assert code != 0 and "took over" in log, log  # fenced: it found its lease taken
        assert (exp / "experiment_state.json").read_bytes() == state_after
    finally:
        gate.write_text("open")
        _end(proc, restore)


# -- a stop asked of a silent driver ---------------------------------------------------------------
def test_a_stop_of_a_silent_driver_says_so_at_once_and_stands_until_it_wakes(
        cli, tmp_path, capsys):
    """A driver stopped (SIGSTOP) on this machine: ``ftnb stop``, ``handle.stop()`` and
    ``%ftstop`` each say at once (not after their 60 s timeout) that it is silent, for how
    long, that it is not stopped yet, and how to take it over; none says it stopped. The
    request stays written: continued, the driver honours it and the experiment ends
    INTERRUPTED."""
    from IPython.core.error import UsageError

    from ftnb.notebook.magics import FtnbMagics

    gate = tmp_path / "gate"
    name, n = "silentstop", 4
    proc = _start_run(cli, name, {"n": n, "sleep": 0.02, "gate": str(gate)}, SILENT_DRIVER_ENV)
    exp = _exp(cli, name)
    try:
        trial = _at_its_gate(exp, n)
        stop_outside_the_lease_lock(proc.pid, exp)

        started = time.monotonic()
        done = cli("stop", name, "--timeout", "60")
        assert time.monotonic() - started < 20  # at once, not after the timeout
        assert done.returncode == 1, done.stdout + done.stderr  # not stopped: not a success
        assert "stopped " not in done.stdout
        one_line_error(done.stderr, "is not stopped yet", "silent", "stopped (SIGSTOP",
                       "The request stands", f"ftnb resume {name} --takeover")
        assert list((exp / "control").iterdir()), "the stop request stays written"

        as_json = cli("stop", name, "--json", "--timeout", "60")
        assert as_json.returncode == 1
        data = json.loads(as_json.stdout)
        assert data["stopped"] is False and data["status"] == "RUNNING"
        assert data["driver_silent_s"] >= 0 and data["driver_dead_in_s"] is None
        assert data["takeover"] == f"ftnb resume {name} --takeover"

        no_wait = cli("stop", name, "--no-wait")
        assert no_wait.returncode == 0 and "is not stopped yet" in no_wait.stdout

        handle = ftnb.attach(str(exp))
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="not stopped yet") as raised:  # DriverSilentError
            handle.stop(timeout=60)
        assert time.monotonic() - started < 10
        assert raised.value.takeover == f"ftnb resume {exp} --takeover"  # it ran from a terminal
        assert raised.value.dead_in_s is None  # stopped here: never dead on its own
        with pytest.raises(TimeoutError, match=f"trial {trial.name} of"):
            handle.stop_trial(trial.name, timeout=60)

        capsys.readouterr()
        with pytest.raises(UsageError, match="is not stopped yet") as raised:  # one line
            FtnbMagics().ftstop(f"{exp} --timeout 60")
        assert f"resume {exp} --takeover" in str(raised.value)
        assert "stopped silentstop" not in capsys.readouterr().out
        assert ftnb.attach(str(exp)).status() == "RUNNING"

        os.kill(proc.pid, signal.SIGCONT)  # it wakes, acts on the requests (and deletes them)
        wait_for(lambda: not list((exp / "control").iterdir()), what="the requests read")
        gate.write_text("open")  # its trial reports, and is stopped there
        assert proc.wait(timeout=60) != 0
    finally:
        gate.write_text("open")
        _end(proc)
    assert ftnb.attach(str(exp)).status() == "INTERRUPTED"
