"""PB2 (Population Based Bandits): the bandit alone (its kernel, the reward changes it learns
from, suggestions in bounds, moving toward what scores better, deterministic under a seed),
the scheduler's policy with a fake controller, then a real sweep on local processes and the
same sweep with its driver SIGKILLed once: every exploit carried out once and whole, and the
bandit's data continues exactly (no row lost, none twice)."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter

import pytest
from killed_driver import kill_when, run_to_end
from test_pbt import (
    ITERATIONS,
    LRS,
    RESTORE,
    TRAIN,
    _check_exploits,
    _Controller,
    _state,
    _Trial,
    train,
)

import ftnb
from ftnb.core.records import StateFormatError
from ftnb.schedulers.pb2 import PB2
from ftnb.schedulers.pb2_bandit import reward_changes, suggest, time_varying_kernel

pytest.importorskip("sklearn")

BOUNDS = {"lr": [0.01, 10.0]}


def _rows(rates: dict, times=(1, 2, 3)) -> list:
    """Rows of trials whose score grows by ``rates[values]`` per unit of time."""
    rows = []
    for n, (values, rate) in enumerate(rates.items()):
        rows += [{"trial": str(n), "time": t, "reward": rate * t, "values": list(values)}
                 for t in times]
    return rows


# -- the bandit ----------------------------------------------------------------------------------
def test_the_kernel_decays_with_time_and_its_gradient_is_right():
    np = pytest.importorskip("numpy")
    kernel = time_varying_kernel(epsilon=0.2).k1
    X = np.random.default_rng(0).uniform(size=(7, 3))
    K, gradient = kernel(X, eval_gradient=True)
    step = 1e-6
    for i, hyperparameter in enumerate(kernel.hyperparameters):
        theta = kernel.theta.copy()
        theta[i] += step
        numeric = (kernel.clone_with_theta(theta)(X) - K) / step
        assert np.abs(numeric - gradient[:, :, i]).max() < 1e-4, hyperparameter.name
    # The same hyperparameters further apart in time correlate less: (1 - eps) ** (|dt| / 2).
    near, far = kernel(np.array([[0.0, 0.5], [0.1, 0.5], [1.0, 0.5]]))[0, 1:]
    assert far < near < kernel.variance
    assert far / kernel.variance == pytest.approx(0.8 ** 0.5)
    assert np.allclose(kernel.diag(X), np.diag(K))


def test_reward_changes_pair_a_trials_rows_with_the_same_config():
    rows = [{"trial": "a", "time": 2, "reward": 4.0, "values": [1.0]},
            {"trial": "a", "time": 4, "reward": 8.0, "values": [1.0]},
            # a exploits: its next interval starts at time 4 from the donor's 20 with lr 3.
            {"trial": "a", "time": 4, "reward": 20.0, "values": [3.0]},
            {"trial": "a", "time": 6, "reward": 26.0, "values": [3.0]},
            {"trial": "b", "time": 2, "reward": 1.0, "values": [0.5]},
            {"trial": "b", "time": 2, "reward": 1.0, "values": [0.5]},  # (no time elapsed)
            {"trial": "b", "time": 4, "reward": float("inf"), "values": [0.5]}]  # (no number)
    assert reward_changes(rows) == [(2.0, 4.0, [1.0], 2.0), (4.0, 20.0, [3.0], 3.0)]


def test_suggestions_stay_in_bounds_and_are_deterministic_under_a_seed():
    rng = random.Random(7)
    rates = {(rng.uniform(-1, 2), rng.uniform(100, 300)): rng.uniform(-1, 1) for _ in range(6)}
    rows = _rows(rates, times=(1, 2, 3, 4))
    bounds = [(-1.0, 2.0), (100.0, 300.0)]
    picked = [suggest(rows, bounds, time=4, reward=0.5, seed=seed) for seed in range(3)]
    for values in picked:
        assert -1.0 <= values[0] <= 2.0 and 100.0 <= values[1] <= 300.0, values
    assert picked[0] == suggest(rows, bounds, time=4, reward=0.5, seed=0)
    pending = [[2.0, 300.0], [-1.0, 100.0]]
    assert suggest(rows, bounds, time=4, reward=0.5, pending=pending, seed=3) == suggest(
        rows, bounds, time=4, reward=0.5, pending=pending, seed=3)
    # Nothing to learn from yet (one row per trial): no suggestion.
    assert suggest(_rows(rates, times=(1,)), bounds, time=1, reward=0.0, seed=0) is None


def test_suggestions_move_toward_the_better_values():
    tried = [0.1, 0.3, 0.5, 0.6]
    higher_better = _rows({(lr,): lr for lr in tried})
    lower_better = _rows({(lr,): 1.0 - lr for lr in tried})
    for seed in range(3):
        up = suggest(higher_better, [(0.0, 1.0)], time=3, reward=1.8, seed=seed)[0]
        down = suggest(lower_better, [(0.0, 1.0)], time=3, reward=2.7, seed=seed)[0]
        assert up > max(tried) and down < min(tried), (seed, up, down)


# -- the policy, with the fake controller of tests/test_pbt.py -----------------------------------
def _pb2(**kw):
    settings = {"time_attr": "training_iteration", "metric": "score", "mode": "max",
                "perturbation_interval": 2, "hyperparam_bounds": BOUNDS,
                "quantile_fraction": 0.25}
    settings.update(kw)
    return PB2(**settings)


def _report(pb2, controller, trial, iteration, score):
    trial.iteration = iteration
    return pb2.on_trial_result(controller, trial, {"training_iteration": iteration,
                                                   "score": score})


def test_bad_arguments_are_refused_naming_pb2_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"hyperparam_bounds=None\) must say"):
        PB2()
    with pytest.raises(ValueError, match=r"hyperparam_bounds\['opt'\]=\['sgd', 'adam'\].*"
                                         "PopulationBasedTraining"):
        PB2(hyperparam_bounds={"opt": ["sgd", "adam"]})
    with pytest.raises(ValueError, match="low > high"):
        PB2(hyperparam_bounds={"lr": [1.0, 0.1]})
    with pytest.raises(ValueError, match=r"\['net'\]\['width'\]=\[1, 2, 3\]"):
        PB2(hyperparam_bounds={"net": {"width": [1, 2, 3]}})
    with pytest.raises(ValueError, match=r"^PB2\(quantile_fraction=0.7\)"):
        PB2(hyperparam_bounds=BOUNDS, quantile_fraction=0.7)
    with pytest.raises(ValueError, match=r"^PB2\(mode='best'\)"):
        PB2(hyperparam_bounds=BOUNDS, mode="best")
    PB2(hyperparam_bounds={"lr": (0.1, 1.0), "net": {"width": [8, 64]}})  # tuples, nesting
    # A bounded key the space does not have: refused before anything is written.
    with pytest.raises(ValueError, match="explores lr, which param_space does not have"):
        ftnb.Tuner(lambda c: None, param_space={"a": 1}, tune_config=ftnb.TuneConfig(
            metric="m", mode="max", scheduler=PB2(hyperparam_bounds=BOUNDS)),
            run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="x")).fit()
    assert not (tmp_path / "x").exists()


def test_without_scikit_learn_the_error_names_the_extra(monkeypatch):
    for name in ["sklearn"] + [m for m in sys.modules if m.startswith("sklearn.")]:
        monkeypatch.setitem(sys.modules, name, None)  # (as if it were not installed)
    with pytest.raises(ImportError, match=r"pip install 'ftnb\[pb2\]'"):
        PB2(hyperparam_bounds=BOUNDS)
    with pytest.raises(ImportError, match=r"pip install 'ftnb\[pb2\]'"):
        suggest(_rows({(0.5,): 1.0}), [(0.0, 1.0)], time=3, reward=3.0)


def test_the_bottom_trial_exploits_with_the_bandits_config():
    random.seed(0)
    bounds = {"lr": [0.01, 10.0], "n": [1, 64]}
    pb2 = _pb2(quantile_fraction=0.5, hyperparam_bounds=bounds)
    checkpoint = {"dir_name": "checkpoint_000001", "iteration": 2}
    trials = [_Trial(str(i), {"lr": lr, "n": 8}, checkpoint=dict(checkpoint))
              for i, lr in enumerate([0.1, 0.2, 0.3, 1.0])]
    controller = _Controller(trials)
    for t in trials:
        pb2.on_trial_add(controller, t)
    # The score grows by lr per iteration; an exploiting trial continues from its donor's.
    score = {t.trial_id: 0.0 for t in trials}
    exploits = []
    for point in (2, 4):
        at_point = dict(score)
        for t in reversed(trials):  # (the top first: the ones after it exploit)
            score[t.trial_id] = at_point[t.trial_id] + 2 * t.config["lr"]
            assert _report(pb2, controller, t, point, score[t.trial_id]) in ("CONTINUE",
                                                                              "PAUSE")
        for trial_id, donor, config in controller.exploits:
            controller.trials[trial_id].config = config  # (the controller carries it out)
            score[trial_id] = score[donor]
            exploits.append((point, trial_id, donor, config))
        controller.exploits.clear()
    first = [e for e in exploits if e[0] == 2]
    second = [e for e in exploits if e[0] == 4]
    assert first and second, exploits
    # The first point: nothing to learn from yet, an exploiting trial takes its donor's config.
    assert all(config == pb2.history[n]["donor_config"] for n, (_, _, _, config) in
               enumerate(first))
    # The second: the bandit's configs, in bounds, n an int, beyond the best lr tried.
    for _, _, _, config in second:
        assert 0.01 <= config["lr"] <= 10.0 and isinstance(config["n"], int), config
        assert 1 <= config["n"] <= 64
    assert max(config["lr"] for *_, config in second) > 1.0, second
    assert [(h["iteration"], h["trial_id"], h["donor_id"], h["config"])
            for h in pb2.history] == exploits
    # The state is JSON and comes back whole, the bandit's data with it: one row per trial and
    # point, and one per exploit (where the exploiting trial's next interval starts).
    state = json.loads(json.dumps(pb2.get_state()))
    expected = Counter((t.trial_id, p) for t in trials for p in (2, 4))
    expected.update((trial_id, point) for point, trial_id, _, _ in exploits)
    assert Counter((r["trial"], r["time"]) for r in state["pb2"]["rows"]) == expected
    assert state["pb2"]["pending"] == [[c["lr"], c["n"]] for *_, c in second]
    again = _pb2(quantile_fraction=0.5, hyperparam_bounds=bounds)
    again.set_state(state)
    assert again.get_state() == pb2.get_state()
    # A stopped run's settings rebuild it (Tuner.restore without the scheduler).
    from ftnb.schedulers import describe_scheduler, scheduler_from_description

    rebuilt = scheduler_from_description(json.loads(json.dumps(describe_scheduler(pb2))))
    assert type(rebuilt) is PB2 and rebuilt._ftnb_settings() == pb2._ftnb_settings()
    # custom_explore_fn runs last on the bandit's config (and must be given again).
    custom = _pb2(hyperparam_bounds=bounds, custom_explore_fn=lambda c: {**c, "lr": 5.0})
    custom.set_state(state)
    assert custom._explored(trials[0], trials[3])["lr"] == 5.0
    assert custom._ftnb_settings() is None


# -- real sweeps ---------------------------------------------------------------------------------
def _explored_in_bounds(entry: dict) -> None:
    """PB2's explore rule: the donor's config as it is (the first point) or one in bounds."""
    assert BOUNDS["lr"][0] <= entry["config"]["lr"] <= BOUNDS["lr"][1], entry


def _check_bandit_data(exp, entries: list) -> None:
    """The bandit's data: each trial's row at each perturbation point once, and one row for
    each exploit, where the exploiting trial's next interval starts (donor's score, new lr)."""
    rows = _state(exp).scheduler["state"]["pb2"]["rows"]
    trials = {t.trial_id for t in _state(exp).trials}
    expected = Counter({(t, p): 1 for t in trials for p in range(2, ITERATIONS, 2)})
    expected.update((e["trial_id"], e["iteration"]) for e in entries)
    assert Counter((r["trial"], r["time"]) for r in rows) == expected
    for entry in entries:
        started = [r for r in rows if (r["trial"], r["time"]) == (
            entry["trial_id"], entry["iteration"]) and r["values"] == [entry["config"]["lr"]]]
        assert len(started) == 1 and started[0]["reward"] == pytest.approx(
            entry["donor_score"]), (entry, rows)


def test_pb2_exploits_and_explores_toward_better_configs(tmp_path):
    """Four trials on local processes (score grows by lr per iteration), synchronous (so that
    which trial exploits when does not depend on the processes' timing): at each point the
    bottom trial continues from the top one's checkpoint, from the second point on with an lr
    the bandit picked, beyond the best one tried, so the best score beats every initial
    config's."""
    random.seed(1)
    pb2 = PB2(time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.25,
              hyperparam_bounds=BOUNDS, synch=True)
    results = ftnb.Tuner(
        ftnb.with_resources(train, {"cpu": 0.25}),
        param_space={"lr": ftnb.grid_search(LRS), "sleep": 0.0},
        tune_config=ftnb.TuneConfig(metric="score", mode="max", scheduler=pb2),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="pb2", verbose=0,
                                  stop={"training_iteration": ITERATIONS}),
    ).fit()
    assert not results.errors
    entries = _check_exploits(tmp_path / "pb2", explored=_explored_in_bounds)
    assert [e["iteration"] for e in entries] == [2, 4, 6]  # (the bottom quarter of 4)
    # The first exploit learnt nothing yet (no trial had two scores with one config): the
    # donor's config as it is; the later ones, the bandit's.
    assert entries[0]["config"] == entries[0]["donor_config"]
    assert any(e["config"]["lr"] > 2 * max(LRS) for e in entries[1:]), entries
    best = results.get_best_result()
    assert best.metrics["score"] > ITERATIONS * max(LRS), best.metrics
    assert best.config["lr"] > 2 * max(LRS)  # (PBT's 1.2 and 0.8 would need 4 exploits)
    _check_bandit_data(tmp_path / "pb2", entries)


DRIVER = """
import sys, ftnb
from ftnb.core.records import StateFormatError
from ftnb.schedulers.pb2 import PB2
__TRAIN__
ftnb.run(ftnb.with_resources(train, {"cpu": 0.25}), name="pb2", storage_path=sys.argv[1],
         param_space={"lr": ftnb.grid_search(__LRS__), "sleep": 0.02},
         tune_config=ftnb.TuneConfig(
             metric="score", mode="max",
             scheduler=PB2(time_attr="training_iteration", perturbation_interval=2,
                           quantile_fraction=0.25, hyperparam_bounds=__BOUNDS__)),
         run_config=ftnb.RunConfig(verbose=0, stop={"training_iteration": __ITERATIONS__}))
print("DONE")
""".replace("__TRAIN__", TRAIN).replace("__LRS__", repr(LRS)).replace(
    "__ITERATIONS__", str(ITERATIONS)).replace("__BOUNDS__", repr(BOUNDS))


def test_pb2_survives_a_driver_sigkill_mid_sweep(tmp_path):
    """The driver is SIGKILLed once the bandit has data saved, at an exploit staged (decided,
    not yet carried out) or at the second perturbation point; restored (Tuner.restore, without
    the scheduler: rebuilt from the state), it finishes the exploits once and whole and goes
    on with the bandit's data as it was saved."""
    exp = tmp_path / "pb2"

    def bandit_data():
        try:
            rows = (_state(exp).scheduler or {}).get("state", {}).get("pb2", {}).get("rows", [])
        except StateFormatError:  # (not written yet)
            rows = []
        staged = sorted(p.name for p in exp.glob("*/pbt_exploit_*"))
        # An exploit staged (decided, not carried out) once the bandit has rows saved, or
        # the second point reached.
        return (rows and staged) or len({r["time"] for r in rows}) >= 2

    killed_at = kill_when(tmp_path, DRIVER, [str(tmp_path)], bandit_data,
                       "the bandit's rows saved and an exploit staged, or the second point")
    before = _state(exp).scheduler["state"]
    # Tuner.restore without the scheduler: the stored PB2 is rebuilt, its data with it.
    assert "DONE" in run_to_end(tmp_path, RESTORE.replace('"/pbt"', '"/pb2"'), [str(tmp_path)])
    entries = _check_exploits(exp, explored=_explored_in_bounds)
    # What the dead driver had saved stands: its exploits and the bandit's rows.
    assert entries[:len(before["history"])] == before["history"], killed_at
    after = _state(exp).scheduler["state"]["pb2"]["rows"]
    assert after[:len(before["pb2"]["rows"])] == before["pb2"]["rows"]
    _check_bandit_data(exp, entries)
    assert len(_state(exp).driver_sessions) == 2
