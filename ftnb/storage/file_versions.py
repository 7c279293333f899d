"""Reads that poll: which files under a folder changed since a reader last looked (issue 13,
item 5: the read model's readers, :mod:`ftnb.ui.monitor` and ``ftnb logs``). Made by
:meth:`Storage.file_versions <ftnb.storage.backend.Storage.file_versions>`; the new bytes of a
changed file come from :meth:`Storage.read_from <ftnb.storage.backend.Storage.read_from>`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

from .outage import call_deadline

if TYPE_CHECKING:
    from .backend import Storage

#: A file's version: a tuple whose first item is the file's size (None if unknown), the rest
#: what tells its versions apart (inode and modification time on a local disk; the ETag,
#: generation or modification time an object store lists). Equal versions: an unchanged file.
FileVersion = tuple


class FileVersions:
    """The versions of the files under one folder at one moment, for a reader that polls: it
    reads a file again only when its version changed. A local disk answers each file with a
    ``stat``; an object store is listed once, when this is made (one paginated request for the
    whole folder instead of one per file)."""

    def __init__(self, storage: Storage, folder: str) -> None:
        self._listed = None if storage.is_local else _listed_versions(storage, folder)

    def get(self, path: str) -> Optional[FileVersion]:
        """The version of the file ``path`` (under the folder), or None if there is none."""
        if self._listed is not None:
            return self._listed.get(path.rstrip("/"))
        try:  # a poll stats every file of an experiment: no more than the stat itself
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_size, st.st_ino, st.st_mtime_ns)


def _listed_versions(storage: Storage, folder: str) -> dict[str, FileVersion]:
    fs = storage.fs
    try:
        fs.invalidate_cache(folder)  # a listing cached by fsspec would hide every change
    except Exception:
        pass
    try:
        found = fs.find(folder, detail=True, **call_deadline(fs))
    except FileNotFoundError:
        return {}
    return {p.rstrip("/"): _listed_version(info) for p, info in found.items()}


def _listed_version(info: dict) -> FileVersion:
    """A listed file's size and whatever version marker its backend lists (ETag on S3, a
    generation or modification time elsewhere)."""
    for name in ("ETag", "etag", "md5Hash", "generation", "LastModified", "mtime", "updated",
                 "last_modified", "created"):
        if info.get(name) is not None:
            return (info.get("size"), str(info[name]))
    return (info.get("size"), None)
