"""Restoring experiments whose driver died: Tuner.restore flags trial by trial, can_restore,
ftnb.run, Ctrl+C, copied folders, and every bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

import ftnb
from ftnb.storage.lease import process_name
from ftnb.core.records import FORMAT_VERSION, ExperimentState
from ftnb.storage import ExperimentPaths
from procs import processes_named, run_again_line, run_script, wait_for
from scripted import case_dirs, executed, result_rows, scripted_case

CASES = {
    "done": {"name": "done", "n": 2},
    "errored": {"name": "errored", "n": 4, "faults": {"1": [2, "raise"]}},
    "running": {"name": "running", "n": 6, "sleep": 0.25},
    "pending": {"name": "pending", "n": 2},
}

# One trial at a time, in this order: "done" finishes, "errored" fails for good
# (max_failures=0), "running" is killed mid-way, "pending" never starts.
MATRIX_DRIVER = """
import sys, ftnb
from scripted import scripted_case
from test_restore import CASES

# The running trial's last iteration waits for a file that only appears after the kill.
CASES["running"] = dict(CASES["running"], gate=sys.argv[2])
ftnb.Tuner(
    scripted_case,
    param_space={"case": ftnb.grid_search([CASES[k] for k in ("done", "errored", "running", "pending")])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=1),
    run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="matrix", verbose=0,
                              failure_config=ftnb.FailureConfig(max_failures=0)),
).fit()
"""


@pytest.fixture(scope="module")
def killed_matrix(tmp_path_factory):
    """An experiment whose driver was SIGKILLed while its third trial was running."""
    tmp = tmp_path_factory.mktemp("matrix")
    gate = tmp / "running.gate"
    proc = run_script(tmp, MATRIX_DRIVER, str(tmp), str(gate))
    exp = tmp / "matrix"
    try:
        dirs = wait_for(lambda: len(case_dirs(str(exp))) == 4 and case_dirs(str(exp)),
                        what="trial folders")
        wait_for(lambda: len(result_rows(dirs["running"])) >= 2, what="the running trial")
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, out
    # Its trial dies with it (no process of the old driver sees the gate), still running.
    token = json.loads((exp / "owner.json").read_text())["token"]
    wait_for(lambda: not processes_named(process_name(token)), what="the old trial to die")
    assert len(result_rows(dirs["running"])) < CASES["running"]["n"]
    gate.touch()  # restored, it may finish
    return exp


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _statuses(results):
    return {json.loads(open(os.path.join(r.path, "params.json")).read())["case"]["name"]: r
            for r in results}


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"resume_unfinished": False},
        {"resume_errored": True},
        {"restart_errored": True},
        {"resume_unfinished": False, "restart_errored": True},
    ],
    ids=["default", "no-unfinished", "resume-errored", "restart-errored", "only-restart-errored"],
)
def test_restore_flags_trial_by_trial(killed_matrix, tmp_path, flags):
    # A copy at another path: nothing may depend on the absolute path recorded at launch.
    exp = _copy(killed_matrix, tmp_path / "moved")
    dirs = case_dirs(str(exp))
    before = {case: (result_rows(d), executed(d)) for case, d in dirs.items()}
    paths = ExperimentPaths.at(str(exp))
    state = ExperimentState.load(paths)
    state.merge_trial_records(paths)  # the state file lags the trials' own records
    by_case = {
        json.load(open(os.path.join(exp, t.dir_name, "params.json")))["case"]["name"]: t
        for t in state.trials
    }
    assert by_case["done"].status == "TERMINATED"
    assert by_case["errored"].status == "ERRORED"
    assert by_case["running"].status == "RUNNING"  # its driver died: nobody recorded an end
    assert by_case["pending"].status == "PENDING"
    assert ftnb.Tuner.can_restore(str(exp))

    results = ftnb.Tuner.restore(str(exp), scripted_case, **flags).fit()
    got = _statuses(results)
    unfinished = flags.get("resume_unfinished", True)

    # TERMINATED trials never run again and keep their results.
    assert got["done"].status == "TERMINATED"
    assert result_rows(dirs["done"]) == before["done"][0]
    assert executed(dirs["done"]) == before["done"][1]

    # RUNNING: continued from its latest checkpoint, or marked TERMINATED as it stood.
    running_rows = result_rows(dirs["running"])
    assert got["running"].status == "TERMINATED"
    if unfinished:
        assert [r["training_iteration"] for r in running_rows] == [1, 2, 3, 4, 5, 6]
        resumed = [r for r in running_rows if r["attempt"] == 2]
        last_ckpt = max(r["training_iteration"] for r in before["running"][0])
        assert resumed[0]["resumed_from"] == last_ckpt  # not from scratch
        assert got["running"].metrics["training_iteration"] == 6
    else:
        assert running_rows == before["running"][0]
        assert executed(dirs["running"]) == before["running"][1]
    trial = _trial(results, dirs["running"])
    assert trial.failures == []  # a dead driver is not the trial's failure
    assert trial.attempts[0].outcome == "interrupted"

    # PENDING: started from scratch, or marked TERMINATED without running.
    pending_rows = result_rows(dirs["pending"])
    if unfinished:
        assert got["pending"].status == "TERMINATED"
        assert [r["training_iteration"] for r in pending_rows] == [1, 2]
    else:
        assert got["pending"].status == "TERMINATED" and pending_rows == []
        assert executed(dirs["pending"]) == []

    # ERRORED: kept, resumed from its checkpoint, or restarted from scratch.
    errored_rows = result_rows(dirs["errored"])
    errored = _trial(results, dirs["errored"])
    assert len(errored.failures) == 1  # the history is kept either way
    if flags.get("resume_errored"):
        assert got["errored"].status == "TERMINATED"
        assert [r["training_iteration"] for r in errored_rows] == [1, 2, 3, 4]
        assert [s for a, s in executed(dirs["errored"]) if a == 2] == [2, 3, 4]
    elif flags.get("restart_errored"):
        assert got["errored"].status == "TERMINATED"
        assert [r["training_iteration"] for r in errored_rows] == [1, 2, 3, 4]
        assert {r["attempt"] for r in errored_rows} == {2}
        assert [s for a, s in executed(dirs["errored"]) if a == 2] == [1, 2, 3, 4]
    else:
        assert got["errored"].status == "ERRORED"
        assert errored_rows == before["errored"][0]
        assert results.errors and "injected failure" in str(results.errors[0])

    # The restored run owns the experiment and released it at the end.
    owner = json.loads((exp / "owner.json").read_text())
    assert owner["released"] is True and owner["epoch"] == 2  # launch, restore


def _trial(results, trial_dir):
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    return next(t for t in state.trials if t.dir_name == os.path.basename(trial_dir))


def test_restore_twice_is_idempotent(killed_matrix, tmp_path):
    exp = _copy(killed_matrix, tmp_path / "twice")
    first = ftnb.Tuner.restore(str(exp), scripted_case, resume_errored=True).fit()
    assert first.num_terminated == 4
    snapshot = {case: result_rows(d) for case, d in case_dirs(str(exp)).items()}
    second = ftnb.Tuner.restore(str(exp), scripted_case).fit()
    assert second.num_terminated == 4
    assert {case: result_rows(d) for case, d in case_dirs(str(exp)).items()} == snapshot


def test_fit_again_on_existing_experiment_points_to_restore(killed_matrix, tmp_path):
    exp = _copy(killed_matrix, tmp_path / "matrix")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError,
                       match=r"already exists.*\(not finished\).*Tuner\.restore.*ftnb\.run"):
        ftnb.Tuner(
            scripted_case, param_space={"case": CASES["done"]},
            run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="matrix", verbose=0),
        ).fit()
    assert ftnb.Tuner.can_restore(str(exp))  # and the experiment was not touched
    assert sorted(os.listdir(tmp_path)) == before  # nor set aside: it is not finished


# -- can_restore and bad input ---------------------------------------------------------------
def test_can_restore_on_every_kind_of_path(killed_matrix, tmp_path):
    assert ftnb.Tuner.can_restore(str(killed_matrix))
    assert not ftnb.Tuner.can_restore(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert not ftnb.Tuner.can_restore(str(tmp_path / "empty"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hi")
    assert not ftnb.Tuner.can_restore(str(other))
    assert not ftnb.Tuner.can_restore(str(other / "notes.txt"))
    assert not ftnb.Tuner.can_restore(str(killed_matrix.parent))  # the storage folder
    # Only the previous generation readable: still restorable.
    fallback = _copy(killed_matrix, tmp_path / "fallback")
    (fallback / "experiment_state.json").write_text("{ torn")
    assert ftnb.Tuner.can_restore(str(fallback))
    # Both generations unreadable, or a newer format: not restorable, and no exception.
    broken = _copy(killed_matrix, tmp_path / "broken")
    (broken / "experiment_state.json").write_text("{ torn")
    (broken / "experiment_state.prev.json").write_text("")
    assert not ftnb.Tuner.can_restore(str(broken))
    newer = _copy(killed_matrix, tmp_path / "newer")
    _set_version(newer, FORMAT_VERSION + 1)
    assert not ftnb.Tuner.can_restore(str(newer))


def _set_version(exp, version):
    for name in ("experiment_state.json", "experiment_state.prev.json"):
        data = json.loads((exp / name).read_text())
        data["format_version"] = version
        (exp / name).write_text(json.dumps(data))


def test_restore_bad_input_is_clear(killed_matrix, tmp_path):
    exp = str(killed_matrix)
    with pytest.raises(TypeError, match=r"trainable.*not `train\(\)`"):
        ftnb.Tuner.restore(exp, "scripted_case")
    with pytest.raises(ValueError, match="resume_errored=True, restart_errored=True.*Pick one"):
        ftnb.Tuner.restore(exp, scripted_case, resume_errored=True, restart_errored=True)
    with pytest.raises(ftnb.RestoreError, match="does not exist"):
        ftnb.Tuner.restore(str(tmp_path / "nope"), scripted_case)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ftnb.RestoreError, match="the folder is empty"):
        ftnb.Tuner.restore(str(tmp_path / "empty"), scripted_case)
    with pytest.raises(ftnb.RestoreError, match=r"holds experiments \(matrix\).*matrix'"):
        ftnb.Tuner.restore(str(killed_matrix.parent), scripted_case)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "tuner.pkl").write_bytes(b"x")
    with pytest.raises(ftnb.RestoreError, match="Ray Tune experiment"):
        ftnb.Tuner.restore(str(tmp_path / "ray"), scripted_case)
    newer = _copy(killed_matrix, tmp_path / "newer")
    _set_version(newer, FORMAT_VERSION + 1)
    with pytest.raises(ftnb.RestoreError, match="newer than this ftnb.*upgrade"):
        ftnb.Tuner.restore(str(newer), scripted_case)
    # The structure of a re-specified space must match: every difference is listed.
    with pytest.raises(ftnb.RestoreError) as err:
        ftnb.Tuner.restore(exp, scripted_case, param_space={
            "case": ftnb.grid_search([CASES["done"], CASES["errored"], CASES["running"]]),
            "lr": 0.1,
        })
    text = str(err.value)
    assert "case: grid_search of 4 values, now 3" in text and "lr: new key" in text
    assert "cannot change the search" in text
    # None of this touched the experiment.
    assert json.loads((killed_matrix / "owner.json").read_text())["epoch"] == 1


LONG_DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.run(scripted, name="long", storage_path=sys.argv[1],
         param_space={"n": 400, "sleep": 0.05, "i": ftnb.grid_search([0, 1])},
         run_config=ftnb.RunConfig(verbose=0))
"""


LONG_TUNER_DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.Tuner(scripted, param_space={"n": 400, "sleep": 0.05, "i": ftnb.grid_search([0, 1])},
           run_config=ftnb.RunConfig(name="long", storage_path=sys.argv[1], verbose=0)).fit()
"""


def _run_again_line(tmp_path):
    """What run_script's driver.py, given ``tmp_path``, is told to resume."""
    return run_again_line(str(tmp_path / "driver.py"), str(tmp_path))


@pytest.mark.parametrize("driver", [LONG_DRIVER, LONG_TUNER_DRIVER], ids=["ftnb.run", "Tuner"])
def test_ctrl_c_prints_the_line_that_resumes(tmp_path, driver):
    proc = run_script(tmp_path, driver, str(tmp_path))
    exp = tmp_path / "long"
    # Both trials (the grid's two) have reported: the controller runs them.
    wait_for(lambda: exp.exists() and sum(len(result_rows(str(d))) >= 2 for d in exp.iterdir()
                                          if d.is_dir()) == 2,
             what="a few results")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    if driver is LONG_DRIVER:  # run again, it resumes: the simplest truth
        assert out.rstrip().endswith(_run_again_line(tmp_path)), out
    else:  # a Tuner's fit() refuses an existing experiment: Tuner.restore resumes it
        assert f"ftnb.Tuner.restore('{exp}', scripted).fit()" in out, out
    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert state.status == "INTERRUPTED"
    assert all(t.failures == [] for t in state.trials)


WIDE_DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.run(scripted, name="wide", storage_path=sys.argv[1],
         param_space={"n": 1, "i": ftnb.grid_search(list(range(2000)))},
         run_config=ftnb.RunConfig(verbose=0))
"""


def test_ctrl_c_while_the_trials_are_laid_out_prints_the_line_that_resumes(tmp_path):
    # Laying out 2000 trial folders (each params.json fsynced) takes a second or more: the
    # interrupt lands there, before any trial starts.
    proc = run_script(tmp_path, WIDE_DRIVER, str(tmp_path))
    exp = tmp_path / "wide"
    wait_for(lambda: exp.exists() and any(d.is_dir() for d in exp.iterdir()),
             what="the first trial folder")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "no trial had started" in out, out
    assert out.rstrip().endswith(_run_again_line(tmp_path)), out
    assert "Traceback" not in out and proc.returncode != 0
    # Resumable, and nothing ran.
    assert ftnb.Tuner.can_restore(str(exp))
    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert len(state.trials) == 2000 and all(not t.attempts for t in state.trials)


def test_a_live_experiment_cannot_be_run_twice(tmp_path):
    proc = run_script(tmp_path, LONG_DRIVER, str(tmp_path))
    exp = tmp_path / "long"
    try:
        wait_for(lambda: ftnb.Tuner.can_restore(str(exp)), what="the experiment")
        with pytest.raises(ftnb.ExperimentLockedError,
                           match=rf"being run by another driver \(pid {proc.pid} .*takeover=True"):
            ftnb.Tuner.restore(str(exp), scripted_case)
        with pytest.raises(ftnb.ExperimentLockedError):
            ftnb.run(scripted_case, name="long", storage_path=str(tmp_path))
        assert proc.poll() is None  # the owner was not disturbed
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def _sum_objects(config):
    ftnb.report({"s": float(config["frame"]["x"].sum() + config["a"].sum())})


def test_objects_are_shared_and_results_show_the_callers_objects(tmp_path):
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    frame, arr = pd.DataFrame({"x": [1, 2]}), np.arange(5)
    results = ftnb.Tuner(
        _sum_objects, param_space={"frame": frame, "a": ftnb.grid_search([arr, arr * 2])},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="objs", verbose=0),
    ).fit()
    assert sorted(r.metrics["s"] for r in results) == [13.0, 23.0]
    assert all(r.config["frame"] is frame for r in results)
    assert any(r.config["a"] is arr for r in results)
    # On disk: placeholders, in the state and in params.json alike.
    params = json.loads(open(os.path.join(results[0].path, "params.json")).read())
    assert params["frame"]["__ftnb_ref__"] and params["frame"]["type"].endswith("DataFrame")


def _record_config_types(config):
    """Fails its first attempt; records the Python types of its config's values."""
    seen = {key: type(value).__name__ for key, value in config.items()}
    seen["inner"] = type(config["nested"]["inner"]).__name__
    seen["in_list"] = type(config["nested"]["in_list"][0]).__name__
    with open(os.path.join(config["log"], f"{ftnb.get_context().attempt}.json"), "w") as f:
        json.dump(seen, f)
    if not os.path.exists(os.path.join(config["log"], "restored")):
        raise RuntimeError("the first run fails")
    ftnb.report({"n": len(config["shape"])})


def test_tuples_in_configs_come_back_as_tuples_after_a_restore(tmp_path):
    """JSON has no tuples, yet a restored trial must get what the first run got (Ray pickles its
    configs; ftnb writes tuples as {"__ftnb_tuple__": [...]})."""
    import numpy as np

    log = tmp_path / "log"
    log.mkdir()
    space = {"shape": (3, 3), "grid": ftnb.grid_search([(1, 2)]), "log": str(log),
             "nested": {"inner": (0.9, 0.999), "in_list": [(1, "a")]}, "array": np.zeros(3)}
    first = ftnb.Tuner(_record_config_types, param_space=space,
                       run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="tuples",
                                                 verbose=0)).fit()
    assert first.num_errors == 1
    (log / "restored").touch()
    path = first.experiment_path
    results = ftnb.Tuner.restore(path, _record_config_types, restart_errored=True,
                                 param_space=space).fit()
    assert results.num_errors == 0
    attempts = {name: json.loads((log / name).read_text()) for name in ("1.json", "2.json")}
    assert attempts["1.json"] == attempts["2.json"]
    assert attempts["2.json"] == {"shape": "tuple", "grid": "tuple", "log": "str",
                                  "nested": "dict", "array": "ndarray", "inner": "tuple",
                                  "in_list": "tuple"}
    # Read back from storage alone, the results show them as tuples too.
    config = ftnb.ResultGrid.from_path(path)[0].config
    assert config["shape"] == (3, 3) and config["nested"]["in_list"] == [(1, "a")]
    # params.json stays plain JSON, as Ray writes it.
    params = json.loads(open(os.path.join(results[0].path, "params.json")).read())
    assert params["shape"] == [3, 3] and params["grid"] == [1, 2]


def test_an_experiment_saved_in_format_1_restores(killed_matrix, tmp_path):
    """Format 1 (ftnb before the journal of trial records): every record in
    experiment_state.json, no journal segments. A killed driver's experiment in that format
    restores as before, and its first save moves it to format 2."""
    exp = _copy(killed_matrix, tmp_path / "format1")
    paths = ExperimentPaths.at(str(exp))
    state = ExperimentState.load(paths)
    old = {**state.to_json(), "format_version": 1}  # the records' fields did not change
    text = json.dumps(old, indent=1)
    (exp / "experiment_state.json").write_text(text)
    (exp / "experiment_state.prev.json").write_text(text)
    for segment in exp.glob("experiment_state.*.jsonl"):
        segment.unlink()
    assert ExperimentState.load(paths).trials == state.trials
    assert ftnb.Tuner.can_restore(str(exp))

    results = ftnb.Tuner.restore(str(exp), scripted_case).fit()
    got = _statuses(results)
    assert {case: r.status for case, r in got.items()} == {
        "done": "TERMINATED", "errored": "ERRORED", "running": "TERMINATED",
        "pending": "TERMINATED"}
    saved = json.loads((exp / "experiment_state.json").read_text())
    assert saved["format_version"] == FORMAT_VERSION == 2
    assert [r["training_iteration"] for r in result_rows(case_dirs(str(exp))["running"])] == [
        1, 2, 3, 4, 5, 6]


def test_a_restore_says_it_resumes_once():
    """A restore's terminal table says "resuming experiment" unless the run's caller did
    (ftnb.run, ftnb run/resume, %ftrun print their own line first): one line, not two."""
    import io

    from ftnb.core.records import TrialRecord
    from ftnb.ui.terminal import TerminalReporter

    state = ExperimentState(name="again", trainable="t", trials=[
        TrialRecord("a_00000", "d0", {}, status="TERMINATED"),
        TrialRecord("a_00001", "d1", {}, status="PAUSED")])
    state.driver_sessions = [{"pid": 1}, {"pid": 2}]  # the second driver: a restore
    out = io.StringIO()
    TerminalReporter(stream=out, path="/s/again").on_experiment_start(state)
    assert out.getvalue() == (
        "ftnb: resuming experiment again (2 trials: 1 done, 1 to run) -> /s/again\n")
    out = io.StringIO()
    TerminalReporter(stream=out, path="/s/again", resume_announced=True).on_experiment_start(state)
    assert out.getvalue() == ""
