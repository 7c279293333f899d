"""Files that grow while a process runs: a file written through the OS and published to storage
(:class:`StagedFile`: a log, a trial's stdout), and a file that grows by whole lines
(:class:`LineLog`: ``result.json``, ``progress.csv``). Both are made by
:class:`~ftnb.storage.backend.Storage` (``staged_file``, ``line_log``), which they write through.
:class:`PeriodicPublisher` publishes staged files while they grow, so that what a process wrote
survives its death where nothing publishes for it afterwards.

Object stores cannot append: publishing a staged file replaces the stored copy. While the file
is written, a copy longer than :data:`RUNNING_TAIL_BYTES` is published as its last
:data:`RUNNING_TAIL_BYTES` (from a line's start, after a line saying how much is left out),
which bounds each upload; the whole file is published at the end. A file continued by a later
process elsewhere (:meth:`StagedFile.resume`) starts from at most that many bytes of the stored
copy too.

The local copy of a staged file lives in a folder of its own under the temporary folder unless
the caller names one: ``ftnb-staged-<machine>-<pid>-<start>-<random>``, named after the process
that made it (:func:`staging_folder`). Once a file is published whole and no longer written,
:meth:`StagedFile.discard` removes the copy (and the folder it made); a copy with changes not
yet published is kept. A process that died first (SIGKILL, a lost Ray actor, a crashed driver)
leaves its folder behind: the next process of this user on the machine that makes a staging
folder removes it (:func:`sweep_staging_folders`), as nothing would ever publish it: a later
writer starts from the stored copy (:meth:`StagedFile.resume`).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Optional

from .faults import faults_named, storage_fault
from .local_disk import _write_all

if TYPE_CHECKING:
    from .backend import Storage

#: How often :class:`PeriodicPublisher` publishes the staged files that grew, in seconds
#: (``$FTNB_OUTPUT_PUBLISH_S`` sets another).
PUBLISH_INTERVAL_S = 5.0
PUBLISH_INTERVAL_ENV = "FTNB_OUTPUT_PUBLISH_S"
#: The most of a staged file uploaded by a publish while it is written, and kept from the stored
#: copy by :meth:`StagedFile.resume`: 8 MiB (a publish every 5 s uploads 1.6 MB/s at most).
RUNNING_TAIL_BYTES = 8 << 20


#: The start of the name of a staging folder (see the module docstring).
STAGING_PREFIX = "ftnb-staged-"
# ftnb-staged-{machine tag}-{pid}-{start time, 0: unknown}-{mkdtemp's random part}
_STAGING_FOLDER = re.compile(r"^ftnb-staged-([0-9a-f]{8})-(\d+)-(\d+)-[^-]+$")
_swept_by: Optional[int] = None  # the pid of the process that swept already (a fork sweeps again)


def staging_folder() -> str:
    """A new folder under the temporary folder for staged files' local copies, named after this
    process, after removing those of this user's processes that are gone (once per process:
    :func:`sweep_staging_folders`)."""
    from ..system.processes import pid_scope_tag, pid_start_time

    global _swept_by
    pid = os.getpid()
    if _swept_by != pid:
        _swept_by = pid
        sweep_staging_folders()
    start = pid_start_time(pid)
    prefix = f"{STAGING_PREFIX}{pid_scope_tag()}-{pid}-{max(start or 0, 0)}-"
    return tempfile.mkdtemp(prefix=prefix)


def sweep_staging_folders(root: Optional[str] = None) -> list[str]:
    """Remove the staging folders in ``root`` (default: the temporary folder) of this user's
    processes on this machine that are gone: what they held was never to be published (their
    files' later writers start from the stored copies). Returns the folders removed."""
    from ..system.processes import pid_scope_tag, process_state

    root = root or tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(STAGING_PREFIX)]
    except OSError:
        return []
    tag = pid_scope_tag()
    removed = []
    for name in names:
        found = _STAGING_FOLDER.match(name)
        if found is None or found.group(1) != tag:
            continue  # another machine's or pid namespace's: its pids mean nothing here
        folder = os.path.join(root, name)
        try:
            if os.lstat(folder).st_uid != os.getuid():
                continue
        except OSError:
            continue
        pid, start = int(found.group(2)), int(found.group(3))
        if process_state(pid, start or None) != "running":
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def publish_interval_s() -> float:
    """``$FTNB_OUTPUT_PUBLISH_S`` (seconds, at least 0.1), else :data:`PUBLISH_INTERVAL_S`;
    ValueError naming the variable when it is not such a number."""
    from .outage import _seconds_from_env

    return _seconds_from_env(PUBLISH_INTERVAL_ENV, PUBLISH_INTERVAL_S,
                             "how often a running trial's output is uploaded", minimum=0.1)


def _tail_after_cut(data: bytes, left_out: int) -> bytes:
    """``data``, the end of a file whose first ``left_out`` bytes are not in it, from its first
    whole line, after a line that says how much is left out."""
    newline = data.find(b"\n")
    if 0 <= newline < len(data) - 1:
        left_out += newline + 1
        data = data[newline + 1:]
    return f"[ftnb: the first {left_out} bytes of this output are left out]\n".encode() + data


class StagedFile:
    """See :meth:`Storage.staged_file`. ``local_path`` is where to write; ``publish()`` puts
    what was written at the storage path (nothing to do on a local disk); ``staged`` says
    whether there is a copy to publish; ``owns_folder`` whether this object made the folder
    of ``local_path`` (:func:`staging_folder`), which :meth:`discard` then removes."""

    def __init__(self, storage: Storage, path: str, staging_dir: Optional[str] = None,
                 local_path: Optional[str] = None) -> None:
        self.storage = storage
        self.path = path
        self.staged = not storage.is_local
        self.owns_folder = False
        if not self.staged:
            self.local_path = path
        elif local_path is not None:
            self.local_path = local_path
        else:
            if staging_dir is None:
                staging_dir = staging_folder()
                self.owns_folder = True
            os.makedirs(staging_dir, exist_ok=True)
            self.local_path = os.path.join(staging_dir, posixpath.basename(path.rstrip("/")))
        # What was published last: the local file's (size, mtime_ns) then, and whether whole.
        self._published: Optional[tuple[tuple[int, int], bool]] = None

    def publish(self, tail_bytes: Optional[int] = None) -> None:
        """Copy the local file to the storage path (when staged and written to); with
        ``tail_bytes``, a file longer than that as its last ``tail_bytes`` (see the module's
        docstring)."""
        seen = self._seen()
        if seen is None:
            return
        size = seen[0]
        if tail_bytes is None or size <= tail_bytes:
            self.storage.upload_file(self.local_path, self.path)
        else:
            with open(self.local_path, "rb") as f:
                f.seek(size - tail_bytes)
                data = f.read(tail_bytes)
            self.storage.write_atomic(self.path, _tail_after_cut(data, size - tail_bytes))
        self._published = (seen, tail_bytes is None or size <= tail_bytes)

    def pending(self, whole: bool = False) -> bool:
        """Whether the local file changed since it was last published (``whole``: or was then
        published only in part)."""
        seen = self._seen()
        return seen is not None and (self._published is None or self._published[0] != seen
                                     or (whole and not self._published[1]))

    def discard(self) -> bool:
        """Remove the local copy once it is published whole and nothing writes it any more
        (its writer ended): the file, then the folder when this object made it and it is
        empty (a folder shared by several files goes with its last). Whether the copy is gone
        (True where nothing is staged); a copy with changes not published whole is kept, so
        output is never lost to a clean-up."""
        if not self.staged:
            return True
        if self.pending(whole=True):
            return False
        try:
            os.unlink(self.local_path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        if self.owns_folder:
            try:
                os.rmdir(os.path.dirname(self.local_path))
            except OSError:
                pass  # (another file is still staged there, or it is gone already)
        return True

    def resume(self, keep_bytes: int = RUNNING_TAIL_BYTES) -> None:
        """Start the local file from the stored copy, at most its last ``keep_bytes``, when the
        local file is not there yet: a process on another machine (a retried attempt on another
        node) then adds to what earlier ones published, where publishing would replace it."""
        if not self.staged or os.path.exists(self.local_path):
            return
        try:
            size = self.storage.fs.info(self.path)["size"]
            start, data = self.storage.read_from(self.path, max(0, size - keep_bytes), size)
        except FileNotFoundError:
            return
        with open(self.local_path, "wb") as f:
            f.write(_tail_after_cut(data, start) if start else data)
        self._published = (self._seen(), True)  # what storage holds (its cut aside)

    def _seen(self) -> Optional[tuple[int, int]]:
        if not self.staged:
            return None
        try:
            stat = os.stat(self.local_path)
        except FileNotFoundError:
            return None
        return stat.st_size, stat.st_mtime_ns

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
        self._size = 0  # on a local disk: the file's length, every line in it whole
        self._whole: Optional[bytearray] = None  # where appends are replacements: the bytes

    def append(self, line: bytes) -> None:
        """Add ``line`` (newline included) at the end of the file, whole, or raise (a
        :class:`~ftnb.storage.faults.StorageFault` when the storage refused it) leaving the file
        as it was: a short write is continued, and a line cut off by a full disk is taken back,
        so nothing half-written is ever read as a line."""
        if not self.storage.is_local:
            if self._whole is None:
                self._whole = bytearray(self._contents())
            self.storage.write_atomic(self.path, bytes(self._whole) + line)
            self._whole += line
            return
        if self._fd is None:
            with faults_named(self.path):
                self._fd = self._open_local()
        try:
            written = os.write(self._fd, line)
            if written != len(line):  # a short write: the rest, or the error that stopped it
                _write_all(self._fd, memoryview(line)[written:])
        except OSError as exc:
            self._cut_back()
            fault = storage_fault(exc, self.path)
            if fault is exc:
                raise
            raise fault from exc
        self._size += len(line)

    def undo(self, line: bytes) -> None:
        """Take back ``line``, the last one appended (a write that had to go with it failed)."""
        if not self.storage.is_local:
            if self._whole is not None and self._whole.endswith(line):
                del self._whole[len(self._whole) - len(line):]
                self.storage.write_atomic(self.path, bytes(self._whole))
            return
        if self._fd is not None:
            self._size -= len(line)
            with faults_named(self.path):
                self._cut_back()

    def _cut_back(self) -> None:
        # Back to the last whole line. Should even this fail (a filesystem turned read-only),
        # the file ends in a fragment without its newline, which readers skip and the next
        # writer repairs (a line is never whole until its newline is written, which comes last).
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            os.close(self._fd)
            self._fd = None  # the next append reopens it, repairing a torn end

    def _open_local(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        except BaseException:
            os.close(fd)
            raise
        if not torn:
            self._size = size
            return fd
        os.close(fd)
        self.storage.write_atomic(self.path, self._contents())
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND, 0o644)
        self._size = os.fstat(fd).st_size
        return fd

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
            with faults_named(self.path):
                os.fsync(self._fd)

    def close(self) -> None:
        """Release the file (a later append opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PeriodicPublisher:
    """Publishes staged files while a process writes them, so that what it wrote survives its
    death (SIGKILL, its machine lost) where nothing publishes for it afterwards: a daemon thread
    publishes those that changed every ``interval`` seconds (default
    :func:`publish_interval_s`), each as at most its last :data:`RUNNING_TAIL_BYTES`;
    :meth:`close` stops it and publishes each whole, if it changed since.

    ``check`` is called before each round that has something to publish; when it raises
    :class:`~ftnb.storage.lease.FencedError` (a later attempt replaced this one, which must not
    overwrite its output) nothing more is published. Files that are not staged are left out.

    >>> publisher = PeriodicPublisher([stdout, stderr])
    >>> ...  # the process runs
    >>> publisher.close()
    >>> publisher.discard()  # once nothing reads the local copies any more
    """

    def __init__(self, files: Iterable[StagedFile], interval: Optional[float] = None,
                 check: Optional[Callable[[], None]] = None) -> None:
        self.files = [output for output in files if output.staged]
        self.interval = publish_interval_s() if interval is None else interval
        self._check = check
        self._lock = threading.Lock()  # one round at a time: a late one must not undo the last
        self._closed = threading.Event()
        self._fenced = False
        if self.files:
            threading.Thread(target=self._run, name="ftnb-publish-output", daemon=True).start()

    def _run(self) -> None:
        while not self._closed.wait(self.interval):
            self._publish(final=False)

    def close(self) -> None:
        """Stop publishing periodically and publish each file whole (if it changed)."""
        self._closed.set()
        self._publish(final=True)

    def discard(self) -> bool:
        """After :meth:`close`: remove the local copies published whole
        (:meth:`StagedFile.discard`), the folders' owners last. Whether all are gone."""
        ordered = sorted(self.files, key=lambda output: output.owns_folder)
        return all([output.discard() for output in ordered])

    def _publish(self, final: bool) -> None:
        from .lease import FencedError

        with self._lock:
            if self._fenced or (self._closed.is_set() and not final):
                return
            due = [output for output in self.files if output.pending(whole=final)]
            if not due:
                return
            try:
                if self._check is not None:
                    self._check()
            except FencedError:
                self._fenced = True
                return
            except Exception:  # storage did not answer: the next round tries again
                return
            for output in due:
                try:
                    output.publish(None if final else RUNNING_TAIL_BYTES)
                except Exception:  # output is a convenience; never fail a trial for it
                    pass
