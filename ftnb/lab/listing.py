"""The experiments in a folder, as the panel's list shows them (``GET ftnb/api/experiments``).

Each experiment is one :func:`ftnb.ui.read_model.summarize` (its state file; its owner lease
when the state says RUNNING), plus its driver and resume line when it is running or was
interrupted. A folder is listed once; on remote storage the experiments are then read
concurrently (each read is a round trip), on a local disk one after the other (each read is a
few microseconds of system time, which threads would only contend for), reusing the entries of
ended experiments whose state file did not change (:class:`EndedExperiments`).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from ..core.records import ExperimentState, ExperimentStatus, StateFormatError
from ..storage import ExperimentPaths, Storage
from ..ui import read_model
from ..ui.location import visible_names
from ..ui.read_model import ResumeContext

__all__ = ["REMOTE_READERS", "EndedExperiments", "experiment_entry", "list_experiments"]

#: How many experiments of a remote storage are read at once.
REMOTE_READERS = 32

_LIVE_OR_INTERRUPTED = (ExperimentStatus.RUNNING, ExperimentStatus.INTERRUPTED)
_ENDED = (ExperimentStatus.FINISHED, ExperimentStatus.ERRORED)
UNREADABLE = "UNREADABLE"


class EndedExperiments:
    """The entries of ended experiments (FINISHED, ERRORED) on a local disk, each with the
    version of the state file it was read from (its inode, mtime and size: one ``stat``). Such
    an entry changes only with its state file (a resume rewrites it), so a listing that finds
    the same version reuses it: a panel that refreshes a thousand finished experiments costs a
    thousand ``stat`` calls, not a thousand JSON parses. Thread-safe."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple, dict]] = {}
        self._lock = threading.Lock()

    def entry(self, paths: ExperimentPaths) -> Optional[dict]:
        """:func:`experiment_entry`, reused while its state file is the same."""
        try:
            version = paths.storage.cheap_version(paths.state)
        except OSError:
            version = None  # no state file (yet, or only the previous generation): read it
        if version is not None:
            with self._lock:
                known = self._entries.get(paths.dir)
            if known is not None and known[0] == version:
                return known[1]
        # The version was taken before the read: a state replaced in between is read again
        # at the next listing, never kept under a version it does not have.
        entry = experiment_entry(paths)
        if version is not None and entry is not None and entry["status"] in _ENDED:
            with self._lock:
                self._entries[paths.dir] = (version, entry)
        return entry


def list_experiments(storage: Storage, folder: str,
                     holds: Optional[Callable[[str], bool]] = None,
                     ended: Optional[EndedExperiments] = None) -> list[dict]:
    """The entries (:func:`experiment_entry`) of the experiments in ``folder``: most recent
    activity first, unreadable ones last. ``holds(path)``: whether a child folder (a local one
    with its symlinks resolved) may be read; children that fail it are left out. ``ended``:
    where a local disk's ended experiments are remembered between listings."""
    names = visible_names(storage.listdir(folder))
    children = [ExperimentPaths.of(storage, name, folder) for name in names]
    if holds is not None and storage.is_local:
        children = [p for p in children if holds(os.path.realpath(p.dir))]
    if storage.is_local:
        read = ended.entry if ended is not None else experiment_entry
        entries = [read(p) for p in children]
    elif len(children) < 2:
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
                               "line": driver.line(ExperimentStatus.RUNNING) or None,
                               "silent_s": summary.driver_silent_s,
                               "dead_in_s": summary.driver_dead_in_s}
    silent = summary.driver_silent_s is not None
    entry["takeover"] = None
    if summary.status == ExperimentStatus.INTERRUPTED or silent:
        try:
            state = ExperimentState.load(paths)
            line = read_model.resume_line(paths, state, ResumeContext.MAGICS, takeover=silent)
        except Exception:
            line = None  # the entry still says INTERRUPTED; its page says how to resume
        entry["takeover" if silent else "resume_line"] = line
    return read_model.finite(entry)


def _has_state(paths: ExperimentPaths) -> bool:
    try:
        return paths.has_state()
    except Exception:
        return True  # the storage cannot say: show it as unreadable rather than hide it


def _unreadable(paths: ExperimentPaths, error: str) -> dict:
    return {"name": paths.name, "path": paths.uri, "status": UNREADABLE, "trials": {},
            "num_trials": None, "failures": None, "preemptions": None, "last_activity": None,
            "live": False, "driver": None, "resume_line": None, "takeover": None,
            "error": error}
