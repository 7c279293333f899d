"""An incremental reader of one experiment directory: the view model of every live UI.

:class:`ExperimentMonitor` follows an experiment that may be running in another process, on
another machine, or that ended long ago (ARCHITECTURE.md, principle 6: every UI is a reader).
Each :meth:`ExperimentMonitor.poll` returns an :class:`ExperimentSnapshot` and reads only what
changed since the last one:

* ``experiment_state.json`` is re-read only when it changed (on a local disk: its inode, size
  and mtime), and trials whose JSON did not change keep their parsed record;
* a trial's ``trial.json`` (the controller's newer word between two state saves) is re-read
  only when it changed, and wins over the state's record when its ``seq`` is higher;
* a trial's ``result.json`` is tailed from the last byte read; a torn last line waits for its
  end, and a file that was replaced (rows dropped when a trial restarted from a checkpoint) is
  read again from the start;
* ``owner.json`` (the lease) tells a driver that died: a state that says RUNNING while its
  owner is gone is shown as ``INTERRUPTED`` with ``driver_gone=True``.

On a local disk a poll that finds nothing new costs one ``stat`` per file. On object stores
(``s3://``) a poll lists the experiment folder once and reads the files whose size or ETag
changed; callers poll those less often (every 2-3 s).

Example::

    monitor = ExperimentMonitor("~/ftnb_results/sweep1")
    snap = monitor.poll()
    print(snap.view.summary())
    for trial_id, (iterations, values) in snap.series("loss").items():
        ...

Thread-safety: one monitor belongs to one thread (the widget's updater); snapshots are
immutable once returned and may be handed to any thread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

from .lease import LEASE_FILE, LeaseInfo
from .results import flatten_row
from .state import (
    ExperimentState,
    FailureRecord,
    StateFormatError,
    StateVersionError,
    TrialRecord,
)
from .storage import ExperimentPaths, call_deadline, default_storage_path, parse_json_line
from .view import ExperimentView, render_table

__all__ = [
    "ExperimentMonitor",
    "ExperimentSnapshot",
    "Restart",
    "default_resume_line",
    "ftnb_magics_loaded",
    "same_storage_path",
    "text_view",
]

# Row keys that are not metrics to plot: ftnb's bookkeeping and the x axis itself.
_NOT_METRICS = frozenset(
    {"training_iteration", "trial_id", "timestamp", "attempt", "checkpoint_dir_name", "done"}
)


@dataclass(frozen=True)
class Restart:
    """A point where a trial's attempt started again (attempt 2 and later).

    ``iteration`` is the ``training_iteration`` it resumed from (0: from scratch), ``attempt``
    the attempt's number, ``time`` when it started, ``restored_from`` the checkpoint folder.
    """

    iteration: int
    attempt: int
    time: float
    restored_from: Optional[str] = None


class ExperimentSnapshot:
    """What an experiment looked like at one poll. Immutable once returned.

    Attributes:
        view: the :class:`ftnb.view.ExperimentView` (status ``INTERRUPTED`` when the driver
            is gone although the state says RUNNING).
        state: the experiment state the view was built from (trial records merged with their
            newer ``trial.json`` and their ``result.json``).
        metrics: the numeric metric names any trial reported, in the order first seen.
        restarts: ``{trial_id: [Restart, ...]}`` for trials that restarted.
        failures: ``{trial_id: [FailureRecord, ...]}`` for trials that failed (preemptions too).
        version: ``{trial_id: int}``, changed whenever the trial's rows or record changed.
        generation: changes whenever anything in the snapshot changed (elapsed time aside).
        driver_gone: the state says RUNNING but no driver owns the experiment any more.
        driver: one line on the driver (alive or gone, and why); "" when unknown.
        resume_line: the line that resumes the experiment if it is interrupted.
        supervisor_log: the supervisor's log file, if the experiment has one (local disks).
        path: the experiment folder as a user can paste it.
    """

    def __init__(
        self,
        *,
        view: ExperimentView,
        state: ExperimentState,
        metrics: list[str],
        restarts: dict[str, list[Restart]],
        failures: dict[str, list[FailureRecord]],
        version: dict[str, int],
        generation: int,
        driver_gone: bool,
        driver: str,
        resume_line: str,
        supervisor_log: Optional[str],
        path: str,
        series: dict[str, "_Series"],
        lengths: dict[str, int],
    ) -> None:
        self.view = view
        self.state = state
        self.metrics = metrics
        self.restarts = restarts
        self.failures = failures
        self.version = version
        self.generation = generation
        self.driver_gone = driver_gone
        self.driver = driver
        self.resume_line = resume_line
        self.supervisor_log = supervisor_log
        self.path = path
        self._series = series
        self._lengths = lengths

    @property
    def status(self) -> str:
        """The experiment's status: RUNNING, FINISHED, ERRORED or INTERRUPTED."""
        return self.view.status

    @property
    def finished(self) -> bool:
        """Whether nothing will change any more without a restore (not RUNNING)."""
        return self.view.status != "RUNNING"

    @property
    def trial_ids(self) -> list[str]:
        return [t.trial_id for t in self.state.trials]

    def series(
        self, metric: str, trial_ids: Optional[Iterable[str]] = None
    ) -> dict[str, tuple[list[int], list[float]]]:
        """``{trial_id: (iterations, values)}`` of ``metric`` for every trial that reported it
        (or only for ``trial_ids``). Rows without the metric are left out."""
        wanted = self._series.keys() if trial_ids is None else trial_ids
        out = {}
        for trial_id in wanted:
            s = self._series.get(trial_id)
            if s is None:
                continue
            points = s.points(metric, self._lengths.get(trial_id, 0))
            if points is not None:
                out[trial_id] = points
        return out

    def value_at(self, trial_id: str, metric: str, iteration: int) -> Optional[float]:
        """The value of ``metric`` that ``trial_id`` reported at ``iteration`` (None if none)."""
        s = self._series.get(trial_id)
        if s is None:
            return None
        return s.value_at(metric, iteration, self._lengths.get(trial_id, 0))

    def num_rows(self, trial_id: str) -> int:
        """How many result rows of the trial this snapshot holds."""
        return self._lengths.get(trial_id, 0)

    def with_elapsed(self, now: float) -> "ExperimentSnapshot":
        """The same snapshot with the running experiment's elapsed time brought up to ``now``."""
        if self.view.status != "RUNNING":
            return self
        clone = object.__new__(ExperimentSnapshot)
        clone.__dict__.update(self.__dict__)
        clone.view = self.view.with_end(now, self.state)
        return clone


# -- result.json tails --------------------------------------------------------------------------
class _Series:
    """One trial's result rows as columns, append-only: a snapshot sees a prefix of the lists by
    its length, so appending after a snapshot never changes what that snapshot shows. A file
    that was replaced gets a new ``_Series``."""

    __slots__ = ("iterations", "columns", "last_row")

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.columns: dict[str, list[Optional[float]]] = {}
        self.last_row: Optional[dict] = None

    def append(self, row: dict, names: dict[str, None]) -> None:
        n = len(self.iterations)
        iteration = row.get("training_iteration")
        self.iterations.append(iteration if isinstance(iteration, int) else n + 1)
        flat = flatten_row(row) if any(isinstance(v, dict) for v in row.values()) else row
        for key, value in flat.items():
            if key in _NOT_METRICS or isinstance(value, bool):
                continue
            if not isinstance(value, (int, float)):
                continue
            column = self.columns.get(key)
            if column is None:
                column = self.columns[key] = [None] * n
                names.setdefault(key, None)
            column.append(value)
        for column in self.columns.values():
            if len(column) <= n:  # this row did not report it
                column.append(None)
        self.last_row = row

    def points(self, metric: str, length: int) -> Optional[tuple[list[int], list[float]]]:
        column = self.columns.get(metric)
        if column is None:
            return None
        xs, ys = [], []
        for x, y in zip(self.iterations[:length], column[:length]):
            if y is not None:
                xs.append(x)
                ys.append(y)
        return (xs, ys) if xs else None

    def value_at(self, metric: str, iteration: int, length: int) -> Optional[float]:
        column = self.columns.get(metric)
        if column is None:
            return None
        iterations = self.iterations
        # Iterations are ascending within a file: search from the end (restarts look back a bit).
        for i in range(min(length, len(iterations)) - 1, -1, -1):
            if iterations[i] == iteration:
                return column[i]
            if iterations[i] < iteration:
                return None
        return None


class _ResultTail:
    """Follows one ``result.json`` from the last byte read."""

    # How much of the last consumed line is compared on each read: a file replaced by one that
    # happens to be as long or longer (a restart dropped rows, then new rows came) is told apart
    # by its content, even if the new file reuses the old inode number.
    _OVERLAP = 256

    def __init__(self) -> None:
        self.key: Any = None
        self.offset = 0
        self.tail = b""
        self.series = _Series()
        self.exists = False

    def reset(self) -> None:
        self.offset = 0
        self.tail = b""
        self.series = _Series()

    def consume(self, data: bytes, names: dict[str, None]) -> bool:
        """Parse the complete lines of ``data`` (read from ``offset``); True if rows came."""
        end = data.rfind(b"\n") + 1
        if not end:
            return False  # only a torn (still being written) line: wait for its end
        got = False
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            row = parse_json_line(line)  # None: corrupt, skipped as read_json_lines does
            if row is not None:
                self.series.append(row, names)
                got = True
        self.offset += end
        self.tail = data[max(0, end - self._OVERLAP) : end]
        return got

    def read_local(self, path: str, names: dict[str, None], stats: dict) -> bool:
        """Bring the tail up to date from a local file; True if its rows changed."""
        key = _local_key(path)
        if key == self.key:
            return False
        if key is None:
            return self._gone()
        changed = False
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (st.st_ino, st.st_size, st.st_mtime_ns)
                replaced = self.key is None or st.st_ino != self.key[0]
                if self.offset and (replaced or st.st_size < self.offset
                                    or not self._same_prefix(f)):
                    self.reset()
                    changed = True
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return False  # replaced between stat and open: the next poll reads the new one
        stats["files_read"] += 1
        stats["bytes_read"] += len(data)
        self.key, self.exists = key, True
        return self.consume(data, names) or changed

    def _same_prefix(self, f: Any) -> bool:
        f.seek(self.offset - len(self.tail))
        return f.read(len(self.tail)) == self.tail

    def _gone(self) -> bool:
        had_rows = bool(self.series.iterations)
        self.key, self.exists = None, False
        self.reset()
        return had_rows

    def read_remote(self, fs: Any, path: str, key: Any, names: dict[str, None],
                    stats: dict) -> bool:
        """The same from a remote file whose listing ``key`` (size, ETag/mtime) changed."""
        if key == self.key:
            return False
        if key is None:
            return self._gone()
        size = key[0] if isinstance(key[0], int) else None
        changed = False
        try:
            data = None
            if self.offset and size is not None and size >= self.offset:
                start = self.offset - len(self.tail)
                data = fs.cat_file(path, start=start, **call_deadline(fs, size - start))
                if data[: len(self.tail)] == self.tail:
                    data = data[len(self.tail):]
                else:
                    data = None  # replaced by a different file: read it whole
            if data is None:
                if self.offset:
                    self.reset()
                    changed = True
                data = fs.cat_file(path, **call_deadline(fs, size or 0))
        except FileNotFoundError:
            return changed
        stats["files_read"] += 1
        stats["bytes_read"] += len(data)
        self.key, self.exists = key, True
        return self.consume(data, names) or changed


# -- trials -------------------------------------------------------------------------------------
class _TrialTracker:
    """What the monitor knows about one trial, kept between polls."""

    __slots__ = (
        "trial_id", "dir_name", "record_path", "results_path", "state_raw", "state_record",
        "file_key", "file_record", "results", "version", "effective", "effective_key",
    )

    def __init__(self, trial_id: str, dir_name: str, paths: ExperimentPaths) -> None:
        self.trial_id = trial_id
        self.dir_name = dir_name
        trial_paths = paths.trial(dir_name)
        self.record_path, self.results_path = trial_paths.record, trial_paths.results
        self.state_raw: Optional[dict] = None
        self.state_record: Optional[TrialRecord] = None
        self.file_key: Any = None
        self.file_record: Optional[TrialRecord] = None
        self.results = _ResultTail()
        self.version = 0
        self.effective: Optional[TrialRecord] = None
        self.effective_key: Any = None

    def set_state_raw(self, raw: dict) -> bool:
        if raw == self.state_raw:
            return False
        self.state_raw = raw
        self.state_record = TrialRecord.from_json(raw)
        return True

    def set_file_record(self, key: Any, data: Optional[bytes]) -> bool:
        self.file_key = key
        if data is None:
            return False
        try:
            record = TrialRecord.from_json(json.loads(data))
        except (ValueError, TypeError, KeyError):
            return False  # unreadable (should not happen: it is written atomically)
        if record.trial_id != self.trial_id:
            return False
        self.file_record = record
        return True

    def record(self) -> TrialRecord:
        """The newest record of the trial, with its iteration and last result from its rows."""
        base = self.state_record
        if self.file_record is not None and (base is None or self.file_record.seq > base.seq):
            base = self.file_record
        assert base is not None
        series = self.results.series
        key = (id(base), id(series), len(series.iterations), self.results.exists)
        if key == self.effective_key and self.effective is not None:
            return self.effective
        record = base
        if self.results.exists:
            # The rows are the truth for progress: the state is saved at most once a second,
            # and trial.json only at transitions.
            last = series.last_row
            iteration = series.iterations[-1] if series.iterations else 0
            if iteration != base.iteration or last != base.last_result:
                record = dataclasses.replace(base, iteration=iteration, last_result=last)
        self.effective, self.effective_key = record, key
        return record


# -- file change detection ----------------------------------------------------------------------
def _local_key(path: str) -> Any:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _listing_key(info: dict) -> Any:
    """What tells a remote file's versions apart: its size and whatever version marker the
    backend lists (ETag on S3, a generation or mtime elsewhere)."""
    marker = None
    for name in ("ETag", "etag", "md5Hash", "generation", "LastModified", "mtime", "updated",
                 "last_modified", "created"):
        if info.get(name) is not None:
            marker = str(info[name])
            break
    return (info.get("size"), marker)


def default_resume_line(paths: ExperimentPaths, state: ExperimentState,
                        magics: Optional[bool] = None) -> str:
    """The one line that resumes an interrupted experiment.

    Launched with ``%ftrun`` or :func:`ftnb.launch` (the state records the names it was
    launched with): ``%ftresume NAME`` where the ``%ft`` magics can run it (``magics``; by
    default, whether this process is an IPython shell with ``%load_ext ftnb`` done), with its
    folder instead of its name when it is not under the default storage path; elsewhere the
    Python line ``ftnb.attach(PATH).resume(TRAINABLE, param_space=SPACE)`` with the recorded
    names. An experiment run by ``Tuner.fit()``: ``ftnb.Tuner.restore(PATH, TRAINABLE).fit()``.
    Started by ``ftnb run`` (its origin says ``"via": "cli"``): ``ftnb resume NAME``, which
    imports the recorded trainable and space again, from any shell.
    """
    origin = state.settings.get("origin")
    if isinstance(origin, dict) and origin.get("via") == "cli":
        import shlex

        default = _norm(default_storage_path())
        ref = state.name if _norm(paths.parent_uri) == default else paths.uri
        return f"ftnb resume {shlex.quote(ref)}"
    if origin:
        if magics is None:
            magics = ftnb_magics_loaded()
        if magics:
            default = _norm(default_storage_path())
            ref = state.name if _norm(paths.parent_uri) == default else paths.uri
            return f"%ftresume {ref}"
        trainable = origin.get("trainable") if isinstance(origin, dict) else None
        trainable = trainable or state.trainable.rsplit(".", 1)[-1]
        space = origin.get("param_space") if isinstance(origin, dict) else None
        with_space = f", param_space={space}" if space else ""
        return f"ftnb.attach({paths.uri!r}).resume({trainable}{with_space})"
    return f"ftnb.Tuner.restore({paths.uri!r}, {state.trainable}).fit()"


def ftnb_magics_loaded() -> bool:
    """Whether this process is an IPython shell where ``%ftresume`` works (``%load_ext ftnb``
    done). Never imports IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
        return shell is not None and "ftresume" in shell.magics_manager.magics["line"]
    except Exception:
        return False


def same_storage_path(a: str, b: str) -> bool:
    """Whether two storage paths (folders or URLs, as a user may write them) are the same."""
    return _norm(a) == _norm(b)


def _norm(path: str) -> str:
    if "://" in path:
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


class ExperimentMonitor:
    """Incremental reader of one experiment directory; see the module docstring.

    Args:
        path_or_paths: the experiment folder (a local path or an fsspec URL such as
            ``s3://bucket/runs/sweep1``), or its :class:`~ftnb.storage.ExperimentPaths`.
        storage_filesystem: an fsspec filesystem to read through (credentials, endpoint).
        metric: the metric the view lists first (default: the experiment's ``metric``).
        resume_line: the line shown to resume an interrupted experiment (default:
            :func:`default_resume_line`).
    """

    def __init__(
        self,
        path_or_paths: Union[str, os.PathLike, ExperimentPaths],
        storage_filesystem: Any = None,
        *,
        metric: Optional[str] = None,
        resume_line: Optional[str] = None,
    ) -> None:
        if isinstance(path_or_paths, ExperimentPaths):
            self.paths = path_or_paths
        else:
            self.paths = ExperimentPaths.at(os.fspath(path_or_paths), storage_filesystem)
        self.storage = self.paths.storage
        self.is_local = self.storage.is_local
        self._metric = metric
        self._resume_line = resume_line
        self._state_key: Any = None
        self._state: Optional[ExperimentState] = None
        self._trackers: dict[str, _TrialTracker] = {}
        self._order: list[str] = []
        self._names: dict[str, None] = {}  # metric names, ordered as first seen
        self._lease_key: Any = None
        self._lease: Optional[LeaseInfo] = None
        self._driver: tuple[bool, str] = (False, "")
        self._supervisor_log: Optional[str] = None
        self._generation = 0
        self._dirty = True
        self._snapshot: Optional[ExperimentSnapshot] = None
        #: Work done so far (polls, files read, bytes read): what a poll costs, for tests and
        #: the benchmark.
        self.stats = {"polls": 0, "files_read": 0, "bytes_read": 0}

    @property
    def metric(self) -> Optional[str]:
        """The metric the view lists first; setting it rebuilds the view at the next poll."""
        return self._metric

    @metric.setter
    def metric(self, value: Optional[str]) -> None:
        if value != self._metric:
            self._metric = value
            self._dirty = True

    # -- polling -------------------------------------------------------------------------------
    def poll(self) -> ExperimentSnapshot:
        """Read what changed and return the experiment as it is now.

        Raises :class:`ftnb.state.StateFormatError` while the folder holds no readable
        experiment state (not created yet, or not an experiment).
        """
        self.stats["polls"] += 1
        listing = None if self.is_local else self._list_remote()
        changed = self._refresh_state(listing)
        state = self._state
        assert state is not None
        for trial_id in self._order:
            tracker = self._trackers[trial_id]
            if self._refresh_trial(tracker, listing):
                tracker.version += 1
                changed = True
        if self._refresh_driver(state, listing):
            changed = True
        if self._supervisor_log is None and self._refresh_supervisor_log(listing):
            changed = True
        if changed or self._dirty or self._snapshot is None:
            self._generation += 1
            self._snapshot = self._build(state)
            self._dirty = False
            return self._snapshot
        return self._snapshot.with_elapsed(time.time())

    def _list_remote(self) -> dict[str, dict]:
        """{path: info} of every file under the experiment folder (one paginated listing)."""
        fs = self.storage.fs
        try:
            fs.invalidate_cache(self.paths.dir)
        except Exception:
            pass
        try:
            found = fs.find(self.paths.dir, detail=True, **call_deadline(fs))
        except FileNotFoundError:
            return {}
        return {p.rstrip("/"): info for p, info in found.items()}

    def _key(self, path: str, listing: Optional[dict]) -> Any:
        if listing is None:
            return _local_key(path)
        info = listing.get(path)
        return None if info is None else _listing_key(info)

    def _refresh_state(self, listing: Optional[dict]) -> bool:
        key = self._key(self.paths.state, listing)
        if key == self._state_key and self._state is not None:
            return False
        parsed = self._read_state() if key is not None else None
        if parsed is None:
            if self._state is not None and key is not None:
                return False  # a damaged write (should not happen): keep the last good one
            # No state file, or an unreadable one: the previous generation, or an error that
            # says what is there instead (StateFormatError).
            loaded = ExperimentState.load(self.paths)
            parsed = dataclasses.replace(loaded, trials=[]), [t.to_json() for t in loaded.trials]
        header, trials_raw = parsed
        self._state_key = key
        order = []
        for raw_trial in trials_raw:
            trial_id = raw_trial["trial_id"]
            tracker = self._trackers.get(trial_id)
            if tracker is None:
                tracker = self._trackers[trial_id] = _TrialTracker(
                    trial_id, raw_trial.get("dir_name", trial_id), self.paths
                )
            if tracker.set_state_raw(raw_trial):
                tracker.version += 1
            order.append(trial_id)
        self._order = order
        self._state = header
        return True

    def _read_state(self) -> Optional[tuple[ExperimentState, list[dict]]]:
        """The state's header (no trials) and its trials as raw JSON, or None if unreadable.

        The trials stay raw so that only those whose JSON changed are parsed again.
        """
        try:
            raw = self._read(self.paths.state)
            data = json.loads(raw)
            trials = data.get("trials", [])
            if not isinstance(trials, list) or not all(
                isinstance(t, dict) and "trial_id" in t for t in trials
            ):
                return None
            header = ExperimentState.from_json(
                {**data, "trials": []}, where=self.storage.uri(self.paths.state)
            )
        except StateVersionError:
            raise
        except (FileNotFoundError, StateFormatError, ValueError, TypeError, KeyError,
                AttributeError):
            return None
        return header, trials

    def _read(self, path: str) -> bytes:
        data = self.storage.read_bytes(path)
        self.stats["files_read"] += 1
        self.stats["bytes_read"] += len(data)
        return data

    def _refresh_trial(self, tracker: _TrialTracker, listing: Optional[dict]) -> bool:
        changed = False
        key = self._key(tracker.record_path, listing)
        if key != tracker.file_key:
            data = None
            if key is not None:
                try:
                    data = self._read(tracker.record_path)
                except FileNotFoundError:
                    key = None
            if tracker.set_file_record(key, data):
                changed = True
        if listing is None:
            rows = tracker.results.read_local(tracker.results_path, self._names, self.stats)
        else:
            key = self._key(tracker.results_path, listing)
            rows = tracker.results.read_remote(
                self.storage.fs, tracker.results_path, key, self._names, self.stats
            )
        return rows or changed

    def _refresh_driver(self, state: ExperimentState, listing: Optional[dict]) -> bool:
        path = self.storage.join(self.paths.dir, LEASE_FILE)
        key = self._key(path, listing)
        if key != self._lease_key:
            self._lease_key = key
            self._lease = None
            if key is not None:
                try:
                    self._lease = LeaseInfo.from_json(json.loads(self._read(path)))
                except (FileNotFoundError, ValueError, TypeError):
                    self._lease = None
        driver = self._driver_line(state)
        # Only the verdict counts as a change: the line's wording (a heartbeat's age) moves on
        # every poll and would rebuild the snapshot each time.
        changed = (driver[0], bool(driver[1])) != (self._driver[0], bool(self._driver[1]))
        self._driver = driver
        return changed

    def _driver_line(self, state: ExperimentState) -> tuple[bool, str]:
        """(gone, line): whether a RUNNING experiment lost its driver, and a line about it."""
        lease = self._lease
        if lease is None:
            if state.status == "RUNNING":
                return True, "no driver owns it (no owner.json)"
            return False, ""
        alive, why = lease.liveness()
        if alive:
            return False, f"driver {lease.describe()}: {why}"
        if state.status != "RUNNING":
            return False, ""
        return True, f"driver {lease.describe()} is gone: {why}"

    def _refresh_supervisor_log(self, listing: Optional[dict]) -> bool:
        path = self.paths.supervisor_log
        if listing is None:
            found = os.path.exists(path)
        else:
            found = path in listing
        if found:
            self._supervisor_log = self.storage.uri(path)
        return found

    # -- building a snapshot -------------------------------------------------------------------
    def _build(self, header: ExperimentState) -> ExperimentSnapshot:
        trials = []
        restarts: dict[str, list[Restart]] = {}
        failures: dict[str, list[FailureRecord]] = {}
        series: dict[str, _Series] = {}
        lengths: dict[str, int] = {}
        version: dict[str, int] = {}
        for trial_id in self._order:
            tracker = self._trackers[trial_id]
            record = tracker.record()
            trials.append(record)
            version[trial_id] = tracker.version
            s = tracker.results.series
            series[trial_id] = s
            lengths[trial_id] = len(s.iterations)
            if len(record.attempts) > 1:
                restarts[trial_id] = [
                    Restart(a.start_iteration, a.number, a.started, a.restored_from)
                    for a in record.attempts[1:]
                ]
            if record.failures:
                failures[trial_id] = list(record.failures)
        gone, line = self._driver
        state = dataclasses.replace(header, trials=trials)
        if gone:
            state = state.without_driver()
        view = ExperimentView.from_state(state, path=self.paths.uri, metric=self._metric)
        if gone:
            # Its times run until the last sign of life, not until now.
            view = view.with_end(_last_activity(header, trials), state)
        resume = self._resume_line or default_resume_line(self.paths, header)
        return ExperimentSnapshot(
            view=view,
            state=state,
            metrics=[m for m in self._names if _plottable(m)],
            restarts=restarts,
            failures=failures,
            version=version,
            generation=self._generation,
            driver_gone=gone,
            driver=line,
            resume_line=resume,
            supervisor_log=self._supervisor_log,
            path=self.paths.uri,
            series=series,
            lengths=lengths,
        )


def _plottable(name: str) -> bool:
    return name not in _NOT_METRICS


def _last_activity(header: ExperimentState, trials: list[TrialRecord]) -> float:
    last = header.updated
    for trial in trials:
        row = trial.last_result or {}
        stamp = row.get("timestamp")
        if isinstance(stamp, (int, float)) and math.isfinite(stamp):
            last = max(last, stamp)
        for attempt in trial.attempts:
            last = max(last, attempt.ended or attempt.started or 0.0)
    return last


def text_view(snap: ExperimentSnapshot, max_rows: int = 50) -> str:
    """The snapshot as plain text: the table of ``ftnb status``, plus how to resume it."""
    text = render_table(snap.view, max_rows=max_rows)
    if snap.driver_gone and snap.driver:
        text += f"\n{snap.driver}"
    if snap.status == "INTERRUPTED":
        text += f"\nResume it with: {snap.resume_line}"
    return text
