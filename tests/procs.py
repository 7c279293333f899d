"""Helpers for tests that run drivers as real child processes and kill them."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap

from ftnb.testing.waiting import pid_alive, wait_for  # noqa: F401 (tests import them from here)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")


def run_script(tmp_path, body: str, *args: str, env: dict | None = None,
               name: str = "driver.py") -> subprocess.Popen:
    """Start ``body`` as a Python script in ``tmp_path`` (ftnb and tests/ importable)."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(body))
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]), PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=str(tmp_path),
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    STARTED.append(proc)
    return proc


#: Every script :func:`run_script` started, in order: tests/conftest.py kills those a test
#: started and left running (a failed test's driver must not go on loading the machine).
STARTED: list[subprocess.Popen] = []


def run_again_line(*argv: str) -> str:
    """What a script run by name (ftnb.run) with ``argv`` is told to resume when interrupted:
    its own command (this Python, then ``argv``), again."""
    return (f"{shlex.join([sys.executable, *argv])}   "
            "# the same command again: ftnb.run resumes it by name")


def kill_started_since(mark: int) -> None:
    """SIGKILL the scripts started after the first ``mark`` that are still running."""
    leftovers = STARTED[mark:]
    del STARTED[mark:]
    for proc in leftovers:
        if proc.poll() is None:
            proc.kill()
    for proc in leftovers:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def processes_named(name: str) -> list[int]:
    """Pids of the live processes whose /proc/PID/comm is ``name``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == name and pid_alive(int(entry)):
                        out.append(int(entry))
            except OSError:
                continue
    return out


def state_trials(experiment_dir) -> list[dict]:
    """The trials' records of the experiment at ``experiment_dir`` as stored (JSON dicts), read
    through ftnb's own reader: while a driver runs, ``experiment_state.json`` holds only the
    running trials and the others are in its journal segments."""
    from ftnb.core.records import ExperimentState
    from ftnb.storage import ExperimentPaths

    state = ExperimentState.load(ExperimentPaths.at(str(experiment_dir)))
    return [trial.to_json() for trial in state.trials]


def holds_a_lock(pid: int, path) -> bool:
    """Whether process ``pid`` holds a lock on the file ``path`` (``/proc/locks``)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields:  # a waiter, not a holder
                continue
            if len(fields) >= 6 and fields[4] == str(pid) and fields[5].endswith(f":{inode}"):
                return True
    return False


def stop_outside_the_lease_lock(pid: int, experiment_dir) -> None:
    """SIGSTOP the driver ``pid``, again until it is not stopped inside a heartbeat, where it
    would hold the lease lock of this disk until continued (a takeover of a driver of another
    machine waits for that lock; one of this machine is killed, which frees it)."""
    import signal

    from ftnb.system.processes import process_status

    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: process_status(pid) == "T", what="the driver to stop")
        if not holds_a_lock(pid, os.path.join(experiment_dir, ".owner.lock")):
            return
        os.kill(pid, signal.SIGCONT)
