"""All of an experiment at once: the :class:`ExperimentSnapshot` every live view renders, with
each trial's progress from its ``result.json`` rows (:class:`ResultColumns`, :func:`with_rows`),
and its JSON. The widget gets one from each poll of its incremental
:class:`ftnb.ui.monitor.ExperimentMonitor`, which builds them here
(:meth:`ExperimentSnapshot.build`); :func:`read_snapshot` reads one at once. Part of the read
model (:mod:`ftnb.ui.read_model`).

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
                 "num_workers": 1,    # ranks per attempt (a data-parallel group: 2 or more)
                 "last_error": "exception ValueError: boom (attempt 1, iter 4)",
                 "last_failure": {...},   # as in "failures" below, or null
                 "error_reason": null, "metrics": {"loss": 0.12}, "params": {"lr": 0.1}}],
       "driver": {"pid": 4242, "host": "node1", "alive": true, "gone": false,
                  "why": "...", "line": "driver pid 4242 on node1, since ...: ..."},
       # While its driver is silent (RUNNING, no heartbeat for two of its intervals, its
       # death unproven: a killed container; or stopped on this machine), else all null:
       "driver_silent_s": 25.3,   # for how long it has been silent
       "driver_dead_in_s": 34.7,  # when it will count as dead (null: never on its own)
       "takeover": "ftnb resume sweep1 --takeover",  # the line that takes it over now
       "resume_line": null,       # the line that resumes it, when it is INTERRUPTED
       # Why it stopped, when its storage refused a write (a full disk, read-only, denied):
       "storage_fault": "Stopped: its storage refused a write: writing /x failed: ...",
       "supervisor_log": null,    # the supervisor's log, when one ran it
       # The supervisor that ran it (supervisor.json), else null: the launcher it was started
       # with, where it runs (a Ray actor: its name, namespace and node), when it ended:
       "supervisor": {"launcher": "local", "host": "node1", "pid": 4242, "actor": null,
                      "namespace": null, "node_id": null, "started": 1767000000.0,
                      "ended": null, "outcome": null,
                      "line": "Supervisor: local launcher, pid 4242 on node1"}},
     "metrics": ["loss", "acc"],  # every numeric metric reported, first seen first
     "restarts": {"3f2a1_00000": [{"iteration": 4, "attempt": 2, "time": 1767000000.0,
                                   "restored_from": "checkpoint_000003"}]},
     "failures": {"3f2a1_00000": [    # every failure of each trial that failed, oldest first
       {"attempt": 1, "time": 1767000000.0, "iteration": 4, "kind": "exception",
        "type": "ValueError", "message": "boom", "traceback": "...", ...,
        "rank": 1,                # a group's first failing rank (the cause); null: one process
        "ranks": [{"rank": 0, "ended": "peer", "detail": "RuntimeError: ..."},
                  {"rank": 1, "ended": "error", "detail": "ValueError: boom"}],
        "recovered_s": 1.2,       # from the failure to the next attempt's first report
        # how every UI words it (ftnb.ui.failures):
        "summary": "exception ValueError: boom in rank 1 (attempt 1, iter 4)",
        "cause": "rank 1 failed first (the cause): exception ValueError: boom",  # or null
        "collateral": ["rank 0: peer (RuntimeError: ...)"],
        "restart": "restarted in 1.2 s"}]},    # or "restarting", or null
     "versions": {"3f2a1_00000": 7}}   # per trial: changes whenever its rows or record did

A field may be added without a new version; a field removed or given another meaning bumps
``format_version``. :meth:`ExperimentSnapshot.series_json` gives a metric's curves.

Thread-safety: snapshots are immutable once returned and may be handed to any thread.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Optional

from ..core.records import (
    INTERRUPTED,
    ExperimentState,
    ExperimentStatus,
    FailureRecord,
    TrialRecord,
)
from ..storage import ExperimentPaths
from ..storage.result_log import flatten_row
from .failures import failure_json
from .resume_lines import ResumeContext, resume_line
from .status import DriverStatus, supervisor_line, without_driver
from .view import ExperimentView

__all__ = [
    "NOT_METRICS",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_FORMAT_VERSION",
    "ExperimentSnapshot",
    "Restart",
    "ResultColumns",
    "finite",
    "read_snapshot",
    "with_rows",
]

SNAPSHOT_FORMAT = "ftnb.snapshot"
SNAPSHOT_FORMAT_VERSION = 1

_RUNNING = ExperimentStatus.RUNNING
#: What the snapshot's JSON gives of ``supervisor.json``.
_SUPERVISOR_KEYS = ("launcher", "host", "pid", "actor", "namespace", "node_id", "started",
                    "ended", "outcome")


# -- one trial's rows ------------------------------------------------------------------------------
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

    def points(self, metric: str, length: int, start: int = 0
               ) -> Optional[tuple[list[int], list[float]]]:
        """``(iterations, values)`` of ``metric`` in the first ``length`` rows (from row
        ``start``: what a reader that has the first ``start`` lacks), or None."""
        column = self.columns.get(metric)
        if column is None:
            return None
        xs, ys = [], []
        for x, y in zip(self.iterations[start:length], column[start:length]):
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



# -- a snapshot: all of it at once -----------------------------------------------------------------
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
        state: the experiment state the view was built from, as read
            (:func:`ftnb.ui.status.as_read`; trial records merged with their newer
            ``trial.json`` and their ``result.json``).
        metrics: the numeric metric names any trial reported, in the order first seen.
        restarts: ``{trial_id: [Restart, ...]}`` for trials that restarted.
        failures: ``{trial_id: [FailureRecord, ...]}`` for trials that failed (preemptions too).
        version: ``{trial_id: int}``, changed whenever the trial's rows or record changed.
        generation: changes whenever anything in the snapshot changed (elapsed time aside).
        driver_gone: the state says RUNNING but no driver owns the experiment any more.
        driver: one line on the driver (alive or gone, and why); "" when there is none to say.
        driver_status: the :class:`DriverStatus` the two above come from.
        resume_line: the line that resumes the experiment if it is interrupted.
        takeover_line: the line that takes it over from its driver and resumes it (shown while
            the driver is silent: :attr:`takeover`).
        supervisor_log: the supervisor's log file, if a supervisor ran the experiment.
        supervisor: its ``supervisor.json`` (empty when none ran it); :attr:`supervisor_line`
            words it.
        path: the experiment folder as a user can paste it.
    """

    def __init__(self, *, view: ExperimentView, state: ExperimentState, metrics: list[str],
                 restarts: dict[str, list[Restart]], failures: dict[str, list[FailureRecord]],
                 version: dict[str, int], generation: int, driver_status: DriverStatus,
                 driver_gone: bool, driver: str, resume_line: str,
                 supervisor_log: Optional[str], path: str, series: dict[str, ResultColumns],
                 lengths: dict[str, int], takeover_line: str = "",
                 supervisor: Optional[dict] = None) -> None:
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
        self.takeover_line = takeover_line
        self.supervisor_log = supervisor_log
        self.supervisor = dict(supervisor or {})
        self.path = path
        self._series = series
        self._lengths = lengths

    @classmethod
    def build(cls, header: ExperimentState, trials: list[TrialRecord], *,
              paths: ExperimentPaths, rows: dict[str, ResultColumns], metric_names: Iterable[str],
              version: dict[str, int], generation: int, driver: DriverStatus,
              metric: Optional[str] = None, resume: Optional[str] = None,
              resume_context: Optional[ResumeContext] = None,
              supervisor_log: Optional[str] = None,
              supervisor: Optional[dict] = None) -> "ExperimentSnapshot":
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
            lengths={t: len(r.iterations) for t, r in rows.items()},
            takeover_line=resume_line(paths, header, resume_context, takeover=True),
            supervisor=supervisor)

    @property
    def status(self) -> str:
        """The experiment's status: RUNNING, FINISHED, ERRORED or INTERRUPTED."""
        return self.view.status

    @property
    def storage_fault_line(self) -> Optional[str]:
        """What stopped the experiment when its storage refused a write (the path, the error in
        words, the free space and the fix), while it stands INTERRUPTED by it; else None."""
        fault = self.state.storage_fault
        if not fault or self.status != INTERRUPTED:
            return None
        return f"Stopped: its storage refused a write: {fault.get('message')}"

    @property
    def takeover(self) -> Optional[str]:
        """While the driver is silent (:meth:`ftnb.ui.status.DriverStatus.offers_takeover`):
        the line that takes the experiment over now and resumes it; else None. A front end's
        button does the same with ``ftnb.attach(path).resume(takeover=True)``."""
        if self.driver_status.offers_takeover(self.state.status) and self.takeover_line:
            return self.takeover_line
        return None

    @property
    def supervisor_line(self) -> str:
        """One line on the supervisor that ran it: its launcher and where it runs
        (:func:`ftnb.ui.status.supervisor_line`); "" when none did."""
        return supervisor_line(self.supervisor)

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

    def result_columns(self, trial_id: str) -> Optional[ResultColumns]:
        """The trial's result columns, of which this snapshot shows the first
        :meth:`num_rows` (None: no rows read). A new object whenever its ``result.json`` was
        replaced (rows dropped by a restart), so a reader that holds rows can tell."""
        return self._series.get(trial_id)

    def num_rows(self, trial_id: str) -> int:
        """How many result rows of the trial this snapshot holds."""
        return self._lengths.get(trial_id, 0)

    def with_elapsed(self, now: float) -> "ExperimentSnapshot":
        """The same snapshot with the running experiment's elapsed time brought up to ``now``,
        and its driver's silence (for how long, when it counts as dead) as of ``now``."""
        if self.view.status != _RUNNING:
            return self
        clone = object.__new__(ExperimentSnapshot)
        clone.__dict__.update(self.__dict__)
        clone.view = self.view.with_end(now, self.state)
        driver = DriverStatus.of(self.driver_status.lease, now)
        if driver.alive or not self.driver_status.alive:
            # (One that died since is the next poll's to rebuild: its trials read otherwise.)
            clone.driver_status = driver
            clone.driver = driver.line(self.state.status)
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
            "failures": finite(self.failures_json()),
            "versions": dict(self.version),
        }

    def experiment_json(self) -> dict:
        """The experiment as ``ftnb status --json`` prints it (the ``experiment`` part of
        :meth:`to_json`): the view model (each row's ``num_workers``: its ranks), each row's last
        error in full and its last failure (traceback, ranks and restart included), when it was
        updated, its driver (while it is silent: for how long, when it counts as dead, and the
        line that takes it over), the line that resumes it (None unless it is interrupted), and
        its supervisor's log and record (its launcher, where it runs)."""
        data = dataclasses.asdict(self.view)
        trials = {t.trial_id: t for t in self.state.trials}
        for row in data["rows"]:
            trial = trials.get(row["trial_id"])
            failure = trial.failures[-1] if trial is not None and trial.failures else None
            row["last_error"] = failure.summary() if failure is not None else ""
            row["last_failure"] = failure_json(failure, trial) if failure is not None else None
            row["error_reason"] = (trial.error or {}).get("reason") if trial is not None else None
        lease = self.driver_status.lease
        data["updated"] = self.state.updated
        data["driver"] = {
            "pid": lease.pid if lease is not None else None,
            "host": lease.host if lease is not None else None,
            "alive": self.driver_status.alive, "gone": self.driver_gone,
            "why": self.driver_status.why, "line": self.driver or None}
        silent = self.takeover is not None
        data["driver_silent_s"] = self.driver_status.silent_s if silent else None
        data["driver_dead_in_s"] = self.driver_status.dead_in_s if silent else None
        data["takeover"] = self.takeover
        data["resume_line"] = self.resume_line if self.status == INTERRUPTED else None
        data["storage_fault"] = self.storage_fault_line
        data["supervisor_log"] = self.supervisor_log
        record = self.supervisor
        data["supervisor"] = None if not record.get("pid") else dict(
            {key: record.get(key) for key in _SUPERVISOR_KEYS}, line=self.supervisor_line)
        return finite(data)

    def failures_json(self) -> dict:
        """``{trial_id: [failure, ...]}``: every failure as :func:`ftnb.ui.failures.failure_json`
        gives it (the record, and how the UIs word a group's: its cause, the other ranks, the
        restart)."""
        trials = {t.trial_id: t for t in self.state.trials}
        return {t: [failure_json(f, trials.get(t)) for f in fs] for t, fs in self.failures.items()}

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



# -- JSON ------------------------------------------------------------------------------------------
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
