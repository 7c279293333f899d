"""What a checkpoint's marker (``.ftnb_checkpoint.json``) records of the checkpoint's files, and
the check of a stored checkpoint against it.

A checkpoint is written whole or not at all (:meth:`Storage.persist_directory`), but a file of
it may be damaged later: a disk error, a hand edit, a tool that truncated it or overwrote it at
the same size. Its marker records every file's size and CRC-32 (:class:`FolderDigest`), so that
a restore can tell an intact checkpoint from a damaged one (:func:`checkpoint_damage`) and
resume from the newest intact one instead of failing on the damaged one.

The cost stays off the checkpoint's write: small files (up to :data:`DIGEST_FILE_LIMIT` bytes,
:data:`DIGEST_BUDGET` in all) are summed before the copy; the others by a thread that reads
them while they are copied (the copy moves bytes in the kernel and waits for the disk; the
thread reads the same pages from the page cache, on another core: zlib releases the GIL), and
the marker, written last, waits for it. A check reads each file once, in pieces. A marker
written before ftnb recorded files (no ``files`` key) is taken as intact; one written before it
summed big files (``crc32`` for small ones only) is checked for what it has.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from typing import TYPE_CHECKING, Optional

from .file_names import CHECKPOINT_MARKER

if TYPE_CHECKING:
    from .backend import Storage

__all__ = ["DIGEST_BUDGET", "DIGEST_FILE_LIMIT", "FolderDigest", "checkpoint_damage",
           "describe_folder"]

#: The biggest file summed before the copy (bigger ones are summed while it is copied).
DIGEST_FILE_LIMIT = 1 << 20
#: How many bytes of a checkpoint's files are summed before the copy at most (the smallest
#: files first).
DIGEST_BUDGET = 4 << 20
#: How much of a file is read at once to sum it.
_READ_CHUNK = 4 << 20


def file_crc32(path: str) -> int:
    """The CRC-32 of the local file ``path``, read in pieces."""
    crc = 0
    buffer = bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                return crc
            crc = zlib.crc32(view[:n], crc)


class FolderDigest:
    """What a marker records of the local folder ``source`` (see :func:`describe_folder`),
    begun when made: its small files are summed at once, its big ones by a thread, which
    :meth:`result` waits for. Make it before the folder's copy starts, ask for the result once
    the copy is done: the summing then overlaps the copy."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._described = describe_folder(source, small_only=True)
        self._big = [rel for rel in self._described["files"]
                     if rel not in self._described["crc32"]]
        self._digests: dict[str, int] = {}
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        if self._big:
            self._thread = threading.Thread(target=self._sum, name="ftnb-checkpoint-crc",
                                            daemon=True)
            self._thread.start()

    def _sum(self) -> None:
        try:
            for rel in self._big:
                self._digests[rel] = file_crc32(os.path.join(self.source, *rel.split("/")))
        except BaseException as exc:  # (a file that vanished: the copy says so too)
            self._error = exc

    def result(self) -> dict:
        """``files`` (relative path, with ``/``, to size) and ``crc32`` (to CRC-32), every file."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return {"files": dict(self._described["files"]),
                "crc32": {**self._described["crc32"], **self._digests}}


def describe_folder(source: str, small_only: bool = False) -> dict:
    """What a marker records of the local folder ``source``: ``files`` (relative path, with
    ``/``, to size in bytes) and ``crc32`` (relative path to CRC-32: every file, or with
    ``small_only`` the small ones, see :data:`DIGEST_FILE_LIMIT`)."""
    sizes: dict[str, int] = {}
    for root, _, names in os.walk(source):
        for name in names:
            full = os.path.join(root, name)
            sizes[os.path.relpath(full, source).replace(os.sep, "/")] = os.path.getsize(full)
    digests: dict[str, int] = {}
    budget = DIGEST_BUDGET
    for rel, size in sorted(sizes.items(), key=lambda item: item[1]):
        if small_only and (size > DIGEST_FILE_LIMIT or size > budget):
            break
        digests[rel] = file_crc32(os.path.join(source, *rel.split("/")))
        budget -= size
    return {"files": sizes, "crc32": digests}


def checkpoint_damage(storage: "Storage", folder: str) -> Optional[str]:
    """None when the stored checkpoint ``folder`` matches what its marker records, else what is
    wrong with it, in words (its marker unreadable, a file missing, of another size, or with
    other contents)."""
    try:
        marker = json.loads(storage.read_bytes(storage.join(folder, CHECKPOINT_MARKER)))
    except FileNotFoundError:
        return f"it has no {CHECKPOINT_MARKER} (it was never complete)"
    except ValueError:
        return f"its marker {CHECKPOINT_MARKER} is not valid JSON"
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict):
        return None  # written before markers recorded files: nothing to check against
    found = _sizes(storage, folder)
    for rel, size in sorted(files.items()):
        if rel not in found:
            return f"its file {rel} is missing"
        if found[rel] != size:
            return f"its file {rel} has {found[rel]} bytes where {size} were written"
    digests = marker.get("crc32") if isinstance(marker.get("crc32"), dict) else {}
    for rel, digest in sorted(digests.items()):
        try:
            crc = _stored_crc32(storage, storage.join(folder, *rel.split("/")))
        except FileNotFoundError:
            return f"its file {rel} is missing"
        if crc != digest:
            return f"its file {rel} does not hold what was written (its CRC-32 differs)"
    return None


def _stored_crc32(storage: "Storage", path: str) -> int:
    """The CRC-32 of a stored file, read in pieces."""
    if storage.is_local:
        return file_crc32(path)
    crc = 0
    with storage.fs.open(path, "rb") as f:
        while True:
            data = f.read(_READ_CHUNK)
            if not data:
                return crc
            crc = zlib.crc32(data, crc)


def _sizes(storage: "Storage", folder: str) -> dict[str, int]:
    """Relative path (with ``/``) to size of every file under ``folder``."""
    if storage.is_local:
        out = {}
        for root, _, names in os.walk(folder):
            for name in names:
                full = os.path.join(root, name)
                try:
                    out[os.path.relpath(full, folder).replace(os.sep, "/")] = os.path.getsize(full)
                except FileNotFoundError:
                    continue
        return out
    prefix = folder.rstrip("/") + "/"
    listing = storage.fs.find(folder, detail=True)
    return {path[len(prefix):] if path.startswith(prefix) else path: int(info.get("size") or 0)
            for path, info in listing.items()}
