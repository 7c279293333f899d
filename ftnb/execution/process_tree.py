"""The processes an attempt starts, and their end with it.

A trial may start processes of its own: data-loader workers in its process group, a server in
a new session (``setsid``), a daemon that forks twice. None of them may outlive the attempt
(they would hold its GPU, its ports, its files, and could write into the experiment after a
retry began). Three marks keep every such process findable, with or without a cgroup:

* **A child subreaper.** Each trial process and WorkerGroup worker, and the fork server they
  come from, asks the kernel (``PR_SET_CHILD_SUBREAPER``) to become the parent of its orphaned
  descendants: a ``setsid`` or double-forked daemon stays in the tree of the process that
  started it, so :func:`kill_tree` ends the whole tree while its root lives, and a root that
  ends its own tree waits for each process by pid (:func:`end_descendants`).
* **An environment variable** (:data:`ATTEMPT_VARIABLE`, ``FTNB_ATTEMPT=<lease token>.<trial
  id>.<attempt>``) in the attempt's environment, which every program it runs inherits
  (``/proc/PID/environ`` holds it across ``exec``), and with it every process they fork.
* **The process name** ``ftnb.<token prefix>`` of the trial process
  (:func:`ftnb.storage.lease.process_name`), inherited by what it forks without ``exec``.

When the root dies first (a signal, the OOM killer), its orphans go to the fork server and the
executor ends what carries the attempt's variable or its driver's name (:func:`kill_marked`);
after a SIGKILLed driver, the driver that takes the experiment over ends what carries the old
token (:func:`end_strays_of`). A process that clears its environment and renames itself
escapes the marks; only a cgroup would hold it (see docs/edges.md).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Optional

__all__ = [
    "ATTEMPT_VARIABLE",
    "attempt_marker",
    "become_subreaper",
    "end_descendants",
    "end_strays_of",
    "kill_marked",
    "kill_tree",
    "process_table",
]

#: The environment variable that marks every process of an attempt.
ATTEMPT_VARIABLE = "FTNB_ATTEMPT"

_PR_SET_CHILD_SUBREAPER = 36
#: How long an end waits for the processes it killed to be gone.
_WAIT_S = 10.0


def attempt_marker(token: Optional[str], trial_id: str, attempt: int) -> str:
    """The value of :data:`ATTEMPT_VARIABLE` for an attempt (``-`` without a lease)."""
    return f"{token or '-'}.{trial_id}.{attempt}"


def become_subreaper() -> bool:
    """Make this process the parent of its orphaned descendants (Linux); False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, str]]:
    """This machine's live processes: pid -> (parent pid, name); zombies left out."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (name) state ppid ...": the name may hold spaces and parentheses.
        open_at, close_at = stat.find(b"("), stat.rfind(b")")
        fields = stat[close_at + 2:].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X"):
            continue
        table[int(entry)] = (int(fields[1]), stat[open_at + 1:close_at].decode("utf-8", "replace"))
    return table


def _descendants(roots: Iterable[int], table: dict[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _gone(pid: int) -> bool:
    """Whether ``pid`` ended (gone, or a zombie); reaps it when it is our child."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _wait_gone(pids: Iterable[int], deadline: float) -> None:
    for pid in pids:
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.005)


def kill_tree(root: int, include_root: bool = True, timeout_s: float = _WAIT_S) -> list[int]:
    """SIGKILL every descendant of ``root`` (and ``root`` itself unless ``include_root`` is
    False), the descendants first: while ``root`` (a subreaper) lives, orphans of its tree stay
    in it. Waits for each by pid; returns the descendants killed."""
    deadline = time.monotonic() + timeout_s
    killed: list[int] = []
    while time.monotonic() < deadline:
        # Again until none is left: a process may fork between the look and the kill, and
        # the orphans of the killed come back to ``root``.
        found = _descendants([root], process_table())
        if not found:
            break
        _kill(found)
        killed.extend(pid for pid in found if pid not in killed)
        _wait_gone(found, deadline)
    if include_root:
        _kill([root])
        _wait_gone([root], deadline)
    return killed


def end_descendants() -> list[int]:
    """In a subreaper (a trial process, a worker) about to exit: end everything it started."""
    return kill_tree(os.getpid(), include_root=False)


def _environ_has(pid: int, prefix: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(item.startswith(prefix) for item in f.read().split(b"\0"))
    except OSError:
        return False


def kill_marked(marker_prefix: str, name: Optional[str] = None,
                spare: Iterable[int] = (), timeout_s: float = _WAIT_S) -> list[int]:
    """SIGKILL this machine's processes whose :data:`ATTEMPT_VARIABLE` starts with
    ``marker_prefix``, or whose name is ``name``, except this process and the trees of
    ``spare`` (live trial processes, whose own processes carry the same name), and wait for
    each by pid. Returns their pids."""
    deadline = time.monotonic() + timeout_s
    wanted = f"{ATTEMPT_VARIABLE}={marker_prefix}".encode()
    spare = set(spare)
    killed: list[int] = []
    while time.monotonic() < deadline:
        table = process_table()
        skip = spare | _descendants(spare, table) | {os.getpid()}
        found = [pid for pid, (_, comm) in table.items() if pid not in skip
                 and ((name is not None and comm == name) or _environ_has(pid, wanted))]
        if not found:
            break
        _kill(found)
        killed.extend(pid for pid in found if pid not in killed)
        _wait_gone(found, deadline)
    return killed


def end_strays_of(token: str) -> list[int]:
    """After a driver's death (a takeover, a restore): end every process on this machine that
    one of its attempts started. Returns their pids."""
    from ..storage.lease import process_name

    return kill_marked(f"{token}.", process_name(token))
