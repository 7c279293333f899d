"""The experiments in a folder, as the panel's list shows them (``GET ftnb/api/experiments``).

Each experiment is one :func:`ftnb.ui.read_model.summarize` (its state file; its owner lease
when the state says RUNNING), plus its driver and resume line when it is running or was
interrupted. A folder is listed once; on remote storage the experiments are then read
concurrently (each read is a round trip), on a local disk one after the other (each read is a
few microseconds of system time, which threads would only contend for).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from ..core.records import ExperimentState, ExperimentStatus, StateFormatError
from ..storage import ExperimentPaths, Storage
from ..ui import read_model
from ..ui.location import visible_names
from ..ui.read_model import ResumeContext

__all__ = ["REMOTE_READERS", "experiment_entry", "list_experiments"]

#: How many experiments of a remote storage are read at once.
REMOTE_READERS = 32

_LIVE_OR_INTERRUPTED = (ExperimentStatus.RUNNING, ExperimentStatus.INTERRUPTED)
UNREADABLE = "UNREADABLE"


def list_experiments(storage: Storage, folder: str,
                     holds: Optional[Callable[[str], bool]] = None) -> list[dict]:
    """The entries (:func:`experiment_entry`) of the experiments in ``folder``: most recent
    activity first, unreadable ones last. ``holds(path)``: whether a child folder (a local one
    with its symlinks resolved) may be read; children that fail it are left out."""
    names = visible_names(storage.listdir(folder))
    children = [ExperimentPaths.of(storage, name, folder) for name in names]
    if holds is not None and storage.is_local:
        children = [p for p in children if holds(os.path.realpath(p.dir))]
    if storage.is_local or len(children) < 2:
        entries = [experiment_entry(p) for p in children]
    else:
        with ThreadPoolExecutor(min(REMOTE_READERS, len(children)),
                                thread_name_prefix="ftnb-lab-list") as pool:
            entries = list(pool.map(experiment_entry, children))
    found = [e for e in entries if e is not None]
    readable = sorted((e for e in found if e["status"] != UNREADABLE),
                      key=lambda e: (-(e["last_activity"] or 0.0), e["name"]))
    broken = sorted((e for e in found if e["status"] == UNREADABLE), key=lambda e: e["name"])
    return readable + broken


def experiment_entry(paths: ExperimentPaths) -> Optional[dict]:
    """One experiment as the panel's list shows it (the shape is in
    :mod:`ftnb.lab.handlers`), or None when the folder holds no experiment."""
    try:
        summary = read_model.summarize(paths)
    except StateFormatError as exc:
        if not _has_state(paths):
            return None  # a folder of something else
        return _unreadable(paths, str(exc))
    except Exception as exc:  # permission denied, a backend error: still list the others
        return _unreadable(paths, f"{type(exc).__name__}: {exc}")
    entry = {
        "name": summary.name, "path": summary.path, "status": summary.status,
        "trials": summary.counts, "num_trials": summary.trials, "failures": summary.failures,
        "preemptions": summary.preemptions, "last_activity": summary.updated,
        "live": False, "driver": None, "resume_line": None, "error": None,
    }
    if summary.status in _LIVE_OR_INTERRUPTED:
        driver = read_model.read_driver(paths)
        entry["live"] = driver.alive
        if driver.lease is not None:
            entry["driver"] = {"pid": driver.lease.pid, "host": driver.lease.host,
                               "alive": driver.alive,
                               "line": driver.line(ExperimentStatus.RUNNING) or None}
    if summary.status == ExperimentStatus.INTERRUPTED:
        try:
            state = ExperimentState.load(paths)
            entry["resume_line"] = read_model.resume_line(paths, state, ResumeContext.MAGICS)
        except Exception:
            pass  # the entry still says INTERRUPTED; its page says how to resume
    return read_model.finite(entry)


def _has_state(paths: ExperimentPaths) -> bool:
    try:
        return paths.has_state()
    except Exception:
        return True  # the storage cannot say: show it as unreadable rather than hide it


def _unreadable(paths: ExperimentPaths, error: str) -> dict:
    return {"name": paths.name, "path": paths.uri, "status": UNREADABLE, "trials": {},
            "num_trials": None, "failures": None, "preemptions": None, "last_activity": None,
            "live": False, "driver": None, "resume_line": None, "error": error}
