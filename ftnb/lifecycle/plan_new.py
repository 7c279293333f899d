"""A new experiment: what is checked before its folder is touched (:func:`plan_new_experiment`),
its first state (:func:`initial_state`), and the rule that none starts where an experiment is
already stored (:func:`refuse_existing`).

``Tuner.fit()`` plans, lays out and runs it (:func:`ftnb.lifecycle.run.run_new`);
``ftnb.launch`` and ``ftnb run`` plan it in the caller first
(:func:`ftnb.tuner.check_new_experiment`), so that bad input is reported there. Planning
writes nothing. What is planned is described by :class:`NewExperiment` (a ``Tuner`` is one):
this package never imports its front doors.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ..config import CheckpointConfig, RunConfig, TuneConfig, callable_name
from ..execution.contract import GroupNotSupportedError
from ..core.records import ExperimentState, ExperimentStatus, TrialRecord, encode_value
from ..input_checks import check_picklable
from ..schedulers.stop_criterion import describe_stop
from ..storage import ExperimentPaths, Storage, default_storage_path
from .stored import load_state, refuse_remains

if TYPE_CHECKING:
    from ..execution.contract import Executor
    from ..execution.resources import TrialResources

__all__ = ["ExperimentExistsError", "NewExperiment", "NewExperimentPlan", "check_group_fits",
           "initial_state",
           "plan_new_experiment", "refuse_existing", "sets_aside_finished"]


class ExperimentExistsError(ValueError):
    """A new experiment was to start where one is stored, readable and run by no live driver
    (:func:`refuse_existing`), and not set aside (an unfinished one; a finished one on storage
    without an atomic rename: :mod:`ftnb.lifecycle.earlier_runs`). A run made by starting *or resuming* by name
    (:func:`~ftnb.lifecycle.start_or_resume.start_or_resume`) that meets it, because the
    experiment was stored after it looked (another ``ftnb.run`` of the same name finished
    meanwhile), resumes it instead, as the same call made a moment later would."""


class NewExperiment(Protocol):
    """What planning and running a new experiment reads of its front door (``ftnb.Tuner``)."""

    trainable: Any
    param_space: dict
    tune_config: TuneConfig
    run_config: RunConfig
    resources: "TrialResources"
    num_workers: int
    origin: Optional[dict]

    def group_settings(self) -> dict:
        """What the state records of the trials' size (resources per rank, ranks, ...)."""


@dataclass
class NewExperimentPlan:
    """A new experiment checked and ready to lay out (:func:`plan_new_experiment`)."""

    executor: "Executor"  # what its trials will run on (the resources fit on it)
    space: dict  # the search space, its objects bound to refs (``ftnb.put``)
    variants: list  # one config per trial, in trial order
    storage: Storage
    name: str
    paths: ExperimentPaths
    #: The search algorithm that makes the trials as they can start (then ``variants`` is
    #: empty), set up with the space; None when every trial is made now.
    searcher: Any = None
    #: A BasicVariantGenerator's own max_concurrent (its trials are all made now).
    max_concurrent: Optional[int] = None
    #: One line when fewer trials than max_concurrent_trials fit at once (and why), else "".
    concurrency_note: str = ""


def check_group_fits(executor: "Executor", tuner: Any) -> None:
    """The trials' ranks can run on ``executor`` (an elastic group: its min, on an executor
    that can resize a running group)."""
    elastic = getattr(tuner, "elastic", None)
    if elastic and not hasattr(executor, "request_resize"):
        raise ValueError(
            f"ScalingConfig(num_workers=({tuner.num_workers}, {elastic['max_workers']})) on the "
            f"{getattr(executor, 'name', type(executor).__name__)!r} executor: elastic groups "
            "run on the local and Ray executors. Fix: a fixed "
            f"num_workers={elastic['max_workers']}, or RunConfig(executor='local').")
    try:
        executor.check_fits(tuner.resources, tuner.num_workers)
    except GroupNotSupportedError:
        raise
    except ValueError as exc:
        if elastic:
            raise ValueError(
                f"ScalingConfig(num_workers=({tuner.num_workers}, {elastic['max_workers']})): "
                f"even its min of {tuner.num_workers} ranks never fits: {exc}") from None
        trainer = getattr(tuner, "trainer_settings", None)
        if not trainer or getattr(executor, "name", "") == "ray":
            raise
        raise ValueError(_scaling_never_fits(tuner.resources, tuner.num_workers,
                                             bool(trainer.get("use_gpu")),
                                             executor.capacity())) from None


def _scaling_never_fits(per_rank: "TrialResources", ranks: int, use_gpu: bool,
                        capacity: Any) -> str:
    """Why a trainer's group never fits this machine, in the words of its ScalingConfig (not
    the resources_per_trial it became), with what to change."""
    from ..wording import number, plural

    written = [f"num_workers={ranks}"] + (["use_gpu=True"] if use_gpu else [])
    # resources_per_worker given: a rank asks for other than the 1 CPU (and 1 GPU) by default
    if per_rank.cpu != 1 or per_rank.gpu != (1 if use_gpu else 0):
        written.append(f"resources_per_worker={per_rank._short_repr()}")
    scaling = f"ScalingConfig({', '.join(written)})"
    have = f"{plural(capacity.cpus, 'CPU')} and {plural(capacity.gpus, 'GPU') if capacity.gpus else 'no GPU'}"
    gpus_needed = per_rank.gpu * ranks if per_rank.gpu >= 1 else (1 if per_rank.gpu else 0)
    if gpus_needed > capacity.gpus:
        if not capacity.gpus:
            return (
                f"TorchTrainer(scaling_config={scaling}) cannot run on this machine: "
                f"{'use_gpu=True gives' if use_gpu else 'resources_per_worker gives'} each rank "
                f"a GPU, and this machine has no GPU ({plural(capacity.cpus, 'CPU')}). Fix: "
                "ScalingConfig(use_gpu=False) to train on the CPUs; or, if the machine has GPUs "
                "that were not detected, set CUDA_VISIBLE_DEVICES (or FTNB_NUM_GPUS); or run on "
                "a Ray cluster with GPUs (RunConfig(executor='ray'))."
            )
        if per_rank.gpu > capacity.gpus:
            return (
                f"TorchTrainer(scaling_config={scaling}) cannot run on this machine: each rank "
                f"asks for {plural(per_rank.gpu, 'GPU')}, and this machine has {have}. Fix: "
                f"resources_per_worker={{'GPU': {capacity.gpus}}}; or set CUDA_VISIBLE_DEVICES "
                "(or FTNB_NUM_GPUS) if GPUs were not detected; or run on a Ray cluster with "
                "more GPUs (RunConfig(executor='ray'))."
            )
        return (
            f"TorchTrainer(scaling_config={scaling}) cannot run on this machine: its "
            f"{ranks} ranks need {plural(gpus_needed, 'GPU')} at once, and this machine has "
            f"{have}. Fix: ScalingConfig(num_workers={int(capacity.gpus // per_rank.gpu)}); or "
            "set CUDA_VISIBLE_DEVICES (or FTNB_NUM_GPUS) if GPUs were not detected; or run on a "
            "Ray cluster with more GPUs (RunConfig(executor='ray'))."
        )
    return (
        f"TorchTrainer(scaling_config={scaling}) cannot run on this machine: its "
        f"{plural(ranks, 'rank')} need {number(per_rank.cpu * ranks)} CPUs at once "
        f"({number(per_rank.cpu)} each), and this machine has {have}. Fix: fewer workers, or "
        "fewer CPUs per rank (resources_per_worker={'CPU': 0.5} lets ranks share cores), or "
        "set FTNB_NUM_CPUS if CPUs were not detected."
    )


def plan_new_experiment(tuner: NewExperiment, executor: "Executor") -> NewExperimentPlan:
    """Everything the new experiment of ``tuner`` needs checked, before its directory is
    touched: its resources fit ``executor``, its space generates its configs, its functions can
    travel to trial processes, its storage is writable, and no experiment is stored under its
    name (chosen here when the run config gives none)."""
    from ..objects import bind_objects
    from ..storage import check_outage_settings

    rc, tc = tuner.run_config, tuner.tune_config
    check_group_fits(executor, tuner)
    space, _ = bind_objects(tuner.param_space)
    searcher, variants, max_concurrent = plan_search(tc, space)
    check_space = getattr(tc.scheduler, "_ftnb_check_space", None)
    if check_space is not None:  # (PBT: the hyperparameters it mutates are in the space)
        check_space(space)
    check_picklable(tuner.trainable, "trainable")
    if callable(rc.stop):
        check_picklable(rc.stop, "RunConfig(stop=...)")
    check_outage_settings()
    storage = Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)
    check_storage = getattr(executor, "check_storage", None)
    if check_storage is not None:  # every node must reach it (a cluster's executor)
        check_storage(storage)
    storage.check_writable()
    name = rc.name or _default_name(tuner.trainable, storage)
    paths = ExperimentPaths.of(storage, name)
    refuse_existing(paths, finished_set_aside=sets_aside_finished(tuner))
    return NewExperimentPlan(executor, space, variants, storage, name, paths, searcher,
                             max_concurrent, _concurrency_note(tuner, executor, variants))


def _concurrency_note(tuner: NewExperiment, executor: "Executor", variants: list) -> str:
    """:func:`~ftnb.execution.resources.concurrency_note` for the new experiment (on one
    machine; a Ray cluster's capacity is spread over nodes that come and go)."""
    from ..execution.resources import concurrency_note

    if getattr(executor, "name", "") == "ray":
        return ""
    tc = tuner.tune_config
    trials = len(variants) or (tc.num_samples if tc.num_samples > 0 else 1 << 30)
    capacity = executor.capacity()
    return concurrency_note(tc.max_concurrent_trials, trials, tuner.resources,
                            tuner.num_workers, capacity.cpus, capacity.gpu_ids)


def plan_search(tc: Any, space: dict) -> tuple[Any, list, Optional[int]]:
    """How the trials of a new experiment are made: ``(searcher, variants, max_concurrent)``.

    Without a ``search_alg`` (and a finite ``num_samples``) every trial is made now, as always
    (:func:`~ftnb.search.generate_variants`); so with a ``BasicVariantGenerator`` and a finite
    ``num_samples`` (its points first). Otherwise the searcher, set up here with the space (its
    errors before anything is written), makes them as they can start."""
    from ..core.searching import PersistedSearcher
    from ..search import BasicVariantGenerator, generate_variants

    searcher = tc.search_alg
    if searcher is None and tc.num_samples != -1:
        return None, generate_variants(space, tc.num_samples, tc.seed), None
    if searcher is None:
        searcher = BasicVariantGenerator()
    PersistedSearcher.prepare(searcher, space, metric=tc.metric, mode=tc.mode,
                              num_samples=tc.num_samples, seed=tc.seed, check_space=True)
    if type(searcher) is BasicVariantGenerator and tc.num_samples != -1:
        return None, searcher.variants(), searcher.max_concurrent or None
    return searcher, [], None


def initial_state(tuner: NewExperiment, plan: NewExperimentPlan) -> ExperimentState:
    """The state the experiment starts with: its settings, its search space (encoded, objects
    as placeholders) and one PENDING trial per variant, with ids unique to this experiment."""
    from ..search import encode_space, varying_keys

    rc, tc = tuner.run_config, tuner.tune_config
    ckpt: CheckpointConfig = rc.checkpoint_config
    prefix = secrets.token_hex(3)[:5]
    state = ExperimentState(
        name=plan.name,
        trainable=callable_name(tuner.trainable),
        settings={
            "metric": tc.metric,
            "mode": tc.mode,
            "num_samples": tc.num_samples,
            "seed": tc.seed,
            "time_budget_s": tc.time_budget_s,
            "max_concurrent_trials": _max_concurrent(tc.max_concurrent_trials,
                                                     plan.max_concurrent),
            "failure_config": vars(rc.failure_config).copy(),
            "checkpoint_config": vars(ckpt).copy(),
            "stop": describe_stop(rc.stop),
            "storage_path": plan.storage.uri(plan.storage.root),
            "executor": getattr(plan.executor, "name", None),
            **tuner.group_settings(),
        },
    )
    if tuner.origin:
        state.settings["origin"] = tuner.origin
    if tc.scheduler is not None:
        from ..schedulers import initial_record

        state.scheduler = initial_record(tc.scheduler)
    for index, config in enumerate(plan.variants):
        trial_id = f"{prefix}_{index:05d}"
        state.trials.append(
            TrialRecord(trial_id=trial_id, dir_name=trial_id, config=encode_value(config))
        )
    state.settings["varying_keys"] = varying_keys(plan.space)
    state.param_space = encode_space(plan.space, encode_value)
    if plan.searcher is not None:
        from ..core.searching import searcher_settings

        state.settings["search_alg"] = encode_value(searcher_settings(plan.searcher))
        state.settings["trial_id_prefix"] = prefix  # its trials' ids go on from a restore
    return state


def _max_concurrent(*limits: Optional[int]) -> Optional[int]:
    given = [n for n in limits if n]
    return min(given) if given else None


def refuse_existing(paths: ExperimentPaths, check_owner: bool = True,
                    finished_set_aside: bool = False) -> None:
    """Raise when an experiment is, or was, stored at ``paths``:

    * :class:`~ftnb.storage.lease.ExperimentLockedError`, naming the driver (host, pid, since),
      while a live driver owns it (``check_owner``; another ``ftnb.run`` of the same name that
      started a moment earlier, say): that driver is running it, and is never to be deleted;
    * a :class:`~ftnb.lifecycle.stored.RestoreError` when its state is unreadable, newer than
      this ftnb, or gone while its trial folders remain (the restore's own errors);
    * an :class:`ExperimentExistsError` (a ValueError) that says how to resume it otherwise.

    ``check_owner=False``: the caller owns the lease itself. ``finished_set_aside``: an
    experiment that ran to its end passes (a plain ``Tuner(...).fit()`` sets it aside and starts
    a new run: :mod:`ftnb.lifecycle.earlier_runs`)."""
    from ..storage.lease import refuse_if_owned
    from .earlier_runs import finished_state

    if check_owner:
        refuse_if_owned(paths, "start")
    if not paths.has_state():
        refuse_remains(paths, "start a new experiment at")
        return
    if finished_set_aside and finished_state(paths) is not None:
        return
    state = load_state(paths, what="start a new experiment at")
    how = ("finished; a finished one is set aside for a new run only on a local disk"
           if ExperimentStatus(state.status).is_finished() else "not finished")
    raise ExperimentExistsError(
        f"An experiment named {paths.name!r} already exists at {paths.uri} ({how}). "
        "Running Tuner(...).fit() again would mix two experiments in one folder. "
        "Fix: resume it with "
        f"ftnb.Tuner.restore({paths.uri!r}, trainable).fit() (or use ftnb.run(...), which "
        "starts or resumes), choose another RunConfig(name=...), or delete that folder to "
        "start over."
    )


def sets_aside_finished(experiment: Any) -> bool:
    """Whether ``experiment``, started where a finished experiment is stored, sets it aside
    and starts a new run: a plain ``Tuner(...).fit()`` does, as Ray's does; a run started by
    name (``ftnb.run``, ``TorchTrainer.fit``: ``resumes_by_name``) resumes it instead."""
    return getattr(experiment, "resumes_by_name", None) is None


def _default_name(trainable: Any, storage: Storage) -> str:
    base = f"{callable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    name, n = base, 1
    while storage.exists(ExperimentPaths.of(storage, name).dir):
        n += 1
        name = f"{base}_{n}"
    return name
