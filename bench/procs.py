"""Processes: the environment of the benchmark's subprocesses, and process-tree bookkeeping.

:class:`TreeSampler` watches a process and all its descendants from a background thread: the
peak of their summed RSS (the memory figures) and every process that ever belonged to the
tree, so that, once the root was SIGKILLed, :func:`count_running` tells which of them still run.
Uses psutil (the ``bench`` extra); a sample costs under a millisecond for a few dozen processes.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subprocess_env(pycache_dir: Optional[str] = None) -> dict:
    """The environment of a benchmark subprocess: ``bench`` importable from any working folder,
    and (with ``pycache_dir``) byte-code caching on in a private folder even where
    ``PYTHONDONTWRITEBYTECODE`` is set, so that imports cost what they cost on a user's machine
    rather than a compile of every module each time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    if pycache_dir:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache_dir
    return env


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot): with the pid, it names one process
    for good. None when no such process runs (a zombie has finished running)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command's closing parenthesis: state is field 3, starttime field 22 of stat(5).
    return None if fields[0] == b"Z" else int(fields[19])


def count_running(processes: list) -> int:
    """How many of ``[(pid, start_ticks), ...]`` still run."""
    return sum(1 for pid, ticks in processes if start_ticks(pid) == ticks)


class TreeSampler:
    """Samples the process tree under ``root_pid`` every ``interval_s`` seconds until stopped.

    Attributes:
        peak_rss: the largest sum of resident set sizes (bytes) of the root and its descendants
            seen in one sample. Shared pages count once per process, as ``ps`` shows them.
        peak_processes: the number of processes in that largest sample.
        seen: ``{pid: start_ticks}`` of every process seen in the tree (the root included).
    """

    def __init__(self, root_pid: int, interval_s: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(root_pid)
        self.interval_s = interval_s
        self.peak_rss = 0
        self.peak_processes = 0
        self.seen: dict[int, Optional[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-tree-sampler", daemon=True)

    def __enter__(self) -> "TreeSampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop sampling (after one last sample while the tree is still there)."""
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        psutil = self._psutil
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:  # the root is gone: nothing more to see
            return
        total = count = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:  # exited between the listing and the read
                continue
            count += 1
            if proc.pid not in self.seen:
                self.seen[proc.pid] = start_ticks(proc.pid)
        if total > self.peak_rss:
            self.peak_rss, self.peak_processes = total, count

    def kill_survivors(self) -> None:
        """SIGKILL the processes once seen in the tree that still run, each by its own pid
        (checked against its start time): they are this benchmark's leftovers."""
        kill_processes([(pid, ticks) for pid, ticks in self.seen.items() if ticks is not None])


#: Set in the environment of a benchmark's driver script, inherited by everything it starts
#: (trial and rank processes, torchrun's agent and workers, Ray's raylet, GCS and workers):
#: :func:`marked_processes` finds them all afterwards, wherever they were re-parented to.
RUN_MARKER_VAR = "FTNB_BENCH_RUN"


def marked_processes(marker: str) -> list[tuple[int, int]]:
    """``[(pid, start_ticks), ...]`` of the running processes (of this user) whose environment
    holds ``RUN_MARKER_VAR=marker``."""
    needle = f"{RUN_MARKER_VAR}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or not ours
            continue
        if needle in environ.split(b"\0"):
            ticks = start_ticks(int(name))
            if ticks is not None:
                found.append((int(name), ticks))
    return found


def kill_processes(processes: list) -> None:
    """SIGKILL each of ``[(pid, start_ticks), ...]`` that is still that same process."""
    import signal

    for pid, ticks in processes:
        if start_ticks(pid) == ticks:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
