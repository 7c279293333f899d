"""The local executor's pump server: a trial's output is copied to its files by a process of
its own, so a stopped driver (SIGSTOP, a hung driver, one taken over from "another machine")
stops no trial, and the server ends once its driver is gone."""

from __future__ import annotations

import os
import signal

from procs import pid_alive, run_script, wait_for

from ftnb.execution.process_tree import ATTEMPT_VARIABLE
from ftnb.system.processes import process_status


_CHATTY_DRIVER = r'''
import sys, time
import ftnb


def chatty(config):
    out = sys.stdout.buffer
    i = 0
    while True:  # 4 KiB lines, about 4 MB/s, and never a report
        out.write(b"%09d " % i + b"c" * 4086 + b"\n")
        out.flush()
        i += 1
        time.sleep(0.001)


if __name__ == "__main__":
    ftnb.Tuner(chatty, param_space={},
               run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="chatty", verbose=0)).fit()
'''


def _pump_servers_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"ftnb.execution.pump_server" in cmdline:
            found.append(int(entry))
    return found


def test_a_stopped_driver_stops_no_trial_and_its_pump_server_ends_with_it(tmp_path):
    """SIGSTOP the driver of a trial that prints without end: the trial is not blocked on its
    pipes, and its output keeps reaching its file (the pump server copies it, not the
    driver). SIGKILL the driver: its pump server ends too."""
    proc = run_script(tmp_path, _CHATTY_DRIVER, str(tmp_path / "runs"))
    try:
        stdout = wait_for(lambda: next((tmp_path / "runs" / "chatty").glob("*/stdout"), None),
                          what="the trial's stdout")
        wait_for(lambda: stdout.stat().st_size > (1 << 20), what="the trial's output")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: process_status(proc.pid) == "T", what="the driver to stop")
            before = stdout.stat().st_size
            # Far more than the pipe holds: the trial writes on, and it reaches the file.
            wait_for(lambda: stdout.stat().st_size > before + (4 << 20), timeout=30,
                     what="the trial's output to grow while its driver is stopped")
            assert process_status(proc.pid) == "T"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        server = wait_for(lambda: _pump_servers_of(proc.pid), what="the pump server")[0]
        with open(f"/proc/{server}/environ", "rb") as f:
            assert f"{ATTEMPT_VARIABLE}=".encode() not in f.read()  # no attempt's end sweeps it
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_for(lambda: not pid_alive(server), timeout=20,
                 what="the pump server to end after its driver's SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
