"""HyperOptSearch, BayesOptSearch and NevergradSearch across a driver SIGKILL: a Ray-style script
killed mid-run (trials running, some told) and run again to its end (HyperOpt's and Nevergrad's
by ``Tuner.restore(path, trainable)``, the searcher rebuilt from its description) finishes with
every trial's iterations exactly once, and the searcher's observations kept: the restored optimizer was shown
every earlier outcome, and its suggestions go on with the study (a study started again would
suggest its first configs again; seeded as they are, these would be the same)."""

from __future__ import annotations

import json

import pytest

from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths
from killed_driver import killed_then_rerun
from scripted import result_rows

pytest.importorskip("hyperopt")
pytest.importorskip("bayes_opt")
pytest.importorskip("nevergrad")

N_TRIALS, N_STEPS = 6, 3

DRIVER = """
import sys, time, ftnb
from ftnb.search import ConcurrencyLimiter
{imports}
from scripted import report_step, restored_step

def trainable(config):
    # Its best slope inside the range (at a bound, BayesOpt would draw it again and again).
    for step in range(restored_step() + 1, config["n"] + 1):
        time.sleep(0.25)
        report_step({{"score": step - 10 * (config["slope"] - 0.37) ** 2}}, step, True)

path = sys.argv[1] + "/wrap"
if {restore} and ftnb.Tuner.can_restore(path):
    # Without search_alg: ftnb builds the searcher again from its description.
    ftnb.Tuner.restore(path, trainable).fit()
else:
    ftnb.run(
        trainable, name="wrap", storage_path=sys.argv[1],
        param_space={{"slope": ftnb.uniform(0.1, 1), "n": {steps}}},
        tune_config=ftnb.TuneConfig(metric="score", mode="max", num_samples={trials},
                                    search_alg=ConcurrencyLimiter({searcher}, 2)),
        run_config=ftnb.RunConfig(verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)),
    )
print("DONE")
"""

#: name: (imports, searcher, whether the rerun restores it with Tuner.restore(path, trainable),
#: without search_alg, rather than running the same ftnb.run again).
SEARCHERS = {
    "hyperopt": ("from ftnb.search.hyperopt import HyperOptSearch",
                 "HyperOptSearch(n_initial_points=2, random_state_seed=11)", True),
    "bayesopt": ("from ftnb.search.bayesopt import BayesOptSearch",
                 "BayesOptSearch(random_search_steps=2)", False),
    "nevergrad": ("import nevergrad as ng\nfrom ftnb.search.nevergrad import NevergradSearch",
                  "NevergradSearch(optimizer=ng.optimizers.OnePlusOne)", True),
}


def _saved(exp):
    try:
        return json.loads((exp / "searcher_state.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def _observations(saved):
    return saved["state"]["searcher"]["observations"]


@pytest.mark.parametrize("name", sorted(SEARCHERS))
def test_a_killed_driver_goes_on_with_the_study(tmp_path, name):
    imports, searcher, restore = SEARCHERS[name]
    script = DRIVER.format(imports=imports, searcher=searcher, steps=N_STEPS, trials=N_TRIALS,
                           restore=restore)
    exp = tmp_path / "wrap"
    before = {}

    def told_twice_and_running():
        saved = _saved(exp)
        if saved is None:
            return None
        told = _observations(saved)["told"]
        if len(told) >= 2 and saved["live"]:
            before.update(saved)
            return True
        return None

    killed_then_rerun(tmp_path, script, [str(tmp_path)], told_twice_and_running,
                      "two trials told and others running")

    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert state.status == "FINISHED"
    trials = state.trials
    assert len(trials) == N_TRIALS and all(t.status == "TERMINATED" for t in trials)
    for trial in trials:  # every iteration exactly once
        rows = result_rows(str(exp / trial.dir_name))
        assert [r["training_iteration"] for r in rows] == list(range(1, N_STEPS + 1))
    # The observations made before the kill are kept, each outcome told once.
    saved = _saved(exp)
    obs = _observations(saved)
    earlier = _observations(before)
    assert obs["told"][:len(earlier["told"])] == earlier["told"]
    assert [t for t, _ in obs["asked"]] == [t.trial_id for t in trials]
    assert sorted(t for t, _, _ in obs["told"]) == sorted(t.trial_id for t in trials)
    scores = {t.trial_id: t.last_result["score"] for t in trials}
    assert all(value == pytest.approx(scores[t]) for t, value, _ in obs["told"])
    # The suggestions after the restore go on with the study: no config comes again.
    slopes = [t.config["slope"] for t in trials]
    assert len({round(s, 9) for s in slopes}) == N_TRIALS, slopes
    assert saved["pending"] == {} and saved["live"] == {} and saved["made"] == N_TRIALS
