"""Search algorithms (issue 18): what OptunaSearch costs per suggestion over Optuna's own
ask/tell on the same space.

``optuna_overhead`` runs ``trials`` suggestions one after another, each followed by
``results`` intermediate results and the trial's outcome (``loss`` of a fixed function of the
suggested values), on a 4-parameter space (two floats, one of them log-scaled, an int, a
categorical), TPE seeded the same way:

* ``optuna``: Optuna alone, as its docs show ask/tell: ``study.ask(distributions)``,
  ``trial.report`` per result, ``study.tell``, the study in memory (its default storage: nothing
  written, the lower bound).
* ``ftnb``: what the controller does per trial with ``TuneConfig(search_alg=OptunaSearch())``:
  ``PersistedSearcher.suggest`` and ``hold`` (Optuna's ask, its journal flushed to the
  experiment's folder, ``searcher_state.json`` written: durable before the trial is recorded),
  ``recorded``,
  ``on_result`` per result, ``on_complete`` (tell, flushed, the state written again), in an
  experiment folder under the bench's storage.

Figures: ``per_trial_ms`` (mean over the trials of one suggestion's whole cycle);
``suggest_ms`` (the suggestion alone, mean); and for ftnb ``overhead_ms``: ftnb's
``per_trial_ms`` minus Optuna's, both measured in the same process (the ftnb repetition runs
the Optuna loop too), so that the difference is not the machine's swing between repetitions.
"""

from __future__ import annotations

import math
import os
import time

__all__ = ["optuna_overhead"]


def _loss(config: dict) -> float:
    return ((math.log10(config["lr"]) + 2.5) ** 2 + (config["dropout"] - 0.2) ** 2
            + 0.1 * abs(config["layers"] - 3) + (0.0 if config["act"] == "relu" else 0.3))


def _optuna_loop(trials: int, results: int) -> tuple[float, float]:
    """(per_trial_ms, suggest_ms) of Optuna's own ask/tell, the study in memory."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {
        "lr": optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True),
        "dropout": optuna.distributions.FloatDistribution(0.0, 0.5),
        "layers": optuna.distributions.IntDistribution(1, 6),
        "act": optuna.distributions.CategoricalDistribution(["relu", "tanh", "gelu"]),
    }
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=0))
    asked = 0.0
    start = time.perf_counter()
    for _ in range(trials):
        t0 = time.perf_counter()
        trial = study.ask(space)
        asked += time.perf_counter() - t0
        loss = _loss(trial.params)
        for step in range(1, results + 1):
            trial.report(loss + 1.0 / step, step)
        study.tell(trial, loss)
    total = time.perf_counter() - start
    return 1000 * total / trials, 1000 * asked / trials


def _ftnb_loop(storage_dir: str, trials: int, results: int) -> tuple[float, float]:
    """(per_trial_ms, suggest_ms) of OptunaSearch as the controller drives it."""
    import optuna

    import ftnb
    from ftnb.core.records import TrialRecord
    from ftnb.core.searching import PersistedSearcher
    from ftnb.search.optuna import OptunaSearch
    from ftnb.storage import ExperimentPaths, Storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {"lr": ftnb.loguniform(1e-5, 1e-1), "dropout": ftnb.uniform(0.0, 0.5),
             "layers": ftnb.randint(1, 7), "act": ftnb.choice(["relu", "tanh", "gelu"])}
    paths = ExperimentPaths.of(Storage(storage_dir), "optuna_overhead")
    paths.storage.makedirs(paths.dir)
    searcher = OptunaSearch(seed=0)
    PersistedSearcher.prepare(searcher, space, metric="loss", mode="min", num_samples=trials,
                              seed=0, check_space=True)
    keeper = PersistedSearcher.start(searcher, paths, space, num_samples=trials,
                                     id_prefix="bench", seed=0)
    asked = 0.0
    start = time.perf_counter()
    for index in range(trials):
        trial_id = keeper.trial_id(index)
        t0 = time.perf_counter()
        config = keeper.suggest(trial_id)
        keeper.hold(trial_id, trial_id)
        asked += time.perf_counter() - t0
        keeper.recorded(trial_id)
        loss = _loss(config)
        row = {}
        for step in range(1, results + 1):
            row = {"loss": loss + 1.0 / step, "training_iteration": step}
            keeper.on_result(trial_id, row)
        row = {"loss": loss, "training_iteration": results}
        keeper.on_complete(TrialRecord(trial_id=trial_id, dir_name=trial_id, config=config,
                                       status="TERMINATED", last_result=row))
    total = time.perf_counter() - start
    return 1000 * total / trials, 1000 * asked / trials


def optuna_overhead(framework: str, storage_dir: str, trials: int, results: int) -> dict:
    """OptunaSearch per suggestion (its study durable in the experiment folder) against
    Optuna's own ask/tell (the study in memory) on the same space and sampler.

    per_trial_ms: one suggestion's cycle (ask, results, tell); suggest_ms: the suggestion
    alone; overhead_ms (ftnb): ftnb's per_trial_ms minus Optuna's in the same process.
    """
    if framework == "optuna":
        per_trial, suggest = _optuna_loop(trials, results)
        return {"per_trial_ms": per_trial, "suggest_ms": suggest}
    per_trial, suggest = _ftnb_loop(os.path.join(storage_dir, "exp"), trials, results)
    baseline, _ = _optuna_loop(trials, results)
    return {"per_trial_ms": per_trial, "suggest_ms": suggest,
            "overhead_ms": per_trial - baseline}
