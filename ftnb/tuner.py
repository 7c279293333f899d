"""Tuner: validate, lay out the experiment directory, run the controller, return results."""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Optional

from .config import (
    CheckpointConfig,
    RunConfig,
    TuneConfig,
    callable_name,
    describe_stop,
    signature_mismatch,
)
from .result import ResultGrid
from .core.records import ExperimentState, ExperimentStatus, TrialRecord, TrialStatus, encode_value
from .storage import ExperimentPaths, Storage, default_storage_path

__all__ = ["Tuner", "run"]

_UNSET: Any = object()


def _end_quietly_if_uncaught() -> None:
    """Make an uncaught KeyboardInterrupt marked ``controller.RESUME_LINE_PRINTED`` end the script
    without a traceback: a ``sys.excepthook`` that ignores it and hands anything else to the
    hook before it. Python still exits as for any uncaught Ctrl+C (by SIGINT: status 130 in a
    shell), with ``finally`` blocks and atexit handlers run. Installed once, from the main
    thread only; inert in IPython and Jupyter, which show a cell's exceptions themselves (and
    keep the kernel alive)."""
    from .core.controller import RESUME_LINE_PRINTED

    if threading.current_thread() is not threading.main_thread():
        return  # a thread's uncaught exception goes to threading.excepthook, not this hook
    previous = sys.excepthook
    if getattr(previous, RESUME_LINE_PRINTED, False):
        return

    def excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
        if not getattr(exc, RESUME_LINE_PRINTED, False):
            previous(exc_type, exc, tb)

    setattr(excepthook, RESUME_LINE_PRINTED, True)
    sys.excepthook = excepthook


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
        from .execution.resources import TrialResources
        from .search import validate_param_space

        _check_trainable(trainable, "Tuner")
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
        # Where the caller's objects came from (e.g. {"trainable": "train", "param_space":
        # "space"} for %ftrun), stored in the state so a new kernel can find them again.
        self.origin: Optional[dict] = None
        self._restore: Optional[_RestorePlan] = None
        self._results: Optional[ResultGrid] = None

    # -- starting ------------------------------------------------------------------------------
    def fit(self) -> ResultGrid:
        """Run every trial to completion (or until ``fail_fast`` stops the experiment) and
        return their results. Trial failures do not raise: see ``ResultGrid.errors``.

        Ctrl+C stops the trials cleanly, saves the state and prints the line that resumes the
        experiment, then raises KeyboardInterrupt; in a script that lets it through, that line
        is the last thing printed (no traceback) and the exit status is Ctrl+C's (130 in a
        shell). A driver that dies any other way is resumed the same way
        (:meth:`Tuner.restore` or :func:`ftnb.run`)."""
        try:
            if self._restore is not None:
                self._results = self._fit_restored(self._restore)
            else:
                self._results = self._fit_new()
        except KeyboardInterrupt as exc:
            from .core.controller import RESUME_LINE_PRINTED

            if getattr(exc, RESUME_LINE_PRINTED, False):
                _end_quietly_if_uncaught()
            raise
        return self._results

    def get_results(self) -> ResultGrid:
        """The results of the last ``fit()``, or of the restored experiment as it stands."""
        if self._results is not None:
            return self._results
        if self._restore is not None:
            plan = self._restore
            return ResultGrid(plan.paths, plan.state, plan.result_configs)
        raise RuntimeError(
            "Tuner.get_results() has no results yet: call fit() first, or create the Tuner with "
            "Tuner.restore(path, trainable) to read an existing experiment."
        )

    def _check_new(self) -> "_NewPlan":
        """Everything a new experiment needs checked, before its directory is touched; the
        detached launcher (``ftnb.launch``) runs this in the caller to report bad input there."""
        import cloudpickle

        from .objects import bind_objects
        from .search import generate_variants
        from .storage import check_outage_settings

        rc, tc = self.run_config, self.tune_config
        executor = self._executor()
        executor.check_fits(self.resources)
        space, _ = bind_objects(self.param_space)
        variants = generate_variants(space, tc.num_samples, tc.seed)
        _check_picklable(self.trainable, "trainable", cloudpickle)
        if callable(rc.stop):
            _check_picklable(rc.stop, "RunConfig(stop=...)", cloudpickle)
        check_outage_settings()
        storage = Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)
        storage.check_writable()
        name = rc.name or _default_name(self.trainable, storage)
        paths = ExperimentPaths.of(storage, name)
        _refuse_existing(paths)
        return _NewPlan(executor, space, variants, storage, name, paths)

    def _fit_new(self) -> ResultGrid:
        from .storage.lease import Lease
        from .search import encode_space, varying_keys

        plan = self._check_new()
        paths, space = plan.paths, plan.space
        lease = Lease.acquire(paths, what="start")
        try:
            _refuse_existing(paths)  # another driver may have created it while we checked
            state = self._new_state(plan.name, plan.variants, plan.storage)
            configs = {t.trial_id: c for t, c in zip(state.trials, plan.variants)}
            state.settings["varying_keys"] = varying_keys(space)
            state.param_space = encode_space(space, encode_value)
            plan.storage.makedirs(paths.dir)
            # The state first: a driver killed while it lays out the trial folders leaves an
            # experiment that restore completes, not folders that belong to nothing.
            state.save(paths)
            hint = self._resume_line(paths, state, bool(_objects_in(state)))
            try:
                _lay_out_trials(paths, state, check=False)
            except KeyboardInterrupt as exc:  # (thousands of trials take a while)
                from .core.controller import say_interrupted

                say_interrupted(exc, state.name, hint,
                                "no trial had started (restore lays out the rest)")
                raise
            return self._run(paths, state, configs, plan.executor, lease, hint,
                             _with_originals(configs, self.param_space, space))
        finally:
            lease.release()

    def _resume_line(self, paths: ExperimentPaths, state: ExperimentState,
                     with_space: bool) -> str:
        """The line printed when this run is interrupted: ``ftnb resume NAME`` for an
        experiment the command line started, else the Python line."""
        from .ui.read_model import resume_line, tuner_restore_line

        if self.origin and self.origin.get("via") == "cli":
            return resume_line(paths, state)
        return tuner_restore_line(paths.uri, callable_name(self.trainable), with_space)

    def _executor(self) -> Any:
        """The executor trials run on: local processes, obtained by name from the registry,
        handing their output over when it is shown (``verbose >= 1``)."""
        from .execution import create_executor

        return create_executor("local", output_events=self.run_config.verbose >= 1)

    def _run(self, paths: ExperimentPaths, state: ExperimentState, configs: dict,
             executor: Any, lease: Any, hint: str, result_configs: dict,
             prepare: Optional[Callable[[Any], None]] = None) -> ResultGrid:
        """Run the controller on ``executor`` (which it shuts down when it ends); the results
        show ``result_configs`` (the caller's own objects where the trials were given refs to
        copies)."""
        from .storage.control import ControlInbox
        from .core.controller import Controller
        from .ui.terminal import TerminalReporter

        rc, tc = self.run_config, self.tune_config
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
            executor=executor,
            listeners=listeners,
            lease=lease,
            resume_hint=hint,
            control=ControlInbox(paths, epoch=lease.info.epoch),
        )
        if prepare is not None:
            prepare(controller)
        lease.start_heartbeat()
        controller.run()
        return ResultGrid(paths, state, result_configs)

    def _new_state(self, name: str, variants: list[dict], storage: Storage) -> ExperimentState:
        rc, tc = self.run_config, self.tune_config
        ckpt: CheckpointConfig = rc.checkpoint_config
        prefix = secrets.token_hex(3)[:5]
        state = ExperimentState(
            name=name,
            trainable=callable_name(self.trainable),
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
        if self.origin:
            state.settings["origin"] = self.origin
        for index, config in enumerate(variants):
            trial_id = f"{prefix}_{index:05d}"
            state.trials.append(
                TrialRecord(trial_id=trial_id, dir_name=trial_id, config=encode_value(config))
            )
        return state

    # -- restoring -----------------------------------------------------------------------------
    @classmethod
    def can_restore(cls, path: Any, storage_filesystem: Any = None) -> bool:
        """Whether ``path`` is the folder of an ftnb experiment that can be restored (a readable
        state). False, never an error, for a missing path, an empty folder, a folder of
        something else, or a state this ftnb cannot read."""
        from .core.records import StateFormatError

        try:
            paths = ExperimentPaths.at(_path_str(path), storage_filesystem)
            if not paths.has_state():
                return False
            ExperimentState.load(paths)
            return True
        except (StateFormatError, OSError, ValueError, TypeError):
            return False

    @classmethod
    def restore(
        cls,
        path: Any,
        trainable: Callable[[dict], Any],
        *,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: Optional[Mapping[str, Any]] = None,
        storage_filesystem: Any = None,
        stop: Any = _UNSET,
        takeover: bool = False,
        verbose: int = 1,
        allow_different_trainable: bool = False,
    ) -> "Tuner":
        """Resume the experiment in folder ``path`` (local or an fsspec URL); call ``.fit()``.

        Trials left RUNNING, PAUSED or PENDING continue from their latest checkpoint
        (``resume_unfinished``; with False they are marked TERMINATED as they stand). ERRORED
        trials stay ERRORED unless ``resume_errored`` (continue from their latest checkpoint) or
        ``restart_errored`` (start over from scratch); either gives them a fresh
        ``max_failures`` budget. TERMINATED trials never run again. Every trial keeps its id,
        folder, results and failure history; ``training_iteration`` continues.

        ``param_space`` must be given when the configs hold objects (models, datasets,
        ``ftnb.put`` refs), which are never stored: pass the original space with the objects
        re-created. It must have the same structure as the original (restore resumes the exact
        experiment). ``stop`` is needed when the original ``RunConfig(stop=...)`` was a
        function. ``takeover=True`` takes the experiment from a driver that still looks alive
        (its machine died less than the lease TTL ago).

        ``trainable`` must have the name of the one the experiment was started with (the state
        records it): resuming trials with other code is usually a mistake (the wrong cell, the
        wrong import). ``allow_different_trainable=True`` resumes with it anyway, for the same
        training under another name (``train_v2``, a fixed version).
        """
        from .config import FailureConfig
        from .storage.lease import refuse_if_owned
        from .storage import check_outage_settings

        check_outage_settings()
        from .execution.resources import TrialResources
        from .restore import (
            RestoreError,
            bind_configs,
            check_same_trainable,
            load_state,
            missing_objects_message,
            needed_objects,
            stored_configs,
        )

        _check_trainable(trainable, "Tuner.restore")
        for flag, value in (("resume_unfinished", resume_unfinished),
                            ("resume_errored", resume_errored),
                            ("restart_errored", restart_errored), ("takeover", takeover),
                            ("allow_different_trainable", allow_different_trainable)):
            if not isinstance(value, bool):
                raise TypeError(f"Tuner.restore({flag}={value!r}) must be True or False.")
        if resume_errored and restart_errored:
            raise ValueError(
                "Tuner.restore(resume_errored=True, restart_errored=True) asks for two things at "
                "once. Fix: resume_errored=True continues errored trials from their latest "
                "checkpoint; restart_errored=True starts them over from scratch. Pick one."
            )
        paths = ExperimentPaths.at(_path_str(path), storage_filesystem)
        state = load_state(paths)
        if not takeover:
            refuse_if_owned(paths, "restore")
        if not allow_different_trainable:
            check_same_trainable(paths, state, callable_name(trainable))
        flags = _RestoreFlags(resume_unfinished, resume_errored, restart_errored)
        to_run = {t.trial_id for t in state.trials if flags.will_run(t.status)}
        if param_space is not None:
            from .search import validate_param_space

            validate_param_space(param_space)
            configs, bound = bind_configs(state, stored_configs(state), param_space)
            result_configs = _with_originals(configs, param_space, bound)
        else:
            needed = needed_objects(stored_configs(state, to_run))
            if needed:
                raise RestoreError(missing_objects_message(paths, callable_name(trainable),
                                                           needed))
            configs = result_configs = stored_configs(state)
        settings = state.settings
        stored_stop = settings.get("stop")
        if stop is _UNSET:
            if isinstance(stored_stop, dict) and set(stored_stop) == {"function"}:
                raise RestoreError(
                    f"The experiment at {paths.uri} was stopped by the function "
                    f"{stored_stop['function']} (RunConfig(stop=...)), which is not saved with "
                    "it. Fix: pass it again: Tuner.restore(..., stop=your_stop_function)."
                )
            stop = stored_stop
        run_config = RunConfig(
            name=paths.name,
            storage_path=paths.parent_uri,
            storage_filesystem=storage_filesystem,
            failure_config=_from_settings(FailureConfig, settings.get("failure_config")),
            checkpoint_config=_from_settings(CheckpointConfig, settings.get("checkpoint_config")),
            stop=stop,
            verbose=verbose,
        )
        tuner = cls.__new__(cls)
        tuner.trainable = trainable
        tuner.param_space = dict(param_space) if param_space is not None else {}
        tuner.tune_config = _stored_tune_config(settings)
        tuner.run_config = run_config
        tuner.resources = TrialResources.from_user(settings.get("resources_per_trial"))
        tuner.listeners = []
        tuner.origin = None
        tuner._results = None
        tuner._restore = _RestorePlan(paths, state, configs, result_configs, flags, takeover,
                                      param_space is not None)
        return tuner

    def _fit_restored(self, plan: "_RestorePlan") -> ResultGrid:
        import cloudpickle

        from .storage.lease import Lease, host_id, reap_processes
        from .restore import load_state

        executor = self._executor()
        executor.check_fits(self.resources)
        _check_picklable(self.trainable, "trainable", cloudpickle)
        paths = plan.paths
        lease = Lease.acquire(paths, takeover=plan.takeover, what="restore")
        try:
            previous = lease.previous
            if previous is not None and not previous.released:
                if previous.host_id == host_id():
                    # The dead (or overridden) driver's trials on this machine: kill them
                    # before anything of ours runs, so no ghost writes after this point.
                    reap_processes(previous.token)
                else:
                    # Trials elsewhere check the lease before every write (at most every
                    # second on object stores): give them the time to see it is gone.
                    time.sleep(max(0.5, paths.storage.poll_interval_s))
            # Re-read now that we own it: the state may have moved since restore() read it.
            state = load_state(paths)
            _remove_leftover_temps(paths, state)
            state.merge_trial_records(paths)
            _lay_out_trials(paths, state, check=True)
            plan.state = state
            hint = self._resume_line(paths, state, plan.rebound)

            def prepare(controller: Any) -> None:
                _apply_restore(controller, state, plan.flags)
                state.status = ExperimentStatus.RUNNING.value
                state.settings["storage_path"] = paths.parent_uri
                if self.origin:
                    state.settings["origin"] = self.origin
                controller._save()

            return self._run(paths, state, plan.configs, executor, lease, hint, plan.result_configs,
                             prepare=prepare)
        finally:
            lease.release()

class _NewPlan:
    def __init__(self, executor: Any, space: dict, variants: list, storage: Storage, name: str,
                 paths: ExperimentPaths) -> None:
        self.executor, self.space, self.variants = executor, space, variants
        self.storage, self.name, self.paths = storage, name, paths


class _RestoreFlags:
    def __init__(self, resume_unfinished: bool, resume_errored: bool,
                 restart_errored: bool) -> None:
        self.resume_unfinished = resume_unfinished
        self.resume_errored = resume_errored
        self.restart_errored = restart_errored

    def will_run(self, status: str) -> bool:
        if status == TrialStatus.TERMINATED:
            return False
        if status == TrialStatus.ERRORED:
            return self.resume_errored or self.restart_errored
        return self.resume_unfinished


@dataclass
class _RestorePlan:
    paths: ExperimentPaths
    state: ExperimentState
    configs: dict
    result_configs: dict
    flags: _RestoreFlags
    takeover: bool
    rebound: bool


def _apply_restore(controller: Any, state: ExperimentState, flags: _RestoreFlags) -> None:
    """Bring every trial up to date with its files and set it to run (or not) as asked."""
    for trial in state.trials:
        status = trial.status
        if status == TrialStatus.TERMINATED:
            continue
        if status == TrialStatus.ERRORED:
            if flags.restart_errored:
                controller.reset_trial(trial)
            elif flags.resume_errored:
                controller.reconcile(trial)
            else:
                continue
            trial.failures_forgiven = len(trial.failures)
            trial.error = None
            trial.status = TrialStatus.PENDING.value
            continue
        controller.reconcile(trial)
        if flags.resume_unfinished:
            trial.status = TrialStatus.PENDING.value
        else:
            trial.status = TrialStatus.TERMINATED.value
            trial.note = "not resumed: restored with resume_unfinished=False"


def _lay_out_trials(paths: ExperimentPaths, state: ExperimentState, check: bool) -> None:
    """Create each trial's folder with its ``params.json`` (only the missing ones if
    ``check``: a driver may have died while laying them out)."""
    storage = paths.storage
    for trial in state.trials:
        trial_paths = paths.trial(trial.dir_name)
        if check and storage.exists(trial_paths.params):
            continue
        storage.makedirs(trial_paths.dir)
        storage.write_atomic(
            trial_paths.params, json.dumps(trial.config, indent=1, default=str) + "\n"
        )


def _remove_leftover_temps(paths: ExperimentPaths, state: ExperimentState) -> None:
    """Delete the temporary files of atomic writes that a dead driver or trial left (a driver
    killed while it laid out the experiment leaves ``.experiment_state.prev.json.<hex>.tmp``).
    Only as the owner, once the previous owner's processes are gone: only files that the owner
    and its trials write, never ``owner.json`` (a would-be owner writes it before it owns)
    nor ``control/`` (its senders')."""
    paths.remove_leftover_temps()
    for trial in state.trials:
        paths.trial(trial.dir_name).remove_leftover_temps()


def _refuse_existing(paths: ExperimentPaths) -> None:
    if not paths.has_state():
        return
    from .restore import RestoreError, load_state

    try:
        load_state(paths, what="start a new experiment at")
    except RestoreError as exc:
        if "newer than this ftnb" in str(exc):
            raise
    raise ValueError(
        f"An experiment named {paths.name!r} already exists at {paths.uri}. Running "
        "Tuner(...).fit() again would mix two experiments in one folder. Fix: resume it with "
        f"ftnb.Tuner.restore({paths.uri!r}, trainable).fit() (or use ftnb.run(...), which "
        "starts or resumes), choose another RunConfig(name=...), or delete that folder to "
        "start over."
    )


def _with_originals(configs: dict, original: Any, bound: Any) -> dict:
    """The configs with each ref that ``bind_objects`` made replaced by the caller's own object
    (what ``Result.config`` should show), pairing the original and bound spaces by position."""
    from .objects import ObjectRef
    from .search import Domain

    originals: dict[str, Any] = {}

    def pair(orig: Any, new: Any) -> None:
        if isinstance(new, ObjectRef):
            if not isinstance(orig, ObjectRef):
                originals[new.id] = orig
        elif isinstance(new, Domain) and isinstance(orig, Domain):
            pair(getattr(orig, "categories", None), getattr(new, "categories", None))
        elif isinstance(new, Mapping) and isinstance(orig, Mapping):
            for key, value in new.items():
                pair(orig.get(key), value)
        elif isinstance(new, (list, tuple)) and isinstance(orig, (list, tuple)):
            for a, b in zip(orig, new):
                pair(a, b)

    pair(original, bound)
    if not originals:
        return configs

    def swap(value: Any) -> Any:
        if isinstance(value, ObjectRef):
            return originals.get(value.id, value)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    return {trial_id: swap(config) for trial_id, config in configs.items()}


def _objects_in(state: ExperimentState) -> list:
    from .objects import walk_placeholders

    return walk_placeholders(state.param_space)



def _stored_tune_config(settings: dict) -> TuneConfig:
    """The experiment's TuneConfig as stored, not checked again: it was when the experiment
    started, and an older ftnb accepted what this one may refuse (mode without metric)."""
    config = TuneConfig.__new__(TuneConfig)
    config.__dict__.update(
        num_samples=settings.get("num_samples") or 1,
        max_concurrent_trials=settings.get("max_concurrent_trials"),
        metric=settings.get("metric"),
        mode=settings.get("mode"),
        seed=settings.get("seed"),
    )
    return config


def _from_settings(cls: type, data: Any) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in names})


def _path_str(path: Any) -> str:
    if isinstance(path, os.PathLike):
        return os.fspath(path)
    if not isinstance(path, str) or not path:
        raise TypeError(
            f"path={path!r} must be the experiment's folder: a local path or an fsspec URL "
            "such as 's3://bucket/experiments/sweep1'."
        )
    return path


def _check_trainable(trainable: Any, where: str) -> None:
    if not callable(trainable):
        raise TypeError(
            f"{where}(trainable=...) must be a function that takes a config dict; got "
            f"{type(trainable).__name__}: {_short(trainable)}. Fix: define "
            "`def train(config): ...` and pass `train` (not `train()`)."
        )
    problem = signature_mismatch(trainable, ("config",))
    if problem:
        name = callable_name(trainable)
        raise TypeError(
            f"{where}(trainable={name}) cannot be called as {name}(config), the way each trial "
            f"calls it with its config dict: {problem}. Fix: define it as "
            f"`def {name if name.isidentifier() else 'train'}(config): ...`; give it other "
            "inputs through param_space (or functools.partial)."
        )


def _default_name(trainable: Any, storage: Storage) -> str:
    base = f"{callable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    name, n = base, 1
    while storage.exists(ExperimentPaths.of(storage, name).dir):
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


def run(
    trainable: Callable[[dict], Any],
    *,
    name: str,
    param_space: Optional[Mapping[str, Any]] = None,
    storage_path: Optional[str] = None,
    tune_config: Optional[TuneConfig] = None,
    run_config: Optional[RunConfig] = None,
    resources_per_trial: Any = None,
    takeover: bool = False,
    allow_different_trainable: bool = False,
) -> ResultGrid:
    """Start the experiment ``name``, or resume it if it exists: one call to re-run as is after
    any interruption (a killed script, a restarted kernel, a preempted machine).

    A new experiment runs as ``Tuner(trainable, ...).fit()``; an existing one as
    ``Tuner.restore(path, trainable, resume_errored=True, param_space=param_space).fit()``
    (errored trials get another chance from their latest checkpoint, finished ones are kept).
    ``name`` and ``storage_path`` given here take precedence over those in ``run_config``.
    Resuming with a trainable of another name than the one the experiment started with is
    refused unless ``allow_different_trainable=True`` (see :meth:`Tuner.restore`).

    Example (a script that is simply run again until it is done)::

        results = ftnb.run(train, name=args.name, storage_path=args.storage_path,
                           param_space={"lr": ftnb.grid_search([0.1, 0.01])},
                           run_config=ftnb.RunConfig(failure_config=ftnb.FailureConfig(3)))
    """
    if name is None:
        raise ValueError("ftnb.run(name=None): ftnb.run needs the experiment's name to find it "
                         "again. Fix: pass name='my_sweep'.")
    tuner, resuming = _start_or_resume(
        trainable, name=name, param_space=param_space, storage_path=storage_path,
        tune_config=tune_config, run_config=run_config,
        resources_per_trial=resources_per_trial, takeover=takeover,
        allow_different_trainable=allow_different_trainable, caller="ftnb.run")
    if resuming and tuner.run_config.verbose:
        print(resuming, flush=True)
    return tuner.fit()


def _start_or_resume(
    trainable: Callable[[dict], Any],
    *,
    name: Optional[str],
    param_space: Optional[Mapping[str, Any]],
    storage_path: Optional[str],
    tune_config: Optional[TuneConfig],
    run_config: Optional[RunConfig],
    resources_per_trial: Any,
    takeover: bool = False,
    restart_errored: bool = False,
    allow_different_trainable: bool = False,
    caller: str,
) -> tuple[Tuner, Optional[str]]:
    """The Tuner that starts experiment ``name`` or resumes it (then also the line that says
    so); ``ftnb.run`` fits it here, ``ftnb.launch`` in a detached supervisor."""
    import dataclasses

    if name is not None and (not isinstance(name, str) or not name or "/" in name
                             or name in (".", "..")):
        raise ValueError(
            f"{caller}(name={name!r}) must be a non-empty folder name without '/'. Fix: pass "
            "name='my_sweep'; the experiment lives in <storage_path>/<name>."
        )
    if run_config is not None and not isinstance(run_config, RunConfig):
        raise TypeError(f"{caller}(run_config=...) must be an ftnb.RunConfig; got {run_config!r}.")
    rc = run_config or RunConfig()
    rc = dataclasses.replace(rc, name=name or rc.name,
                             storage_path=storage_path or rc.storage_path)
    if rc.name:
        storage = Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)
        paths = ExperimentPaths.of(storage, rc.name)
        if Tuner.can_restore(paths.uri, rc.storage_filesystem):
            state = ExperimentState.load(paths)
            counts = state.counts()
            line = (
                f"ftnb: resuming experiment {rc.name!r} at {paths.uri} "
                f"({counts.get('TERMINATED', 0)} of {len(state.trials)} trials finished, "
                f"{counts.get('ERRORED', 0)} errored)"
            )
            tuner = Tuner.restore(
                paths.uri,
                trainable,
                resume_errored=not restart_errored,
                restart_errored=restart_errored,
                param_space=param_space,
                storage_filesystem=rc.storage_filesystem,
                stop=rc.stop if rc.stop is not None else _UNSET,  # else: the stored one
                takeover=takeover,
                verbose=rc.verbose,
                allow_different_trainable=allow_different_trainable,
            )
            return tuner, line
    tuner = Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=rc,
        resources_per_trial=resources_per_trial,
    )
    return tuner, None
