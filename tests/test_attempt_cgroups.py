"""An attempt's cgroup (ftnb.execution.process_tree.AttemptCgroup), where this machine lets a
test make one: what joins it cannot leave it, its end kills everything in it and removes it, and
one a killed driver left empty is removed later, never one with a process in it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from ftnb.execution.process_tree import AttemptCgroup
from procs import pid_alive, wait_for

# Joins the cgroup named in argv[1], then starts a daemon in a session of its own and prints
# both pids.
JOINER = """
import os, subprocess, sys, time
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write("0")
daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                          start_new_session=True, env={})
print(os.getpid(), daemon.pid, flush=True)
time.sleep(300)
"""


@pytest.fixture
def cgroup():
    made = AttemptCgroup.create(f"test.{uuid.uuid4().hex}")
    if made is None:
        pytest.skip("this machine gives no cgroup to make")
    yield made
    made.end()


def test_the_end_of_a_cgroup_ends_all_in_it_even_what_dropped_every_mark(cgroup):
    proc = subprocess.Popen([sys.executable, "-c", JOINER, cgroup.folder],
                            stdout=subprocess.PIPE, text=True)
    try:
        joiner, daemon = map(int, proc.stdout.readline().split())
        assert sorted(cgroup.pids()) == sorted([joiner, daemon])
        killed = cgroup.end()
        assert sorted(killed) == sorted([joiner, daemon])
        assert not pid_alive(joiner) and not pid_alive(daemon)
        assert not os.path.exists(cgroup.folder)
        assert proc.wait(10) < 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_an_abandoned_empty_cgroup_is_removed_when_another_is_made(cgroup):
    parent = os.path.dirname(cgroup.folder)
    old = time.time() - 3600
    busy = AttemptCgroup.create(f"test.{uuid.uuid4().hex}")
    proc = subprocess.Popen([sys.executable, "-c", JOINER, busy.folder],
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        for folder in (cgroup.folder, busy.folder):
            try:
                os.utime(folder, (old, old))
            except OSError:
                pytest.skip("this cgroup filesystem keeps its folders' times")
        fresh = AttemptCgroup.create(f"test.{uuid.uuid4().hex}")
        try:
            assert not os.path.exists(cgroup.folder)  # empty for an hour: removed
            assert os.path.exists(busy.folder) and busy.pids()  # a process in it: kept
            assert os.path.dirname(fresh.folder) == parent
        finally:
            fresh.end()
    finally:
        busy.end()
        wait_for(lambda: proc.poll() is not None, 10, "the joiner to end")
