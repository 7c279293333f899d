"""The ``ray`` launcher on a real multi-node Ray cluster (``ray_cluster``): the supervisor is a
detached, named Ray actor, so the experiment outlives the process that launched it (SIGKILLed
here), and Ray restarts the actor when its process is SIGKILLed, which resumes the experiment
from its checkpoints. Any process that sees the storage attaches to it. Storage is ``tmp_path``,
declared shared (``FTNB_SHARED_STORAGE=1``), as in tests/test_ray_cluster.py."""

from __future__ import annotations

import json
import os
import signal

import pytest

import ftnb
from procs import pid_alive, run_script, state_trials, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

LAUNCHER = """
import json, sys, time
import ftnb
import ray_trainables

args = json.loads(sys.argv[1])
config = {"dir": args["dir"], "steps": args["steps"], "sleep": args["sleep"],
          "hold_at": args["hold_at"]}  # (see ray_trainables)
if args.get("blob"):  # a launch file over Ray's 100 KB inline limit (ray-project/ray#53727)
    import numpy
    config["blob"] = numpy.ones(args["blob"])
handle = ftnb.launch(ray_trainables.stepper, param_space=config, name=args["name"],
                     storage_path=args["storage"], launcher="ray",
                     run_config=ftnb.RunConfig(verbose=0))
print("LAUNCHED", flush=True)
time.sleep(600)
"""


def _launch(tmp_path, cluster, name: str, steps: int, sleep: float, blob: int = 0,
            hold_at: int | None = None):
    marks = tmp_path / f"marks-{name}"
    marks.mkdir()
    args = {"dir": str(marks), "steps": steps, "sleep": sleep, "name": name, "hold_at": hold_at,
            "storage": str(tmp_path / "results"), "blob": blob}
    driver = run_script(tmp_path, LAUNCHER, json.dumps(args), name=f"launch_{name}.py",
                        env={"RAY_ADDRESS": cluster.address, "FTNB_SHARED_STORAGE": "1"})
    out = []

    def launched() -> bool:
        line = driver.stdout.readline()
        out.append(line)
        assert line or driver.poll() is None, "".join(out)
        return "LAUNCHED" in line

    wait_for(launched, timeout=120, what="the launch")
    return driver, marks, tmp_path / "results" / name


def _supervisor(path) -> dict:
    with open(path / "supervisor.json") as f:
        return json.load(f)


def _iterations(path) -> list[int]:
    (trial,) = state_trials(path)
    rows = (path / trial["dir_name"] / "result.json").read_text().splitlines()
    return [json.loads(row)["training_iteration"] for row in rows if row.strip()]


def _progress(marks):
    try:
        attempt, step, _, _ = (marks / "progress-0").read_text().split()
    except (OSError, ValueError):
        return None
    return int(attempt), int(step)


def test_the_experiment_outlives_its_launcher_and_any_process_attaches_to_it(tmp_path,
                                                                            ray_cluster):
    # Its trial waits at step 3 until released: surely still running when it is attached to.
    driver, marks, path = _launch(tmp_path, ray_cluster, "outlives", steps=6, sleep=0.2,
                                  hold_at=3)
    record = _supervisor(path)
    assert record["launcher"] == "ray"
    assert record["actor"].startswith("ftnb-supervisor:outlives:") and record["node_id"]
    with open(f"/proc/{record['pid']}/cmdline", "rb") as f:  # a Ray worker: the actor's
        assert b"SupervisorActor" in f.read()
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=10)
    wait_for(lambda: _progress(marks) == (1, 3), timeout=120, what="the trial held at step 3")
    handle = ftnb.attach(str(path))  # this process never connected to Ray
    assert handle.status() == "RUNNING" and handle.is_live()
    (marks / "release").touch()
    results = handle.wait(timeout=120)
    assert handle.status() == "FINISHED" and results[0].metrics["training_iteration"] == 6
    assert _iterations(path) == list(range(1, 7))  # every iteration exactly once
    # Done: the actor removed itself (no restart), and said so in the experiment's log.
    wait_for(lambda: not pid_alive(record["pid"]), timeout=30, what="the actor to exit")
    assert _supervisor(path)["outcome"] == "finished"
    with open(handle.supervisor_log) as f:
        assert "supervisor exiting" in f.read()


def test_a_killed_supervisor_actor_is_restarted_by_ray_and_resumes_the_experiment(
        tmp_path, ray_cluster):
    # Its space holds a 2.4 MB array: the launch file must outlive the actor's first start.
    # Attempt 1 waits at step 3 and is never released: what happens after is the restart's.
    driver, marks, path = _launch(tmp_path, ray_cluster, "phoenix", steps=10, sleep=0.3,
                                  blob=300_000, hold_at=3)
    first = _supervisor(path)
    wait_for(lambda: (p := _progress(marks)) and p == (1, 3), timeout=120,
             what="attempt 1 held at step 3")
    ghost = int((marks / "progress-0").read_text().split()[3])  # attempt 1's actor's pid
    os.kill(first["pid"], signal.SIGKILL)
    # Ray starts it again: a new process that owns the experiment and resumes it. Its record
    # may already say it finished (attempt 2's 7 steps take about 2 s).
    try:
        restarted = wait_for(lambda: (r := _supervisor(path)).get("pid") != first["pid"] and r,
                             timeout=120, what="the restarted actor")
    except AssertionError:  # (CI keeps only this test's output: say what the supervisor did)
        print(_supervisor(path), (path / "supervisor.log").read_text()[-4000:], sep="\n")
        raise
    # The trial's actor was the supervisor's: Ray ends it with its owner, so no ghost of the
    # dead supervisor goes on beside the restarted one's attempt.
    wait_for(lambda: not pid_alive(ghost), timeout=60, what="the dead supervisor's trial actor")
    assert restarted["actor"] == first["actor"]
    handle = ftnb.attach(str(path))
    results = handle.wait(timeout=150)
    assert handle.status() == "FINISHED" and results[0].metrics["training_iteration"] == 10
    # A checkpoint every step: nothing lost, nothing done twice.
    assert _iterations(path) == list(range(1, 11))
    attempt, step = _progress(marks)
    assert attempt >= 2 and step == 10  # the trial resumed in a new attempt
    with open(handle.supervisor_log) as f:
        assert "restarted by Ray" in f.read()
    driver.kill()
    driver.wait(timeout=10)


REFUSED = """
import json, sys
import ftnb
from ftnb.launchers import LauncherError
from ftnb.launchers.ray import RayLauncher
import ray_trainables

args = json.loads(sys.argv[1])
config = {"dir": args["dir"], "steps": 1, "sleep": 0}
try:
    ftnb.launch(ray_trainables.stepper, param_space=config, name="nowhere",
                storage_path=args["storage"], launcher=RayLauncher("127.0.0.1:1"))
except LauncherError as exc:
    print("UNREACHABLE", exc, flush=True)
try:  # a local path on a cluster of several nodes, not declared shared
    ftnb.launch(ray_trainables.stepper, param_space=config, name="local",
                storage_path=args["storage"], launcher="ray")
except ValueError as exc:
    print("REFUSED", exc, flush=True)
"""


def test_a_cluster_that_is_not_there_or_a_local_path_is_refused_before_anything_starts(
        tmp_path, ray_cluster):
    args = {"dir": str(tmp_path), "storage": str(tmp_path / "results")}
    env = {"RAY_ADDRESS": ray_cluster.address, "FTNB_SHARED_STORAGE": ""}
    script = run_script(tmp_path, REFUSED, json.dumps(args), env=env)
    out, _ = script.communicate(timeout=120)
    assert "UNREACHABLE launcher='ray': no Ray cluster answers at '127.0.0.1:1'" in out, out
    assert "REFUSED storage_path=" in out and "FTNB_SHARED_STORAGE=1" in out, out
    assert not (tmp_path / "results").exists()
