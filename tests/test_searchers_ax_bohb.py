"""AxSearch, TuneBOHB and HyperBandForBOHB at Ray's import paths: Ray-style scripts run end to
end on real processes inside a ConcurrencyLimiter, their drivers SIGKILLed mid-run and restored
with Tuner.restore (every trial's iterations once, the study continued: no config suggested
again); their pure logic (HyperBandForBOHB's pause and resume decisions, the searchers' JSON
state, conversions, Ray's arguments); a missing library named with its extra; and the restore
that adopts a searcher's unlisted trials before its scheduler is brought up to date."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys

import pytest
from killed_driver import kill_when, run_to_end
from scripted import InterruptAfter, result_rows
from test_schedulers import FakeController

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths

needs_ax = pytest.mark.skipif(importlib.util.find_spec("ax") is None,
                              reason="needs ax-platform (ftnb[ax])")
needs_bohb = pytest.mark.skipif(importlib.util.find_spec("hpbandster") is None,
                                reason="needs hpbandster (ftnb[bohb])")


def _state(path) -> ExperimentState:
    return ExperimentState.load(ExperimentPaths.at(str(path)))


def _done_trials(exp, iterations) -> int:
    return sum(1 for p in exp.glob("*/result.json") if len(result_rows(str(p.parent))) >= iterations)


# -- Ray-style scripts, SIGKILLed and restored -----------------------------------------------
TRAIN = """
import json, os, sys, tempfile, time
import ftnb

def train(config):
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["step"]
    for step in range(start + 1, config["steps"] + 1):
        time.sleep(0.1)
        loss = (config["x"] - 0.3) ** 2 + 1.0 / step
        with tempfile.TemporaryDirectory() as d:
            json.dump({"step": step}, open(os.path.join(d, "state.json"), "w"))
            ftnb.report({"loss": loss, "c": config["x"] + config.get("y", 0.0)},
                        checkpoint=ftnb.Checkpoint.from_directory(d))

path = os.path.join(sys.argv[1], "exp")
"""



def _killed_then_finished(tmp_path, driver: str, condition, what: str,
                          count: int) -> ExperimentState:
    """Run ``driver``, SIGKILL it once ``condition()`` holds, run it again to its end: the
    experiment's state, finished with its ``count`` trials."""
    exp = tmp_path / "exp"
    kill_when(tmp_path, driver, [str(tmp_path)], condition, what)
    assert _state(exp).status != "FINISHED"  # (killed mid-run)
    out = run_to_end(tmp_path, driver, [str(tmp_path)])
    assert f"DONE {count}" in out, out
    state = _state(exp)
    assert state.status == "FINISHED" and len(state.trials) == count
    return state


def _driver(imports: str, tuner_arguments: str) -> str:
    """A Ray-style script: the experiment restored when it exists, else started."""
    return TRAIN + imports + f"""
if ftnb.Tuner.can_restore(path):
    tuner = ftnb.Tuner.restore(path, train)
else:
    tuner = ftnb.Tuner(train, {tuner_arguments},
                       run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="exp", verbose=0))
results = tuner.fit()
print("DONE", len(results))
"""


BOHB_DRIVER = _driver("""
from ftnb.schedulers.hb_bohb import HyperBandForBOHB
from ftnb.search import ConcurrencyLimiter
from ftnb.search.bohb import TuneBOHB
""", """param_space={"x": ftnb.uniform(0, 1), "steps": 4},
    tune_config=ftnb.TuneConfig(
        metric="loss", mode="min", num_samples=7,
        search_alg=ConcurrencyLimiter(TuneBOHB(seed=4), max_concurrent=2),
        scheduler=HyperBandForBOHB(max_t=4, reduction_factor=2))""")

@needs_bohb
def test_tune_bohb_with_hyperband_for_bohb_survives_a_driver_sigkill(tmp_path):
    exp = tmp_path / "exp"
    state = _killed_then_finished(tmp_path, BOHB_DRIVER, lambda: _done_trials(exp, 1) >= 3,
                                  "three trials at their first milestone", 7)
    assert all(t.status == "TERMINATED" and not t.failures for t in state.trials)
    last = {}
    for trial in state.trials:  # every iteration once, ending at a milestone
        iterations = [r["training_iteration"] for r in result_rows(str(exp / trial.dir_name))]
        assert iterations == list(range(1, len(iterations) + 1)), trial.trial_id
        last[trial.trial_id] = iterations[-1]
    # Brackets s=2 (4 trials from 1: 2 go on to 2, 1 to 4), then s=1 (3 trials from 2: 2 to 4).
    assert sorted(last.values()) == [1, 1, 2, 2, 4, 4, 4]
    saved = json.loads((exp / "searcher_state.json").read_text())
    bohb = saved["state"]["searcher"]
    assert saved["made"] == 7 and saved["pending"] == {} and bohb["made"] == 7
    xs = [t.config["x"] for t in state.trials]
    assert len(set(xs)) == 7  # the restore drew new configs, not its first ones again
    # BOHB learned each milestone result once: 4 + 2 + 1 in bracket 2, 3 + 2 in bracket 1.
    seen = [(o[0]["x"], o[1]) for o in bohb["observations"]]
    assert len(seen) == len(set(seen)) == 12
    assert sorted(b for _, b in seen) == [1] * 4 + [2] * 5 + [4] * 3


AX_DRIVER = _driver("""
from ftnb.search import ConcurrencyLimiter
from ftnb.search.ax import AxSearch
""", """param_space={"x": ftnb.uniform(0, 1), "y": ftnb.uniform(0, 1), "steps": 3},
    tune_config=ftnb.TuneConfig(
        metric="loss", mode="min", num_samples=5,
        search_alg=ConcurrencyLimiter(AxSearch(
            parameter_constraints=["x + y <= 1.0"], outcome_constraints=["c <= 2.0"],
            random_seed=3), max_concurrent=2))""")

@needs_ax
def test_ax_search_survives_a_driver_sigkill_and_continues_its_study(tmp_path):
    from ax.service.ax_client import AxClient

    exp = tmp_path / "exp"
    state = _killed_then_finished(tmp_path, AX_DRIVER, lambda: _done_trials(exp, 3) >= 2,
                                  "two trials done", 5)
    rows = {t.trial_id: result_rows(str(exp / t.dir_name)) for t in state.trials}
    for trial in state.trials:
        assert [r["training_iteration"] for r in rows[trial.trial_id]] == [1, 2, 3]
        assert trial.config["x"] + trial.config["y"] <= 1.0 + 1e-9  # Ax's constraint
    points = {(t.config["x"], t.config["y"]) for t in state.trials}
    assert len(points) == 5  # Sobol went on after the restore: no point drawn twice
    # Ax's own snapshot (JSON) holds exactly these trials, each completed with its last loss.
    saved = json.loads((exp / "searcher_state.json").read_text())
    client = AxClient.from_json_snapshot(saved["state"]["searcher"]["ax_snapshot"],
                                         verbose_logging=False)
    ax_trials = client.experiment.trials
    assert len(ax_trials) == 5 and all(t.status.is_completed for t in ax_trials.values())
    data = client.experiment.fetch_data().df
    losses = sorted(data[data.metric_name == "loss"]["mean"])
    assert losses == pytest.approx(sorted(r[-1]["loss"] for r in rows.values()))


# -- TuneBOHB and AxSearch: state, conversions, arguments ----------------------------------------
@pytest.mark.unit
@needs_bohb
def test_tune_bohb_state_is_json_and_a_restore_continues_its_draws():
    from ftnb.schedulers.hb_bohb import HyperBandForBOHB
    from ftnb.search.bohb import TuneBOHB

    space = {"x": ftnb.uniform(0, 1), "m": {"q": ftnb.quniform(0, 1, 0.25)},
             "c": ftnb.choice(["a", "b"]), "n": ftnb.randint(1, 4), "k": 7}
    searcher = TuneBOHB(seed=1, points_to_evaluate=[{"x": 0.5}])
    scheduler = HyperBandForBOHB(metric="loss", mode="min", max_t=4, reduction_factor=2)
    assert searcher.set_search_properties("loss", "min", space) is True
    searcher.set_scheduler(scheduler)
    view = FakeController("t0", "t1", "t2", "t3")
    trials = view.get_trials()
    configs = []
    for trial in trials:
        scheduler.on_trial_add(view, trial)
        configs.append(searcher.suggest(trial.trial_id))
    assert configs[0]["x"] == 0.5 and searcher.suggest("t0") == configs[0]
    assert all(c["m"]["q"] in (0, 0.25, 0.5, 0.75, 1.0) and 1 <= c["n"] <= 3 for c in configs)
    for trial, config in zip(trials, configs):
        for step in (1, 3):  # only the milestone (1) is an observation
            searcher.on_trial_result(trial.trial_id, {"training_iteration": step,
                                                      "loss": config["x"]})
    state = json.loads(json.dumps(searcher.get_state()))
    assert [o[1] for o in state["observations"]] == [1, 1, 1, 1]
    following = [searcher.suggest(f"n{i}") for i in range(3)]
    restored = TuneBOHB(seed=99)
    restored.set_search_properties("loss", "min", space)
    restored.set_scheduler(scheduler)
    restored.set_state(state)
    assert [restored.suggest(f"n{i}") for i in range(3)] == following
    assert all(f not in configs for f in following)
    # max_concurrent counts running trials: the ones HyperBandForBOHB paused make room.
    limited = TuneBOHB(seed=1, max_concurrent=2)
    limited.set_search_properties("loss", "min", space)
    limited.set_scheduler(scheduler)
    assert limited.suggest("t0") is not None and limited.suggest("t1") is not None
    assert limited.suggest("t2") is None
    scheduler.on_trial_result(view, trials[0], {"training_iteration": 1, "loss": 1.0})
    assert limited.suggest("t2") is not None


@pytest.mark.unit
@needs_bohb
def test_tune_bohb_takes_a_configspace_and_is_rebuilt_from_its_description():
    import ConfigSpace

    from ftnb.core.searching import rebuild_searcher, searcher_settings
    from ftnb.search import ConcurrencyLimiter
    from ftnb.search.bohb import TuneBOHB

    cs = ConfigSpace.ConfigurationSpace(seed=0)
    cs.add(ConfigSpace.UniformFloatHyperparameter("a/lr", 1e-4, 1e-1, log=True))
    searcher = ConcurrencyLimiter(TuneBOHB(space=cs, metric="acc", mode="max", seed=2), 3)
    with pytest.raises(ValueError, match="has a search space of its own"):
        from ftnb.core.searching import PersistedSearcher

        PersistedSearcher.prepare(searcher, {"b": ftnb.uniform(0, 1)}, metric=None, mode=None,
                                  num_samples=2, seed=None, check_space=True)
    config = searcher.suggest("t0")
    assert 1e-4 <= config["a"]["lr"] <= 1e-1
    description = json.loads(json.dumps(searcher_settings(searcher)["description"]))
    again = rebuild_searcher(description)
    again.set_search_properties(None, None, {})
    again.set_state(json.loads(json.dumps(searcher.get_state())))
    assert again.suggest("t0") == config and again.suggest("t1") == searcher.suggest("t1")


@pytest.mark.unit
@needs_ax
@needs_bohb
def test_tune_bohb_and_ax_refuse_what_they_cannot_search_naming_the_fix():
    from ftnb.search.ax import AxSearch
    from ftnb.search.bohb import TuneBOHB

    for cls in (TuneBOHB, AxSearch):
        with pytest.raises(ValueError, match="grid_search"):
            cls().set_search_properties("loss", "min", {"x": ftnb.grid_search([1, 2])})
        with pytest.raises(ValueError, match="randn"):
            cls().set_search_properties("loss", "min", {"x": ftnb.randn(0, 1)})
        with pytest.raises(ValueError, match="needs a metric and a mode"):
            cls().set_search_properties(None, None, {"x": ftnb.uniform(0, 1)})
        with pytest.raises(TypeError, match="points_to_evaluate"):
            cls(points_to_evaluate={"x": 1})
    with pytest.raises(ValueError, match="max_concurrent"):
        TuneBOHB(max_concurrent=-1)
    with pytest.raises(TypeError, match="parameter_constraints"):
        AxSearch(parameter_constraints="x <= 1")


@pytest.mark.unit
@needs_ax
def test_ax_search_state_is_its_json_snapshot_and_a_restore_continues_the_study():
    from ax.service.ax_client import AxClient, ObjectiveProperties

    from ftnb.core.searching import rebuild_searcher, searcher_settings
    from ftnb.search.ax import AxSearch

    search = AxSearch(random_seed=0, outcome_constraints=["c <= 1.0"])
    space = {"x": ftnb.uniform(0, 1), "n": {"k": ftnb.randint(1, 5)}, "fixed": 3}
    assert search.set_search_properties("loss", "min", space) is True
    first = search.suggest("t0")
    assert search.suggest("t0") == first and set(first) == {"x", "n"}
    search.on_trial_complete("t0", {"loss": 0.5, "c": 0.3})
    search.suggest("t1")
    search.on_trial_complete("t1", {"loss": float("nan"), "c": 0.3})  # abandoned
    search.suggest("t2")
    search.on_trial_complete("t2", None, error=True)  # failed
    state = json.loads(json.dumps(search.get_state()))
    following = search.suggest("t3")
    again = rebuild_searcher(json.loads(json.dumps(searcher_settings(search)["description"])))
    again.set_search_properties("loss", "min", space)
    again.set_state(state)
    assert again.suggest("t3") == following
    statuses = [t.status.name for t in again.ax_client.experiment.trials.values()]
    assert statuses == ["COMPLETED", "ABANDONED", "FAILED", "RUNNING"]
    # An ax_client of the user's, its experiment made already: metric and mode come from it.
    client = AxClient(verbose_logging=False, random_seed=1)
    client.create_experiment(parameters=[{"name": "lr", "type": "range", "bounds": [0.0, 1.0]}],
                             objectives={"acc": ObjectiveProperties(minimize=False)})
    own = AxSearch(ax_client=client, points_to_evaluate=[{"lr": 0.25}])
    assert own.set_search_properties("loss", "min", {}) is False
    assert (own.metric, own.mode) == ("acc", "max") and own.suggest("t0") == {"lr": 0.25}
    assert own.describe() is None  # (an object: given again at a restore)


@pytest.mark.unit
@pytest.mark.parametrize("module, extra, hidden", [
    ("ftnb.search.ax", "ftnb[ax]", "ax"),
    ("ftnb.search.bohb", "ftnb[bohb]", "hpbandster"),
])
def test_a_missing_library_names_the_extra_to_install(monkeypatch, module, extra, hidden):
    for name in list(sys.modules):
        if name == hidden or name.startswith(hidden + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, hidden, None)  # (import hidden: ImportError)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install '{extra}'".replace("[", r"\[")):
        importlib.import_module(module)
    monkeypatch.delitem(sys.modules, module, raising=False)


# -- the core fix: adopted trials are known to the scheduler before it restores ----------------
_FED: list = []


class _Recording(ftnb.schedulers.FIFOScheduler):
    def on_trial_add(self, tune_controller, trial):
        _FED.append(("add", trial.trial_id))

    def on_trial_result(self, tune_controller, trial, result):
        _FED.append((trial.trial_id, result["training_iteration"]))
        return "CONTINUE"


class _Seeded(ftnb.search.Searcher):
    def suggest(self, trial_id):
        return {"x": int(trial_id.rsplit("_", 1)[1])}


def _three_steps(config):
    for _ in range(3):
        ftnb.report({"loss": config["x"]})


@pytest.mark.unit
def test_a_restore_adopts_the_searchers_unlisted_trials_before_the_scheduler_restores(
        tmp_path, monkeypatch):
    from ftnb.core.controller import Controller

    def run_config():
        return ftnb.RunConfig(storage_path=str(tmp_path), name="adopt", verbose=0,
                              executor="inprocess")

    tuner = ftnb.Tuner(_three_steps, tune_config=ftnb.TuneConfig(
        metric="loss", mode="min", num_samples=3, max_concurrent_trials=1,
        search_alg=_Seeded(), scheduler=_Recording()), run_config=run_config())
    tuner.listeners.append(InterruptAfter(2))
    monkeypatch.setattr(Controller, "save", lambda self, final=False, durable=True: None)
    with pytest.raises(KeyboardInterrupt):
        tuner.fit()  # (no state saved: the trials are only in the searcher's file)
    monkeypatch.undo()
    assert _state(tmp_path / "adopt").trials == []
    _FED.clear()
    results = ftnb.Tuner.restore(str(tmp_path / "adopt"), _three_steps, search_alg=_Seeded(),
                                 scheduler=_Recording(), verbose=0).fit()
    assert len(results) == 3 and results.status == "FINISHED"
    ids = sorted(t.trial_id for t in _state(tmp_path / "adopt").trials)
    # The restored scheduler met every trial once, and was fed each stored row once (the
    # adopted trials' rows replayed before any new one).
    assert sorted(e[1] for e in _FED if e[0] == "add") == ids
    for trial_id in ids:
        assert [e[1] for e in _FED if e[0] == trial_id] == [1, 2, 3], trial_id
