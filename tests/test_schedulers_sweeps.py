"""Trial schedulers on real sweeps (issue 18): ASHA stops the worse trials exactly at their rungs
(trial processes of the local executor), HyperBand pauses trials at their milestone and resumes
the best from its checkpoint, the median stopping rule stops a trial below the median; then the
ASHA sweep with its driver SIGKILLed three times at random moments: the same rung decisions,
every iteration recorded once, the stopped trials still stopped; and HyperBand's and the median
rule's sweeps, killed three times, end exactly as unkilled ones. A scheduler-stopped trial reads
STOPPED, with the reason, in the records, the read model and the CLI's table."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from killed_driver import kill_when, run_to_end
from scripted import report_step, restored_step, result_rows

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.schedulers import ASHAScheduler, HyperBandScheduler, MedianStoppingRule
from ftnb.storage import ExperimentPaths
from ftnb.ui.view import shown_status


def _state(path) -> ExperimentState:
    return ExperimentState.load(ExperimentPaths.at(str(path)))


def _by_q(state: ExperimentState) -> dict:
    return {t.config["q"]: t for t in state.trials}


def _iterations(exp, trial) -> list:
    return [row["training_iteration"] for row in result_rows(str(exp / trial.dir_name))]


# Run one at a time in this order, with loss = q / iteration (ASHA: max_t=9, grace_period=1,
# reduction_factor=3), the rungs decide (worked out by hand from Ray's rules):
#   q=3: rungs 1, 3 empty: on to max_t    q=1: above both cutoffs: on to max_t
#   q=4: below rung 1's cutoff (-1.67)    q=2: passes rung 1 (-2.33), below rung 3's (-0.56)
#   q=6, q=5: below rung 1's cutoff
ORDER = [3, 1, 4, 2, 6, 5]
LAST_ITERATION = {3: 9, 1: 9, 4: 1, 2: 3, 6: 1, 5: 1}


def _check_asha_outcome(exp) -> None:
    state = _state(exp)
    trials = _by_q(state)
    for q, trial in trials.items():
        # Every iteration once, and the last one is where the decision was made.
        assert _iterations(exp, trial) == list(range(1, LAST_ITERATION[q] + 1)), q
    for q in (3, 1):
        assert (trials[q].status, shown_status(trials[q]), trials[q].note) == (
            "TERMINATED", "TERMINATED", None)
    for q in (4, 2, 6, 5):
        trial = trials[q]
        assert trial.status == "TERMINATED" and shown_status(trial) == "STOPPED", q
        assert trial.note.startswith(
            f"stopped by ASHAScheduler at training_iteration={LAST_ITERATION[q]}: loss="), q
        assert not trial.failures
    rungs = dict((m, r) for m, r in state.scheduler["state"]["brackets"][0])
    by_id = {t.trial_id: q for q, t in trials.items()}
    assert {by_id[t]: v for t, v in rungs[1].items()} == {q: -q for q in ORDER}
    assert {by_id[t]: v for t, v in rungs[3].items()} == {3: -1.0, 1: -1 / 3, 2: -2 / 3}


def _asha_trainable(config):
    import time

    import ftnb

    for i in range(1, 10):
        time.sleep(config.get("sleep", 0.0))
        ftnb.report({"loss": config["q"] / i})


def test_asha_stops_the_worse_trials_at_their_rungs(tmp_path):
    scheduler = ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)
    results = ftnb.Tuner(
        _asha_trainable,
        param_space={"q": ftnb.grid_search(ORDER)},
        tune_config=ftnb.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                    scheduler=scheduler),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="asha", verbose=0),
    ).fit()
    assert not results.errors
    _check_asha_outcome(tmp_path / "asha")
    # The read model (what every view renders: `ftnb status`, the widget, the lab panel)
    # tells the stopped trials from the finished ones.
    out = subprocess.run([sys.executable, "-m", "ftnb", "status", str(tmp_path / "asha"),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = {row["params"]["q"]: row["shown_status"] for row in json.loads(out.stdout)["rows"]}
    assert shown == {3: "TERMINATED", 1: "TERMINATED", 4: "STOPPED", 2: "STOPPED",
                     6: "STOPPED", 5: "STOPPED"}


# The same sweep by a driver script that is SIGKILLed and run again: ftnb.run resumes it.
ASHA_DRIVER = """
import sys, time, ftnb
from ftnb.schedulers import ASHAScheduler
from scripted import report_step, restored_step

def train(config):
    for i in range(restored_step() + 1, 10):
        time.sleep(0.06)
        report_step({"loss": config["q"] / i}, i, checkpoint=True)

ftnb.run(train, name="asha", storage_path=sys.argv[1],
         param_space={"q": ftnb.grid_search(__ORDER__)},
         tune_config=ftnb.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                     scheduler=ASHAScheduler(max_t=9, grace_period=1,
                                                             reduction_factor=3)),
         run_config=ftnb.RunConfig(verbose=0))
print("DONE")
""".replace("__ORDER__", repr(ORDER))


def _rows_so_far(exp) -> int:
    return sum(len(result_rows(str(p.parent))) for p in exp.glob("*/result.json"))


def test_asha_decisions_survive_three_driver_sigkills(tmp_path):
    exp = tmp_path / "asha"
    rng = random.Random()
    kills = []
    # 24 reports in all: each driver is killed 1 to 5 reports into its run, most often while
    # a trial waits at a rung for the decision (it comes milliseconds after the row).
    for _ in range(3):
        base, more = _rows_so_far(exp), rng.randint(1, 5)
        kills.append(kill_when(tmp_path, ASHA_DRIVER, [str(tmp_path)],
                               lambda: _rows_so_far(exp) >= base + more and _rows_so_far(exp),
                               f"{more} more reports after {base}"))
    assert "DONE" in run_to_end(tmp_path, ASHA_DRIVER, [str(tmp_path)])
    _check_asha_outcome(exp)
    assert len(_state(exp).driver_sessions) == 4, kills


def _checkpointing_trainable(config):
    """loss = q / iteration up to iteration ``config["steps"]``, a checkpoint at each report;
    restored, from the checkpoint's iteration on."""
    for i in range(restored_step() + 1, config["steps"] + 1):
        report_step({"loss": config["q"] / i}, i, checkpoint=True)


def test_hyperband_pauses_at_the_milestone_and_resumes_the_best_from_its_checkpoint(tmp_path):
    # max_t=3, eta=3: trials 0 and 1 form a bracket run to 3; trials 2, 3, 4 a bracket that
    # pauses each at 1, then keeps the best (q=1) up to 3, from its checkpoint at 1. One trial
    # at a time, so q=1 is surely not the last of its bracket at 1 (the last one, if the best,
    # goes on without a pause, as in Ray).
    ftnb.Tuner(
        _checkpointing_trainable,
        param_space={"q": ftnb.grid_search([5, 6, 3, 1, 2]), "steps": 3},
        tune_config=ftnb.TuneConfig(
            metric="loss", mode="min", max_concurrent_trials=1,
            scheduler=HyperBandScheduler(max_t=3, reduction_factor=3)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="hb", verbose=0,
                                  executor="inprocess"),
    ).fit()
    exp = tmp_path / "hb"
    trials = _by_q(_state(exp))
    best = trials[1]
    assert _iterations(exp, best) == [1, 2, 3]
    assert [a.outcome for a in best.attempts] == ["stopped", "stopped"]
    assert best.attempts[1].restored_from == "checkpoint_000000"
    assert best.attempts[1].start_iteration == 1
    assert not best.failures and best.status == "TERMINATED" and shown_status(best) == "TERMINATED"
    for q in (3, 2):
        trial = trials[q]
        assert _iterations(exp, trial) == [1], q
        assert shown_status(trial) == "STOPPED" and not trial.failures, q
        assert trial.note.startswith("stopped by HyperBandScheduler at training_iteration=1")
    for q in (5, 6):
        assert _iterations(exp, trials[q]) == [1, 2, 3] and trials[q].note is None


def _median_trainable(config):
    import time

    import ftnb

    for i in range(1, 6):
        time.sleep(0.08 if config["q"] == 10 else 0.01)  # the bad trial lags behind
        ftnb.report({"loss": config["q"] + 1.0 / i})


def test_median_stopping_rule_stops_the_trial_below_the_median(tmp_path):
    ftnb.Tuner(
        _median_trainable,
        param_space={"q": ftnb.grid_search([1, 2, 3, 10])},
        tune_config=ftnb.TuneConfig(
            metric="loss", mode="min",
            scheduler=MedianStoppingRule(time_attr="training_iteration", grace_period=2,
                                         min_samples_required=3)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="median", verbose=0,
                                  executor="inprocess"),
        resources_per_trial={"cpu": 0.1},  # all four at once: none waits, none yields
    ).fit()
    exp = tmp_path / "median"
    trials = _by_q(_state(exp))
    bad = trials[10]
    last = _iterations(exp, bad)
    assert shown_status(bad) == "STOPPED" and 2 <= len(last) < 5, (last, bad.note)
    assert bad.note.startswith(f"stopped by MedianStoppingRule at training_iteration="
                               f"{len(last)}: best loss=")
    for q in (1, 2, 3):
        assert _iterations(exp, trials[q]) == [1, 2, 3, 4, 5] and trials[q].note is None


def test_a_restore_goes_on_with_the_stored_scheduler(tmp_path):
    """Tuner.restore rebuilds ASHA from the state (no scheduler given) and refuses another."""
    tuner = ftnb.Tuner(
        _asha_trainable, param_space={"q": ftnb.grid_search([1, 2])},
        tune_config=ftnb.TuneConfig(metric="loss", mode="min",
                                    scheduler=ASHAScheduler(max_t=3, grace_period=1)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="again", verbose=0,
                                  executor="inprocess"))
    tuner.fit()
    restored = ftnb.Tuner.restore(str(tmp_path / "again"), _asha_trainable)
    assert type(restored.tune_config.scheduler) is ASHAScheduler
    with pytest.raises(ftnb.RestoreError, match="another scheduler"):
        ftnb.Tuner.restore(str(tmp_path / "again"), _asha_trainable,
                           scheduler=MedianStoppingRule(metric="loss", mode="min"))
    state = json.loads((tmp_path / "again" / "experiment_state.json").read_text())
    assert state["scheduler"]["class"] == "ASHAScheduler"


def _as_if_killed(exp, edit) -> None:
    """Rewrite the stored experiment as a driver killed at some moment would have left it:
    ``edit(state, trials_by_q)`` changes the records; the trials' own records follow."""
    paths = ExperimentPaths.at(str(exp))
    state = ExperimentState.load(paths)
    edit(state, _by_q(state))
    state.status = "RUNNING"
    for trial in state.trials:
        trial.seq += 10
        (exp / trial.dir_name / "trial.json").write_text(json.dumps(trial.to_json()))
    state.save(paths, final=True)


def test_a_restore_keeps_a_decision_carried_out_and_makes_the_one_the_driver_missed(tmp_path):
    """The two moments a SIGKILL can hit a decision, made to happen exactly: (1) the decision
    to stop q=2 at rung 3 was saved and answered but its end never seen (the trial is still
    RUNNING in the records): it stays stopped, its rows as they are; (2) q=5 reported its rung
    and checkpointed, the driver died before deciding: the restore decides from the persisted
    row (the same STOP), and q=5 never runs again."""
    ftnb.Tuner(
        _checkpointing_trainable, param_space={"q": ftnb.grid_search(ORDER), "steps": 9},
        tune_config=ftnb.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                    scheduler=ASHAScheduler(max_t=9, grace_period=1,
                                                            reduction_factor=3)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="asha", verbose=0,
                                  executor="inprocess"),
    ).fit()
    exp = tmp_path / "asha"
    _check_asha_outcome(exp)

    def edit(state, trials):
        record = state.scheduler
        q2, q5 = trials[2], trials[5]
        # (1) Stopped at its rung, answered, its exit not seen.
        # (Its note marked: the restore must carry out this decision, not make it again.)
        record["decided"][q2.trial_id] = {"decision": "STOP", "iteration": 3,
                                          "note": q2.note + " [as decided]"}
        record["ended"].remove(q2.trial_id)
        q2.status, q2.attempts[-1].outcome, q2.attempts[-1].ended = "RUNNING", "running", None
        # (2) Its rung's row persisted, no decision: not in the rung, not fed, still running.
        bracket = record["state"]["brackets"][0]
        for milestone, recorded in bracket:
            recorded.pop(q5.trial_id, None)
        record["state"]["stopped"].pop(q5.trial_id)
        record["fed"][q5.trial_id] = 0
        record["ended"].remove(q5.trial_id)
        q5.status, q5.note = "RUNNING", None
        q5.attempts[-1].outcome, q5.attempts[-1].ended = "running", None

    _as_if_killed(exp, edit)
    ftnb.Tuner.restore(str(exp), _checkpointing_trainable).fit()
    _check_asha_outcome(exp)
    trials = _by_q(_state(exp))
    assert len(trials[2].attempts) == 1 and len(trials[5].attempts) == 1  # neither ran again
    assert trials[2].note.endswith(" [as decided]")


def test_the_asha_benchmark_workload_runs_at_its_quick_size(tmp_path):
    """bench's `asha` workload (ftnb's side; Ray Tune is not run here) at its --quick size."""
    pytest.importorskip("psutil", reason="the benchmark needs psutil (the `bench` extra)")
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.runner import check_figures, run_repetition
    from bench.workloads import WORKLOADS

    workload = WORKLOADS["asha"]
    figures = check_figures(run_repetition(workload, "ftnb", workload.quick, str(tmp_path),
                                           False))
    trials, max_t = workload.quick["trials"], workload.quick["max_t"]
    assert 1 <= figures["stopped"] < trials
    assert trials <= figures["iterations"] < trials * max_t


def _hyperband_stopping_trainable(config):
    """_checkpointing_trainable; the trial q=2 first waits until q=1 and q=3 wait PAUSED at their
    milestone, and asks the experiment to stop (as `ftnb stop` does) before its first report."""
    import glob
    import json as json_
    import os
    import time

    import ftnb
    from ftnb.storage import ExperimentPaths
    from ftnb.storage.control import send_request

    if config["q"] == 2 and ftnb.get_checkpoint() is None:
        exp = os.path.dirname(ftnb.get_context().get_trial_dir())

        def paused() -> int:
            count = 0
            for path in glob.glob(os.path.join(exp, "*", "trial.json")):
                try:
                    with open(path) as f:
                        record = json_.load(f)
                except (OSError, ValueError):
                    continue
                count += record["status"] == "PAUSED" and record["config"]["q"] in (1, 3)
            return count

        deadline = time.time() + 60
        while paused() < 2 and time.time() < deadline:
            time.sleep(0.02)
        paths = ExperimentPaths.at(exp)
        request = send_request(paths, "stop")
        while os.path.exists(paths.control_request(request.id)) and time.time() < deadline:
            time.sleep(0.02)  # until the driver took it: the report below is made while stopping
    _checkpointing_trainable(config)


def test_hyperband_paused_trials_wait_through_a_stop_and_a_restore(tmp_path):
    """The experiment is stopped while two trials of a bracket wait PAUSED at their milestone
    and the third reports it: the bracket's decision stands (q=2, the worst, stops; q=3 stops;
    q=1 goes on), the restore resumes q=1 from its checkpoint and nothing else of the bracket."""
    run = dict(param_space={"q": ftnb.grid_search([5, 6, 3, 1, 2]), "steps": 3},
               tune_config=ftnb.TuneConfig(metric="loss", mode="min", scheduler=HyperBandScheduler(
                   max_t=3, reduction_factor=3)),
               run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="hb", verbose=0,
                                         executor="inprocess"),
               resources_per_trial={"cpu": 0.1})
    ftnb.Tuner(_hyperband_stopping_trainable, **run).fit()
    exp = tmp_path / "hb"
    first = _state(exp)
    assert first.status == "INTERRUPTED"
    ftnb.Tuner.restore(str(exp), _hyperband_stopping_trainable).fit()
    trials = _by_q(_state(exp))
    assert _iterations(exp, trials[1]) == [1, 2, 3] and trials[1].note is None
    assert trials[1].attempts[-1].restored_from == "checkpoint_000000"
    for q in (3, 2):
        assert _iterations(exp, trials[q]) == [1], q
        assert shown_status(trials[q]) == "STOPPED", (q, trials[q].note)
    for q in (5, 6):
        assert _iterations(exp, trials[q]) == [1, 2, 3], q
    assert not any(t.failures for t in trials.values())


# HyperBand (pauses at its milestones, resumes the best) and the median stopping rule (yields
# to waiting trials, then stops the trial below the median), run one trial at a time so that
# their decisions depend on the results alone: a run with its driver SIGKILLed three times at
# random moments must end exactly as a run that was never killed.
SCHEDULED_DRIVER = """
import sys, time, ftnb
from ftnb.schedulers import HyperBandScheduler, MedianStoppingRule
from scripted import report_step, restored_step

def train(config):
    for i in range(restored_step() + 1, config["steps"] + 1):
        time.sleep(0.03)
        report_step({"loss": config["q"] + 1.0 / i}, i, checkpoint=True)

if sys.argv[2] == "hyperband":
    scheduler, qs, steps = HyperBandScheduler(max_t=3, reduction_factor=3), [5, 6, 3, 1, 2], 3
else:
    scheduler = MedianStoppingRule(time_attr="training_iteration", grace_period=2,
                                   min_samples_required=2)
    qs, steps = [1, 2, 3, 10], 5
ftnb.run(train, name="sched", storage_path=sys.argv[1],
         param_space={"q": ftnb.grid_search(qs), "steps": steps},
         tune_config=ftnb.TuneConfig(metric="loss", mode="min", max_concurrent_trials=1,
                                     scheduler=scheduler),
         run_config=ftnb.RunConfig(verbose=0))
print("DONE")
"""


def _scheduled_outcome(exp) -> dict:
    outcome = {}
    for q, trial in _by_q(_state(exp)).items():
        iterations = _iterations(exp, trial)
        assert iterations == list(range(1, len(iterations) + 1)), (q, iterations)  # each once
        assert not trial.failures, (q, trial.failures)  # a pause, a stop, a kill: no failure
        outcome[q] = (len(iterations), trial.status, shown_status(trial), trial.note)
    return outcome


@pytest.mark.parametrize("kind", ["hyperband", "median"])
def test_hyperband_and_median_decisions_survive_three_driver_sigkills(tmp_path, kind):
    reference = tmp_path / "reference"
    assert "DONE" in run_to_end(tmp_path, SCHEDULED_DRIVER, [str(reference), kind])
    expected = _scheduled_outcome(reference / "sched")
    assert any(shown == "STOPPED" for _, _, shown, _ in expected.values()), expected
    total = sum(n for n, *_ in expected.values())
    killed = tmp_path / "killed"
    exp = killed / "sched"
    rng = random.Random()
    for _ in range(3):
        base = _rows_so_far(exp)
        more = rng.randint(1, max(1, min(4, total - base - 2)))
        kill_when(tmp_path, SCHEDULED_DRIVER, [str(killed), kind],
                  lambda: _rows_so_far(exp) >= base + more, f"{more} more reports after {base}")
    assert "DONE" in run_to_end(tmp_path, SCHEDULED_DRIVER, [str(killed), kind])
    assert _scheduled_outcome(exp) == expected
    assert len(_state(exp).driver_sessions) == 4
