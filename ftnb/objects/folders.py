"""Where ``ftnb.put`` object files live, how they are named after the process that owns them,
and the sweep that removes the files of owners that died without cleaning up.

An object file is ``{pid scope tag}-{owner pid}-{owner start time}-{object id}.obj`` in a
per-user folder (:func:`choose_store_dir`); it is written as ``.{name}.tmp`` first. The name
alone says whether its owner still runs, so a sweep needs to open no file.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from typing import Optional

from ..system.processes import pid_scope_tag

__all__ = [
    "OBJECT_STORE_ENV",
    "choose_store_dir",
    "ensure_store_dir",
    "object_file_path",
    "pid_scope_tag",
    "process_is_alive",
    "remove_if_present",
    "sweep_orphans",
    "temporary_path",
    "this_process_identity",
]

#: Environment variable naming the folder for object files (default: /dev/shm, else the tempdir).
OBJECT_STORE_ENV = "FTNB_OBJECT_STORE"

_SUFFIX = ".obj"
# {pid scope tag}-{owner pid}-{owner start time}-{object id}.obj, temporary files with a "." prefix
# and a ".tmp" suffix.
_FILE_NAME = re.compile(r"^\.?([0-9a-f]{8})-(\d+)-(\d+)-([0-9a-f]+)\.obj(?:\.tmp)?$")

# /dev/shm is RAM and also carries PyTorch DataLoader and NCCL traffic: only use it when the
# object leaves max(256 MiB, 20% of it) free.
_SHM_ROOT = "/dev/shm"
_SHM_RESERVE_MIN = 256 << 20
_SHM_RESERVE_FRACTION = 0.2


# --------------------------------------------------------------------------- processes


def _start_time(pid: int) -> Optional[int]:
    """The start time of ``pid`` in clock ticks since boot; None when the process does not
    exist, is a zombie, or /proc cannot be read."""
    from ..system.processes import pid_start_time

    start = pid_start_time(pid)
    return None if start is None or start < 0 else start


def _has_proc() -> bool:
    return os.path.isdir("/proc/self")


def process_is_alive(pid: int, start: int) -> bool:
    """Whether the process that wrote an object file (``pid`` started at ``start``) still runs.

    ``start`` 0 means unknown (no /proc when it was written): the pid alone decides.
    """
    if _has_proc():
        actual = _start_time(pid)
        return actual is not None and (start == 0 or actual == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


_identity_lock = threading.Lock()
_identity: tuple[int, int] = (0, 0)


def this_process_identity() -> tuple[int, int]:
    """``(pid, start time)`` of this process; recomputed after a fork."""
    global _identity
    pid = os.getpid()
    with _identity_lock:
        if _identity[0] != pid:
            _identity = (pid, _start_time(pid) or 0)
        return _identity


# --------------------------------------------------------------------------- where files live


def _user_folder_name() -> str:
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return f"ftnb-objects-{getuid()}"
    import getpass  # only off POSIX

    return f"ftnb-objects-{getpass.getuser()}"


def _fs_space(path: str) -> tuple[int, int]:
    """``(free, total)`` bytes of the filesystem holding ``path`` for an unprivileged user."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def choose_store_dir(
    nbytes: int,
    *,
    shm_root: str = _SHM_ROOT,
    shm_free: Optional[int] = None,
    shm_total: Optional[int] = None,
) -> str:
    """The folder for an object file of ``nbytes`` bytes (not created here).

    ``$FTNB_OBJECT_STORE`` when set; else a per-user folder in ``shm_root`` (``/dev/shm``) when
    it exists and keeps ``max(256 MiB, 20%)`` free after the object; else a per-user folder
    under ``tempfile.gettempdir()``. ``shm_free`` and ``shm_total`` override the measured
    space of ``shm_root`` (for tests). For example, without ``$FTNB_OBJECT_STORE``, a 10 GB
    object goes to /dev/shm when 20 GB of a 24 GB /dev/shm are free, to the tempdir when 12 GB
    are (2 GB would be left, less than the 20% reserve).
    """
    configured = os.environ.get(OBJECT_STORE_ENV)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    if os.path.isdir(shm_root):
        if shm_free is None or shm_total is None:
            try:
                measured_free, measured_total = _fs_space(shm_root)
            except OSError:
                measured_free, measured_total = 0, 0
            shm_free = measured_free if shm_free is None else shm_free
            shm_total = measured_total if shm_total is None else shm_total
        reserve = max(_SHM_RESERVE_MIN, int(shm_total * _SHM_RESERVE_FRACTION))
        if shm_free - nbytes >= reserve:
            return os.path.join(shm_root, _user_folder_name())
    return os.path.join(tempfile.gettempdir(), _user_folder_name())


def _candidate_dirs() -> list[str]:
    """Every folder where this user's object files may be, for sweeps."""
    dirs = [os.path.join(root, _user_folder_name()) for root in (_SHM_ROOT, tempfile.gettempdir())]
    configured = os.environ.get(OBJECT_STORE_ENV)
    if configured:
        dirs.insert(0, os.path.abspath(os.path.expanduser(configured)))
    return [d for d in dirs if os.path.isdir(d)]


def ensure_store_dir(path: str) -> None:
    """Create ``path``; a default (shared-root) folder must be a real folder owned by us."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.environ.get(OBJECT_STORE_ENV) or not hasattr(os, "getuid"):
        return  # the user chose this folder
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
        raise PermissionError(
            f"ftnb.put(): the object folder {path!r} is not a folder owned by this user "
            f"(uid {os.getuid()}), so objects written there could be read or replaced by "
            f"others. Fix: remove it, or set {OBJECT_STORE_ENV} to a private folder."
        )


def sweep_orphans() -> None:
    """Remove object files whose owner died without cleaning up (SIGKILL, os._exit). Every
    :func:`ftnb.put` does it, and so does the local executor when a trial process was killed.

    An owner is dead when its pid is gone or now belongs to a process with another start
    time. Races with other sweepers are harmless: a file already removed is skipped.
    """
    me = this_process_identity()
    tag = pid_scope_tag()
    verdicts: dict[tuple[int, int], bool] = {}
    for folder in _candidate_dirs():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            match = _FILE_NAME.match(name)
            if match is None or match.group(1) != tag:
                continue
            owner = (int(match.group(2)), int(match.group(3)))
            if owner == me:
                continue
            if owner not in verdicts:
                verdicts[owner] = process_is_alive(*owner)
            if not verdicts[owner]:
                remove_if_present(os.path.join(folder, name))


def remove_if_present(path: str) -> None:
    """Remove the file ``path``; one already removed (by another sweeper) is no error."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- file names


def object_file_path(folder: str, pid: int, start: int, ref_id: str) -> str:
    """The file of the object ``ref_id`` owned by the process ``pid`` (started at ``start``) in
    ``folder``: ``{pid scope tag}-{pid}-{start}-{ref_id}.obj`` (parsed by :data:`_FILE_NAME`)."""
    return os.path.join(folder, f"{pid_scope_tag()}-{pid}-{start}-{ref_id}{_SUFFIX}")


def temporary_path(path: str) -> str:
    """Where the object file ``path`` is written before it is renamed into place."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.tmp")
