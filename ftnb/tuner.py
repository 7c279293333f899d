"""Tuner: the object that runs an experiment (``fit()``), new or restored, and ``ftnb.run``.

A front door: what each step does lives in :mod:`ftnb.lifecycle` (planning a new experiment
or a restore, owning it, reconciling its trials, running the controller, starting or resuming
by name), the loop that runs the trials in :mod:`ftnb.core.controller`. The Tuner holds what
the user gave (checked), picks the executor and hands itself to the lifecycle, which never
imports it.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from .config import RunConfig, TuneConfig, callable_name
from .core.records import ExperimentState
from .input_checks import keywords_after
from .result import ResultGrid
from .storage import ExperimentPaths

if TYPE_CHECKING:
    from .lifecycle.plan_new import NewExperimentPlan
    from .lifecycle.plan_restore import RestorePlan

__all__ = ["Tuner", "check_new_experiment", "run", "start_or_resume"]

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

    @keywords_after("Tuner", "param_space")
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
        group = _GroupSettings.of(trainable, resources_per_trial, "Tuner", param_space)
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
        #: An elastic group's {"max_workers", "resize_interval_s"} (num_workers is its min).
        self.elastic = group.elastic
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
        #: For a new experiment started by name (``ftnb.run``, ``ftnb run``...): the run that
        #: resumes it, should ``fit()`` find it stored meanwhile (another driver of the same
        #: name finished it after this one looked). Set by
        #: :func:`~ftnb.lifecycle.start_or_resume.start_or_resume`; None: refused, as always.
        self.when_stored: Optional[Callable[[], "Tuner"]] = None
        #: The call that starts or resumes this run by its name (``"ftnb.run"``), set by
        #: start_or_resume: run again, it resumes (what an interrupted script is told). None
        #: for a plain Tuner, whose fit() refuses an unfinished experiment and sets a finished
        #: one aside (:mod:`ftnb.lifecycle.earlier_runs`).
        self.resumes_by_name: Optional[str] = None
        self._results: Optional[ResultGrid] = None

    # -- starting ------------------------------------------------------------------------------
    def fit(self) -> ResultGrid:
        """Run every trial to completion (or until ``fail_fast`` stops the experiment) and
        return their results. Trial failures do not raise: see ``ResultGrid.errors``.

        Ctrl+C stops the trials cleanly, saves the state and prints the line that resumes the
        experiment, then raises KeyboardInterrupt; in a script that lets it through, that line
        is the last thing printed (no traceback) and the exit status is Ctrl+C's (130 in a
        shell). A driver that dies any other way is resumed the same way
        (:meth:`Tuner.restore` or :func:`ftnb.run`).

        Under the ``RunConfig(name, storage_path)`` of a finished experiment it starts a new
        run, as Ray's does, and keeps the earlier one whole at ``<name>-<when it started>``
        beside it (a printed line says where); an unfinished one is refused (resume it)."""
        from .trainable_class import show_results_to

        show_results_to(self.trainable, self.run_config.callbacks)
        try:
            if self.restore_plan is not None:
                from .lifecycle.run import run_restored

                self._results = run_restored(self, self.restore_plan, self._executor())
            else:
                from .lifecycle.plan_new import ExperimentExistsError
                from .lifecycle.run import run_new

                try:
                    self._results = run_new(self, check_new_experiment(self))
                except ExperimentExistsError:
                    if self.when_stored is None:
                        raise
                    return self.when_stored().fit()  # (nothing was written: it resumes it)
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

    def group_settings(self) -> dict:
        """What the state records of the trials' size: resources per rank, ranks, hang limit."""
        settings = {"resources_per_trial": self.resources.as_dict(),
                    "num_workers": self.num_workers,
                    "collective_timeout_s": self.collective_timeout_s}
        if self.elastic:
            settings["elastic"] = dict(self.elastic)
        if self.trainer_settings:
            settings["trainer"] = self.trainer_settings
        parameters = getattr(self.trainable, "_ftnb_parameters", None)
        if parameters:
            settings["with_parameters"] = parameters
        return settings

    def _executor(self) -> Any:
        """The executor trials run on: local processes, obtained by name from the registry,
        handing their output over when it is shown (``verbose >= 1``)."""
        from .execution import executor_for

        if (self.trainer_settings or {}).get("local_mode"):
            from .train.local_mode import caller_executor

            return caller_executor(self.run_config.executor, self.tune_config)
        return executor_for(self.run_config.executor, output_events=self.run_config.verbose >= 1)

    # -- restoring -----------------------------------------------------------------------------
    @classmethod
    def can_restore(cls, path: Any, storage_filesystem: Any = None) -> bool:
        """Whether ``path`` is the folder of an ftnb experiment that can be restored (a readable
        state). False, never an error, for a missing path, an empty folder, a folder of
        something else, or a state this ftnb cannot read."""
        from .lifecycle.stored import can_restore

        return can_restore(path, storage_filesystem)

    @classmethod
    @keywords_after("Tuner.restore", "param_space")
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
        from .lifecycle.plan_restore import plan_restore, restored_scheduler

        param_space = _restored_space(path, storage_filesystem, trainable, param_space)
        group = _GroupSettings.of(trainable, None, "Tuner.restore", param_space)
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
            kind = _trainer_kind(stored_trainer.get("kind"))
            group = _GroupSettings(kind.trainer_from_settings(trainable, plan.state.settings))
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
            from .lifecycle.stored import RestoreError

            names = ", ".join(f"{n}=..." for n in stored)
            raise RestoreError(
                f"The experiment at {plan.paths.uri} was run with ftnb.with_parameters("
                f"{callable_name(trainable)}, {names}), whose objects are not saved with it. "
                f"Fix: pass them again: Tuner.restore(path, ftnb.with_parameters("
                f"{callable_name(trainable)}, {names}))."
            )
        tuner.num_workers = group.num_workers if group.trainer else plan.num_workers
        tuner.elastic = group.elastic if group.trainer else plan.state.settings.get("elastic")
        tuner.collective_timeout_s = (group.collective_timeout_s if group.trainer
                                      else plan.collective_timeout_s)
        tuner.trainer_pickle = keep_file
        tuner.trainer_settings = group.settings or stored_trainer
        tuner.listeners = []
        tuner.origin = None
        tuner._results = None
        tuner.restore_plan = plan
        tuner.when_stored = None
        tuner.resumes_by_name = None
        return tuner


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
        self.elastic: Optional[dict] = None
        self.collective_timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S
        self.pickle: Optional[bytes] = None
        #: What the state records of the trainer (settings["trainer"]), None for a function.
        self.settings: Optional[dict] = None
        if trainer is not None:
            # The fork server preloads what the driver has imported: every rank of every
            # restart then starts with torch in memory instead of importing it (seconds each).
            import torch.distributed  # noqa: F401

            scaling = trainer.scaling_config
            self.settings = {"kind": type(trainer).__name__, "use_gpu": scaling.use_gpu,
                             "backend": trainer.torch_config.backend}
            if scaling.local_mode:  # one "rank": the caller (ftnb.execution.caller)
                self.settings["local_mode"] = True
            given = getattr(trainer, "resume_from_checkpoint", None)
            if given is not None:  # its location, so a restore does not need it again
                self.settings["resume_from_checkpoint"] = given.uri
            self.resources = scaling.worker_resources()
            self.num_workers = max(scaling.min_workers, 1)  # an elastic group's min must fit
            if scaling.elastic:
                self.elastic = {"max_workers": scaling.max_workers,
                                "resize_interval_s": scaling.elastic_resize_monitor_interval_s}
            self.collective_timeout_s = (trainer.torch_config.timeout_s
                                         or scaling.collective_timeout_s)
            self.pickle = _trainer_kind(type(trainer).__name__).trainer_pickle(trainer)

    @classmethod
    def of(cls, trainable: Any, resources_per_trial: Any, where: str,
           param_space: Any = None) -> "_GroupSettings":
        """The group of ``trainable``; a trainer's as ``param_space`` makes it (its
        ``scaling_config`` searched: :meth:`TorchTrainer.for_space`)."""
        if not getattr(trainable, "_ftnb_trainer", False):
            return cls()
        if resources_per_trial is not None:
            raise ValueError(
                f"{where}(TorchTrainer, resources_per_trial={resources_per_trial!r}): a trainer's "
                "ScalingConfig says what each of its ranks gets. Fix: leave resources_per_trial "
                "out and use ScalingConfig(num_workers=..., resources_per_worker=...)."
            )
        return cls(trainable.for_space(param_space))


def _stored_state(path: Any, filesystem: Any) -> Optional[ExperimentState]:
    """The state of the experiment at ``path``; None when it cannot be read (plan_restore
    then says what is wrong with the path)."""
    from .lifecycle.stored import path_str

    try:
        return ExperimentState.load(ExperimentPaths.at(path_str(path), filesystem))
    except Exception:
        return None


def _restored_space(path: Any, filesystem: Any, trainable: Any, space: Any) -> Any:
    """The space ``Tuner.restore`` resumes with, given ``space``: a trainer's with its stored
    ``scaling_config``; a plain function's as its stored trainer's space."""
    if getattr(trainable, "_ftnb_trainer", False):
        return _with_stored_scaling(path, filesystem, trainable, space)
    if space is not None:
        return _as_stored_trainer_space(path, filesystem, space)
    return space


def _with_stored_scaling(path: Any, filesystem: Any, trainable: Any, space: Any) -> Any:
    """``space`` of a trainer resumed without the ``scaling_config`` its Tuner searched
    (``Tuner.restore(path, trainer)``): the stored one, over the trainer's own ScalingConfig,
    so that the space is the one the experiment was started with."""
    if isinstance(space, Mapping) and "scaling_config" in space:
        return space
    state = _stored_state(path, filesystem)
    stored = state.param_space.get("scaling_config") if state is not None and isinstance(
        state.param_space, dict) else None
    if not isinstance(stored, dict):
        return space
    import dataclasses

    from .search.space_json import decode_space

    scaling = dataclasses.replace(trainable.scaling_config, **decode_space(stored))
    return {**(space or {}), "scaling_config": scaling}


def _as_stored_trainer_space(path: Any, filesystem: Any, space: Mapping[str, Any]) -> Any:
    """``space`` given with a plain function to resume a TorchTrainer's experiment (its state's
    ``settings["trainer"]``): the trainer's space around it, as the run was started."""
    state = _stored_state(path, filesystem)
    if state is None:
        return space
    stored = state.settings.get("trainer")
    if not stored:
        return space
    return _trainer_kind(stored.get("kind")).group_space(space)


#: The module of each kind of trainer, by the name the state records (``settings["trainer"]
#: ["kind"]``): what rebuilds one from its settings (``trainer_from_settings``), wraps a space
#: as its own (``group_space``) and pickles its code (``trainer_pickle``). Named here, imported
#: on use: a trainer's ``fit()`` builds a Tuner, so the Tuner must not import the trainer back
#: (as the registry names executors). A kind not listed is a TorchTrainer's subclass.
_TRAINER_KINDS = {"TorchTrainer": "ftnb.train.torch_trainer"}


def _trainer_kind(kind: Optional[str]) -> Any:
    """The module of the trainer kind ``kind`` (:data:`_TRAINER_KINDS`)."""
    import importlib

    return importlib.import_module(_TRAINER_KINDS.get(kind or "", _TRAINER_KINDS["TorchTrainer"]))


def check_new_experiment(tuner: Tuner) -> NewExperimentPlan:
    """Everything the new experiment that ``tuner`` would start needs checked, before its
    directory is touched (its name chosen when the run config gives none); ``ftnb.launch`` and
    ``ftnb run`` call this in the caller to report bad input there."""
    from .lifecycle.plan_new import plan_new_experiment

    return plan_new_experiment(tuner, tuner._executor())


def start_or_resume(trainable: Any, **options: Any) -> tuple[Tuner, Optional[str]]:
    """The Tuner that starts experiment ``name`` or resumes it (then also the line that says
    so): what :func:`run`, :func:`ftnb.launch`, its supervisor, ``ftnb run``, ``ftnb resume``
    and ``TorchTrainer.fit`` call. The keyword arguments are those of
    :func:`ftnb.lifecycle.start_or_resume.start_or_resume` (``name``, ``param_space``,
    ``storage_path``, ``tune_config``, ``run_config``, ``resources_per_trial``, ``takeover``,
    ``restart_errored``, ``allow_different_trainable``, ``caller``), which decides; this front
    door gives it the Tuner."""
    from .lifecycle.start_or_resume import start_or_resume as by_name

    return by_name(Tuner, trainable, **options)


@keywords_after("ftnb.run", "param_space")
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
    tuner, resuming = start_or_resume(
        trainable, name=name, param_space=param_space, storage_path=storage_path,
        tune_config=tune_config, run_config=run_config,
        resources_per_trial=resources_per_trial, takeover=takeover,
        allow_different_trainable=allow_different_trainable, caller="ftnb.run")
    if resuming and tuner.run_config.verbose:
        print(resuming, flush=True)
    return tuner.fit()
