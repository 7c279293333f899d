"""How a reported checkpoint reaches storage without stalling the training loop.

* :func:`snapshot_folder`: a cheap, private copy of the reported folder (hard links where the
  filesystem allows them, a copy otherwise), taken before ``report(..., checkpoint_upload_mode=
  ASYNC)`` returns, so the trainable may delete its folder at once (a ``TemporaryDirectory``).
  :meth:`Snapshot.changed_files` tells whether a file was rewritten in place meanwhile (a hard
  link shares the file's contents): such an upload is refused, never kept.
* :func:`register_folder`: a folder that already is at its place in storage (``NO_UPLOAD``, or
  written there by a ``checkpoint_upload_fn``) becomes a checkpoint: its marker, written last,
  records its files, as :meth:`Storage.persist_directory` does for a copied one.
* :class:`UploadQueue`: the jobs of one attempt (a checkpoint's upload, then its row), run by one
  thread in the order they were queued, at most ``max_checkpoints`` checkpoints queued or in
  flight (``put`` waits beyond: back pressure). A job that fails stops the queue: the jobs after
  it are dropped (their rows would follow a missing one) and the error is raised in the
  training thread at its next call (``raise_error``, ``put``, ``drain``).

Ownership: the queue is the attempt's; only its training thread calls ``put`` and ``drain``.
Jobs write the trial's files, so the training thread writes them only while the queue is idle
(:meth:`UploadQueue.idle`): one writer at a time, rows in order.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from .checkpoint_files import _sizes, describe_folder
from .file_names import CHECKPOINT_MARKER, temporary_folder_name
from .local_disk import _copy_file_fsync, _fsync_dir

if TYPE_CHECKING:
    from .backend import Storage

__all__ = ["MAX_CHECKPOINTS_IN_FLIGHT", "Snapshot", "UploadQueue", "register_folder",
           "snapshot_folder"]

#: How many asynchronous checkpoints an attempt has queued or uploading before ``report`` waits
#: (``$FTNB_MAX_ASYNC_CHECKPOINTS`` sets another).
MAX_CHECKPOINTS_IN_FLIGHT = 2
MAX_IN_FLIGHT_ENV = "FTNB_MAX_ASYNC_CHECKPOINTS"

_SNAPSHOT_PREFIX = ".ftnb-snapshot-"


def max_checkpoints_in_flight() -> int:
    """``$FTNB_MAX_ASYNC_CHECKPOINTS`` (a whole number >= 1), else the default."""
    text = os.environ.get(MAX_IN_FLIGHT_ENV, "").strip()
    if not text:
        return MAX_CHECKPOINTS_IN_FLIGHT
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"${MAX_IN_FLIGHT_ENV}={text!r}: it must be a whole number >= 1 (how "
                         "many asynchronous checkpoints may be queued or uploading). Fix: "
                         f"unset it or set e.g. {MAX_IN_FLIGHT_ENV}=2.")
    return int(text)


@dataclass
class Snapshot:
    """A private copy of a reported folder: ``path``, made by hard links (``linked``) or by
    copying, and what each file was then (``stats``: relative path to (size, mtime_ns))."""

    source: str
    path: str
    linked: bool
    stats: dict[str, tuple[int, int]] = field(default_factory=dict)

    def changed_files(self) -> list[str]:
        """The files of a linked snapshot that were rewritten in place since it was taken (a
        hard link sees the new contents): what was uploaded may be a mix of old and new."""
        if not self.linked:
            return []
        changed = []
        for rel, seen in self.stats.items():
            try:
                st = os.stat(os.path.join(self.path, rel))
            except FileNotFoundError:
                changed.append(rel)
                continue
            if (st.st_size, st.st_mtime_ns) != seen:
                changed.append(rel)
        return changed

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def snapshot_folder(source: str, staging: Optional[str] = None) -> Snapshot:
    """A :class:`Snapshot` of the local folder ``source``: hard links in a hidden folder beside
    it (same filesystem), else a copy in ``staging`` (default: a new temporary folder)."""
    parent = os.path.dirname(os.path.abspath(source.rstrip(os.sep)))
    _remove_dead_snapshots(parent)
    prefix = f"{_SNAPSHOT_PREFIX}{os.getpid()}-"
    try:
        target = tempfile.mkdtemp(prefix=prefix, dir=parent)
    except OSError:
        target = None
    if target is not None:
        snap = Snapshot(source, target, linked=True)
        try:
            _link_tree(source, target, snap.stats)
            return snap
        except OSError as exc:
            shutil.rmtree(target, ignore_errors=True)
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK,
                                 errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
    target = tempfile.mkdtemp(prefix=prefix, dir=staging)
    shutil.copytree(source, target, dirs_exist_ok=True)
    return Snapshot(source, target, linked=False)


def _remove_dead_snapshots(parent: str) -> None:
    """Delete the snapshots in ``parent`` of processes that are gone (a trial SIGKILLed
    mid-upload): their hard links would hold the checkpoint's space forever."""
    from ..system.processes import pid_exists

    try:
        names = [n for n in os.listdir(parent) if n.startswith(_SNAPSHOT_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_SNAPSHOT_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or pid_exists(int(pid)):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)



def _link_tree(source: str, target: str, stats: dict[str, tuple[int, int]]) -> None:
    for root, dirs, names in os.walk(source):
        rel_root = os.path.relpath(root, source)
        out_root = target if rel_root == "." else os.path.join(target, rel_root)
        for d in dirs:
            os.makedirs(os.path.join(out_root, d), exist_ok=True)
        for name in names:
            src = os.path.join(root, name)
            st = os.stat(src)
            os.link(src, os.path.join(out_root, name))
            rel = name if rel_root == "." else os.path.join(rel_root, name)
            stats[rel] = (st.st_size, st.st_mtime_ns)


def register_folder(storage: "Storage", dest: str, marker: dict) -> None:
    """Make the folder ``dest``, already in storage, a checkpoint: write its marker (with what
    it records of the files, see :mod:`~ftnb.storage.checkpoint_files`), last."""
    if storage.is_local:
        described = describe_folder(dest)
    else:
        described = {"files": _sizes(storage, dest), "crc32": {}}
    described["files"].pop(CHECKPOINT_MARKER, None)
    described["crc32"].pop(CHECKPOINT_MARKER, None)
    storage.write_atomic(storage.join(dest, CHECKPOINT_MARKER),
                         json.dumps({**marker, **described}))


class UploadQueue:
    """See the module's docstring."""

    def __init__(self, max_checkpoints: int) -> None:
        self.max_checkpoints = max_checkpoints
        self._jobs: deque[tuple[Callable[[], None], bool]] = deque()
        self._cond = threading.Condition()
        self._busy = 0  # jobs queued or running
        self._checkpoints = 0  # of them, with a checkpoint
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def idle(self) -> bool:
        """Whether no job is queued or running (then the training thread may write itself)."""
        with self._cond:
            return self._busy == 0

    def put(self, job: Callable[[], None], with_checkpoint: bool) -> float:
        """Queue ``job``; with a checkpoint, first wait while ``max_checkpoints`` are queued or
        uploading. Returns the seconds waited."""
        import time

        started = time.monotonic()
        with self._cond:
            while (with_checkpoint and self._checkpoints >= self.max_checkpoints
                   and self._error is None):
                self._cond.wait(0.5)
            self._raise_error_locked()
            self._jobs.append((job, with_checkpoint))
            self._busy += 1
            self._checkpoints += with_checkpoint
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ftnb-uploads",
                                                daemon=True)
                self._thread.start()
        return time.monotonic() - started

    def drain(self) -> None:
        """Wait until every queued job ran; raise the error of one that failed."""
        with self._cond:
            while self._busy and self._error is None:
                self._cond.wait(0.5)
            self._raise_error_locked()

    def raise_error(self) -> None:
        """Raise the error of a job that failed (once), else nothing."""
        with self._cond:
            self._raise_error_locked()

    def _raise_error_locked(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job, with_checkpoint = self._jobs[0]
            try:
                job()
                error = None
            except BaseException as exc:  # raised in the training thread instead
                error = exc
            with self._cond:
                self._jobs.popleft()
                self._busy -= 1
                self._checkpoints -= with_checkpoint
                if error is not None:
                    self._error = error
                    dropped = list(self._jobs)  # their rows would follow a missing one
                    self._jobs.clear()
                    for dropped_job, _ in dropped:
                        discard = getattr(dropped_job, "discard", None)
                        if discard is not None:
                            discard()
                    self._busy -= len(dropped)
                    self._checkpoints -= sum(c for _, c in dropped)
                self._cond.notify_all()


# -- the checkpoint of several ranks, merged into one folder -------------------------------------
def shard_folder(storage: "Storage", trial_dir: str, name: str, dest: str) -> str:
    """Where the ranks of a group write their files of the checkpoint ``name`` (whose place is
    ``dest``): on a local disk a hidden folder beside it, renamed into place once whole (swept
    as debris otherwise); elsewhere ``dest`` itself, whole once its marker is written."""
    if storage.is_local:
        return os.path.join(trial_dir, f"{temporary_folder_name(name).rsplit('-', 1)[0]}-shards")
    return dest


def write_shard(storage: "Storage", source: str, folder: str, skip: Iterable[str] = ()) -> None:
    """Copy the local folder ``source``'s files into ``folder`` (other ranks add theirs), but
    those in ``skip`` (relative paths with ``/``: another rank writes the same bytes)."""
    skipped = set(skip)
    if not storage.is_local and not skipped:
        storage.fs.put(source.rstrip("/") + "/", folder.rstrip("/") + "/", recursive=True)
        return
    for root, _, names in os.walk(source):
        rel = os.path.relpath(root, source)
        target = folder if rel == "." else os.path.join(folder, rel)
        if storage.is_local:
            os.makedirs(target, exist_ok=True)
        for name in names:
            rel_file = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            if rel_file in skipped:
                continue
            if storage.is_local:
                _copy_file_fsync(os.path.join(root, name), os.path.join(target, name))
            else:
                storage.fs.put_file(os.path.join(root, name), f"{folder.rstrip('/')}/{rel_file}")


def finish_shards(storage: "Storage", folder: str, dest: str, marker: dict) -> None:
    """Rank 0, once every rank wrote its files into ``folder`` (:func:`shard_folder`): make the
    merged checkpoint whole at ``dest``, its marker last."""
    if not storage.is_local:
        register_folder(storage, dest, marker)
        return
    os.makedirs(folder, exist_ok=True)
    described = describe_folder(folder)
    with open(os.path.join(folder, CHECKPOINT_MARKER), "wb") as f:
        f.write(json.dumps({**marker, **described}).encode())
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(folder)
    if os.path.exists(dest):
        shutil.rmtree(dest)  # debris of an attempt that died after its rename, before its row
    os.rename(folder, dest)
    _fsync_dir(os.path.dirname(dest))
