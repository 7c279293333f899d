"""Searchers over third-party optimizers (issue 31, Performance): what a suggestion costs with
ftnb's ``HyperOptSearch``, ``BayesOptSearch``, ``NevergradSearch``, ``TuneBOHB`` and
``OptunaSearch`` against Ray Tune's searchers of the same names, in one process, one run.

``searcher_overhead`` drives each searcher as a controller does, in process and without
trials: ``trials`` times ``suggest(trial_id)``, then ``on_trial_result`` and
``on_trial_complete`` with one result, the ``loss`` of a fixed function of the config (its
optimum inside the space) at ``training_iteration`` 1 with ``hyperband_info: {"budget": 1}``
(what Ray's TuneBOHB learns from, HyperBandForBOHB's budget; ftnb's, without that scheduler,
learns from the trial's end). The space is the same 3 floats for all (BayesOpt searches floats
only: ``lr`` log-uniform, ``dropout`` and ``momentum`` uniform), the searchers seeded alike,
``metric="loss", mode="min"`` given by ``set_search_properties`` as a Tuner does. ftnb's and
Ray's searcher of each kind run in the same process, so that their ratio is not the machine's
swing between runs: 3 unmeasured trials of each first (the library's first use), then a study
each in the order ftnb, Ray, Ray, ftnb, each side's figure the mean of its two. A ``None`` from ``suggest`` ("not now": BayesOpt
waiting for a duplicate's result) counts in the time and is asked again under a new trial id.

This is the searcher alone: what ftnb adds around it at each suggestion and outcome to make
the study durable (``searcher_state.json``, Optuna's journal) is ``optuna_overhead``'s figure.
Ray's ``AxSearch`` is left out: with ax-platform 1.3.1 (what ``ftnb[ax]`` installs) Ray 2.60's
wrapper fails at its set-up (``AttributeError: 'Objective' object has no attribute
'objectives'``: it reads what Ax 1.x no longer has).

Figures, per searcher ``<name>`` (hyperopt, bayesopt, nevergrad, bohb, optuna): ``<name>_ms``
(ftnb: the mean time of one trial's suggestion, result and outcome), ``<name>_ray_ms``
(Ray's, measured right after), ``<name>_vs_ray`` (ftnb / Ray: below 1 is faster). A searcher
whose library is not installed is left out; Ray's figures need ``ray[tune]``.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
import warnings
from typing import Any, Callable, Optional

__all__ = ["searcher_overhead"]

#: name: (module ftnb's and Ray's searcher live in under ``<package>.search``, class, kwargs).
SEARCHERS = {
    "hyperopt": ("hyperopt", "HyperOptSearch", {"random_state_seed": 0}),
    "bayesopt": ("bayesopt", "BayesOptSearch", {"random_state": 0, "random_search_steps": 4}),
    "nevergrad": ("nevergrad", "NevergradSearch", {}),
    "bohb": ("bohb", "TuneBOHB", {"seed": 0}),
    "optuna": ("optuna", "OptunaSearch", {"seed": 0}),
}


def _space(package: str) -> dict:
    tune = importlib.import_module("ftnb" if package == "ftnb" else "ray.tune")
    return {"lr": tune.loguniform(1e-5, 1e-1), "dropout": tune.uniform(0.0, 0.5),
            "momentum": tune.uniform(0.5, 0.99)}


def _loss(config: dict) -> float:
    return ((math.log10(config["lr"]) + 2.5) ** 2 + (config["dropout"] - 0.2) ** 2
            + (config["momentum"] - 0.9) ** 2)


def _searcher(package: str, name: str) -> Optional[Any]:
    """``package``'s searcher ``name`` (``package``: "ftnb" or "ray.tune"), None when it or its
    library does not import."""
    module, cls, kwargs = SEARCHERS[name]
    try:
        searcher_cls = getattr(importlib.import_module(f"{package}.search.{module}"), cls)
    except ImportError:
        return None
    if name == "nevergrad":
        import nevergrad as ng

        kwargs = {"optimizer": ng.optimizers.OnePlusOne}
    return searcher_cls(**kwargs)


def _per_trial_ms(package: str, name: str, trials: int) -> Optional[float]:
    """The mean ms of one trial's suggest, on_trial_result and on_trial_complete, over
    ``trials`` trials."""
    searcher = _searcher(package, name)
    if searcher is None:
        return None
    searcher.set_search_properties("loss", "min", _space(package))
    made = asked = 0
    start = time.perf_counter()
    while made < trials and asked < 20 * trials:
        trial_id = f"t{asked:05d}"
        asked += 1
        config = searcher.suggest(trial_id)
        if config is None:
            continue
        if not isinstance(config, dict):  # (FINISHED: a searcher that gave up)
            break
        made += 1
        # (hyperband_info: what Ray's TuneBOHB learns from, HyperBandForBOHB's budget; ftnb's,
        # without that scheduler, learns from the trial's end with its training_iteration.)
        result = {"loss": _loss(config), "training_iteration": 1,
                  "hyperband_info": {"budget": 1}}
        searcher.on_trial_result(trial_id, result)
        searcher.on_trial_complete(trial_id, result)
    total = time.perf_counter() - start
    return 1000 * total / max(made, 1)


def _quiet() -> Callable[[], None]:
    """Silence the libraries' and Ray's logs and warnings; returns what undoes it."""
    saved = logging.root.manager.disable
    logging.disable(logging.WARNING)
    catcher = warnings.catch_warnings()
    catcher.__enter__()
    warnings.simplefilter("ignore")

    def undo() -> None:
        catcher.__exit__(None, None, None)
        logging.disable(saved)

    return undo


def searcher_overhead(framework: str, storage_dir: str, trials: int) -> dict:
    """ftnb's searchers over HyperOpt, BayesOpt, Nevergrad, BOHB and Optuna against Ray Tune's,
    per trial (suggest + on_trial_complete), in one process.

    <name>_ms: ftnb's; <name>_ray_ms: Ray's; <name>_vs_ray: their ratio.
    """
    try:
        importlib.import_module("ray.tune")
        with_ray = True
    except ImportError:
        with_ray = False
    undo = _quiet()
    out: dict = {}
    try:
        for name in SEARCHERS:
            # Unmeasured: each library's first use (lazy imports, caches) for both sides.
            if _per_trial_ms("ftnb", name, 3) is None:
                continue
            if not with_ray or _per_trial_ms("ray.tune", name, 3) is None:
                out[f"{name}_ms"] = _per_trial_ms("ftnb", name, trials)
                continue
            # ftnb, Ray, Ray, ftnb: a drift of the machine's load weighs on both alike.
            first = _per_trial_ms("ftnb", name, trials)
            theirs = (_per_trial_ms("ray.tune", name, trials)
                      + _per_trial_ms("ray.tune", name, trials)) / 2
            ours = (first + _per_trial_ms("ftnb", name, trials)) / 2
            out.update({f"{name}_ms": ours, f"{name}_ray_ms": theirs,
                        f"{name}_vs_ray": ours / theirs})
    finally:
        undo()
    return out
