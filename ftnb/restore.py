"""Restoring an experiment from its folder alone: what ``Tuner.restore`` (and so ``ftnb.run``,
``ftnb.launch``, ``ftnb resume`` and ``%ftresume``) does, in the order it does it.

1. Finding it: :func:`load_state` reads the state or raises a :class:`RestoreError` saying what
   is at the path instead; :func:`can_restore` asks without raising.
2. Planning, before anything is written (:func:`plan_restore`, giving a :class:`RestorePlan`):
   which trials run again (:class:`RestoreFlags`), that no live driver owns the experiment, that
   the trainable is the one it started with (:func:`check_same_trainable`), the objects its
   trials need (:func:`needed_objects`, :func:`bind_configs`), its stop criterion and configs as
   stored.
3. Carrying it out as the experiment's owner (:func:`take_over`, then :func:`resume_trials`):
   the previous driver's trials are gone, the state is re-read, each trial's record is brought
   up to date with its files (:class:`ftnb.core.trial_files.TrialFiles`) and set to run or not as
   asked. The controller then runs the trials like any others.

The experiment state holds plain JSON. Every object of a search space (a model, a tensor, a
DataFrame, a dataset) was stored with ``ftnb.put`` when the experiment started and appears in
the state as a placeholder ``{"__ftnb_ref__": id, "type", "size", "repr"}``. Restoring pairs
each stored placeholder with the object at the same place of the re-specified space (the last
two sections: comparing search spaces, re-binding objects).

Why this module is over 500 lines: it is all of restore, in the order it happens, so that a
newcomer finds restore in one place (issue 13); what it does to the trials' files is
:mod:`ftnb.core.trial_files`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from .config import CheckpointConfig, FailureConfig, RunConfig, TuneConfig, callable_name
from .core.records import (
    ExperimentState,
    StateFormatError,
    StateVersionError,
    TrialStatus,
    encode_value,
)
from .core.recoveries import PREVIOUS_STATE, recovery, say
from .core.trial_files import TrialFiles, lay_out_trial_folders, remove_leftover_temps
from .input_checks import check_trainable
from .objects import ObjectRef, bind_objects, is_placeholder, walk_placeholders
from .search import encode_space
from .storage import (
    PARAMS_FILE,
    RESULTS_FILE,
    STATE_BACKUP_FILE,
    STATE_FILE,
    ExperimentPaths,
)
from .storage.file_names import STATE_SEGMENT

if TYPE_CHECKING:
    from .execution.resources import TrialResources
    from .storage.lease import Lease, LeaseInfo

__all__ = [
    "DifferentTrainableError",
    "RestoreError",
    "RestoreFlags",
    "RestorePlan",
    "bind_configs",
    "can_restore",
    "check_same_trainable",
    "describe_location",
    "load_state",
    "missing_objects_message",
    "needed_objects",
    "note_fallbacks",
    "plan_restore",
    "refuse_remains",
    "remains_of_experiment",
    "resume_trials",
    "space_differences",
    "stored_configs",
    "take_over",
    "take_over_driver",
    "with_originals",
]

#: The stand-in that ``encode_value`` writes for an object not put with ``ftnb.put`` (in states
#: written before ``ftnb.put``, every object): its type and repr, nothing to re-bind it by.
_LEGACY_OBJECT = "__ftnb_object__"


class RestoreError(ValueError):
    """An experiment cannot be restored as asked; the message says why and how to fix it."""


class DifferentTrainableError(RestoreError):
    """The trainable given to resume an experiment is not named like the one it started with.

    Attributes: ``recorded`` (the name in the experiment's state), ``given`` (the name of the
    one given), ``path`` (the experiment's folder)."""

    def __init__(self, message: str, recorded: str, given: str, path: str) -> None:
        super().__init__(message)
        self.recorded, self.given, self.path = recorded, given, path


def check_same_trainable(paths: ExperimentPaths, state: ExperimentState, given: str) -> None:
    """Raise :class:`DifferentTrainableError` when ``given`` (a trainable's name) is not the
    name the experiment's state records (states that record none pass)."""
    recorded = state.trainable
    if not isinstance(recorded, str) or recorded in ("", "?") or recorded == given:
        return
    raise DifferentTrainableError(
        f"Cannot resume {paths.uri} with the trainable {given!r}: the experiment was run by "
        f"{recorded!r}, and resuming its trials with other code would mix two programs in one "
        f"experiment. Fix: pass {recorded} again, or pass allow_different_trainable=True if "
        f"{given} is the same training under another name (a fixed version, say).",
        recorded, given, paths.uri,
    )


def describe_location(paths: ExperimentPaths) -> str:
    """What is at ``paths.dir``, for an error that says there is no experiment there."""
    storage = paths.storage
    if not storage.exists(paths.dir):
        return "that path does not exist"
    if not storage.isdir(paths.dir):
        return "it is a file, not a folder"
    names = storage.listdir(paths.dir)
    if not names:
        return "the folder is empty"
    experiments = [
        n for n in names if storage.exists(ExperimentPaths.of(storage, n, folder=paths.dir).state)
    ]
    if experiments:
        shown = ", ".join(experiments[:5]) + (" ..." if len(experiments) > 5 else "")
        return (
            f"it is a storage folder that holds experiments ({shown}): pass one of them, e.g. "
            f"{ExperimentPaths.of(storage, experiments[0], folder=paths.dir).uri!r}"
        )
    if "tuner.pkl" in names or any(n.startswith("experiment_state-") for n in names):
        return "it looks like a Ray Tune experiment (tuner.pkl), which ftnb cannot restore"
    shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
    return f"the folder holds no experiment_state.json (it has: {shown})"


def remains_of_experiment(paths: ExperimentPaths, limit: int = 5) -> list[str]:
    """Names of up to ``limit`` files or folders in ``paths.dir`` that belong to an experiment
    (its state's journal segments, trial folders with their ``params.json`` or
    ``result.json``): what is left of one whose state files are both gone."""
    storage = paths.storage
    if not storage.isdir(paths.dir):
        return []
    found = []
    for name in sorted(storage.listdir(paths.dir)):
        if STATE_SEGMENT.match(name) or any(
                storage.exists(storage.join(paths.dir, name, file))
                for file in (PARAMS_FILE, RESULTS_FILE)):
            found.append(name)
            if len(found) >= limit:
                break
    return found


def refuse_remains(paths: ExperimentPaths, what: str) -> None:
    """Raise :class:`RestoreError` when ``paths.dir`` holds what is left of an experiment whose
    state files (the state and its previous generation) are both gone: it cannot be resumed,
    and a new experiment beside its trial folders would mix two in one folder."""
    remains = remains_of_experiment(paths)
    if not remains:
        return
    raise RestoreError(
        f"Cannot {what} {paths.uri}: both generations of its experiment state ({STATE_FILE}, "
        f"{STATE_BACKUP_FILE}) are gone, but the folder still holds an experiment's files "
        f"({', '.join(remains)}{' ...' if len(remains) >= 5 else ''}). ftnb cannot resume it "
        "without its state, and will not start a second experiment beside its trials. Fix: "
        f"put {STATE_FILE} back from a backup, or run under another name (the trials' "
        "result.json files and checkpoints stay readable where they are)."
    )


def load_state(paths: ExperimentPaths, what: str = "restore") -> ExperimentState:
    """The experiment's state, or a :class:`RestoreError` naming what was found instead."""
    if not paths.has_state():
        refuse_remains(paths, what)
        raise RestoreError(
            f"Cannot {what} {paths.uri}: no ftnb experiment there; {describe_location(paths)}. "
            "Fix: pass the experiment's folder, i.e. <storage_path>/<name> (`ftnb ls "
            "<storage_path>` lists them)."
        )
    try:
        return _read_state(paths)
    except StateVersionError as exc:
        raise RestoreError(f"Cannot {what} {paths.uri}: {exc}") from None
    except StateFormatError as exc:
        raise RestoreError(
            f"Cannot {what} {paths.uri}: {exc}. The state and its previous generation are both "
            "unreadable; the trials' result.json files and checkpoints are intact. Fix: put "
            f"{STATE_FILE} back from a backup, or run under another name; ftnb will not start "
            "a second experiment in this folder."
        ) from None


def _read_state(paths: ExperimentPaths) -> ExperimentState:
    """The state (or its previous generation); when neither can be read because a journal
    segment they list is damaged or gone, the state rebuilt from the trials' files
    (:func:`ftnb.core.state_rebuild.rebuild_state`, said by :func:`note_fallbacks`)."""
    from .core.state_rebuild import rebuild_state

    try:
        return ExperimentState.load(paths)
    except StateVersionError:
        raise
    except StateFormatError:
        rebuilt = rebuild_state(paths)
        if rebuilt is None:
            raise
        return rebuilt


def can_restore(path: Any, storage_filesystem: Any = None) -> bool:
    """Whether ``path`` is the folder of an ftnb experiment that can be restored (a readable
    state). False, never an error, for a missing path, an empty folder, a folder of
    something else, or a state this ftnb cannot read."""
    try:
        paths = ExperimentPaths.at(_path_str(path), storage_filesystem)
        if not paths.has_state():
            return False
        _read_state(paths)
        return True
    except (StateFormatError, OSError, ValueError, TypeError):
        return False


def _path_str(path: Any) -> str:
    if isinstance(path, os.PathLike):
        return os.fspath(path)
    if not isinstance(path, str) or not path:
        raise TypeError(
            f"path={path!r} must be the experiment's folder: a local path or an fsspec URL "
            "such as 's3://bucket/experiments/sweep1'."
        )
    return path


# -- planning ----------------------------------------------------------------------------------
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
    from .execution.resources import TrialResources
    from .storage import check_outage_settings
    from .storage.lease import refuse_if_owned, refuse_takeover_of_live_driver

    check_outage_settings()
    check_trainable(trainable, "Tuner.restore")
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
    else:
        refuse_takeover_of_live_driver(paths, what="take over")
    if not allow_different_trainable:
        check_same_trainable(paths, state, callable_name(trainable))
    flags = RestoreFlags(resume_unfinished, resume_errored, restart_errored)
    to_run = {t.trial_id for t in state.trials if flags.will_run(t.status)}
    bound = None
    if param_space is not None:
        from .search import validate_param_space

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


def _restored_searcher(paths: ExperimentPaths, state: ExperimentState, tune_config: TuneConfig,
                       given: Any, bound_space: Any) -> tuple[Any, Any]:
    """The searcher that goes on making the experiment's trials, set up with its space: the one
    ``given`` (``Tuner.restore(search_alg=...)``), or built again from its description in the
    state; ``(None, None)`` for an experiment whose trials were all made when it started."""
    from .core.searching import PersistedSearcher, rebuild_searcher, searcher_settings
    from .search.searcher import Searcher
    from .search.space_json import SpaceNotStoredError, decode_space

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
            raise RestoreError(f"Cannot restore {paths.uri}: its search algorithm needs "
                               f"{exc.name or exc}. Fix: pip install 'ftnb[optuna]'.") from None
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


# -- carrying it out ---------------------------------------------------------------------------
def take_over(plan: RestorePlan, lease: "Lease") -> ExperimentState:
    """Once ``lease`` (the experiment's owner lease) is ours: make sure the previous driver's
    trials are gone, then re-read the state (``plan.state`` becomes the one read) and finish
    what a dead driver left in the folder: its temporary files are removed, the trials' own
    records merged in, and the trial folders it did not lay out created."""
    from .storage.lease import fence_out

    paths = plan.paths
    # The dead (or taken over) driver's trials must be gone before anything of ours runs, so
    # no ghost writes after this point.
    fence_out(paths, lease.previous)
    end_strays_of_driver(lease.previous)
    # Re-read now that we own it: the state may have moved since plan_restore read it.
    state = load_state(paths)
    note_fallbacks(paths, state)
    remove_leftover_temps(paths, state)
    state.merge_trial_records(paths)
    lay_out_trial_folders(paths, state, only_missing=True)
    plan.state = state
    return state


def end_strays_of_driver(previous: Optional["LeaseInfo"]) -> None:
    """End what the trials of a driver that did not release its lease started on this machine
    (a server in its own session, a daemon): they outlive its trial processes, which die with
    it (:func:`ftnb.execution.process_tree.end_strays_of`)."""
    from .storage.lease import host_id

    if previous is not None and not previous.released and previous.host_id == host_id():
        from .execution.process_tree import end_strays_of

        end_strays_of(previous.token)


def take_over_driver(paths: ExperimentPaths, what: str = "take over") -> Optional[str]:
    """What ``--takeover`` does before a resume (``ftnb resume --takeover``, ``%ftresume
    --takeover``, ``handle.resume(takeover=True)``): take the experiment from its driver at
    once (:func:`ftnb.storage.lease.take_over_now`: the old driver is fenced by a new epoch, its
    trials on this machine killed) and return the line that says so; None when no live driver
    held it. Raises :class:`ftnb.ExperimentLockedError` while the driver is provably alive on
    this machine."""
    from .storage.lease import take_over_now

    previous = take_over_now(paths, what)
    if previous is None:
        return None
    end_strays_of_driver(previous)
    silent = max(0.0, time.time() - previous.heartbeat)
    return (f"ftnb: took experiment {paths.name!r} over from its driver ({previous.describe()}, "
            f"last heartbeat {silent:.0f} s ago); should that driver wake up, it finds its lease "
            "taken and stops before writing anything more.")


def note_fallbacks(paths: ExperimentPaths, state: ExperimentState) -> None:
    """Record and say it when ``state`` was not read from the latest state file: from its
    previous generation (the latest was damaged or missing), or rebuilt from the trials' files
    (a journal segment both list was); what happened since is taken from the trials' own
    records and result files, but it must not happen in silence."""
    from .core.state_rebuild import REBUILT

    if state.loaded_from == REBUILT:
        say(state.recoveries[-1:])  # (rebuild_state recorded it)
        return
    if state.loaded_from != paths.state_backup:
        return
    entry = recovery(
        PREVIOUS_STATE,
        f"the experiment state {paths.storage.uri(paths.state)} is damaged or missing; read "
        f"its previous generation ({STATE_BACKUP_FILE}) instead, and the trials' own records "
        "and result files for what happened since.")
    state.recoveries.append(entry)
    say([entry])


def resume_trials(state: ExperimentState, flags: RestoreFlags, trial_files: TrialFiles) -> None:
    """Bring every trial up to date with its files and set it to run (or not) as asked; an
    errored trial that runs again gets a fresh failure budget. Then the state is the
    controller's to run. What it fell back to for damaged files is added to
    ``state.recoveries`` and said (:mod:`ftnb.core.recoveries`)."""
    recoveries: list[dict] = []
    for trial in state.trials:
        status = trial.status
        if status == TrialStatus.TERMINATED:
            continue
        if status == TrialStatus.ERRORED:
            if flags.restart_errored:
                trial_files.reset(trial)
            elif flags.resume_errored:
                recoveries += trial_files.reconcile(trial, state.updated)
            else:
                continue
            trial.failures_forgiven = len(trial.failures)
            trial.error = None
            trial.status = TrialStatus.PENDING.value
            continue
        recoveries += trial_files.reconcile(trial, state.updated)
        if flags.resume_unfinished:
            trial.status = TrialStatus.PENDING.value
        else:
            trial.status = TrialStatus.TERMINATED.value
            trial.note = "not resumed: restored with resume_unfinished=False"
    state.recoveries += recoveries
    say(recoveries)


# -- comparing search spaces -------------------------------------------------------------------
def space_differences(stored: Any, new: Any, path: str = "") -> list[str]:
    """How the encoded space ``new`` differs from ``stored``, one line per difference.

    Objects (ref placeholders) may be replaced by any object; everything else (keys, grid sizes,
    domains, plain values) must be equal.
    """
    where = path or "<the whole space>"
    if is_placeholder(stored) or _is_legacy(stored):
        if is_placeholder(new):
            return []
        return [f"{where}: was an object ({_type_of(stored)}), now {_describe(new)}"]
    if is_placeholder(new):
        return [f"{where}: was {_describe(stored)}, now an object ({_type_of(new)})"]
    if isinstance(stored, dict) and isinstance(new, dict):
        if "grid_search" in stored and "grid_search" in new:
            old_grid, new_grid = stored["grid_search"], new["grid_search"]
            if len(old_grid) != len(new_grid):
                return [
                    f"{path}: grid_search of {len(old_grid)} values, now {len(new_grid)}"
                ]
        out = []
        for key in stored:
            sub = f"{path}/{key}" if path else str(key)
            if key not in new:
                out.append(f"{sub}: missing (it was {_describe(stored[key])})")
            else:
                out.extend(space_differences(stored[key], new[key], sub))
        for key in new:
            if key not in stored:
                sub = f"{path}/{key}" if path else str(key)
                out.append(f"{sub}: new key (not in the original space)")
        return out
    if isinstance(stored, list) and isinstance(new, list):
        if len(stored) != len(new):
            return [f"{where}: a list of {len(stored)} values, now {len(new)}"]
        out = []
        for i, (a, b) in enumerate(zip(stored, new)):
            out.extend(space_differences(a, b, f"{path}[{i}]"))
        return out
    if _same_plain(stored, new):
        return []
    return [f"{where}: was {_describe(stored)}, now {_describe(new)}"]


def _same_plain(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float))
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b
    )


def _is_legacy(value: Any) -> bool:
    return isinstance(value, dict) and _LEGACY_OBJECT in value


def _type_of(placeholder: dict) -> str:
    return str(placeholder.get("type") or placeholder.get(_LEGACY_OBJECT) or "object")


def _describe(value: Any) -> str:
    if is_placeholder(value) or _is_legacy(value):
        return f"an object ({_type_of(value)})"
    if isinstance(value, dict) and "grid_search" in value:
        return f"a grid_search of {len(value['grid_search'])} values"
    if isinstance(value, dict) and "__ftnb_domain__" in value:
        return f"the domain {json.dumps(value, default=str)[:80]}"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# -- re-binding objects ------------------------------------------------------------------------
def needed_objects(configs: dict[str, Any]) -> list[tuple[str, str]]:
    """(key path, type) of every object the given stored configs refer to, without repeats."""
    seen: dict[str, str] = {}
    for config in configs.values():
        for key, placeholder in walk_placeholders(config):
            seen.setdefault(key, _type_of(placeholder))
        for key, legacy in _walk_legacy(config, ""):
            seen.setdefault(key, _type_of(legacy))
    return sorted(seen.items())


def _walk_legacy(value: Any, path: str) -> list[tuple[str, dict]]:
    if _is_legacy(value):
        return [(path, value)]
    out = []
    if isinstance(value, dict) and not is_placeholder(value):
        for k, v in value.items():
            out.extend(_walk_legacy(v, f"{path}/{k}" if path else str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out.extend(_walk_legacy(v, f"{path}[{i}]"))
    return out


def bind_configs(
    state: ExperimentState, stored_configs: dict[str, Any], param_space: Any
) -> tuple[dict[str, Any], Any]:
    """Pair the stored space's objects with those of ``param_space`` and put them into the stored
    configs. Returns (configs by trial id, the re-bound space). Raises :class:`RestoreError`
    listing every difference when the structures differ."""
    bound_space, _ = bind_objects(param_space)
    new_encoded = encode_space(bound_space, encode_value)
    differences = space_differences(state.param_space, new_encoded)
    if differences:
        shown = "\n  ".join(differences[:20])
        more = f"\n  ... and {len(differences) - 20} more" if len(differences) > 20 else ""
        raise RestoreError(
            "Tuner.restore(param_space=...) must have the same structure as the original space: "
            "same keys, same grid sizes and domains, same plain values; only the objects "
            "(models, tensors, datasets, ftnb.put refs) may be given anew. Restoring resumes the "
            f"exact experiment; it cannot change the search. Differences:\n  {shown}{more}\n"
            "Fix: pass the original space with the objects re-created, or start a new "
            "experiment (another name) to search something else."
        )
    refs = {ref.id: ref for ref in _refs_in(bound_space)}
    mapping: dict[str, ObjectRef] = {}
    for (_, old), (_, new) in zip(walk_placeholders(state.param_space),
                                  walk_placeholders(new_encoded)):
        mapping.setdefault(old["__ftnb_ref__"], refs[new["__ftnb_ref__"]])
    configs = {}
    for trial_id, config in stored_configs.items():
        missing = [
            key for key, p in walk_placeholders(config) if p["__ftnb_ref__"] not in mapping
        ]
        if missing or _walk_legacy(config, ""):
            keys = missing or [k for k, _ in _walk_legacy(config, "")]
            raise RestoreError(
                f"Trial {trial_id}'s config holds objects at {', '.join(keys)} that do not come "
                "from the search space (a sample_from function made them), so they cannot be "
                "re-bound. Fix: put such objects in the space itself (or create them inside "
                "the trainable from plain config values)."
            )
        configs[trial_id] = _substitute(config, mapping)
    return configs, bound_space


def _refs_in(value: Any) -> list[ObjectRef]:
    from .search import Domain

    if isinstance(value, ObjectRef):
        return [value]
    if isinstance(value, Domain):
        value = getattr(value, "categories", [])
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _refs_in(v)]
    return []


def _substitute(value: Any, mapping: dict[str, ObjectRef]) -> Any:
    if is_placeholder(value):
        return mapping[value["__ftnb_ref__"]]
    if isinstance(value, dict):
        return {k: _substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, mapping) for v in value)
    return value


def missing_objects_message(paths: ExperimentPaths, trainable_name: str,
                            needed: list[tuple[str, str]]) -> str:
    """The error for a restore without the search space whose trials need the objects
    ``needed`` (:func:`needed_objects`)."""
    keys = ", ".join(f"{key} ({kind})" for key, kind in needed)
    return (
        f"The experiment at {paths.uri} has trials to resume whose configs hold objects that "
        f"are not saved with the experiment: {keys}. Pass the search space again with those "
        f"objects re-created: Tuner.restore({paths.uri!r}, {trainable_name}, "
        "param_space=param_space) (or ftnb.run(..., param_space=param_space)), where "
        "param_space is the original space (same keys, grids and values)."
    )


def stored_configs(state: ExperimentState, trial_ids: Optional[set] = None) -> dict[str, Any]:
    """The trials' configs as stored (objects as placeholders), by trial id: all of them, or
    those of ``trial_ids``."""
    return {
        t.trial_id: t.config for t in state.trials if trial_ids is None or t.trial_id in trial_ids
    }


def with_originals(configs: dict, original: Any, bound: Any) -> dict:
    """The configs with each ref that ``bind_objects`` made replaced by the caller's own object
    (what ``Result.config`` should show), pairing the original and bound spaces by position."""
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


def restored_scheduler(paths: ExperimentPaths, state: ExperimentState, given: Any) -> Any:
    """The trial scheduler a restore goes on with: ``given`` (``Tuner.restore(scheduler=...)``,
    ``ftnb.run``'s ``TuneConfig(scheduler=...)``) when it is the one the experiment ran with,
    else the stored one rebuilt (ftnb's schedulers); None for an experiment run without one.
    Raises :class:`RestoreError` for a different scheduler, one added to an experiment run
    without, and a class of the user's not given again."""
    from .schedulers import (
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
