"""Group attempts (data-parallel trials: N ranks that fail and restart as one) in every UI: the
read model and its JSON, `ftnb status` (text and --json), `ftnb watch`, the live widget, the
text view and the terminal reporter show how many ranks a trial has, which rank failed first
(the cause, with its exception and traceback), how the other ranks ended (a peer's reset
connection) and how long the restart took; a hang reads as one. Single-worker experiments look
as they did. Real experiment folders written through the records and ExperimentPaths; the real
read model, widget and CLI read them."""

from __future__ import annotations

import html
import io
import json
import os
import time

import pytest

import ftnb
from ftnb.cli import main
from ftnb.core.records import AttemptRecord, ExperimentState, FailureRecord, TrialRecord
from ftnb.storage import ExperimentPaths, Storage
from ftnb.storage.lease import Lease
from ftnb.ui import read_model
from ftnb.ui.failures import (
    collateral_lines,
    group_failures_text,
    group_lines,
    restart_text,
    shorten_keeping_rank,
)
from ftnb.ui.monitor import text_view
from ftnb.ui.terminal import TerminalReporter
from ftnb.ui.view import ExperimentView, render_table

pytestmark = pytest.mark.timeout(60)

T0 = time.time() - 600  # the experiments were created ten minutes ago
PEER = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:29500"
TIMEOUT = "RuntimeError: Timed out waiting 30000ms for recv operation to complete"
HANG = ("rank 0 stopped making progress (stopped, deadlocked or cut off) and was killed: see "
        "ScalingConfig(collective_timeout_s)")
TRACEBACK = "\n".join(
    ["Traceback (most recent call last):"]
    + [f'  File "/work/train.py", line {n}, in step_{n}\n    step_{n + 1}()' for n in range(1, 5)]
    + ["RuntimeError: boom at step 4"])


def _crash(recovered_s):
    """Rank 1 raised at iteration 4; rank 0 lost its peer."""
    return FailureRecord(
        attempt=1, time=T0, iteration=4, kind="exception", type="RuntimeError",
        message="boom at step 4", traceback=TRACEBACK, rank=1,
        ranks=[{"rank": 0, "ended": "peer", "detail": PEER},
               {"rank": 1, "ended": "error", "detail": "RuntimeError: boom at step 4"}],
        recovered_s=recovered_s)


def _hang():
    """Rank 0 stopped (SIGSTOP) and was killed; rank 1 timed out in its all-reduce."""
    return FailureRecord(
        attempt=1, time=T0 + 100, iteration=2, kind="hang", message=HANG,
        signal="SIGKILL", rank=0,
        ranks=[{"rank": 0, "ended": "hung", "detail": "stopped making progress; killed"},
               {"rank": 1, "ended": "peer", "detail": TIMEOUT}])


def _attempt(number, *, workers, start_iteration=0, ended=True, outcome="finished"):
    return AttemptRecord(number=number, started=T0 + number,
                         start_iteration=start_iteration, num_workers=workers,
                         pids=list(range(4000 + 10 * number, 4000 + 10 * number + workers)),
                         ended=T0 + 50 + number if ended else None,
                         outcome=outcome if ended else "running")


def _rows(trial_id, iterations):
    return [{"loss": 1.0 / i, "training_iteration": i, "trial_id": trial_id, "attempt": 1,
             "timestamp": T0 + i} for i in iterations]


def write_group_experiment(root, name="ddp", *, live=False, recovered_s=1.234, workers=2):
    """An experiment of ``workers``-rank trials: ``crash`` failed in rank 1 and restarted from
    its checkpoint (``live``: it is back on attempt 2, running, its restart not done when
    ``recovered_s`` is None), ``hang`` hung in rank 0 and errored, ``waits`` has not started."""
    paths = ExperimentPaths.of(Storage(str(root)), name)
    os.makedirs(paths.dir, exist_ok=True)
    state = ExperimentState(name=name, trainable="train_loop", created=T0,
                            status="RUNNING" if live else "ERRORED",
                            settings={"metric": "loss", "mode": "min", "varying_keys": ["lr"]},
                            driver_sessions=[[T0, T0 + 200]])
    crash = TrialRecord("crash_00000", "train_crash_00000", {"lr": 0.1},
                        status="RUNNING" if live else "TERMINATED",
                        attempts=[_attempt(1, workers=workers, outcome="failed"),
                                  _attempt(2, workers=workers, start_iteration=3,
                                           ended=not live)],
                        failures=[_crash(recovered_s)], iteration=6)
    hang = TrialRecord("hang_00001", "train_hang_00001", {"lr": 0.01}, status="ERRORED",
                       attempts=[_attempt(1, workers=workers, outcome="failed")],
                       failures=[_hang()], iteration=2,
                       error={"reason": "max_failures=0 reached"})
    waits = TrialRecord("waits_00002", "train_waits_00002", {"lr": 0.001}, status="PENDING")
    for trial, iterations in ((crash, range(1, 7)), (hang, range(1, 3)), (waits, ())):
        folder = paths.trial(trial.dir_name)
        os.makedirs(folder.dir, exist_ok=True)
        rows = _rows(trial.trial_id, iterations)
        with open(folder.results, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        trial.last_result = rows[-1] if rows else None
        state.trials.append(trial)
    state.save(paths)
    return paths, state


def write_single_experiment(root, name="single"):
    """The same crash in an ordinary (one process) trial; its restart took 2 s."""
    paths = ExperimentPaths.of(Storage(str(root)), name)
    os.makedirs(paths.dir, exist_ok=True)
    state = ExperimentState(name=name, trainable="train", created=T0,
                            status="FINISHED", settings={"varying_keys": ["lr"]},
                            driver_sessions=[[T0, T0 + 200]])
    failure = FailureRecord(attempt=1, time=T0, iteration=4, kind="exception",
                            type="RuntimeError", message="boom at step 4", traceback=TRACEBACK,
                            recovered_s=2.0)
    trial = TrialRecord("one_00000", "train_one_00000", {"lr": 0.1}, status="TERMINATED",
                        attempts=[_attempt(1, workers=1, outcome="failed"),
                                  _attempt(2, workers=1, start_iteration=3)],
                        failures=[failure], iteration=6)
    os.makedirs(paths.trial(trial.dir_name).dir, exist_ok=True)
    state.trials.append(trial)
    state.save(paths)
    return paths, state


def _status(capsys, *argv):
    code = main(["status", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _table(out):
    """The table's header and rows (cells stripped) by trial id."""
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[1:]
    return header, {r[0]: dict(zip(header, r)) for r in rows}


# -- the wording, on records -------------------------------------------------------------------
def test_a_group_failure_reads_as_cause_other_ranks_and_restart():
    crash = _crash(1.234)
    assert group_lines(crash) == [
        "rank 1 failed first (the cause): exception RuntimeError: boom at step 4",
        f"rank 0: peer ({PEER})",
        "restarted in 1.2 s",
    ]
    assert group_lines(_hang()) == [
        ("rank 0 hung first (the cause): stopped making progress (stopped, deadlocked or cut "
         "off) and was killed: see ScalingConfig(collective_timeout_s)"),
        f"rank 1: peer ({TIMEOUT})",
    ]
    # Ranks that ended alike are one line; the cause is never among the others.
    eight = FailureRecord(attempt=3, time=0.0, iteration=9, kind="signal", signal="SIGKILL",
                          rank=5, ranks=[{"rank": r, "ended": "peer", "detail": "reset"}
                                         for r in range(5)]
                          + [{"rank": 5, "ended": "signal", "detail": "SIGKILL"},
                             {"rank": 6, "ended": "stopped", "detail": "ended by ftnb"},
                             {"rank": 7, "ended": "stopped", "detail": "ended by ftnb"}])
    assert group_lines(eight) == ["rank 5 failed first (the cause): signal SIGKILL",
                                  "ranks 0, 1, 2, 3, 4: peer (reset)",
                                  "ranks 6, 7: stopped (ended by ftnb)"]
    # A record is read, not trusted: entries that are not ranks are left out.
    odd = FailureRecord(attempt=1, time=0.0, iteration=1, kind="exit", exit_code=3, rank=1,
                        ranks=[{"rank": 0, "ended": "clean"}, "junk", {"ended": "error"}])
    assert collateral_lines(odd) == ["rank 0: clean"]
    assert group_lines(odd)[0] == "rank 1 failed first (the cause): exit code 3"


def test_the_restart_is_under_way_until_the_next_attempt_reports():
    failure = _crash(None)
    trial = TrialRecord("t", "t", {}, status="PENDING", failures=[failure])
    assert restart_text(failure, trial) == "restarting"
    trial.status = "RUNNING"
    assert restart_text(failure, trial) == "restarting"
    for ended in ("ERRORED", "PAUSED", "INTERRUPTED"):  # it is not coming back on its own
        trial.status = ended
        assert restart_text(failure, trial) == ""
    failure.recovered_s = 75.04
    assert restart_text(failure, trial) == "restarted in 75.0 s"


def test_a_cut_last_error_keeps_the_rank_that_failed_first():
    crash = _crash(None)
    crash.message = "x" * 200
    cut = shorten_keeping_rank(crash, 60)
    assert len(cut) == 60 and cut.endswith("... in rank 1 (attempt 1, iter 4)"), cut
    single = FailureRecord(attempt=1, time=0.0, iteration=4, kind="exception", type="E",
                           message="y" * 200)
    assert shorten_keeping_rank(single, 60) == single.summary()[:57] + "..."  # as before


# -- the read model and its JSON ---------------------------------------------------------------
def test_the_read_model_carries_ranks_and_every_ranks_end(tmp_path, capsys):
    paths, _ = write_group_experiment(tmp_path)
    snap = read_model.read_snapshot(paths)
    assert {r.trial_id: r.num_workers for r in snap.view.rows} == {
        "crash_00000": 2, "hang_00001": 2, "waits_00002": 2}  # not started: the experiment's
    assert snap.view.summary().startswith(
        "Experiment ddp: ERRORED | 1 PENDING, 1 TERMINATED, 1 ERRORED | 2 ranks per trial | "
        "2 failures, 0 preemptions | run time")

    doc = snap.to_json()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc  # strict JSON
    rows = {r["trial_id"]: r for r in doc["experiment"]["rows"]}
    crash = rows["crash_00000"]["last_failure"]
    assert rows["crash_00000"]["num_workers"] == 2
    assert (crash["rank"], crash["recovered_s"], crash["traceback"]) == (1, 1.234, TRACEBACK)
    assert crash["ranks"] == [{"rank": 0, "ended": "peer", "detail": PEER},
                              {"rank": 1, "ended": "error",
                               "detail": "RuntimeError: boom at step 4"}]
    assert crash["summary"] == "exception RuntimeError: boom at step 4 in rank 1 (attempt 1, " \
                               "iter 4)"
    assert crash["cause"] == "rank 1 failed first (the cause): exception RuntimeError: boom at " \
                             "step 4"
    assert crash["collateral"] == [f"rank 0: peer ({PEER})"]
    assert crash["restart"] == "restarted in 1.2 s"
    hang = rows["hang_00001"]["last_failure"]
    assert hang["kind"] == "hang" and hang["rank"] == 0 and hang["restart"] is None
    assert hang["cause"].startswith("rank 0 hung first (the cause): stopped making progress")
    assert rows["hang_00001"]["error_reason"] == "max_failures=0 reached"
    assert rows["waits_00002"]["last_failure"] is None
    # Every failure, not only the last ones: what a web front end lists.
    assert doc["failures"] == {"crash_00000": [crash], "hang_00001": [hang]}

    # `ftnb status --json` prints exactly the experiment part.
    assert main(["status", paths.dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == doc["experiment"]


def test_trials_not_started_yet_have_the_ranks_the_experiment_records(tmp_path):
    paths = ExperimentPaths.of(Storage(str(tmp_path)), "queued")
    os.makedirs(paths.dir)
    state = ExperimentState(name="queued", trainable="t", settings={"num_workers": 4},
                            trials=[TrialRecord(f"q_{i}", f"q_{i}", {}) for i in range(2)])
    state.save(paths)
    view = read_model.read_snapshot(paths).view
    assert [r.num_workers for r in view.rows] == [4, 4]
    assert "| 4 ranks per trial |" in view.summary()
    # Recorded on every attempt too: a trial's own attempts say what it ran with.
    state.trials[0].attempts = [_attempt(1, workers=2, ended=False)]
    assert [r.num_workers for r in ExperimentView.from_state(state).rows] == [2, 4]
    assert "| 2-4 ranks per trial |" in ExperimentView.from_state(state).summary()


# -- ftnb status, ftnb watch, the text view ------------------------------------------------------
def test_ftnb_status_shows_ranks_the_cause_with_its_traceback_and_the_restart(tmp_path, capsys):
    paths, _ = write_group_experiment(tmp_path)
    out = _status(capsys, paths.dir)
    print(out)  # the sample the report quotes (pytest -s)
    lines = out.splitlines()
    assert "| 2 ranks per trial |" in lines[0]
    header, rows = _table(out)
    assert header[:6] == ["trial_id", "status", "ranks", "iter", "attempts", "failures"]
    assert [rows[t]["ranks"] for t in ("crash_00000", "hang_00001", "waits_00002")] == ["2"] * 3
    # Cut to the column, the rank that failed first stays in sight.
    assert rows["crash_00000"]["last error"] == \
        "exception RuntimeError: boo... in rank 1 (attempt 1, iter 4)"
    assert rows["hang_00001"]["last error"].startswith("hang rank 0 stopped making")
    assert rows["hang_00001"]["last error"].endswith("... in rank 0 (attempt 1, iter 2)")

    block = out[out.index("Group failures"):out.index("Updated ")].splitlines()
    assert block[0] == "Group failures (the latest of each trial; 2 trials):"
    # The errored trial first; for each: the cause, its traceback's end, the other ranks, the
    # restart.
    hang_at, crash_at = block.index("  hang_00001 attempt 1 (iter 2), 2 ranks:"), \
        block.index("  crash_00000 attempt 1 (iter 4), 2 ranks:")
    assert hang_at < crash_at
    assert block[hang_at + 1].startswith("    rank 0 hung first (the cause): stopped making")
    assert block[hang_at + 2] == f"    rank 1: peer ({TIMEOUT})"
    crash = block[crash_at + 1:]
    assert crash[0] == "    rank 1 failed first (the cause): exception RuntimeError: boom at " \
                       "step 4"
    assert crash[1] == "      | ... (4 traceback lines above; the trial's error.txt has them all)"
    assert crash[2:8] == ["      | " + line for line in TRACEBACK.splitlines()[-6:]]
    assert crash[7] == "      | RuntimeError: boom at step 4"
    assert crash[8:10] == [f"    rank 0: peer ({PEER})", "    restarted in 1.2 s"]

    # `ftnb watch` shows the same, without tracebacks; it ends with the experiment's exit code.
    assert main(["watch", paths.dir]) == 1  # ERRORED
    watched = capsys.readouterr().out
    assert "| 2 ranks per trial |" in watched and "| ranks |" in watched
    assert "    rank 1 failed first (the cause): exception RuntimeError: boom at step 4\n" \
           f"    rank 0: peer ({PEER})\n    restarted in 1.2 s" in watched
    assert "Traceback" not in watched

    # The text view (a widget where widgets cannot be shown, h.display() in a script).
    snap = read_model.read_snapshot(paths)
    text = text_view(snap)
    assert text == render_table(snap.view) + "\n" + "\n".join(block).rstrip("\n")


def test_a_restart_under_way_reads_restarting_then_how_long_it_took(tmp_path, capsys):
    paths, state = write_group_experiment(tmp_path, live=True, recovered_s=None)
    lease = Lease.acquire(paths)  # this process drives it: RUNNING, not INTERRUPTED
    try:
        out = _status(capsys, paths.dir)
        assert out.startswith("Experiment ddp: RUNNING")
        assert "    rank 0: peer" in out and "    restarting\n" in out
        assert "restarted in" not in out

        state.trial("crash_00000").failures[-1].recovered_s = 3.5
        state.save(paths)
        out = _status(capsys, paths.dir)
        assert "    restarted in 3.5 s\n" in out and "restarting" not in out
    finally:
        lease.release()


# -- the widget ----------------------------------------------------------------------------------
@pytest.fixture
def widget_class():
    pytest.importorskip("ipywidgets", reason="the widget needs ftnb[notebook]")
    pytest.importorskip("plotly", reason="the widget needs ftnb[notebook]")
    from ftnb.notebook.widget import ExperimentWidget

    return ExperimentWidget


def test_the_widget_shows_ranks_the_first_failing_rank_the_others_and_the_restart(
        tmp_path, widget_class):
    from ftnb.notebook.widget import table_rows

    paths, _ = write_group_experiment(tmp_path)
    w = widget_class(ftnb.attach(paths.dir), start=False)
    try:
        assert "2 ranks per trial" in w.header.value
        header, rows = table_rows(w.snapshot, w.metric_picker.value, None)
        assert header[:3] == ["trial", "status", "ranks"]
        assert [r[2] for r in rows] == ["2", "2", "2"]

        failures = w.failures.value
        # Newest first: the hang (rank 0), then the crash (rank 1), each with its ranks below.
        assert failures.index("hang_00001") < failures.index("crash_00000")
        for text in ("attempt 1 (iter 4)  exception  rank 1: RuntimeError: boom at step 4",
                     "rank 1 failed first (the cause): exception RuntimeError: boom at step 4",
                     f"rank 0: peer ({PEER})", "restarted in 1.2 s",
                     "attempt 1 (iter 2)  hang  rank 0 stopped making progress",
                     "rank 0 hung first (the cause): stopped making progress",
                     f"rank 1: peer ({TIMEOUT})"):
            assert text in failures, text
        # The chart's restart marker says which rank failed and how long the restart took.
        [(x, hover)] = zip(w.chart.restarts_trace.x, w.chart.restarts_trace.hovertext)
        assert x == 3 and hover.startswith("crash_00000: attempt 2 resumed from iteration 3 at ")
        assert hover.endswith(" after rank 1 failed (exception); restarted in 1.2 s")
        labels = [label for label, _ in w.failure_picker.options]
        assert "hang_00001  attempt 1 (iter 2)  hang  rank 0 stopped making progress" in labels[0]
        assert "rank 1: RuntimeError: boom at step 4" in labels[1]

        # The traceback on demand: the cause, the other ranks and the restart above it.
        w.failure_picker.value = w.failure_picker.options[1][1]
        w.traceback_toggle.value = True
        shown = w.traceback.value
        assert shown.index("rank 1 failed first (the cause)") < shown.index(
            "rank 0: peer") < shown.index("restarted in 1.2 s") < shown.index("Traceback")
        assert "RuntimeError: boom at step 4" in shown
        # A hang has no traceback: what happened, in the same words as the list.
        w.failure_picker.value = w.failure_picker.options[0][1]
        assert w.traceback.value.split(">", 1)[1].split("<")[0].splitlines() == [
            html.escape(line) for line in group_lines(_hang())]
    finally:
        w.close()


def test_the_widget_shows_the_restart_once_it_is_done(tmp_path, widget_class):
    paths, state = write_group_experiment(tmp_path, live=True, recovered_s=None)
    lease = Lease.acquire(paths)
    try:
        w = widget_class(ftnb.attach(paths.dir), start=False)
        try:
            assert "RUNNING" in w.header.value
            assert "restarting" in w.failures.value and "restarted in" not in w.failures.value
            [hover] = w.chart.restarts_trace.hovertext
            assert hover.endswith(" after rank 1 failed (exception)")
            state.trial("crash_00000").failures[-1].recovered_s = 3.5
            state.save(paths)
            w.refresh()  # same failures, one of them now restarted: shown
            assert "restarted in 3.5 s" in w.failures.value
            assert "restarting" not in w.failures.value
            [hover] = w.chart.restarts_trace.hovertext
            assert hover.endswith(" after rank 1 failed (exception); restarted in 3.5 s")
        finally:
            w.close()
    finally:
        lease.release()


# -- the terminal reporter (what a script prints while it runs) --------------------------------
def test_the_terminal_reporter_says_the_cause_the_other_ranks_and_the_restart():
    out = io.StringIO()
    reporter = TerminalReporter(stream=out)
    failure = _crash(None)
    trial = TrialRecord("crash_00000", "d", {}, status="RUNNING",
                        attempts=[_attempt(1, workers=2, outcome="failed")], failures=[failure])
    state = ExperimentState(name="ddp", trainable="t", trials=[trial])
    reporter.on_trial_failure(state, trial, failure)
    assert out.getvalue().splitlines() == [
        ("ftnb: trial crash_00000 exception RuntimeError: boom at step 4 in rank 1 (attempt 1, "
         "iter 4)"),
        "  rank 1 failed first (the cause): exception RuntimeError: boom at step 4",
        f"  rank 0: peer ({PEER})",
    ]
    out.truncate(0), out.seek(0)
    trial.attempts.append(_attempt(2, workers=2, ended=False))
    reporter.on_result(state, trial, {"training_iteration": 4})  # not restarted yet: no word
    failure.recovered_s = 1.3
    reporter.on_result(state, trial, {"training_iteration": 5})
    reporter.on_result(state, trial, {"training_iteration": 6})  # said once
    assert out.getvalue() == "ftnb: trial crash_00000 restarted in 1.3 s (attempt 2)\n"


# -- single-worker experiments look as they did ------------------------------------------------
def test_single_worker_experiments_look_as_before(tmp_path, capsys):
    paths, state = write_single_experiment(tmp_path)
    view = ExperimentView.from_state(state)
    assert view.rows[0].num_workers == 1 and not view.is_group and view.ranks_text() == ""
    assert view.summary().startswith("Experiment single: FINISHED | 1 TERMINATED | 1 failure,")
    out = _status(capsys, paths.dir)
    header, rows = _table(out)
    assert header[:5] == ["trial_id", "status", "iter", "attempts", "failures"]
    assert "ranks" not in header and "ranks per trial" not in out
    assert rows["one_00000"]["last error"] == \
        "exception RuntimeError: boom at step 4 (attempt 1, iter 4)"
    assert "Group failures" not in out and "restarted" not in out
    assert group_failures_text(state.trials) == ""
    assert "Group failures" not in text_view(read_model.read_snapshot(paths))

    out = io.StringIO()
    reporter = TerminalReporter(stream=out)
    trial = state.trials[0]
    reporter.on_trial_failure(state, trial, trial.failures[0])
    reporter.on_result(state, trial, {"training_iteration": 5})
    assert out.getvalue() == f"ftnb: trial one_00000 {trial.failures[0].summary()}\n"

    # The JSON says it all the same (a field more: how it would be worded).
    assert main(["status", paths.dir, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert row["num_workers"] == 1
    assert (row["last_failure"]["rank"], row["last_failure"]["ranks"]) == (None, [])
    assert (row["last_failure"]["cause"], row["last_failure"]["collateral"]) == (None, [])


def test_single_worker_widget_looks_as_before(tmp_path, widget_class):
    from ftnb.notebook.widget import failure_label, table_rows

    paths, state = write_single_experiment(tmp_path)
    w = widget_class(ftnb.attach(paths.dir), start=False)
    try:
        assert "ranks per trial" not in w.header.value
        header, _ = table_rows(w.snapshot, None, None)
        assert header[:5] == ["trial", "status", "iter", "attempts", "failures"]
        failure = state.trials[0].failures[0]
        assert failure_label("one_00000", failure).endswith(
            "one_00000  attempt 1 (iter 4)  exception  RuntimeError: boom at step 4")
        assert "rank" not in w.failures.value and "restarted" not in w.failures.value
        w.traceback_toggle.value = True
        assert "Traceback" in w.traceback.value and "rank" not in w.traceback.value
    finally:
        w.close()
