"""Experiment storage: named paths and atomic, durable writes through fsspec.

Contract (every writer follows it, every reader relies on it):

* A reader never sees half a file. Whole files are replaced atomically: on a local disk through
  a temporary file that is fsynced and renamed over the target (then the folder is fsynced); on
  object stores with one PUT of the complete object.
* ``result.json`` (and its mirror ``progress.csv``) grow by whole lines (:class:`LineLog`).
  Each line is written with a single ``write()`` so a process death leaves at most a torn *last*
  line, which readers skip and the next writer repairs; a bad line anywhere else is corruption,
  which readers report (:class:`CorruptFileError`) rather than skip.
* A checkpoint folder is complete once its ``.ftnb_checkpoint.json`` marker exists and the
  result line naming it is written. Folders without both are debris from a crash and are ignored.
* Every file and folder of an experiment is a named path of :class:`ExperimentPaths` and
  :class:`TrialPaths` (temporary names included); nobody joins experiment paths by hand.
* Only the process that runs the current attempt of a trial writes into that trial's folder
  (results, checkpoints, output); only the controller writes ``experiment_state.json``,
  ``params.json`` and ``error.txt``.

Outages. A write to remote storage (an object store, any non-local fsspec filesystem) that fails
with anything but a permanent error (a missing path, a denied permission) is retried with
backoff for up to ``$FTNB_STORAGE_OUTAGE_S`` seconds (default 600) after the storage stopped
answering, past the filesystem's own few seconds of retries: the writer (the driver saving
state, a trial in ``report()``) waits out a network outage instead of failing, and an
acknowledged report is still a persisted one. Past that, :class:`StorageUnavailableError`.
Reads are not retried: readers (the widget, the CLI) poll again anyway.

A network that drops packets instead of refusing connections makes a request hang rather than
fail, so every call to an async fsspec filesystem (s3fs, gcsfs, ...) has a deadline:
``$FTNB_STORAGE_CALL_TIMEOUT_S`` (default 60) plus the time to move its bytes at 1 MB/s. A call
past it is cancelled and counts as a failure of the outage kind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

__all__ = [
    "CorruptFileError",
    "ExperimentPaths",
    "LineLog",
    "StagedFile",
    "Storage",
    "StorageUnavailableError",
    "TrialPaths",
    "default_storage_path",
    "read_json_lines",
]

OUTAGE_ENV = "FTNB_STORAGE_OUTAGE_S"
DEFAULT_OUTAGE_S = 600.0
CALL_TIMEOUT_ENV = "FTNB_STORAGE_CALL_TIMEOUT_S"
DEFAULT_CALL_TIMEOUT_S = 60.0
_SLOWEST_BYTES_PER_S = 1 << 20  # what a call's deadline allows for its data, on top
_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 30.0
# Errors that waiting cannot cure: the path is wrong, or access is denied.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError,
              IsADirectoryError, ValueError, TypeError)


#: How often readers poll a local disk and an object store (see Storage.poll_interval_s).
LOCAL_POLL_S = 0.2
REMOTE_POLL_S = 2.0


class StorageUnavailableError(OSError):
    """Remote storage did not take a write for longer than ``$FTNB_STORAGE_OUTAGE_S``."""


def _seconds_from_env(name: str, default: float, what: str, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= minimum:
        raise ValueError(f"{name}={raw!r} is not a number of seconds >= {minimum:g}. Fix: set it "
                         f"to {what} (default {default:.0f}).")
    return value


def outage_limit_s() -> float:
    """How long a writer waits for remote storage to answer again (``$FTNB_STORAGE_OUTAGE_S``)."""
    return _seconds_from_env(OUTAGE_ENV, DEFAULT_OUTAGE_S,
                             "how long writers should wait for storage")


def call_timeout_s() -> float:
    """The base deadline of one call to remote storage (``$FTNB_STORAGE_CALL_TIMEOUT_S``)."""
    return _seconds_from_env(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_S,
                             "the longest a storage request may hang", minimum=1.0)


def check_outage_settings() -> None:
    """Raise a clear error for a bad ``$FTNB_STORAGE_OUTAGE_S`` or ``$FTNB_STORAGE_CALL_TIMEOUT_S``
    now, before an experiment starts, rather than in the middle of an outage."""
    outage_limit_s()
    call_timeout_s()


def call_deadline(fs: Any, nbytes: int = 0) -> dict:
    """``timeout=`` for a call to an async fsspec filesystem that moves ``nbytes`` (see the
    module docstring); nothing for other filesystems, which take no such argument."""
    from fsspec.asyn import AsyncFileSystem

    if not isinstance(fs, AsyncFileSystem):
        return {}
    return {"timeout": call_timeout_s() + nbytes / _SLOWEST_BYTES_PER_S}


def is_transient(exc: BaseException) -> bool:
    """Whether a storage error may go away by itself (a network or service outage)."""
    return isinstance(exc, Exception) and not isinstance(exc, _PERMANENT)

# The names of an experiment's files: the on-disk format, read by every ftnb version since.
# Only ExperimentPaths and TrialPaths (below) use them; everyone else asks those for paths.
STATE_FILE = "experiment_state.json"
STATE_BACKUP_FILE = "experiment_state.prev.json"
CHECKPOINT_MARKER = ".ftnb_checkpoint.json"
LEASE_FILE = "owner.json"
LEASE_LOCK_FILE = ".owner.lock"
CONTROL_DIR = "control"
CONTROL_REQUEST_SUFFIX = ".json"
SUPERVISOR_FILE = "supervisor.json"
SUPERVISOR_LOG = "supervisor.log"
TRIAL_RECORD_FILE = "trial.json"
PARAMS_FILE = "params.json"
RESULTS_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
ERROR_FILE = "error.txt"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
_CHECKPOINT_PREFIX = "checkpoint_"
# A folder being copied into place on a local disk (see Storage.persist_directory).
_TEMP_FOLDER_PREFIX = ".tmp-"


def default_storage_path() -> str:
    """``$FTNB_STORAGE_PATH`` if set, else ``~/ftnb_results``."""
    return os.environ.get("FTNB_STORAGE_PATH") or os.path.join(
        os.path.expanduser("~"), "ftnb_results"
    )


def checkpoint_dir_name(index: int) -> str:
    """The name of a trial's checkpoint folder number ``index`` (``checkpoint_000003``)."""
    return f"{_CHECKPOINT_PREFIX}{index:06d}"


def checkpoint_index(dir_name: str) -> Optional[int]:
    """The number of the checkpoint folder ``dir_name``, or None for any other name."""
    prefix = _CHECKPOINT_PREFIX
    if dir_name.startswith(prefix) and dir_name[len(prefix) :].isdigit():
        return int(dir_name[len(prefix) :])
    return None


def is_temporary_checkpoint(dir_name: str) -> bool:
    """Whether ``dir_name`` is a checkpoint folder still being copied into place (debris once
    its writer is dead)."""
    return dir_name.startswith(_TEMP_FOLDER_PREFIX + _CHECKPOINT_PREFIX)


def _temporary_folder_name(name: str) -> str:
    """``.tmp-<name>-<8 hex digits>``: the folder a local copy of ``name`` is built in."""
    return f"{_TEMP_FOLDER_PREFIX}{name}-{uuid.uuid4().hex[:8]}"


class Storage:
    """An fsspec filesystem and a root folder on it, with the atomic operations ftnb needs.

    ``Storage`` is picklable: trial processes receive the controller's instance and write through
    the same filesystem (same credentials, same endpoint).
    """

    def __init__(self, url: str, filesystem: Any = None) -> None:
        import fsspec.core

        url = os.fspath(url)
        if filesystem is None and _is_local_path_with_colons(url):
            # fsspec would read "::" as a chain of filesystems and cut the path there.
            fs, path = fsspec.filesystem("file"), os.path.abspath(os.path.expanduser(url))
        elif filesystem is None:
            fs, path = fsspec.core.url_to_fs(os.path.expanduser(url))
        else:
            fs = filesystem
            path = fs._strip_protocol(url)
        self.fs = fs
        self.root = path.rstrip("/") if path != "/" else path
        self.url = url
        self.is_local = is_local_fs(fs)
        if self.is_local:
            self.root = os.path.abspath(self.root)
        self._down_since: Optional[float] = None  # when remote writes started failing

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_down_since"] = None  # another process has its own view of the outage
        return state

    def __repr__(self) -> str:
        return f"Storage({self.uri(self.root)!r})"

    # -- paths ---------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        if self.is_local:
            return os.path.join(*parts)
        return posixpath.join(*parts)

    def uri(self, path: str) -> str:
        """A path a user can paste: plain for local disk, with the protocol otherwise."""
        if self.is_local:
            return path
        return self.fs.unstrip_protocol(path)

    def parent(self, path: str) -> str:
        """The folder holding ``path``."""
        if self.is_local:
            return os.path.dirname(path.rstrip(os.sep)) or os.sep
        return posixpath.dirname(path.rstrip("/"))

    # -- how to use it -------------------------------------------------------------------------
    @property
    def poll_interval_s(self) -> float:
        """How often a reader (a widget, ``ftnb watch``, a driver's control inbox) should look
        for changes: a local disk answers in microseconds, an object store request costs a
        round trip (and money)."""
        return LOCAL_POLL_S if self.is_local else REMOTE_POLL_S

    @property
    def user_filesystem(self) -> Any:
        """The fsspec filesystem to hand to a user's call (``storage_filesystem=``): None for
        the local disk, which needs none."""
        return None if self.is_local else self.fs

    def staged_file(self, path: str, staging_dir: Optional[str] = None,
                    local_path: Optional[str] = None) -> "StagedFile":
        """A file that a process appends to through the OS (a log, a trial's stdout) and that
        ends up at ``path``: the file itself on a local disk, else the local file
        ``local_path`` (default: one of the same name in ``staging_dir``, by default a new
        temporary folder) copied to ``path`` by :meth:`StagedFile.publish`."""
        return StagedFile(self, path, staging_dir, local_path)

    @contextlib.contextmanager
    def exclusive_lock(self, path: str) -> Iterator[bool]:
        """Hold an exclusive lock on the file ``path`` (created if missing) for a ``with``
        block. Yields True where the lock excludes every other process (a local or NFS disk:
        ``flock``), False where the storage has no such lock (object stores and other remote
        filesystems): the block then runs unserialized and the caller settles races another
        way (write, wait, read back)."""
        if not self.is_local:
            yield False
            return
        import fcntl

        os.makedirs(self.parent(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def cheap_version(self, path: str) -> Optional[tuple]:
        """A value that changes whenever the file ``path`` is written or replaced, when one can
        be had without a request: on a local disk its inode, modification time and size (a
        ``stat``; :class:`FileNotFoundError` when it is missing). None elsewhere, where it would
        cost a round trip: read the file itself, at most every so often."""
        if not self.is_local:
            return None
        st = os.stat(path)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def missing_local_folder(self, path: str) -> bool:
        """Whether ``path`` is on this machine's disk and is not a folder there. Remote storage
        is not asked (False): that costs a request, and may need credentials that are set up
        only where the folder is read."""
        return self.is_local and not os.path.isdir(path)

    @contextlib.contextmanager
    def local_folder(self, path: str) -> Iterator[str]:
        """A folder of this machine with the files of the folder ``path``, for reading: on a
        local disk ``path`` itself, without a copy (do not modify it); elsewhere a temporary
        download, deleted after the ``with`` block."""
        if self.is_local:
            yield path
            return
        import tempfile

        tmp = tempfile.mkdtemp(prefix="ftnb-checkpoint-")
        try:
            self._download_folder(path, tmp)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def copy_folder_to_local(self, path: str, target: str) -> None:
        """Copy the files of the folder ``path`` into the local folder ``target`` (created if
        missing; files already there are overwritten)."""
        os.makedirs(target, exist_ok=True)
        if self.is_local:
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            self._download_folder(path, target)

    def _download_folder(self, path: str, target: str) -> None:
        self.fs.get(path.rstrip("/") + "/", target.rstrip("/") + "/", recursive=True)

    def line_log(self, path: str, contents: Callable[[], bytes]) -> "LineLog":
        """The file ``path``, to grow by whole lines (see :class:`LineLog`)."""
        return LineLog(self, path, contents)

    # -- reads ---------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        if self.is_local:
            return os.path.exists(path)
        return self.fs.exists(path, **self._deadline())

    def isdir(self, path: str) -> bool:
        if self.is_local:
            return os.path.isdir(path)
        return self.fs.isdir(path, **self._deadline())

    def read_bytes(self, path: str) -> bytes:
        if self.is_local:
            with open(path, "rb") as f:
                return f.read()
        return self.fs.cat_file(path, **self._deadline())

    def _deadline(self, nbytes: int = 0) -> dict:
        return call_deadline(self.fs, nbytes)

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def listdir(self, path: str) -> list[str]:
        """Names (not paths) of the entries of a folder; [] if it does not exist."""
        if self.is_local:
            try:
                return sorted(os.listdir(path))
            except (FileNotFoundError, NotADirectoryError):
                return []
        try:
            entries = self.fs.ls(path, detail=False, refresh=True, **self._deadline())
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = [posixpath.basename(e.rstrip("/")) for e in entries]
        return sorted(n for n in names if n)

    # -- reads that poll (the read model's readers: ftnb.ui.monitor, `ftnb logs`) -----------------
    # Added for issue 13, item 5 (one read model); see FileVersions at the end of this module.
    def file_versions(self, folder: str) -> "FileVersions":
        """The versions of the files under ``folder`` as they are now (:class:`FileVersions`)."""
        return FileVersions(self, folder)

    def read_from(self, path: str, offset: int, size: Optional[int] = None) -> tuple[int, bytes]:
        """``(start, data)``: the bytes of the file ``path`` from ``offset`` to its end, with
        ``start == offset``; or the whole file with ``start == 0`` when it is now shorter than
        ``offset`` (it was replaced). ``size``: its size if the caller knows it (from
        :class:`FileVersions`), which saves an object store a request. FileNotFoundError if
        it is missing."""
        if self.is_local:
            with open(path, "rb") as f:
                start = offset if offset <= os.fstat(f.fileno()).st_size else 0
                f.seek(start)
                return start, f.read()
        if offset:
            if size is None:
                size = self.fs.info(path, **self._deadline())["size"]
            if offset > size:
                offset = 0
            elif offset == size:
                return offset, b""
        if not offset:
            return 0, self.fs.cat_file(path, **self._deadline(size or 0))
        return offset, self.fs.cat_file(path, start=offset, **self._deadline(size - offset))

    # -- writes --------------------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        if self.is_local:
            os.makedirs(path, exist_ok=True)
        elif _is_object_store(self.fs):
            # Folders are implicit there; s3fs's makedirs would *create a bucket* for a
            # mistyped storage_path (and fail where HeadBucket is denied but the prefix is not).
            return
        else:
            self.fs.makedirs(path, exist_ok=True)

    def write_atomic(self, path: str, data: bytes | str, durable: bool = True) -> None:
        """Replace ``path`` with ``data`` so that readers see the old or the new file, whole.

        ``durable=False`` skips the fsyncs on a local disk: the file still survives the death
        of any process, but not necessarily a machine crash (for records that have a durable
        fallback).
        """
        if isinstance(data, str):
            data = data.encode("utf-8")
        if self.is_local:
            _local_write_atomic(path, data, durable)
        else:
            # One PUT of the complete object: object stores never expose a partial object.
            self._retrying(f"writing {self.uri(path)}", self.fs.pipe_file, path, data,
                           **self._deadline(len(data)))

    def _retrying(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, retried through an outage of remote storage (see the module
        docstring). One outage shares one deadline across all the writes that meet it."""
        delay = _RETRY_FIRST_S
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                now = time.monotonic()
                limit = outage_limit_s()
                if self._down_since is None:
                    self._down_since = now
                    print(f"ftnb: storage {self.uri(self.root)} is not answering ({what}: "
                          f"{type(exc).__name__}: {exc}); waiting for it for up to "
                          f"{limit:.0f} s ({OUTAGE_ENV}).", file=sys.stderr, flush=True)
                left = self._down_since + limit - now
                if left <= 0:
                    raise StorageUnavailableError(
                        f"storage {self.uri(self.root)} has not answered for "
                        f"{now - self._down_since:.0f} s ({what}: {type(exc).__name__}: {exc}). "
                        f"Fix: check the network and the storage service; the experiment can "
                        f"be resumed once it is back (wait longer with {OUTAGE_ENV})."
                    ) from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, _RETRY_MAX_S)
                continue
            if self._down_since is not None:
                print(f"ftnb: storage {self.uri(self.root)} is answering again after "
                      f"{time.monotonic() - self._down_since:.0f} s.", file=sys.stderr, flush=True)
                self._down_since = None
            return result

    def remove_leftover_temps(self, folder: str, targets: frozenset[str]) -> list[str]:
        """Delete the temporary files that :meth:`write_atomic` left in ``folder`` for the files
        named in ``targets`` (their writer died between writing and renaming); return their
        names. Call it only as the owner of those files, once no earlier writer can be alive:
        a live writer's temporary file would be pulled from under it. Nothing else is touched.
        """
        if not self.is_local:
            return []  # object stores replace files with one PUT: there is no temporary file
        removed = []
        for name in self.listdir(folder):
            match = _TEMP_NAME.match(name)
            if match and match.group("target") in targets:
                self.remove(self.join(folder, name))
                removed.append(name)
        return removed

    def write_json_atomic(self, path: str, obj: Any) -> None:
        self.write_atomic(path, json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")

    def remove(self, path: str, recursive: bool = False) -> None:
        try:
            if self.is_local:
                if recursive and os.path.isdir(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
            else:
                self._retrying(f"removing {self.uri(path)}", self.fs.rm, path,
                               recursive=recursive, **self._deadline())
        except FileNotFoundError:
            pass

    def upload_file(self, local_path: str, path: str) -> None:
        """Replace ``path`` with a copy of the local file ``local_path`` (readers see the old
        or the new file, whole)."""
        if self.is_local:
            tmp = _temporary_file_path(path)
            try:
                shutil.copyfile(local_path, tmp)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
                raise
        else:
            self._retrying(f"uploading {self.uri(path)}", self.fs.put_file, local_path, path,
                           **self._deadline(os.path.getsize(local_path)))

    def check_writable(self) -> None:
        """Create the root and write+delete a probe file; raise a clear error if that fails."""
        probe = self.join(self.root, f".ftnb-write-probe-{uuid.uuid4().hex[:8]}")
        try:
            # Not through the outage retries: storage that is down before anything started is
            # a mistake to report now (a wrong endpoint, say), not an outage to wait out.
            self.makedirs(self.root)
            if self.is_local:
                self.write_atomic(probe, b"ok")
                self.remove(probe)
            else:
                self.fs.pipe_file(probe, b"ok", **self._deadline())
                self.fs.rm(probe, **self._deadline())
        except Exception as exc:  # any backend error means the same thing to the user
            raise ValueError(
                f"storage_path={self.uri(self.root)!r} is not writable: "
                f"{type(exc).__name__}: {exc}. Fix: pass a storage_path you can write to "
                "(a local folder, an NFS mount, or an s3:// / gs:// URL with credentials), or "
                "set FTNB_STORAGE_PATH."
            ) from exc

    # -- checkpoints ---------------------------------------------------------------------------
    def persist_directory(self, source: str, dest: str, marker: dict) -> None:
        """Copy the local folder ``source`` to ``dest`` durably, then write the marker.

        Locally the copy goes to a hidden temporary folder that is fsynced and renamed into place,
        so ``dest`` either does not exist or is complete. On object stores the files are uploaded
        and the marker goes last: a folder without a marker is incomplete.
        """
        marker_bytes = json.dumps(marker).encode("utf-8")
        if self.is_local:
            parent = os.path.dirname(dest)
            tmp = os.path.join(parent, _temporary_folder_name(os.path.basename(dest)))
            _copy_tree_fsync(source, tmp)
            _write_fsync(os.path.join(tmp, CHECKPOINT_MARKER), marker_bytes)
            _fsync_dir(tmp)
            if os.path.exists(dest):
                # Debris of an attempt that died after renaming but before its result line.
                shutil.rmtree(dest)
            os.rename(tmp, dest)
            _fsync_dir(parent)
        else:
            # Both steps are idempotent: a retry after an outage uploads the folder again.
            size = sum(os.path.getsize(os.path.join(root, name))
                       for root, _, names in os.walk(source) for name in names)
            self._retrying(f"uploading {self.uri(dest)}", self.fs.put,
                           source.rstrip("/") + "/", dest.rstrip("/") + "/", recursive=True,
                           **self._deadline(size))
            self._retrying(f"writing {self.uri(dest)}", self.fs.pipe_file,
                           self.join(dest, CHECKPOINT_MARKER), marker_bytes, **self._deadline())


_OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})


def _is_local_path_with_colons(url: str) -> bool:
    """Whether ``url`` is a local path with ``::`` in it, not a chain of fsspec filesystems
    (``simplecache::s3://bucket/runs``): no protocol before its first ``::``."""
    from fsspec.core import split_protocol
    from fsspec.registry import known_implementations

    if "::" not in url:
        return False
    head = url.split("::", 1)[0]
    return split_protocol(head)[0] is None and head not in known_implementations


def _protocols(fs: Any) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def _is_object_store(fs: Any) -> bool:
    return bool(_protocols(fs) & _OBJECT_STORE_PROTOCOLS)


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


def is_local_fs(fs: Any) -> bool:
    """Whether an fsspec filesystem is this machine's disk."""
    return bool(_protocols(fs) & {"file", "local"})


def _write_fsync(path: str, data: bytes, durable: bool = True) -> None:
    # 0o666 less the umask, as open() gives: experiment files are for every reader (other
    # users, the JupyterLab server), not only their writer.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ``.<target name>.<12 hex digits>.tmp``: the temporary file of an atomic local write.
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{12}\.tmp$")


def _temporary_file_path(path: str) -> str:
    """Where a new version of the local file ``path`` is written before it is renamed over it:
    ``.<name>.<12 hex digits>.tmp`` next to it (see :data:`_TEMP_NAME`)."""
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}.{uuid.uuid4().hex[:12]}.tmp")


def _local_write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    parent = os.path.dirname(path) or "."
    tmp = _temporary_file_path(path)
    try:
        _write_fsync(tmp, data, durable)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(parent)


_WRITEBACK_CHUNK = 2 << 20


def _copy_file_fsync(src: str, dst: str) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        offset = 0
        # copy_file_range / sendfile move the bytes in the kernel, without a trip through Python.
        advise = getattr(os, "posix_fadvise", None)
        try:
            while offset < size:
                n = os.copy_file_range(
                    fin.fileno(), fout.fileno(), min(_WRITEBACK_CHUNK, size - offset)
                )
                if n == 0:
                    break
                if advise is not None:
                    # Start write-back of this chunk now: the disk writes while the next chunk
                    # is copied, and the fsync below waits only for the tail (bench: 0.94x ->
                    # 1.5x raw write+fsync for 100 MB checkpoints). Durability is unchanged.
                    advise(fout.fileno(), offset, n, os.POSIX_FADV_DONTNEED)
                offset += n
        except (AttributeError, OSError):
            fin.seek(offset)
            fout.seek(offset)
            shutil.copyfileobj(fin, fout, 8 << 20)
        fout.flush()
        os.fsync(fout.fileno())
    shutil.copystat(src, dst, follow_symlinks=True)


def _copy_tree_fsync(src: str, dst: str) -> None:
    os.makedirs(dst)
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        target_root = dst if rel == "." else os.path.join(dst, rel)
        for d in dirs:
            os.makedirs(os.path.join(target_root, d), exist_ok=True)
        for name in files:
            _copy_file_fsync(os.path.join(root, name), os.path.join(target_root, name))
        if target_root != dst:
            _fsync_dir(target_root)


#: The key of a ``result.json`` row that says which of its values are NaN or infinite. JSON has
#: no such numbers, so such a value is written as ``null`` (pandas reads NaN, ``jq`` null) and
#: this key records it, e.g. ``{"loss": null, "__ftnb_nonfinite__": {"loss": "NaN"}}``; nested
#: values are named by a dict of the same shape (list items by their index as a string), each
#: leaf "NaN", "Infinity" or "-Infinity". :func:`parse_json_line` restores them.
NONFINITE_KEY = "__ftnb_nonfinite__"
_NONFINITE_TOKENS = frozenset({"NaN", "Infinity", "-Infinity"})


def json_line(row: dict) -> bytes:
    """``row`` as one line of strict JSON (see :data:`NONFINITE_KEY`), newline included."""
    try:
        text = json.dumps(row, default=str, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere (the rare case: only then a copy)
        overlay: dict = {}
        clean = _null_nonfinite(row, overlay)
        clean[NONFINITE_KEY] = overlay
        text = json.dumps(clean, default=str, allow_nan=False)
    return (text + "\n").encode("utf-8")


def _null_nonfinite(value: Any, overlay: dict) -> Any:
    """A copy of ``value`` (a dict or list) with its NaN and infinities as None, each recorded in
    ``overlay`` under its key (its index, for a list)."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out: Any = {} if isinstance(value, dict) else [None] * len(value)
    for key, item in items:
        slot = key if isinstance(value, dict) else str(key)
        if isinstance(item, float) and item != item:
            overlay[slot], item = "NaN", None
        elif isinstance(item, float) and item in (math.inf, -math.inf):
            overlay[slot], item = ("Infinity" if item > 0 else "-Infinity"), None
        elif isinstance(item, (dict, list, tuple)):
            inner: dict = {}
            item = _null_nonfinite(item, inner)
            if inner:
                overlay[slot] = inner
        out[key] = item
    return out


def _restore_nonfinite(value: Any, overlay: Any) -> Any:
    if isinstance(overlay, str):
        return float(overlay) if value is None and overlay in _NONFINITE_TOKENS else value
    if isinstance(overlay, dict):
        for slot, inner in overlay.items():
            if isinstance(value, dict) and slot in value:
                value[slot] = _restore_nonfinite(value[slot], inner)
            elif isinstance(value, list) and slot.isdigit() and int(slot) < len(value):
                value[int(slot)] = _restore_nonfinite(value[int(slot)], inner)
    return value


class CorruptFileError(ValueError):
    """A file of JSON lines (``result.json``) has a bad line that is not its last one: not a
    torn write, which only ever leaves the last line incomplete, but a damaged file."""


def parse_json_line(line: bytes) -> Optional[dict]:
    """One row of ``result.json`` with its NaN and infinities back (see :data:`NONFINITE_KEY`;
    rows written with bare NaN tokens, as before, read as they are), or None for a line that is
    not a JSON object (torn by a process that died mid-write, or corrupt)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    overlay = row.pop(NONFINITE_KEY, None)
    return _restore_nonfinite(row, overlay) if overlay else row


def read_json_lines(data: bytes, source: str = RESULTS_FILE) -> list[dict]:
    """The rows of a JSON Lines file (``source``: its path, for errors).

    An unreadable *last* line is skipped: it is a line torn by a writer that died while writing
    it (the next writer repairs the file). An unreadable line anywhere else cannot come from a
    torn write: :class:`CorruptFileError` names the file and the line.
    """
    lines = data.splitlines()
    last = len(lines)
    while last and not lines[last - 1].strip():
        last -= 1
    rows = []
    for number, line in enumerate(lines[:last], start=1):
        if not line.strip():
            continue
        row = parse_json_line(line)
        if row is not None:
            rows.append(row)
        elif number < last:
            shown = line[:80].decode("utf-8", "replace")
            raise CorruptFileError(
                f"{source} is damaged: line {number} of {last} is not a JSON object "
                f"({shown!r}{'...' if len(line) > 80 else ''}), and only the last line can be "
                "torn by a writer that died. Fix: repair or delete that line (each line is one "
                "report), or restore the file from a backup; ftnb does not guess which rows "
                "it held."
            )
    return rows


@dataclass(frozen=True)
class TrialPaths:
    """Every file of one trial, by name. Nobody joins trial paths by hand elsewhere.

    ``<trial dir>/``: ``trial.json`` (:attr:`record`), ``params.json``, ``result.json``
    (:attr:`results`), ``progress.csv``, ``error.txt``, ``stdout``, ``stderr``, and
    ``checkpoint_000000/`` ... (:meth:`checkpoint`, each complete once it holds its
    :meth:`checkpoint_marker`).
    """

    storage: Storage
    dir: str

    def _file(self, name: str) -> str:
        return self.storage.join(self.dir, name)

    @property
    def uri(self) -> str:
        """The trial's folder as a path (local) or URL (elsewhere) a user can paste."""
        return self.storage.uri(self.dir)

    @property
    def params(self) -> str:
        """``params.json``: the trial's config (refs as placeholders)."""
        return self._file(PARAMS_FILE)

    @property
    def results(self) -> str:
        """``result.json``: one JSON line per acknowledged report."""
        return self._file(RESULTS_FILE)

    @property
    def progress(self) -> str:
        """``progress.csv``: the rows of ``result.json``, flattened."""
        return self._file(PROGRESS_FILE)

    @property
    def error(self) -> str:
        """``error.txt``: the trial's failures, written by the controller."""
        return self._file(ERROR_FILE)

    @property
    def record(self) -> str:
        """The controller's record of the trial (attempts, failures, status), written at every
        transition; newer than ``experiment_state.json`` when the driver died in between."""
        return self._file(TRIAL_RECORD_FILE)

    @property
    def stdout(self) -> str:
        """``stdout``: what the trial's processes printed, over all attempts."""
        return self._file(STDOUT_FILE)

    @property
    def stderr(self) -> str:
        """``stderr``: the same for the error stream."""
        return self._file(STDERR_FILE)

    def checkpoint(self, dir_name: str) -> str:
        """The checkpoint folder ``dir_name`` (see :func:`checkpoint_dir_name`)."""
        return self._file(dir_name)

    def checkpoint_marker(self, dir_name: str) -> str:
        """The file whose presence says the checkpoint folder ``dir_name`` is complete."""
        return self.storage.join(self.checkpoint(dir_name), CHECKPOINT_MARKER)

    def owner_files(self) -> frozenset[str]:
        """Names of the files that the trial's owner (its driver and its current attempt)
        replaces atomically, whose temporary files a dead owner may leave behind."""
        return frozenset((PARAMS_FILE, TRIAL_RECORD_FILE, ERROR_FILE, RESULTS_FILE,
                          PROGRESS_FILE))

    def remove_leftover_temps(self) -> list[str]:
        """See :meth:`Storage.remove_leftover_temps` (the same rules: as the owner only)."""
        return self.storage.remove_leftover_temps(self.dir, self.owner_files())

    def read_results(self) -> list[dict]:
        """The rows of ``result.json`` ([] when there is none); a torn last line is skipped,
        a damaged line elsewhere raises :class:`CorruptFileError`."""
        try:
            data = self.storage.read_bytes(self.results)
        except FileNotFoundError:
            return []
        return read_json_lines(data, source=self.storage.uri(self.results))

    def checkpoint_dirs(self) -> list[str]:
        """Names of the complete checkpoint folders (with a marker), oldest first."""
        names = [n for n in self.storage.listdir(self.dir) if checkpoint_index(n) is not None]
        return [
            n
            for n in sorted(names, key=lambda n: checkpoint_index(n) or 0)
            if self.storage.exists(self.checkpoint_marker(n))
        ]


@dataclass(frozen=True)
class ExperimentPaths:
    """Every file of one experiment, by name (the model: submitit's ``JobPaths``).

    ``<storage_path>/<name>/``: ``experiment_state.json`` (:attr:`state`) and its previous
    generation (:attr:`state_backup`), ``owner.json`` and ``.owner.lock`` (:attr:`lease`,
    :attr:`lease_lock`), ``control/`` (:attr:`control`, :meth:`control_request`),
    ``supervisor.json`` and ``supervisor.log``, and one folder per trial (:meth:`trial`).
    """

    storage: Storage
    dir: str

    @classmethod
    def of(cls, storage: Storage, name: str, folder: Optional[str] = None) -> "ExperimentPaths":
        """The experiment ``name`` in ``folder`` of ``storage`` (default: its root, the
        ``storage_path``)."""
        return cls(storage, storage.join(storage.root if folder is None else folder, name))

    @classmethod
    def at(cls, path: str, filesystem: Any = None) -> "ExperimentPaths":
        """The experiment whose folder is ``path`` (a local path or an fsspec URL)."""
        storage = Storage(path, filesystem)
        return cls(storage, storage.root)

    def _file(self, name: str) -> str:
        return self.storage.join(self.dir, name)

    @property
    def name(self) -> str:
        """The experiment's name: the last part of its folder's path."""
        return posixpath.basename(self.dir.rstrip("/").replace(os.sep, "/"))

    @property
    def uri(self) -> str:
        """The experiment's folder as a path (local) or URL (elsewhere) a user can paste."""
        return self.storage.uri(self.dir)

    @property
    def parent_uri(self) -> str:
        """The storage path this experiment's folder is in (its ``RunConfig.storage_path``)."""
        return self.storage.uri(self.storage.parent(self.dir))

    @property
    def state(self) -> str:
        """``experiment_state.json``: the versioned state, written by the driver."""
        return self._file(STATE_FILE)

    @property
    def state_backup(self) -> str:
        """``experiment_state.prev.json``: the previous generation of :attr:`state`."""
        return self._file(STATE_BACKUP_FILE)

    def has_state(self) -> bool:
        """Whether the folder holds an experiment (its state, or the previous generation)."""
        return self.storage.exists(self.state) or self.storage.exists(self.state_backup)

    def trial(self, dir_name: str) -> TrialPaths:
        """The files of the trial whose folder is named ``dir_name``."""
        return TrialPaths(self.storage, self._file(dir_name))

    @property
    def lease(self) -> str:
        """``owner.json``: the owner lease (token, epoch, host, pid, heartbeat)."""
        return self._file(LEASE_FILE)

    @property
    def lease_lock(self) -> str:
        """``.owner.lock``: serializes acquisitions of the lease on a local disk."""
        return self._file(LEASE_LOCK_FILE)

    @property
    def control(self) -> str:
        """Folder of control requests (stop a trial, stop the experiment) to its driver."""
        return self._file(CONTROL_DIR)

    def control_request(self, request_id: str) -> str:
        """The file of the control request ``request_id``."""
        return self.storage.join(self.control, request_id + CONTROL_REQUEST_SUFFIX)

    def control_request_ids(self) -> list[str]:
        """The ids of the requests in :attr:`control`, oldest first (ids sort by time)."""
        return [name[: -len(CONTROL_REQUEST_SUFFIX)]
                for name in self.storage.listdir(self.control)
                if name.endswith(CONTROL_REQUEST_SUFFIX)]

    @property
    def supervisor(self) -> str:
        """``supervisor.json``: the detached process hosting the controller, and its log."""
        return self._file(SUPERVISOR_FILE)

    @property
    def supervisor_log(self) -> str:
        """``supervisor.log``: the detached supervisor's output."""
        return self._file(SUPERVISOR_LOG)

    def owner_files(self) -> frozenset[str]:
        """Names of the files of the experiment's folder that its owner (the driver) replaces
        atomically, whose temporary files a dead owner may leave behind. Not ``owner.json``
        (a would-be owner writes it before it owns) nor ``control/`` (its senders')."""
        return frozenset((STATE_FILE, STATE_BACKUP_FILE, SUPERVISOR_FILE))

    def remove_leftover_temps(self) -> list[str]:
        """See :meth:`Storage.remove_leftover_temps` (the same rules: as the owner only)."""
        return self.storage.remove_leftover_temps(self.dir, self.owner_files())


# =================================================================================================
# Reads that poll (issue 13, item 5: the read model's readers, ftnb.ui.monitor and `ftnb logs`)
# -------------------------------------------------------------------------------------------------
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
