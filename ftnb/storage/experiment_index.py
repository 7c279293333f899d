"""The index of a storage folder: one small summary per experiment, kept by its driver, so that
listing a folder of a thousand experiments on an object store costs a few requests, not a
thousand state reads.

Layout, beside the experiments it indexes::

    <storage_path>/
      .ftnb-index/
        <name>.json          one entry per experiment (its name percent-quoted), written by
                             the experiment's driver: status as stored, trial counts, failures,
                             preemptions, created/updated, the driver's lease token
        .snapshot.json       every entry at once, each with the version of the entry file it
                             copies: a cache, rewritten by each driver as it ends
      sweep1/  sweep2/ ...   the experiments

**Concurrency.** Each entry has one writer, the driver that holds the experiment's owner lease,
and entries of different experiments are different files, so drivers never contend: nothing
needs an append, a lock or a compare-and-swap, and no driver can lose another's entry (on a
local disk, NFS or an object store alike). A driver replaces its entry atomically
(:meth:`Storage.write_atomic`) when the summary changes, and at most every
:data:`REFRESH_S` seconds for its ``updated`` time; on remote storage from a thread, off the
driver's loop; its last save writes the final entry before the lease is released.

The snapshot is a cache: :func:`read_index` lists the entries' versions (one ``scandir``, or
one paginated LIST) and reads the snapshot; an entry whose listed version equals the one the
snapshot copied is taken from the snapshot, the others are read (all at once: fsspec's batch
``cat``, concurrent on S3). Each driver folds the entries into it as it ends
(:func:`compact_index`), so a listing reads one by one only the entries of experiments that ran
since. Two drivers that end at once both write a correct snapshot (the last wins), since
every item in it is checked against the listed version before it is used: a stale snapshot
costs reads, never a wrong answer. Readers never write (``ftnb ls`` and the panel only read).

**What the index does not know**, and its readers (:mod:`ftnb.ui.listing`) handle: whether a
driver is alive (an entry that says RUNNING is checked against the owner lease, as every view
checks it), experiments written by an ftnb that kept no index, or copied in (no entry: read in
full), and experiments deleted or moved away (an entry whose folder is gone is ignored).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .backend import Storage
from .file_versions import _listed_versions
from .outage import call_deadline
from .paths import ExperimentPaths

__all__ = [
    "INDEX_DIR",
    "INDEX_FORMAT",
    "INDEX_FORMAT_VERSION",
    "REFRESH_S",
    "SNAPSHOT_FILE",
    "FolderIndex",
    "IndexEntry",
    "IndexEntryWriter",
    "read_files",
    "compact_index",
    "read_index",
]

INDEX_DIR = ".ftnb-index"
SNAPSHOT_FILE = ".snapshot.json"
INDEX_FORMAT = "ftnb.index-entry"
SNAPSHOT_FORMAT = "ftnb.index-snapshot"
INDEX_FORMAT_VERSION = 1
#: A running driver rewrites an unchanged entry at most this often (its ``updated`` time: the
#: listing's "last activity"); a change of status or counts is written at the next state save.
REFRESH_S = 10.0
#: How many files one batch read asks for at once (each batch gets its own call deadline).
_BATCH = 256
#: How long the entry-writing thread of a driver on remote storage waits for work before it
#: ends (a driver saves every second while it runs).
_IDLE_S = 30.0

_RUNNING = "RUNNING"
_LIVE_STATUSES = frozenset(("RUNNING", "INTERRUPTED"))


def index_dir(storage: Storage, folder: str) -> str:
    """``<folder>/.ftnb-index``."""
    return storage.join(folder, INDEX_DIR)


def entry_file_name(name: str) -> str:
    """The entry's file name: the experiment's name percent-quoted (never a glob pattern,
    never a path), ``.json``."""
    return urllib.parse.quote(name, safe="") + ".json"


def _entry_name(file_name: str) -> Optional[str]:
    if file_name.startswith(".") or not file_name.endswith(".json"):
        return None  # the snapshot, a temporary file
    return urllib.parse.unquote(file_name[: -len(".json")])


# -- an entry --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexEntry:
    """One experiment's summary as its driver last wrote it (the state's status as stored: a
    RUNNING entry says nothing of whether its driver is alive)."""

    name: str
    status: str
    trials: int
    counts: dict
    failures: int
    preemptions: int
    created: float
    updated: float
    #: The lease token of the driver that wrote it (None: it ran without a lease).
    token: Optional[str] = None
    #: The state generation it summarizes.
    generation: int = 0
    #: The version of its file when read (see :class:`~ftnb.storage.FileVersions`); not stored.
    version: Optional[list] = field(default=None, compare=False)

    @classmethod
    def of_state(cls, name: str, state: Any, token: Optional[str]) -> "IndexEntry":
        """The entry of an :class:`~ftnb.core.records.ExperimentState` (read, not imported:
        storage sits below the core)."""
        trials = state.trials
        return cls(name=name, status=str(state.status), trials=len(trials),
                   counts=state.counts(), failures=sum(t.num_failures for t in trials),
                   preemptions=sum(t.num_preemptions for t in trials),
                   created=float(state.created), updated=float(state.updated), token=token,
                   generation=int(state.generation))

    def summary_key(self) -> tuple:
        """What a listing shows, but the time: a change here is written at once."""
        return (self.status, self.trials, tuple(sorted(self.counts.items())), self.failures,
                self.preemptions, self.token)

    def to_json(self) -> dict:
        return {"format": INDEX_FORMAT, "format_version": INDEX_FORMAT_VERSION,
                "name": self.name, "status": self.status, "trials": self.trials,
                "counts": self.counts, "failures": self.failures,
                "preemptions": self.preemptions, "created": self.created,
                "updated": self.updated, "token": self.token, "generation": self.generation}

    @classmethod
    def from_json(cls, data: Any, name: str, version: Optional[list] = None
                  ) -> Optional["IndexEntry"]:
        """The entry in ``data`` if it is a valid entry of the experiment ``name`` (one this
        ftnb understands), else None: its reader then reads the experiment in full."""
        try:
            if (data.get("format") != INDEX_FORMAT or data.get("name") != name
                    or not isinstance(data.get("format_version"), int)
                    or data["format_version"] > INDEX_FORMAT_VERSION):
                return None
            counts = data["counts"]
            if not isinstance(counts, dict) or not all(
                    isinstance(k, str) and _is_int(v) for k, v in counts.items()):
                return None
            token = data.get("token")
            entry = cls(name=name, status=str(data["status"]), trials=data["trials"],
                        counts=dict(counts), failures=data["failures"],
                        preemptions=data["preemptions"], created=float(data["created"]),
                        updated=float(data["updated"]),
                        token=token if isinstance(token, str) else None,
                        generation=int(data.get("generation") or 0), version=version)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        if not all(_is_int(v) for v in (entry.trials, entry.failures, entry.preemptions)):
            return None
        return entry


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the driver's side -----------------------------------------------------------------------------
class IndexEntryWriter:
    """Keeps one experiment's entry up to date, for its driver (the controller calls
    :meth:`update` at each state save).

    An entry is written when its summary changed (status, counts, failures, token), when
    :data:`REFRESH_S` passed since the last write (its ``updated`` time), and at the driver's
    last save, which then folds the folder's entries into the snapshot
    (:func:`compact_index`). On a local disk it is written at once (a few microseconds, no
    fsync: a lost entry is only a slower listing); on remote storage a thread writes the
    latest one, so a PUT never waits in the driver's loop, and the last save's entry is
    written before it returns. A failed write is never the experiment's failure: the listing
    then reads the experiment in full (said once on stderr).
    """

    def __init__(self, paths: ExperimentPaths, lease: Any = None,
                 derive: Optional[Derive] = None) -> None:
        self.paths = paths
        self.derive = derive
        self.storage = paths.storage
        self.lease = lease
        folder = self.storage.parent(paths.dir)
        self.dir = index_dir(self.storage, folder)
        self.path = self.storage.join(self.dir, entry_file_name(paths.name))
        self._written: Optional[tuple] = None
        self._written_at = 0.0
        self._trials = -1
        self._pending: Optional[IndexEntry] = None
        self._lock = threading.Lock()  # one write at a time, in order
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._made_dir = False
        self._warned = False

    def update(self, state: Any, changed: bool = True, final: bool = False) -> None:
        """The entry of ``state`` (its latest save), written if it changed or is due.
        ``changed``: whether a trial's record changed since the last call (False, and the
        number of trials the same: the counts cannot have changed, and the entry is not even
        computed unless it is due); ``final``: the driver's last save (written now, whatever
        the storage, then folded into the snapshot)."""
        now = time.monotonic()
        due = now - self._written_at >= REFRESH_S
        if not (changed or final or due or self._written is None
                or len(state.trials) != self._trials):
            return
        token = getattr(self.lease, "token", None)
        entry = IndexEntry.of_state(self.paths.name, state, token)
        key = entry.summary_key()
        if key == self._written and not due and not final:
            return
        self._written, self._written_at, self._trials = key, now, entry.trials
        if final or self.storage.is_local:
            self._stop_thread()
            written = self._write(entry)
            if final and written:
                compact_index(self.storage, self.storage.parent(self.paths.dir),
                              derive=self.derive)
        else:
            self._hand_to_thread(entry)

    def close(self) -> None:
        """Stop the writing thread (what it had not written yet is dropped)."""
        self._stop_thread()

    # -- writing ---------------------------------------------------------------------------------
    def _write(self, entry: IndexEntry) -> bool:
        data = json.dumps(entry.to_json(), allow_nan=True).encode("utf-8")
        with self._lock:
            try:
                if not self._made_dir:
                    _make_index_dir(self.storage, self.dir)
                    self._made_dir = True
                    # A driver killed while it replaced this entry left its temporary file;
                    # this entry has one writer, the lease holder, and that is this driver now.
                    self.storage.remove_leftover_temps(
                        self.dir, frozenset({entry_file_name(self.paths.name)}))
                self.storage.write_atomic(self.path, data, durable=False)
                return True
            except Exception as exc:  # never the experiment's failure
                if not self._warned:
                    self._warned = True
                    print(f"ftnb: could not update the listing index {self.storage.uri(self.path)}"
                          f" ({type(exc).__name__}: {exc}); listings read this experiment in "
                          "full instead.", file=sys.stderr, flush=True)
                return False

    def _hand_to_thread(self, entry: IndexEntry) -> None:
        with self._wake:
            self._pending = entry
            if self._thread is None:
                self._closed = False
                self._thread = threading.Thread(target=self._run, name="ftnb-index-writer",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._pending is None and not self._closed:
                    self._wake.wait(_IDLE_S)
                if self._closed:
                    return
                if self._pending is None:
                    # Idle (a driver that stopped saving: its lease lost, or it is ending): go;
                    # the next update starts a new thread.
                    self._thread = None
                    return
                entry, self._pending = self._pending, None
            self._write(entry)

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._wake:
            self._closed = True
            self._pending = None
            self._wake.notify()
        thread.join(timeout=30)  # (a write under way: it finishes first, then ours follows)
        self._thread = None


def _make_index_dir(storage: Storage, folder: str) -> None:
    """Make the index folder; on a local or NFS disk with the permissions of the storage folder
    it is in, so that every user who may add experiments there may add their entries."""
    if not storage.is_local:
        storage.makedirs(folder)
        return
    if os.path.isdir(folder):
        return
    os.makedirs(folder, exist_ok=True)
    try:
        # (Without the sticky bit of a /tmp-like folder: the snapshot is replaced by whichever
        # user's driver ends last.)
        mode = stat.S_IMODE(os.stat(os.path.dirname(folder)).st_mode) & ~stat.S_ISVTX
        os.chmod(folder, mode)
    except OSError:
        pass  # (not ours to change: someone else made it meanwhile)


# -- the readers' side -----------------------------------------------------------------------------
@dataclass
class FolderIndex:
    """What :func:`read_index` found: the valid entries by experiment name (each with the
    version of its file), and how many entries it read one by one (not from the snapshot or
    the caller's memory)."""

    entries: dict[str, IndexEntry] = field(default_factory=dict)
    read: int = 0
    snapshot_found: bool = False
    #: The snapshot's items on experiments whose driver is gone (see :func:`compact_index`),
    #: by name: only those written under their entry's current version.
    gone: dict[str, dict] = field(default_factory=dict)


def read_index(storage: Storage, folder: str, memory: Optional[dict] = None,
               most: Optional[int] = None) -> FolderIndex:
    """The index of ``folder``: its entries as they are now.

    One listing of ``.ftnb-index/`` (each entry's version), the snapshot, and a read of each
    entry that neither the snapshot nor ``memory`` (a dict this function keeps up to date for a
    caller that lists again: path -> entry) holds at its listed version; at most ``most`` of
    those (the others are left out). Storage errors propagate; an unreadable entry is left out
    (its experiment is then read in full)."""
    where = index_dir(storage, folder)
    versions = _entry_versions(storage, where)
    out = FolderIndex()
    if not versions:
        return out
    snap_path = storage.join(where, SNAPSHOT_FILE)
    memory = {} if memory is None else memory
    snapshot: dict = {}
    if snap_path in versions:
        # (Kept in memory, as read, under its version: a refresh reads it only when a driver
        # rewrote it.)
        known = memory.get(snap_path)
        if isinstance(known, tuple) and known[0] == versions[snap_path]:
            snapshot = known[1]
        else:
            raw = read_files(storage, [snap_path]).get(snap_path)
            if isinstance(raw, bytes):
                snapshot = _parse_snapshot(raw)
                memory[snap_path] = (versions[snap_path], snapshot)
        out.snapshot_found = bool(snapshot)
    copied, gone = snapshot.get("entries", {}), snapshot.get("gone", {})
    wanted: dict[str, str] = {}
    for path, version in versions.items():
        name = _entry_name(_base(path))
        if name is None:
            continue
        known = memory.get(path)
        if known is not None and known.version == version:
            out.entries[name] = known
            continue
        item = copied.get(name)
        if isinstance(item, dict) and item.get("version") == version:
            entry = IndexEntry.from_json(item.get("entry"), name, version)
            if entry is not None:
                out.entries[name] = memory[path] = entry
                continue
        wanted[path] = name
    if most is not None:
        wanted = dict(list(wanted.items())[:most])
    for path, raw in read_files(storage, list(wanted)).items():
        name = wanted[path]
        out.read += 1
        if not isinstance(raw, bytes):
            continue  # deleted since the listing: its experiment is read in full, if there
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        entry = IndexEntry.from_json(data, name, versions[path])
        if entry is not None:
            out.entries[name] = memory[path] = entry
    for path in [p for p in memory if p not in versions]:
        del memory[path]
    for name, entry in out.entries.items():
        item = gone.get(name)
        if isinstance(item, dict) and item.get("version") == entry.version:
            out.gone[name] = item
    return out


#: What a driver gives :func:`compact_index` to read the experiments whose entry says RUNNING
#: (``derive(storage, folder, entries)``): for each whose driver is gone, by name, what every
#: reader would read (a JSON object; the storage layer does not know the read model).
Derive = Callable[[Storage, str, dict], dict]


def compact_index(storage: Storage, folder: str, most: int = 1000,
                  derive: Optional[Derive] = None, most_derived: int = 200) -> bool:
    """Write the snapshot of ``folder``'s index: every entry of an experiment whose folder is
    there (a deleted one's is left out), each with the version of its file, so that a reader
    gets them all in one read. Reads the entries that changed since the last snapshot, at most
    ``most`` of them (the rest: at a later compaction).

    ``derive``: also keep, under ``gone``, what ``derive`` says of the experiments whose entry
    says RUNNING though their driver is gone (a SIGKILLed driver never rewrites its entry),
    each with its entry's version: read once, at most ``most_derived`` at a time, and carried
    over while the entry stays the same (a reader still checks the lease it was read under).

    A driver does this at its end; True if a snapshot was written. Never raises: the snapshot
    is a cache."""
    try:
        names = set(storage.listdir(folder))
        index = read_index(storage, folder, most=most)
        live = {n: e for n, e in index.entries.items() if n in names and e.version is not None}
        gone = {n: item for n, item in index.gone.items() if n in live}
        derived: dict = {}
        if derive is not None:
            todo = {n: e for n, e in sorted(live.items())
                    if e.status == _RUNNING and n not in gone}
            if todo:
                derived = derive(storage, folder, dict(list(todo.items())[:most_derived]))
        if not index.read and not derived and index.snapshot_found:
            return False  # nothing new
        for name, item in derived.items():
            if name in todo and isinstance(item, dict):
                gone[name] = {**item, "version": todo[name].version}
        data = {"format": SNAPSHOT_FORMAT, "format_version": INDEX_FORMAT_VERSION,
                "written": time.time(),
                "entries": {name: {"version": e.version, "entry": e.to_json()}
                            for name, e in sorted(live.items())},
                "gone": dict(sorted(gone.items()))}
        storage.write_atomic(storage.join(index_dir(storage, folder), SNAPSHOT_FILE),
                             json.dumps(data, allow_nan=True).encode("utf-8"), durable=False)
    except Exception:
        return False
    return True


def _parse_snapshot(raw: bytes) -> dict:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if (not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT
            or not isinstance(data.get("format_version"), int)
            or data["format_version"] > INDEX_FORMAT_VERSION):
        return {}
    entries, gone = data.get("entries"), data.get("gone")
    return {"entries": entries if isinstance(entries, dict) else {},
            "gone": gone if isinstance(gone, dict) else {}}


def _entry_versions(storage: Storage, where: str) -> dict[str, list]:
    """The files of the index folder and their versions (as JSON would give them back):
    one ``scandir`` on a local disk, one (paginated) listing elsewhere."""
    if storage.is_local:
        out = {}
        try:
            with os.scandir(where) as found:
                for item in found:
                    try:
                        st = item.stat()
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        out[item.path] = [st.st_size, st.st_ino, st.st_mtime_ns]
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return out
    listed = _listed_versions(storage, where)
    return {path: list(version) for path, version in listed.items()}


def _base(path: str) -> str:
    return path.rstrip("/").replace(os.sep, "/").rsplit("/", 1)[-1]


# -- reading many small files at once --------------------------------------------------------------
def read_files(storage: Storage, paths: list[str]) -> dict[str, Any]:
    """The bytes of each file of ``paths``, or the exception reading it raised (a
    :class:`FileNotFoundError` for a missing one), by path. On a local disk one after the
    other (each is a few microseconds); on remote storage in batches that an async
    filesystem (s3fs, gcsfs) reads concurrently (fsspec's batch ``cat``)."""
    if not paths:
        return {}
    out: dict[str, Any] = {}
    if storage.is_local:
        for path in paths:
            try:
                with open(path, "rb") as f:
                    out[path] = f.read()
            except OSError as exc:
                out[path] = exc
        return out
    fs = storage.fs
    plain = [p for p in paths if not _has_magic(p)]
    for path in paths:
        if _has_magic(path):  # the batch would read it as a glob: alone, by its exact name
            out[path] = _read_one(storage, path)
    for start in range(0, len(plain), _BATCH):
        batch = plain[start:start + _BATCH]
        try:
            found = fs.cat(batch, on_error="return", **call_deadline(fs))
        except Exception:
            found = {}
        if not isinstance(found, dict):
            found = {batch[0]: found}
        stripped = {fs._strip_protocol(p): v for p, v in found.items()}
        for path in batch:
            value = found.get(path, stripped.get(fs._strip_protocol(path)))
            out[path] = value if value is not None else _read_one(storage, path)
    return out


def _read_one(storage: Storage, path: str) -> Any:
    try:
        return storage.read_bytes(path)
    except Exception as exc:
        return exc


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")
