"""Tuner: validate, lay out the experiment directory, run the controller, return results."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Callable, Mapping, Optional

from .config import CheckpointConfig, RunConfig, TuneConfig, describe_stop
from .result import ResultGrid
from .state import ExperimentState, TrialRecord, encode_value
from .storage import ExperimentPaths, Storage, default_storage_path

__all__ = ["Tuner"]


class Tuner:
    """Runs a function over a search space, each trial in its own process, surviving crashes.

    Args:
        trainable: a function ``train(config)`` that calls :func:`ftnb.report`. It may be
            defined in a notebook cell or in ``__main__``: it travels to the trial processes by
            value (cloudpickle).
        param_space: the search space, a dict of values, grids and domains
            (``ftnb.grid_search``, ``ftnb.uniform``, ...), nested as you like.
        tune_config: :class:`TuneConfig` (num_samples, max_concurrent_trials, metric, mode, seed).
        run_config: :class:`RunConfig` (name, storage_path, failure/checkpoint config, stop).
        resources_per_trial: ``{"cpu": n, "gpu": m}`` for each trial (default one CPU, no GPU).
            GPUs are given exclusively through ``CUDA_VISIBLE_DEVICES``; a fraction below 1 lets
            trials share one GPU.

    Example:
        >>> def train(config):  # doctest: +SKIP
        ...     for step in range(10):
        ...         ftnb.report({"loss": config["lr"] / (step + 1)})
        >>> results = ftnb.Tuner(  # doctest: +SKIP
        ...     train,
        ...     param_space={"lr": ftnb.grid_search([0.1, 0.01])},
        ...     run_config=ftnb.RunConfig(failure_config=ftnb.FailureConfig(max_failures=2)),
        ... ).fit()
    """

    def __init__(
        self,
        trainable: Callable[[dict], Any],
        *,
        param_space: Optional[Mapping[str, Any]] = None,
        tune_config: Optional[TuneConfig] = None,
        run_config: Optional[RunConfig] = None,
        resources_per_trial: Any = None,
    ) -> None:
        from .resources import TrialResources
        from .search import validate_param_space

        if not callable(trainable):
            raise TypeError(
                f"Tuner(trainable=...) must be a function that takes a config dict; got "
                f"{type(trainable).__name__}: {_short(trainable)}. Fix: define "
                "`def train(config): ...` and pass `train` (not `train()`)."
            )
        validate_param_space(param_space)
        if tune_config is not None and not isinstance(tune_config, TuneConfig):
            raise TypeError(
                f"Tuner(tune_config=...) must be an ftnb.TuneConfig; got {_short(tune_config)}."
            )
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError(
                f"Tuner(run_config=...) must be an ftnb.RunConfig; got {_short(run_config)}."
            )
        self.trainable = trainable
        self.param_space = dict(param_space) if param_space is not None else {}
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
        self.resources = TrialResources.from_user(resources_per_trial)
        self.listeners: list[Any] = []

    def fit(self) -> ResultGrid:
        """Run every trial to completion (or until ``fail_fast`` stops the experiment) and
        return their results. Trial failures do not raise: see ``ResultGrid.errors``."""
        import cloudpickle

        from .controller import Controller
        from .executors.local import LocalProcessExecutor
        from .reporting import TerminalReporter
        from .resources import ResourcePool, check_fits
        from .search import encode_space, generate_variants, varying_keys

        rc, tc = self.run_config, self.tune_config
        # Everything is checked before the experiment directory is touched.
        pool = ResourcePool.from_machine()
        check_fits(self.resources, pool)
        variants = generate_variants(self.param_space, tc.num_samples, tc.seed)
        _check_picklable(self.trainable, "trainable", cloudpickle)
        if callable(rc.stop):
            _check_picklable(rc.stop, "RunConfig(stop=...)", cloudpickle)
        storage = Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)
        storage.check_writable()
        name = rc.name or _default_name(self.trainable, storage)
        paths = ExperimentPaths.of(storage, name)
        if paths.has_state():
            raise ValueError(
                f"An experiment named {name!r} already exists at {paths.uri}. Running it again "
                "with Tuner(...).fit() would mix two experiments in one folder. Fix: choose "
                "another RunConfig(name=...), or delete that folder to start over."
            )

        state = self._new_state(name, variants, storage)
        storage.makedirs(paths.dir)
        configs = {}
        for trial, config in zip(state.trials, variants):
            configs[trial.trial_id] = config
            trial_paths = paths.trial(trial.dir_name)
            storage.makedirs(trial_paths.dir)
            storage.write_atomic(
                trial_paths.params, json.dumps(trial.config, indent=1, default=str) + "\n"
            )
        state.settings["varying_keys"] = varying_keys(self.param_space)
        state.param_space = encode_space(self.param_space, encode_value)
        state.save(paths)

        listeners = list(self.listeners)
        if rc.verbose:
            listeners.append(TerminalReporter(rc.verbose, path=paths.uri))
        controller = Controller(
            paths=paths,
            state=state,
            trainable=self.trainable,
            configs=configs,
            run_config=rc,
            max_concurrent=tc.max_concurrent_trials,
            resources=self.resources,
            pool=pool,
            executor=LocalProcessExecutor(),
            listeners=listeners,
        )
        controller.run()
        return ResultGrid(paths, state, configs)

    def _new_state(self, name: str, variants: list[dict], storage: Storage) -> ExperimentState:
        rc, tc = self.run_config, self.tune_config
        ckpt: CheckpointConfig = rc.checkpoint_config
        prefix = secrets.token_hex(3)[:5]
        state = ExperimentState(
            name=name,
            trainable=_callable_name(self.trainable),
            settings={
                "metric": tc.metric,
                "mode": tc.mode,
                "num_samples": tc.num_samples,
                "seed": tc.seed,
                "max_concurrent_trials": tc.max_concurrent_trials,
                "resources_per_trial": self.resources.as_dict(),
                "failure_config": vars(rc.failure_config).copy(),
                "checkpoint_config": vars(ckpt).copy(),
                "stop": describe_stop(rc.stop),
                "storage_path": storage.uri(storage.root),
            },
        )
        for index, config in enumerate(variants):
            trial_id = f"{prefix}_{index:05d}"
            state.trials.append(
                TrialRecord(trial_id=trial_id, dir_name=trial_id, config=encode_value(config))
            )
        return state


def _callable_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _default_name(trainable: Any, storage: Storage) -> str:
    base = f"{_callable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    name, n = base, 1
    while storage.exists(storage.join(storage.root, name)):
        n += 1
        name = f"{base}_{n}"
    return name


def _check_picklable(obj: Any, what: str, cloudpickle: Any) -> None:
    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        raise TypeError(
            f"{what}={_short(obj)} cannot be sent to a trial process: {type(exc).__name__}: "
            f"{exc}. Fix: do not capture unpicklable objects (open files, locks, live "
            "connections) in the function; create them inside it instead."
        ) from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
