"""A trial's stdout and stderr, streamed from a pipe to a capped file and to the listeners.

A trial writes into a pipe; a :class:`PumpedOutput` (one thread per pipe, in the process that
reads it: the driver for local processes, the actor for Ray) copies what arrives to the trial's
file through a :class:`CappedFile`, in bounded chunks, and keeps at most ``shown_bytes`` of it
for the listeners (the terminal, the widget). Nothing is buffered beyond those bounds, whatever
a trial prints:

* the file keeps the first half of :func:`output_max_bytes` (``$FTNB_OUTPUT_MAX_BYTES``, default
  64 MiB) and the last lines, with a line saying how much was left out between them;
* what the listeners do not take in time is dropped, and a line in their text says how much
  (the file has it, within its cap).

Where a process writes its output file itself (a Ray actor), a :class:`FileTail` reads what it
appends in bounded pieces instead, skipping what the listeners could not keep up with.

Threading: the pump thread alone writes the file; :meth:`PumpedOutput.take_text` is called by
the executor's thread; both hold the pump's lock only to move bytes between them.
"""

from __future__ import annotations

import os
import re
import select
import threading
from typing import Callable, Optional

__all__ = [
    "OUTPUT_MAX_BYTES",
    "OUTPUT_MAX_BYTES_ENV",
    "CappedFile",
    "FileTail",
    "PumpedOutput",
    "output_max_bytes",
]

#: The most a trial's ``stdout`` or ``stderr`` file holds (each rank's, each file on its own):
#: 64 MiB, of which the first half is the start of the output and the rest its end.
OUTPUT_MAX_BYTES = 64 << 20
OUTPUT_MAX_BYTES_ENV = "FTNB_OUTPUT_MAX_BYTES"
#: The smallest cap ``$FTNB_OUTPUT_MAX_BYTES`` may set: room for a head, a note and a tail.
_MIN_MAX_BYTES = 4096
#: How much is read from the pipe, and copied within the file, at once.
_CHUNK = 1 << 20
#: The pipe's buffer asked for (best effort; a user's pipes share a limit, 64 MiB by default).
_PIPE_BYTES = 256 << 10
#: How far back from the head's end a line break is looked for (a longer line is cut).
_LINE_SEARCH = 64 << 10
_NOTE = re.compile(rb"\[ftnb: (\d+) bytes of output left out here")


def output_max_bytes() -> int:
    """``$FTNB_OUTPUT_MAX_BYTES`` (a whole number of bytes, at least 4096), else
    :data:`OUTPUT_MAX_BYTES`; ValueError naming the variable when it is not such a number."""
    text = os.environ.get(OUTPUT_MAX_BYTES_ENV, "").strip()
    if not text:
        return OUTPUT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < _MIN_MAX_BYTES:
        raise ValueError(
            f"${OUTPUT_MAX_BYTES_ENV}={text!r} is invalid: it is the most bytes a trial's "
            f"stdout or stderr file keeps. Fix: a whole number >= {_MIN_MAX_BYTES} "
            f"(default {OUTPUT_MAX_BYTES}), or unset it.")
    return value


class CappedFile:
    """Appends to ``path`` (continuing what is there) and keeps it at most ``max_bytes`` long:
    once full, it keeps its first ``max_bytes // 2`` (to a line's end), a line saying how many
    bytes were left out, and the last lines: at least a quarter of ``max_bytes``, growing back
    to the cap before the next cut. Cutting copies the kept end within the file, in chunks, so
    each byte written is copied about once more, and memory stays at one chunk."""

    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        #: Bytes left out so far, and where the note saying so starts and how long it is.
        self.left_out = 0
        self._head_end: Optional[int] = None
        self._note_len = 0
        if self.size > max_bytes // 2:
            self._find_note()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.max_bytes - self.size
            if room <= 0:
                self._cut()
                continue
            written = os.pwrite(self._fd, view[:room], self.size)
            self.size += written
            view = view[written:]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _find_note(self) -> None:
        """A file an earlier attempt cut: find its note, to cut after it and add to its count."""
        head = self.max_bytes // 2
        start = max(0, head - _LINE_SEARCH - 1)
        window = os.pread(self._fd, head + 1024 - start, start)
        match = _NOTE.search(window)
        if match is None:
            return
        end = window.find(b"\n", match.start())
        self._head_end = start + match.start()
        self._note_len = (end + 1 if end >= 0 else len(window)) - match.start()
        self.left_out = int(match.group(1))

    def _cut(self) -> None:
        if self._head_end is None:
            head = self.max_bytes // 2
            start = max(0, head - _LINE_SEARCH)
            newline = os.pread(self._fd, head - start, start).rfind(b"\n")
            self._head_end = start + newline + 1 if newline >= 0 else head
            self._note_len = 0
        content = self._head_end + self._note_len  # what follows the note (or the head)
        src = max(content, self.size - (self.max_bytes - self.max_bytes // 2) // 2)
        ahead = os.pread(self._fd, min(_LINE_SEARCH, self.size - src), src)
        newline = ahead.find(b"\n")
        if 0 <= newline < len(ahead) - 1:
            src += newline + 1  # the kept end starts with a whole line
        self.left_out += src - content
        before = os.pread(self._fd, 1, self._head_end - 1) if self._head_end else b"\n"
        note = (b"" if before == b"\n" else b"\n") + (
            f"[ftnb: {self.left_out} bytes of output left out here; this file keeps the first "
            f"and the last lines, at most {self.max_bytes} bytes (${OUTPUT_MAX_BYTES_ENV})]\n"
        ).encode()
        dst = self._head_end + len(note)
        kept = self.size - src
        done = 0
        while done < kept:  # forwards: dst < src, so no chunk overwrites one not yet read
            chunk = os.pread(self._fd, min(_CHUNK, kept - done), src + done)
            if not chunk:
                break
            _pwrite_all(self._fd, chunk, dst + done)
            done += len(chunk)
        os.ftruncate(self._fd, dst + done)
        _pwrite_all(self._fd, note, self._head_end)
        self._note_len = len(note)
        self.size = dst + done


def widen_pipe(fd: int) -> None:
    """Ask for a larger buffer for the pipe ``fd`` (best effort): fewer, larger reads, and
    room for a trial's output while its reader starts."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, _PIPE_BYTES)  # F_SETPIPE_SZ
    except (OSError, AttributeError, ImportError):
        pass


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


class PumpedOutput:
    """Copies what arrives on the pipe ``fd`` (its read end; it is closed at the end) into a
    :class:`CappedFile` at ``path``, and keeps up to ``shown_bytes`` of it for
    :meth:`take_text` (0: none). A thread does it until the pipe's writers are all gone (the
    trial and what it started ended) or :meth:`close` (or :meth:`give_up`) stops waiting;
    ``on_end``, if given, is then called in that thread, with the pump."""

    def __init__(self, fd: int, path: str, *, max_bytes: Optional[int] = None,
                 shown_bytes: int = 0, name: str = "output",
                 on_end: Optional[Callable[["PumpedOutput"], None]] = None) -> None:
        self._fd = fd
        widen_pipe(fd)
        os.set_blocking(fd, False)
        self.file = CappedFile(path, max_bytes or output_max_bytes())
        self._shown_bytes = shown_bytes
        self._shown = bytearray()
        self._dropped = 0  # bytes not shown since the listeners last kept up
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._give_up = False
        #: The last error writing the file (a full disk): the pipe is still drained, and what
        #: could not be written is counted in a line of the file once it can be written again.
        self.error: Optional[OSError] = None
        self._lost = 0
        self._on_end = on_end
        self._thread = threading.Thread(target=self._pump, name=f"ftnb-{name}", daemon=True)
        self._thread.start()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def _pump(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while not self._give_up:
                if not poller.poll(200):
                    continue
                try:
                    data = os.read(self._fd, _CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    break
                if not data:
                    break  # every writer is gone
                self._write(data)
                if self._shown_bytes:
                    self._show(data)
        finally:
            with self._lock:
                self._note_dropped()
            self._ended.set()
            if self._on_end is not None:
                self._on_end(self)

    def _write(self, data: bytes) -> None:
        try:
            if self._lost:
                self.file.write(f"[ftnb: {self._lost} bytes of output lost here: "
                                f"{self.error}]\n".encode())
                self._lost = 0
            self.file.write(data)
        except OSError as exc:
            if self.error is None:  # said once: the output is a convenience, the trial goes on
                import sys

                print(f"ftnb: could not write a trial's output to {self.file.path}: {exc}; "
                      "what it prints meanwhile is left out there", file=sys.stderr)
            self.error = exc
            self._lost += len(data)

    def _show(self, data: bytes) -> None:
        with self._lock:
            if self._dropped:
                # Dropping: resume at a line's start, after a line saying how much was dropped.
                newline = data.find(b"\n")
                if newline < 0 or len(self._shown) + 200 > self._shown_bytes:
                    self._dropped += len(data)
                    return
                self._dropped += newline + 1
                self._note_dropped()
                data = data[newline + 1:]
            room = self._shown_bytes - len(self._shown)
            if len(data) <= room:
                self._shown += data
                return
            cut = data.rfind(b"\n", 0, room) + 1  # the whole lines that fit
            self._shown += data[:cut]
            if self._shown and not self._shown.endswith(b"\n"):
                self._shown += b"\n"  # the cut line ends here
            self._dropped += len(data) - cut

    def _note_dropped(self) -> None:
        if self._dropped:
            self._shown += (f"[ftnb: {self._dropped} bytes of output not shown here (the "
                            "display fell behind); the trial's output file has them]\n").encode()
            self._dropped = 0

    def take_text(self, limit: int = 256 << 10) -> Optional[str]:
        """At most ``limit`` bytes of the whole lines kept for the listeners (a line longer than
        that in pieces; a last line never ended is not handed over, as with every executor),
        or None."""
        with self._lock:
            if not self._shown:
                return None
            end = self._shown.rfind(b"\n", 0, limit) + 1
            if not end:
                if len(self._shown) < limit:
                    return None
                end = limit
            data = bytes(self._shown[:end])
            del self._shown[:end]
        return data.decode("utf-8", "replace")

    def close(self, timeout: float = 0.0) -> None:
        """Wait up to ``timeout`` seconds for the pipe to close (stray processes holding it
        are not waited for longer), then stop, closing the pipe and the file."""
        if not self._ended.wait(timeout):
            self._give_up = True
        self._thread.join()
        self.release()

    def give_up(self) -> None:
        """Stop waiting for the pipe's writers (its thread ends within 0.2 s)."""
        self._give_up = True

    def release(self) -> None:
        """Close the pipe and the file: once the pump has ended (from ``on_end``, or after
        its thread is joined)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        self.file.close()


class FileTail:
    """The whole lines appended to the file at ``path`` since this tail was made (the files
    are appended to across attempts: only this attempt's are handed over), at most ``limit``
    bytes per :meth:`read`. When more than ``backlog`` bytes wait, the older ones are skipped,
    with a line saying how many (the file has them); with ``keep_first``, after the first
    lines waiting (half of ``limit``): what a trial printed first says how it started.

    The file may be cut to its cap meanwhile (:class:`CappedFile`, written by another process):
    the end it keeps moves towards the start. The tail notices because the bytes just before
    its offset are no longer the last ones it handed over, and goes on after them where they
    now are, or, when they were cut out, at the first line after the cut's note, with a line
    saying that output was not shown."""

    #: How much of what was handed over is kept to find the offset again after a cut.
    _MARK = 256

    def __init__(self, stream: str, path: str, backlog: int = 1 << 20,
                 keep_first: bool = False) -> None:
        self.stream = stream
        self.path = path
        self.backlog = backlog
        self.keep_first = keep_first
        try:
            self.offset = os.path.getsize(path)
        except OSError:
            self.offset = 0
        self._mark = b""  # the last bytes handed over, which end at ``offset``
        if self.offset:
            try:
                with open(path, "rb") as f:
                    f.seek(max(0, self.offset - self._MARK))
                    self._mark = f.read(self.offset - f.tell())
            except OSError:
                self.offset = 0

    def read(self, limit: int = 256 << 10) -> Optional[str]:
        note = b""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if self._mark and not self._still_at_mark(f, size):
                    note = self._find_mark(f, size)
                    size = os.fstat(f.fileno()).st_size
                if size - self.offset > self.backlog and self.keep_first and not note:
                    f.seek(self.offset)
                    first = f.read(limit // 2)
                    first = first[:first.rfind(b"\n") + 1]
                    self.offset += len(first)
                    self._mark = (self._mark + first)[-self._MARK:]
                    note = first
                    limit -= len(first)
                if size - self.offset > self.backlog:
                    skip_to = size - self.backlog
                    f.seek(skip_to)
                    newline = f.read(_LINE_SEARCH).find(b"\n")
                    if newline >= 0:
                        skip_to += newline + 1
                    note += (f"[ftnb: {skip_to - self.offset} bytes of output not shown here "
                             "(the display fell behind); the trial's output file has them]\n"
                             ).encode()
                    self.offset = skip_to
                    self._mark = b""
                f.seek(self.offset)
                data = f.read(limit)
        except OSError:
            return None
        # Only whole lines: a half-written line is handed over when it is complete (a line
        # longer than ``limit``, in pieces).
        end = data.rfind(b"\n") + 1
        if not end and len(data) >= limit:
            end = len(data)
        self.offset += end
        if end:
            self._mark = (self._mark + data[:end])[-self._MARK:]
        if not end and not note:
            return None
        return (note + data[:end]).decode("utf-8", "replace")

    def _still_at_mark(self, f, size: int) -> bool:
        if size < self.offset:
            return False
        f.seek(self.offset - len(self._mark))
        return f.read(len(self._mark)) == self._mark

    def _find_mark(self, f, size: int) -> bytes:
        """The file was cut: go on after the last bytes handed over where they now are (in
        the kept end, within ``backlog`` of the end), else after the cut's note.
        Returns the line to show when output was skipped."""
        start = max(0, size - self.backlog - len(self._mark))
        f.seek(start)
        window = f.read(size - start)
        found = window.rfind(self._mark)
        if found >= 0:
            self.offset = start + found + len(self._mark)
            return b""
        notes = list(_NOTE.finditer(window))  # the kept end follows the cut's note
        after = notes[-1].start() if notes else 0
        newline = window.find(b"\n", after)
        self.offset = start + newline + 1 if newline >= 0 else start
        self._mark = b""
        return (b"[ftnb: bytes of output not shown here (the display fell behind and the file "
                b"was cut to its cap); the trial's output file has its first and last lines]\n")
