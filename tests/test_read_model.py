"""The read model (ftnb/ui/read_model.py): one answer to what is at a path, what its status is (a
dead driver reads as INTERRUPTED), what its trials are and what line resumes it, which every
reader gives: the widget's monitor, `ftnb status`/`ls`/`watch`, handles, and the JSON a web
front end serves. Real experiments (Tuner runs, a driver killed with SIGKILL) and real files;
the storage's polling reads on the local disk and on a non-local fsspec filesystem
(``memory://``)."""

from __future__ import annotations

import json
import math
import shutil
import uuid

import pytest

import ftnb
from ftnb.ui import read_model
from ftnb.cli import main
from ftnb.storage.lease import process_name, read_lease
from ftnb.ui.monitor import ExperimentMonitor
from ftnb.ui.read_model import Found, ResumeContext
from ftnb.core.records import AttemptRecord, ExperimentState, TrialRecord
from ftnb.storage import ExperimentPaths, Storage, read_json_lines
from procs import processes_named, run_script, wait_for

pytestmark = pytest.mark.timeout(180)


def nonfinite(config):
    """Reports NaN and infinities; x == 2 then fails."""
    ftnb.report({"loss": float("nan"), "gain": float("inf"), "x": config["x"]})
    ftnb.report({"loss": 1.0 / config["x"], "gain": -float("inf"), "x": config["x"]})
    if config["x"] == 2:
        raise ValueError("x=2 fails")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real experiment that ended: one trial TERMINATED, one ERRORED, NaN metrics."""
    root = tmp_path_factory.mktemp("store")
    ftnb.Tuner(nonfinite, param_space={"x": ftnb.grid_search([1, 2])},
               run_config=ftnb.RunConfig(storage_path=str(root), name="nonfinite",
                                         verbose=0)).fit()
    return root / "nonfinite"


@pytest.fixture
def experiment(finished, tmp_path):
    """A copy of the finished experiment to doctor."""
    return shutil.copytree(finished, tmp_path / "store" / "nonfinite")


def _cli_json(capsys, *argv) -> object:
    assert main(list(argv)) in (0, 1), capsys.readouterr()
    return json.loads(capsys.readouterr().out)


# -- the snapshot as JSON -------------------------------------------------------------------------
def test_snapshot_json_is_strict_versioned_and_what_ftnb_status_prints(finished, capsys):
    paths = ExperimentPaths.at(str(finished))
    snap = read_model.read_snapshot(paths, resume_context=ResumeContext.TERMINAL)
    doc = snap.to_json()
    text = json.dumps(doc, allow_nan=False)  # strict JSON, NaN and infinities included
    assert json.loads(text) == doc
    assert (doc["format"], doc["format_version"]) == ("ftnb.snapshot", 1)
    assert doc["generation"] == snap.generation and doc["metrics"] == snap.metrics
    assert doc["metrics"][:3] == ["loss", "gain", "x"] and "time_total_s" in doc["metrics"]
    assert set(doc["versions"]) == set(snap.trial_ids) and doc["restarts"] == {}

    experiment = doc["experiment"]
    rows = {r["params"]["x"]: r for r in experiment["rows"]}
    assert rows[1]["status"] == "TERMINATED" and rows[2]["status"] == "ERRORED"
    assert rows[1]["metrics"] == {"loss": 1.0, "gain": None, "x": 1}  # -inf is null
    assert rows[2]["last_error"].startswith("exception ValueError: x=2 fails")
    assert "x=2 fails" in rows[2]["last_failure"]["traceback"]
    assert experiment["driver"]["alive"] is False and experiment["driver"]["gone"] is False
    assert experiment["resume_line"] is None
    # `ftnb status --json` prints exactly that part; `ftnb watch --json` too, with a progress.
    assert _cli_json(capsys, "status", str(finished), "--json") == experiment
    watched = _cli_json(capsys, "watch", str(finished), "--json")
    assert watched.pop("progress").startswith("[") and watched == experiment

    # A metric's curves, with NaN as a gap (null).
    series = snap.series_json("loss")
    json.dumps(series, allow_nan=False)
    assert series["metric"] == "loss"
    curves = {snap.state.trial(t).config["x"]: c for t, c in series["trials"].items()}
    assert curves[1] == {"iterations": [1, 2], "values": [None, 1.0]}
    assert curves[2] == {"iterations": [1, 2], "values": [None, 0.5]}
    assert math.isnan(snap.series("loss")[snap.trial_ids[0]][1][0])  # the values stay NaN


def test_a_driver_falling_silent_shows_at_the_next_poll_though_no_file_changed(
        experiment, monkeypatch):
    """A driver elsewhere (another host id) that beats every 0.2 s stops beating: nothing in
    the folder changes, yet the monitor's next snapshot says it is silent, counts down, and
    offers the takeover; the stored state is untouched."""
    import time
    from dataclasses import asdict

    from ftnb.storage.lease import LeaseInfo

    state_file = experiment / "experiment_state.json"
    data = json.loads(state_file.read_text())
    data["status"] = "RUNNING"
    state_file.write_text(json.dumps(data))
    now = time.time()
    lease = LeaseInfo(token=uuid.uuid4().hex, epoch=1, host="elsewhere", host_id="elsewhere",
                      pid=1, pid_start=None, acquired=now, heartbeat=now, ttl_s=60.0,
                      heartbeat_s=0.2)
    (experiment / "owner.json").write_text(json.dumps(asdict(lease)))
    monitor = ExperimentMonitor(str(experiment), resume_context=ResumeContext.TERMINAL)
    first = monitor.poll()
    assert first.status == "RUNNING" and first.takeover is None
    assert first.to_json()["experiment"]["driver_silent_s"] is None
    silent = wait_for(lambda: monitor.poll().takeover and monitor.poll(),
                      what="the snapshot to offer the takeover")
    doc = silent.to_json()["experiment"]
    assert doc["status"] == "RUNNING" and doc["driver"]["alive"] is True
    assert doc["driver_silent_s"] > 0.4 and 0 < doc["driver_dead_in_s"] < 60
    assert doc["takeover"] == silent.takeover
    assert "--takeover" in silent.takeover or "takeover=True" in silent.takeover
    assert "is silent" in silent.driver and "counts as dead in" in silent.driver
    assert json.loads(state_file.read_text())["status"] == "RUNNING"


# -- one status for every reader --------------------------------------------------------------------
DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.run(scripted, name="killed", storage_path=sys.argv[1],
         param_space={"n": 1000, "sleep": 0.02, "ckpt_every": 5, "x": ftnb.grid_search([1, 2])},
         tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
         run_config=ftnb.RunConfig(verbose=0))
"""


def test_a_driver_killed_mid_run_reads_as_interrupted_to_every_reader(tmp_path, capsys):
    store = tmp_path / "store"
    proc = run_script(tmp_path, DRIVER, str(store))
    paths = ExperimentPaths.at(str(store / "killed"))
    token = None
    try:
        def rows_in_every_trial():
            if not paths.has_state():
                return False
            state = ExperimentState.load(paths)
            counts = [len(paths.trial(t.dir_name).read_results()) for t in state.trials]
            return len(counts) == 2 and min(counts) >= 30
        wait_for(rows_in_every_trial, timeout=90, what="30 rows in both trials")
        token = read_lease(paths).token
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert token is not None
    wait_for(lambda: not processes_named(process_name(token)), timeout=30,
             what="the killed driver's trials to die")

    # The files as the driver left them: RUNNING, its trials too.
    stored = read_model.read_state(paths)
    assert stored.status == "RUNNING" and {t.status for t in stored.trials} == {"RUNNING"}

    handle = ftnb.attach(str(store / "killed"))
    assert not handle.is_live() and handle.status() == "INTERRUPTED"
    assert read_model.read_status(paths) == "INTERRUPTED"
    snap = read_model.read_snapshot(paths, resume_context=ResumeContext.TERMINAL)
    assert snap.status == "INTERRUPTED" and snap.driver_gone and "is gone" in snap.driver
    assert {r.status for r in snap.view.rows} == {"INTERRUPTED"}
    # Each trial's progress is its rows, not the state saved up to a second before the kill.
    rows = {t.trial_id: len(paths.trial(t.dir_name).read_results()) for t in stored.trials}
    assert {r.trial_id: r.iteration for r in snap.view.rows} == rows

    terminal_line = read_model.resume_line(paths, stored, ResumeContext.TERMINAL)
    assert terminal_line.startswith(f"ftnb.Tuner.restore({paths.uri!r}, <trainable>)")
    status = _cli_json(capsys, "status", "killed", "--storage", str(store), "--json")
    assert status == snap.experiment_json()
    assert status["status"] == "INTERRUPTED" and status["resume_line"] == terminal_line
    assert status["driver"]["gone"] is True and status["driver"]["alive"] is False
    [listed] = _cli_json(capsys, "ls", str(store), "--json")
    assert listed["status"] == "INTERRUPTED" and listed["counts"] == snap.view.counts
    assert read_model.summarize(paths).counts == snap.view.counts == {
        "PENDING": 0, "RUNNING": 0, "PAUSED": 0, "TERMINATED": 0, "ERRORED": 0,
        "INTERRUPTED": 2}
    # The widget's reader (in a Python process: the Python line), and the handle's text.
    python_line = f"ftnb.Tuner.restore({paths.uri!r}, scripted).fit()"
    widget_view = ExperimentMonitor(paths).poll()
    assert widget_view.status == "INTERRUPTED" and widget_view.resume_line == python_line
    assert handle.resume_line == python_line
    assert handle.text().endswith(f"Resume it with: {python_line}")
    # Reading changed nothing.
    assert ExperimentState.load(paths).status == "RUNNING"


def _doctor(exp, state_edit, record_edits):
    """Edit the state (both generations) and trials' own records: ``record_edits`` maps a
    trial's x to a function of its trial.json."""
    for name in ("experiment_state.json", "experiment_state.prev.json"):
        data = json.loads((exp / name).read_text())
        state_edit(data)
        (exp / name).write_text(json.dumps(data))
    for record in exp.glob("*/trial.json"):
        data = json.loads(record.read_text())
        edit = record_edits.get(data["config"]["x"])
        if edit is not None:
            edit(data)
            record.write_text(json.dumps(data))


def test_a_trials_own_record_wins_when_newer_for_every_reader(experiment, capsys):
    """The state says RUNNING (its driver is gone); trial x=1's own trial.json is newer and says
    TERMINATED; trial x=2's is older than the state's record: the state's RUNNING stands."""
    seqs = {}

    def state_edit(data):
        data["status"] = "RUNNING"
        for trial in data["trials"]:
            trial["status"] = "RUNNING"
            seqs[trial["config"]["x"]] = trial["seq"]

    def newer_terminated(record):
        record.update(status="TERMINATED", seq=seqs[1] + 1)

    def older_terminated(record):
        record.update(status="TERMINATED", seq=seqs[2] - 1)

    _doctor(experiment, state_edit, {1: newer_terminated, 2: older_terminated})
    paths = ExperimentPaths.at(str(experiment))
    stored = {t.config["x"]: t.status for t in read_model.read_state(paths).trials}
    assert stored == {1: "TERMINATED", 2: "RUNNING"}

    as_read = {"PENDING": 0, "RUNNING": 0, "PAUSED": 0, "TERMINATED": 1, "ERRORED": 0,
               "INTERRUPTED": 1}
    snap = read_model.read_snapshot(paths)
    assert snap.status == "INTERRUPTED" and snap.view.counts == as_read
    assert {snap.state.trial(r.trial_id).config["x"]: r.status for r in snap.view.rows} == {
        1: "TERMINATED", 2: "INTERRUPTED"}
    assert read_model.summarize(paths).counts == as_read
    [listed] = _cli_json(capsys, "ls", str(experiment.parent), "--json")
    assert listed["counts"] == as_read
    status = _cli_json(capsys, "status", str(experiment), "--json")
    assert status["counts"] == as_read and status["rows"] == snap.experiment_json()["rows"]


# -- what is at a path ------------------------------------------------------------------------------
def test_locate_says_what_is_at_a_path(finished, tmp_path):
    store = finished.parent
    trial = next(p for p in finished.iterdir() if (p / "trial.json").exists())
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    (tmp_path / ".hidden_only").mkdir()
    (tmp_path / ".hidden_only" / ".tmp").write_text("x")
    cases = [
        (finished, Found.EXPERIMENT, ()),
        (store, Found.STORAGE, ("nonfinite",)),
        (trial, Found.TRIAL, ()),
        (finished / "experiment_state.json", Found.STATE_FILE, ()),
        (trial / "result.json", Found.FILE, ()),
        (tmp_path / "empty", Found.EMPTY, ()),
        (tmp_path / ".hidden_only", Found.EMPTY, ()),
        (tmp_path / "other", Found.OTHER, ("notes.txt",)),
        (tmp_path / "missing", Found.MISSING, ()),
    ]
    for path, found, names in cases:
        location = read_model.locate(Storage(str(path)))
        assert (location.found, location.names) == (found, names), path
        assert (location.experiment is not None) == (found is Found.EXPERIMENT), path
    assert read_model.experiment_names(Storage(str(store))) == ["nonfinite"]
    # A name under a storage path, or a folder, as ftnb.attach takes them.
    by_name = read_model.experiment_paths("nonfinite", str(store))
    by_folder = read_model.experiment_paths(str(finished))
    assert by_name.dir == by_folder.dir == str(finished)
    assert read_model.is_experiment(by_name.storage, by_name.dir)
    assert not read_model.is_experiment(by_name.storage, str(tmp_path / "empty"))


# -- the line that resumes it -----------------------------------------------------------------------
def test_the_resume_line_by_origin_and_where_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_STORAGE_PATH", str(tmp_path / "default"))
    home = ExperimentPaths.at(str(tmp_path / "default" / "sweep1"))
    away = ExperimentPaths.at(str(tmp_path / "my runs" / "sweep1"))
    P, M, T = ResumeContext.PYTHON, ResumeContext.MAGICS, ResumeContext.TERMINAL
    tuner = {}
    notebook = {"origin": {"trainable": "train", "param_space": "space"}}
    cli = {"origin": {"via": "cli", "trainable": "jobs.py:train"}}
    restore_home = f"ftnb.Tuner.restore({home.uri!r}, train).fit()"
    cases = [
        (tuner, home, P, restore_home),
        (tuner, home, M, restore_home),
        (tuner, home, T, f"ftnb.Tuner.restore({home.uri!r}, <trainable>).fit(), or run the "
                         "same ftnb.run(...) again"),
        (notebook, home, P, f"ftnb.attach({home.uri!r}).resume(train, param_space=space)"),
        (notebook, home, T, f"ftnb.attach({home.uri!r}).resume(train, param_space=space)"),
        (notebook, home, M, "%ftresume sweep1"),
        (notebook, away, M, f"%ftresume {away.uri}"),
        (cli, home, P, "ftnb resume sweep1"),
        (cli, home, M, "ftnb resume sweep1"),
        (cli, away, T, f"ftnb resume '{away.uri}'"),
    ]
    for settings, paths, context, line in cases:
        state = ExperimentState(name="sweep1", trainable="train", settings=dict(settings))
        assert read_model.resume_line(paths, state, context) == line, (settings, context)
    # Outside IPython the default is the Python line.
    state = ExperimentState(name="sweep1", trainable="train", settings=dict(notebook))
    assert read_model.resume_line(home, state) == cases[3][3]
    # A Tuner run whose trials hold objects given again says so, as the Tuner's own line does.
    state = ExperimentState(name="sweep1", trainable="train",
                            param_space={"data": {"__ftnb_ref__": "3fa2c1", "type": "t"}})
    assert read_model.resume_line(home, state, P) == (
        f"ftnb.Tuner.restore({home.uri!r}, train, param_space=param_space).fit()")


# -- the storage's polling reads ----------------------------------------------------------------------
@pytest.fixture(params=["local", "memory"])
def storage(request, tmp_path):
    if request.param == "local":
        return Storage(str(tmp_path / "exp"))
    return Storage(f"memory://ftnb-test-{uuid.uuid4().hex}/exp")


def test_read_from_and_file_versions(storage):
    folder = storage.root
    storage.makedirs(folder)
    path = storage.join(folder, "result.json")
    assert storage.file_versions(folder).get(path) is None
    with pytest.raises(FileNotFoundError):
        storage.read_from(path, 0)

    storage.write_atomic(path, b"one\ntwo\n")
    first = storage.file_versions(folder).get(path)
    assert first is not None and first[0] == 8
    assert storage.read_from(path, 4) == (4, b"two\n")
    assert storage.read_from(path, 8) == (8, b"")
    assert storage.read_from(path, 4, size=first[0]) == (4, b"two\n")
    assert storage.file_versions(folder).get(path) == first  # unchanged: the same version

    storage.write_atomic(path, b"one\ntwo\nthree\n")  # grew
    grown = storage.file_versions(folder).get(path)
    assert grown != first and grown[0] == 14
    assert storage.read_from(path, 8, size=grown[0]) == (8, b"three\n")

    storage.write_atomic(path, b"new\n")  # replaced by a shorter file: read whole
    assert storage.read_from(path, 14) == (0, b"new\n")
    assert storage.file_versions(folder).get(path) not in (first, grown)
    storage.remove(path)
    assert storage.file_versions(folder).get(path) is None


def _row(step: int, loss: float) -> bytes:
    return (json.dumps({"training_iteration": step, "loss": loss}) + "\n").encode()


def test_the_monitor_follows_rows_on_a_non_local_filesystem(storage):
    """The monitor reads through the storage only: the same polls over a local disk and over a
    filesystem it must list (memory://): rows that grow, a torn last line, a file replaced by a
    shorter one (a restart from a checkpoint), a trial record that is newer than the state."""
    paths = ExperimentPaths(storage, storage.root)
    state = ExperimentState(name="exp", trainable="train", status="RUNNING")
    state.trials = [TrialRecord("t1", "t1", {"x": 1}, status="RUNNING",
                                attempts=[AttemptRecord(1, started=1.0)])]
    storage.makedirs(paths.trial("t1").dir)
    state.save(paths)
    results = paths.trial("t1").results
    storage.write_atomic(results, _row(1, 0.5) + _row(2, 0.25) + b'{"training_iter')
    monitor = ExperimentMonitor(paths)
    snap = monitor.poll()
    assert snap.status == "INTERRUPTED" and snap.driver_gone  # no owner.json
    assert snap.series("loss") == {"t1": ([1, 2], [0.5, 0.25])}
    assert snap.view.rows[0].iteration == 2

    storage.write_atomic(results, _row(1, 0.5) + _row(2, 0.25) + _row(3, 0.125))
    grown = monitor.poll()
    assert grown.series("loss") == {"t1": ([1, 2, 3], [0.5, 0.25, 0.125])}
    assert snap.series("loss") == {"t1": ([1, 2], [0.5, 0.25])}  # an old snapshot holds still
    assert monitor.poll().generation == grown.generation  # nothing new: nothing rebuilt

    storage.write_atomic(results, _row(1, 0.5) + _row(2, 0.2))  # restarted from iteration 1
    replaced = monitor.poll()
    assert replaced.series("loss") == {"t1": ([1, 2], [0.5, 0.2])}

    newer = TrialRecord("t1", "t1", {"x": 1}, status="TERMINATED", seq=1,
                        attempts=[AttemptRecord(1, started=1.0, ended=2.0, outcome="finished")])
    storage.write_atomic(paths.trial("t1").record, json.dumps(newer.to_json()))
    ended = monitor.poll()
    assert ended.view.rows[0].status == "TERMINATED" and ended.view.rows[0].iteration == 2
    assert read_json_lines(storage.read_bytes(results))[-1]["loss"] == 0.2
