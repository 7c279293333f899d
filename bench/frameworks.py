"""The few things a workload needs from a framework, behind one small interface per framework.

Driver side only: start-up (:func:`import_statement`, :func:`init`, :func:`shutdown`),
:func:`run_experiment`, :func:`can_restore` and :func:`restore_experiment`. The trial side (what
a trainable calls) is :func:`bench.trainables.trial_api`. Each function has an ftnb and a Ray Tune
branch; Ray Tune is set up as its documentation advises for a small machine: one local
instance with a CPU per core, no dashboard, no log forwarding, its session files in a private
temporary folder, and shut down before the process ends.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .procs import usable_cpus

__all__ = [
    "ExperimentRun",
    "TrialInfo",
    "can_restore",
    "import_statement",
    "init",
    "restore_experiment",
    "run_experiment",
    "shutdown",
    "version",
]


@dataclass
class TrialInfo:
    """What a workload learns about one finished trial from the driver side."""

    key: int  # the trial's config["i"]
    trial_dir: str
    status: str
    first_attempt_started: Optional[float]  # time.time() of its first attempt (ftnb only)


@dataclass
class ExperimentRun:
    fit_s: float  # wall time of the framework's fit() call alone
    trials: list[TrialInfo]


def _check(framework: str) -> None:
    if framework not in ("ftnb", "ray"):
        raise ValueError(f"unknown framework {framework!r}")


def import_statement(framework: str) -> str:
    """The statement that makes the framework's Tune API usable (what `startup` times)."""
    _check(framework)
    return "import ftnb" if framework == "ftnb" else "import ray.tune"


def version(framework: str) -> Optional[str]:
    """The installed version, read from the package metadata (nothing is imported)."""
    from importlib import metadata

    _check(framework)
    try:
        return metadata.version(framework)
    except metadata.PackageNotFoundError:
        return None


# ---- start-up and shut-down ----------------------------------------------------------------------

_ray_temp_dir: Optional[str] = None


def init(framework: str, temp_root: Optional[str] = None) -> None:
    """Make the framework ready to run trials in this process: ftnb needs nothing; Ray gets a
    local instance (``ray.init``) unless it has one already, with its session files in a new
    folder under ``temp_root`` (default ``/tmp``)."""
    global _ray_temp_dir
    _check(framework)
    if framework == "ftnb":
        return
    import tempfile

    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing to phone home to here
    # Short and under /tmp: Ray puts its Unix sockets in here (a path of at most 107 bytes).
    _ray_temp_dir = tempfile.mkdtemp(prefix="rb-", dir=temp_root or "/tmp")
    ray.init(
        num_cpus=usable_cpus(),
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=_ray_temp_dir,
    )


def shutdown(framework: str) -> None:
    """Undo :func:`init`: stop Ray's local instance and delete its session files."""
    global _ray_temp_dir
    _check(framework)
    if framework == "ftnb" or _ray_temp_dir is None:
        return
    import shutil

    import ray

    ray.shutdown()
    shutil.rmtree(_ray_temp_dir, ignore_errors=True)
    _ray_temp_dir = None


# ---- experiments -------------------------------------------------------------------------------


def run_experiment(
    framework: str,
    trainable: Callable[[dict], Any],
    *,
    storage_dir: str,
    name: str,
    trials: int,
    max_concurrent: int,
    config: dict,
    max_failures: int = 0,
    reuse_actors: bool = False,
) -> ExperimentRun:
    """Run ``trials`` trials of ``trainable``, a grid over ``config["i"]`` = 0..trials-1 (the
    other keys of ``config`` are constants), 1 CPU each, silently; check that every one
    finished, and return fit()'s wall time and what the driver knows of each trial.

    ``reuse_actors`` is Ray Tune's option to run the next trial in the process of the previous
    one; ftnb always starts a fresh process per attempt and has no such option.
    """
    init(framework)
    spec = _Spec(storage_dir, name, trials, max_concurrent, config, max_failures, reuse_actors)
    if framework == "ftnb":
        if reuse_actors:
            raise ValueError("ftnb has no reuse_actors option")
        tuner = _ftnb_tuner(trainable, spec)
    else:
        tuner = _ray_tuner(trainable, spec)
    return _fit(framework, tuner, os.path.join(storage_dir, name), trials)


@dataclass
class _Spec:
    """The arguments of :func:`run_experiment` that both frameworks' Tuners are built from."""

    storage_dir: str
    name: str
    trials: int
    max_concurrent: int
    config: dict
    max_failures: int
    reuse_actors: bool

    def param_space(self, grid_search: Callable[[list], Any]) -> dict:
        return {**self.config, "i": grid_search(list(range(self.trials)))}


def can_restore(framework: str, path: str) -> bool:
    """``Tuner.can_restore(path)`` of the framework, for the experiment folder ``path``."""
    _check(framework)
    if framework == "ftnb":
        import ftnb

        return ftnb.Tuner.can_restore(path)
    import ray.tune

    return ray.tune.Tuner.can_restore(path)


def restore_experiment(
    framework: str, path: str, trainable: Callable[[dict], Any], trials: int
) -> ExperimentRun:
    """``Tuner.restore(path, trainable)`` resuming the unfinished trials, then ``fit()``; checks
    that all ``trials`` finished, as :func:`run_experiment` does."""
    init(framework)
    if framework == "ftnb":
        import ftnb

        tuner = ftnb.Tuner.restore(path, trainable, resume_unfinished=True, verbose=0)
    else:
        import ray.tune

        tuner = ray.tune.Tuner.restore(
            path, trainable=_ray_trainable(trainable), resume_unfinished=True
        )
    return _fit(framework, tuner, path, trials)


def _fit(framework: str, tuner: Any, exp_dir: str, expected: int) -> ExperimentRun:
    start = time.perf_counter()
    results = tuner.fit()
    fit_s = time.perf_counter() - start
    if results.num_errors or results.num_terminated != expected:
        first = results.errors[0] if results.errors else None
        raise RuntimeError(
            f"{framework} benchmark experiment {exp_dir}: {results.num_terminated}/{expected} "
            f"trials terminated, {results.num_errors} errored; first error: {first}"
        )
    infos = _ftnb_trials(exp_dir) if framework == "ftnb" else _ray_trials(results)
    return ExperimentRun(fit_s, infos)


# ---- ftnb --------------------------------------------------------------------------------------


def _ftnb_tuner(trainable: Callable[[dict], Any], spec: _Spec) -> Any:
    import ftnb

    return ftnb.Tuner(
        trainable,
        param_space=spec.param_space(ftnb.grid_search),
        tune_config=ftnb.TuneConfig(max_concurrent_trials=spec.max_concurrent),
        run_config=ftnb.RunConfig(
            name=spec.name,
            storage_path=spec.storage_dir,
            failure_config=ftnb.FailureConfig(max_failures=spec.max_failures),
            verbose=0,
        ),
        resources_per_trial={"cpu": 1},
    )


def _ftnb_trials(exp_dir: str) -> list[TrialInfo]:
    """The trials as the experiment folder records them (it is ftnb's truth)."""
    with open(os.path.join(exp_dir, "experiment_state.json")) as f:
        state = json.load(f)
    infos = []
    for trial in state["trials"]:
        attempts = trial.get("attempts") or []
        infos.append(
            TrialInfo(
                key=trial["config"]["i"],
                trial_dir=os.path.join(exp_dir, trial["dir_name"]),
                status=trial["status"],
                first_attempt_started=attempts[0]["started"] if attempts else None,
            )
        )
    return infos


# ---- Ray Tune ----------------------------------------------------------------------------------


def _ray_trainable(trainable: Callable[[dict], Any]) -> Any:
    import ray.tune

    return ray.tune.with_resources(trainable, {"cpu": 1})


def _ray_tuner(trainable: Callable[[dict], Any], spec: _Spec) -> Any:
    import ray.tune as tune

    from .trainables import ray_api

    api = ray_api()
    return tune.Tuner(
        _ray_trainable(trainable),
        param_space=spec.param_space(tune.grid_search),
        tune_config=tune.TuneConfig(
            max_concurrent_trials=spec.max_concurrent, reuse_actors=spec.reuse_actors
        ),
        run_config=api.RunConfig(
            name=spec.name,
            storage_path=os.path.abspath(spec.storage_dir),
            failure_config=api.FailureConfig(max_failures=spec.max_failures),
            verbose=0,
        ),
    )


def _ray_trials(results: Any) -> list[TrialInfo]:
    return [TrialInfo(r.config["i"], r.path, "TERMINATED", None) for r in results]
