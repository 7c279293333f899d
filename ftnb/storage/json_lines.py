"""``result.json``'s format: one row of strict JSON per line, and the readers that tolerate a torn
last line only.

A writer that dies mid-line leaves at most a torn *last* line (each line is one ``write()``, see
:class:`~ftnb.storage.growing_files.LineLog`): readers skip it and the next writer repairs it. A
bad line anywhere else is damage, which readers report (:class:`CorruptFileError`) rather than
skip.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from .file_names import RESULTS_FILE

#: The key of a ``result.json`` row that says which of its values are NaN or infinite. JSON has
#: no such numbers, so such a value is written as ``null`` (pandas reads NaN, ``jq`` null) and
#: this key records it, e.g. ``{"loss": null, "__ftnb_nonfinite__": {"loss": "NaN"}}``; nested
#: values are named by a dict of the same shape (list items by their index as a string), each
#: leaf "NaN", "Infinity" or "-Infinity". :func:`parse_json_line` restores them.
NONFINITE_KEY = "__ftnb_nonfinite__"

#: The keys ftnb fills in on every ``result.json`` row (a trainable may not report them itself;
#: views do not show them as metrics).
AUTO_KEYS = (
    "training_iteration",
    "trial_id",
    "time_this_iter_s",
    "time_total_s",
    "timestamp",
    "attempt",
    "checkpoint_dir_name",
)
_NONFINITE_TOKENS = frozenset({"NaN", "Infinity", "-Infinity"})


def json_line(row: dict) -> bytes:
    """``row`` as one line of strict JSON (see :data:`NONFINITE_KEY`), newline included. A
    value that is not JSON is written as its text (an array as its list), as Ray Tune's
    ``SafeFallbackEncoder`` writes it."""
    try:
        text = json.dumps(row, default=text_form, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere (the rare case: only then a copy)
        overlay: dict = {}
        clean = _null_nonfinite(row, overlay)
        clean[NONFINITE_KEY] = overlay
        text = json.dumps(clean, default=text_form, allow_nan=False)
    return (text + "\n").encode("utf-8")


def text_form(value: Any) -> Any:
    """What a JSON record keeps of a value that is not JSON: an array's (numpy, torch) list,
    else its text (``str(value)``: ``"Ellipsis"``, ``"<MyModel ...>"``)."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "shape", None) is not None:
        try:
            return tolist()
        except Exception:  # (a tensor on a device it cannot be read from, say)
            pass
    return str(value)


def reported_object(value: Any) -> Any:
    """A reported value that is not JSON, as it travels from the trial to the driver's callbacks
    and results: itself when it can (it pickles), else its text (:func:`text_form`'s)."""
    import pickle

    try:
        pickle.dumps(value)
    except Exception:  # a lambda, a lock, an open file: any error pickle may raise
        return str(value)
    return value


def _null_nonfinite(value: Any, overlay: dict) -> Any:
    """A copy of ``value`` (a dict or list) with its NaN and infinities as None, each recorded in
    ``overlay`` under its key (its index, for a list)."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out: Any = {} if isinstance(value, dict) else [None] * len(value)
    for key, item in items:
        slot = key if isinstance(value, dict) else str(key)
        if isinstance(item, float) and item != item:
            overlay[slot], item = "NaN", None
        elif isinstance(item, float) and item in (math.inf, -math.inf):
            overlay[slot], item = ("Infinity" if item > 0 else "-Infinity"), None
        elif isinstance(item, (dict, list, tuple)):
            inner: dict = {}
            item = _null_nonfinite(item, inner)
            if inner:
                overlay[slot] = inner
        out[key] = item
    return out


def _restore_nonfinite(value: Any, overlay: Any) -> Any:
    if isinstance(overlay, str):
        return float(overlay) if value is None and overlay in _NONFINITE_TOKENS else value
    if isinstance(overlay, dict):
        for slot, inner in overlay.items():
            if isinstance(value, dict) and slot in value:
                value[slot] = _restore_nonfinite(value[slot], inner)
            elif isinstance(value, list) and slot.isdigit() and int(slot) < len(value):
                value[int(slot)] = _restore_nonfinite(value[int(slot)], inner)
    return value


class CorruptFileError(ValueError):
    """A file of JSON lines (``result.json``) has a bad line that is not its last one: not a
    torn write, which only ever leaves the last line incomplete, but a damaged file."""


def parse_json_line(line: bytes) -> Optional[dict]:
    """One row of ``result.json`` with its NaN and infinities back (see :data:`NONFINITE_KEY`;
    rows written with bare NaN tokens, as before, read as they are), or None for a line that is
    not a JSON object (torn by a process that died mid-write, or corrupt)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    overlay = row.pop(NONFINITE_KEY, None)
    return _restore_nonfinite(row, overlay) if overlay else row


def read_json_lines(data: bytes, source: str = RESULTS_FILE) -> list[dict]:
    """The rows of a JSON Lines file (``source``: its path, for errors).

    An unreadable *last* line is skipped: it is a line torn by a writer that died while writing
    it (the next writer repairs the file). An unreadable line anywhere else cannot come from a
    torn write: :class:`CorruptFileError` names the file and the line.
    """
    lines = data.splitlines()
    last = len(lines)
    while last and not lines[last - 1].strip():
        last -= 1
    rows = []
    for number, line in enumerate(lines[:last], start=1):
        if not line.strip():
            continue
        row = parse_json_line(line)
        if row is not None:
            rows.append(row)
        elif number < last:
            shown = line[:80].decode("utf-8", "replace")
            raise CorruptFileError(
                f"{source} is damaged: line {number} of {last} is not a JSON object "
                f"({shown!r}{'...' if len(line) > 80 else ''}), and only the last line can be "
                "torn by a writer that died. Fix: repair or delete that line (each line is one "
                "report), or restore the file from a backup; ftnb does not guess which rows "
                "it held."
            )
    return rows


def damaged_tail(data: bytes) -> int:
    """Where the damaged end of a JSON Lines file begins: the length of ``data`` up to and with
    its last line that is a row, when only lines that are not rows (garbage, NUL bytes, a torn
    line) follow it; ``len(data)`` when nothing is damaged at its end. A bad line followed by
    rows is not a damaged end but damage inside the file: :func:`read_json_lines` reports it."""
    end = 0
    offset = 0
    for line in data.splitlines(keepends=True):
        offset += len(line)
        if not line.strip() and line.endswith((b"\n", b"\r")):
            if end == offset - len(line):
                end = offset  # a blank line after a row belongs to the intact part
            continue
        if line.endswith(b"\n") and parse_json_line(line) is not None:
            end = offset
    return end
