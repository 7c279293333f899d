"""The read model: what every UI knows about an experiment, answered in one place.

* **What is at this path?** :func:`locate` says what a folder is (an experiment, a storage folder
  of experiments, a trial's folder, ...); :func:`experiment_paths` resolves a name or a folder as
  :func:`ftnb.attach` takes it; :func:`experiment_names` lists a storage folder.
* **What is its status?** :func:`read_status`. A state that says RUNNING while no live driver
  owns the experiment (its driver was killed, its machine lost) reads as ``INTERRUPTED``, and so
  do the trials that driver ran (:func:`as_read`); the stored state is never changed, so a
  resume continues from it. :class:`DriverStatus` says who the driver is, and why it counts as
  alive or gone.
* **What are its trials?** :func:`read_state`: each trial's record from the state, replaced by
  its own ``trial.json`` when that is newer (:func:`newer_record`; the controller writes it at
  every transition, the whole state at most once a second); in a snapshot, with its progress
  (iteration, last result) from its ``result.json`` rows (:func:`with_rows`).
* **What line resumes it?** :func:`resume_line`, worded for where it is read
  (:class:`ResumeContext`: a Python prompt, an IPython shell with the ``%ft`` magics, a
  terminal).
* **All of it at once:** :func:`read_snapshot` returns an :class:`ExperimentSnapshot`; the widget
  gets one from each poll of its incremental :class:`ftnb.ui.monitor.ExperimentMonitor`, which
  builds them here (:meth:`ExperimentSnapshot.build`).

The widget, ``ftnb status``/``ls``/``watch``/``logs``/``stop``, :class:`ftnb.ExperimentHandle`
and the JupyterLab panel read experiments through these functions only, so they never disagree.

The snapshot's JSON (:meth:`ExperimentSnapshot.to_json`), what a web front end serves: format
``ftnb.snapshot``, version 1, strict JSON (NaN and infinities are ``null``)::

    {"format": "ftnb.snapshot", "format_version": 1,
     "generation": 12,            # changes whenever anything but the times changed
     "experiment": {              # exactly what `ftnb status --json` prints
       "name": "sweep1", "path": "/home/me/ftnb_results/sweep1",
       "status": "RUNNING",       # RUNNING | FINISHED | ERRORED | INTERRUPTED (driver gone)
       "counts": {"PENDING": 0, "RUNNING": 2, "PAUSED": 0, "TERMINATED": 5, "ERRORED": 1},
       "total_failures": 3, "total_preemptions": 0,
       "elapsed_s": 812.4,        # wall time since it was created
       "running_s": 790.1,        # time its drivers ran it
       "updated": 1767000000.0,   # when its state was last saved (Unix time)
       "metric_columns": ["loss"], "param_columns": ["lr"],
       "rows": [{"trial_id": "3f2a1_00000", "status": "RUNNING", "iteration": 12,
                 "attempts": 2, "failures": 1, "preemptions": 0,
                 "last_error": "exception ValueError: boom (attempt 1, iter 4)",
                 "last_failure": {"attempt": 1, "kind": "exception", "traceback": "...", ...},
                 "error_reason": null, "metrics": {"loss": 0.12}, "params": {"lr": 0.1}}],
       "driver": {"pid": 4242, "host": "node1", "alive": true, "gone": false,
                  "why": "...", "line": "driver pid 4242 on node1, since ...: ..."},
       "resume_line": null,       # the line that resumes it, when it is INTERRUPTED
       "supervisor_log": null},   # the supervisor's log, when one ran it
     "metrics": ["loss", "acc"],  # every numeric metric reported, first seen first
     "restarts": {"3f2a1_00000": [{"iteration": 4, "attempt": 2, "time": 1767000000.0,
                                   "restored_from": "checkpoint_000003"}]},
     "versions": {"3f2a1_00000": 7}}   # per trial: changes whenever its rows or record did

A field may be added without a new version; a field removed or given another meaning bumps
``format_version``. :meth:`ExperimentSnapshot.series_json` gives a metric's curves.

Thread-safety: snapshots are immutable once returned and may be handed to any thread.

Why one module of this size: every answer a reader gives is in it, so that no two readers can
word a rule (a dead driver, the newer record, the resume line) differently; its sections (what
is at a path, status, trials, resume line, snapshot, summary) can become modules of their own
where the storage layer gets its package.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional

from ..storage.lease import LeaseInfo, read_lease
from ..storage.result_log import flatten_row
from ..core.records import ExperimentState, ExperimentStatus, FailureRecord, INTERRUPTED, TrialRecord, TrialStatus
from ..storage import (
    STATE_BACKUP_FILE,
    STATE_FILE,
    ExperimentPaths,
    Storage,
    default_storage_path,
)
from .view import ExperimentView

__all__ = [
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_FORMAT_VERSION",
    "DriverStatus",
    "ExperimentSnapshot",
    "ExperimentSummary",
    "Found",
    "Location",
    "Restart",
    "ResultColumns",
    "ResumeContext",
    "as_read",
    "experiment_names",
    "experiment_paths",
    "finite",
    "ftnb_magics_loaded",
    "is_experiment",
    "locate",
    "merge_trial_records",
    "names_a_folder",
    "newer_record",
    "parse_trial_record",
    "read_driver",
    "read_snapshot",
    "read_state",
    "read_status",
    "resume_line",
    "same_storage_path",
    "summarize",
    "supervisor_log",
    "supervisor_record",
    "tuner_restore_line",
    "with_rows",
    "without_driver",
]

SNAPSHOT_FORMAT = "ftnb.snapshot"
SNAPSHOT_FORMAT_VERSION = 1

_RUNNING = ExperimentStatus.RUNNING


# -- what is at a path ------------------------------------------------------------------------------
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


# -- its driver and status ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DriverStatus:
    """Who drives an experiment, as its owner lease (``owner.json``) says, seen from this
    process: ``alive`` and ``why`` are :meth:`ftnb.storage.lease.LeaseInfo.liveness`'s verdict."""

    lease: Optional[LeaseInfo]
    alive: bool
    why: str

    @classmethod
    def of(cls, lease: Optional[LeaseInfo]) -> "DriverStatus":
        """The verdict on ``lease`` (None: there is no owner.json)."""
        if lease is None:
            return cls(None, False, "")
        alive, why = lease.liveness()
        return cls(lease, alive, why)

    def gone(self, stored_status: str) -> bool:
        """Whether an experiment whose state says ``stored_status`` lost its driver: the state
        says RUNNING but no live driver owns it."""
        return stored_status == _RUNNING and not self.alive

    def line(self, stored_status: str) -> str:
        """One line on the driver: alive, or gone and why; "" when there is nothing to say (a
        stopped experiment whose driver let go, or died after saving it)."""
        lease = self.lease
        if lease is None:
            return "no driver owns it (no owner.json)" if stored_status == _RUNNING else ""
        if self.alive:
            return f"driver {lease.describe()}: {self.why}"
        if stored_status != _RUNNING:
            return ""
        return f"driver {lease.describe()} is gone: {self.why}"


def read_driver(paths: ExperimentPaths) -> DriverStatus:
    """The experiment's driver as its owner lease says now."""
    return DriverStatus.of(read_lease(paths))


def without_driver(state: ExperimentState) -> ExperimentState:
    """A copy of ``state`` as it reads once its driver is gone: INTERRUPTED, and so are the
    trials it was running (their attempts died with it; a resume continues them from their
    checkpoints). ``state`` itself is not changed."""
    trials = [replace(t, status=INTERRUPTED) if t.status == TrialStatus.RUNNING else t
              for t in state.trials]
    return replace(state, status=INTERRUPTED, trials=trials)


def as_read(state: ExperimentState, driver: DriverStatus) -> ExperimentState:
    """``state`` as every view shows it: :func:`without_driver` if its driver is gone."""
    return without_driver(state) if driver.gone(state.status) else state


def read_status(paths: ExperimentPaths) -> str:
    """RUNNING, FINISHED, ERRORED or INTERRUPTED (which a RUNNING state whose driver is gone
    reads as)."""
    status = ExperimentState.load(paths).status
    if status != _RUNNING:
        return status
    return INTERRUPTED if read_driver(paths).gone(status) else status


# -- its trials ---------------------------------------------------------------------------------------
def parse_trial_record(data: bytes, trial_id: str) -> Optional[TrialRecord]:
    """The trial record in ``data`` (a ``trial.json``), or None if it is unreadable or another
    trial's."""
    try:
        record = TrialRecord.from_json(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return record if record.trial_id == trial_id else None


def newer_record(current: Optional[TrialRecord],
                 candidate: Optional[TrialRecord]) -> Optional[TrialRecord]:
    """The record to believe: ``candidate`` (a trial's own ``trial.json``) when its ``seq`` is
    higher than ``current``'s (the one in the state), else ``current``."""
    if candidate is not None and (current is None or candidate.seq > current.seq):
        return candidate
    return current


def merge_trial_records(state: ExperimentState, paths: ExperimentPaths) -> ExperimentState:
    """Replace each trial's record in ``state`` by its own ``trial.json`` where that is newer
    (after a driver died, the trial records are its latest word). Returns ``state``."""
    storage = paths.storage
    for i, trial in enumerate(state.trials):
        try:
            data = storage.read_bytes(paths.trial(trial.dir_name).record)
        except FileNotFoundError:
            continue
        state.trials[i] = newer_record(trial, parse_trial_record(data, trial.trial_id)) or trial
    return state


def read_state(paths: ExperimentPaths) -> ExperimentState:
    """The experiment's state as its files have it, trial records merged (not as read: see
    :func:`as_read`). Raises :class:`ftnb.core.records.StateFormatError` where there is none."""
    return merge_trial_records(ExperimentState.load(paths), paths)


#: Keys of result rows that are not metrics to plot: ftnb's bookkeeping and the x axis itself.
NOT_METRICS = frozenset(
    {"training_iteration", "trial_id", "timestamp", "attempt", "checkpoint_dir_name", "done"}
)


class ResultColumns:
    """One trial's result rows as columns, append-only: a snapshot sees a prefix of the lists
    by its length, so appending after a snapshot never changes what that snapshot shows. A
    ``result.json`` that was replaced gets new columns."""

    __slots__ = ("iterations", "columns", "last_row")

    def __init__(self) -> None:
        self.iterations: list[int] = []
        self.columns: dict[str, list[Optional[float]]] = {}
        self.last_row: Optional[dict] = None

    def append(self, row: dict, names: dict[str, None]) -> None:
        """Add ``row``; its new numeric metric names go into ``names`` (ordered first seen)."""
        n = len(self.iterations)
        iteration = row.get("training_iteration")
        self.iterations.append(iteration if isinstance(iteration, int) else n + 1)
        flat = flatten_row(row) if any(isinstance(v, dict) for v in row.values()) else row
        for key, value in flat.items():
            if key in NOT_METRICS or isinstance(value, bool):
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
        """``(iterations, values)`` of ``metric`` in the first ``length`` rows, or None."""
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
        """The value of ``metric`` at ``iteration`` in the first ``length`` rows, or None."""
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


def with_rows(record: TrialRecord, rows: ResultColumns) -> TrialRecord:
    """``record`` with its progress (iteration, last result) from its ``result.json`` rows:
    they are the truth for progress, the state being saved at most once a second and
    ``trial.json`` only at transitions."""
    iteration = rows.iterations[-1] if rows.iterations else 0
    if iteration == record.iteration and rows.last_row == record.last_result:
        return record
    return replace(record, iteration=iteration, last_result=rows.last_row)


# -- the line that resumes it ------------------------------------------------------------------------
class ResumeContext(str, enum.Enum):
    """Where a resume line is read: it must be one that works there."""

    PYTHON = "python"  # a script, or a notebook without the %ft magics
    MAGICS = "magics"  # an IPython shell with %load_ext ftnb done
    TERMINAL = "terminal"  # a shell (the ftnb command)


def resume_line(paths: ExperimentPaths, state: ExperimentState,
                context: Optional[ResumeContext] = None) -> str:
    """The one line that resumes the experiment (once it is interrupted), for ``context``
    (default: MAGICS in an IPython shell with the ``%ft`` magics loaded, else PYTHON).

    * Started by ``ftnb run`` (its origin says ``"via": "cli"``): ``ftnb resume NAME``, which
      imports the recorded trainable and space again, from any shell.
    * Launched with ``%ftrun`` or :func:`ftnb.launch` (the state records the names it was
      launched with): ``%ftresume NAME`` with the magics; elsewhere the Python line
      ``ftnb.attach(PATH).resume(TRAINABLE, param_space=SPACE)`` with the recorded names.
    * Run by ``Tuner.fit()``: ``ftnb.Tuner.restore(PATH, TRAINABLE).fit()`` (with
      ``param_space=param_space`` when its trials hold objects given again); in a terminal,
      where no function can be passed, a hint to do that or run the same ``ftnb.run`` again.

    NAME is the folder instead when it is not under the default storage path.
    """
    origin = state.settings.get("origin")
    if isinstance(origin, dict) and origin.get("via") == "cli":
        return f"ftnb resume {shlex.quote(_reference(paths, state))}"
    if context is None:
        context = ResumeContext.MAGICS if ftnb_magics_loaded() else ResumeContext.PYTHON
    if origin:
        if context is ResumeContext.MAGICS:
            return f"%ftresume {_reference(paths, state)}"
        trainable = origin.get("trainable") if isinstance(origin, dict) else None
        trainable = trainable or state.trainable.rsplit(".", 1)[-1]
        space = origin.get("param_space") if isinstance(origin, dict) else None
        with_space = f", param_space={space}" if space else ""
        return f"ftnb.attach({paths.uri!r}).resume({trainable}{with_space})"
    if context is ResumeContext.TERMINAL:
        return (f"{tuner_restore_line(paths.uri, '<trainable>')}, or run the same "
                "ftnb.run(...) again")
    return tuner_restore_line(paths.uri, state.trainable, _holds_objects(state))


def tuner_restore_line(uri: str, trainable: str, with_space: bool = False) -> str:
    """``ftnb.Tuner.restore(URI, TRAINABLE).fit()``, with ``param_space=param_space`` when the
    space must be given again (its objects are not saved with the experiment)."""
    space = ", param_space=param_space" if with_space else ""
    return f"ftnb.Tuner.restore({uri!r}, {trainable}{space}).fit()"


def _holds_objects(state: ExperimentState) -> bool:
    from ..objects import walk_placeholders

    return bool(walk_placeholders(state.param_space))


def _reference(paths: ExperimentPaths, state: ExperimentState) -> str:
    """The experiment's name where that finds it (under the default storage path), else its
    folder."""
    if same_storage_path(paths.parent_uri, default_storage_path()):
        return state.name
    return paths.uri


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


# -- a snapshot: all of it at once ---------------------------------------------------------------------
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
    """What an experiment looked like at one reading. Immutable once returned.

    Attributes:
        view: the :class:`ftnb.ui.view.ExperimentView` (status ``INTERRUPTED`` when the driver
            is gone although the state says RUNNING).
        state: the experiment state the view was built from, as read (:func:`as_read`; trial
            records merged with their newer ``trial.json`` and their ``result.json``).
        metrics: the numeric metric names any trial reported, in the order first seen.
        restarts: ``{trial_id: [Restart, ...]}`` for trials that restarted.
        failures: ``{trial_id: [FailureRecord, ...]}`` for trials that failed (preemptions too).
        version: ``{trial_id: int}``, changed whenever the trial's rows or record changed.
        generation: changes whenever anything in the snapshot changed (elapsed time aside).
        driver_gone: the state says RUNNING but no driver owns the experiment any more.
        driver: one line on the driver (alive or gone, and why); "" when there is none to say.
        driver_status: the :class:`DriverStatus` the two above come from.
        resume_line: the line that resumes the experiment if it is interrupted.
        supervisor_log: the supervisor's log file, if a supervisor ran the experiment.
        path: the experiment folder as a user can paste it.
    """

    def __init__(self, *, view: ExperimentView, state: ExperimentState, metrics: list[str],
                 restarts: dict[str, list[Restart]], failures: dict[str, list[FailureRecord]],
                 version: dict[str, int], generation: int, driver_status: DriverStatus,
                 driver_gone: bool, driver: str, resume_line: str,
                 supervisor_log: Optional[str], path: str, series: dict[str, ResultColumns],
                 lengths: dict[str, int]) -> None:
        self.view = view
        self.state = state
        self.metrics = metrics
        self.restarts = restarts
        self.failures = failures
        self.version = version
        self.generation = generation
        self.driver_status = driver_status
        self.driver_gone = driver_gone
        self.driver = driver
        self.resume_line = resume_line
        self.supervisor_log = supervisor_log
        self.path = path
        self._series = series
        self._lengths = lengths

    @classmethod
    def build(cls, header: ExperimentState, trials: list[TrialRecord], *,
              paths: ExperimentPaths, rows: dict[str, ResultColumns], metric_names: Iterable[str],
              version: dict[str, int], generation: int, driver: DriverStatus,
              metric: Optional[str] = None, resume: Optional[str] = None,
              resume_context: Optional[ResumeContext] = None,
              supervisor_log: Optional[str] = None) -> "ExperimentSnapshot":
        """The snapshot of an experiment whose state's ``header`` (its trials aside) and
        trial records (with their rows: :func:`with_rows`) were read, ``rows`` being each
        trial's result columns. ``resume``: a resume line that replaces :func:`resume_line`."""
        restarts: dict[str, list[Restart]] = {}
        failures: dict[str, list[FailureRecord]] = {}
        for record in trials:
            if len(record.attempts) > 1:
                restarts[record.trial_id] = [
                    Restart(a.start_iteration, a.number, a.started, a.restored_from)
                    for a in record.attempts[1:]
                ]
            if record.failures:
                failures[record.trial_id] = list(record.failures)
        gone = driver.gone(header.status)
        state = replace(header, trials=trials)
        if gone:
            state = without_driver(state)
        view = ExperimentView.from_state(state, path=paths.uri, metric=metric)
        if gone:  # its times run until its last sign of life, not until now
            view = view.with_end(_last_activity(header, trials), state)
        return cls(
            view=view, state=state, metrics=[m for m in metric_names if m not in NOT_METRICS],
            restarts=restarts, failures=failures, version=version, generation=generation,
            driver_status=driver, driver_gone=gone, driver=driver.line(header.status),
            resume_line=resume or resume_line(paths, header, resume_context),
            supervisor_log=supervisor_log, path=paths.uri, series=rows,
            lengths={t: len(r.iterations) for t, r in rows.items()})

    @property
    def status(self) -> str:
        """The experiment's status: RUNNING, FINISHED, ERRORED or INTERRUPTED."""
        return self.view.status

    @property
    def finished(self) -> bool:
        """Whether nothing will change any more without a restore (not RUNNING)."""
        return self.view.status != _RUNNING

    @property
    def trial_ids(self) -> list[str]:
        """The trials' ids, in the state's order."""
        return [t.trial_id for t in self.state.trials]

    def series(self, metric: str, trial_ids: Optional[Iterable[str]] = None
               ) -> dict[str, tuple[list[int], list[float]]]:
        """``{trial_id: (iterations, values)}`` of ``metric`` for every trial that reported it
        (or only for ``trial_ids``). Rows without the metric are left out."""
        wanted = self._series.keys() if trial_ids is None else trial_ids
        out = {}
        for trial_id in wanted:
            rows = self._series.get(trial_id)
            if rows is None:
                continue
            points = rows.points(metric, self._lengths.get(trial_id, 0))
            if points is not None:
                out[trial_id] = points
        return out

    def value_at(self, trial_id: str, metric: str, iteration: int) -> Optional[float]:
        """The value of ``metric`` that ``trial_id`` reported at ``iteration`` (None if none)."""
        rows = self._series.get(trial_id)
        if rows is None:
            return None
        return rows.value_at(metric, iteration, self._lengths.get(trial_id, 0))

    def num_rows(self, trial_id: str) -> int:
        """How many result rows of the trial this snapshot holds."""
        return self._lengths.get(trial_id, 0)

    def with_elapsed(self, now: float) -> "ExperimentSnapshot":
        """The same snapshot with the running experiment's elapsed time brought up to ``now``."""
        if self.view.status != _RUNNING:
            return self
        clone = object.__new__(ExperimentSnapshot)
        clone.__dict__.update(self.__dict__)
        clone.view = self.view.with_end(now, self.state)
        return clone

    # -- as JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The snapshot as strict JSON-able data: the document described in the module
        docstring (format ``ftnb.snapshot``, version 1)."""
        return {
            "format": SNAPSHOT_FORMAT,
            "format_version": SNAPSHOT_FORMAT_VERSION,
            "generation": self.generation,
            "experiment": self.experiment_json(),
            "metrics": list(self.metrics),
            "restarts": finite({t: [dataclasses.asdict(r) for r in rs]
                                for t, rs in self.restarts.items()}),
            "versions": dict(self.version),
        }

    def experiment_json(self) -> dict:
        """The experiment as ``ftnb status --json`` prints it (the ``experiment`` part of
        :meth:`to_json`): the view model, each row's last error in full and its last failure
        (traceback included), when it was updated, its driver, the line that resumes it (None
        unless it is interrupted) and its supervisor's log."""
        data = dataclasses.asdict(self.view)
        trials = {t.trial_id: t for t in self.state.trials}
        for row in data["rows"]:
            trial = trials.get(row["trial_id"])
            failure = trial.failures[-1] if trial is not None and trial.failures else None
            row["last_error"] = failure.summary() if failure is not None else ""
            row["last_failure"] = dataclasses.asdict(failure) if failure is not None else None
            row["error_reason"] = (trial.error or {}).get("reason") if trial is not None else None
        lease = self.driver_status.lease
        data["updated"] = self.state.updated
        data["driver"] = {
            "pid": lease.pid if lease is not None else None,
            "host": lease.host if lease is not None else None,
            "alive": self.driver_status.alive, "gone": self.driver_gone,
            "why": self.driver_status.why, "line": self.driver or None}
        data["resume_line"] = self.resume_line if self.status == INTERRUPTED else None
        data["supervisor_log"] = self.supervisor_log
        return finite(data)

    def series_json(self, metric: str, trial_ids: Optional[Iterable[str]] = None) -> dict:
        """:meth:`series` as strict JSON-able data: ``{"metric": NAME, "trials": {trial_id:
        {"iterations": [...], "values": [...]}}}`` (a NaN value is null: a gap in the curve)."""
        trials = {t: {"iterations": xs, "values": ys}
                  for t, (xs, ys) in self.series(metric, trial_ids).items()}
        return finite({"metric": metric, "trials": trials})


def _last_activity(header: ExperimentState, trials: list[TrialRecord]) -> float:
    """The last sign of life of a driver that died: its last save, or later in its trials."""
    last = header.updated
    for trial in trials:
        stamp = (trial.last_result or {}).get("timestamp")
        if isinstance(stamp, (int, float)) and math.isfinite(stamp):
            last = max(last, stamp)
        for attempt in trial.attempts:
            last = max(last, attempt.ended or attempt.started or 0.0)
    return last


def read_snapshot(paths: ExperimentPaths, *, metric: Optional[str] = None,
                  resume_context: Optional[ResumeContext] = None) -> ExperimentSnapshot:
    """The experiment as it is now, read once (the first poll of an
    :class:`ftnb.ui.monitor.ExperimentMonitor`). Raises :class:`ftnb.core.records.StateFormatError`
    where there is no readable experiment state."""
    from .monitor import ExperimentMonitor

    return ExperimentMonitor(paths, metric=metric, resume_context=resume_context).poll()


def supervisor_record(paths: ExperimentPaths) -> dict:
    """``supervisor.json`` (empty when no supervisor ran the experiment, or it is unreadable)."""
    try:
        record = json.loads(paths.storage.read_bytes(paths.supervisor))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def supervisor_log(paths: ExperimentPaths) -> Optional[str]:
    """The supervisor's log as a reader finds it: the experiment's ``supervisor.log`` once the
    supervisor moved (local disk) or uploaded (at its end, elsewhere) it there, else the file
    ``supervisor.json`` names (on the supervisor's machine); None when no supervisor ran it."""
    if paths.storage.exists(paths.supervisor_log):
        return paths.storage.uri(paths.supervisor_log)
    return supervisor_record(paths).get("log")


# -- a summary: one experiment in a list -----------------------------------------------------------------
@dataclass(frozen=True)
class ExperimentSummary:
    """One experiment as a list of them shows it (``ftnb ls``), status as read."""

    name: str
    path: str
    status: str
    trials: int
    counts: dict
    failures: int
    preemptions: int
    updated: float


def summarize(paths: ExperimentPaths) -> ExperimentSummary:
    """The experiment's summary, from its state file (one read) and, when the state says
    RUNNING, its owner lease. When that driver is gone the state stopped at its last save, so
    the trials' own records are read too, as :func:`read_snapshot` reads them. Raises
    :class:`ftnb.core.records.StateFormatError` where there is no readable state."""
    state = ExperimentState.load(paths)
    if state.status == _RUNNING:
        driver = read_driver(paths)
        if driver.gone(state.status):
            state = as_read(merge_trial_records(state, paths), driver)
    return ExperimentSummary(
        name=paths.name, path=paths.uri, status=state.status, trials=len(state.trials),
        counts=state.counts(), failures=sum(t.num_failures for t in state.trials),
        preemptions=sum(t.num_preemptions for t in state.trials), updated=state.updated)


# -- JSON -------------------------------------------------------------------------------------------------
def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (recursively), so that
    ``json.dumps(obj, allow_nan=False)`` (strict JSON: jq, JavaScript) works."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
