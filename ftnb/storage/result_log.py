"""The per-trial result files: ``result.json`` (JSON Lines) and ``progress.csv``.

Both mirror Ray Tune's files so pandas and a Ray user's habits work on them. ``result.json`` is
the source of truth; ``progress.csv`` is the same rows, flattened (``"a/b"`` columns for nested
metrics), and is rewritten with a wider header when a later row brings new keys.

``result.json`` is strict JSON, unlike Ray's: a NaN or infinite metric is written as ``null``
with a note that ftnb's readers use to restore it (:data:`ftnb.storage.NONFINITE_KEY`);
``progress.csv`` writes it as ``nan`` / ``inf``, which pandas reads as such.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Iterable, Mapping, Optional

from . import Storage, TrialPaths, json_line
from .json_lines import text_form

__all__ = ["ResultLog", "flatten_row", "metric_value"]


def flatten_row(row: dict, prefix: str = "", sep: str = "/") -> dict:
    """``row`` with its nested dicts spread into ``"outer/inner"`` keys (progress.csv's
    columns)."""
    out: dict = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_row(value, f"{name}{sep}", sep))
        else:
            out[name] = value
    return out


def metric_value(row: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """The value of the metric ``name`` in a reported ``row``: a top-level key, or, as Ray Tune
    flattens results with ``/``, a nested one (``"test/test1"`` is ``row["test"]["test1"]``).

    >>> metric_value({"test": {"test1": {"test2": 6}}}, "test/test1/test2")
    6
    """
    if name in row:
        return row[name]
    return flatten_row(dict(row)).get(name, default)


def _csv_text(header: list[str], rows: Iterable[dict], with_header: bool) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore", lineterminator="\n")
    if with_header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(v) for k, v in row.items()})
    return buf.getvalue()


def _csv_value(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=text_form)
    return value


class ResultLog:
    """Appends acknowledged results to a trial's files, through :class:`ftnb.storage.LineLog`:
    on a local disk each row is one ``write()`` to ``result.json`` (in the operating system
    when ``append`` returns, so it survives the death of any process; ``sync()`` makes it
    survive a machine crash too, used when a checkpoint is reported); on an object store each
    append replaces the whole object (one PUT), which is atomic and durable.
    """

    def __init__(self, paths: TrialPaths, existing: Optional[list[dict]] = None) -> None:
        self.paths = paths
        self.storage: Storage = paths.storage
        self.rows: list[dict] = list(existing) if existing is not None else paths.read_results()
        self.header: list[str] = []
        for row in self.rows:
            self._extend_header(flatten_row(row))
        self._results = self.storage.line_log(paths.results, self._results_text)
        self._progress = self.storage.line_log(paths.progress, self._progress_text)

    def _extend_header(self, flat: dict) -> bool:
        new = [k for k in flat if k not in self.header]
        self.header.extend(new)
        return bool(new)

    def _results_text(self) -> bytes:
        return b"".join(map(json_line, self.rows))

    def _progress_text(self) -> bytes:
        return _csv_text(self.header, (flatten_row(r) for r in self.rows), True).encode("utf-8")

    def append(self, row: dict, durable: bool = False) -> None:
        """Add ``row`` to both files, whole, or raise leaving both as they were (a
        :class:`~ftnb.storage.faults.StorageFault` when the storage refused a write).
        ``durable``: also make it survive a machine crash (a row that names a checkpoint)."""
        flat = flatten_row(row)
        line = json_line(row)
        # The result line first: it is the record of truth, progress.csv only mirrors it. Each
        # file gets its line before ``rows`` has the row: what a LineLog's ``contents()`` reads.
        self._results.append(line)
        try:
            new = [k for k in flat if k not in self.header]
            if new:  # progress.csv again, with the wider header
                header = self.header + new
                self._progress.replace(_csv_text(
                    header, (flatten_row(r) for r in (*self.rows, row)), True).encode("utf-8"))
            else:
                self._progress.append(_csv_text(self.header, [flat], False).encode("utf-8"))
            if durable:
                self._results.sync()
        except BaseException:
            self._results.undo(line)  # a row is acknowledged whole, with its mirror, or not at all
            raise
        if new:
            self.header = header
        self.rows.append(row)

    def sync(self) -> None:
        """Make the rows appended so far survive a machine crash."""
        self._results.sync()

    def rewrite(self, rows: list[dict]) -> None:
        """Replace both files with ``rows`` (used between attempts to drop rows past the
        checkpoint a trial restarts from, so no ``training_iteration`` appears twice)."""
        self.close()
        self.rows = list(rows)
        self.header = []
        for row in self.rows:
            self._extend_header(flatten_row(row))
        self._results.replace(self._results_text())
        self._progress.replace(self._progress_text())

    def close(self) -> None:
        """Release the files (a later append opens them again)."""
        self._results.close()
        self._progress.close()
