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
import signal
import subprocess

import pytest

import ftnb
from clirun import FTNB, cli_in, literal, one_line_error
from ftnb.storage import ExperimentPaths
from ftnb.storage.lease import process_name
from procs import TESTS, pid_alive, processes_named, wait_for
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


def _status_json(cli, name) -> dict:
    done = cli("status", name, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _silent(cli, name):
    data = _status_json(cli, name)
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


def _holds_a_lock(pid: int, path) -> bool:
    """Whether process ``pid`` holds a lock on the file ``path`` (``/proc/locks``)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields:  # a waiter, not a holder
                continue
            if len(fields) >= 6 and fields[4] == str(pid) and fields[5].endswith(f":{inode}"):
                return True
    return False


def _stop_outside_the_lease_lock(proc, exp) -> None:
    """SIGSTOP the driver, again until it is not stopped inside a heartbeat, where it would
    hold the lease lock of this disk until continued (a takeover waits for that lock)."""
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: _process_state(proc.pid) == "T", what="the driver to stop")
        if not _holds_a_lock(proc.pid, exp / ".owner.lock"):
            return
        os.kill(proc.pid, signal.SIGCONT)


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rfind(b")") + 2:][:1].decode()


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
    assert stopped.returncode == 0, stopped.stderr
    assert "its driver is silent" in stopped.stdout
    assert f"ftnb resume {name} --takeover" in stopped.stdout

    done = cli("resume", name, "--takeover", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"took experiment {name!r} over from its driver" in done.stdout
    assert "FINISHED" in done.stdout
    _assert_each_iteration_once(exp, n)
    after = _status_json(cli, name)
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
        data = _status_json(cli, name)
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
        trial = wait_for(lambda: _trial_dir(exp), what="the trial's folder")
        wait_for(lambda: len(result_rows(str(trial))) == n - 1, what="the trial at its gate")
        old_token = _owner(exp)["token"]
        old_trials = wait_for(lambda: processes_named(process_name(old_token)),
                              what="its trial process")
        _stop_outside_the_lease_lock(proc, exp)
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
