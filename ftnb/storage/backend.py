"""The storage backend: :class:`Storage`, an fsspec filesystem and a root folder on it, with the
atomic operations ftnb needs (the contract is in :mod:`ftnb.storage`).

Every operation that differs between this machine's disk and remote storage branches here, and
nowhere else: local writes go through :mod:`~ftnb.storage.local_disk`, remote writes are one PUT
each, retried through an outage (:mod:`~ftnb.storage.outage`).

Compare-and-swap (:meth:`Storage.read_versioned`, :meth:`Storage.write_if`) is what an object
store offers in place of a lock: S3 (s3fs) replaces an object only if it is unchanged
(``If-Match`` with its ETag) or absent (``If-None-Match: *``). Other storage has none (a local
or NFS disk serializes with :meth:`Storage.exclusive_lock` instead; gcsfs exposes no
preconditions on its writes): there :meth:`~Storage.write_if` writes unconditionally and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator, Optional, Sequence

from .checkpoint_files import FolderDigest
from .faults import faults_named
from .file_names import CHECKPOINT_MARKER, TEMPORARY_FILE_NAME
from .file_versions import FileVersions
from .filesystem_kinds import is_local_fs, is_local_path_with_colons, is_object_store
from .growing_files import LineLog, StagedFile
from .local_disk import (
    append_file_durably,
    copy_file_atomically,
    persist_folder,
    write_file_atomically,
)
from .object_store_conditions import is_s3, s3_get_with_etag, s3_put_if, s3_status
from .outage import (
    OUTAGE_ENV,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    StorageUnavailableError,
    call_deadline,
    is_transient,
    outage_limit_s,
)

#: How often readers poll a local disk and an object store (see Storage.poll_interval_s).
LOCAL_POLL_S = 0.2
REMOTE_POLL_S = 2.0


class Storage:
    """An fsspec filesystem and a root folder on it, with the atomic operations ftnb needs.

    ``Storage`` is picklable: trial processes receive the controller's instance and write through
    the same filesystem (same credentials, same endpoint).
    """

    def __init__(self, url: str, filesystem: Any = None) -> None:
        import fsspec.core

        url = os.fspath(url)
        if filesystem is None and is_local_path_with_colons(url):
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
        # Whether write_if is a compare-and-swap here: None until an S3 server was probed.
        self._conditional_writes: Optional[bool] = None if is_s3(fs) else False

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
        temporary folder named after this process) copied to ``path`` by
        :meth:`StagedFile.publish`, and removed by :meth:`StagedFile.discard` once published
        for the last time."""
        return StagedFile(self, path, staging_dir, local_path)

    @contextlib.contextmanager
    def exclusive_lock(self, path: str) -> Iterator[bool]:
        """Hold an exclusive lock on the file ``path`` (created if missing) for a ``with``
        block. Yields True where the lock excludes every other process (a local or NFS disk:
        ``flock``), False where the storage has no such lock (object stores and other remote
        filesystems): the block then runs unserialized and the caller settles races another
        way (a compare-and-swap, :meth:`write_if`, where there is one; else write, wait, read
        back)."""
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

    def move_checkpoint(self, source: str, dest: str) -> None:
        """Put the whole checkpoint folder ``source`` (its marker written) at ``dest``, which
        must not exist: on a local disk a rename (atomic); elsewhere a copy through this
        machine, marker last, so ``dest`` counts only once whole (``source`` stays: its owner
        removes it)."""
        if self.is_local:
            with faults_named(dest):
                os.rename(source, dest)
            return
        marker = json.loads(self.read_bytes(self.join(source, CHECKPOINT_MARKER)))
        with tempfile.TemporaryDirectory(prefix="ftnb-checkpoint-") as local:
            self._download_folder(source, local)
            # The marker is written last, describing the files; it is not one of them.
            os.remove(os.path.join(local, CHECKPOINT_MARKER))
            self.persist_directory(local, dest, marker)

    def _download_folder(self, path: str, target: str) -> None:
        # File by file: a folder copy's meaning hangs on trailing slashes, which a wrapper such
        # as DirFileSystem drops (it would put the folder itself inside target), and a
        # filesystem without auto_mkdir does not create the local subfolders.
        base = self.fs._strip_protocol(path).rstrip("/")
        sources = self.fs.find(base, **self._deadline())
        targets = [os.path.join(target, *posixpath.relpath(source, base).split("/"))
                   for source in sources]
        for local in targets:
            os.makedirs(os.path.dirname(local), exist_ok=True)
        if sources:
            self.fs.get(sources, targets)

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
    # Added for issue 13, item 5 (one read model); see ftnb.storage.file_versions.
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
            with faults_named(path):
                os.makedirs(path, exist_ok=True)
        elif is_object_store(self.fs):
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
            with faults_named(path):
                write_file_atomically(path, data, durable)
        else:
            # One PUT of the complete object: object stores never expose a partial object.
            self._retrying(f"writing {self.uri(path)}", self.fs.pipe_file, path, data,
                           **self._deadline(len(data)))

    def sync(self) -> None:
        """Make every write made so far with ``durable=False`` survive a machine crash: one
        flush of the disk's caches (``sync``) instead of two fsyncs per file, for a writer of
        thousands of files. Nothing to do on object stores, where every write is durable."""
        if self.is_local:
            os.sync()

    def append_durably(self, path: str, data: bytes) -> None:
        """Add ``data`` at the end of the file ``path`` on this machine's disk, durably (see
        :func:`~ftnb.storage.local_disk.append_file_durably`). Object stores cannot append:
        ValueError there (write a new object instead)."""
        if not self.is_local:
            raise ValueError(f"{self.uri(path)}: object stores cannot append to a file")
        with faults_named(path):
            append_file_durably(path, data)

    def _retrying(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, retried through an outage of remote storage (see
        :mod:`ftnb.storage.outage`). One outage shares one deadline across all the writes that
        meet it."""
        delay = RETRY_FIRST_S
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
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if self._down_since is not None:
                print(f"ftnb: storage {self.uri(self.root)} is answering again after "
                      f"{time.monotonic() - self._down_since:.0f} s.", file=sys.stderr, flush=True)
                self._down_since = None
            return result

    # -- compare-and-swap ----------------------------------------------------------------------
    def read_versioned(self, path: str) -> tuple[Optional[bytes], Optional[str]]:
        """``(contents, version)`` of the file ``path``, read in one request, for
        :meth:`write_if`; ``(None, None)`` when it is missing. The version is the object's ETag
        on storage with conditional writes, None elsewhere (where :meth:`write_if` ignores it).
        Not retried, as other reads."""
        if not self._has_conditional_writes():
            try:
                return self.read_bytes(path), None
            except FileNotFoundError:
                return None, None
        from fsspec.asyn import sync

        try:
            return sync(self.fs.loop, s3_get_with_etag, self.fs, path, **self._deadline())
        except FileNotFoundError:
            return None, None

    def write_if(self, path: str, data: bytes | str, version: Optional[str]) -> Optional[bool]:
        """Replace the file ``path`` with ``data`` only if it is still at ``version`` (from
        :meth:`read_versioned`; None: only if it does not exist), atomically with the check.

        True: written. False: not written, the file changed (or appeared, or vanished) since
        that read. None: this storage has no conditional writes, and ``data`` was written
        unconditionally (:meth:`write_atomic`); the caller serializes its writers another way
        (:meth:`exclusive_lock` on a disk; write, wait, read back elsewhere).

        Retried through an outage like every write: a retry that finds the file changed and
        holding exactly ``data`` was preceded by a try that landed (its answer was lost), and
        counts as written."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not self._has_conditional_writes():
            self.write_atomic(path, data)
            return None
        tries = 0

        def put() -> bool:
            nonlocal tries
            tries += 1
            return s3_put_if(self.fs, path, data, version, self._deadline(len(data)))

        if self._retrying(f"writing {self.uri(path)}", put):
            return True
        return tries > 1 and self.read_versioned(path)[0] == data

    def _has_conditional_writes(self) -> bool:
        """Whether :meth:`write_if` is a compare-and-swap here; an S3 server is probed once,
        the first time it is asked (see :meth:`_probe_conditional_writes`), at the storage's
        root, where :meth:`check_writable` probes too: not in the experiment's folder, which
        others may be listing (unless the root is that folder)."""
        if self._conditional_writes is None:
            self._conditional_writes = self._probe_conditional_writes(self.root)
        return self._conditional_writes

    def _probe_conditional_writes(self, folder: str) -> bool:
        """Whether the S3 server honours ``If-None-Match`` and ``If-Match`` on a PUT: a probe
        object is written, then written again with each condition false; both must be refused
        (412). A server that answers with another client error (400, 501, ...) does not
        support them, and one that takes the writes ignores the headers: either way there is
        no compare-and-swap (a server that ignored them silently would let two drivers both
        win the lease)."""
        probe = self.join(folder, f".ftnb-cas-probe-{uuid.uuid4().hex[:8]}")
        deadline = self._deadline()

        def put_refused(version: Optional[str]) -> bool:
            try:
                return not s3_put_if(self.fs, probe, b"", version, deadline)
            except Exception as exc:
                status = s3_status(exc)
                if status == 501 or (status is not None and 400 <= status < 500
                                     and status not in (408, 409, 429)):
                    return False  # an answer, not an outage: the condition is not supported
                raise

        self._retrying(f"writing {self.uri(probe)}", self.fs.pipe_file, probe, b"", **deadline)
        try:
            for version in (None, '"ftnb-no-such-etag"'):
                if not self._retrying(f"writing {self.uri(probe)}", put_refused, version):
                    print(f"ftnb: storage {self.uri(self.root)} does not honour conditional "
                          "writes (If-Match, If-None-Match): the owner lease settles races "
                          "by reading its writes back after a delay.", file=sys.stderr, flush=True)
                    return False
            return True
        finally:
            self.remove(probe)

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
            match = TEMPORARY_FILE_NAME.match(name)
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
            with faults_named(path):
                copy_file_atomically(local_path, path)
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

    def reserve_space(self, paths: Sequence[str], nbytes: int = 1 << 20) -> bool:
        """Hold ``nbytes`` of disk space (allocated, not merely sized) and an inode per file in
        the files ``paths`` on a local disk, so that :meth:`release_space` can give them back
        when the disk fills: whoever held them can then still write what it must (a driver: why
        it stopped). False, holding nothing, where it cannot (remote storage, a filesystem
        without fallocate, too little space)."""
        if not self.is_local:
            return False
        try:
            for path in paths:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.posix_fallocate(fd, 0, max(1, nbytes // len(paths)))
                finally:
                    os.close(fd)
            return True
        except OSError:
            self.release_space(paths)
            return False

    def release_space(self, paths: Sequence[str]) -> None:
        """Give back what :meth:`reserve_space` held in ``paths``."""
        if self.is_local:
            for path in paths:
                with contextlib.suppress(OSError):
                    os.remove(path)

    # -- checkpoints ---------------------------------------------------------------------------
    def persist_directory(self, source: str, dest: str, marker: dict) -> None:
        """Copy the local folder ``source`` to ``dest`` durably, then write the marker.

        Locally the copy goes to a hidden temporary folder that is fsynced and renamed into place,
        so ``dest`` either does not exist or is complete. On object stores the files are uploaded
        and the marker goes last: a folder without a marker is incomplete.
        """
        # Its files' sizes and CRC-32s, so a restore can tell it is intact: big files are
        # summed while they are copied (FolderDigest), and the marker waits for them.
        digest = FolderDigest(source)

        def marker_bytes() -> bytes:
            return json.dumps({**marker, **digest.result()}).encode("utf-8")

        if self.is_local:
            with faults_named(dest):
                persist_folder(source, dest, marker_bytes)
        else:
            # Both steps are idempotent: a retry after an outage uploads the folder again.
            size = sum(os.path.getsize(os.path.join(root, name))
                       for root, _, names in os.walk(source) for name in names)
            self._retrying(f"uploading {self.uri(dest)}", self.fs.put,
                           source.rstrip("/") + "/", dest.rstrip("/") + "/", recursive=True,
                           **self._deadline(size))
            self._retrying(f"writing {self.uri(dest)}", self.fs.pipe_file,
                           self.join(dest, CHECKPOINT_MARKER), marker_bytes(),
                           **self._deadline())
