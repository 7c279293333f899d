"""``ftnb run`` and ``ftnb resume`` as real processes: the installed entry point, trainables
imported from a file or a module (in the trial processes and the supervisor too), the foreground
run with its exit codes (0, 1, 130 on SIGINT), --detach, --json."""

from __future__ import annotations

import os
import signal
import sys

import pytest

import ftnb
from clirun import cli_in, literal, one_line_error, strict_json, write
from procs import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cli(tmp_path):
    yield from cli_in(tmp_path)


def _state(cli, name):
    return ftnb.attach(name, storage_path=str(cli.storage)).state()


def _gated_space(cli, xs=(1, 2)):
    return literal({"x": {"grid_search": list(xs)}, "gate": str(cli.cwd / "gate")})


def _wait_running(cli, name, trials=2):
    def running():
        try:
            state = _state(cli, name)
        except Exception:
            return None
        ready = [t for t in state.trials if t.status == "RUNNING" and t.iteration >= 1]
        return len(ready) == trials and state.trials

    return wait_for(running, timeout=60, what=f"{trials} trials of {name} to report")


def test_run_a_file_in_the_foreground_prints_progress_and_exits_0(cli):
    done = cli("run", "jobs.py:quick", "--param-space", "jobs.py:space", "--name", "s1",
               "--max-failures", "2")
    assert done.returncode == 0, done.stderr
    assert "(" in done.stdout and ") step 2" in done.stdout  # the trials' output, live
    assert "Experiment s1: FINISHED | 2 TERMINATED" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(
        "ftnb: experiment 's1' FINISHED: 2 trials, 2 terminated, 0 errored")
    state = _state(cli, "s1")
    assert [t.last_result["loss"] for t in state.trials] == pytest.approx([1 / 3, 2 / 3])
    origin = state.settings["origin"]
    assert origin["via"] == "cli" and origin["trainable"] == f"{cli.cwd / 'jobs.py'}:quick"
    assert origin["param_space"] == f"{cli.cwd / 'jobs.py'}:space"
    assert origin["source"].startswith("ftnb run jobs.py:quick --param-space jobs.py:space")
    assert state.settings["failure_config"]["max_failures"] == 2


def test_the_same_command_again_does_not_run_a_finished_experiment_again(cli):
    assert cli("run", "jobs.py:quick", "-p", "jobs.py:space", "-n", "again").returncode == 0
    before = _state(cli, "again")
    done = cli("run", "jobs.py:quick", "-p", "jobs.py:space", "-n", "again")
    assert done.returncode == 0, done.stderr
    assert "already finished; nothing to resume" in done.stdout
    after = _state(cli, "again")
    assert [len(t.attempts) for t in after.trials] == [len(t.attempts) for t in before.trials]


def test_a_dotted_module_from_the_current_folder_reaches_the_trials_and_the_supervisor(cli):
    # Found as `python -m` finds it (the entry point's own folder is not the current one),
    # pickled by reference: the trials and the supervisor import it from the same path.
    write(cli.cwd, "mypkg/__init__.py", "")
    write(cli.cwd, "mypkg/helpers.py", "FACTOR = 10\n")
    write(cli.cwd, "mypkg/jobs.py", """
        import ftnb
        from mypkg.helpers import FACTOR

        def train(config):
            ftnb.report({"y": config["x"] * FACTOR})
        """)
    done = cli("run", "mypkg.jobs:train", "-p", '{"x": {"grid_search": [1, 2]}}', "-n", "mod",
               "--verbose", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [t.last_result["y"] for t in _state(cli, "mod").trials] == [10, 20]

    done = cli("run", "mypkg.jobs:train", "-p", '{"x": 3}', "-n", "mod_bg", "--detach")
    assert done.returncode == 0, done.stderr
    assert "runs in the background" in done.stdout
    handle = ftnb.attach("mod_bg", storage_path=str(cli.storage))
    assert handle.wait(timeout=60).num_errors == 0
    assert handle.state().trials[0].last_result["y"] == 30


@pytest.mark.parametrize("filename", ["train_job.py", "my-train.py", "json.py"])
def test_a_file_reaches_a_detached_supervisor_and_its_trials(cli, filename):
    # train_job.py is importable by its name (by reference, its folder on the path that
    # travels); my-train.py is not a module name and json.py is the standard library's:
    # those are sent by value. Each imports a sibling module of its folder.
    write(cli.cwd, "sub/helper.py", "OFFSET = 100\n")
    write(cli.cwd, f"sub/{filename}", """
        import ftnb
        from helper import OFFSET

        def train(config):
            ftnb.report({"y": config["x"] + OFFSET})
        """)
    name = "file_" + filename.replace(".", "_").replace("-", "_")
    done = cli("run", f"sub/{filename}:train", "-p", '{"x": 5}', "-n", name, "--detach")
    assert done.returncode == 0, done.stdout + done.stderr
    handle = ftnb.attach(name, storage_path=str(cli.storage))
    results = handle.wait(timeout=60)
    assert results.num_errors == 0, open(handle.supervisor_log).read()
    assert handle.state().trials[0].last_result["y"] == 105


def test_more_concurrency_than_fits_is_said_once_at_the_start(cli):
    cli.env["FTNB_NUM_CPUS"] = "2"
    space = literal({"x": {"grid_search": [1, 2, 3, 4]}})
    note = "ftnb: only 2 trials run at once, not the 4 asked for"
    done = cli("run", "jobs.py:quick", "-p", space, "-n", "c4", "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(note) == 1 and done.stdout.startswith(note), done.stdout
    assert "each trial asks for 1 CPU, and this machine has 2 CPUs" in done.stdout
    assert "--cpus-per-trial 0.5" in done.stdout and "FTNB_NUM_CPUS" in done.stdout
    done = cli("run", "jobs.py:quick", "-p", space, "-n", "c4d", "--concurrency", "4",
               "--detach")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(note) == 1, done.stdout
    ftnb.attach("c4d", storage_path=str(cli.storage)).wait(timeout=60)
    done = cli("run", "jobs.py:quick", "-p", space, "-n", "c2", "--concurrency", "2")
    assert done.returncode == 0 and "at once" not in done.stdout, done.stdout


def test_an_errored_experiment_exits_1_with_its_error(cli):
    done = cli("run", "jobs.py:broken", "-p", "jobs.py:space", "-n", "broken", "--verbose", "0")
    assert done.returncode == 1, done.stderr
    assert "ftnb: experiment 'broken' ERRORED: 2 trials, 1 terminated, 1 errored" in done.stdout
    assert "ERRORED: exception ValueError: x=2 is broken and says so" in done.stdout


def test_json_is_one_strict_document_with_the_full_error(cli):
    done = cli("run", "jobs.py:broken", "-p", "jobs.py:space", "-n", "broken_json", "--json")
    assert done.returncode == 1
    data = strict_json(done.stdout)  # the progress went to stderr
    assert "Experiment broken_json" in done.stderr
    assert data["name"] == "broken_json" and data["status"] == "ERRORED"
    errored = [r for r in data["rows"] if r["status"] == "ERRORED"]
    assert len(errored) == 1
    # In full: the table cuts it at 60 characters.
    assert errored[0]["last_error"].endswith("and says so at length (attempt 1, iter 1)")
    assert len(errored[0]["last_error"]) > 100
    assert "Traceback" in errored[0]["last_failure"]["traceback"]
    assert all(r["metrics"]["loss"] is None for r in data["rows"])  # NaN is null
    status = strict_json(cli("status", "broken_json", "--json").stdout)
    assert status["rows"] == data["rows"] and status["resume_line"] is None


def test_sigint_stops_cleanly_prints_the_resume_line_exits_130_and_resume_finishes(cli):
    proc = cli.start("run", "jobs.py:gated", "-p", _gated_space(cli), "-n", "ctrlc",
                     "--verbose", "0")
    try:
        _wait_running(cli, "ctrlc")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "stopping experiment 'ctrlc'" in err
    assert out.strip().splitlines()[-1] == "Resume it with: ftnb resume ctrlc"
    state = _state(cli, "ctrlc")
    assert state.status == "INTERRUPTED"
    assert {t.status for t in state.trials} == {"PAUSED"}
    stopped_at = {t.trial_id: t.iteration for t in state.trials}

    status = strict_json(cli("status", "ctrlc", "--json").stdout)
    assert status["status"] == "INTERRUPTED" and status["resume_line"] == "ftnb resume ctrlc"

    cli.open_gate()
    done = cli("resume", "ctrlc", "--verbose", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ftnb: resuming experiment 'ctrlc'" in done.stdout
    state = _state(cli, "ctrlc")
    assert state.status == "FINISHED"
    for trial in state.trials:
        # The second attempt ran (from scratch: gated keeps no checkpoint).
        assert trial.status == "TERMINATED" and len(trial.attempts) == 2
        assert trial.last_result["attempt"] == 2 and stopped_at[trial.trial_id] >= 1


def test_sigterm_stops_cleanly_too(cli):
    proc = cli.start("run", "jobs.py:gated", "-p", _gated_space(cli, [1]), "-n", "term",
                     "--verbose", "0")
    try:
        _wait_running(cli, "term", trials=1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, (out, err)
    assert out.strip().splitlines()[-1] == "Resume it with: ftnb resume term"
    assert _state(cli, "term").status == "INTERRUPTED"


def test_a_second_ctrl_c_does_not_wait_for_the_next_report_and_saves_the_state(cli):
    write(cli.cwd, "slow.py", """
        import time
        import ftnb

        def train(config):
            for i in range(100):
                ftnb.report({"i": i})
                time.sleep(30)  # the first Ctrl+C would wait for its next report
        """)
    # The first Ctrl+C alone would end it after the 3 s grace (the second comes well before);
    # the second stops it at once: the controller waits at most that grace, then kills.
    proc = cli.start("run", "slow.py:train", "-n", "twice", "--verbose", "0",
                     "--preemption-grace", "3")
    try:
        _wait_running(cli, "twice", trials=1)
        proc.send_signal(signal.SIGINT)
        control = cli.storage / "twice" / "control"
        wait_for(lambda: control.is_dir() and any(control.iterdir()), timeout=60,
                 what="the stop request of the first Ctrl+C")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "ftnb resume twice" in err  # said once, by the driver that saved the state
    assert "Resume it with" not in out
    state = _state(cli, "twice")
    assert state.status == "INTERRUPTED" and state.trials[0].status == "PAUSED"


def test_resume_without_a_recorded_reference_says_what_to_pass(cli, tmp_path):
    script = write(cli.cwd, "script.py", f"""
        import sys
        sys.path.insert(0, {str(cli.cwd)!r})
        import ftnb
        from jobs import broken
        ftnb.run(broken, name="scripted", storage_path={str(cli.storage)!r},
                 param_space={{"x": ftnb.grid_search([1, 2])}},
                 run_config=ftnb.RunConfig(verbose=0))
        """)
    import subprocess

    subprocess.run([sys.executable, str(script)], cwd=cli.cwd, check=True, timeout=120,
                   capture_output=True)
    done = cli("resume", "scripted")
    assert done.returncode == 2
    one_line_error(done.stderr, "Python script", "--trainable FILE.py:broken")
    # The fix works; a function of another name must be allowed explicitly.
    done = cli("resume", "scripted", "--trainable", "jobs.py:renamed", "--verbose", "0")
    assert done.returncode == 2
    one_line_error(done.stderr, "--allow-different-trainable")
    done = cli("resume", "scripted", "--trainable", "jobs.py:renamed", "--verbose", "0",
               "--allow-different-trainable")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _state(cli, "scripted").status == "FINISHED"
    assert _state(cli, "scripted").settings["origin"]["trainable"].endswith("jobs.py:renamed")


def test_detach_of_a_running_experiment_attaches_and_the_foreground_refuses(cli):
    done = cli("run", "jobs.py:gated", "-p", _gated_space(cli, [1]), "-n", "live", "--detach",
               "--json")
    assert done.returncode == 0, done.stderr
    data = strict_json(done.stdout)
    assert data["name"] == "live" and data["supervisor"]["pid"] > 0
    try:
        again = cli("run", "jobs.py:gated", "-p", _gated_space(cli, [1]), "-n", "live",
                    "--detach")
        assert again.returncode == 0 and "already running" in again.stdout
        here = cli("run", "jobs.py:gated", "-p", _gated_space(cli, [1]), "-n", "live")
        assert here.returncode == 2
        one_line_error(here.stderr, "already running", "ftnb watch live", "ftnb stop live")
    finally:
        cli.open_gate()
    assert ftnb.attach("live", storage_path=str(cli.storage)).wait(timeout=60).num_errors == 0


def test_python_dash_m_ftnb_is_the_same_command(cli):
    done = cli("run", "jobs.py:quick", "-p", '{"x": 1}', "-n", "dash_m", "--verbose", "0",
               command=(sys.executable, "-m", "ftnb"))
    assert done.returncode == 0, done.stderr
    assert os.path.isdir(cli.storage / "dash_m")
