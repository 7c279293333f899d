"""Storage faults: a write that storage refused for a reason waiting cannot cure on its own.

A full disk (``ENOSPC``), a quota reached (``EDQUOT``), a filesystem turned read-only
(``EROFS``), a permission taken away (``EACCES``, ``EPERM``) and an I/O error (``EIO``) are
not bugs in the trial and not outages of a network: retrying the attempt writes into the same
full disk. Every writer of ftnb turns them into one typed error, :class:`StorageFault`, which
names the path, the error in words and, where the path is on this machine, the free space; the
controller records it as a failure of kind ``storage`` (not counted against ``max_failures``)
and ends the experiment INTERRUPTED with the fix and the line that resumes it.

A write either completes whole or raises: a short write is continued, and a write that fails
part-way is rolled back where it can be (a line log is cut back to its last whole line), so
nothing half-written is ever read as a row or a checkpoint.

    >>> try:
    ...     os.write(fd, data)
    ... except OSError as exc:
    ...     raise storage_fault(exc, path) from exc   # StorageFault, or exc itself
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from typing import Callable, Iterator, Optional, TypeVar

T = TypeVar("T")

__all__ = ["FAULT_ERRNOS", "StorageFault", "faults_named", "free_inodes", "free_space",
           "is_storage_fault", "storage_fault", "waiting_out_faults"]

#: The errors that make a write a storage fault, with what each means to the user and the fix.
FAULT_ERRNOS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device",
                   "free space (or inodes) on that filesystem, or choose another storage_path"),
    errno.EDQUOT: ("the disk quota is exceeded",
                   "free space within your quota, or choose another storage_path"),
    errno.EROFS: ("the filesystem is read-only",
                  "remount it read-write (check the kernel log for why it was remounted "
                  "read-only), or choose another storage_path"),
    errno.EACCES: ("permission denied",
                   "give the user running ftnb write access to that folder"),
    errno.EPERM: ("operation not permitted",
                  "give the user running ftnb write access to that folder"),
    errno.EIO: ("an I/O error (the device or the filesystem failed)",
                "check the device and the kernel log, then free or repair the storage"),
}


class StorageFault(OSError):
    """A write to experiment storage failed for a reason the storage has to be fixed for: full,
    over quota, read-only, permission denied or an I/O error. ``path`` is what was written,
    ``errno``/``strerror`` the operating system's error, ``words`` what it means, ``fix`` what
    to do, ``free_bytes`` the free space of the filesystem holding ``path`` (None where it
    cannot be told, on remote storage)."""

    def __init__(self, err: int, path: str, free_bytes: Optional[int] = None,
                 detail: str = "", free_inodes: Optional[int] = None) -> None:
        words, fix = FAULT_ERRNOS.get(err, (os.strerror(err), "fix the storage"))
        super().__init__(err, os.strerror(err), path)
        self.words = words
        self.fix = fix
        self.free_bytes = free_bytes
        self.free_inodes = free_inodes
        self.detail = detail

    @property
    def errno_name(self) -> str:
        """``ENOSPC``, ``EROFS``, ...: the error's symbolic name."""
        return errno.errorcode.get(self.errno, str(self.errno))

    def __str__(self) -> str:
        free = ""
        if self.free_bytes is not None:
            free = f"; {_size(self.free_bytes)} free there"
            if self.free_inodes == 0:  # a filesystem out of inodes is full however many bytes
                free += " but no inodes (no new file can be made)"
        detail = f" ({self.detail})" if self.detail else ""
        return (f"writing {self.filename} failed: {self.words} ({self.errno_name}){detail}"
                f"{free}. Fix: {self.fix}.")

    def __reduce__(self):  # survives a trip through pickle (from a trial to its driver)
        return (_rebuild, (self.errno, self.filename, self.free_bytes, self.detail,
                           self.free_inodes))

    def as_dict(self) -> dict:
        """What a failure record keeps of it."""
        return {"path": self.filename, "errno": self.errno_name, "words": self.words,
                "free_bytes": self.free_bytes, "free_inodes": self.free_inodes, "fix": self.fix}


def _rebuild(err: int, path: str, free_bytes: Optional[int], detail: str,
             free_inodes: Optional[int] = None) -> StorageFault:
    return StorageFault(err, path, free_bytes, detail, free_inodes)


def is_storage_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is (or would become) a :class:`StorageFault`."""
    return isinstance(exc, StorageFault) or (
        isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS)


def storage_fault(exc: BaseException, path: Optional[str] = None) -> BaseException:
    """``exc`` as a :class:`StorageFault` when it is an ``OSError`` with one of
    :data:`FAULT_ERRNOS`' errors (naming ``path``, else the error's own file name); any other
    exception as it is. Meant for ``raise storage_fault(exc, path) from exc``."""
    if isinstance(exc, StorageFault) or not isinstance(exc, OSError):
        return exc
    if exc.errno not in FAULT_ERRNOS:
        return exc
    where = str(path or exc.filename or "?")
    return StorageFault(exc.errno, where, free_space(where), free_inodes=free_inodes(where))


@contextlib.contextmanager
def faults_named(path: str) -> Iterator[None]:
    """Within it, an ``OSError`` that is a storage fault is raised as a :class:`StorageFault`
    naming ``path`` (the file the caller writes, whatever temporary file failed)."""
    try:
        yield
    except OSError as exc:
        fault = storage_fault(exc, path)
        if fault is exc:
            raise
        raise fault from exc


def waiting_out_faults(write: Callable[[], T], wait_s: Optional[float], what: str) -> T:
    """``write()``; with ``wait_s``, a storage fault it raises is retried with backoff (0.5 s,
    doubling to 30 s) for up to ``wait_s`` seconds, said once on stderr when the waiting starts
    and once when the storage took the write, so that space freed meanwhile costs nothing.
    Past ``wait_s`` (or with None) the fault is raised."""
    if not wait_s:
        return write()
    deadline = time.monotonic() + wait_s
    delay = 0.5
    waiting_since = None
    while True:
        try:
            result = write()
        except OSError as exc:
            if not is_storage_fault(exc) or time.monotonic() + delay > deadline:
                raise
            if waiting_since is None:
                waiting_since = time.monotonic()
                print(f"ftnb: {storage_fault(exc)}\nftnb: {what} waits up to {wait_s:g} s for "
                      "the storage to take it (FailureConfig(storage_wait_s))",
                      file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
            continue
        if waiting_since is not None:
            print(f"ftnb: the storage took the write again after "
                  f"{time.monotonic() - waiting_since:.1f} s; {what} goes on",
                  file=sys.stderr, flush=True)
        return result


def free_space(path: str) -> Optional[int]:
    """Free bytes on the local filesystem holding ``path`` (its nearest existing folder), None
    for remote paths or where it cannot be told."""
    stat = _statvfs(path)
    return None if stat is None else stat.f_bavail * stat.f_frsize


def free_inodes(path: str) -> Optional[int]:
    """Free inodes (new files) on the local filesystem holding ``path``, as :func:`free_space`;
    None where the filesystem does not count them."""
    stat = _statvfs(path)
    return None if stat is None or stat.f_files == 0 else stat.f_favail


def _statvfs(path: str) -> Optional[os.statvfs_result]:
    if "://" in path:
        return None
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    try:
        return os.statvfs(probe)
    except OSError:
        return None


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"
