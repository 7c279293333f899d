"""Trial schedulers (issue 18): ASHA over many short trials, ftnb against Ray Tune.

``asha_sweep`` runs the same sweep for both frameworks: ``trials`` trials, trial ``i`` reporting
``loss = q / iteration`` (``q`` drawn from ``i``: a fixed shuffle, the same for both) for up to
``max_t`` iterations, 1 CPU each, ``concurrent`` at once, under ASHA (``max_t``,
``grace_period``, ``reduction_factor``, one bracket) with ``metric="loss"``, ``mode="min"``.
Each framework's own ASHA stops the trials below its rungs' cutoffs, so most trials are short.

Figures: ``wall_s``, end to end (from before the framework is made ready, Ray's ``ray.init()``
included, to ``fit()`` returning: what a user's script waits); ``fit_s`` (``fit()`` alone);
``trials_per_s`` (``trials / wall_s``); ``stopped`` (trials the scheduler stopped before
``max_t``) and ``iterations`` (reports in all), which show the two ran the same kind of sweep
(their decisions differ only where concurrent trials reach a rung in another order).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from . import frameworks
from .procs import usable_cpus

__all__ = ["asha_sweep", "asha_trainable"]


def asha_trainable(config: dict) -> None:
    """``loss = q / iteration`` for up to ``max_t`` iterations, each after ``step_s``."""
    if config["framework"] == "ftnb":
        import ftnb as api
    else:
        from .trainables import ray_api

        api = ray_api()
    for iteration in range(1, config["max_t"] + 1):
        if config["step_s"]:
            time.sleep(config["step_s"])
        api.report({"loss": config["q"] / iteration})


def _qualities(trials: int) -> list[float]:
    qualities = [1.0 + i for i in range(trials)]
    random.Random(18).shuffle(qualities)
    return qualities


def asha_sweep(framework: str, storage_dir: str, trials: int, max_t: int, grace_period: int,
               reduction_factor: int, concurrent: int, step_s: float,
               reuse_actors: bool = False) -> dict:
    """ASHA over many short trials (1 CPU each), ftnb's and Ray Tune's, end to end.

    wall_s: from before the framework is made ready (ray.init() for Ray) to fit() returning;
    fit_s: fit() alone; trials_per_s: trials / wall_s; stopped: trials the scheduler stopped
    before max_t; iterations: reports in all.
    """
    concurrent = min(concurrent, usable_cpus())
    space_values = _qualities(trials)
    start = time.perf_counter()
    frameworks.init(framework)
    if framework == "ftnb":
        import ftnb
        from ftnb.schedulers import ASHAScheduler

        tuner: Any = ftnb.Tuner(
            asha_trainable,
            param_space={"framework": framework, "max_t": max_t, "step_s": step_s,
                         "q": ftnb.grid_search(space_values)},
            tune_config=ftnb.TuneConfig(
                metric="loss", mode="min", max_concurrent_trials=concurrent,
                scheduler=ASHAScheduler(max_t=max_t, grace_period=grace_period,
                                        reduction_factor=reduction_factor)),
            run_config=ftnb.RunConfig(name="asha", storage_path=storage_dir, verbose=0),
            resources_per_trial={"cpu": 1},
        )
    else:
        import ray.tune as tune
        from ray.tune.schedulers import ASHAScheduler as RayASHA

        from .trainables import ray_api

        tuner = tune.Tuner(
            tune.with_resources(asha_trainable, {"cpu": 1}),
            param_space={"framework": framework, "max_t": max_t, "step_s": step_s,
                         "q": tune.grid_search(space_values)},
            tune_config=tune.TuneConfig(
                metric="loss", mode="min", max_concurrent_trials=concurrent,
                reuse_actors=reuse_actors,
                scheduler=RayASHA(max_t=max_t, grace_period=grace_period,
                                  reduction_factor=reduction_factor)),
            run_config=ray_api().RunConfig(name="asha",
                                           storage_path=os.path.abspath(storage_dir),
                                           verbose=0),
        )
    fit_start = time.perf_counter()
    results = tuner.fit()
    end = time.perf_counter()
    if results.num_errors:
        raise RuntimeError(f"{framework} ASHA benchmark: {results.num_errors} trials errored; "
                           f"first: {results.errors[0]}")
    lengths = [len(r.metrics_dataframe) if r.metrics_dataframe is not None else 0
               for r in results]
    if len(lengths) != trials:
        raise RuntimeError(f"{framework} ASHA benchmark: {len(lengths)}/{trials} results")
    return {
        "wall_s": end - start,
        "fit_s": end - fit_start,
        "trials_per_s": trials / (end - start),
        "stopped": sum(1 for n in lengths if n < max_t),
        "iterations": sum(lengths),
    }
