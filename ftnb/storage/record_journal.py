"""A journal of JSON records kept beside a file that is rewritten often: how
``experiment_state.json`` stays small while an experiment has thousands of trials.

The records that no longer change (a finished trial's, one waiting to start) leave the state file
for the journal, written once, so a save writes what changed and not every record again.

Layout: *segments* beside the state file (``experiment_state.00000012.jsonl``: files, as every
folder of an experiment is a trial's), JSON Lines files each holding one trial's record per
line. The file that owns the journal (the state) lists the segments it uses and, for each, how
many of its bytes are committed (:class:`Segment`); that listing is the commit: a reader reads
each listed segment up to its committed length and nothing else, so the lines a save wrote
before it died (a torn line, a segment not listed yet) are never read, and every reader sees a
whole generation of the state. A record's latest line wins (later segments, then later lines).

Writing (the owner only; the contract of :mod:`ftnb.storage`):

* On a local disk (and NFS) the lines of a save are appended to this session's segment with one
  ``write()`` and an fsync before the state that lists them is written: a save costs what it adds.
* Object stores cannot append: each save puts one new segment (one PUT). The newest segments are
  merged as they pile up, each time the one before the newest is no more than twice its size
  (a binary counter): at most about log2(records) segments to read, and each record rewritten
  about log2(records) times over a whole experiment.
* A segment that the state no longer lists is deleted once the previous generation of the state
  (the fallback, ``experiment_state.prev.json``) no longer lists it either; a reader that loses
  the race with that deletion reads the state again (:class:`SegmentGoneError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional

from .file_names import STATE_SEGMENT, TEMPORARY_FILE_NAME, state_segment_name

if TYPE_CHECKING:
    from .backend import Storage

__all__ = ["JournalCache", "RecordJournal", "Segment", "SegmentGoneError", "read_segments"]

#: A record's line and the key that says which record it is (a trial's id).
Line = tuple[str, bytes]


class SegmentGoneError(FileNotFoundError):
    """A segment that the state read lists was deleted since (a newer state merged it): read
    the state again."""


@dataclass(frozen=True)
class Segment:
    """One segment file as a state lists it: its name in the journal's folder, its committed
    length in bytes, and how many records (lines) that length holds."""

    file: str
    bytes: int
    records: int

    def to_json(self) -> dict:
        return {"file": self.file, "bytes": self.bytes, "records": self.records}

    @classmethod
    def from_json(cls, data: Any) -> "Segment":
        """A listed segment; ValueError for anything else (a damaged state)."""
        try:
            segment = cls(str(data["file"]), int(data["bytes"]), int(data["records"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a journal segment: {data!r}") from exc
        if not STATE_SEGMENT.match(segment.file):
            raise ValueError(f"not a journal segment's name: {segment.file!r}")
        return segment


def _is_segment_or_its_temporary(name: str) -> bool:
    temporary = TEMPORARY_FILE_NAME.match(name)
    return bool(STATE_SEGMENT.match(temporary.group("target") if temporary else name))


class RecordJournal:
    """The writer of a journal (its owner's): see the module's docstring.

    ``segments``: what the state on disk lists now (read from it, or none for a new one). A
    writer never appends to a segment it did not create: the first lines it writes start a new
    one, so what a dead writer left past a committed length is never built upon.
    """

    def __init__(self, storage: Storage, folder: str, segments: Iterable[Segment] = ()) -> None:
        self.storage = storage
        self.folder = folder
        self.segments: list[Segment] = list(segments)
        # Every segment file a state on disk may list: those of the latest committed listing and
        # of the one before it (the fallback); files leave it only once neither lists them.
        self._on_disk_files = {s.file for s in self.segments}
        self._prev_files = set(self._on_disk_files)
        self._retired: set[str] = set()
        self._appendable: Optional[str] = None  # local: this writer's segment, grown by appends
        # Object stores: the lines of the segments this writer made, to merge them unread.
        self._lines: dict[str, list[Line]] = {}
        self._sweep = False  # list the folder at the next commit, for a dead writer's files

    def _path(self, name: str) -> str:
        return self.storage.join(self.folder, name)

    # -- changing it (what the next state will list) -----------------------------------------------
    def rewrite(self, lines: list[Line], generation: int) -> None:
        """Start over: one new segment of ``lines`` (every record), the others retired. Also
        where a new owner begins (files a dead writer left are swept at the commit)."""
        self._retire(s.file for s in self.segments)
        self.segments = []
        self._appendable = None
        self._sweep = True
        if lines:
            self._new_segment(lines, generation)

    def clear(self) -> None:
        """No segment any more (every record went back into the state itself)."""
        self.rewrite([], 0)

    def add(self, lines: list[Line], generation: int) -> None:
        """Add the lines of records that changed (the newest line of a record wins)."""
        if not lines:
            return
        if self.storage.is_local and self._appendable is not None:
            last = self.segments[-1]
            data = b"".join(line for _, line in lines)
            self.storage.append_durably(self._path(last.file), data)
            self.segments[-1] = Segment(last.file, last.bytes + len(data),
                                        last.records + len(lines))
            return
        if not self.storage.is_local:
            # Merge the newest segments while the one before is no more than twice as big.
            merged: list[Line] = []
            while self.segments and self.segments[-1].records <= 2 * (len(merged) + len(lines)):
                older = self.segments.pop()
                merged = self._segment_lines(older) + merged
                self._retire([older.file])
            lines = _latest_per_key(merged + lines) if merged else lines
        self._new_segment(lines, generation)

    def _new_segment(self, lines: list[Line], generation: int) -> None:
        name = state_segment_name(generation)
        if any(s.file == name for s in self.segments):
            raise RuntimeError(f"journal segment {name} written twice by one save")
        data = b"".join(line for _, line in lines)
        self.storage.makedirs(self.folder)
        self.storage.write_atomic(self._path(name), data)
        self._retired.discard(name)
        self.segments.append(Segment(name, len(data), len(lines)))
        if self.storage.is_local:
            self._appendable = name
        else:
            self._lines[name] = list(lines)

    def _segment_lines(self, segment: Segment) -> list[Line]:
        lines = self._lines.pop(segment.file, None)
        if lines is None:  # not written by this writer (cannot happen after a rewrite)
            data = _read_committed(self.storage, self._path(segment.file), segment)
            lines = [(str(record["trial_id"]), line) for record, line in
                     zip(_parse(data, segment.file), data.splitlines(keepends=True))]
        return lines

    def _retire(self, files: Iterable[str]) -> None:
        for name in files:
            self._retired.add(name)
            self._lines.pop(name, None)

    # -- after the state that lists it was written -------------------------------------------------
    def listing(self) -> list[dict]:
        """The segments as the state lists them."""
        return [s.to_json() for s in self.segments]

    def committed(self, final: bool = False) -> None:
        """The state listing :attr:`segments` is written (``final``: as its fallback too):
        delete the retired segments that no state on disk lists any more."""
        now = {s.file for s in self.segments}
        self._prev_files = set(now) if final else self._on_disk_files
        self._on_disk_files = now
        if self._sweep:
            self._sweep = False
            self._retired.update(n for n in self.storage.listdir(self.folder)
                                 if _is_segment_or_its_temporary(n) and n not in now)
        doomed = self._retired - now - self._prev_files
        for name in sorted(doomed):
            self.storage.remove(self._path(name))
        self._retired -= doomed


def _latest_per_key(lines: list[Line]) -> list[Line]:
    latest: dict[str, bytes] = {}
    for key, line in lines:
        latest.pop(key, None)  # keep the order of the latest lines
        latest[key] = line
    return list(latest.items())


# -- reading -----------------------------------------------------------------------------------------
class JournalCache:
    """What a reader that polls has read of a journal's segments, by file: a segment is read
    again only from where it was committed last time (a growing local one) or not at all."""

    def __init__(self) -> None:
        self.records: dict[str, tuple[int, list[dict]]] = {}


def read_segments(storage: Storage, folder: str, segments: list[Segment],
                  cache: Optional[JournalCache] = None) -> list[dict]:
    """Every record line of ``segments`` (committed lengths only), oldest first.

    Raises :class:`SegmentGoneError` when a listed segment is gone (read the state again) and
    ValueError when one is shorter than listed or holds a line that is not a JSON object.
    """
    out: list[dict] = []
    kept: dict[str, tuple[int, list[dict]]] = {}
    for segment in segments:
        path = storage.join(folder, segment.file)
        done, records = cache.records.get(segment.file, (0, [])) if cache else (0, [])
        if done > segment.bytes:  # a file of that name rewritten: read it whole
            done, records = 0, []
        if done < segment.bytes:
            try:
                start, data = storage.read_from(path, done)
            except FileNotFoundError:
                raise SegmentGoneError(f"{storage.uri(path)} is gone") from None
            if start != done:  # shorter than what was read before: read from the start
                done, records = 0, []
            data = data[: segment.bytes - done]
            records = records + _parse(data, storage.uri(path), segment.bytes - done)
            done = segment.bytes
        if len(records) != segment.records:
            raise ValueError(f"{storage.uri(path)} holds {len(records)} records where the state "
                             f"lists {segment.records}")
        kept[segment.file] = (done, records)
        out.extend(records)
    if cache is not None:
        cache.records = kept
    return out


def _read_committed(storage: Storage, path: str, segment: Segment) -> bytes:
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise SegmentGoneError(f"{storage.uri(path)} is gone") from None
    return data[: segment.bytes]


def _parse(data: bytes, source: str, expected: Optional[int] = None) -> list[dict]:
    """The records of whole lines ``data`` (ValueError if it is short or a line is damaged)."""
    if expected is not None and len(data) < expected:
        raise ValueError(f"{source} is shorter ({len(data)} bytes) than its state lists "
                         f"({expected})")
    if not data:
        return []
    if not data.endswith(b"\n"):
        raise ValueError(f"{source}: its committed part does not end with a whole line")
    # One parse for the whole segment: json.dumps escapes every newline inside a value, so the
    # newlines are exactly the separators of the records.
    try:
        records = json.loads(b"[" + data[:-1].replace(b"\n", b",") + b"]")
    except ValueError as exc:
        raise ValueError(f"{source}: a committed line is not JSON ({exc})") from None
    if not all(isinstance(r, dict) and "trial_id" in r for r in records):
        raise ValueError(f"{source}: a committed line is not a record")
    return records
