"""ExperimentMonitor: the incremental reader behind the widget, from real experiment folders
(finished, errored, running, interrupted with a dead driver, on S3) and hand-made damage (a torn
last line, a result file replaced under the reader, a trial record newer than the state)."""

from __future__ import annotations

import json
import os
import posixpath
import shutil

import pytest

import ftnb
from ftnb.storage.lease import process_name
from ftnb.ui.monitor import ExperimentMonitor, Restart, default_resume_line
from ftnb.core.records import ExperimentState, StateFormatError, StateVersionError
from ftnb.storage import ExperimentPaths, read_json_lines
from procs import processes_named, run_script, wait_for
from scripted import case_dirs, result_rows, scripted_case

N = 6
CASES = [
    # name, faults, ckpt_every
    ("clean", {}, 1),
    # Attempt 1 reports 1..3 (checkpoint at 2) and raises before 4: attempt 2 resumes from 2.
    ("restart", {"1": [4, "raise"]}, 2),
    # The same bug twice: with max_failures=1 the trial ends ERRORED at iteration 1.
    ("errored", {"1": [2, "raise_same"], "2": [2, "raise_same"]}, 1),
]


def _space(cases):
    return {
        "case": ftnb.grid_search(
            [{"name": c, "faults": f, "ckpt_every": e, "n": N} for c, f, e in cases]
        )
    }


@pytest.fixture(scope="module")
def errored_experiment(tmp_path_factory):
    """A finished sweep whose trials ran clean, restarted once, and ended ERRORED."""
    root = tmp_path_factory.mktemp("monitor")
    grid = ftnb.Tuner(
        scripted_case,
        param_space=_space(CASES),
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2, metric="score", mode="max"),
        run_config=ftnb.RunConfig(
            storage_path=str(root), name="sweep", verbose=0,
            failure_config=ftnb.FailureConfig(max_failures=1),
        ),
    ).fit()
    assert grid.status == "ERRORED"
    return grid.experiment_path


def _trial_ids(path):
    state = ExperimentState.load(ExperimentPaths.at(path))
    dirs = case_dirs(path)
    return {name: next(t.trial_id for t in state.trials if os.path.join(path, t.dir_name) == d)
            for name, d in dirs.items()}


def test_finished_experiment_snapshot(errored_experiment):
    path = errored_experiment
    ids = _trial_ids(path)
    snap = ExperimentMonitor(path).poll()

    assert snap.status == "ERRORED" and snap.finished and not snap.driver_gone
    assert snap.view.counts["TERMINATED"] == 2 and snap.view.counts["ERRORED"] == 1
    rows = {r.trial_id: r for r in snap.view.rows}
    assert rows[ids["clean"]].iteration == N and rows[ids["clean"]].attempts == 1
    assert rows[ids["restart"]].attempts == 2 and rows[ids["restart"]].failures == 1
    assert rows[ids["errored"]].status == "ERRORED"
    assert "deterministic bug" in rows[ids["errored"]].last_error
    assert snap.view.metric_columns[0] == "score"
    assert "score" in snap.metrics and "resumed_from" in snap.metrics
    assert "training_iteration" not in snap.metrics and "timestamp" not in snap.metrics

    # The series are the trials' result.json rows, exactly.
    series = snap.series("score")
    for name, trial_id in ids.items():
        file_rows = result_rows(case_dirs(path)[name])
        assert series[trial_id] == (
            [r["training_iteration"] for r in file_rows], [r["score"] for r in file_rows]
        ), name
    assert series[ids["clean"]][0] == list(range(1, N + 1))
    assert snap.series("score", [ids["clean"]]).keys() == {ids["clean"]}
    assert snap.series("no_such_metric") == {}

    # Restarts: where attempt 2 of the restarted trial resumed, and its checkpoint.
    (restart,) = snap.restarts[ids["restart"]]
    assert (restart.iteration, restart.attempt) == (2, 2)
    assert restart.restored_from == "checkpoint_000000"
    assert snap.value_at(ids["restart"], "score", restart.iteration) == 2.0
    assert [r.attempt for r in snap.restarts[ids["errored"]]] == [2]
    assert ids["clean"] not in snap.restarts

    # Failures: when, kind, message and the traceback, per trial.
    (failure,) = snap.failures[ids["restart"]]
    assert failure.kind == "exception" and failure.type == "ValueError"
    assert "injected failure at step 4" in failure.message
    assert "Traceback" in failure.traceback and "_fire" in failure.traceback
    assert [f.attempt for f in snap.failures[ids["errored"]]] == [1, 2]
    assert ids["clean"] not in snap.failures

    assert snap.resume_line == f"ftnb.Tuner.restore({path!r}, scripted_case).fit()"
    assert snap.supervisor_log is None  # run by a Tuner in-process, not by a supervisor


def test_a_poll_that_finds_nothing_new_reads_nothing(errored_experiment):
    monitor = ExperimentMonitor(errored_experiment)
    first = monitor.poll()
    read = dict(monitor.stats)
    assert read["files_read"] >= 1 + 2 * 3  # the state, then every trial.json and result.json
    again = monitor.poll()
    assert again.generation == first.generation
    assert again.version == first.version
    assert monitor.stats["files_read"] == read["files_read"]
    assert monitor.stats["bytes_read"] == read["bytes_read"]


def test_tail_reads_only_new_bytes_skips_a_torn_line_and_notices_a_replaced_file(
    errored_experiment, tmp_path
):
    path = str(tmp_path / "copy")
    shutil.copytree(errored_experiment, path)
    ids = _trial_ids(path)
    results = os.path.join(case_dirs(path)["clean"], "result.json")
    trial_id = ids["clean"]
    monitor = ExperimentMonitor(path)
    first = monitor.poll()
    assert first.num_rows(trial_id) == N

    # A torn last line (a writer mid-write) is not a row yet.
    row = {"score": 70.0, "training_iteration": 7, "trial_id": trial_id}
    line = json.dumps(row).encode() + b"\n"
    with open(results, "ab") as f:
        f.write(line[:10])
    before = monitor.stats["bytes_read"]
    snap = monitor.poll()
    assert snap.num_rows(trial_id) == N
    assert snap.version[trial_id] == first.version[trial_id]
    with open(results, "ab") as f:
        f.write(line[10:])
    snap = monitor.poll()
    assert snap.num_rows(trial_id) == N + 1
    assert snap.series("score")[trial_id][1][-1] == 70.0
    assert snap.version[trial_id] > first.version[trial_id]
    # Only the new bytes (and a little overlap to check them) were read, not the file again.
    size = os.path.getsize(results)
    assert monitor.stats["bytes_read"] - before < size / 2
    # The row count of the trial follows the file, the view too.
    assert {r.trial_id: r.iteration for r in snap.view.rows}[trial_id] == 7
    # An older snapshot does not change when later rows arrive.
    assert first.num_rows(trial_id) == N and len(first.series("score")[trial_id][0]) == N

    # Replaced (a restart dropped rows past its checkpoint) by a file as long as the old one:
    # the reader starts over instead of appending to what it had.
    rows = read_json_lines(open(results, "rb").read())
    old_size = os.path.getsize(results)
    kept = rows[:3]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in kept)
    pad = {"score": -1.0, "training_iteration": 4, "trial_id": trial_id, "note": "x"}
    while len(data) < old_size:
        data += json.dumps(pad).encode() + b"\n"
        pad["training_iteration"] += 1
    tmp = results + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, results)
    snap = monitor.poll()
    expected = read_json_lines(data)
    assert snap.num_rows(trial_id) == len(expected)
    assert snap.series("score")[trial_id][1] == [r["score"] for r in expected]

    # Removed entirely: no rows.
    os.remove(results)
    snap = monitor.poll()
    assert snap.num_rows(trial_id) == 0 and trial_id not in snap.series("score")


def test_a_trial_record_newer_than_the_state_wins(errored_experiment, tmp_path):
    path = str(tmp_path / "copy")
    shutil.copytree(errored_experiment, path)
    ids = _trial_ids(path)
    record_path = os.path.join(case_dirs(path)["clean"], "trial.json")
    monitor = ExperimentMonitor(path)
    first = monitor.poll()
    record = json.loads(open(record_path).read())

    # An older record (lower seq) than the state's is ignored.
    stale = dict(record, seq=0, status="RUNNING")
    with open(record_path, "w") as f:
        json.dump(stale, f)
    snap = monitor.poll()
    assert {r.trial_id: r.status for r in snap.view.rows}[ids["clean"]] == "TERMINATED"

    newer = dict(record, seq=record["seq"] + 5, status="PAUSED", note="stopped by hand")
    with open(record_path, "w") as f:
        json.dump(newer, f)
    snap = monitor.poll()
    assert {r.trial_id: r.status for r in snap.view.rows}[ids["clean"]] == "PAUSED"
    assert snap.version[ids["clean"]] > first.version[ids["clean"]]
    assert snap.version[ids["restart"]] == first.version[ids["restart"]]


def test_no_state_yet_then_one_appears_and_a_newer_format_is_refused(errored_experiment, tmp_path):
    path = str(tmp_path / "late")
    monitor = ExperimentMonitor(path)
    with pytest.raises(StateFormatError, match="no readable experiment state"):
        monitor.poll()
    shutil.copytree(errored_experiment, path)
    assert monitor.poll().status == "ERRORED"

    state_file = os.path.join(path, "experiment_state.json")
    data = json.loads(open(state_file).read())
    data["format_version"] = 99
    with open(state_file, "w") as f:
        json.dump(data, f)
    with pytest.raises(StateVersionError, match="newer"):
        ExperimentMonitor(path).poll()


def test_resume_line_for_notebook_launches(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_STORAGE_PATH", str(tmp_path / "default"))
    paths = ExperimentPaths.at(str(tmp_path / "default" / "sweep1"))
    state = ExperimentState(name="sweep1", trainable="train")
    assert default_resume_line(paths, state) == (
        f"ftnb.Tuner.restore({paths.uri!r}, train).fit()"
    )
    state.settings = {"origin": {"trainable": "train"}}
    assert default_resume_line(paths, state, magics=True) == "%ftresume sweep1"
    elsewhere = ExperimentPaths.at(str(tmp_path / "other" / "sweep1"))
    assert default_resume_line(elsewhere, state, magics=True) == f"%ftresume {elsewhere.uri}"
    # Where the magics cannot run it (a script, a terminal; here: no IPython shell), the Python
    # line, with the names %ftrun recorded.
    assert default_resume_line(paths, state) == f"ftnb.attach({paths.uri!r}).resume(train)"
    state.settings = {"origin": {"trainable": "train", "param_space": "space"}}
    assert default_resume_line(paths, state) == (
        f"ftnb.attach({paths.uri!r}).resume(train, param_space=space)")
    assert "%ftresume" not in default_resume_line(paths, state, magics=False)
    # The caller (the handle) may say it better.
    monitor = ExperimentMonitor(paths, resume_line="%ftresume x")
    assert monitor._resume_line == "%ftresume x"


LIVE_DRIVER = """
import sys, ftnb
from scripted import scripted_case

ftnb.run(
    scripted_case, name="live", storage_path=sys.argv[1],
    param_space={"case": ftnb.grid_search([
        {"name": "slow", "n": 500, "sleep": 0.1, "ckpt_every": 5},
        {"name": "fails", "n": 500, "sleep": 0.1, "ckpt_every": 1, "faults": {"1": [3, "raise"]}},
    ])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=3)),
)
"""


def test_live_experiment_then_its_driver_dies(tmp_path):
    proc = run_script(tmp_path, LIVE_DRIVER, str(tmp_path))
    exp = str(tmp_path / "live")
    monitor = ExperimentMonitor(exp)
    token = None
    try:
        def snapshot():
            try:
                return monitor.poll()
            except StateFormatError:
                return None  # not created yet

        first = wait_for(snapshot, timeout=60, what="the experiment's state")
        assert first.status == "RUNNING" and not first.driver_gone
        assert "running" in first.driver

        # Rows arrive incrementally; a trial restarts after its injected failure.
        def restarted():
            snap = monitor.poll()
            ok = snap.restarts and all(snap.num_rows(t) >= 4 for t in snap.trial_ids)
            return snap if ok else None

        snap = wait_for(restarted, timeout=60, what="a restart and 4 rows per trial")
        assert snap.status == "RUNNING" and not snap.driver_gone
        assert snap.generation > first.generation
        ((trial_id, (restart,)),) = snap.restarts.items()
        assert isinstance(restart, Restart) and restart.attempt == 2 and restart.iteration == 2
        assert snap.failures[trial_id][0].kind == "exception"
        for trial_id in snap.trial_ids:
            iterations, _ = snap.series("score")[trial_id]
            assert iterations == list(range(1, len(iterations) + 1))
        token = json.loads(open(os.path.join(exp, "owner.json")).read())["token"]
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    if token:
        wait_for(lambda: not processes_named(process_name(token)), timeout=20,
                 what="the killed driver's trials to die")

    dead = wait_for(lambda: (lambda s: s if s.driver_gone else None)(monitor.poll()),
                    timeout=20, what="the monitor to see the dead driver")
    assert dead.status == "INTERRUPTED" and dead.view.status == "INTERRUPTED"
    assert dead.state.status == "INTERRUPTED"
    assert "gone" in dead.driver and "exited" in dead.driver
    assert dead.resume_line.startswith("ftnb.Tuner.restore(")
    # Elapsed stops at the last sign of life instead of running on.
    assert dead.with_elapsed(dead.view.elapsed_s + 1e6).view.elapsed_s == dead.view.elapsed_s
    # A reader that comes later sees the same.
    later = ExperimentMonitor(exp).poll()
    assert later.driver_gone and later.status == "INTERRUPTED"
    assert {t: later.num_rows(t) for t in later.trial_ids} == {
        t: dead.num_rows(t) for t in dead.trial_ids
    }


def test_supervisor_log_is_found(errored_experiment, tmp_path):
    path = str(tmp_path / "copy")
    shutil.copytree(errored_experiment, path)
    monitor = ExperimentMonitor(path)
    assert monitor.poll().supervisor_log is None
    with open(os.path.join(path, "supervisor.log"), "w") as f:
        f.write("started\n")
    assert monitor.poll().supervisor_log == os.path.join(path, "supervisor.log")


def test_dead_driver_signal_case_uses_lease_not_state(errored_experiment, tmp_path):
    """A state that says RUNNING with a live owner is RUNNING; with the owner gone it is
    INTERRUPTED; once the state itself says INTERRUPTED the driver line is empty."""
    path = str(tmp_path / "copy")
    shutil.copytree(errored_experiment, path)
    state_file = os.path.join(path, "experiment_state.json")
    data = json.loads(open(state_file).read())
    data["status"] = "RUNNING"
    with open(state_file, "w") as f:
        json.dump(data, f)
    owner = os.path.join(path, "owner.json")
    lease = json.loads(open(owner).read())
    # This process as the owner: alive.
    from ftnb.system.processes import host_id, pid_start_time

    lease.update(released=False, pid=os.getpid(), pid_start=pid_start_time(os.getpid()),
                 host_id=host_id())
    with open(owner, "w") as f:
        json.dump(lease, f)
    monitor = ExperimentMonitor(path)
    snap = monitor.poll()
    assert snap.status == "RUNNING" and not snap.driver_gone
    # A child that exited as the owner: gone.
    proc = run_script(tmp_path, "pass\n")
    proc.communicate(timeout=30)
    lease.update(pid=proc.pid, pid_start=12345)
    with open(owner, "w") as f:
        json.dump(lease, f)
    snap = monitor.poll()
    assert snap.status == "INTERRUPTED" and snap.driver_gone
    data["status"] = "INTERRUPTED"
    with open(state_file, "w") as f:
        json.dump(data, f)
    snap = monitor.poll()
    assert snap.status == "INTERRUPTED" and not snap.driver_gone and snap.driver == ""


# ---- S3 ---------------------------------------------------------------------------------------


@pytest.mark.s3
def test_monitor_on_s3(s3_storage):
    url, fs = s3_storage
    grid = ftnb.Tuner(
        scripted_case,
        param_space=_space(CASES[:2]),
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=ftnb.RunConfig(
            storage_path=url, storage_filesystem=fs, name="s3sweep", verbose=0,
            failure_config=ftnb.FailureConfig(max_failures=1),
        ),
    ).fit()
    assert grid.status == "FINISHED"
    monitor = ExperimentMonitor(grid.experiment_path, fs)
    snap = monitor.poll()
    assert snap.status == "FINISHED" and not snap.driver_gone
    assert snap.path == grid.experiment_path
    by_name = {t.config["case"]["name"]: t.trial_id for t in snap.state.trials}
    assert snap.series("score")[by_name["clean"]][0] == list(range(1, N + 1))
    (restart,) = snap.restarts[by_name["restart"]]
    assert (restart.iteration, restart.attempt) == (2, 2)
    assert snap.failures[by_name["restart"]][0].kind == "exception"

    again = monitor.poll()
    assert again.generation == snap.generation
    read = monitor.stats["files_read"]
    monitor.poll()
    assert monitor.stats["files_read"] == read  # a listing, no reads

    # A row appended (on S3 a whole new object, as the trial's ResultLog writes it).
    trial = next(t for t in snap.state.trials if t.trial_id == by_name["clean"])
    results = posixpath.join(fs._strip_protocol(grid.experiment_path), trial.dir_name,
                             "result.json")
    data = fs.cat_file(results)
    row = {"score": 99.0, "training_iteration": N + 1, "trial_id": trial.trial_id}
    fs.pipe_file(results, data + json.dumps(row).encode() + b"\n")
    snap = monitor.poll()
    assert snap.series("score")[trial.trial_id][1][-1] == 99.0
    assert snap.num_rows(trial.trial_id) == N + 1
    # Replaced by fewer rows: read again from the start.
    fs.pipe_file(results, b"".join(data.splitlines(keepends=True)[:2]))
    snap = monitor.poll()
    assert snap.series("score")[trial.trial_id][0] == [1, 2]
