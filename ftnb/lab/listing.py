"""The experiments in a folder, as the panel's list shows them (``GET ftnb/api/experiments``).

Each experiment is one :class:`ftnb.ui.read_model.ListedExperiment` of
:func:`ftnb.ui.read_model.list_folder`: its summary, status as read, through the folder's index
(``.ftnb-index/``, kept by the drivers: :mod:`ftnb.storage.experiment_index`) where it can,
plus its driver and resume line when it is running or was interrupted. A listing of a folder of
ended experiments is a few requests (the folder, the index, its snapshot), plus one for each
experiment whose state says RUNNING (its owner lease: a dead driver reads as INTERRUPTED) and
one full read for each experiment the index does not know (made by an older ftnb, or copied
in). What a listing read is remembered for the next one (:class:`EndedExperiments`).
"""

from __future__ import annotations

from typing import Callable, Optional

from ..core.records import ExperimentStatus, StateFormatError
from ..storage import ExperimentPaths, Storage
from ..ui import read_model
from ..ui.read_model import ListedExperiment, ListingMemory

__all__ = ["UNREADABLE", "EndedExperiments", "experiment_entry", "list_experiments"]

UNREADABLE = "UNREADABLE"


class EndedExperiments(ListingMemory):
    """What the panel's server remembers between listings of a folder (see
    :class:`ftnb.ui.read_model.ListingMemory`): the index entries it read, with their
    versions; the full reads of experiments whose driver is gone, while neither their entry
    nor their lease changes; and on a local disk the full reads of ended experiments the index
    does not know, while their state file stays the same (one ``stat``). Thread-safe."""


def list_experiments(storage: Storage, folder: str,
                     holds: Optional[Callable[[str], bool]] = None,
                     ended: Optional[EndedExperiments] = None) -> list[dict]:
    """The entries (:func:`experiment_entry`) of the experiments in ``folder``: most recent
    activity first, unreadable ones last. ``holds(path)``: whether a child folder (a local one
    with its symlinks resolved) may be read; children that fail it are left out. ``ended``:
    what is remembered between listings."""
    listed = read_model.list_folder(storage, folder, holds=holds, lines=True, memory=ended)
    entries = [_entry(item) for item in listed]
    readable = sorted((e for e in entries if e["status"] != UNREADABLE),
                      key=lambda e: (-(e["last_activity"] or 0.0), e["name"]))
    broken = sorted((e for e in entries if e["status"] == UNREADABLE), key=lambda e: e["name"])
    return readable + broken


def experiment_entry(paths: ExperimentPaths) -> Optional[dict]:
    """One experiment as the panel's list shows it (the shape is in
    :mod:`ftnb.lab.handlers`), read in full; None when the folder holds no experiment."""
    listed = read_model.read_experiment(paths, lines=True)
    return None if listed is None else _entry(listed)


def _entry(listed: ListedExperiment) -> dict:
    paths, summary = listed.paths, listed.summary
    if summary is None:
        exc = listed.error
        error = (str(exc) if isinstance(exc, StateFormatError)
                 else f"{type(exc).__name__}: {exc}")
        return _unreadable(paths, error)
    entry = {
        "name": summary.name, "path": summary.path, "status": summary.status,
        "trials": summary.counts, "num_trials": summary.trials, "failures": summary.failures,
        "preemptions": summary.preemptions, "last_activity": summary.updated,
        "live": False, "driver": None, "resume_line": listed.resume_line, "error": None,
        "takeover": listed.takeover,
    }
    driver = listed.driver
    if driver is not None and summary.status in (ExperimentStatus.RUNNING,
                                                 ExperimentStatus.INTERRUPTED):
        entry["live"] = driver.alive
        if driver.lease is not None:
            entry["driver"] = {"pid": driver.lease.pid, "host": driver.lease.host,
                               "alive": driver.alive,
                               "line": driver.line(ExperimentStatus.RUNNING) or None,
                               "silent_s": summary.driver_silent_s,
                               "dead_in_s": summary.driver_dead_in_s}
    return read_model.finite(entry)


def _unreadable(paths: ExperimentPaths, error: str) -> dict:
    return {"name": paths.name, "path": paths.uri, "status": UNREADABLE, "trials": {},
            "num_trials": None, "failures": None, "preemptions": None, "last_activity": None,
            "live": False, "driver": None, "resume_line": None, "takeover": None,
            "error": error}
