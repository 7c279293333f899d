"""The storage roots the server extension serves, and the confinement of every path to them.

A request names a folder (``root=``) or an experiment (``path=``) by its path or URL, as the
listing gave it. :meth:`StorageRoots.resolve` answers with the folder in its root's
:class:`ftnb.storage.Storage`, or raises :class:`PathRefused` (HTTP 403) when it is not inside
one of the configured roots: a ``..`` segment, a relative path, a local path outside every root
once its symlinks are resolved (a symlink leading out is refused), a URL whose scheme, bucket or
prefix no root names. Nothing here imports jupyter_server: the rules are tested on their own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from ..storage import ExperimentPaths, Storage

__all__ = ["PathRefused", "StorageRoot", "StorageRoots"]


class PathRefused(Exception):
    """A path outside the configured roots (HTTP 403); the message says which are served."""


@dataclass(frozen=True)
class StorageRoot:
    """One configured root: ``text`` as configured, ``storage`` opened on it, and ``base``:
    its folder in that storage's terms (a resolved local path, or ``bucket/prefix``)."""

    text: str
    storage: Storage
    base: str

    @property
    def protocol(self) -> Optional[str]:
        """``None`` for the local disk, else the URL's scheme (``s3``, ``gs``, ...)."""
        return None if self.storage.is_local else _scheme(self.text)

    @property
    def uri(self) -> str:
        """The root as a request names it (and as ``GET roots`` lists it)."""
        return self.storage.uri(self.base)

    def holds(self, folder: str) -> bool:
        """Whether ``folder`` (in this root's storage's terms, already resolved) is inside."""
        sep = os.sep if self.storage.is_local else "/"
        return folder == self.base or folder.startswith(self.base.rstrip(sep) + sep)


class StorageRoots:
    """The configured roots (``c.Ftnb.storage_roots``), opened once."""

    def __init__(self, roots: Iterable[str]) -> None:
        opened: list[StorageRoot] = []
        for text in roots:
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"c.Ftnb.storage_roots: {text!r} is not a path or URL. Fix: "
                                 "list folders or URLs, e.g. ['~/ftnb_results', "
                                 "'s3://bucket/exps']")
            text = text.strip()
            if _scheme(text) in (None, "file"):
                local = os.path.realpath(os.path.expanduser(_without_file_scheme(text)))
                opened.append(StorageRoot(text, Storage(local), local))
            else:
                storage = Storage(text)
                opened.append(StorageRoot(text, storage, storage.root))
        if not opened:
            raise ValueError("c.Ftnb.storage_roots is empty: the panel would have nothing to "
                             "show. Fix: list at least one folder or URL (the default is "
                             "ftnb's default storage path)")
        self.roots: tuple[StorageRoot, ...] = tuple(opened)

    def uris(self) -> list[str]:
        """The roots as a request names them."""
        return [root.uri for root in self.roots]

    def resolve(self, text: Optional[str], argument: str = "path") -> tuple[StorageRoot, str]:
        """``(root, folder)``: the root holding the folder ``text`` names, and that folder in
        the root's storage's terms (a local one with its symlinks resolved). Raises
        :class:`PathRefused` unless it is inside a configured root, ValueError when ``text``
        is missing."""
        if text is not None and not isinstance(text, str):
            raise ValueError(f"the {argument!r} argument must be a string (a path or URL); got "
                             f"{argument}={text!r} ({type(text).__name__}). Fix: pass a folder "
                             f"under one of the served roots ({self._served()})")
        if not text:
            raise ValueError(f"the {argument!r} argument is missing. Fix: pass a folder under "
                             f"one of the served roots ({self._served()})")
        if "\x00" in text:
            raise PathRefused(f"{argument}={text!r} holds a NUL character")
        scheme = _scheme(text)
        if scheme not in (None, "file"):
            return self._resolve_url(text, scheme, argument)
        local = _without_file_scheme(text)
        if not os.path.isabs(local):
            raise self._refused(text, argument, "it is not an absolute path")
        if ".." in local.split(os.sep):
            raise self._refused(text, argument, "it has a '..' segment")
        resolved = os.path.realpath(local)
        for root in self.roots:
            if root.storage.is_local and root.holds(resolved):
                return root, resolved
        why = ("it leads out of them through a symlink" if resolved != os.path.normpath(local)
               else "it is outside them")
        raise self._refused(text, argument, why)

    def experiment(self, text: Optional[str]) -> tuple[StorageRoot, ExperimentPaths]:
        """The experiment folder ``text`` names, confined as :meth:`resolve` does."""
        root, folder = self.resolve(text, "path")
        return root, ExperimentPaths(root.storage, folder)

    def _resolve_url(self, text: str, scheme: str, argument: str) -> tuple[StorageRoot, str]:
        candidates = [r for r in self.roots if r.protocol == scheme]
        if not candidates:
            raise self._refused(text, argument, f"no served root is a {scheme}:// URL")
        rest = text.split("://", 1)[1]
        segments = rest.split("/")
        if ".." in segments or "." in segments:
            raise self._refused(text, argument, "it has a '..' or '.' segment")
        for root in candidates:
            folder = root.storage.fs._strip_protocol(text).rstrip("/")
            if root.holds(folder):
                return root, folder
        raise self._refused(text, argument, "it is outside them")

    def _served(self) -> str:
        return ", ".join(self.uris())

    def _refused(self, text: str, argument: str, why: str) -> PathRefused:
        return PathRefused(
            f"{argument}={text!r} is not inside the storage roots this server serves "
            f"({self._served()}): {why}. Fix: open an experiment the panel lists, or add its "
            "storage to c.Ftnb.storage_roots in jupyter_server_config.py")


def _scheme(text: str) -> Optional[str]:
    """The URL scheme of ``text`` (``s3`` for ``s3://...``), None for a plain path."""
    if "://" not in text:
        return None
    scheme = text.split("://", 1)[0]
    return scheme.lower() if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) else None


def _without_file_scheme(text: str) -> str:
    return text[len("file://"):] if text.lower().startswith("file://") else text

