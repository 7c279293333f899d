"""What is at a path: an experiment, a storage folder of experiments, a trial's folder, ...

:func:`locate` says what a folder is; :func:`experiment_paths` resolves a name or a folder as
:func:`ftnb.attach` takes it; :func:`experiment_names` lists a storage folder;
:func:`same_storage_path` compares two storage paths as a user may write them. Part of the read
model (:mod:`ftnb.ui.read_model`).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..storage import (
    STATE_BACKUP_FILE,
    STATE_FILE,
    ExperimentPaths,
    Storage,
    default_storage_path,
)

__all__ = [
    "Found",
    "Location",
    "experiment_names",
    "experiment_paths",
    "is_experiment",
    "locate",
    "names_a_folder",
    "same_storage_path",
    "visible_names",
]


def names_a_folder(text: str) -> bool:
    """Whether ``text`` names an experiment's folder (a path or a URL), not a name under a
    storage path."""
    return "://" in text or os.sep in text or text.startswith((".", "~"))


def experiment_paths(name_or_path: str, storage_path: Optional[str] = None,
                     filesystem: Any = None) -> ExperimentPaths:
    """The experiment ``name_or_path`` names, as :func:`ftnb.attach` takes it: its folder (a
    path or a URL), or its name under ``storage_path`` (default ``$FTNB_STORAGE_PATH``, else
    ``~/ftnb_results``). Whether one is there: :func:`is_experiment`."""
    if names_a_folder(name_or_path):
        return ExperimentPaths.at(os.path.expanduser(name_or_path), filesystem)
    storage = Storage(storage_path or default_storage_path(), filesystem)
    return ExperimentPaths.of(storage, name_or_path)


def is_experiment(storage: Storage, folder: str) -> bool:
    """Whether ``folder`` holds an experiment (its state, or at least the previous generation);
    False when the storage cannot say."""
    try:
        return ExperimentPaths(storage, folder).has_state()
    except Exception:
        return False


def visible_names(names: Iterable[str]) -> list[str]:
    """``names`` without hidden entries (ftnb's own temporaries, the OS's)."""
    return [n for n in names if not n.startswith(".")]


def experiment_names(storage: Storage, folder: Optional[str] = None) -> list[str]:
    """The names of the experiments in ``folder`` (default: the storage's root), sorted."""
    folder = storage.root if folder is None else folder
    return [n for n in visible_names(storage.listdir(folder))
            if is_experiment(storage, ExperimentPaths.of(storage, n, folder).dir)]


class Found(str, enum.Enum):
    """What :func:`locate` found at a path."""

    EXPERIMENT = "experiment"  # a folder that holds an experiment
    MISSING = "missing"
    STATE_FILE = "state_file"  # an experiment's state file: its folder is the experiment
    FILE = "file"  # any other file
    STORAGE = "storage"  # a folder of experiments (a storage path)
    TRIAL = "trial"  # a folder inside an experiment's folder
    EMPTY = "empty"  # an empty folder (hidden entries aside)
    OTHER = "other"  # a folder of something else


@dataclass(frozen=True)
class Location:
    """What is at ``path`` of ``storage``. ``names``: the experiments in a STORAGE folder, the
    entries of an OTHER one."""

    found: Found
    storage: Storage
    path: str
    names: tuple[str, ...] = ()

    @property
    def experiment(self) -> Optional[ExperimentPaths]:
        """The experiment when the path is one, else None."""
        return ExperimentPaths(self.storage, self.path) if self.found is Found.EXPERIMENT else None


def locate(storage: Storage, path: Optional[str] = None) -> Location:
    """What is at ``path`` (default: the storage's root). The storage's own errors (no
    credentials, no network) propagate."""
    path = storage.root if path is None else path
    if not storage.exists(path):
        return Location(Found.MISSING, storage, path)
    if not storage.isdir(path):
        base = path.replace(os.sep, "/").rsplit("/", 1)[-1]
        state_file = base in (STATE_FILE, STATE_BACKUP_FILE)
        return Location(Found.STATE_FILE if state_file else Found.FILE, storage, path)
    if is_experiment(storage, path):
        return Location(Found.EXPERIMENT, storage, path)
    names = visible_names(storage.listdir(path))
    if not names:
        return Location(Found.EMPTY, storage, path)
    experiments = [n for n in names
                   if is_experiment(storage, ExperimentPaths.of(storage, n, path).dir)]
    if experiments:
        return Location(Found.STORAGE, storage, path, tuple(experiments))
    parent = storage.parent(path)
    if parent and parent != path and is_experiment(storage, parent):
        return Location(Found.TRIAL, storage, path)
    return Location(Found.OTHER, storage, path, tuple(names))


def same_storage_path(a: str, b: str) -> bool:
    """Whether two storage paths (folders or URLs, as a user may write them) are the same."""
    return _norm(a) == _norm(b)


def _norm(path: str) -> str:
    if "://" in path:
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))

