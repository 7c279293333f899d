"""Running an experiment as its owner: a new one (:func:`run_new`: the lease, the state, the
trial folders, then the controller) or a planned restore (:func:`run_restored`: the lease, the
previous driver fenced out, the trials reconciled, then the controller); both end in
:func:`run_controller`, which builds the controller with its listeners and runs it.

What is run is described by :class:`RunnableExperiment` (a ``Tuner`` is one): this package
never imports its front doors.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from ..config import TuneConfig, callable_name
from ..core.records import ExperimentState, ExperimentStatus
from ..result import ResultGrid
from ..storage import ExperimentPaths
from .plan_new import NewExperiment, check_group_fits

if TYPE_CHECKING:
    from .plan_new import NewExperimentPlan
    from .plan_restore import RestorePlan

__all__ = ["RunnableExperiment", "resume_hint", "run_controller", "run_new", "run_restored"]


class RunnableExperiment(NewExperiment, Protocol):
    """What running an experiment reads of its front door, besides what planning reads."""

    listeners: list
    collective_timeout_s: float
    #: A TorchTrainer's code, written to ``trainer.pkl`` before the trials run; None otherwise.
    trainer_pickle: Optional[bytes]


def run_new(experiment: RunnableExperiment, plan: "NewExperimentPlan") -> ResultGrid:
    """Start the new experiment ``plan`` (:func:`~ftnb.lifecycle.plan_new.plan_new_experiment`)
    under its owner lease: its state first, then its trial folders, then its trials."""
    from ..core.controller import say_interrupted
    from ..core.trial_files import lay_out_trial_folders
    from ..objects import walk_placeholders
    from ..storage.lease import Lease
    from .earlier_runs import set_aside_finished
    from .plan_new import initial_state, refuse_existing, sets_aside_finished
    from .rebinding import with_originals
    from .trial_names import name_trials

    paths, space = plan.paths, plan.space
    if plan.concurrency_note and experiment.run_config.verbose:
        print(plan.concurrency_note, flush=True)
    lease = Lease.acquire(paths, what="start")
    try:
        if sets_aside_finished(experiment):  # a finished one is kept beside, as Ray does
            lease = set_aside_finished(paths, lease, experiment.run_config.verbose)
        # Another driver may have created it while we checked (the lease is ours now).
        refuse_existing(paths, check_owner=False)
        state = initial_state(experiment, plan)
        name_trials(state, experiment.tune_config, plan.variants,
                    callable_name(experiment.trainable))
        if plan.max_concurrent:  # a BasicVariantGenerator's own limit
            experiment.tune_config = _with_max_concurrent(experiment.tune_config,
                                                          plan.max_concurrent)
        configs = {t.trial_id: c for t, c in zip(state.trials, plan.variants)}
        plan.storage.makedirs(paths.dir)
        # The state first: a driver killed while it lays out the trial folders leaves an
        # experiment that restore completes, not folders that belong to nothing.
        state.save(paths)
        hint = resume_hint(experiment, paths, state,
                           bool(walk_placeholders(state.param_space)))
        try:
            lay_out_trial_folders(paths, state, only_missing=False)
        except KeyboardInterrupt as exc:  # (thousands of trials take a while)
            say_interrupted(exc, state.name, hint,
                            "no trial had started (restore lays out the rest)")
            raise
        search = None
        if plan.searcher is not None:
            from ..core.searching import PersistedSearcher

            search = PersistedSearcher.start(
                plan.searcher, paths, space, num_samples=experiment.tune_config.num_samples,
                id_prefix=state.settings["trial_id_prefix"], seed=experiment.tune_config.seed,
                guard=lease.check)
        return run_controller(experiment, paths, state, configs, plan.executor, lease, hint,
                              with_originals(configs, experiment.param_space, space),
                              search=search)
    finally:
        lease.release()


def run_restored(experiment: RunnableExperiment, plan: "RestorePlan",
                 executor: Any) -> ResultGrid:
    """Carry out the restore ``plan`` (:func:`~ftnb.lifecycle.plan_restore.plan_restore`) on
    ``executor``: take the lease, fence out the previous driver (:func:`~ftnb.lifecycle.own.
    take_over`), reconcile the trials with their files, then run them."""
    from ..core.controller import Controller
    from ..input_checks import check_picklable
    from ..storage.lease import Lease
    from .own import take_over
    from .reconcile import resume_trials

    check_group_fits(executor, experiment)
    check_storage = getattr(executor, "check_storage", None)
    if check_storage is not None:
        check_storage(plan.paths.storage)
    check_picklable(experiment.trainable, "trainable")
    paths = plan.paths
    if plan.takeover:
        from .own import end_stopped_driver

        end_stopped_driver(paths)
    lease = Lease.acquire(paths, takeover=plan.takeover, what="restore")
    try:
        state = take_over(plan, lease)
        hint = resume_hint(experiment, paths, state, plan.rebound)

        def prepare(controller: Controller) -> None:
            resume_trials(state, plan.flags, controller.trial_files, plan.missing_folders)
            state.status = ExperimentStatus.RUNNING.value
            state.settings["storage_path"] = paths.parent_uri
            state.settings.update(experiment.group_settings())
            if experiment.origin:
                state.settings["origin"] = experiment.origin
            controller.save()

        search = None
        if plan.searcher is not None:
            from ..core.searching import PersistedSearcher

            search = PersistedSearcher.resume(
                plan.searcher, paths, plan.search_space,
                num_samples=experiment.tune_config.num_samples,
                id_prefix=state.settings.get("trial_id_prefix") or "t",
                seed=experiment.tune_config.seed, guard=lease.check)
        return run_controller(experiment, paths, state, plan.configs, executor, lease, hint,
                              plan.result_configs, prepare=prepare, search=search)
    finally:
        lease.release()


def resume_hint(experiment: NewExperiment, paths: ExperimentPaths, state: ExperimentState,
                with_space: bool) -> str:
    """The line printed when this run is interrupted: ``ftnb resume NAME`` for an
    experiment the command line started; the script's own command for a script that runs it by
    name (``ftnb.run``, ``TorchTrainer.fit``: run again, it resumes); else the Python line."""
    from ..ui.read_model import resume_line, tuner_restore_line
    from ..ui.resume_lines import run_again_line

    if experiment.origin and experiment.origin.get("via") == "cli":
        return resume_line(paths, state)
    by_name = getattr(experiment, "resumes_by_name", None)
    again = run_again_line(by_name) if by_name in ("ftnb.run", "TorchTrainer.fit") else None
    if again:
        return again
    return tuner_restore_line(paths.uri, callable_name(experiment.trainable), with_space)


def run_controller(experiment: RunnableExperiment, paths: ExperimentPaths,
                   state: ExperimentState, configs: dict, executor: Any, lease: Any, hint: str,
                   result_configs: dict, prepare: Optional[Callable[[Any], None]] = None,
                   search: Any = None) -> ResultGrid:
    """Run the controller on ``executor`` (which it shuts down when it ends); the results
    show ``result_configs`` (the caller's own objects where the trials were given refs to
    copies)."""
    from ..core.controller import Controller
    from ..parameters import trial_resources_of
    from ..storage.control import ControlInbox
    from .trial_names import TrialSetup

    rc, tc = experiment.run_config, experiment.tune_config
    listeners, rc, stopping = _listeners(experiment, paths)
    controller = Controller(
        paths=paths,
        state=state,
        trainable=experiment.trainable,
        configs=configs,
        run_config=rc,
        max_concurrent=tc.max_concurrent_trials,
        resources=experiment.resources,
        executor=executor,
        listeners=listeners,
        lease=lease,
        resume_hint=hint,
        control=ControlInbox(paths, epoch=lease.info.epoch),
        num_workers=experiment.num_workers,
        collective_timeout_s=experiment.collective_timeout_s,
        elastic=getattr(experiment, "elastic", None),
        search=search,
        scheduler=tc.scheduler,
    )
    if search is not None:
        controller.trial_setup = TrialSetup(state, tc, experiment.trainable)
    if stopping is not None:
        from ..stopper import decides_in_driver

        stopping.controller = controller
        # A Stopper deciding in the driver: each report waits for it (exact, as in Ray).
        controller.scheduling.every_report = decides_in_driver(stopping.stopper)
    _, controller.trial_resources = trial_resources_of(experiment.trainable, configs)
    for request in set(controller.trial_resources.values()):
        executor.check_fits(request, experiment.num_workers)
    if experiment.trainer_pickle is not None:
        paths.storage.write_atomic(paths.trainer, experiment.trainer_pickle)
    if prepare is not None:
        prepare(controller)
    lease.start_heartbeat()
    controller.run()
    return ResultGrid(paths, state, result_configs)


def _listeners(experiment: RunnableExperiment, paths: ExperimentPaths) -> tuple[list, Any, Any]:
    """The controller's listeners (the experiment's own, the terminal table, the callbacks, the
    driver-side stopper), the run config the controller gets (its stop criterion reduced to
    what trials check), and the driver-side stopping listener (None without one)."""
    from ..stopper import DriverStopping, split_stop
    from ..ui.terminal import TerminalReporter

    rc, tc = experiment.run_config, experiment.tune_config
    listeners = list(experiment.listeners)
    if rc.verbose:
        listeners.append(TerminalReporter(
            rc.verbose, path=paths.uri,
            resume_announced=getattr(experiment, "resume_announced", False)))
    if rc.callbacks:
        from ..callback import CallbackListener

        listeners.append(CallbackListener(rc.callbacks, paths, rc.stop))
    in_trial_stop, driver_stopper = split_stop(rc.stop, tc.time_budget_s)
    stopping = None
    if driver_stopper is not None:
        stopping = DriverStopping(driver_stopper, paths)
        listeners.append(stopping)
        rc = dataclasses.replace(rc, stop=in_trial_stop)
    return listeners, rc, stopping


def _with_max_concurrent(tune_config: TuneConfig, limit: int) -> TuneConfig:
    current = tune_config.max_concurrent_trials
    return dataclasses.replace(tune_config, max_concurrent_trials=min(limit, current or limit))
