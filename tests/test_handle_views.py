"""What a handle and the views say about an experiment: run time against wall time across a
driver that died and a resume, the handle's text (its status and when it was read), and the
resume line outside a notebook (a real script, no IPython). Real supervisors, SIGKILLed."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

import ftnb
from ftnb.storage.lease import read_lease
from ftnb.core.records import AttemptRecord, ExperimentState, ExperimentStatus, TrialRecord
from ftnb.ui.view import ExperimentView, run_times
from procs import run_script, wait_for
from scripted import executed, scripted

pytestmark = pytest.mark.timeout(180)


def _state(**kwargs) -> ExperimentState:
    return ExperimentState(name="e", trainable="t", **kwargs)


def test_run_time_adds_up_the_driver_sessions_and_the_wall_time_is_labelled():
    state = _state(created=100.0, updated=130.0, status="FINISHED",
                   driver_sessions=[[100.0, 110.0], [120.0, 130.0]])
    view = ExperimentView.from_state(state)
    assert (view.running_s, view.elapsed_s) == (20.0, 30.0)
    assert view.summary().endswith("| run time 0:00:20, wall 0:00:30")
    # One session: the two are the same, and only the run time is shown.
    state.driver_sessions = [[100.0, 130.0]]
    assert ExperimentView.from_state(state).summary().endswith("| run time 0:00:30")
    # A live session runs until `end` (now, or its driver's last sign of life).
    assert run_times(_state(created=100.0, driver_sessions=[[100.0, 101.0]]), 160.0) == (
        60.0, 60.0)


def test_states_written_before_driver_sessions_still_read():
    data = _state(created=100.0, updated=130.0, status="FINISHED").to_json()
    del data["driver_sessions"]
    state = ExperimentState.from_json(data)
    assert state.driver_sessions == []
    view = ExperimentView.from_state(state)
    assert (view.running_s, view.elapsed_s) == (30.0, 30.0)
    # Resumed by this ftnb: what ran before counts as one session, then the new one starts.
    state.trials = [TrialRecord("a", "a", {}, attempts=[AttemptRecord(1, started=101.0,
                                                                      ended=125.0)])]
    state.begin_driver_session()
    first, second = state.driver_sessions
    assert first == [100.0, 130.0] and second[0] == second[1] > 130.0
    # Values that are not pairs of numbers are left out, not fatal.
    data["driver_sessions"] = [[1, 2], "x", [1], [True, 2]]
    assert ExperimentState.from_json(data).driver_sessions == [[1.0, 2.0]]


def test_run_time_leaves_out_the_time_the_driver_was_dead(tmp_path):
    store = str(tmp_path / "store")
    space = {"n": 6, "sleep": 0.05, "ckpt_every": 1, "gate": str(tmp_path / "gate"),
             "x": ftnb.grid_search([0])}
    handle = ftnb.launch(scripted, param_space=space, name="dies", storage_path=store,
                         quiet=True)
    [trial] = handle.state().trials
    trial_dir = os.path.join(handle.path, trial.dir_name)
    wait_for(lambda: len(executed(trial_dir)) >= 2, timeout=60, what="two steps")
    os.kill(read_lease(handle.paths).pid, signal.SIGKILL)
    wait_for(lambda: handle.status() == "INTERRUPTED", timeout=30, what="INTERRUPTED")
    # One type whichever way the status was read: the state's word, or a dead driver's.
    assert type(handle.status()) is ExperimentStatus
    # The handle's text says when it read a status that can still change.
    assert re.fullmatch(rf"ExperimentHandle\('dies', INTERRUPTED as of \d\d:\d\d:\d\d, "
                        rf"{re.escape(repr(handle.path))}\)", repr(handle)), repr(handle)

    (tmp_path / "gate").write_text("open")
    again = ftnb.launch(scripted, param_space=space, name="dies", storage_path=store,
                        quiet=True)
    results = again.wait(timeout=90)
    assert type(again.status()) is ExperimentStatus and again.status().is_finished()
    assert type(results.status) is ExperimentStatus and results.status == "FINISHED"
    assert repr(again) == f"ExperimentHandle('dies', FINISHED, {again.path!r})"
    state = again.state()
    assert state.status == "FINISHED"
    (start1, end1), (start2, end2) = state.driver_sessions
    assert start1 == state.created and end2 == state.updated
    # The first session ends at its trial's last report, before the driver was found dead.
    assert start1 < end1 < start2 < end2
    view = ExperimentView.from_state(state)
    assert view.running_s == pytest.approx((end1 - start1) + (end2 - start2), abs=1e-3)
    assert view.elapsed_s - view.running_s == pytest.approx(start2 - end1, abs=1e-3)
    with open(again.paths.state) as f:
        assert len(json.load(f)["driver_sessions"]) == 2


def test_run_time_leaves_out_the_time_a_stopped_experiment_sat_stopped(tmp_path):
    """Issue 32: a stop, then a resume later; the resume's own saves (before its driver runs)
    must not stretch the first session to the resume."""
    store = str(tmp_path / "store")
    space = {"n": 40, "sleep": 0.05, "ckpt_every": 1, "x": ftnb.grid_search([0])}
    handle = ftnb.launch(scripted, param_space=space, name="paused", storage_path=store,
                         quiet=True)
    [trial] = handle.state().trials
    wait_for(lambda: len(executed(os.path.join(handle.path, trial.dir_name))) >= 2,
             timeout=60, what="two steps")
    handle.stop()
    assert handle.status() == "INTERRUPTED"
    [(start1, stopped_at)] = handle.state().driver_sessions
    again = ftnb.attach(handle.path).resume(scripted, param_space=space, wait=False)
    wait_for(lambda: len(again.state().driver_sessions) == 2, timeout=60, what="a 2nd session")
    (first_start, first_end), (second_start, _) = again.state().driver_sessions
    # The first session still ends at the stop, not when the restore prepared the state.
    assert (first_start, first_end) == (start1, stopped_at)
    assert first_end < second_start
    again.stop()


SCRIPT = """
import sys
import ftnb

ftnb.attach(sys.argv[1]).display()
"""


def test_outside_a_notebook_the_resume_line_is_python(tmp_path):
    """h.display() in a script prints the text view; the line it offers is one a script can
    run, not %ftresume."""
    store = str(tmp_path / "store")
    space = {"n": 50, "sleep": 0.05, "ckpt_every": 1, "x": ftnb.grid_search([0])}
    handle = ftnb.launch(scripted, param_space=space, name="script", storage_path=store,
                         quiet=True)
    handle.stop()
    assert handle.status() == "INTERRUPTED"
    proc = run_script(tmp_path, SCRIPT, handle.path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert f"Resume it with: ftnb.attach({handle.path!r}).resume(scripted)" in out, out
    assert "%ft" not in out


def test_resume_without_the_space_names_the_variable_it_was_started_with(tmp_path):
    """A resume that would need objects of the space (the widget's button in a notebook
    resumes with the notebook's names) says which name to define."""
    store = str(tmp_path / "store")
    space = {"n": 50, "sleep": 0.05, "ckpt_every": 1, "x": ftnb.grid_search([0]),
             "blob": ftnb.put(bytearray(b"not saved with the experiment"))}
    handle = ftnb.launch(scripted, param_space=space, name="objects", storage_path=store,
                         origin={"trainable": "scripted", "param_space": "space"}, quiet=True)
    handle.stop()
    again = ftnb.attach(handle.path)  # a new kernel: nothing but the names
    with pytest.raises(ftnb.RestoreError) as info:
        again.resume(namespace={"scripted": scripted})
    assert str(info.value) == (
        "ftnb: cannot resume 'objects' without its search space: its trials hold objects that "
        "are not saved with the experiment (blob (bytearray)). Fix: define 'space' (the search space "
        "it was started with, those objects re-created) and resume again, or pass it: "
        f"ftnb.attach({handle.path!r}).resume(param_space=space).")
    assert again.status() == "INTERRUPTED"
    resumed = again.resume(namespace={"scripted": scripted, "space": space}, quiet=True)
    resumed.stop()
