"""The few things a workload needs from a framework, behind one small interface per framework.

Driver side only: start-up (:func:`import_statement`, :func:`init`, :func:`shutdown`),
:func:`run_experiment`, :func:`can_restore` and :func:`restore_experiment`. The trial side (what
a trainable calls) is :func:`bench.trainables.trial_api`. Each function has an ftnb and a Ray Tune
branch; Ray Tune is set up as its documentation advises for a small machine: one local
instance with a CPU per core, no dashboard, no log forwarding, its session files in a private
temporary folder, and shut down before the process ends.

The rank-group workloads (data-parallel training over several ranks) use
:func:`prepare_group` and :func:`fit_group`, with three branches: ``ftnb.TorchTrainer``, Ray
Train's ``ray.train.torch.TorchTrainer`` (framework ``"ray"``), and ``torchrun`` (its elastic
agent restarting a plain script). Their rank side is :mod:`bench.group_loop`.
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
    "fit_group",
    "import_statement",
    "init",
    "prepare_group",
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


#: The distribution each framework comes in (torchrun is torch's launcher).
_DISTRIBUTION = {"ftnb": "ftnb", "ray": "ray", "torchrun": "torch", "optuna": "optuna"}


def _check(framework: str, allowed: tuple = ("ftnb", "ray", "torchrun", "optuna")) -> None:
    if framework not in allowed:
        raise ValueError(f"unknown framework {framework!r} here; expected one of {allowed}")


def import_statement(framework: str) -> str:
    """The statement that makes the framework's Tune API usable (what `startup` times)."""
    _check(framework, ("ftnb", "ray"))
    return "import ftnb" if framework == "ftnb" else "import ray.tune"


def version(framework: str) -> Optional[str]:
    """The installed version, read from the package metadata (nothing is imported)."""
    from importlib import metadata

    _check(framework)
    try:
        return metadata.version(_DISTRIBUTION[framework])
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
    if framework != "ray":
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
    if framework != "ray" or _ray_temp_dir is None:
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
    executor: Any = None,
    stop: Any = None,
) -> ExperimentRun:
    """Run ``trials`` trials of ``trainable``, a grid over ``config["i"]`` = 0..trials-1 (the
    other keys of ``config`` are constants), 1 CPU each, silently; check that every one
    finished, and return fit()'s wall time and what the driver knows of each trial.

    ``reuse_actors`` is Ray Tune's option to run the next trial in the process of the previous
    one; ftnb always starts a fresh process per attempt and has no such option. ``executor``
    is ftnb's ``RunConfig.executor`` (the Ray workloads pass a RayExecutor; Ray Tune runs on
    the Ray instance this process is connected to). ``stop`` is ``RunConfig(stop=...)``.
    """
    init(framework)
    spec = _Spec(storage_dir, name, trials, max_concurrent, config, max_failures, reuse_actors,
                 executor, stop)
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
    executor: Any = None
    stop: Any = None

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
            executor=spec.executor,
            stop=spec.stop,
        ),
        resources_per_trial={"cpu": 1},
    )


def _ftnb_trials(exp_dir: str) -> list[TrialInfo]:
    """The trials as the experiment folder records them (it is ftnb's truth), read by ftnb's
    own reader (a running driver keeps finished trials in its journal segments)."""
    from ftnb.core.records import ExperimentState
    from ftnb.storage import ExperimentPaths

    state = ExperimentState.load(ExperimentPaths.at(exp_dir))
    infos = []
    for trial in (record.to_json() for record in state.trials):
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
            stop=spec.stop,
        ),
    )


def _ray_trials(results: Any) -> list[TrialInfo]:
    return [TrialInfo(r.config["i"], r.path, "TERMINATED", None) for r in results]


# ---- rank groups (ftnb.TorchTrainer, Ray Train, torchrun) --------------------------------------

#: torchrun has no "retry forever": its --max-restarts for FailureConfig(max_failures=-1).
TORCHRUN_UNLIMITED_RESTARTS = 1000


def prepare_group(framework: str, temp_root: Optional[str] = None) -> None:
    """What a training script does before it starts the job: import the framework's trainer
    and, for Ray, start its local instance (:func:`init`). torchrun needs nothing (its launcher
    is a new process)."""
    _check(framework)
    if framework == "ftnb":
        import ftnb

        ftnb.TorchTrainer  # noqa: B018  (imported on first use: do it before the clock starts)
    elif framework == "ray":
        import ray.train.torch  # noqa: F401

        init(framework, temp_root)


def fit_group(
    framework: str,
    loop: Callable[[dict], Any],
    *,
    storage_dir: str,
    name: str,
    num_workers: int,
    max_failures: int,
    config: dict,
) -> None:
    """Run ``loop(config)`` on ``num_workers`` ranks (CPUs, gloo) until every rank returns,
    restarting the whole group from its latest checkpoint after a failure, up to
    ``max_failures`` times (-1: always), keeping the two newest checkpoints. Raises when the
    job failed. torchrun runs ``python -m <loop's module> CONFIG_JSON`` in each worker."""
    _check(framework)
    if framework == "ftnb":
        import ftnb

        ftnb.TorchTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ftnb.ScalingConfig(num_workers=num_workers),
            run_config=ftnb.RunConfig(
                name=name,
                storage_path=storage_dir,
                failure_config=ftnb.FailureConfig(max_failures=max_failures),
                checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2),
                verbose=0,
            ),
        ).fit()
    elif framework == "ray":
        import ray.train
        import ray.train.torch

        ray.train.torch.TorchTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=False),
            run_config=ray.train.RunConfig(
                name=name,
                storage_path=os.path.abspath(storage_dir),
                failure_config=ray.train.FailureConfig(max_failures=max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            ),
        ).fit()
    else:
        _torchrun(loop, storage_dir, name, num_workers, max_failures, config)


def _torchrun(loop: Callable[[dict], Any], storage_dir: str, name: str, num_workers: int,
              max_failures: int, config: dict) -> None:
    import subprocess
    import sys

    root = os.path.join(storage_dir, name)  # the script's checkpoints (and metrics)
    os.makedirs(root, exist_ok=True)
    restarts = TORCHRUN_UNLIMITED_RESTARTS if max_failures < 0 else max_failures
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={num_workers}", f"--max-restarts={restarts}",
        "-m", loop.__module__, json.dumps({**config, "checkpoint_root": root}),
    ]
    # torch 2.13's default hands every round's workers the agent's one store, where the last
    # round's gloo addresses still are: the first restart after a failure often dies in
    # connectFullMesh ("Connection refused") and costs a second restart. With this documented
    # switch, rank 0 serves a fresh store each round, and every restart works the first time.
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    code = subprocess.run(cmd, env=env).returncode
    if code != 0:
        raise RuntimeError(f"torchrun exited with {code}: {' '.join(cmd[:8])} ...")
