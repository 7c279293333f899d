"""Planning a restore: everything ``Tuner.restore`` is asked, checked against the stored
experiment before anything is written (:func:`plan_restore`, giving a :class:`RestorePlan`):
which trials run again (:class:`RestoreFlags`), that no live driver owns the experiment, that
the trainable is the one it started with, the objects its trials need, its stop criterion,
searcher and scheduler as stored. Carrying the plan out is :mod:`ftnb.lifecycle.own` (the
lease, fencing out the previous driver) and :mod:`ftnb.lifecycle.reconcile` (the trials'
records brought up to date with their files).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ..config import CheckpointConfig, FailureConfig, RunConfig, TuneConfig, callable_name
from ..core.records import ExperimentState, TrialStatus
from ..input_checks import check_trainable
from ..storage import ExperimentPaths
from .rebinding import (
    bind_configs,
    missing_objects_message,
    needed_objects,
    stored_configs,
    with_originals,
)
from .stored import RestoreError, path_str, check_same_trainable, load_state

if TYPE_CHECKING:
    from ..execution.resources import TrialResources

__all__ = ["RestoreFlags", "RestorePlan", "plan_restore", "restored_scheduler"]


class RestoreFlags:
    """Which trials a restore runs again (``Tuner.restore``'s flags of the same names)."""

    def __init__(self, resume_unfinished: bool, resume_errored: bool,
                 restart_errored: bool) -> None:
        self.resume_unfinished = resume_unfinished
        self.resume_errored = resume_errored
        self.restart_errored = restart_errored

    def will_run(self, status: str) -> bool:
        """Whether a trial left in ``status`` runs again."""
        if status == TrialStatus.TERMINATED:
            return False
        if status == TrialStatus.ERRORED:
            return self.resume_errored or self.restart_errored
        return self.resume_unfinished


@dataclass
class RestorePlan:
    """A restore checked and ready (:func:`plan_restore`); ``Tuner.fit()`` carries it out."""

    paths: ExperimentPaths
    #: The state as read when planned; :func:`take_over` re-reads it as the owner.
    state: ExperimentState
    configs: dict  # by trial id, what the trials run with (objects re-bound)
    result_configs: dict  # what the results show (the caller's own objects)
    flags: RestoreFlags
    takeover: bool
    rebound: bool  # a param_space was given (the resume line then asks for it again)
    run_config: RunConfig  # the stored one, with the stop criterion and verbosity asked for
    tune_config: TuneConfig  # as stored
    resources: "TrialResources"  # per trial (per rank of a group), as stored
    num_workers: int = 1  # ranks per trial, as stored
    collective_timeout_s: float = 30.0
    #: The search algorithm that goes on making trials (set up with ``search_space``), or None.
    searcher: Any = None
    search_space: Any = None
    #: The trials whose folder was missing when the restore took the experiment over (laid out
    #: again empty by :func:`~ftnb.lifecycle.own.take_over`): they start over, and say why.
    missing_folders: frozenset = frozenset()


#: ``plan_restore(stop=...)`` not given: the experiment's own stop criterion.
_STORED_STOP: Any = object()


def plan_restore(
    path: Any,
    trainable: Callable[[dict], Any],
    *,
    resume_unfinished: bool = True,
    resume_errored: bool = False,
    restart_errored: bool = False,
    param_space: Optional[Mapping[str, Any]] = None,
    storage_filesystem: Any = None,
    stop: Any = _STORED_STOP,
    takeover: bool = False,
    verbose: int = 1,
    allow_different_trainable: bool = False,
    search_alg: Any = None,
) -> RestorePlan:
    """Check everything :meth:`ftnb.Tuner.restore` is asked (its arguments, documented there)
    against the experiment stored at ``path``, writing nothing; raise on the first problem."""
    from ..execution.resources import TrialResources
    from ..storage import check_outage_settings
    from ..storage.lease import refuse_if_owned, refuse_takeover_of_live_driver

    check_outage_settings()
    check_trainable(trainable, "Tuner.restore")
    _check_flags(resume_unfinished=resume_unfinished, resume_errored=resume_errored,
                 restart_errored=restart_errored, takeover=takeover,
                 allow_different_trainable=allow_different_trainable)
    paths = ExperimentPaths.at(path_str(path), storage_filesystem)
    state = load_state(paths)
    if not takeover:
        refuse_if_owned(paths, "restore")
    else:
        refuse_takeover_of_live_driver(paths, what="take over")
    if not allow_different_trainable:
        check_same_trainable(paths, state, callable_name(trainable))
    flags = RestoreFlags(resume_unfinished, resume_errored, restart_errored)
    to_run = {t.trial_id for t in state.trials if flags.will_run(t.status)}
    bound = None
    if param_space is not None:
        from ..search import validate_param_space

        validate_param_space(param_space)
        configs, bound = bind_configs(state, stored_configs(state), param_space)
        result_configs = with_originals(configs, param_space, bound)
    else:
        needed = needed_objects(stored_configs(state, to_run))
        if needed:
            raise RestoreError(missing_objects_message(paths, callable_name(trainable), needed))
        configs = result_configs = stored_configs(state)
    settings = state.settings
    stored_stop = settings.get("stop")
    if stop is _STORED_STOP:
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
        # The executor it ran on, by name (an executor object is not stored): None is
        # $FTNB_EXECUTOR, else "local".
        executor=settings.get("executor") if settings.get("executor") not in (None, "local")
        else None,
    )
    tune_config = _stored_tune_config(settings)
    resources = TrialResources.from_user(settings.get("resources_per_trial"))
    searcher, search_space = _restored_searcher(paths, state, tune_config, search_alg, bound)
    return RestorePlan(paths, state, configs, result_configs, flags, takeover,
                       param_space is not None, run_config, tune_config, resources,
                       int(settings.get("num_workers") or 1),
                       float(settings.get("collective_timeout_s") or 30.0),
                       searcher, search_space)


def _check_flags(**flags: Any) -> None:
    """Refuse a flag of ``Tuner.restore`` that is not a bool, and the two errored-trial flags
    asked together."""
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"Tuner.restore({flag}={value!r}) must be True or False.")
    if flags["resume_errored"] and flags["restart_errored"]:
        raise ValueError(
            "Tuner.restore(resume_errored=True, restart_errored=True) asks for two things at "
            "once. Fix: resume_errored=True continues errored trials from their latest "
            "checkpoint; restart_errored=True starts them over from scratch. Pick one."
        )


def _restored_searcher(paths: ExperimentPaths, state: ExperimentState, tune_config: TuneConfig,
                       given: Any, bound_space: Any) -> tuple[Any, Any]:
    """The searcher that goes on making the experiment's trials, set up with its space: the one
    ``given`` (``Tuner.restore(search_alg=...)``), or built again from its description in the
    state; ``(None, None)`` for an experiment whose trials were all made when it started."""
    from ..core.searching import PersistedSearcher, rebuild_searcher, searcher_settings
    from ..search.libraries import install_hint
    from ..search.searcher import Searcher
    from ..search.space_json import SpaceNotStoredError, decode_space

    stored = state.settings.get("search_alg")
    if not stored:
        if given is not None:
            raise RestoreError(
                f"Tuner.restore(search_alg={given!r}): the experiment at {paths.uri} was not run "
                "with a search algorithm (its trials were all made when it started). Fix: leave "
                "search_alg out.")
        return None, None
    if given is not None and not isinstance(given, Searcher):
        raise RestoreError(f"Tuner.restore(search_alg={given!r}) must be an ftnb.search.Searcher.")
    stored_class = stored.get("class") if isinstance(stored, dict) else None
    given_class = searcher_settings(given)["class"] if given is not None else None
    if given_class is not None and stored_class and given_class != stored_class:
        raise RestoreError(
            f"The experiment at {paths.uri} was run with the search algorithm "
            f"{stored.get('name') or stored_class}; Tuner.restore(search_alg={given!r}) is "
            "another one, whose state would not match the stored one. Fix: pass the same "
            "search algorithm, configured as it was (or leave search_alg out when ftnb can "
            "rebuild it), or run a new experiment (another name) to search differently.")
    searcher = given
    if searcher is None:
        description = stored.get("description") if isinstance(stored, dict) else None
        if not description:
            name = stored.get("name") if isinstance(stored, dict) else stored
            raise RestoreError(
                f"The experiment at {paths.uri} was run with the search algorithm {name}, which "
                "holds code or objects that are not saved with it (a function, a sampler, a "
                "class of your own). Fix: pass it again, configured as it was: "
                "Tuner.restore(path, trainable, search_alg=...) (or ftnb.run(..., tune_config="
                "TuneConfig(search_alg=...))).")
        try:
            searcher = rebuild_searcher(description)
        except ImportError as exc:
            hint = install_hint(description)
            raise RestoreError(
                f"Cannot restore {paths.uri}: its search algorithm {stored.get('name')} needs "
                f"{exc.name or exc}, which is not installed. Fix: "
                f"{hint or 'install the missing package'}.") from None
        except (ValueError, TypeError) as exc:
            raise RestoreError(f"Cannot restore {paths.uri}: its search algorithm "
                               f"{stored.get('name')} cannot be built again here: {exc}") from None
    space = bound_space
    if space is None:
        try:
            space = decode_space(state.param_space) or {}
        except SpaceNotStoredError as exc:
            raise RestoreError(f"Cannot restore {paths.uri}: {exc}") from None
    try:
        PersistedSearcher.prepare(searcher, space, metric=tune_config.metric,
                                  mode=tune_config.mode, num_samples=tune_config.num_samples,
                                  seed=tune_config.seed, check_space=False)
    except (ValueError, TypeError) as exc:
        raise RestoreError(f"Cannot restore {paths.uri} with the search algorithm "
                           f"{searcher!r}: {exc}") from None
    return searcher, space


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
        time_budget_s=settings.get("time_budget_s"),
    )
    return config


def _from_settings(cls: type, data: Any) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (data or {}).items() if k in names})



def restored_scheduler(paths: ExperimentPaths, state: ExperimentState, given: Any) -> Any:
    """The trial scheduler a restore goes on with: ``given`` (``Tuner.restore(scheduler=...)``,
    ``ftnb.run``'s ``TuneConfig(scheduler=...)``) when it is the one the experiment ran with,
    else the stored one rebuilt (ftnb's schedulers); None for an experiment run without one.
    Raises :class:`RestoreError` for a different scheduler, one added to an experiment run
    without, and a class of the user's not given again."""
    from ..schedulers import (
        FIFOScheduler,
        TrialScheduler,
        same_scheduler,
        scheduler_from_description,
    )

    stored = state.scheduler
    if given is not None and not isinstance(given, TrialScheduler):
        raise RestoreError(f"Tuner.restore(scheduler={given!r}) must be an "
                           "ftnb.schedulers.TrialScheduler.")
    if not stored:
        if given is not None and type(given) is not FIFOScheduler:
            raise RestoreError(
                f"The experiment at {paths.uri} was run without a trial scheduler (every trial "
                f"to its end); {type(given).__name__} cannot take over its results halfway: its "
                "decisions would not hold for what was reported without it. Fix: leave the "
                "scheduler out to resume it, or run a new experiment (another name) with it.")
        return None
    name = stored.get("class")
    settings = stored.get("settings")
    if given is not None:
        given.set_search_properties(state.settings.get("metric"), state.settings.get("mode"))
        if not same_scheduler(stored, given):
            shown = ", ".join(f"{k}={v!r}" for k, v in (settings or {}).items())
            raise RestoreError(
                f"The experiment at {paths.uri} was run with {name}({shown}); resuming it with "
                f"another scheduler ({type(given).__name__}, or other arguments) would not agree "
                "with the decisions already made (rungs, brackets, trials stopped). Fix: leave "
                "the scheduler out (ftnb rebuilds it from the state) or pass the same one; "
                "or run a new experiment (another name) with the new scheduler.")
        return given
    rebuilt = scheduler_from_description(stored)
    if rebuilt is None:
        raise RestoreError(
            f"The experiment at {paths.uri} was run with the trial scheduler {name}, a class of "
            "your own, which is not saved with it (its state is). Fix: pass it again, "
            f"configured as it was: Tuner.restore(path, trainable, scheduler={name}(...)) (or "
            f"ftnb.run(..., tune_config=TuneConfig(scheduler={name}(...))).")
    return rebuilt
