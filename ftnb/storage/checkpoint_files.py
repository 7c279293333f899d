"""What a checkpoint's marker (``.ftnb_checkpoint.json``) records of the checkpoint's files, and
the check of a stored checkpoint against it.

A checkpoint is written whole or not at all (:meth:`Storage.persist_directory`), but a file of
it may be damaged later: a disk error, a hand edit, a tool that truncated it. Its marker records
every file's size and, for small files, a CRC-32 (:func:`describe_folder`), so that a restore
can tell an intact checkpoint from a damaged one (:func:`checkpoint_damage`) and resume from the
newest intact one instead of failing on the damaged one.

The cost stays that of a listing for big checkpoints: sizes come from the listing, and only
files of up to :data:`DIGEST_FILE_LIMIT` bytes, :data:`DIGEST_BUDGET` bytes in all, are read to
be summed (a model's weights are not; its small step counter or JSON state is). A marker written
before ftnb recorded files (no ``files`` key) is taken as intact.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import TYPE_CHECKING, Optional

from .file_names import CHECKPOINT_MARKER

if TYPE_CHECKING:
    from .backend import Storage

__all__ = ["DIGEST_BUDGET", "DIGEST_FILE_LIMIT", "checkpoint_damage", "describe_folder"]

#: The biggest file whose CRC-32 a marker records.
DIGEST_FILE_LIMIT = 1 << 20
#: How many bytes of a checkpoint's files are summed at most (the smallest files first).
DIGEST_BUDGET = 4 << 20


def describe_folder(source: str) -> dict:
    """What a marker records of the local folder ``source``: ``files`` (relative path, with
    ``/``, to size in bytes) and ``crc32`` (relative path to CRC-32, small files only)."""
    sizes: dict[str, int] = {}
    for root, _, names in os.walk(source):
        for name in names:
            full = os.path.join(root, name)
            sizes[os.path.relpath(full, source).replace(os.sep, "/")] = os.path.getsize(full)
    digests: dict[str, int] = {}
    budget = DIGEST_BUDGET
    for rel, size in sorted(sizes.items(), key=lambda item: item[1]):
        if size > DIGEST_FILE_LIMIT or size > budget:
            break
        with open(os.path.join(source, *rel.split("/")), "rb") as f:
            digests[rel] = zlib.crc32(f.read())
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
            data = storage.read_bytes(storage.join(folder, *rel.split("/")))
        except FileNotFoundError:
            return f"its file {rel} is missing"
        if zlib.crc32(data) != digest:
            return f"its file {rel} does not hold what was written (its CRC-32 differs)"
    return None


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
