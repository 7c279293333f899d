"""``ftnb logs`` and ``ftnb watch`` as real processes, following real experiments until they
end: new lines as they are written, the live table redrawn on a terminal (a pty) and appended
elsewhere, JSON Lines, exit codes."""

from __future__ import annotations

import os
import pty
import re
import select
import threading
import time

import pytest

import ftnb
from clirun import cli_in, literal, strict_json
from procs import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cli(tmp_path):
    yield from cli_in(tmp_path)


def _launch_gated(cli, name, xs=(1,)):
    space = literal({"x": {"grid_search": list(xs)}, "gate": str(cli.cwd / "gate")})
    done = cli("run", "jobs.py:gated", "-p", space, "-n", name, "--detach")
    assert done.returncode == 0, done.stderr
    handle = ftnb.attach(name, storage_path=str(cli.storage))
    wait_for(lambda: all(t.iteration >= 2 for t in handle.state().trials), timeout=60,
             what="the trials to report")
    return handle


class _Lines:
    """Collects a process's stdout lines in a thread, so a test can wait on them."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def join(self):
        self._thread.join(timeout=30)


def _numbers(lines):
    return [int(m.group(1)) for m in (re.search(r"line (\d+) of", s) for s in lines) if m]


def test_logs_of_a_trial_follow_new_lines_until_the_trial_ends(cli):
    handle = _launch_gated(cli, "logs1")
    trial = handle.state().trials[0]
    stdout_file = os.path.join(handle.path, trial.dir_name, "stdout")
    proc = cli.start("logs", "logs1", "--trial", trial.trial_id, "--follow")
    try:
        seen = _Lines(proc)
        wait_for(lambda: _numbers(seen.lines), timeout=60, what="the first lines")
        with open(stdout_file) as f:
            written = len(f.read().splitlines())
        # Lines written after the command had printed what was there.
        wait_for(lambda: max(_numbers(seen.lines)) > written + 3, timeout=60,
                 what="lines written while following")
        cli.open_gate()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        seen.join()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen.lines[-1] == "last line"
    numbers = _numbers(seen.lines)
    assert numbers == list(range(1, len(numbers) + 1))  # every line once, in order
    with open(stdout_file) as f:
        assert f.read().splitlines() == seen.lines


def test_logs_of_the_experiment_follow_its_supervisor_log_to_the_end(cli):
    handle = _launch_gated(cli, "logs2", xs=(1, 2))
    proc = cli.start("logs", "logs2", "-f")
    try:
        seen = _Lines(proc)
        trial_ids = [t.trial_id for t in handle.state().trials]
        wait_for(lambda: all(any(s.startswith(f"({t}) line") for s in seen.lines)
                             for t in trial_ids), timeout=60, what="both trials' output")
        cli.open_gate()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        seen.join()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen.lines[0].startswith("ftnb supervisor pid")
    assert seen.lines[-1] == "ftnb: experiment 'logs2' finished; supervisor exiting."


def test_logs_of_a_foreground_run_are_its_trials_output_and_json_lines(cli):
    assert cli("run", "jobs.py:quick", "-p", "jobs.py:space", "-n", "fg", "--verbose",
               "0").returncode == 0
    trials = ftnb.attach("fg", storage_path=str(cli.storage)).state().trials
    done = cli("logs", "fg")
    assert done.returncode == 0, done.stderr
    for trial in trials:
        assert [s for s in done.stdout.splitlines() if s.startswith(f"({trial.trial_id}) ")] \
            == [f"({trial.trial_id}) step {i}" for i in range(3)]
    done = cli("logs", "fg", "--json")
    rows = [strict_json(line) for line in done.stdout.splitlines()]
    assert len(rows) == 6 and {r["trial_id"] for r in rows} == {t.trial_id for t in trials}
    assert rows[0] == {"source": "trial", "trial_id": trials[0].trial_id, "stream": "stdout",
                       "line": "step 0"}
    done = cli("logs", "fg", "--trial", "nope")
    assert done.returncode == 2 and "has no trial 'nope'" in done.stderr


def test_watch_appends_tables_when_not_a_terminal_and_ends_with_the_experiment(cli):
    _launch_gated(cli, "watched", xs=(1, 2))
    proc = cli.start("watch", "watched", "--interval", "0.2")
    try:
        seen = _Lines(proc)
        wait_for(lambda: any("Experiment watched: RUNNING" in s for s in seen.lines),
                 timeout=60, what="the first table")
        cli.open_gate()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        seen.join()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "\n".join(seen.lines)
    assert "\x1b[" not in text  # no cursor movement in a pipe
    last = text.strip().split("\n\n")[-1].splitlines()
    assert last[0].startswith("[########################] 100%  2/2 trials ended")
    assert last[1].startswith("Experiment watched: FINISHED | 2 TERMINATED")


def test_watch_redraws_in_place_on_a_terminal(cli):
    _launch_gated(cli, "tty", xs=(1,))
    leader, follower = pty.openpty()
    proc = cli.start("watch", "tty", "--interval", "0.1", stdout=follower)
    os.close(follower)
    out = b""
    try:
        def redrawn():
            nonlocal out
            while select.select([leader], [], [], 0.1)[0]:
                try:
                    out += os.read(leader, 65536)
                except OSError:
                    break
            return out.count(b"\x1b[J") >= 2

        wait_for(redrawn, timeout=60, what="two redraws")
        cli.open_gate()
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            redrawn()
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    final = out.decode().split("\x1b[J")[-1]
    assert "Experiment tty: FINISHED" in final and "1/1 trials ended" in final


def test_watch_json_lines_and_the_exit_code_of_an_errored_experiment(cli):
    assert cli("run", "jobs.py:broken", "-p", "jobs.py:space", "-n", "bad",
               "--verbose", "0").returncode == 1
    done = cli("watch", "bad", "--json")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 1  # it had ended: one snapshot
    data = strict_json(lines[0])
    assert data["status"] == "ERRORED" and data["progress"].startswith("[")
    assert "1 errored" in data["progress"]
    done = cli("watch", "bad")
    assert done.returncode == 1 and "Experiment bad: ERRORED" in done.stdout
