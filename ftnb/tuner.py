"""Tuner: the object that runs an experiment (``fit()``), new or restored, and ``ftnb.run``.

What each step does lives in its own module: checking and laying out a new experiment in
:mod:`ftnb.new_experiment`, restoring one (planning and carrying it out) in :mod:`ftnb.restore`,
starting or resuming by name in :mod:`ftnb.start_or_resume`, the loop that runs the trials in
:mod:`ftnb.core.controller`. The Tuner puts them together: the executor, the owner lease, the
listeners and the line that resumes an interrupted run.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from .config import RunConfig, TuneConfig, callable_name
from .core.records import ExperimentState, ExperimentStatus
from .result import ResultGrid
from .storage import ExperimentPaths

if TYPE_CHECKING:
    from .new_experiment import NewExperimentPlan
    from .restore import RestorePlan

__all__ = ["Tuner", "check_new_experiment", "run"]

#: ``Tuner.restore(stop=...)`` not given: the experiment's own stop criterion.
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
        from .input_checks import check_instance, check_trainable
        from .trainable_class import as_function_trainable
        from .search import validate_param_space

        check_trainable(trainable, "Tuner")
        group = _GroupSettings.of(trainable, resources_per_trial, "Tuner")
        if group.trainer is not None:
            param_space = group.trainer.param_space(param_space)
            run_config = run_config or group.trainer.run_config
            trainable = group.trainer.worker_loop()
        validate_param_space(param_space)
        check_instance(tune_config, TuneConfig, "Tuner(tune_config=...)")
        check_instance(run_config, RunConfig, "Tuner(run_config=...)")
        self.param_space = dict(param_space) if param_space is not None else {}
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
        _warn_if_endless(self.tune_config, self.run_config)
        self.trainable = as_function_trainable(trainable, self.run_config.checkpoint_config,
                                               self.run_config.stop)
        self.resources = group.resources or TrialResources.from_user(
            _resources_per_trial(trainable, resources_per_trial))
        #: Ranks per trial (a TorchTrainer's ScalingConfig), and their hang limit.
        self.num_workers = group.num_workers
        self.collective_timeout_s = group.collective_timeout_s
        #: A TorchTrainer's code, written to ``trainer.pkl`` (see ExperimentPaths.trainer).
        self.trainer_pickle = group.pickle
        self.trainer_settings = group.settings
        self.listeners: list[Any] = []
        # Where the caller's objects came from (e.g. {"trainable": "train", "param_space":
        # "space"} for %ftrun), stored in the state so a new kernel can find them again.
        self.origin: Optional[dict] = None
        #: The restore that ``fit()`` carries out (:meth:`Tuner.restore`); None for a new
        #: experiment.
        self.restore_plan: Optional[RestorePlan] = None
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
            if self.restore_plan is not None:
                self._results = self._fit_restored(self.restore_plan)
            else:
                self._results = self._fit_new()
        except KeyboardInterrupt as exc:
            from .core.controller import RESUME_LINE_PRINTED

            if getattr(exc, RESUME_LINE_PRINTED, False):
                _end_quietly_if_uncaught()
            raise
        if self.run_config.failure_config.fail_fast == "raise" and self._results.errors:
            raise _as_raised(self._results.errors[0])
        return self._results

    def get_results(self) -> ResultGrid:
        """The results of the last ``fit()``, or of the restored experiment as it stands."""
        if self._results is not None:
            return self._results
        if self.restore_plan is not None:
            plan = self.restore_plan
            return ResultGrid(plan.paths, plan.state, plan.result_configs)
        raise RuntimeError(
            "Tuner.get_results() has no results yet: call fit() first, or create the Tuner with "
            "Tuner.restore(path, trainable) to read an existing experiment."
        )

    def _fit_new(self) -> ResultGrid:
        from .core.controller import say_interrupted
        from .core.trial_files import lay_out_trial_folders
        from .new_experiment import initial_state, refuse_existing
        from .objects import walk_placeholders
        from .restore import with_originals
        from .storage.lease import Lease

        plan = check_new_experiment(self)
        paths, space = plan.paths, plan.space
        lease = Lease.acquire(paths, what="start")
        try:
            # Another driver may have created it while we checked (the lease is ours now).
            refuse_existing(paths, check_owner=False)
            state = initial_state(self, plan)
            _name_trials(state, self.tune_config, plan.variants, callable_name(self.trainable))
            if plan.max_concurrent:  # a BasicVariantGenerator's own limit
                self.tune_config = _with_max_concurrent(self.tune_config, plan.max_concurrent)
            configs = {t.trial_id: c for t, c in zip(state.trials, plan.variants)}
            plan.storage.makedirs(paths.dir)
            # The state first: a driver killed while it lays out the trial folders leaves an
            # experiment that restore completes, not folders that belong to nothing.
            state.save(paths)
            hint = self._resume_line(paths, state, bool(walk_placeholders(state.param_space)))
            try:
                lay_out_trial_folders(paths, state, only_missing=False)
            except KeyboardInterrupt as exc:  # (thousands of trials take a while)
                say_interrupted(exc, state.name, hint,
                                "no trial had started (restore lays out the rest)")
                raise
            search = None
            if plan.searcher is not None:
                from .core.searching import PersistedSearcher

                search = PersistedSearcher.start(
                    plan.searcher, paths, space, num_samples=self.tune_config.num_samples,
                    id_prefix=state.settings["trial_id_prefix"], seed=self.tune_config.seed,
                    guard=lease.check)
            return self._run(paths, state, configs, plan.executor, lease, hint,
                             with_originals(configs, self.param_space, space), search=search)
        finally:
            lease.release()

    def group_settings(self) -> dict:
        """What the state records of the trials' size: resources per rank, ranks, hang limit."""
        settings = {"resources_per_trial": self.resources.as_dict(),
                    "num_workers": self.num_workers,
                    "collective_timeout_s": self.collective_timeout_s}
        if self.trainer_settings:
            settings["trainer"] = self.trainer_settings
        parameters = getattr(self.trainable, "_ftnb_parameters", None)
        if parameters:
            settings["with_parameters"] = parameters
        return settings

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
        from .execution import executor_for

        return executor_for(self.run_config.executor, output_events=self.run_config.verbose >= 1)

    def _run(self, paths: ExperimentPaths, state: ExperimentState, configs: dict,
             executor: Any, lease: Any, hint: str, result_configs: dict,
             prepare: Optional[Callable[[Any], None]] = None,
             search: Any = None) -> ResultGrid:
        """Run the controller on ``executor`` (which it shuts down when it ends); the results
        show ``result_configs`` (the caller's own objects where the trials were given refs to
        copies)."""
        import dataclasses

        from .core.controller import Controller
        from .parameters import trial_resources_of
        from .stopper import DriverStopping, split_stop
        from .storage.control import ControlInbox
        from .ui.terminal import TerminalReporter

        rc, tc = self.run_config, self.tune_config
        listeners = list(self.listeners)
        if rc.verbose:
            listeners.append(TerminalReporter(rc.verbose, path=paths.uri))
        if rc.callbacks:
            from .callback import CallbackListener

            listeners.append(CallbackListener(rc.callbacks, paths, rc.stop))
        in_trial_stop, driver_stopper = split_stop(rc.stop, tc.time_budget_s)
        stopping = None
        if driver_stopper is not None:
            stopping = DriverStopping(driver_stopper, paths)
            listeners.append(stopping)
            rc = dataclasses.replace(rc, stop=in_trial_stop)
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
            num_workers=self.num_workers,
            collective_timeout_s=self.collective_timeout_s,
            search=search,
            scheduler=tc.scheduler,
        )
        if search is not None:
            controller.trial_setup = _TrialSetup(state, tc, self.trainable)
        if stopping is not None:
            stopping.controller = controller
        _, controller.trial_resources = trial_resources_of(self.trainable, configs)
        for request in set(controller.trial_resources.values()):
            executor.check_fits(request, self.num_workers)
        if self.trainer_pickle is not None:
            paths.storage.write_atomic(paths.trainer, self.trainer_pickle)
        if prepare is not None:
            prepare(controller)
        lease.start_heartbeat()
        controller.run()
        return ResultGrid(paths, state, result_configs)

    # -- restoring -----------------------------------------------------------------------------
    @classmethod
    def can_restore(cls, path: Any, storage_filesystem: Any = None) -> bool:
        """Whether ``path`` is the folder of an ftnb experiment that can be restored (a readable
        state). False, never an error, for a missing path, an empty folder, a folder of
        something else, or a state this ftnb cannot read."""
        from .restore import can_restore

        return can_restore(path, storage_filesystem)

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
        search_alg: Any = None,
        scheduler: Any = None,
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

        An experiment run with a ``TuneConfig(search_alg=...)`` goes on searching where it was:
        ftnb's searchers are built again from the state (OptunaSearch's study is in the
        experiment's folder); ``search_alg`` must be given again when the searcher holds code or
        objects (a define-by-run function, a sampler, your own Searcher class), configured as
        it was.

        An experiment run with a ``TuneConfig(scheduler=...)`` goes on with it as it was (its
        rungs, brackets and decisions from the state): ftnb's schedulers are built again from
        the state; ``scheduler`` must be given again for a scheduler class of your own, and a
        different scheduler than the one it ran with is refused (docs/schedulers.md).
        """
        from .execution.resources import TrialResources
        from .restore import plan_restore, restored_scheduler

        group = _GroupSettings.of(trainable, None, "Tuner.restore")
        if group.trainer is None and param_space is not None:
            param_space = _as_stored_trainer_space(path, storage_filesystem, param_space)
        if group.trainer is not None:
            # Its space (with its datasets) must match the stored one; its scaling is the one
            # the run goes on with (fewer workers after a GPU was lost, say).
            param_space = group.trainer.param_space(param_space)
            trainable = group.trainer.worker_loop()
        # Passed on only when given: plan_restore keeps the stored stop criterion otherwise.
        given_stop = {} if stop is _UNSET else {"stop": stop}
        plan = plan_restore(
            path, trainable, resume_unfinished=resume_unfinished, resume_errored=resume_errored,
            restart_errored=restart_errored, param_space=param_space,
            storage_filesystem=storage_filesystem, takeover=takeover, verbose=verbose,
            allow_different_trainable=allow_different_trainable, search_alg=search_alg,
            **given_stop)
        plan.tune_config.scheduler = restored_scheduler(plan.paths, plan.state, scheduler)
        stored_trainer = plan.state.settings.get("trainer")
        keep_file = group.pickle  # trainer.pkl is rewritten only from a trainer the user gave
        if group.trainer is None and stored_trainer:
            # A TorchTrainer's run resumed with its loop alone (ftnb resume, %ftresume,
            # ftnb.run): each rank runs it in the group the run was started with.
            from .train.torch_trainer import trainer_from_settings

            group = _GroupSettings(trainer_from_settings(trainable, plan.state.settings))
            trainable = group.trainer.worker_loop()
        from .trainable_class import as_function_trainable

        tuner = cls.__new__(cls)
        tuner.trainable = as_function_trainable(
            trainable, plan.run_config.checkpoint_config, plan.run_config.stop)
        tuner.param_space = dict(param_space) if param_space is not None else {}
        tuner.tune_config = plan.tune_config
        tuner.run_config = plan.run_config
        given = _resources_per_trial(trainable, None)
        tuner.resources = group.resources or (
            TrialResources.from_user(given) if given is not None else plan.resources)
        stored = plan.state.settings.get("with_parameters")
        if stored and stored != getattr(trainable, "_ftnb_parameters", None):
            from .restore import RestoreError

            names = ", ".join(f"{n}=..." for n in stored)
            raise RestoreError(
                f"The experiment at {plan.paths.uri} was run with ftnb.with_parameters("
                f"{callable_name(trainable)}, {names}), whose objects are not saved with it. "
                f"Fix: pass them again: Tuner.restore(path, ftnb.with_parameters("
                f"{callable_name(trainable)}, {names}))."
            )
        tuner.num_workers = group.num_workers if group.trainer else plan.num_workers
        tuner.collective_timeout_s = (group.collective_timeout_s if group.trainer
                                      else plan.collective_timeout_s)
        tuner.trainer_pickle = keep_file
        tuner.trainer_settings = group.settings or stored_trainer
        tuner.listeners = []
        tuner.origin = None
        tuner._results = None
        tuner.restore_plan = plan
        return tuner

    def _fit_restored(self, plan: RestorePlan) -> ResultGrid:
        from .core.controller import Controller
        from .input_checks import check_picklable
        from .restore import resume_trials, take_over
        from .storage.lease import Lease

        executor = self._executor()
        executor.check_fits(self.resources, self.num_workers)
        check_storage = getattr(executor, "check_storage", None)
        if check_storage is not None:
            check_storage(plan.paths.storage)
        check_picklable(self.trainable, "trainable")
        paths = plan.paths
        lease = Lease.acquire(paths, takeover=plan.takeover, what="restore")
        try:
            state = take_over(plan, lease)
            hint = self._resume_line(paths, state, plan.rebound)

            def prepare(controller: Controller) -> None:
                resume_trials(state, plan.flags, controller.trial_files)
                state.status = ExperimentStatus.RUNNING.value
                state.settings["storage_path"] = paths.parent_uri
                state.settings.update(self.group_settings())
                if self.origin:
                    state.settings["origin"] = self.origin
                controller.save()

            search = None
            if plan.searcher is not None:
                from .core.searching import PersistedSearcher

                search = PersistedSearcher.resume(
                    plan.searcher, paths, plan.search_space,
                    num_samples=self.tune_config.num_samples,
                    id_prefix=state.settings.get("trial_id_prefix") or "t",
                    seed=self.tune_config.seed, guard=lease.check)
            return self._run(paths, state, plan.configs, executor, lease, hint, plan.result_configs,
                             prepare=prepare, search=search)
        finally:
            lease.release()


@dataclass(frozen=True)
class TrialInfo:
    """What ``TuneConfig(trial_name_creator=..., trial_dirname_creator=...)`` are given about a
    trial, as Ray Tune gives its ``Trial``: its id, config, trainable's name and experiment tag
    (its index and varying values, ``"0_lr=0.01"``)."""

    trial_id: str
    config: dict
    trainable_name: str
    experiment_tag: str

    def __str__(self) -> str:
        return self.trial_id


def _name_trials(state: ExperimentState, tune_config: TuneConfig, variants: list,
                 trainable_name: str) -> None:
    """Apply the trial name and folder name creators to the new trials of ``state``; a bad name
    is refused here, before the experiment's folder is written."""
    if tune_config.trial_name_creator is None and tune_config.trial_dirname_creator is None:
        return
    keys = state.settings.get("varying_keys") or []
    seen: dict[str, str] = {}
    for index, (trial, config) in enumerate(zip(state.trials, variants)):
        _name_trial(trial, config, index, tune_config, keys, trainable_name, seen)


def _name_trial(trial: Any, config: dict, index: int, tune_config: TuneConfig, keys: list,
                trainable_name: str, seen: dict) -> None:
    """Apply the name creators to the trial number ``index`` (``seen``: the folder names taken,
    to the trial that has each)."""
    name_of, dirname_of = tune_config.trial_name_creator, tune_config.trial_dirname_creator
    values = ",".join(f"{k}={_config_value(config, k)}" for k in keys)
    info = TrialInfo(trial.trial_id, config, trainable_name,
                     f"{index}_{values}" if values else str(index))
    if name_of is not None:
        trial.name = _created(name_of, info, "trial_name_creator")
    if dirname_of is not None:
        dir_name = _created(dirname_of, info, "trial_dirname_creator")
        if "/" in dir_name or "\\" in dir_name or dir_name in (".", "..") or (
                dir_name.startswith(".") or dir_name.startswith("experiment_state")):
            raise ValueError(
                f"TuneConfig(trial_dirname_creator=...) returned {dir_name!r} for trial "
                f"{trial.trial_id}: it must be a plain folder name, not hidden. Fix: return "
                "a name such as f\"trial_{trial.trial_id}\".")
        if dir_name in seen:
            raise ValueError(
                f"TuneConfig(trial_dirname_creator=...) returned {dir_name!r} for both trial "
                f"{seen[dir_name]} and trial {trial.trial_id}: each trial needs its own "
                "folder. Fix: include trial.trial_id in the name.")
        seen[dir_name] = trial.trial_id
        trial.dir_name = dir_name


class _TrialSetup:
    """What the Tuner fills in of a trial its searcher made (the controller's ``trial_setup``):
    its name and folder name (``TuneConfig``'s creators) and its resources when
    ``ftnb.with_resources`` was given a function of the config."""

    def __init__(self, state: ExperimentState, tune_config: TuneConfig, trainable: Any) -> None:
        self.state = state
        self.tune_config = tune_config
        self.trainable = trainable
        self.trainable_name = callable_name(trainable)

    def __call__(self, trial: Any, config: dict) -> Any:
        tc = self.tune_config
        if tc.trial_name_creator is not None or tc.trial_dirname_creator is not None:
            seen = {t.dir_name: t.trial_id for t in self.state.trials}
            _name_trial(trial, config, len(self.state.trials), tc,
                        self.state.settings.get("varying_keys") or [], self.trainable_name, seen)
        if callable(getattr(self.trainable, "_ftnb_resources", None)):
            from .parameters import trial_resources_of

            _, by_trial = trial_resources_of(self.trainable, {trial.trial_id: config})
            return by_trial.get(trial.trial_id)
        return None


def _warn_if_endless(tune_config: TuneConfig, run_config: RunConfig) -> None:
    """``num_samples=-1`` with nothing that ends the experiment: Ray Tune accepts it (it runs
    until stopped), so does ftnb, with a warning that says how to bound it."""
    if tune_config.num_samples != -1 or tune_config.time_budget_s is not None:
        return
    from .stopper import Stopper

    if isinstance(run_config.stop, Stopper):
        return
    import warnings

    warnings.warn(
        "TuneConfig(num_samples=-1) without time_budget_s or a Stopper makes trials until the "
        "experiment is stopped (Ctrl+C, `ftnb stop`, a stop request). Fix: give "
        "TuneConfig(time_budget_s=...) or RunConfig(stop=ftnb.stopper....) to bound it.",
        UserWarning, stacklevel=3)


def _with_max_concurrent(tune_config: TuneConfig, limit: int) -> TuneConfig:
    import dataclasses

    current = tune_config.max_concurrent_trials
    return dataclasses.replace(tune_config, max_concurrent_trials=min(limit, current or limit))


def _config_value(config: Any, dotted: str) -> Any:
    value = config
    for part in str(dotted).split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _created(creator: Any, info: TrialInfo, argument: str) -> str:
    try:
        value = creator(info)
    except Exception as exc:
        raise ValueError(f"TuneConfig({argument}={callable_name(creator)}) failed for trial "
                         f"{info.trial_id}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"TuneConfig({argument}={callable_name(creator)}) must return a non-empty"
                        f" str; got {value!r} for trial {info.trial_id}.")
    return value


def _as_raised(error: Exception) -> Exception:
    """A trial's :class:`~ftnb.result.TrialError`, for ``FailureConfig(fail_fast="raise")``: also
    an instance of the trial's exception class when that is a built-in one (``ValueError``), so
    that a Ray Tune user's ``except ValueError`` catches it; the error itself otherwise."""
    import builtins

    cls = getattr(builtins, getattr(error, "type", None) or "", None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or isinstance(error, cls):
        return error
    try:
        raised_cls = type(f"TrialError[{cls.__name__}]", (type(error), cls), {})
        raised = raised_cls.__new__(raised_cls)
        raised.__dict__.update(error.__dict__)
        raised.args = error.args
        return raised
    except TypeError:  # a layout conflict (OSError's): the error as it is
        return error


def _resources_per_trial(trainable: Any, resources_per_trial: Any) -> Any:
    """``resources_per_trial``, or the dict ``ftnb.with_resources`` gave ``trainable``."""
    fixed = getattr(trainable, "_ftnb_resources", None)
    if fixed is None or callable(fixed):
        return resources_per_trial
    if resources_per_trial is not None:
        raise ValueError(
            f"Tuner(resources_per_trial={resources_per_trial!r}) and ftnb.with_resources("
            f"..., {fixed!r}) both say what a trial gets. Fix: keep one of them."
        )
    return fixed


class _GroupSettings:
    """How big each trial is: one worker, or a TorchTrainer's group (its ScalingConfig)."""

    def __init__(self, trainer: Any = None) -> None:
        from .config import DEFAULT_COLLECTIVE_TIMEOUT_S

        self.trainer = trainer
        self.resources: Any = None
        self.num_workers = 1
        self.collective_timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S
        self.pickle: Optional[bytes] = None
        #: What the state records of the trainer (settings["trainer"]), None for a function.
        self.settings: Optional[dict] = None
        if trainer is not None:
            from .train.torch_trainer import trainer_pickle

            # The fork server preloads what the driver has imported: every rank of every
            # restart then starts with torch in memory instead of importing it (seconds each).
            import torch.distributed  # noqa: F401

            scaling = trainer.scaling_config
            self.settings = {"kind": type(trainer).__name__, "use_gpu": scaling.use_gpu,
                             "backend": trainer.torch_config.backend}
            self.resources = scaling.worker_resources()
            self.num_workers = scaling.num_workers
            self.collective_timeout_s = (trainer.torch_config.timeout_s
                                         or scaling.collective_timeout_s)
            self.pickle = trainer_pickle(trainer)

    @classmethod
    def of(cls, trainable: Any, resources_per_trial: Any, where: str) -> "_GroupSettings":
        if not getattr(trainable, "_ftnb_trainer", False):
            return cls()
        if resources_per_trial is not None:
            raise ValueError(
                f"{where}(TorchTrainer, resources_per_trial={resources_per_trial!r}): a trainer's "
                "ScalingConfig says what each of its ranks gets. Fix: leave resources_per_trial "
                "out and use ScalingConfig(num_workers=..., resources_per_worker=...)."
            )
        return cls(trainable)


def _as_stored_trainer_space(path: Any, filesystem: Any, space: Mapping[str, Any]) -> Any:
    """``space`` given with a plain function to resume a TorchTrainer's experiment (its state's
    ``settings["trainer"]``): the trainer's space around it, as the run was started."""
    from .restore import _path_str
    from .train.torch_trainer import group_space

    try:
        paths = ExperimentPaths.at(_path_str(path), filesystem)
        settings = ExperimentState.load(paths).settings
    except Exception:  # plan_restore says what is wrong with the path
        return space
    return group_space(space) if settings.get("trainer") else space


def check_new_experiment(tuner: Tuner) -> NewExperimentPlan:
    """Everything the new experiment that ``tuner`` would start needs checked, before its
    directory is touched (its name chosen when the run config gives none); ``ftnb.launch`` and
    ``ftnb run`` call this in the caller to report bad input there."""
    from .new_experiment import plan_new_experiment

    return plan_new_experiment(tuner, tuner._executor())


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
    from .start_or_resume import start_or_resume

    tuner, resuming = start_or_resume(
        trainable, name=name, param_space=param_space, storage_path=storage_path,
        tune_config=tune_config, run_config=run_config,
        resources_per_trial=resources_per_trial, takeover=takeover,
        allow_different_trainable=allow_different_trainable, caller="ftnb.run")
    if resuming and tuner.run_config.verbose:
        print(resuming, flush=True)
    return tuner.fit()
