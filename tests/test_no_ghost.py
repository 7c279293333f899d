"""A trial that never reports (a long step, a hang) still dies with its SIGKILLed driver: the
fork server it was forked from must see the driver go, which it cannot while a child holds
its "alive" pipe open (every trial and WorkerGroup worker closes its copy)."""

from __future__ import annotations

import pytest

from procs import pid_alive, run_script, wait_for

DRIVER = """
import os, sys, threading, tempfile
import ftnb

def train(config):
    with open(config["pidfile"], "w") as f:
        f.write(str(os.getpid()))
    threading.Event().wait(120)  # never reports

if __name__ == "__main__":
    ftnb.Tuner(train, param_space={"pidfile": sys.argv[1]},
               run_config=ftnb.RunConfig(storage_path=sys.argv[2], verbose=0)).fit()
"""


@pytest.mark.slow
def test_a_trial_that_never_reports_dies_with_its_killed_driver(tmp_path):
    pidfile = tmp_path / "pid"
    driver = run_script(tmp_path, DRIVER, str(pidfile), str(tmp_path / "runs"))
    try:
        trial = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 60,
                             "the trial to start"))
        driver.kill()
        driver.wait(10)
        wait_for(lambda: not pid_alive(trial), 15, "the trial to die with its driver")
    finally:
        if driver.poll() is None:
            driver.kill()
