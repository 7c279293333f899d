"""An incremental reader of one experiment directory: how the live UIs read the read model.

:class:`ExperimentMonitor` follows an experiment that may be running in another process, on
another machine, or that ended long ago (ARCHITECTURE.md, principle 7: every UI is a reader).
Each :meth:`ExperimentMonitor.poll` returns an :class:`ftnb.ui.read_model.ExperimentSnapshot` and
reads only what changed since the last one:

* ``experiment_state.json`` is re-read only when it changed (its version: on a local disk its
  inode, size and mtime), and trials whose JSON did not change keep their parsed record;
* a trial's ``trial.json`` (the controller's newer word between two state saves) is re-read
  only when it changed;
* a trial's ``result.json`` is tailed from the last byte read; a torn last line waits for its
  end, and a file that was replaced (rows dropped when a trial restarted from a checkpoint) is
  read again from the start;
* ``owner.json`` (the lease) is re-read only when it changed.

What the files mean (which trial record wins, a dead driver read as INTERRUPTED, the resume
line) is :mod:`ftnb.ui.read_model`'s to say: a poll hands it what was read
(:meth:`ExperimentSnapshot.build`), so the widget and ``ftnb status`` never disagree.

On a local disk a poll that finds nothing new costs one ``stat`` per file. On object stores
(``s3://``) a poll lists the experiment folder once and reads the files whose size or ETag
changed (:meth:`ftnb.storage.Storage.file_versions`); callers poll those less often
(:attr:`ftnb.storage.Storage.poll_interval_s`).

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
import os
import time
from typing import Any, Optional, Union

from ..core.records import (
    ExperimentState,
    ExperimentStatus,
    StateFormatError,
    StateVersionError,
    TrialRecord,
    with_journal,
)
from ..storage import ExperimentPaths, FileVersion, FileVersions, Storage, parse_json_line
from ..storage.record_journal import JournalCache
from ..storage.lease import LeaseInfo
from .failures import group_failures_text
from .read_model import (
    DriverStatus,
    ExperimentSnapshot,
    Restart,
    ResultColumns,
    ResumeContext,
    ftnb_magics_loaded,
    newer_record,
    parse_trial_record,
    resume_line,
    same_storage_path,
    with_rows,
)
from .view import render_table

__all__ = [
    "ExperimentMonitor",
    "ExperimentSnapshot",
    "Restart",
    "default_resume_line",
    "ftnb_magics_loaded",
    "same_storage_path",
    "text_view",
]


# -- result.json tails --------------------------------------------------------------------------
class _ResultTail:
    """Follows one ``result.json`` from the last byte read."""

    # How much of the last consumed line is compared on each read: a file replaced by one that
    # happens to be as long or longer (a restart dropped rows, then new rows came) is told apart
    # by its content, even if the new file reuses the old inode number.
    _OVERLAP = 256

    def __init__(self) -> None:
        self.version: Optional[FileVersion] = None
        self.offset = 0
        self.tail = b""
        self.rows = ResultColumns()
        self.exists = False

    def reset(self) -> None:
        self.offset = 0
        self.tail = b""
        self.rows = ResultColumns()

    def consume(self, data: bytes, names: dict[str, None]) -> bool:
        """Parse the complete lines of ``data`` (read from ``offset``); True if rows came."""
        end = data.rfind(b"\n") + 1
        if not end:
            return False  # only a torn (still being written) line: wait for its end
        got = False
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            row = parse_json_line(line)  # None: torn or corrupt, skipped: a view shows the rest
            if row is not None:
                self.rows.append(row, names)
                got = True
        self.offset += end
        self.tail = data[max(0, end - self._OVERLAP) : end]
        return got

    def read(self, storage: Storage, path: str, version: Optional[FileVersion],
             names: dict[str, None], stats: dict) -> bool:
        """Bring the tail up to date with the file's ``version`` (None: it is gone); True if
        its rows changed."""
        if version == self.version:
            return False
        if version is None:
            had_rows = bool(self.rows.iterations)
            self.version, self.exists = None, False
            self.reset()
            return had_rows
        changed = False
        try:
            data = None
            size = version[0]
            if self.offset and size is not None and size >= self.offset:
                # Read from a little before the offset: the overlap tells a file that was
                # replaced (read it again whole) from one that grew.
                want = self.offset - len(self.tail)
                start, chunk = storage.read_from(path, want, size)
                if start == want and chunk[: len(self.tail)] == self.tail:
                    data = chunk[len(self.tail) :]
            if data is None:
                if self.offset:
                    self.reset()
                    changed = True
                _, data = storage.read_from(path, 0, size)
        except FileNotFoundError:
            return changed  # replaced between the look and the read: the next poll reads it
        stats["files_read"] += 1
        stats["bytes_read"] += len(data)
        self.version, self.exists = version, True
        return self.consume(data, names) or changed


# -- trials -------------------------------------------------------------------------------------
class _TrialTracker:
    """What the monitor knows about one trial, kept between polls."""

    __slots__ = (
        "trial_id", "record_path", "results_path", "state_raw", "state_record", "file_version",
        "file_record", "results", "version", "effective", "effective_key",
    )

    def __init__(self, trial_id: str, dir_name: str, paths: ExperimentPaths) -> None:
        self.trial_id = trial_id
        trial_paths = paths.trial(dir_name)
        self.record_path, self.results_path = trial_paths.record, trial_paths.results
        self.state_raw: Optional[dict] = None
        self.state_record: Optional[TrialRecord] = None
        self.file_version: Optional[FileVersion] = None
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

    def set_file_record(self, version: Optional[FileVersion], data: Optional[bytes]) -> bool:
        self.file_version = version
        record = parse_trial_record(data, self.trial_id) if data is not None else None
        if record is None:
            return False  # gone, or unreadable (should not happen: it is written atomically)
        self.file_record = record
        return True

    def record(self) -> TrialRecord:
        """The newest record of the trial, with its iteration and last result from its rows."""
        base = newer_record(self.state_record, self.file_record)
        assert base is not None
        rows = self.results.rows
        key = (id(base), id(rows), len(rows.iterations), self.results.exists)
        if key == self.effective_key and self.effective is not None:
            return self.effective
        record = with_rows(base, rows) if self.results.exists else base
        self.effective, self.effective_key = record, key
        return record


def default_resume_line(paths: ExperimentPaths, state: ExperimentState,
                        magics: Optional[bool] = None) -> str:
    """The one line that resumes an interrupted experiment (:func:`ftnb.ui.read_model.resume_line`;
    ``magics``: whether the ``%ft`` magics can run it, by default whether this process is an
    IPython shell with ``%load_ext ftnb`` done)."""
    context = None if magics is None else (
        ResumeContext.MAGICS if magics else ResumeContext.PYTHON)
    return resume_line(paths, state, context)


class ExperimentMonitor:
    """Incremental reader of one experiment directory; see the module docstring.

    Args:
        path_or_paths: the experiment folder (a local path or an fsspec URL such as
            ``s3://bucket/runs/sweep1``), or its :class:`~ftnb.storage.ExperimentPaths`.
        storage_filesystem: an fsspec filesystem to read through (credentials, endpoint).
        metric: the metric the view lists first (default: the experiment's ``metric``).
        resume_line: the line shown to resume an interrupted experiment (default:
            :func:`ftnb.ui.read_model.resume_line` for ``resume_context``).
        resume_context: where the resume line is read (:class:`ftnb.ui.read_model.ResumeContext`;
            default: this process, a Python or an IPython shell).
    """

    def __init__(
        self,
        path_or_paths: Union[str, os.PathLike, ExperimentPaths],
        storage_filesystem: Any = None,
        *,
        metric: Optional[str] = None,
        resume_line: Optional[str] = None,
        resume_context: Optional[ResumeContext] = None,
    ) -> None:
        if isinstance(path_or_paths, ExperimentPaths):
            self.paths = path_or_paths
        else:
            self.paths = ExperimentPaths.at(os.fspath(path_or_paths), storage_filesystem)
        self.storage = self.paths.storage
        self._metric = metric
        self._resume_line = resume_line
        self._resume_context = resume_context
        self._state_version: Optional[FileVersion] = None
        self._state: Optional[ExperimentState] = None
        self._journal = JournalCache()  # the state's journal of trial records, as read so far
        self._trackers: dict[str, _TrialTracker] = {}
        self._order: list[str] = []
        self._names: dict[str, None] = {}  # metric names, ordered as first seen
        self._lease_version: Optional[FileVersion] = None
        self._lease: Optional[LeaseInfo] = None
        self._driver = DriverStatus(None, False, "")
        self._verdict: tuple[bool, bool] = (False, False)
        self._supervisor_log: Optional[str] = None  # the experiment's supervisor.log, once found
        self._record_version: Optional[FileVersion] = None
        self._record: dict = {}  # supervisor.json, as last read
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

        Raises :class:`ftnb.core.records.StateFormatError` while the folder holds no readable
        experiment state (not created yet, or not an experiment).
        """
        self.stats["polls"] += 1
        versions = self.storage.file_versions(self.paths.dir)
        changed = self._refresh_state(versions)
        state = self._state
        assert state is not None
        for trial_id in self._order:
            tracker = self._trackers[trial_id]
            if self._refresh_trial(tracker, versions):
                tracker.version += 1
                changed = True
        if self._refresh_driver(state, versions):
            changed = True
        if self._refresh_supervisor(versions):
            changed = True
        if changed or self._dirty or self._snapshot is None:
            self._generation += 1
            self._snapshot = self._build(state)
            self._dirty = False
            return self._snapshot
        return self._snapshot.with_elapsed(time.time())

    def _refresh_state(self, versions: FileVersions) -> bool:
        version = versions.get(self.paths.state)
        if version == self._state_version and self._state is not None:
            return False
        parsed = self._read_state() if version is not None else None
        if parsed is None:
            if self._state is not None and version is not None:
                return False  # a damaged write (should not happen): keep the last good one
            # No state file, or an unreadable one: the previous generation, or an error that
            # says what is there instead (StateFormatError).
            loaded = ExperimentState.load(self.paths)
            parsed = dataclasses.replace(loaded, trials=[]), [t.to_json() for t in loaded.trials]
        header, trials_raw = parsed
        self._state_version = version
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
            header = ExperimentState.from_json(
                {**data, "trials": []}, where=self.storage.uri(self.paths.state)
            )
            data = with_journal(self.paths, data, self._journal)
            trials = data.get("trials", [])
            if not isinstance(trials, list) or not all(
                isinstance(t, dict) and "trial_id" in t for t in trials
            ):
                return None
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

    def _read_changed(self, path: str, version: Optional[FileVersion]) -> Optional[bytes]:
        """The file at ``version`` (None: gone), or None if it is gone."""
        if version is None:
            return None
        try:
            return self._read(path)
        except FileNotFoundError:
            return None

    def _refresh_trial(self, tracker: _TrialTracker, versions: FileVersions) -> bool:
        changed = False
        version = versions.get(tracker.record_path)
        if version != tracker.file_version:
            data = self._read_changed(tracker.record_path, version)
            if tracker.set_file_record(version if data is not None else None, data):
                changed = True
        rows = tracker.results.read(self.storage, tracker.results_path,
                                    versions.get(tracker.results_path), self._names, self.stats)
        return rows or changed

    def _refresh_driver(self, state: ExperimentState, versions: FileVersions) -> bool:
        path = self.paths.lease
        version = versions.get(path)
        if version != self._lease_version:
            self._lease_version = version
            self._lease = None
            data = self._read_changed(path, version)
            if data is not None:
                try:
                    self._lease = LeaseInfo.from_json(json.loads(data))
                except (ValueError, TypeError):
                    self._lease = None
        self._driver = DriverStatus.of(self._lease)
        # Only the verdict counts as a change: the line's wording (a heartbeat's age) moves on
        # every poll and would rebuild the snapshot each time.
        verdict = (self._driver.gone(state.status), bool(self._driver.line(state.status)))
        changed = verdict != self._verdict
        self._verdict = verdict
        return changed

    def _refresh_supervisor(self, versions: FileVersions) -> bool:
        """``supervisor.json`` (read again only when it changed: a supervisor writes it when it
        starts and when it ends), and the supervisor's log as
        :func:`ftnb.ui.read_model.supervisor_log` finds it: the experiment's
        ``supervisor.log`` once it is there (then never looked for again), else the file
        ``supervisor.json`` names (on the supervisor's machine, while it runs)."""
        changed = False
        if self._supervisor_log is None and versions.get(self.paths.supervisor_log) is not None:
            self._supervisor_log = self.storage.uri(self.paths.supervisor_log)
            changed = True
        version = versions.get(self.paths.supervisor)
        if version == self._record_version:
            return changed
        self._record_version = version
        data = self._read_changed(self.paths.supervisor, version)
        try:
            record = json.loads(data) if data is not None else {}
        except ValueError:
            record = {}
        record = record if isinstance(record, dict) else {}
        if record != self._record:
            self._record = record
            changed = True
        return changed

    # -- building a snapshot -------------------------------------------------------------------
    def _build(self, header: ExperimentState) -> ExperimentSnapshot:
        trials, rows, version = [], {}, {}
        for trial_id in self._order:
            tracker = self._trackers[trial_id]
            trials.append(tracker.record())
            version[trial_id] = tracker.version
            rows[trial_id] = tracker.results.rows
        return ExperimentSnapshot.build(
            header, trials, paths=self.paths, rows=rows, metric_names=self._names,
            version=version, generation=self._generation, driver=self._driver,
            metric=self._metric, resume=self._resume_line, resume_context=self._resume_context,
            supervisor_log=self._supervisor_log or self._record.get("log"),
            supervisor=self._record)


def text_view(snap: ExperimentSnapshot, max_rows: int = 50) -> str:
    """The snapshot as plain text: the table of ``ftnb status`` (and its group failures), the
    supervisor's launcher and where it runs, plus how to resume it, or to take it over from a
    silent driver."""
    text = render_table(snap.view, max_rows=max_rows)
    failures = group_failures_text(snap.state.trials)
    if failures:
        text += f"\n{failures}"
    if snap.supervisor_line:  # its launcher, and where it runs
        text += f"\n{snap.supervisor_line}"
    if snap.driver_gone and snap.driver:
        text += f"\n{snap.driver}"
    elif snap.takeover is not None:  # silent: for how long, when dead, and the way out now
        text += f"\n{snap.driver}\nTake it over now with: {snap.takeover}"
    if snap.status == ExperimentStatus.INTERRUPTED:
        text += f"\nResume it with: {snap.resume_line}"
    return text
