"""Ray Tune's search-space names run unchanged (issue 18): every domain of ``ray.tune`` with its
signature, its ``lower=``/``upper=`` keywords and its bounds, in a real ``Tuner.fit()`` and
through a restore; ``Domain.sample(config, size, random_state)``; the errors of bad arguments."""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import statistics
from typing import Any

import pytest

import ftnb
from ftnb.lifecycle.rebinding import space_differences
from ftnb.search import encode_space, generate_variants, varying_keys

# Ray's documented signatures: (name, default) of every parameter.
_NO_DEFAULT = inspect.Parameter.empty
RAY_SIGNATURES = {
    "uniform": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT)],
    "quniform": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT), ("q", _NO_DEFAULT)],
    "loguniform": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT), ("base", 10)],
    "qloguniform": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT), ("q", _NO_DEFAULT),
                    ("base", 10)],
    "randn": [("mean", 0.0), ("sd", 1.0)],
    "qrandn": [("mean", _NO_DEFAULT), ("sd", _NO_DEFAULT), ("q", _NO_DEFAULT)],
    "randint": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT)],
    "qrandint": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT), ("q", 1)],
    "lograndint": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT), ("base", 10)],
    "qlograndint": [("lower", _NO_DEFAULT), ("upper", _NO_DEFAULT), ("q", _NO_DEFAULT),
                    ("base", 10)],
}


def ray_doc_space() -> dict[str, Any]:
    """The space of Ray's "Search Space API" example, keywords and all."""
    return {
        "uniform": ftnb.uniform(-5, -1),
        "quniform": ftnb.quniform(lower=3.2, upper=5.4, q=0.2),
        "loguniform": ftnb.loguniform(lower=1e-4, upper=1e-2),
        "qloguniform": ftnb.qloguniform(1e-4, 1e-1, 5e-5),
        "randn": ftnb.randn(10, 2),
        "qrandn": ftnb.qrandn(mean=10, sd=2, q=0.2),
        "randint": ftnb.randint(lower=-9, upper=15),
        "qrandint": ftnb.qrandint(-21, 12, 3),
        "lograndint": ftnb.lograndint(lower=1, upper=10),
        "qlograndint": ftnb.qlograndint(lower=1, upper=10, q=2),
        "choice": ftnb.choice(["a", "b", "c"]),
        "grid": ftnb.grid_search([32, 64]),
    }


def on_grid(value: float, q: float) -> bool:
    return math.isclose(value / q, round(value / q), abs_tol=1e-9)


def assert_within_ray_bounds(config: dict[str, Any]) -> None:
    """Each value of :func:`ray_doc_space` is of Ray's type, in Ray's bounds, on its q grid."""
    floats = ("uniform", "quniform", "loguniform", "qloguniform", "randn", "qrandn")
    ints = ("randint", "qrandint", "lograndint", "qlograndint")
    assert all(type(config[k]) is float for k in floats), config
    assert all(type(config[k]) is int for k in ints), config
    assert -5 <= config["uniform"] <= -1
    assert 3.2 <= config["quniform"] <= 5.4 and config["quniform"] == round(config["quniform"], 1)
    assert on_grid(config["quniform"], 0.2)
    assert 1e-4 <= config["loguniform"] <= 1e-2
    assert 1e-4 <= config["qloguniform"] <= 1e-1 and on_grid(config["qloguniform"], 5e-5)
    assert on_grid(config["qrandn"], 0.2) and config["qrandn"] == round(config["qrandn"], 1)
    assert -9 <= config["randint"] < 15
    assert -21 <= config["qrandint"] <= 12 and config["qrandint"] % 3 == 0
    assert 1 <= config["lograndint"] < 10
    assert 2 <= config["qlograndint"] <= 10 and config["qlograndint"] % 2 == 0


def report_config(config: dict[str, Any]) -> None:
    ftnb.report({"score": config["uniform"]})


def fails_until_gate(config: dict[str, Any]) -> None:
    """Fails every trial until the file named by ``config["gate"]`` exists."""
    if not os.path.exists(config["gate"]):
        raise RuntimeError("interrupted before the gate opened")
    ftnb.report({"score": 1.0})


def _fit(trainable: Any, space: dict[str, Any], path: Any, name: str,
         num_samples: int = 2, seed: int | None = 0) -> ftnb.ResultGrid:
    return ftnb.Tuner(
        trainable,
        param_space=space,
        tune_config=ftnb.TuneConfig(num_samples=num_samples, seed=seed),
        run_config=ftnb.RunConfig(storage_path=str(path), name=name, verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=0)),
    ).fit()


def _configs(results: ftnb.ResultGrid) -> list[dict[str, Any]]:
    return sorted((r.config for r in results), key=lambda c: json.dumps(c, sort_keys=True))


# --------------------------------------------------------------------------- names and signatures


@pytest.mark.parametrize("name", sorted(RAY_SIGNATURES))
def test_every_ray_domain_has_rays_signature_in_ftnb_and_ftnb_search(name: str) -> None:
    func = getattr(ftnb, name)
    assert func is getattr(ftnb.search, name) and name in ftnb.__all__
    params = [(p.name, p.default) for p in inspect.signature(func).parameters.values()]
    assert params == RAY_SIGNATURES[name]
    assert func.__doc__


# --------------------------------------------------------------------------- in a real Tuner


def test_ray_doc_space_runs_in_a_tuner_reproducibly_and_survives_restores(tmp_path) -> None:
    space = ray_doc_space()
    first = _fit(report_config, space, tmp_path, "first")
    second = _fit(report_config, ray_doc_space(), tmp_path, "second")
    assert first.num_errors == 0 and len(first) == 4  # a grid of 2, twice
    for config in _configs(first):
        assert_within_ray_bounds(config)
    assert _configs(first) == _configs(second)  # the seed reproduces every draw
    assert len({c["uniform"] for c in _configs(first)}) == 4

    # The stored space is each domain's JSON, read back equal to a new encoding of the same space.
    state = json.loads((tmp_path / "first" / "experiment_state.json").read_text())
    stored = state["param_space"]
    assert stored["qlograndint"] == {"__ftnb_domain__": "qlograndint", "low": 1, "high": 10,
                                     "q": 2, "base": 10}
    assert stored["randn"] == {"__ftnb_domain__": "randn", "mean": 10, "sd": 2}
    assert space_differences(stored, encode_space(ray_doc_space(), repr)) == []

    # A finished experiment restores, with or without the space, to the same configs.
    path = first.experiment_path
    assert _configs(ftnb.Tuner.restore(path, report_config).fit()) == _configs(first)
    restored = ftnb.Tuner.restore(path, report_config, param_space=ray_doc_space()).fit()
    assert _configs(restored) == _configs(first)

    # A changed domain is a difference that restore names.
    changed = dict(ray_doc_space(), qrandint=ftnb.qrandint(-21, 12, 7))
    with pytest.raises(ftnb.RestoreError, match=r"qrandint/q: was 3, now 7"):
        ftnb.Tuner.restore(path, report_config, param_space=changed)


def test_an_interrupted_experiment_resumes_with_the_new_domains(tmp_path) -> None:
    gate = tmp_path / "gate"
    space = {"gate": str(gate), "uniform": ftnb.uniform(lower=0, upper=1),
             "w": ftnb.qlograndint(8, 1024, 8), "n": ftnb.qrandint(lower=1, upper=5),
             "lr": ftnb.qloguniform(lower=1e-4, upper=1e-2, q=1e-4)}
    first = _fit(fails_until_gate, space, tmp_path, "gated", num_samples=3, seed=7)
    assert first.num_errors == 3
    gate.touch()
    resumed = ftnb.Tuner.restore(first.experiment_path, fails_until_gate, restart_errored=True,
                                 param_space=dict(space)).fit()
    assert resumed.num_errors == 0 and _configs(resumed) == _configs(first)
    for config in _configs(resumed):
        assert 8 <= config["w"] <= 1024 and config["w"] % 8 == 0
        assert 1 <= config["n"] <= 5 and 1e-4 <= config["lr"] <= 1e-2
        assert config["lr"] == round(config["lr"], 4)


# --------------------------------------------------------------------------- bounds


def _draws(domain: Any, n: int = 3000) -> list[Any]:
    return [v["x"] for v in generate_variants({"x": domain}, num_samples=n, seed=0)]


def test_integer_bounds_as_ray_documents_them() -> None:
    assert set(_draws(ftnb.randint(1, 5))) == {1, 2, 3, 4}  # upper exclusive
    assert set(_draws(ftnb.lograndint(1, 10))) == set(range(1, 10))  # upper exclusive
    assert set(_draws(ftnb.qrandint(1, 5))) == {1, 2, 3, 4, 5}  # upper inclusive, q=1 too
    assert set(_draws(ftnb.qrandint(-21, 12, 3))) == set(range(-21, 13, 3))
    assert set(_draws(ftnb.qrandint(1, 10, 3))) == {3, 6, 9}  # the multiples within the bounds
    assert set(_draws(ftnb.qlograndint(1, 10, 1))) == set(range(1, 11))  # upper inclusive
    assert set(_draws(ftnb.qlograndint(2, 10, 2))) == {2, 4, 6, 8, 10}
    assert set(_draws(ftnb.qrandint(1, 4, 3))) == {3}  # one multiple: always it
    # qrandint draws its multiples equally often; qlograndint favours the small ones.
    counts = [_draws(ftnb.qrandint(0, 10, 5)).count(v) for v in (0, 5, 10)]
    assert all(900 < c < 1100 for c in counts), counts
    logs = _draws(ftnb.qlograndint(10, 10_000, 10))
    assert sum(v < 100 for v in logs) > sum(v >= 1000 for v in logs) * 0.8
    assert sum(v < 100 for v in logs) > 600


def test_float_bounds_and_q_grid() -> None:
    values = _draws(ftnb.quniform(-5, -1, 0.2))
    assert min(values) == -5.0 and max(values) == -1.0  # both bounds included
    assert all(v == round(v, 1) and on_grid(v, 0.2) for v in values)
    assert len(set(values)) == 21
    values = _draws(ftnb.qloguniform(1e-4, 1e-1, 5e-5))
    assert all(1e-4 <= v <= 1e-1 and on_grid(v, 5e-5) and v == round(v, 5) for v in values)
    assert sum(v < 1e-3 for v in values) > 600  # a third per decade, not uniform
    assert set(_draws(ftnb.quniform(0, 10, 1), 200)) <= {float(i) for i in range(11)}
    normal = _draws(ftnb.randn(10, 2))
    assert abs(statistics.mean(normal) - 10) < 0.2 and abs(statistics.stdev(normal) - 2) < 0.2
    assert all(on_grid(v, 0.5) and type(v) is float for v in _draws(ftnb.qrandn(0, 3, 0.5)))
    assert statistics.mean(_draws(ftnb.randn())) == pytest.approx(0, abs=0.1)


def test_seeds_reproduce_the_new_domains_and_varying_keys_name_them() -> None:
    space = ray_doc_space()
    assert generate_variants(space, 3, seed=1) == generate_variants(ray_doc_space(), 3, seed=1)
    assert generate_variants(space, 3, seed=1) != generate_variants(space, 3, seed=2)
    assert varying_keys({"model": space}) == [f"model/{k}" for k in space]


# --------------------------------------------------------------------------- Domain.sample


def test_sample_one_value_or_a_list_like_ray() -> None:
    dom = ftnb.qrandint(0, 100, 10)
    assert isinstance(dom.sample(), int)
    values = dom.sample(size=5, random_state=3)
    assert isinstance(values, list) and len(values) == 5 and all(v % 10 == 0 for v in values)
    assert dom.sample(size=5, random_state=3) == values  # an int seed
    assert dom.sample(None, 5, random.Random(3)) == values  # a random.Random, positionally
    assert dom.sample(random.Random(3)) == values[0]  # ftnb's earlier sample(rng)
    random.seed(11)  # None: Python's global random state
    first = ftnb.uniform(0, 1).sample(size=3)
    random.seed(11)
    assert ftnb.uniform(0, 1).sample(size=3) == first
    np = pytest.importorskip("numpy")
    drawn = ftnb.quniform(0, 1, 0.1).sample(size=4, random_state=np.random.default_rng(0))
    assert drawn == ftnb.quniform(0, 1, 0.1).sample(size=4, random_state=np.random.default_rng(0))
    assert all(0 <= v <= 1 for v in drawn)
    assert 0 <= ftnb.randint(0, 3).sample(random_state=np.random.RandomState(0)) < 3
    assert ftnb.choice(["x", "y"]).sample(size=3, random_state=0) in (
        [a, b, c] for a in "xy" for b in "xy" for c in "xy")


def test_sample_gives_sample_from_its_config() -> None:
    double = ftnb.sample_from(lambda spec: spec.config.lr * 2)
    assert double.sample({"lr": 0.5}) == 1.0
    assert double.sample([{"lr": 1}, {"lr": 2}], size=2) == [2, 4]
    assert ftnb.sample_from(lambda: 7).sample(size=2) == [7, 7]


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"size": 0}, ValueError, r"'size' must be >= 1; got size=0\. Fix"),
        ({"size": 2.0}, TypeError, r"'size' must be an int; got float: 2\.0\. Fix"),
        ({"random_state": "seed"}, TypeError, r"'random_state' must be .*; got str: 'seed'\. Fix"),
    ],
)
def test_sample_bad_arguments(kwargs: dict[str, Any], error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        ftnb.uniform(0, 1).sample(**kwargs)


# --------------------------------------------------------------------------- errors


def _case(factory: Any, pattern: str) -> tuple[Any, str]:
    """A constructor call that must fail, and the message it must fail with."""
    return factory, pattern


BAD_VALUES = [
    _case(lambda: ftnb.uniform(lower=1, upper=0),
          r"uniform\(\) needs lower < upper; got lower=1, upper=0\. "
          r"Fix: .*uniform\(lower=0, upper=1\)"),
    _case(lambda: ftnb.quniform(1, 1, 0.5),
          r"quniform\(\) needs lower < upper; got lower=1, upper=1"),
    _case(lambda: ftnb.quniform(0, 1, 0), r"quniform\(\) argument 'q' must be > 0; got q=0\. Fix"),
    _case(lambda: ftnb.quniform(0, 1, -0.1), r"'q' must be > 0; got q=-0\.1"),
    _case(lambda: ftnb.quniform(0.15, 1, 0.1),
          r"quniform\(\) argument 'lower' must be a multiple of q .*got lower=0\.15, q=0\.1\. "
          r"Fix: use lower=0\.1 or lower=0\.2"),
    _case(lambda: ftnb.quniform(0, 1, 0.3), r"'upper' must be a multiple of q .*upper=1, q=0\.3"),
    _case(lambda: ftnb.qloguniform(0, 1, 0.1),
          r"qloguniform\(\) argument 'lower' must be > 0; got lower=0\. Fix: .*quniform\(\)"),
    _case(lambda: ftnb.qloguniform(1e-2, 1e-3, 1e-4), r"lower=0\.01, upper=0\.001"),
    _case(lambda: ftnb.qloguniform(0.1, 1, 0.1, base=1),
          r"'base' must be > 0 and != 1; got base=1"),
    _case(lambda: ftnb.randn(0, 0), r"randn\(\) argument 'sd' must be > 0; got sd=0\. Fix"),
    _case(lambda: ftnb.qrandn(0, -1, 0.1), r"qrandn\(\) argument 'sd' must be > 0; got sd=-1"),
    _case(lambda: ftnb.qrandn(0, 1, 0), r"qrandn\(\) argument 'q' must be > 0; got q=0\. Fix"),
    _case(lambda: ftnb.randn(math.nan), r"randn\(\) argument 'mean' must be finite; got nan"),
    _case(lambda: ftnb.randint(lower=5, upper=5),
          r"randint\(\) needs lower < upper \(upper is exclusive\); got lower=5, upper=5\. Fix"),
    _case(lambda: ftnb.qrandint(10, 1, 3),
          r"qrandint\(\) needs lower < upper \(both are included\); got lower=10, upper=1"),
    _case(lambda: ftnb.qrandint(0, 10, 0),
          r"qrandint\(\) argument 'q' must be > 0; got q=0\. Fix"),
    _case(lambda: ftnb.qrandint(1, 4, 5),
          r"qrandint\(\) has no multiple of q .*lower=1, upper=4, q=5\. Fix"),
    _case(lambda: ftnb.lograndint(0, 10),
          r"lograndint\(\) argument 'lower' must be > 0; got lower=0\. "
          r"Fix: use lower=1, or randint\(\)"),
    _case(lambda: ftnb.lograndint(10, 10), r"lograndint\(\) needs lower < upper"),
    _case(lambda: ftnb.qlograndint(-1, 10, 2),
          r"qlograndint\(\) argument 'lower' must be > 0; got lower=-1\. Fix: .*qrandint\(\)"),
    _case(lambda: ftnb.qlograndint(1, 10, -2),
          r"qlograndint\(\) argument 'q' must be > 0; got q=-2"),
    _case(lambda: ftnb.qlograndint(1, 5, 8), r"qlograndint\(\) has no multiple of q"),
    _case(lambda: ftnb.uniform(0, math.inf),
          r"uniform\(\) argument 'upper' must be finite; got inf"),
]

BAD_TYPES = [
    _case(lambda: ftnb.quniform("0", 1, 0.1),
          r"quniform\(\) argument 'lower' must be a real number; got str"),
    _case(lambda: ftnb.qrandint(0, 10.0),
          r"qrandint\(\) argument 'upper' must be an int; got float: 10\.0\. Fix"),
    _case(lambda: ftnb.qrandint(0, 10, 2.5),
          r"qrandint\(\) argument 'q' must be an int; got float: 2\.5\. Fix"),
    _case(lambda: ftnb.lograndint(1.0, 10),
          r"lograndint\(\) argument 'lower' must be an int; got float"),
    _case(lambda: ftnb.qlograndint(1, 10, True), r"'q' must be an int; got bool"),
    _case(lambda: ftnb.randn("0"), r"randn\(\) argument 'mean' must be a real number; got str"),
    _case(lambda: ftnb.qrandn(0, 1, None),
          r"qrandn\(\) argument 'q' must be a real number; got NoneType"),
    _case(lambda: ftnb.randint(lower=0, upper=None),
          r"randint\(\) argument 'upper' must be an int; got NoneType"),
]


@pytest.mark.parametrize(("factory", "pattern"), BAD_VALUES)
def test_bad_values_name_the_argument_the_value_and_the_fix(factory: Any, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        factory()


@pytest.mark.parametrize(("factory", "pattern"), BAD_TYPES)
def test_bad_types_name_the_argument_the_value_and_the_fix(factory: Any, pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        factory()
