"""HyperOptSearch, BayesOptSearch and NevergradSearch (Ray Tune's searchers at Ray's import paths):
each run end to end by a Ray-style script through ftnb.Tuner on real trial processes, inside a
ConcurrencyLimiter, with points_to_evaluate and the metric taken from TuneConfig; their state
saved and restored (the study goes on, it does not start again); and the error naming the pip
extra when the optimizer's library is missing. tests/test_searcher_wrappers_crash.py kills the
driver mid-run."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

import ftnb
from procs import run_script

pytest.importorskip("hyperopt")
pytest.importorskip("bayes_opt")
pytest.importorskip("nevergrad")

SCRIPT = """
import json, sys
import ftnb
from ftnb.search import ConcurrencyLimiter
{imports}

def objective(config):
    for step in range(3):
        ftnb.report({{"loss": (config["x"] - 0.3) ** 2 + {extra} + 0.01 * step}})

searcher = {searcher}
tuner = ftnb.Tuner(
    objective,
    param_space={space},
    tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=6,
                                search_alg=ConcurrencyLimiter(searcher, max_concurrent=2)),
    run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="wrap", verbose=0),
)
results = tuner.fit()
print("RESULTS", json.dumps({{
    "metric": searcher.metric, "mode": searcher.mode, "errors": results.num_errors,
    "trials": [{{"config": r.config, "loss": r.metrics["loss"],
                 "iterations": r.metrics["training_iteration"]}} for r in results],
    "best": results.get_best_result().config}}))
"""

CASES = {
    # HyperOpt's own space, a conditional one: the width exists only in the "mlp" branch.
    "hyperopt": dict(
        imports="from hyperopt import hp\nfrom ftnb.search.hyperopt import HyperOptSearch",
        searcher='HyperOptSearch({"x": hp.uniform("x", 0, 1), "model": hp.choice("model", ['
                 '{"kind": "mlp", "width": hp.quniform("width", 8, 64, 8)}, {"kind": "linear"}'
                 ']), "batch": 32}, points_to_evaluate=[{"x": 0.9, "model": 1}], '
                 'n_initial_points=2, random_state_seed=5)',
        space="{}", extra='(0 if config["model"]["kind"] == "mlp" else 0.5)'),
    "bayesopt": dict(
        imports="from ftnb.search.bayesopt import BayesOptSearch",
        searcher='BayesOptSearch(utility_kwargs={"kind": "ucb", "kappa": 2.5, "xi": 0.0}, '
                 'random_search_steps=2, points_to_evaluate=[{"x": 0.9, "y": 0.5}])',
        space='{"x": ftnb.uniform(0, 1), "y": ftnb.uniform(-1, 1), "batch": 32}',
        extra='config["y"] ** 2'),
    "nevergrad": dict(
        imports="import nevergrad as ng\nfrom ftnb.search.nevergrad import NevergradSearch",
        searcher='NevergradSearch(optimizer=ng.optimizers.OnePlusOne, '
                 'points_to_evaluate=[{"x": 0.9, "opt": {"name": "sgd"}}])',
        space='{"x": ftnb.uniform(0, 1), "opt": {"name": ftnb.choice(["adam", "sgd"])}, '
              '"batch": 32}',
        extra='(0 if config["opt"]["name"] == "adam" else 0.5)'),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_ray_style_script_runs_the_searcher_in_a_concurrency_limiter(tmp_path, name):
    proc = run_script(tmp_path, SCRIPT.format(**CASES[name]), str(tmp_path))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    data = json.loads(out.split("RESULTS ", 1)[1].splitlines()[0])
    # The metric and mode came from TuneConfig.
    assert (data["metric"], data["mode"], data["errors"]) == ("loss", "min", 0)
    trials = data["trials"]
    assert len(trials) == 6 and all(t["iterations"] == 3 for t in trials)
    assert all(t["config"]["batch"] == 32 for t in trials)  # constants kept
    configs = [json.dumps(t["config"], sort_keys=True) for t in trials]
    assert len(set(configs)) == 6, configs
    first = trials[0]["config"]
    assert first["x"] == pytest.approx(0.9)  # points_to_evaluate run first
    if name == "hyperopt":
        assert first["model"] == {"kind": "linear"}
        for t in trials:
            model = t["config"]["model"]
            assert model["kind"] in ("mlp", "linear")
            assert ("width" in model) == (model["kind"] == "mlp")  # the branch's keys only
    elif name == "bayesopt":
        assert first["y"] == 0.5
    else:
        assert first["opt"] == {"name": "sgd"}
    assert data["best"] == min(trials, key=lambda t: t["loss"])["config"]


# -- state: saved, restored, the study going on ------------------------------------------------
def _hyperopt(**kw):
    from ftnb.search.hyperopt import HyperOptSearch

    return HyperOptSearch(random_state_seed=3, n_initial_points=3, **kw)


def _bayesopt(**kw):
    from ftnb.search.bayesopt import BayesOptSearch

    return BayesOptSearch(random_search_steps=2, **kw)


def _nevergrad(**kw):
    import nevergrad as ng

    from ftnb.search.nevergrad import NevergradSearch

    return NevergradSearch(optimizer=ng.optimizers.OnePlusOne, **kw)


MAKERS = {"hyperopt": _hyperopt, "bayesopt": _bayesopt, "nevergrad": _nevergrad}
SPACE = {"x": ftnb.uniform(0, 1), "nested": {"y": ftnb.uniform(-1, 1)}}


def _tell(searcher, trial_id, config):
    searcher.on_trial_complete(trial_id, {"loss": (config["x"] - 0.3) ** 2
                                          + config["nested"]["y"] ** 2})


@pytest.mark.parametrize("name", [  # BayesOpt fits its Gaussian process: seconds, not unit
    pytest.param("bayesopt"), pytest.param("hyperopt", marks=pytest.mark.unit),
    pytest.param("nevergrad", marks=pytest.mark.unit)])
def test_save_and_restore_go_on_with_the_study(tmp_path, name):
    searcher = MAKERS[name]()
    searcher.set_search_properties("loss", "min", SPACE)
    first = []
    for i in range(4):
        config = searcher.suggest(f"t{i}")
        first.append(config)
        _tell(searcher, f"t{i}", config)
    live = searcher.suggest("t4")  # suggested, not finished when saved
    path = tmp_path / "searcher.json"
    searcher.save(str(path))
    json.loads(path.read_text())  # plain JSON, never a pickle

    restored = MAKERS[name]()
    restored.set_search_properties("loss", "min", SPACE)
    restored.restore(str(path))
    assert restored.suggest("t4") == live  # the live trial keeps its config
    _tell(restored, "t4", live)
    later = [restored.suggest(f"t{i}") for i in range(5, 7)]
    seen = [json.dumps(c, sort_keys=True) for c in first + [live]]
    # A study that started again would suggest its first configs again.
    assert not {json.dumps(c, sort_keys=True) for c in later} & set(seen)
    state = restored.get_state()["observations"]
    assert [t for t, _ in state["asked"]][:5] == [f"t{i}" for i in range(5)]
    assert [t for t, _, _ in state["told"]] == [f"t{i}" for i in range(5)]
    if name != "nevergrad":  # seeded: the restored study draws what the saved one would have
        searcher.on_trial_complete("t4", {"loss": (live["x"] - 0.3) ** 2
                                          + live["nested"]["y"] ** 2})
        assert [searcher.suggest(f"t{i}") for i in range(5, 7)] == later


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_metric_and_mode_come_from_tune_config_and_are_needed(name):
    searcher = MAKERS[name]()
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        searcher.set_search_properties(None, None, SPACE)
    searcher = MAKERS[name]()
    assert searcher.set_search_properties("score", "max", SPACE) is True
    assert (searcher.metric, searcher.mode) == ("score", "max")
    with pytest.raises(ValueError, match="grid_search"):
        MAKERS[name]().set_search_properties("score", "max", {"x": ftnb.grid_search([1, 2])})


@pytest.mark.unit
def test_a_searcher_with_its_own_space_refuses_the_tuners_domains(tmp_path):
    from hyperopt import hp

    def train(config):
        ftnb.report({"loss": 1})

    with pytest.raises(ValueError, match="search space of its own"):
        ftnb.Tuner(train, param_space={"x": ftnb.uniform(0, 1)},
                   tune_config=ftnb.TuneConfig(metric="loss", mode="min", search_alg=_hyperopt(
                       space={"x": hp.uniform("x", 0, 1)})),
                   run_config=ftnb.RunConfig(storage_path=str(tmp_path), verbose=0)).fit()


@pytest.mark.unit
def test_hyperopt_points_give_choices_by_value_and_missing_keys_are_named():
    from hyperopt import hp

    from ftnb.search.hyperopt import HyperOptSearch

    space = {"opt": hp.choice("opt", ["adam", "sgd"]), "lr": hp.loguniform("lr", -5, 0)}
    searcher = HyperOptSearch(space, metric="loss", mode="max",
                              points_to_evaluate=[{"opt": "sgd", "lr": 0.1}, {"opt": "adam"}])
    searcher.set_search_properties(None, None, {})
    assert searcher.suggest("a") == {"opt": "sgd", "lr": 0.1}
    with pytest.raises(ValueError, match="does not give the search space all it needs"):
        searcher.suggest("b")
    bad = HyperOptSearch(space, metric="loss", mode="max", points_to_evaluate=[{"opt": "x"}])
    bad.set_search_properties(None, None, {})
    with pytest.raises(ValueError, match=r"'x' is not one of the choice 'opt'"):
        bad.suggest("a")


@pytest.mark.unit
def test_bayesopt_takes_bounds_and_refuses_what_it_cannot_search():
    from ftnb.search.bayesopt import BayesOptSearch

    searcher = BayesOptSearch({"a": (0, 1), "b/c": (2, 3)}, metric="m", mode="max",
                              random_search_steps=0)
    searcher.set_search_properties(None, None, {})
    config = searcher.suggest("t")
    assert 0 <= config["a"] <= 1 and 2 <= config["b"]["c"] <= 3
    with pytest.raises(ValueError, match="randint"):
        BayesOptSearch().set_search_properties("m", "max", {"n": ftnb.randint(1, 4)})
    with pytest.raises(ValueError, match="utility_kwargs"):
        BayesOptSearch(utility_kwargs={"kind": "nope"})


@pytest.mark.unit
def test_nevergrad_takes_parametrizations_and_instances():
    import nevergrad as ng

    from ftnb.search.nevergrad import NevergradSearch

    instr = NevergradSearch(ng.optimizers.OnePlusOne, space=ng.p.Instrumentation(
        lr=ng.p.Log(lower=1e-4, upper=1e-1), layers=ng.p.Choice([1, 2])),
        metric="loss", mode="min", points_to_evaluate=[{"lr": 0.01, "layers": 2}])
    instr.set_search_properties(None, None, {})
    assert instr.suggest("a") == {"lr": pytest.approx(0.01), "layers": 2}
    assert set(instr.suggest("b")) == {"lr", "layers"}
    opt = ng.optimizers.OnePlusOne(parametrization=2, budget=20)
    arr = NevergradSearch(opt, space=["x", "y"], metric="loss", mode="min")
    arr.set_search_properties(None, None, {})
    config = arr.suggest("a")
    assert set(config) == {"x", "y"}
    arr.on_trial_complete("a", {"loss": 1.0})
    assert opt.num_tell == 1  # the instance given is the one used
    with pytest.raises(ValueError, match="list of parameter names"):
        NevergradSearch(opt, space={"x": ftnb.uniform(0, 1)})
    with pytest.raises(ValueError, match="names"):
        NevergradSearch(ng.optimizers.OnePlusOne(parametrization=2), space=["x"])
    with pytest.raises(ValueError, match="optimizer class"):
        NevergradSearch("OnePlusOne")


@pytest.mark.unit
@pytest.mark.parametrize("module, extra", [("hyperopt", "hyperopt"), ("bayesopt", "bayes_opt"),
                                           ("nevergrad", "nevergrad")])
def test_a_missing_library_names_the_extra_to_install(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, extra, None)  # import hyperopt -> ImportError
    monkeypatch.delitem(sys.modules, f"ftnb.search.{module}", raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'ftnb\[{module}\]'"):
        importlib.import_module(f"ftnb.search.{module}")
    with pytest.raises(ImportError, match=rf"pip install 'ftnb\[{module}\]'"):
        getattr(importlib.import_module("ftnb.search"), {
            "hyperopt": "HyperOptSearch", "bayesopt": "BayesOptSearch",
            "nevergrad": "NevergradSearch"}[module])


# -- descriptions: what a restore without search_alg rebuilds ----------------------------------
def _described():
    import nevergrad as ng
    from ftnb.search.bayesopt import BayesOptSearch
    from ftnb.search.hyperopt import HyperOptSearch
    from ftnb.search.nevergrad import NevergradSearch

    space = {"a": {"x": ftnb.uniform(0, 1)}, "c": ftnb.choice(["p", "q"]), "n": 3}
    return [
        HyperOptSearch(),
        HyperOptSearch(space, metric="loss", mode="min", points_to_evaluate=[{"a/x": 0.5}],
                       n_initial_points=3, random_state_seed=7, gamma=0.3),
        BayesOptSearch(),
        BayesOptSearch({"x": (0, 1), "y": ftnb.uniform(-1, 1)}, metric="loss", mode="max",
                       utility_kwargs={"kind": "ei", "kappa": 1.0, "xi": 0.1},
                       random_state=3, random_search_steps=2, patience=None),
        NevergradSearch(ng.optimizers.OnePlusOne, {"budget": 20}),
        NevergradSearch(ng.optimizers.CMA, space=space, metric="loss", mode="min"),
        ftnb.search.ConcurrencyLimiter(HyperOptSearch(random_state_seed=1), 2),
    ]


@pytest.mark.unit
@pytest.mark.parametrize("index", range(7))
def test_a_json_configured_searcher_is_described_and_rebuilt_as_it_was(index):
    from ftnb.core.searching import rebuild_searcher

    searcher = _described()[index]
    description = searcher.describe()
    assert description is not None
    stored = json.loads(json.dumps(description))  # (what the experiment's state holds)
    assert stored == description
    rebuilt = rebuild_searcher(stored)
    assert type(rebuilt) is type(searcher) and rebuilt.describe() == description


@pytest.mark.unit
def test_a_library_object_makes_the_searcher_given_again_and_names_no_code():
    import nevergrad as ng
    from hyperopt import hp
    from ftnb.search.bayesopt import BayesOptSearch
    from ftnb.search.hyperopt import HyperOptSearch
    from ftnb.search.nevergrad import NevergradSearch

    # An hp.* space (mixed with a domain too), an optimizer instance, a parametrization, a
    # configured optimizer of the user's, an object in the space: None (search_alg again).
    for searcher in [
            HyperOptSearch({"x": hp.uniform("x", 0, 1)}),
            HyperOptSearch({"x": hp.uniform("x", 0, 1), "y": ftnb.uniform(0, 1)}),
            HyperOptSearch({"x": ftnb.uniform(0, 1), "data": object()}),
            NevergradSearch(ng.optimizers.OnePlusOne(parametrization=ng.p.Dict(
                x=ng.p.Scalar(lower=0, upper=1)))),
            NevergradSearch(ng.optimizers.OnePlusOne, space=ng.p.Dict(x=ng.p.Scalar())),
            NevergradSearch(ng.optimizers.ParametrizedOnePlusOne(noise_handling="random")),
            BayesOptSearch(points_to_evaluate=[{"x": (0.1, 0.2)}])]:
        assert searcher.describe() is None, searcher
    # A Nevergrad optimizer is stored by its name in Nevergrad's registry, and only found there.
    from ftnb.search.nevergrad import from_description

    description = NevergradSearch(ng.optimizers.OnePlusOne).describe()
    assert description["optimizer"] == "OnePlusOne"
    with pytest.raises(ValueError, match="no optimizer named 'os.system'"):
        from_description({**description, "optimizer": "os.system"})


@pytest.mark.unit
def test_a_restore_whose_searchers_library_is_missing_names_its_extra(tmp_path, monkeypatch):
    from ftnb.lifecycle.stored import RestoreError
    from ftnb.search.hyperopt import HyperOptSearch

    def objective(config):
        ftnb.report({"loss": config["x"]})

    ftnb.Tuner(objective, param_space={"x": ftnb.uniform(0, 1)},
               tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=1,
                                           search_alg=HyperOptSearch(random_state_seed=1)),
               run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="e", verbose=0,
                                         executor="inprocess")).fit()
    monkeypatch.setitem(sys.modules, "hyperopt", None)
    monkeypatch.delitem(sys.modules, "ftnb.search.hyperopt")
    with pytest.raises(RestoreError, match=r"pip install 'ftnb\[hyperopt\]'"):
        ftnb.Tuner.restore(str(tmp_path / "e"), objective)
