"""Checkpoint: a folder of files on some filesystem, local or remote."""

from __future__ import annotations

import contextlib
import enum
import os
import tempfile
from typing import Any, Iterator, Optional

__all__ = ["Checkpoint", "CheckpointUploadMode"]


class CheckpointUploadMode(enum.Enum):
    """How ``report(..., checkpoint=...)`` brings a checkpoint into the trial's storage
    (Ray Train's ``CheckpointUploadMode``; see docs/checkpoint-uploads.md).

    - ``SYNC``: ``report`` returns once the checkpoint and its row are persisted (the default).
    - ``ASYNC``: ``report`` returns once the folder is snapshotted; the upload runs in the
      background, in order, and the row becomes visible once the checkpoint is whole.
    - ``NO_UPLOAD``: the reported folder already is in the trial's folder on storage (written
      there by the trainable); it is registered where it is, never copied.
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """What ``delete_local_checkpoint_after_upload=None`` means: True for ``ASYNC``,
        False otherwise (as in Ray Train)."""
        return self is CheckpointUploadMode.ASYNC

#: The file in a checkpoint's folder that holds its metadata (Ray Train's name for it).
METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A folder of files that a trainable saves and restores from, as in Ray Tune.

    Inside a trainable, save state to a local folder and hand it to ``report``; ftnb copies it
    into the trial's folder on storage before ``report`` returns::

        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            ftnb.report({"loss": loss}, checkpoint=ftnb.Checkpoint.from_directory(d))

    and restore with ``get_checkpoint``::

        ckpt = ftnb.get_checkpoint()
        if ckpt:
            with ckpt.as_directory() as d:
                model.load_state_dict(torch.load(os.path.join(d, "model.pt")))

    Attributes:
        path: the folder's path on its filesystem (without the protocol).
        filesystem: the fsspec filesystem holding it.
    """

    def __init__(self, path: str | os.PathLike, filesystem: Any = None) -> None:
        from .storage import Storage

        # The folder's storage answers every local-or-remote question (where to read it, its
        # URL); ``path`` is the storage's root: absolute on a local disk, without the protocol.
        self._storage = Storage(os.fspath(path), filesystem)
        self.filesystem = self._storage.fs
        self.path: str = self._storage.root

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> "Checkpoint":
        """A checkpoint of the folder ``path`` (a local path or an fsspec URL)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"Checkpoint.from_directory(path=...) needs a folder path; got "
                f"{type(path).__name__}: {path!r}."
            )
        ckpt = cls(path)
        if ckpt._storage.missing_local_folder(ckpt.path):
            raise ValueError(
                f"Checkpoint.from_directory(path={os.fspath(path)!r}): no such folder. "
                "Fix: save your files into a folder first, then pass that folder."
            )
        return ckpt

    @property
    def uri(self) -> str:
        """The checkpoint's location as a path (local) or URL (remote)."""
        return self._storage.uri(self.path)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local folder with the checkpoint's files, for reading.

        A local checkpoint is yielded in place, without a copy (do not modify it); a remote one
        is downloaded to a temporary folder that is deleted afterwards.
        """
        with self._storage.local_folder(self.path) as folder:
            yield folder

    def to_directory(self, path: Optional[str | os.PathLike] = None) -> str:
        """Copy the checkpoint's files into the local folder ``path`` (default: a new temporary
        folder) and return that folder's path."""
        target = (os.fspath(path) if path is not None
                  else tempfile.mkdtemp(prefix="ftnb-checkpoint-"))
        self._storage.copy_folder_to_local(self.path, target)
        return target

    # -- metadata (Ray's get_metadata / set_metadata / update_metadata) -------------------------
    def get_metadata(self) -> dict[str, Any]:
        """The checkpoint's metadata: a JSON dict kept in its folder (``.metadata.json``), so it
        travels with the checkpoint when it is reported and is there when it is restored. ``{}``
        when none was set."""
        import json

        path = self._storage.join(self.path, METADATA_FILE)
        if not self._storage.exists(path):
            return {}
        return json.loads(self._storage.read_text(path))

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the checkpoint's metadata with ``metadata`` (a dict of JSON values), written
        into its folder at once: set it before ``report(..., checkpoint=...)`` to persist it with
        the checkpoint."""
        import json

        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint.set_metadata(metadata=...) needs a dict; got "
                            f"{type(metadata).__name__}: {metadata!r}.")
        try:
            text = json.dumps(metadata, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"Checkpoint.set_metadata: the metadata must be JSON values (numbers, strings, "
                f"lists, dicts); {exc}. Fix: store other objects as files in the checkpoint."
            ) from None
        self._storage.write_atomic(self._storage.join(self.path, METADATA_FILE), text)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the checkpoint's metadata (its keys win)."""
        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint.update_metadata(metadata=...) needs a dict; got "
                            f"{type(metadata).__name__}: {metadata!r}.")
        self.set_metadata({**self.get_metadata(), **metadata})

    def __repr__(self) -> str:
        return f"Checkpoint({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __reduce__(self) -> tuple:
        return (Checkpoint, (self.path, self.filesystem))
