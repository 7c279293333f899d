"""The detached supervisor of an experiment on the S3 server (moto): its log reaches the bucket
while it runs, so a SIGKILLed supervisor's log tells what it did, and the supervisor that
resumes the experiment continues that log."""

from __future__ import annotations

import json
import os
import posixpath
import signal

import pytest

import ftnb
from procs import pid_alive, wait_for
from scripted import scripted

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]


def test_a_sigkilled_supervisors_log_is_on_s3_and_the_resume_continues_it(s3_storage, tmp_path,
                                                                           monkeypatch):
    url, fs = s3_storage
    monkeypatch.setenv("FTNB_OUTPUT_PUBLISH_S", "0.2")
    temp = tmp_path / "temp"  # the supervisors' temporary folder: their staged copies
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))

    def staged() -> list[str]:
        return sorted(p.name for p in temp.iterdir() if p.name.startswith("ftnb-staged-"))

    gate = tmp_path / "gate"  # the trial waits at its last step until it exists
    space = {"n": 2, "sleep": 0.05, "gate": str(gate)}
    run_config = ftnb.RunConfig(storage_filesystem=fs, verbose=0)
    handle = ftnb.launch(scripted, param_space=space, name="logged", storage_path=url,
                         run_config=run_config, quiet=True)
    exp = url[len("s3://"):] + "/logged"
    log_key = posixpath.join(exp, "supervisor.log")
    pid = json.loads(fs.cat_file(posixpath.join(exp, "supervisor.json")))["pid"]
    first_line = f"ftnb supervisor pid {pid} "

    def stored_log() -> str:
        return fs.cat_file(log_key).decode() if fs.exists(log_key) else ""

    # What the running supervisor logged is in the bucket before anything ends it.
    try:
        wait_for(lambda: first_line in stored_log(), timeout=30, what="the running log on S3")
    finally:
        os.kill(pid, signal.SIGKILL)  # (its trial dies with it)
    wait_for(lambda: not pid_alive(pid), timeout=10, what="the supervisor to die")
    wait_for(lambda: handle.status() == "INTERRUPTED", timeout=30, what="INTERRUPTED")
    assert first_line in stored_log()
    # The killed supervisor's local copies (its log, its trial's output) are left behind...
    assert staged() and all(f"-{pid}-" in name for name in staged()), staged()

    gate.write_text("open")
    again = ftnb.launch(scripted, param_space=space, name="logged", storage_path=url,
                        run_config=run_config, quiet=True)
    assert again.wait(timeout=90)[0].metrics["training_iteration"] == 2
    pid2 = json.loads(fs.cat_file(posixpath.join(exp, "supervisor.json")))["pid"]
    assert pid2 != pid
    log = stored_log()
    # The resuming supervisor's log follows the killed one's, as on a local disk.
    assert first_line in log
    second_line = log.index(f"ftnb supervisor pid {pid2} ")
    assert log.index(first_line) < second_line < log.index("supervisor exiting")
    # ...and removed by the next supervisor; its own go once uploaded whole.
    wait_for(lambda: not pid_alive(pid2), timeout=30, what="the second supervisor to exit")
    assert staged() == []
