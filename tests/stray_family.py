"""Processes a trial (or a WorkerGroup worker) starts that would outlive it unless ended: one of
each kind that escapes in its own way. tests/test_stray_processes.py uses them in trials and
in driver scripts (tests/ is on their import path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]


def _forked_daemon() -> int:
    """A daemon made the classic way, without exec: fork, setsid, fork again, the middle
    process exits (so the daemon is an orphan). It keeps its parent's name and environment
    memory. Returns its pid."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read)
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            os.close(write)
            while True:
                time.sleep(60)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        pid = int(f.read())
    os.waitpid(middle, 0)
    return pid


def _shell_daemon() -> int:
    """A program a shell puts in the background in a session of its own; the shell exits."""
    script = ('python_bin="$1"; "$python_bin" -c "import os, time; os.setsid(); time.sleep(300)"'
              ' </dev/null >/dev/null 2>&1 & echo $!')
    out = subprocess.run(["sh", "-c", script, "sh", sys.executable], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


def start_family() -> dict[str, int]:
    """Start one process of each kind; returns their pids by kind."""
    return {
        # exec'd, in the caller's process group (a data-loader worker, a tool)
        "group_child": subprocess.Popen(SLEEP).pid,
        # exec'd, in a new session: killpg of the caller's group misses it
        "setsid_child": subprocess.Popen(SLEEP, start_new_session=True).pid,
        "forked_daemon": _forked_daemon(),
        "shell_daemon": _shell_daemon(),
    }


def start_family_into(path: str) -> dict[str, int]:
    """:func:`start_family`, its pids added to the JSON lines file ``path``."""
    family = start_family()
    with open(path, "a") as f:
        f.write(json.dumps(family) + "\n")
    return family


def families(path: str) -> list[dict[str, int]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def family_pids(path: str) -> list[int]:
    return [pid for family in families(path) for pid in family.values()]
