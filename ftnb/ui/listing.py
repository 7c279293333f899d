"""The experiments of a storage folder, as every list of them shows them (``ftnb ls``, the
JupyterLab panel): each one's :class:`~ftnb.ui.status.ExperimentSummary`, status as read,
through the folder's index (:mod:`ftnb.storage.experiment_index`) where it can. Part of the read
model (:mod:`ftnb.ui.read_model`).

A listing lists the folder and its index (concurrently on remote storage), then:

* an experiment whose entry says FINISHED or ERRORED is its entry (an ended experiment changes
  only when a driver resumes it, and that driver rewrites the entry);
* an entry that says RUNNING or INTERRUPTED is checked against the experiment's owner lease
  (all of them in one batch read), with the verdict every view gives
  (:class:`~ftnb.ui.status.DriverStatus`): a live driver whose token wrote a RUNNING entry,
  and that is not silent, makes it its entry; any other live driver (silent: the takeover line
  needs the state; or one that has not written its entry yet) gets the experiment read in
  full; a gone driver's experiment reads as INTERRUPTED with its trials' own records merged,
  read in full (:func:`read_experiment`) and, for a caller that lists again, remembered while
  its entry and its lease stay the same (an INTERRUPTED entry is its summary, but the resume
  line needs the state);
* an experiment with no valid entry (written by an ftnb that kept no index, copied in, or its
  driver could not write it) is read in full;
* an entry whose experiment folder is gone (deleted, moved) is ignored.

So a folder of ended experiments lists in a few requests (the folder, the index, its snapshot),
plus one for each entry that changed since the snapshot, plus one for each experiment whose
state says RUNNING; the answer is the one :func:`read_experiment` would give each experiment.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..core.index_upkeep import lease_digest, parse_lease
from ..core.records import ExperimentState, ExperimentStatus, StateFormatError
from ..storage import ExperimentPaths, Storage, default_storage_path
from ..storage.experiment_index import FolderIndex, IndexEntry, read_files, read_index
from .location import visible_names
from .resume_lines import ResumeContext, resume_line
from .status import DriverStatus, ExperimentSummary, read_driver, summarize

__all__ = ["REMOTE_READERS", "ListedExperiment", "ListingMemory", "list_folder",
           "read_experiment"]

#: How many experiments of a remote storage are read in full at once.
REMOTE_READERS = 32

_RUNNING = ExperimentStatus.RUNNING.value
_INTERRUPTED = ExperimentStatus.INTERRUPTED.value
_LIVE_OR_INTERRUPTED = (_RUNNING, _INTERRUPTED)
_ENDED = (ExperimentStatus.FINISHED.value, ExperimentStatus.ERRORED.value)


@dataclass(frozen=True)
class ListedExperiment:
    """One experiment of a folder as a listing found it.

    ``summary``: status as read (None when unreadable: ``error`` is the exception).
    ``driver``: its owner lease's verdict now, for an experiment whose state says RUNNING or
    INTERRUPTED (else None). ``resume_line`` (INTERRUPTED) and ``takeover`` (a silent driver):
    the lines a notebook user runs, when the listing was asked for them. ``indexed``: whether
    it came from the folder's index rather than a read of the experiment.
    """

    paths: ExperimentPaths
    summary: Optional[ExperimentSummary] = None
    driver: Optional[DriverStatus] = None
    resume_line: Optional[str] = None
    takeover: Optional[str] = None
    error: Optional[Exception] = None
    indexed: bool = False


@dataclass
class _FolderMemory:
    entries: dict = field(default_factory=dict)  # index file -> IndexEntry; the snapshot as read
    gone: dict = field(default_factory=dict)  # name -> ((entry version, lease, context), ...)
    ended: dict = field(default_factory=dict)  # experiment folder -> ((state version, lines), ...)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ListingMemory:
    """What a caller that lists again and again (the panel's server) keeps between listings,
    for each folder: the index entries read (with their versions), the full reads of
    experiments whose driver is gone (with the entry version and the lease they were read
    under), and on a local disk the full reads of ended experiments without an entry (with
    their state file's version). Thread-safe: listings of one folder take turns."""

    def __init__(self) -> None:
        self._folders: dict[str, _FolderMemory] = {}
        self._lock = threading.Lock()

    def of(self, storage: Storage, folder: str) -> _FolderMemory:
        key = storage.uri(folder)
        with self._lock:
            return self._folders.setdefault(key, _FolderMemory())


def list_folder(storage: Storage, folder: str, *, holds: Optional[Callable[[str], bool]] = None,
                lines: bool = False, memory: Optional[ListingMemory] = None
                ) -> list[ListedExperiment]:
    """The experiments in ``folder``, by name (folders that hold no experiment are left out).

    ``holds(path)``: whether a child folder (a local one, its symlinks resolved) may be read;
    the others are left out. ``lines``: compute the resume and takeover lines (a notebook's:
    ``%ftresume`` with the magics). ``memory``: what to keep for the next listing."""
    memory = (memory if memory is not None else ListingMemory()).of(storage, folder)
    with memory.lock:
        return _list_folder(storage, folder, holds, lines, memory)


def _list_folder(storage: Storage, folder: str, holds: Optional[Callable[[str], bool]],
                 lines: bool, memory: _FolderMemory) -> list[ListedExperiment]:
    names, index = _list_with_index(storage, folder, memory)
    entries = index.entries
    children = {n: ExperimentPaths.of(storage, n, folder) for n in visible_names(names)}
    if holds is not None and storage.is_local:
        children = {n: p for n, p in children.items() if holds(os.path.realpath(p.dir))}
    found: dict[str, ListedExperiment] = {}
    unread: list[tuple[ExperimentPaths, Optional[DriverStatus], Optional[tuple]]] = []
    checked: dict[str, tuple[ExperimentPaths, IndexEntry]] = {}
    for name, paths in children.items():
        entry = entries.get(name)
        if entry is None:
            unread.append((paths, None, None))
        elif entry.status in _ENDED:
            found[name] = ListedExperiment(paths, _summary(paths, entry), indexed=True)
        elif entry.status in _LIVE_OR_INTERRUPTED:
            checked[name] = (paths, entry)
        else:
            unread.append((paths, None, None))
    leases = read_files(storage, [paths.lease for paths, _ in checked.values()])
    context = default_storage_path() if lines else None
    for name, (paths, entry) in checked.items():
        raw = leases.get(paths.lease)
        if isinstance(raw, Exception) and not isinstance(raw, FileNotFoundError):
            unread.append((paths, None, None))  # the storage did not answer: read it all
            continue
        raw = raw if isinstance(raw, bytes) else None
        driver = DriverStatus.of(parse_lease(raw))
        if driver.alive:
            lease = driver.lease
            ours = lease is not None and entry.token in (None, lease.token)
            if entry.status == _RUNNING and ours and not driver.silent:
                found[name] = ListedExperiment(paths, _summary(paths, entry), driver,
                                               indexed=True)
            else:  # silent (the takeover line needs the state), or a driver that has not
                unread.append((paths, driver, None))  # written its entry yet (a resume)
            continue
        # Its state says INTERRUPTED, or RUNNING with its driver gone: what a full read gives
        # stays the same while neither the entry nor the lease changes.
        key = (tuple(entry.version or ()), raw, context)
        known = memory.gone.get(name)
        if (known is None or known[0] != key) and entry.status == _RUNNING:
            read = _from_snapshot(paths, index.gone.get(name), raw, key, lines)
            if read is not None:
                known = memory.gone[name] = read
        if known is not None and known[0] == key:
            summary, line = known[1], known[2]
            found[name] = ListedExperiment(paths, summary, driver, resume_line=line,
                                           indexed=True)
        elif entry.status == _INTERRUPTED and not lines:
            found[name] = ListedExperiment(paths, _summary(paths, entry), driver, indexed=True)
        else:
            unread.append((paths, driver, key))
    for (paths, driver, key), listed in zip(unread, _read_all(storage, unread, lines, memory)):
        if listed is None:
            continue
        found[paths.name] = listed
        summary = listed.summary
        if (key is not None and summary is not None and summary.status == _INTERRUPTED
                and summary.driver_silent_s is None):
            memory.gone[paths.name] = (key, summary, listed.resume_line)
    for name in [n for n in memory.gone if n not in children]:
        del memory.gone[name]
    dirs = {p.dir for p in children.values()}
    for gone in [d for d in memory.ended if d not in dirs]:
        del memory.ended[gone]
    return [found[name] for name in sorted(found)]


def read_experiment(paths: ExperimentPaths, lines: bool = False,
                    driver: Optional[DriverStatus] = None) -> Optional[ListedExperiment]:
    """One experiment read in full: its state (and, where it says RUNNING or INTERRUPTED, its
    owner lease; ``driver``: as the caller just read it); None when the folder holds no
    experiment. Never raises: an unreadable one comes back with its ``error``."""
    try:
        state = ExperimentState.load(paths)
        if state.status not in _LIVE_OR_INTERRUPTED:
            driver = None
        elif driver is None:
            driver = read_driver(paths)
        summary = summarize(paths, state=state, driver=driver)
    except (StateFormatError, NotADirectoryError) as exc:
        if not _has_state(paths):
            return None  # a folder of something else, or a file
        return ListedExperiment(paths, error=exc)
    except Exception as exc:  # permission denied, a backend error: still list the others
        return ListedExperiment(paths, error=exc)
    silent = summary.driver_silent_s is not None
    line = None
    if lines and (summary.status == _INTERRUPTED or silent):
        try:
            line = resume_line(paths, state, ResumeContext.MAGICS, takeover=silent)
        except Exception:
            line = None  # the entry still says INTERRUPTED; its page says how to resume
    return ListedExperiment(paths, summary, driver,
                            resume_line=None if silent else line,
                            takeover=line if silent else None)


# -- helpers -------------------------------------------------------------------------------------
def _list_with_index(storage: Storage, folder: str, memory: _FolderMemory
                     ) -> tuple[list[str], FolderIndex]:
    """The folder's names and its index: two listings, at once on remote storage. An index
    that cannot be read is as good as none (everything is read in full)."""

    def entries() -> FolderIndex:
        try:
            return read_index(storage, folder, memory.entries)
        except Exception:
            return FolderIndex()

    if storage.is_local:
        return storage.listdir(folder), entries()
    with ThreadPoolExecutor(1, thread_name_prefix="ftnb-index") as pool:
        index = pool.submit(entries)
        names = storage.listdir(folder)
        return names, index.result()


def _read_all(storage: Storage, unread: list, lines: bool,
              memory: _FolderMemory) -> list[Optional[ListedExperiment]]:
    if storage.is_local:
        return [_read_local(paths, lines, driver, memory) for paths, driver, _ in unread]
    if len(unread) < 2:
        return [read_experiment(paths, lines, driver) for paths, driver, _ in unread]
    with ThreadPoolExecutor(min(REMOTE_READERS, len(unread)),
                            thread_name_prefix="ftnb-list") as pool:
        return list(pool.map(lambda item: read_experiment(item[0], lines, item[1]), unread))


def _read_local(paths: ExperimentPaths, lines: bool, driver: Optional[DriverStatus],
                memory: _FolderMemory) -> Optional[ListedExperiment]:
    """:func:`read_experiment` on a local disk, reusing the read of an ended experiment (it
    changes only with its state file) while its state file is the same (one ``stat``)."""
    try:
        version = paths.storage.cheap_version(paths.state)
    except OSError:
        version = None  # no state file (yet, or only the previous generation): read it
    if version is not None:
        known = memory.ended.get(paths.dir)
        if known is not None and known[0] == (version, lines):
            return known[1]
    # The version was taken before the read: a state replaced in between is read again at the
    # next listing, never kept under a version it does not have.
    listed = read_experiment(paths, lines, driver)
    if (version is not None and listed is not None and listed.summary is not None
            and listed.summary.status in _ENDED):
        memory.ended[paths.dir] = ((version, lines), listed)
    return listed


def _summary(paths: ExperimentPaths, entry: IndexEntry) -> ExperimentSummary:
    return ExperimentSummary(name=paths.name, path=paths.uri, status=entry.status,
                             trials=entry.trials, counts=dict(entry.counts),
                             failures=entry.failures, preemptions=entry.preemptions,
                             updated=entry.updated)


def _from_snapshot(paths: ExperimentPaths, item: Optional[dict], raw: Optional[bytes],
                   key: tuple, lines: bool) -> Optional[tuple]:
    """What the snapshot says of an experiment whose driver is gone (a driver that ended read
    it: :func:`ftnb.core.index_upkeep.gone_summaries`), as :attr:`_FolderMemory.gone` keeps
    it; None unless it was read under this very lease (and, for ``lines``, it has what the
    resume line is made of)."""
    if not isinstance(item, dict) or item.get("lease") != lease_digest(raw):
        return None
    try:
        fields = item["summary"]
        counts = fields["counts"]
        summary = ExperimentSummary(
            name=paths.name, path=paths.uri, status=str(fields["status"]),
            trials=int(fields["trials"]),
            counts={str(k): int(v) for k, v in counts.items()},
            failures=int(fields["failures"]), preemptions=int(fields["preemptions"]),
            updated=float(fields["updated"]))
        line = None
        if lines:
            header = item["resume"]
            state = ExperimentState(name=str(header["name"]),
                                    trainable=str(header["trainable"]),
                                    settings=dict(header["settings"]),
                                    param_space=header["param_space"])
            line = resume_line(paths, state, ResumeContext.MAGICS)
    except Exception:
        return None  # written by another ftnb, or damaged: read the experiment
    return key, summary, line


def _has_state(paths: ExperimentPaths) -> bool:
    try:
        return paths.has_state()
    except Exception:
        return True  # the storage cannot say: show it as unreadable rather than hide it

