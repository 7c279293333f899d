"""Ray Tune's stoppers (issue 18), used the way Ray's docs show, on real trials in their own
processes: MaximumIterationStopper and TrialPlateauStopper end a trial exactly at the report
that met them; a Stopper subclass's stop_all() and ExperimentPlateauStopper end the experiment;
TimeoutStopper / TuneConfig(time_budget_s). A trial a stopper ended is STOPPED (note "stopped by
<Stopper>"), distinct from one that completed. Driver SIGKILLs: ExperimentPlateauStopper's history
and TimeoutStopper's spent time survive them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from killed_driver import kill_when, run_to_end

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    MaximumIterationStopper,
    TimeoutStopper,
    TrialPlateauStopper,
)
from ftnb.storage import ExperimentPaths
from ftnb.ui.view import shown_status


def _values(config):
    """Reports config["values"] as ``score`` one by one (the last one again until config["n"]
    reports), ``config["sleep"]`` seconds apart (the config, or its "case" entry)."""
    import time

    config = config.get("case", config)
    values = config["values"]
    for i in range(config.get("n", len(values))):
        ftnb.report({"score": values[min(i, len(values) - 1)]})
        time.sleep(config.get("sleep", 0.0))


def _fit(tmp_path, name, cases, stop=None, **tune):
    return ftnb.Tuner(
        _values,
        param_space={"case": ftnb.grid_search(cases)} if len(cases) > 1 else cases[0],
        tune_config=ftnb.TuneConfig(**tune),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=name, stop=stop, verbose=0),
    ).fit()


def _state(path) -> ExperimentState:
    return ExperimentState.load(ExperimentPaths.at(str(path)))


def _iterations(result) -> list:
    return list(result.metrics_dataframe["training_iteration"])


def test_per_trial_stoppers_end_a_trial_at_the_report_that_met_them(tmp_path):
    stop = CombinedStopper(
        MaximumIterationStopper(max_iter=6),
        TrialPlateauStopper(metric="score", std=0.01, num_results=3, grace_period=3),
    )
    results = ftnb.Tuner(
        _values,
        param_space={"values": ftnb.grid_search([list(range(20)), [5, 1, 2, 2, 2, 9], [1, 2]])},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="per_trial", stop=stop,
                                  verbose=0),
    ).fit()
    by_values = {tuple(r.config["values"]): r for r in results}
    assert _iterations(by_values[tuple(range(20))]) == [1, 2, 3, 4, 5, 6]
    assert _iterations(by_values[(5, 1, 2, 2, 2, 9)]) == [1, 2, 3, 4, 5]  # 2, 2, 2: a plateau
    assert _iterations(by_values[(1, 2)]) == [1, 2]  # it completed on its own
    state = _state(tmp_path / "per_trial")
    notes = {tuple(t.config["values"]): (shown_status(t), t.note) for t in state.trials}
    assert notes == {
        tuple(range(20)): ("STOPPED", "stopped by MaximumIterationStopper"),
        (5, 1, 2, 2, 2, 9): ("STOPPED", "stopped by TrialPlateauStopper"),
        (1, 2): ("TERMINATED", None),
    }
    status = subprocess.run(
        [sys.executable, "-m", "ftnb", "status", "--json", str(tmp_path / "per_trial")],
        capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    shown = sorted(row["shown_status"] for row in json.loads(status.stdout)["rows"])
    assert shown == ["STOPPED", "STOPPED", "TERMINATED"]
    # The text table says the same (a stopped trial never reads as completed).
    table = subprocess.run(
        [sys.executable, "-m", "ftnb", "status", str(tmp_path / "per_trial")],
        capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    statuses = sorted(line.split("|")[2].strip() for line in table.stdout.splitlines()
                      if line.startswith("| ") and "_0000" in line)
    assert statuses == ["STOPPED", "STOPPED", "TERMINATED"], table.stdout


class CustomStopper(ftnb.Stopper):
    """Ray's documented example of a Stopper subclass."""

    def __init__(self):
        self.should_stop = False

    def __call__(self, trial_id, result):
        if not self.should_stop and result["score"] > 0.96:
            self.should_stop = True
        return self.should_stop

    def stop_all(self):
        return self.should_stop


def test_a_stopper_subclass_stop_all_ends_the_experiment(tmp_path):
    cases = [
        {"values": [0.1, 0.5], "n": 2},
        {"values": [0.5, 0.97], "n": 10_000, "sleep": 0.02},
        {"values": [0.1], "n": 3},
        {"values": [0.1], "n": 3},
    ]
    results = _fit(tmp_path, "custom", cases, stop=CustomStopper(), max_concurrent_trials=1)
    state = _state(tmp_path / "custom")
    first, second, third, fourth = state.trials
    assert (shown_status(first), first.note) == ("TERMINATED", None)
    assert (shown_status(second), second.note) == ("STOPPED", "stopped by CustomStopper")
    assert 2 <= second.iteration < 10_000  # ended from the driver, at a report after the 0.97
    for never in (third, fourth):
        assert (shown_status(never), never.note, never.attempts) == (
            "STOPPED", "stopped by CustomStopper", [])
    assert not results.errors


def test_time_budget_stops_every_trial_and_starts_no_more(tmp_path):
    cases = [{"values": [1], "n": 10**6, "sleep": 0.02}, {"values": [1], "n": 10**6}]
    results = _fit(tmp_path, "budget", cases, max_concurrent_trials=1, time_budget_s=1.0)
    running, waiting = _state(tmp_path / "budget").trials
    assert (shown_status(running), running.note) == ("STOPPED", "stopped by TimeoutStopper")
    assert 1 <= running.iteration < 10**6
    assert (shown_status(waiting), waiting.note, waiting.attempts) == (
        "STOPPED", "stopped by TimeoutStopper", [])
    assert not results.errors


def test_stoppers_check_their_arguments():
    with pytest.raises(ValueError, match="max_iter"):
        MaximumIterationStopper(max_iter=0)
    with pytest.raises(ValueError, match="mode"):
        ExperimentPlateauStopper("loss", mode="best")
    with pytest.raises(ValueError, match="timeout"):
        TimeoutStopper(-1)
    with pytest.raises(ValueError, match="time_budget_s"):
        ftnb.TuneConfig(time_budget_s=0)
    with pytest.raises(TypeError, match="CombinedStopper"):
        CombinedStopper({"training_iteration": 3})


# Trial i reports config["values"] (3 reports, 0.15 s apart), one trial at a time. The top 3
# values (mode="max") are all 3 once the fourth trial reports its first value: the experiment
# plateaus there, so trials 5 and 6 never start. A driver that forgot trials 1 and 2's results
# after a crash would let trial 5 start.
PLATEAU_DRIVER = """
import sys, time, ftnb
from ftnb.stopper import ExperimentPlateauStopper

def train(config):
    for value in config["values"]:
        ftnb.report({"score": value})
        time.sleep(0.15)

ftnb.run(
    train, name="plateau", storage_path=sys.argv[1],
    param_space={"values": ftnb.grid_search(
        [[3, 1, 1], [1, 1, 1], [3, 1, 1], [3, 1, 1], [3, 1, 1], [3, 1, 1]])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=1),
    run_config=ftnb.RunConfig(verbose=0, stop=ExperimentPlateauStopper(
        "score", std=0.001, top=3, mode="max")),
)
print("DONE")
"""


def _trial_records(exp):
    """The trials' own records (trial.json), by trial id; {} while there are none."""
    records = {}
    for path in exp.glob("*/trial.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records[record["trial_id"]] = record
    return records


def test_experiment_plateau_history_survives_a_sigkilled_driver(tmp_path):
    exp = tmp_path / "plateau"
    # Killed once the second trial has ended: its results are only in the files.
    kill_when(tmp_path, PLATEAU_DRIVER, [str(tmp_path)],
              lambda: sum(r["status"] == "TERMINATED" for r in _trial_records(exp).values()) >= 2,
              "two trials to end")
    assert "DONE" in run_to_end(tmp_path, PLATEAU_DRIVER, [str(tmp_path)])
    trials = _state(exp).trials
    assert [bool(t.attempts) for t in trials] == [True, True, True, True, False, False], [
        (t.status, t.note) for t in trials]
    assert [t.note for t in trials[4:]] == ["stopped by ExperimentPlateauStopper"] * 2
    assert all(t.status == "TERMINATED" for t in trials)


TIMEOUT_DRIVER = """
import json, sys, time, ftnb
from ftnb.stopper import TimeoutStopper

def train(config):
    while True:
        ftnb.report({"score": 1})
        time.sleep(0.05)

stopper = TimeoutStopper(30)
ftnb.run(train, name="timeout", storage_path=sys.argv[1],
         run_config=ftnb.RunConfig(verbose=0, stop=stopper))
print(json.dumps({"spent_before": stopper._elapsed_before}))
"""


def test_timeout_counts_the_time_spent_before_a_sigkilled_driver(tmp_path):
    exp = tmp_path / "timeout"
    state_file = exp / "experiment_state.json"

    def first_session_s():
        try:
            start, last_seen = json.loads(state_file.read_text())["driver_sessions"][-1]
        except (OSError, ValueError, KeyError, IndexError):
            return None
        return last_seen - start if last_seen - start >= 2 else None

    spent = kill_when(tmp_path, TIMEOUT_DRIVER, [str(tmp_path)], first_session_s,
                      "2 s of the driver's session saved")
    # The restored driver only has what is left of the 30 s: stop it sooner, at once.
    out = run_to_end(tmp_path, TIMEOUT_DRIVER.replace("TimeoutStopper(30)", "TimeoutStopper(3)"),
                     [str(tmp_path)])
    spent_before = json.loads(out.strip().splitlines()[-1])["spent_before"]
    assert spent_before >= spent
    trial = _state(exp).trials[0]
    assert (shown_status(trial), trial.note) == ("STOPPED", "stopped by TimeoutStopper")
