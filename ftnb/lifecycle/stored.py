"""Finding a stored experiment: :func:`load_state` reads its state or raises a
:class:`RestoreError` saying what is at the path instead; :func:`can_restore` asks without
raising; :func:`refuse_remains` refuses a folder whose state files are both gone while its
trials' files remain. Reading writes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.records import ExperimentState, StateFormatError, StateVersionError
from ..storage import (
    PARAMS_FILE,
    RESULTS_FILE,
    STATE_BACKUP_FILE,
    STATE_FILE,
    ExperimentPaths,
)
from ..storage.file_names import STATE_SEGMENT

__all__ = [
    "DifferentTrainableError",
    "RestoreError",
    "can_restore",
    "check_same_trainable",
    "describe_location",
    "load_state",
    "refuse_remains",
    "remains_of_experiment",
]


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
    from ..core.state_rebuild import rebuild_state

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
        paths = ExperimentPaths.at(path_str(path), storage_filesystem)
        if not paths.has_state():
            return False
        _read_state(paths)
        return True
    except (StateFormatError, OSError, ValueError, TypeError):
        return False


def path_str(path: Any) -> str:
    if isinstance(path, os.PathLike):
        return os.fspath(path)
    if not isinstance(path, str) or not path:
        raise TypeError(
            f"path={path!r} must be the experiment's folder: a local path or an fsspec URL "
            "such as 's3://bucket/experiments/sweep1'."
        )
    return path
