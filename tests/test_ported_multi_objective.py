"""Multi-objective searchers in a ConcurrencyLimiter (issue 31, item 11), as Ray's
optuna_multiobjective_example runs them: the limiter takes the searcher's metric and mode lists
as they are; a sweep runs end to end on real trial processes, and one whose driver is SIGKILLed
mid-run finishes on a re-run with every trial's iterations once and Optuna's study holding every
trial with both objectives."""

from __future__ import annotations

import pytest
from killed_driver import killed_then_rerun
from scripted import result_rows

import ftnb
from ftnb.search import ConcurrencyLimiter, Searcher

optuna = pytest.importorskip("optuna")


@pytest.mark.parametrize("metric, mode", [
    (["loss", "acc"], ["min", "max"]),
    (["loss", "acc", "seen"], ["min", "max", "obs"]),
    (["loss"], None),
])
def test_the_limiter_takes_metric_and_mode_lists(metric, mode):
    limiter = ConcurrencyLimiter(Searcher(metric=metric, mode=mode), max_concurrent=2)
    assert limiter.metric == metric and limiter.mode == mode


@pytest.mark.parametrize("metric, mode", [
    (["loss", "acc"], ["min"]),
    (["loss", "acc"], "min"),
    (["loss", 3], ["min", "max"]),
    (["loss"], ["best"]),
])
def test_lists_that_do_not_match_are_named(metric, mode):
    with pytest.raises(ValueError, match=r"Searcher\(metric=.*a multi-objective searcher.*Fix"):
        Searcher(metric=metric, mode=mode)


def evaluate(config):
    import time

    for step in range(1, config.get("steps", 3) + 1):
        time.sleep(config.get("sleep", 0))
        ftnb.report({"loss": (config["x"] - 0.3) ** 2 + 1 / step,
                     "acc": config["x"] * step, "step": step})


def _study_of(path):
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    return optuna.load_study(study_name="ftnb", storage=optuna.storages.JournalStorage(backend))


def test_a_multi_objective_optuna_sweep_in_a_limiter(tmp_path):
    from ftnb.search.optuna import OptunaSearch

    searcher = OptunaSearch(metric=["loss", "acc"], mode=["min", "max"], seed=1)
    results = ftnb.Tuner(
        evaluate, param_space={"x": ftnb.uniform(0, 1)},
        tune_config=ftnb.TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=2),
                                    num_samples=5),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="multi", verbose=0),
    ).fit()
    assert not results.errors and len(results) == 5
    study = _study_of(tmp_path / "multi" / "optuna_journal.jsonl")
    assert len(study.trials) == 5 and all(len(t.values) == 2 for t in study.trials)
    assert study.best_trials  # the Pareto front
    best = results.get_best_result(metric="loss", mode="min")
    assert best.metrics["loss"] == min(r.metrics["loss"] for r in results)


DRIVER = """
import sys, ftnb, optuna
from ftnb.search import ConcurrencyLimiter
from ftnb.search.optuna import OptunaSearch
from test_ported_multi_objective import evaluate

optuna.logging.set_verbosity(optuna.logging.WARNING)
searcher = OptunaSearch(metric=["loss", "acc"], mode=["min", "max"], seed=2)
ftnb.run(evaluate, name="killed", storage_path=sys.argv[1],
         param_space={"x": ftnb.uniform(0, 1), "steps": 4, "sleep": 0.1},
         tune_config=ftnb.TuneConfig(num_samples=8,
                                     search_alg=ConcurrencyLimiter(searcher, max_concurrent=2)),
         run_config=ftnb.RunConfig(verbose=0))
print("DONE")
"""


def test_a_sigkilled_multi_objective_sweep_finishes_on_a_rerun(tmp_path):
    exp = tmp_path / "killed"

    def some_done():
        done = [p for p in exp.glob("*/result.json") if len(result_rows(str(p.parent))) == 4]
        return len(done) >= 3

    killed_then_rerun(tmp_path, DRIVER, [str(tmp_path)], some_done, "three trials done")
    trial_dirs = [p.parent for p in exp.glob("*/result.json")]
    assert len(trial_dirs) == 8
    xs = set()
    for trial_dir in trial_dirs:
        rows = result_rows(str(trial_dir))
        assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4]
        xs.add(rows[0]["loss"])
    assert len(xs) == 8  # no config suggested twice
    study = _study_of(exp / "optuna_journal.jsonl")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 8 and all(len(t.values) == 2 for t in complete)
