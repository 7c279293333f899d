"""Experiments in a detached supervisor: ftnb.launch / attach / ExperimentHandle and control
requests, with real processes (the launcher and the supervisor SIGKILLed for real)."""

from __future__ import annotations

import json
import os
import signal

import pytest

import ftnb
from ftnb import supervisor
from ftnb.storage.control import STOP_TRIAL, send_request
from ftnb.handle import ExperimentNotFoundError
from ftnb.storage.lease import process_name, read_lease
from ftnb.storage import ExperimentPaths, Storage
from procs import pid_alive, processes_named, run_script, wait_for
from scripted import executed, result_rows, scripted, uses_objects

pytestmark = pytest.mark.timeout(180)


def _space(tmp_path, n=6, sleep=0.05, trials=2, gate=True):
    return {"n": n, "sleep": sleep, "ckpt_every": 1, "x": ftnb.grid_search(list(range(trials))),
            **({"gate": str(tmp_path / "gate")} if gate else {})}


def _open_gate(tmp_path):
    (tmp_path / "gate").write_text("open")


def _record(handle):
    with open(handle.paths.supervisor) as f:
        return json.load(f)


def _trial_dirs(handle):
    return {t.trial_id: os.path.join(handle.path, t.dir_name) for t in handle.state().trials}


def test_launch_returns_while_the_experiment_runs_in_a_session_of_its_own(tmp_path, capsys):
    handle = ftnb.launch(scripted, param_space=_space(tmp_path), name="bg",
                         storage_path=str(tmp_path / "store"))
    assert "runs in the background" in capsys.readouterr().out
    assert handle.status() == "RUNNING" and handle.is_live()
    pid = _record(handle)["pid"]
    assert pid != os.getpid() and read_lease(handle.paths).pid == pid
    # A new session: the kernel's Ctrl+C, restart or culling signals never reach it.
    assert os.getsid(pid) == pid != os.getsid(0)
    _open_gate(tmp_path)
    results = handle.wait(timeout=60)
    assert handle.status() == "FINISHED" and not handle.is_live()
    assert len(results) == 2 and not results.errors
    assert sorted(r.metrics["training_iteration"] for r in results) == [6, 6]
    log = handle.supervisor_log
    assert log == os.path.join(handle.path, "supervisor.log")
    with open(log) as f:
        assert "supervisor exiting" in f.read()
    assert _record(handle)["outcome"] == "finished"
    assert not pid_alive(pid)  # wait() returns once the supervisor has exited


def test_wait_from_another_handle_returns_once_the_supervisor_has_written_its_end(tmp_path):
    """An attached handle (a new kernel's) did not start the supervisor, yet its wait() also
    returns only after the supervisor recorded its outcome and exited."""
    launched = ftnb.launch(scripted, param_space=_space(tmp_path), name="bg2",
                           storage_path=str(tmp_path / "store"), quiet=True)
    pid = _record(launched)["pid"]
    attached = ftnb.attach(launched.path)
    assert attached._process is None and attached.is_live()
    _open_gate(tmp_path)
    results = attached.wait(timeout=60)
    assert len(results) == 2 and not results.errors
    assert _record(attached)["outcome"] == "finished" and not pid_alive(pid)
    with open(attached.supervisor_log) as f:
        assert f.read().rstrip().endswith("supervisor exiting.")


def test_the_experiment_and_its_objects_outlive_the_process_that_launched_it(tmp_path):
    """The launcher (standing in for a kernel) is SIGKILLed right after launch(): the trials,
    later ones included, still run to the end and still see the launcher's ftnb.put objects."""
    store = tmp_path / "store"
    launcher = run_script(tmp_path, f"""
        import time
        import numpy as np, pandas as pd
        import ftnb
        from scripted import uses_objects
        space = {{"data": np.arange(10.0), "frame": pd.DataFrame({{"x": [1.0, 2.0]}}),
                  "w": ftnb.grid_search([0, 1, 2]), "n": 3, "sleep": 0.1}}
        h = ftnb.launch(uses_objects, param_space=space, name="orphan", storage_path={str(store)!r},
                        tune_config=ftnb.TuneConfig(max_concurrent_trials=1))
        print("LAUNCHED", flush=True)
        time.sleep(600)
    """)
    wait_for(lambda: "LAUNCHED" in launcher.stdout.readline(), timeout=60, what="the launch")
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    handle = ftnb.attach(str(store / "orphan"))
    results = handle.wait(timeout=90)
    assert handle.status() == "FINISHED"
    assert sorted(r.metrics["w"] for r in results) == [0, 1, 2]
    for result in results:
        assert result.metrics["data_sum"] == 45.0 and result.metrics["frame_sum"] == 3.0


def test_a_second_launch_of_a_running_experiment_attaches_to_it(tmp_path, capsys):
    store = str(tmp_path / "store")
    first = ftnb.launch(scripted, param_space=_space(tmp_path), name="once", storage_path=store)
    pid = _record(first)["pid"]
    second = ftnb.launch(scripted, param_space=_space(tmp_path), name="once", storage_path=store)
    assert "already running" in capsys.readouterr().out
    assert second.path == first.path and _record(second)["pid"] == pid
    assert read_lease(second.paths).pid == pid
    _open_gate(tmp_path)
    assert len(second.wait(timeout=60)) == 2
    # Every trial ran once: no duplicate controller started them again.
    for trial in second.state().trials:
        assert len(trial.attempts) == 1


def test_a_killed_supervisor_leaves_an_interrupted_experiment_that_launch_resumes(tmp_path,
                                                                                capsys):
    store = str(tmp_path / "store")
    space = _space(tmp_path, n=8, sleep=0.1)
    handle = ftnb.launch(scripted, param_space=space, name="phoenix", storage_path=store)
    token = read_lease(handle.paths).token
    wait_for(lambda: all(len(executed(d)) >= 3 for d in _trial_dirs(handle).values()),
             timeout=60, what="three steps of every trial")
    os.kill(_record(handle)["pid"], signal.SIGKILL)
    wait_for(lambda: handle.status() == "INTERRUPTED", timeout=30, what="INTERRUPTED")
    # Its trials died with it: none of them is left to write into the experiment.
    wait_for(lambda: not processes_named(process_name(token)), timeout=30,
             what="the killed supervisor's trials to exit")
    # Outside IPython the line is Python (%ftresume where the magics are loaded).
    assert handle.resume_line == f"ftnb.attach({handle.path!r}).resume(scripted)"
    assert f"Resume it with: {handle.resume_line}" in handle.text()
    _open_gate(tmp_path)
    capsys.readouterr()
    again = ftnb.launch(scripted, param_space=space, name="phoenix", storage_path=store)
    assert "resuming experiment 'phoenix'" in capsys.readouterr().out
    results = again.wait(timeout=90)
    assert again.status() == "FINISHED" and len(results) == 2
    for trial_dir in _trial_dirs(again).values():
        assert [r["training_iteration"] for r in result_rows(trial_dir)] == list(range(1, 9))


def test_stop_a_trial_then_the_experiment_then_resume_it(tmp_path):
    store = str(tmp_path / "store")
    space = _space(tmp_path, n=5, sleep=0.05, trials=3)
    # The gated trials wait without reporting: a stopped one is killed after the grace period.
    quick = ftnb.RunConfig(failure_config=ftnb.FailureConfig(preemption_grace_period_s=0.5))
    handle = ftnb.launch(scripted, param_space=space, name="ctl", storage_path=store,
                         run_config=quick, quiet=True)
    # Two CPUs: two trials run, the third waits for a free one.
    running = wait_for(lambda: [t.trial_id for t in handle.state().trials if t.iteration >= 1],
                       timeout=60, what="a trial to report")
    first = running[0]
    others = sorted(set(_trial_dirs(handle)) - {first})
    handle.stop_trial(first, timeout=30)
    trials = {t.trial_id: t for t in handle.state().trials}
    assert trials[first].status == "TERMINATED" and trials[first].note == "stopped by user"
    assert all(trials[t].status in ("RUNNING", "PENDING") for t in others)
    assert handle.status() == "RUNNING"
    handle.stop(timeout=30)
    assert handle.status() == "INTERRUPTED" and not handle.is_live()
    trials = {t.trial_id: t for t in handle.state().trials}
    assert trials[first].status == "TERMINATED"
    assert all(trials[t].status in ("PAUSED", "PENDING") for t in others)
    handle.stop()  # stopping a stopped experiment says so and does nothing
    _open_gate(tmp_path)
    resumed = handle.resume(quiet=True)  # this process launched it: it knows the trainable
    resumed.wait(timeout=60)
    final = {t.trial_id: t for t in resumed.state().trials}
    assert final[first].iteration < 5 and len(final[first].attempts) == 1  # not run again
    assert all(final[t].status == "TERMINATED" and final[t].iteration == 5 for t in others)


def test_control_requests_reach_a_plain_script_and_stale_ones_are_dropped(tmp_path):
    """`Tuner.fit()` in a script obeys the same requests; a request left for a driver that
    is gone is not acted upon by the next one."""
    store = tmp_path / "store"
    gate = tmp_path / "gate"
    script = run_script(tmp_path, f"""
        import ftnb
        from scripted import scripted
        space = {{"n": 4, "sleep": 0.05, "gate": {str(gate)!r}, "x": ftnb.grid_search([0, 1])}}
        quick = ftnb.FailureConfig(preemption_grace_period_s=0.5)
        ftnb.Tuner(scripted, param_space=space,
                   run_config=ftnb.RunConfig(name="script", storage_path={str(store)!r},
                                             failure_config=quick)).fit()
        print("FIT RETURNED", flush=True)
    """)
    paths = ExperimentPaths.of(Storage(str(store)), "script")
    wait_for(lambda: paths.has_state() and read_lease(paths) is not None, timeout=60,
             what="the script's experiment")
    handle = ftnb.attach(paths.dir)
    victim, other = sorted(t.trial_id for t in handle.state().trials)
    handle.stop_trial(victim, timeout=30)
    handle.stop(timeout=30)
    out, _ = script.communicate(timeout=60)
    assert "FIT RETURNED" in out
    assert handle.status() == "INTERRUPTED"
    # A request for nobody: the next driver must not stop `other` because of it.
    send_request(paths, STOP_TRIAL, other)
    gate.write_text("open")
    resumed = handle.resume(scripted, param_space=None, quiet=True)
    resumed.wait(timeout=60)
    trials = {t.trial_id: t for t in resumed.state().trials}
    assert trials[other].status == "TERMINATED" and trials[other].iteration == 4
    assert trials[other].note is None
    assert os.listdir(paths.control) == []


def test_bad_input_raises_in_the_caller_before_anything_starts(tmp_path):
    store = tmp_path / "store"
    with pytest.raises(TypeError, match=r"ftnb.launch\(trainable=...\) must be a function"):
        ftnb.launch("train", name="bad", storage_path=str(store))
    with pytest.raises(ValueError, match="name"):
        ftnb.launch(scripted, name="a/b", storage_path=str(store))
    with pytest.raises(ValueError, match="cpu|CPU"):
        ftnb.launch(scripted, name="big", storage_path=str(store),
                    resources_per_trial={"cpu": 10_000})
    assert not (store / "bad").exists() and not (store / "big").exists()
    with pytest.raises(ExperimentNotFoundError, match="No ftnb experiment named 'nope'"):
        ftnb.attach("nope", storage_path=str(store))
    with pytest.raises(ExperimentNotFoundError, match="in that folder"):
        ftnb.attach(str(tmp_path))


def test_a_stop_for_an_unknown_trial_names_the_trials(tmp_path):
    handle = ftnb.launch(scripted, param_space=_space(tmp_path, gate=False), name="ids",
                         storage_path=str(tmp_path / "store"), quiet=True, wait=True)
    with pytest.raises(ValueError, match="has no trial 'zzz'; its trials: "):
        handle.stop_trial("zzz")


def test_errors_in_the_supervisor_reach_the_caller_as_themselves(tmp_path):
    """What stops the supervisor before the experiment runs is raised by start() with its
    own type; a supervisor that dies without a word is a SupervisorError with its log."""
    store = str(tmp_path / "store")
    handle = ftnb.launch(scripted, param_space=_space(tmp_path), name="taken",
                         storage_path=store, quiet=True)
    # Past launch()'s own check: the supervisor finds the experiment owned and says so.
    spec = supervisor.LaunchSpec(scripted, "taken", param_space=_space(tmp_path),
                                 storage_path=store)
    with pytest.raises(ftnb.ExperimentLockedError, match="pid"):
        supervisor.start(spec)
    # The caller's path is how the supervisor finds the trainable's module.
    lost = supervisor.LaunchSpec(scripted, "lost", storage_path=store,
                                 sys_path=[p for p in os.sys.path if not p.endswith("tests")])
    with pytest.raises(ModuleNotFoundError, match="scripted"):
        supervisor.start(lost)
    with pytest.raises(supervisor.SupervisorError, match="exited with code 3"):
        supervisor.start(supervisor.LaunchSpec(_ExitOnLoad(), "dies", storage_path=store))
    assert not os.path.exists(os.path.join(store, "lost"))
    assert not os.path.exists(os.path.join(store, "dies"))
    _open_gate(tmp_path)
    handle.wait(timeout=60)


class _ExitOnLoad:
    """Unpickles as a call to os._exit(3): a supervisor that dies before saying anything."""

    def __reduce__(self):
        return (os._exit, (3,))


def test_the_supervisor_log_tells_what_happened(tmp_path):
    handle = ftnb.launch(uses_objects, name="noobjs", storage_path=str(tmp_path / "store"),
                         param_space={"n": 1}, quiet=True)
    handle.wait(timeout=60)
    # The trial failed (no objects in its config): the log has the experiment's own report.
    with open(handle.supervisor_log) as f:
        log = f.read()
    assert "ftnb supervisor pid" in log and "errored; supervisor exiting" in log
    assert handle.status() == "ERRORED"


def test_launch_tells_where_the_trainable_came_from_for_a_new_kernel(tmp_path):
    """`origin` names are stored, so resume() finds the trainable in a namespace."""
    store = str(tmp_path / "store")
    handle = ftnb.launch(scripted, param_space=_space(tmp_path, trials=1), name="origin",
                         storage_path=store, quiet=True,
                         origin={"trainable": "my_train", "param_space": "my_space"})
    handle.stop(timeout=30)
    fresh = ftnb.attach("origin", storage_path=store)  # knows nothing but the path
    with pytest.raises(ValueError, match="'my_train' is not defined here"):
        fresh.resume(namespace={})
    _open_gate(tmp_path)
    resumed = fresh.resume(namespace={"my_train": scripted,
                                      "my_space": _space(tmp_path, trials=1)}, quiet=True)
    assert resumed.wait(timeout=60)[0].metrics["training_iteration"] == 6




def test_a_long_tmpdir_still_leaves_room_for_the_fork_servers_socket(tmp_path, monkeypatch):
    """The fork server's socket lives under the supervisor's temporary folder; under a long
    $TMPDIR (pytest's own tmp paths, macOS's /var/folders/...) it did not fit in an AF_UNIX
    address and the supervisor died starting its first trial ("AF_UNIX path too long")."""
    import tempfile

    from ftnb.launchers.temp_folders import temp_folders_root

    long_dir = tmp_path / ("a-long-temporary-folder-name-" * 3)
    long_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_dir))
    root = temp_folders_root()
    socket_path = os.path.join(root, "0123abcd-4194304-1795395291", "pymp-abcdefgh",
                               "listener-abcdefgh")
    assert len(socket_path.encode()) <= 103, socket_path
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert temp_folders_root().startswith("/tmp/ftnb-supervisors-")
