"""Files that grow while a process runs: a file written through the OS and published to storage
(:class:`StagedFile`: a log, a trial's stdout), and a file that grows by whole lines
(:class:`LineLog`: ``result.json``, ``progress.csv``). Both are made by
:class:`~ftnb.storage.backend.Storage` (``staged_file``, ``line_log``), which they write through.
"""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from .backend import Storage


class StagedFile:
    """See :meth:`Storage.staged_file`. ``local_path`` is where to write; ``publish()`` puts
    what was written at the storage path (nothing to do on a local disk); ``staged`` says
    whether there is a copy to publish."""

    def __init__(self, storage: Storage, path: str, staging_dir: Optional[str] = None,
                 local_path: Optional[str] = None) -> None:
        self.storage = storage
        self.path = path
        self.staged = not storage.is_local
        if not self.staged:
            self.local_path = path
        elif local_path is not None:
            self.local_path = local_path
        else:
            import tempfile

            folder = staging_dir or tempfile.mkdtemp(prefix="ftnb-staged-")
            os.makedirs(folder, exist_ok=True)
            self.local_path = os.path.join(folder, posixpath.basename(path.rstrip("/")))

    def publish(self) -> None:
        """Copy the local file to the storage path (when staged and written to)."""
        if self.staged and os.path.exists(self.local_path):
            self.storage.upload_file(self.local_path, self.path)

    def __repr__(self) -> str:
        return f"StagedFile({self.storage.uri(self.path)!r}, local={self.local_path!r})"


class LineLog:
    """A file that grows by whole lines (``result.json``, ``progress.csv``); see
    :meth:`Storage.line_log`. Only one process writes it at a time (the trial's current
    attempt, or the controller between attempts).

    On a local disk each line is one ``write()`` to the file opened with ``O_APPEND``: once
    :meth:`append` returns, the line is in the operating system and survives the death of any
    process; :meth:`sync` makes it survive a machine crash too. Elsewhere (object stores cannot
    append) each append replaces the whole file with one PUT, which is atomic and durable.

    ``contents()`` returns what the file holds before this log changes it, as its writer read
    it (without a torn last line). It is called at most once: to start the whole-file copy where
    appends are replacements, and on a local disk to repair a file whose last line is torn (its
    writer died mid-line) before the first append, so the new line is not glued onto the
    fragment.
    """

    def __init__(self, storage: Storage, path: str, contents: Callable[[], bytes]) -> None:
        self.storage = storage
        self.path = path
        self._contents = contents
        self._fd: Optional[int] = None
        self._whole: Optional[bytearray] = None  # where appends are replacements: the bytes

    def append(self, line: bytes) -> None:
        """Add ``line`` (newline included) at the end of the file."""
        if not self.storage.is_local:
            if self._whole is None:
                self._whole = bytearray(self._contents())
            self._whole += line
            self.storage.write_atomic(self.path, bytes(self._whole))
            return
        if self._fd is None:
            self._fd = self._open_local()
        os.write(self._fd, line)

    def _open_local(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        except BaseException:
            os.close(fd)
            raise
        if not torn:
            return fd
        os.close(fd)
        self.storage.write_atomic(self.path, self._contents())
        return os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o644)

    def replace(self, data: bytes) -> None:
        """Replace the whole file with ``data`` (readers see the old or the new file)."""
        self.storage.write_atomic(self.path, data)
        if not self.storage.is_local:
            self._whole = bytearray(data)
        if self._fd is not None:
            # The descriptor points at the replaced file: the next append opens the new one.
            os.close(self._fd)
            self._fd = None

    def sync(self) -> None:
        """Make the appended lines survive a machine crash (a no-op where each append is a
        durable replacement already)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        """Release the file (a later append opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
