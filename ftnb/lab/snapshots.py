"""The experiments a panel (or a widget) has open: one incremental reader each, polled only when
a request asks (``GET ftnb/api/experiment`` and ``ftnb/api/results``), so a page that asks every
second costs one ``stat`` per file while nothing changes, and the server does nothing at all
while no page asks.

A curve is sent incrementally: each trial's answer carries a ``cursor`` (which rows file it
read, and how many rows); given back as ``since``, only the rows after it are sent, or all of
them with ``reset`` when that file was replaced meanwhile (a restart from a checkpoint drops
the rows after it, and the rows that follow have the same iterations).
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from typing import Any, Mapping, Optional

from ..storage import ExperimentPaths
from ..ui.monitor import ExperimentMonitor
from ..ui.read_model import ExperimentSnapshot, ResultColumns, ResumeContext, finite
from ..ui.view import format_value

__all__ = ["OpenExperiment", "OpenExperiments"]


class OpenExperiment:
    """One experiment's reader, its lock (a monitor belongs to one thread at a time), and the
    names of the rows files it has read (for cursors)."""

    def __init__(self, paths: ExperimentPaths) -> None:
        self.paths = paths
        self.monitor = ExperimentMonitor(paths, resume_context=ResumeContext.MAGICS)
        self.lock = threading.Lock()
        self._prefix = secrets.token_hex(3)  # a new reader's cursors never match old ones
        self._files: dict[str, tuple[ResultColumns, str]] = {}
        self._count = 0

    def poll(self) -> ExperimentSnapshot:
        """The experiment as it is now (reads what changed since the last poll)."""
        with self.lock:
            return self.monitor.poll()

    def series(self, snap: ExperimentSnapshot, metric: str, since: Mapping[str, Any]) -> dict:
        """``{trial_id: {"label", "x", "y", "rows", "cursor", "reset"}}``: ``metric`` in the
        rows each trial reported after ``since[trial_id]`` (a cursor of an earlier answer, or
        a number of rows); trials with nothing new are left out."""
        labels = _labels(snap)
        out = {}
        with self.lock:
            for trial_id in snap.trial_ids:
                columns = snap.result_columns(trial_id)
                if columns is None:
                    continue
                rows = snap.num_rows(trial_id)
                name = self._file_name(trial_id, columns)
                start, reset = 0, False
                if trial_id in since:
                    seen_name, seen_rows = _parse_cursor(since[trial_id])
                    if seen_name in (None, name) and 0 <= seen_rows <= rows:
                        start = seen_rows
                    else:
                        reset = True
                if start == rows and not reset:
                    continue
                xs, ys = columns.points(metric, rows, start) or ([], [])
                out[trial_id] = {"label": labels.get(trial_id, trial_id), "x": xs, "y": ys,
                                 "rows": rows, "cursor": f"{name}:{rows}", "reset": reset}
        return finite(out)

    def _file_name(self, trial_id: str, columns: ResultColumns) -> str:
        known = self._files.get(trial_id)
        if known is not None and known[0] is columns:
            return known[1]
        self._count += 1
        name = f"{self._prefix}{self._count}"
        self._files[trial_id] = (columns, name)
        return name


class OpenExperiments:
    """The readers of the experiments asked about most recently (at most ``size``; the least
    recently asked is dropped first, and read again from scratch if asked again)."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._open: "OrderedDict[str, OpenExperiment]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, paths: ExperimentPaths) -> OpenExperiment:
        """The reader of ``paths`` (a new one if it is not open)."""
        key = paths.uri
        with self._lock:
            found = self._open.get(key)
            if found is None:
                found = self._open[key] = OpenExperiment(paths)
                while len(self._open) > self.size:
                    self._open.popitem(last=False)
            else:
                self._open.move_to_end(key)
            return found

    def forget(self, paths: ExperimentPaths) -> None:
        """Drop the reader of ``paths`` (its folder is gone, or no longer an experiment)."""
        with self._lock:
            self._open.pop(paths.uri, None)


def _labels(snap: ExperimentSnapshot) -> dict[str, str]:
    """Each trial's varying hyperparameters, ``lr=0.01, bs=32`` (its id when none vary)."""
    out = {}
    for row in snap.view.rows:
        text = ", ".join(f"{k}={format_value(v)}" for k, v in row.params.items())
        out[row.trial_id] = text or row.trial_id
    return out


def _parse_cursor(value: Any) -> tuple[Optional[str], int]:
    """``(file name, rows)`` of a cursor (``"name:rows"``), or ``(None, rows)`` for a number;
    ``(None, -1)`` (never matches) for anything else."""
    if isinstance(value, bool):
        return None, -1
    if isinstance(value, int):
        return None, value
    if isinstance(value, str) and ":" in value:
        name, _, rows = value.rpartition(":")
        if rows.isdigit():
            return name, int(rows)
    return None, -1
