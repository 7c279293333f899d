"""The processes an attempt starts, and their end with it.

A trial may start processes of its own: data-loader workers in its process group, a server in
a new session (``setsid``), a daemon that forks twice. None of them may outlive the attempt
(they would hold its GPU, its ports, its files, and could write into the experiment after a
retry began).

Where this machine lets the driver make cgroups (a cgroup v2 hierarchy it can write), each
attempt gets one (:class:`AttemptCgroup`, ``ftnb.<FTNB_ATTEMPT>`` under the driver's cgroup):
its processes join it before the trainable runs, nothing they start can leave it, and its end
kills everything in it (``cgroup.kill``). ``FTNB_ATTEMPT_CGROUPS=0`` turns this off. With or
without one, three marks keep every such process findable:

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
    "CGROUP_VARIABLE",
    "AttemptCgroup",
    "attempt_marker",
    "become_subreaper",
    "end_descendants",
    "end_strays_of",
    "join_cgroup",
    "kill_marked",
    "kill_tree",
    "name_this_thread",
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


def _gone(pid: int, reap: bool) -> bool:
    """Whether ``pid`` ended (gone, or a zombie). ``reap``: collect it when it is our child (a
    subreaper's orphans, which nobody else waits for; never a child whose exit status a
    ``subprocess.Popen`` of the caller's will want)."""
    if reap:
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


def _wait_gone(pids: Iterable[int], deadline: float, reap: bool = False) -> None:
    for pid in pids:
        while not _gone(pid, reap) and time.monotonic() < deadline:
            time.sleep(0.005)


def kill_tree(root: int, include_root: bool = True, timeout_s: float = _WAIT_S,
              reap: bool = False) -> list[int]:
    """SIGKILL every descendant of ``root`` (and ``root`` itself unless ``include_root`` is
    False), the descendants first: while ``root`` (a subreaper) lives, orphans of its tree stay
    in it. Waits for each by pid (``reap``: collecting those that are this process's
    children); returns the descendants killed."""
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
        _wait_gone(found, deadline, reap)
    if include_root:
        _kill([root])
        _wait_gone([root], deadline)
    return killed


def end_descendants() -> list[int]:
    """In a subreaper (a trial process, a worker) about to exit: end everything it started."""
    return kill_tree(os.getpid(), include_root=False, reap=True)


def _environ_has(pid: int, prefix: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any((item + b"\0").startswith(prefix) for item in f.read().split(b"\0"))
    except OSError:
        return False


def kill_marked(marker_prefix: str, name: Optional[str] = None,
                spare: Iterable[int] = (), timeout_s: float = _WAIT_S,
                exact: bool = False) -> list[int]:
    """SIGKILL this machine's processes whose :data:`ATTEMPT_VARIABLE` starts with
    ``marker_prefix`` (``exact``: is it), or whose name is ``name``, except this process and
    the trees of ``spare`` (live trial processes, whose own processes carry the same name), and
    wait for each by pid. Returns their pids."""
    deadline = time.monotonic() + timeout_s
    wanted = f"{ATTEMPT_VARIABLE}={marker_prefix}".encode()
    if exact:
        wanted += b"\0"  # (the environment's items are read with their ends, see below)
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


def name_this_thread(name: str) -> None:
    """Name the calling thread (``/proc/PID/comm`` of what it forks without ``exec``), best
    effort: in a process whose main thread is not the trial's (a Ray actor)."""
    try:
        with open("/proc/thread-self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def end_strays_of(token: str) -> list[int]:
    """After a driver's death (a takeover, a restore): end every process on this machine that
    one of its attempts started. Returns their pids."""
    from ..storage.lease import process_name

    killed: list[int] = []
    for cgroup in AttemptCgroup.of_driver(token):
        killed.extend(cgroup.end())
    return killed + kill_marked(f"{token}.", process_name(token))


#: The environment variable that names the attempt's cgroup folder to its processes.
CGROUP_VARIABLE = "FTNB_ATTEMPT_CGROUP"
_CGROUP_PREFIX = "ftnb."


def _own_cgroup_folder() -> Optional[str]:
    """The folder of this process's cgroup in a mounted cgroup v2 hierarchy, or None."""
    try:
        with open("/proc/self/cgroup") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    if own is None:
        return None
    for fields in mounts:
        # "id parent dev root mount_point options ... - fstype source super_options"
        if "-" not in fields:
            continue
        rest = fields[fields.index("-") + 1:]
        if not rest or rest[0] != "cgroup2":
            continue
        root, mount_point = fields[3], fields[4]
        if own == root or own.startswith(root.rstrip("/") + "/"):
            folder = os.path.join(mount_point, own[len(root.rstrip("/")):].lstrip("/"))
            return folder if os.path.isdir(folder) else None
    return None


class AttemptCgroup:
    """An attempt's cgroup (see the module docstring): ``create`` it before its processes
    start, :func:`join_cgroup` in each, :meth:`end` it when the attempt is over."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        #: Whether :meth:`end` removed it: empty, every process of the attempt ended.
        self.removed = False

    @classmethod
    def create(cls, marker: str) -> Optional["AttemptCgroup"]:
        """A new cgroup for the attempt ``marker``, or None where none can be made (no cgroup
        v2, no right to write it, turned off by ``FTNB_ATTEMPT_CGROUPS=0``)."""
        if os.environ.get("FTNB_ATTEMPT_CGROUPS", "1") == "0":
            return None
        parent = _own_cgroup_folder()
        if parent is None or not os.access(os.path.join(parent, "cgroup.procs"), os.W_OK):
            return None
        _remove_abandoned(parent)
        folder = os.path.join(parent, _CGROUP_PREFIX + marker.replace("/", "_"))
        try:
            os.mkdir(folder)
        except FileExistsError:
            pass
        except OSError:
            return None
        cgroup = cls(folder)
        if not os.access(os.path.join(folder, "cgroup.procs"), os.W_OK):
            cgroup.end()
            return None
        return cgroup

    @classmethod
    def of_driver(cls, token: str) -> list["AttemptCgroup"]:
        """The attempt cgroups a driver with lease ``token`` left under this process's cgroup."""
        parent = _own_cgroup_folder()
        if parent is None:
            return []
        try:
            names = os.listdir(parent)
        except OSError:
            return []
        return [cls(os.path.join(parent, name)) for name in names
                if name.startswith(f"{_CGROUP_PREFIX}{token}.")]

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.folder, "cgroup.procs")) as f:
                return [int(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return []

    def end(self, timeout_s: float = _WAIT_S) -> list[int]:
        """SIGKILL every process in the cgroup, wait until it is empty, remove it. Returns
        the pids killed; :attr:`removed` says whether it is gone (so nothing it held lives)."""
        deadline = time.monotonic() + timeout_s
        killed: list[int] = []
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            killed.extend(pid for pid in pids if pid not in killed)
            try:  # the kernel kills them all at once, forks in flight included (Linux 5.14)
                with open(os.path.join(self.folder, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:
                _kill(pids)
            _wait_gone(pids, deadline)
        while True:
            try:
                os.rmdir(self.folder)
                self.removed = True
                break
            except FileNotFoundError:
                self.removed = True
                break
            except OSError:  # EBUSY: the last of them are still exiting
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
        return killed


#: An attempt cgroup empty for this long was left by a driver that ended without removing it
#: (killed, and not run again): its processes joined it within moments of its making.
_ABANDONED_S = 60.0


def _remove_abandoned(parent: str) -> None:
    try:
        names = [name for name in os.listdir(parent) if name.startswith(_CGROUP_PREFIX)]
    except OSError:
        return
    now = time.time()
    for name in names:
        folder = os.path.join(parent, name)
        try:
            if now - os.stat(folder).st_mtime < _ABANDONED_S:
                continue
        except OSError:
            continue
        if not AttemptCgroup(folder).pids():
            try:
                os.rmdir(folder)  # refused (EBUSY) while anything is in it
            except OSError:
                pass


def join_cgroup(folder: Optional[str]) -> None:
    """Move this process into the attempt's cgroup ``folder`` (None: none), before it runs
    anything of the trainable's."""
    if not folder:
        return
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write("0")
    except OSError:
        pass  # then the marks alone find what it starts
