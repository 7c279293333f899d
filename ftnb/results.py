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
import os
from typing import Any, Iterable, Optional

from .storage import Storage, TrialPaths, json_line

__all__ = ["ResultLog", "flatten_row"]


def flatten_row(row: dict, prefix: str = "", sep: str = "/") -> dict:
    out: dict = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_row(value, f"{name}{sep}", sep))
        else:
            out[name] = value
    return out


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
        return json.dumps(value)
    return value


class ResultLog:
    """Appends acknowledged results to a trial's files.

    On a local disk each row is one ``write()`` to ``result.json`` opened with ``O_APPEND``: when
    ``append`` returns the row is in the operating system and survives the death of any process;
    ``sync()`` makes it survive a machine crash too (used when a checkpoint is reported). On an
    object store each append rewrites the whole object (one PUT), which is atomic and durable.
    """

    def __init__(self, paths: TrialPaths, existing: Optional[list[dict]] = None) -> None:
        self.paths = paths
        self.storage: Storage = paths.storage
        self.rows: list[dict] = list(existing) if existing is not None else paths.read_results()
        self.header: list[str] = []
        for row in self.rows:
            self._extend_header(flatten_row(row))
        self._fd: Optional[int] = None
        self._csv_fd: Optional[int] = None
        self._csv_lines: list[str] = []

    def _extend_header(self, flat: dict) -> bool:
        new = [k for k in flat if k not in self.header]
        self.header.extend(new)
        return bool(new)

    def _open_local(self) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._fd = os.open(self.paths.results, flags, 0o644)
        self._csv_fd = os.open(self.paths.progress, flags, 0o644)

    def append(self, row: dict) -> None:
        line = json_line(row)
        flat = flatten_row(row)
        widened = self._extend_header(flat)
        self.rows.append(row)
        if not self.storage.is_local:
            self.storage.write_atomic(self.paths.results, b"".join(map(json_line, self.rows)))
            self._write_csv_whole()
            return
        if self._fd is None:
            self._open_local()
        # The result line first: it is the record of truth, progress.csv only mirrors it.
        os.write(self._fd, line)
        if widened:
            self._write_csv_whole()
        else:
            os.write(self._csv_fd, _csv_text(self.header, [flat], False).encode("utf-8"))

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def _write_csv_whole(self) -> None:
        text = _csv_text(self.header, (flatten_row(r) for r in self.rows), True)
        self.storage.write_atomic(self.paths.progress, text)
        if self._csv_fd is not None:
            # The old descriptor points at the replaced file; appends must go to the new one.
            os.close(self._csv_fd)
            self._csv_fd = os.open(self.paths.progress, os.O_WRONLY | os.O_APPEND, 0o644)

    def rewrite(self, rows: list[dict]) -> None:
        """Replace both files with ``rows`` (used between attempts to drop rows past the
        checkpoint a trial restarts from, so no ``training_iteration`` appears twice)."""
        self.close()
        self.rows = list(rows)
        self.header = []
        for row in self.rows:
            self._extend_header(flatten_row(row))
        self.storage.write_atomic(self.paths.results, b"".join(map(json_line, self.rows)))
        self.storage.write_atomic(
            self.paths.progress, _csv_text(self.header, (flatten_row(r) for r in self.rows), True)
        )

    def close(self) -> None:
        for fd in (self._fd, self._csv_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._csv_fd = None
