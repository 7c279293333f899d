"""Temporary folders of detached supervisors: each keeps multiprocessing's temporary folder
(``pymp-*``, the fork server's socket) in a folder named after itself
(:func:`private_temp_folder`), which the next launch on this machine removes if a SIGKILL left it
behind (:func:`sweep_temp_folders`)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

__all__ = ["private_temp_folder", "sweep_temp_folders", "temp_folders_root"]

# The longest temporary folder under which the fork server's socket
# (<root>/ftnb-supervisors-UID/<tag>-<pid>-<start>/pymp-XXXXXXXX/listener-XXXXXXXX, about 85
# characters below it) still fits in an AF_UNIX address (107 bytes on Linux, 103 on macOS).
_MAX_TEMP_BASE = 18


def temp_folders_root() -> str:
    """The folder of this user's supervisors' temporary folders (:func:`private_temp_folder`):
    under the temporary folder, or under ``/tmp`` where that is too long a path for the fork
    server's socket (a long ``$TMPDIR``: "AF_UNIX path too long"), as Python 3.13's
    multiprocessing does for its own folder."""
    base = tempfile.gettempdir()
    if len(base) > _MAX_TEMP_BASE and os.path.isdir("/tmp") and os.access("/tmp", os.W_OK):
        base = "/tmp"
    return os.path.join(base, f"ftnb-supervisors-{os.getuid()}")


# {pid scope tag}-{pid}-{start time}: its owner, as ftnb.put's object files name theirs.
_TEMP_FOLDER = re.compile(r"^([0-9a-f]{8})-(\d+)-(\d+)$")


def private_temp_folder() -> str:
    """A temporary folder of this process's own, named after it (as ``ftnb.put``'s object files
    are: ``{pid scope tag}-{pid}-{start time}``), made multiprocessing's temporary folder (its
    ``pymp-*`` folder, the fork server's socket, goes there) and removed when the process ends
    normally. A process killed by SIGKILL leaves it: :func:`sweep_temp_folders` removes it."""
    import multiprocessing.util

    from ..objects.folders import pid_scope_tag, this_process_identity

    pid, started = this_process_identity()
    root = temp_folders_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    folder = os.path.join(root, f"{pid_scope_tag()}-{pid}-{started}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    previous = tempfile.tempdir
    tempfile.tempdir = folder  # (for the next line only: it reads it once and keeps it)
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = previous
    # After multiprocessing's own clean-up of its folder (exit priority -100, run first).
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-101)
    return folder


def sweep_temp_folders() -> list[str]:
    """Remove the temporary folders (:func:`private_temp_folder`) of this user's supervisors
    that died without removing them (SIGKILL), as ``ftnb.put`` sweeps dead owners' object
    files. Every launch and every supervisor does it. Returns the folders removed."""
    from ..objects.folders import pid_scope_tag, process_is_alive

    root = temp_folders_root()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    tag = pid_scope_tag()
    removed = []
    for name in names:
        match = _TEMP_FOLDER.match(name)
        if match is None or match.group(1) != tag:
            continue  # another machine's or PID namespace's (a shared /tmp): not ours to judge
        if not process_is_alive(int(match.group(2)), int(match.group(3))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(os.path.join(root, name))
    return removed
