"""The few things a workload needs from a framework, behind one small interface per framework.

Driver side only: :func:`import_statement`, :func:`version` and :func:`run_experiment`. The trial
side (what a trainable calls) is :func:`bench.trainables.trial_api`. Only ftnb is implemented; a
Ray Tune variant adds a branch to each of these functions (``ray.tune.Tuner``, ...) and to
``trial_api`` (``ray.train.report``, ...).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = [
    "ExperimentRun",
    "TrialInfo",
    "import_statement",
    "run_experiment",
    "version",
]


class NotImplementedForFramework(NotImplementedError):
    pass


def _unknown(framework: str) -> NotImplementedForFramework:
    return NotImplementedForFramework(f"the benchmark has no {framework!r} variant yet")


@dataclass
class TrialInfo:
    """What a workload learns about one finished trial from the driver side."""

    trial_id: str
    trial_dir: str
    status: str
    first_attempt_started: Optional[float]  # time.time() when the first attempt was started


@dataclass
class ExperimentRun:
    fit_s: float  # wall time of the framework's fit() call alone
    trials: list[TrialInfo]


def import_statement(framework: str) -> str:
    """The statement that makes the framework's Tune API usable (what `startup` times)."""
    if framework == "ftnb":
        return "import ftnb"
    raise _unknown(framework)


def version(framework: str) -> Optional[str]:
    if framework == "ftnb":
        try:
            import ftnb

            return ftnb.__version__
        except Exception:
            return None
    return None


def run_experiment(
    framework: str,
    trainable: Callable[[dict], Any],
    *,
    storage_dir: str,
    name: str,
    num_samples: int,
    max_concurrent: int,
    cpus_per_trial: float = 1,
    config: Optional[dict] = None,
) -> ExperimentRun:
    """Run ``num_samples`` trials of ``trainable`` (silent, default failure policy), check that
    every one finished, and return fit()'s wall time and what the driver knows of each trial."""
    if framework == "ftnb":
        return _run_ftnb(
            trainable, storage_dir, name, num_samples, max_concurrent, cpus_per_trial, config
        )
    raise _unknown(framework)


# ---- ftnb --------------------------------------------------------------------------------------


def _run_ftnb(
    trainable: Callable[[dict], Any],
    storage_dir: str,
    name: str,
    num_samples: int,
    max_concurrent: int,
    cpus_per_trial: float,
    config: Optional[dict],
) -> ExperimentRun:
    import ftnb

    tuner = ftnb.Tuner(
        trainable,
        param_space=dict(config or {}),
        tune_config=ftnb.TuneConfig(num_samples=num_samples, max_concurrent_trials=max_concurrent),
        run_config=ftnb.RunConfig(
            name=name,
            storage_path=storage_dir,
            failure_config=ftnb.FailureConfig(),
            verbose=0,
        ),
        resources_per_trial={"cpu": cpus_per_trial},
    )
    start = time.perf_counter()
    results = tuner.fit()
    fit_s = time.perf_counter() - start
    if results.num_errors or results.num_terminated != num_samples:
        first = results.errors[0] if results.errors else None
        raise RuntimeError(
            f"ftnb benchmark experiment {name!r}: {results.num_terminated}/{num_samples} trials "
            f"terminated, {results.num_errors} errored; first error: {first}"
        )
    # The experiment directory is the truth: read the attempts' start times from its state file.
    exp_dir = os.path.join(storage_dir, name)
    with open(os.path.join(exp_dir, "experiment_state.json")) as f:
        state = json.load(f)
    infos = []
    for trial in state["trials"]:
        attempts = trial.get("attempts") or []
        infos.append(
            TrialInfo(
                trial_id=trial["trial_id"],
                trial_dir=os.path.join(exp_dir, trial["dir_name"]),
                status=trial["status"],
                first_attempt_started=attempts[0]["started"] if attempts else None,
            )
        )
    return ExperimentRun(fit_s, infos)
