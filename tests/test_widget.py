"""The live widget's view model, without a kernel: widgets built from real experiment folders in
every state (finished, errored, interrupted with a dead driver, running under a supervisor,
with failures and restarts), their values asserted; the controls against a real running
experiment; and what is sent to the browser (only what changed). Its behaviour in a real kernel
(views, bytes per display, controls by id, tracebacks) is tests/test_widget_chart.py's."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time

import pytest

pytest.importorskip("ipywidgets", reason="the widget needs ftnb[notebook]")
pytest.importorskip("anywidget", reason="the widget needs ftnb[notebook]")

import comm  # noqa: E402

import ftnb  # noqa: E402
from ftnb.storage.lease import process_name  # noqa: E402
from ftnb.core.records import ExperimentState  # noqa: E402
from ftnb.notebook.widget import (  # noqa: E402
    DEFAULT_TABLE_ROWS,
    ExperimentWidget,
    table_rows,
    text_view,
)
from procs import REPO, processes_named, run_script, wait_for  # noqa: E402
from scripted import case_dirs, report_step, restored_step, result_rows, scripted_case  # noqa: E402

sys.path.insert(0, REPO)
from bench.widget_load import write_experiment  # noqa: E402

N = 6
CASES = [
    ("clean", {}, 1),
    ("restart", {"1": [4, "raise"]}, 2),  # resumes from iteration 2 in attempt 2
    ("errored", {"1": [2, "raise_same"], "2": [2, "raise_same"]}, 1),
]


@pytest.fixture(scope="module")
def errored_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("widget")
    grid = ftnb.Tuner(
        scripted_case,
        param_space={"case": ftnb.grid_search(
            [{"name": c, "faults": f, "ckpt_every": e, "n": N} for c, f, e in CASES])},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2, metric="score", mode="max"),
        run_config=ftnb.RunConfig(storage_path=str(root), name="sweep", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    assert grid.status == "ERRORED"
    return grid.experiment_path


def _ids(path):
    state = ftnb.attach(path).state()
    by_dir = {os.path.join(path, t.dir_name): t.trial_id for t in state.trials}
    return {name: by_dir[d] for name, d in case_dirs(path).items()}


def wait_widget(w, predicate, **kw):
    """wait_for, judged between two updates: the updater thread sets the snapshot, the header
    and the controls one after another under the widget's lock, so a predicate read without it
    could see half an update (and the assertions after it the other half)."""

    def settled():
        with w._lock:
            return predicate()

    return wait_for(settled, **kw)


def _rows(widget):
    header, rows = table_rows(widget.snapshot, widget.metric_picker.value, None)
    return {r[0]: dict(zip(header, r)) for r in rows}


def _stoppable(widget):
    return [trial_id for trial_id, _ in widget.chart.controls["stoppable"]]


def _control(widget, action, trial_id=None):
    """A control request as a view sends it; returns the reply it gets ``(ok, text)``."""
    replies = []
    original = widget.chart.send
    widget.chart.send = lambda content, buffers=None: replies.append(content)
    try:
        widget.chart._on_front_end_msg(widget.chart, {"type": action, "trial_id": trial_id,
                                                "request": 7, "view": "v1"}, [])
    finally:
        widget.chart.send = original
    (reply,) = [r for r in replies if r.get("type") == "reply"]
    assert (reply["request"], reply["view"]) == (7, "v1")
    return reply["ok"], reply["text"]


@pytest.fixture
def sent(monkeypatch):
    """Every comm message the widgets send (outside a kernel they go nowhere)."""
    messages = []
    original = comm.DummyComm.publish_msg

    def publish(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        messages.append((self.comm_id, msg_type, data))
        return original(self, msg_type, data=data, metadata=metadata, buffers=buffers, **keys)

    monkeypatch.setattr(comm.DummyComm, "publish_msg", publish)
    return messages


def test_errored_experiment_shows_everything(errored_path):
    ids = _ids(errored_path)
    w = ExperimentWidget(ftnb.attach(errored_path))
    try:
        # Finished: the updater does not even start; the first state was read at once.
        assert not w.updating and w.snapshot.status == "ERRORED"
        header = w.header.value
        for text in ("sweep", "ERRORED", "2 TERMINATED, 1 ERRORED", "3 failures, 2 retries",
                     "run time 0:00:"):
            assert text in header, (text, header)

        rows = _rows(w)
        assert set(rows) == set(ids.values())
        clean, restart, errored = (rows[ids[n]] for n in ("clean", "restart", "errored"))
        assert (clean["status"], clean["iter"], clean["attempts"], clean["failures"]) == (
            "TERMINATED", str(N), "1", "0")
        assert (restart["attempts"], restart["failures"], restart["score"]) == ("2", "1", "6")
        assert "injected failure at step 4" in restart["last error"]
        assert errored["status"] == "ERRORED" and errored["iter"] == "1"
        assert "deterministic bug" in errored["last error"]
        assert "case/name" in clean and clean["case/name"] == "clean"
        assert ids["errored"] in w.table.value and "deterministic bug" in w.table.value

        # The chart: the experiment's metric, a trace per trial with its rows, restarts marked.
        assert w.metric_picker.value == "score"
        assert list(w.metric_picker.options)[:2] == ["score", "resumed_from"]
        traces = w.chart.trial_traces
        assert set(traces) == set(ids.values())
        for name, trial_id in ids.items():
            file_rows = result_rows(case_dirs(errored_path)[name])
            assert list(traces[trial_id].x) == [r["training_iteration"] for r in file_rows]
            assert list(traces[trial_id].y) == [r["score"] for r in file_rows]
        shown = w.chart.trial_statuses
        assert shown[ids["errored"]] == "ERRORED" and shown[ids["clean"]] == "TERMINATED"
        marks = w.chart.restarts_trace
        points = sorted(zip(marks.x, marks.y, marks.hovertext))
        assert [(x, y) for x, y, _ in points] == [(1, 1.0), (2, 2.0)]
        assert f"{ids['restart']}: attempt 2 resumed from iteration 2" in points[1][2]
        assert "after a failure (exception)" in points[1][2]
        assert marks.kind == ["retry", "retry"]
        assert w.chart.metric == "score"
        # Legend and hover name each trial by its varying hyperparameters.
        labels = w.chart.labels
        assert labels[ids["clean"]].startswith("case/name=clean")

        # Failures: newest first, one line each; the traceback only on demand.
        # (The restart trial's failure and the errored trial's first one race each other on a
        # busy machine, so the expected order comes from the recorded failure times.)
        recorded = sorted(
            ((f.time, t.trial_id, f.attempt) for t in ftnb.attach(errored_path).state().trials
             for f in t.failures), reverse=True)
        order = [(t, a) for _, t, a in recorded]
        assert sorted(order) == sorted([(ids["errored"], 1), (ids["errored"], 2),
                                        (ids["restart"], 1)])
        assert order.index((ids["errored"], 2)) < order.index((ids["errored"], 1))
        options = list(w.failure_picker.options)
        assert len(options) == 3
        for (label, value), (_, trial_id, attempt) in zip(options, recorded):
            assert value[0] == trial_id and f"{trial_id}  attempt {attempt} " in label, label
        label_of = {(v[0], int(label.split("attempt ")[1].split()[0])): (label, v)
                    for label, v in options}
        assert "exception" in label_of[ids["restart"], 1][0]
        assert "injected failure at step 4" in label_of[ids["restart"], 1][0]
        assert "deterministic bug" in label_of[ids["errored"], 2][0]
        assert "injected failure at step 4" in w.failures.value
        assert w.traceback.value == ""
        w.traceback_toggle.value = True  # the newest failure is picked first
        newest = "injected failure at step 4" if recorded[0][1] == ids["restart"] else (
            "deterministic bug")
        assert "Traceback" in w.traceback.value and newest in w.traceback.value
        w.failure_picker.value = label_of[ids["restart"], 1][1]
        assert "injected failure at step 4" in w.traceback.value
        w.failure_picker.value = label_of[ids["errored"], 2][1]
        assert "deterministic bug" in w.traceback.value
        w.traceback_toggle.value = False
        assert w.traceback.value == ""

        # Controls: nothing to stop or resume.
        assert not w.chart.controls["running"] and not w.chart.controls["interrupted"]
        assert w.chart.controls["stoppable"] == []
        assert "Resume it with" not in text_view(w.snapshot)

        # Where widgets cannot be shown, the same view as text instead of the widget's repr.
        bundle = w._repr_mimebundle_()
        assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == w.model_id
        assert bundle["text/plain"] == text_view(w.snapshot)
        assert bundle["text/plain"].startswith("Experiment sweep: ERRORED")
    finally:
        w.close()


def test_choosing_another_metric_redraws_every_trace_and_the_table(errored_path):
    ids = _ids(errored_path)
    w = ExperimentWidget(ftnb.attach(errored_path))
    try:
        w.metric_picker.value = "resumed_from"
        traces = w.chart.trial_traces
        restart_rows = result_rows(case_dirs(errored_path)["restart"])
        assert list(traces[ids["restart"]].y) == [r["resumed_from"] for r in restart_rows]
        assert w.chart.metric == "resumed_from"
        # The restart marker sits on the new metric's value at the iteration it resumed from.
        marks = dict(zip(w.chart.restarts_trace.x, w.chart.restarts_trace.y))
        assert marks[2] == 0  # resumed_from at iteration 2 was 0 (attempt 1 started fresh)
        assert "resumed_from" in _rows(w)[ids["clean"]]
    finally:
        w.close()


def test_nothing_is_sent_when_nothing_changed_and_only_the_new_points_when_some_came(
    errored_path, tmp_path, sent
):
    path = str(tmp_path / "copy")
    shutil.copytree(errored_path, path)
    ids = _ids(path)
    w = ExperimentWidget(ftnb.attach(path), start=False)
    try:
        assert sent  # the widgets were created (comm_open) and filled
        del sent[:]
        w.refresh()
        w.refresh()
        assert sent == []

        results = os.path.join(case_dirs(path)["clean"], "result.json")
        with open(results, "a") as f:
            f.write(json.dumps({"score": 42.0, "training_iteration": N + 1,
                                "trial_id": ids["clean"]}) + "\n")
        w.refresh()
        chart_id = w.chart.comm.comm_id
        # One append, for that trial alone: its one new point, from where the view's line ends.
        customs = [d["content"] for cid, kind, d in sent
                   if cid == chart_id and d and d.get("method") == "custom"]
        assert customs == [{"type": "delta", "metric": "score", "trials": {
            ids["clean"]: {"start": N, "x": [N + 1], "y": [42.0]}}}]
        assert list(w.chart.trace(ids["clean"]).y) == [float(i) for i in range(1, N + 1)] + [42.0]
        # The table changed (its iteration), the failures did not: not re-sent.
        changed = {cid for cid, kind, d in sent}
        assert w.table.comm.comm_id in changed
        assert w.failures.comm.comm_id not in changed
        assert w.failure_picker.comm.comm_id not in changed
        assert _rows(w)[ids["clean"]]["iter"] == str(N + 1)
    finally:
        w.close()


def test_many_trials_cut_table(tmp_path):
    trials = DEFAULT_TABLE_ROWS + 10
    paths, _ = write_experiment(str(tmp_path), "many", trials, 5)
    w = ExperimentWidget(ftnb.attach(paths.dir))
    try:
        assert len(w.chart.trial_traces) == trials
        assert w.table.value.count("<tr>") == DEFAULT_TABLE_ROWS + 1  # + the header row
        assert "10 more trials" in w.table.value
        w.show_all_rows.value = True
        assert w.table.value.count("<tr>") == trials + 1
        assert "more trials" not in w.table.value
        assert w.header.value.count(f"{trials} TERMINATED") == 1
    finally:
        w.close()


LIVE_DRIVER = """
import sys, ftnb
from scripted import scripted_case

ftnb.run(
    scripted_case, name="live", storage_path=sys.argv[1],
    param_space={"case": ftnb.grid_search([
        {"name": "slow", "n": 2000, "sleep": 0.05, "ckpt_every": 5},
        {"name": "fails", "n": 2000, "sleep": 0.05, "ckpt_every": 1,
         "faults": {"1": [3, "raise"]}},
    ])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=3)),
)
"""


def test_interrupted_by_a_dead_driver_offers_the_resume_line(tmp_path):
    proc = run_script(tmp_path, LIVE_DRIVER, str(tmp_path))
    exp = str(tmp_path / "live")
    try:
        wait_for(lambda: os.path.exists(os.path.join(exp, "experiment_state.json")),
                 timeout=60, what="the experiment to start")
        handle = ftnb.attach(exp)
        w = ExperimentWidget(handle)
        assert w.updating
        wait_widget(w, lambda: w.snapshot is not None and w.snapshot.restarts
                    and all(len(t.x) >= 4 for t in w.chart.trial_traces.values()),
                    timeout=60, what="the updater to show rows and a restart")
        assert "RUNNING" in w.header.value
        assert w.chart.controls["running"] and not w.chart.controls["interrupted"]
        assert len(w.chart.restarts_trace.x) == 1
        token = json.loads(open(os.path.join(exp, "owner.json")).read())["token"]
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    try:
        wait_widget(w, lambda: "INTERRUPTED" in w.header.value, timeout=30,
                    what="the widget to show the dead driver")
        assert "is gone" in w.header.value
        assert w.chart.controls["interrupted"] and not w.chart.controls["running"]
        assert w.chart.controls["resume_line"] == handle.resume_line
        assert w.updating  # it keeps watching (slowly) for a resume from elsewhere
        assert "Resume it with" in text_view(w.snapshot)

        # The trials it was running show as INTERRUPTED too; the stored state is unchanged.
        assert {r.status for r in w.snapshot.view.rows} == {"INTERRUPTED"}
        assert "2 INTERRUPTED" in w.header.value and "RUNNING" not in w.header.value
        assert w.chart.controls["stoppable"] == []  # nothing runs that could be stopped
        stored = ExperimentState.load(handle.paths).merge_trial_records(handle.paths)
        assert {t.status for t in stored.trials} == {"RUNNING"}

        # A control that fails shows its error in the status line; nothing is raised.
        trial_id = w.snapshot.view.rows[0].trial_id
        w._action("Stop trial", lambda: handle.stop_trial(trial_id))
        assert "failed" in w.status_line.value and "not running" in w.status_line.value
    finally:
        w.close()
        wait_for(lambda: not processes_named(process_name(token)), timeout=20,
                 what="the killed driver's trials to die")
    assert not w.updating


def held(config: dict) -> None:
    """Reports a step every ``sleep`` s (a checkpoint every 5) for at least ``min_steps``, and
    on while the file ``config["hold"]`` exists."""
    start = restored_step()
    step = start
    while True:
        step += 1
        time.sleep(config.get("sleep", 0.05))
        metrics = {"score": float(step), "loss": 1.0 / step}
        report_step(metrics, step, checkpoint=step % 5 == 0)
        if step >= config.get("min_steps", 1) and not os.path.exists(config["hold"]):
            return


def test_controls_stop_a_trial_stop_the_experiment_and_resume_it(tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("hold")
    handle = ftnb.launch(
        held, param_space={"hold": str(hold), "i": ftnb.grid_search([0, 1, 2])},
        name="ctl", storage_path=str(tmp_path / "runs"),
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2), quiet=True,
    )
    w = ExperimentWidget(handle)
    try:
        wait_widget(w, lambda: w.snapshot is not None and len(_stoppable(w)) == 3
                    and len(w.chart.trial_traces) == 2
                    and all(len(t.x) >= 3 for t in w.chart.trial_traces.values()),
                    timeout=60, what="two trials reporting in the widget")
        assert w.chart.controls["running"] and w.updating

        # Stop one trial, as a view's message names it: it ends STOPPED (not completed), the
        # experiment goes on.
        victim = next(iter(w.chart.trial_traces))
        assert _control(w, "stop_trial", victim) == (True, f"Stopping trial {victim}: requested.")
        assert f"Stopping trial {victim}: requested" in w.status_line.value
        wait_widget(w, lambda: _rows(w)[victim]["status"] == "STOPPED", timeout=60,
                    what="the stopped trial to end")
        assert victim not in _stoppable(w)
        assert w.chart.trial_statuses[victim] == "STOPPED"
        assert "RUNNING" in w.header.value
        # A second stop of it (a click queued behind a busy kernel) is refused: no other trial
        # is stopped in its place.
        ok, text = _control(w, "stop_trial", victim)
        assert not ok and text == f"Trial {victim} already ended (STOPPED): nothing stopped."
        ok, text = _control(w, "stop_trial", "gone_00009")
        assert not ok and "No trial gone_00009" in text
        assert len(_stoppable(w)) == 2

        # Stop the experiment: INTERRUPTED, with the line (and the button) that resumes it.
        assert _control(w, "stop")[0]
        wait_widget(w, lambda: w.snapshot.status == "INTERRUPTED"
                    and w.chart.controls["interrupted"], timeout=60,
                    what="the experiment to stop")
        assert not w.chart.controls["running"]
        assert w.chart.controls["resume_line"] == handle.resume_line
        stopped_at = {t: len(tr.x) for t, tr in w.chart.trial_traces.items()}

        # Resume (with the trainable this process launched it with), then let it finish.
        assert _control(w, "resume")[0], w.status_line.value
        assert "failed" not in w.status_line.value, w.status_line.value
        wait_widget(w, lambda: w.snapshot.status == "RUNNING", timeout=60,
                    what="the widget to show the resumed experiment")
        wait_widget(w, lambda: len(w.chart.trial_traces) == 3
                    and any(len(w.chart.trace(t).x) > n for t, n in stopped_at.items()),
                    timeout=60, what="new rows after the resume")
        hold.unlink()
        wait_for(lambda: not w.updating, timeout=120,
                 what="the updater to stop once the experiment finished")
        assert w.snapshot.status == "FINISHED" and "FINISHED" in w.header.value
        statuses = {t: r["status"] for t, r in _rows(w).items()}
        assert statuses.pop(victim) == "STOPPED"
        assert set(statuses.values()) == {"TERMINATED"}
        # Paused by the stop, then resumed: not retries (nothing failed).
        assert "0 failures, 0 retries" in w.header.value
        assert set(w.chart.restarts_trace.kind) == {"resume"}
        assert not w.chart.controls["running"] and not w.chart.controls["interrupted"]
    finally:
        if hold.exists():
            hold.unlink()
        w.close()
        handle.stop(wait=True, timeout=60) if handle.is_live() else None


class _BrokenHandle:
    """A handle whose controls fail: their errors must land in the status line."""

    def __init__(self, real):
        self._real = real
        self.name, self.path = real.name, real.path
        self.resume_line = real.resume_line

    def monitor(self):
        return self._real.monitor()

    def stop(self, wait=True, timeout=60.0):
        raise RuntimeError("the storage said no")

    def stop_trial(self, trial_id, wait=True, timeout=60.0):
        print("trying hard")
        raise ValueError(f"no trial {trial_id}")

    def resume(self, trainable=None, *, param_space=None, wait=False):
        raise ValueError("cannot resume without its trainable")


def test_control_errors_go_to_the_status_line(errored_path):
    w = ExperimentWidget(_BrokenHandle(ftnb.attach(errored_path)))
    try:
        assert not _control(w, "stop")[0]
        assert "Stopping experiment sweep failed: the storage said no" in w.status_line.value
        assert not _control(w, "resume")[0]
        assert "cannot resume without its trainable" in w.status_line.value
        assert not _control(w, "stop_trial", "")[0]
        assert "Choose a trial to stop first" in w.status_line.value
        # An id the experiment has, but ended: refused before the handle is asked.
        ended = w.snapshot.trial_ids[0]
        assert _control(w, "stop_trial", ended)[1].startswith(f"Trial {ended} already ended")
    finally:
        w.close()


def test_a_widget_before_the_experiment_exists_waits_for_it(errored_path, tmp_path):
    class Later:
        name, path, resume_line = "later", str(tmp_path / "later"), "%ftresume later"

        def monitor(self):
            from ftnb.ui.monitor import ExperimentMonitor

            return ExperimentMonitor(self.path)

    w = ExperimentWidget(Later())
    try:
        assert w.snapshot is None and "waiting for the experiment to start" in w.header.value
        assert w.updating
        # Appears whole (a copy renamed into place), as a finished experiment's files are.
        shutil.copytree(errored_path, str(tmp_path / "staging"))
        os.rename(tmp_path / "staging", tmp_path / "later")
        wait_for(lambda: not w.updating, timeout=30, what="the widget to show it and stop")
        assert "ERRORED" in w.header.value and len(w.chart.trial_traces) == 3
    finally:
        w.close()


def test_close_stops_the_updater(tmp_path):
    paths, _ = write_experiment(str(tmp_path), "open", 3, 4, status="RUNNING")
    # RUNNING with no owner: shown INTERRUPTED, watched slowly; close() ends the thread.
    w = ExperimentWidget(ftnb.attach(paths.dir))
    assert w.snapshot.status == "INTERRUPTED" and w.updating
    thread = w._thread
    w.close()
    assert not thread.is_alive() and not w.updating
    assert threading.active_count() >= 1


@pytest.mark.s3
def test_widget_on_s3(s3_storage):
    url, fs = s3_storage
    grid = ftnb.Tuner(
        scripted_case,
        param_space={"case": ftnb.grid_search(
            [{"name": c, "faults": f, "ckpt_every": e, "n": N} for c, f, e in CASES[:2]])},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=ftnb.RunConfig(storage_path=url, storage_filesystem=fs, name="s3w",
                                  verbose=0, failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    handle = ftnb.attach(grid.experiment_path, storage_filesystem=fs)
    w = ExperimentWidget(handle)
    try:
        assert w.interval_s >= 2.0  # object stores are polled less often
        assert not w.updating and "FINISHED" in w.header.value
        assert all(list(t.x) == list(range(1, N + 1)) for t in w.chart.trial_traces.values())
        assert len(w.chart.restarts_trace.x) == 1 and len(w.failure_picker.options) == 1
    finally:
        w.close()


def test_updater_in_a_real_kernel(tmp_path):
    """The bench workload at a small size: a jupyter_client kernel shows the widget on an
    experiment a writer process plays, and its updater thread sends updates."""
    pytest.importorskip("jupyter_client", reason="needs jupyter_client")
    pytest.importorskip("ipykernel", reason="needs ipykernel")
    from bench.widget_load import widget_updater

    # At 2 rows/s the first running trial finishes a minute after the writer starts: the
    # widget is built long before any pending trial could start.
    figures = widget_updater("ftnb", str(tmp_path), trials=12, reports=1000, running=3,
                             rows_per_s=2.0, window_s=3.0, idle_s=0.5)
    assert figures["chart_traces"] == 12 - 3  # the pending ones have no rows yet
    assert figures["unviewed_comm_msgs"] == 0  # no view: nothing sent
    assert 0 < figures["display_kb"] < 300 and not figures["plotly_imported"]
    assert figures["updates_per_s"] > 0 and figures["comm_msgs_per_s"] > 0
    # The updater never polls more than twice a second: 2 a second, one more for where the
    # window starts and ends, and one more for the poll at the end of the cell that read the
    # window's first stats (a cell's end shows the experiment as it is then, however recent the
    # updater's last poll: under load the two came within milliseconds in a CI rehearsal).
    window = figures["stats_window_s"]
    assert window >= 3.0 and figures["polls_per_s"] * window <= 2 * window + 2
    assert 0 <= figures["kernel_cpu_pct"] < 100
