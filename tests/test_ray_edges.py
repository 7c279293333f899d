"""The Ray executor keeps the local executor's promises at the edges (docs/edges.md), on a real
multi-node Ray cluster (``ray_cluster``): a trial's output files are capped as locally (their
first and last lines kept, a killed actor's last lines included), nothing a trial starts (a
process-group child, a ``setsid`` child, a daemon forked twice with and without ``exec``)
outlives its attempt whether the attempt returns or its actor is killed, and a hung trial is
ended as ``hang``, retried from its checkpoint, each iteration once. Each case is one driver
run, with a cgroup per rank and with the marks alone."""

from __future__ import annotations

import json
import os
import signal

import pytest

from procs import pid_alive, run_script, state_trials
from stray_family import families, family_pids

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CAP = 65536
#: Attempt 1 hangs after its second report, and the test waits this long for it to be taken for
#: hung: the normal path pays it twice (once a case). An attempt's start to its first report
#: (its strays started, 2 MB printed) took 1.2 s at load 10 on two cores, the retry's 0.8 s.
HANG_TIMEOUT_S = 6

DRIVER = """
import json, sys
import ftnb
from ftnb.execution.ray import RayExecutor
import ray_trainables

args = json.loads(sys.argv[1])
grid = ftnb.Tuner(
    ray_trainables.loud_family_hangs_once,
    param_space={"pids": args["pids"], "lines": args["lines"]},
    run_config=ftnb.RunConfig(
        name="run", storage_path=args["storage"], verbose=0,
        executor=RayExecutor(args["address"], shared_storage=True),
        failure_config=ftnb.FailureConfig(max_failures=1,
                                          hang_timeout_s=args["hang_timeout_s"])),
).fit()
print("DONE", grid[0].metrics["training_iteration"], flush=True)
"""


@pytest.mark.parametrize("cgroups", ["cgroup", "marks"])
def test_a_hung_loud_trial_with_strays_on_ray(tmp_path, ray_cluster, cgroups):
    pids = str(tmp_path / "pids")
    storage = tmp_path / "results"
    env = {"FTNB_OUTPUT_MAX_BYTES": str(CAP)}
    if cgroups == "marks":
        env["FTNB_ATTEMPT_CGROUPS"] = "0"
    driver = run_script(tmp_path, DRIVER, json.dumps({
        "address": ray_cluster.address, "pids": pids, "storage": str(storage),
        "lines": 20000, "hang_timeout_s": HANG_TIMEOUT_S}), env=env)
    try:
        out, _ = driver.communicate(timeout=240)
        assert driver.returncode == 0, out
        assert "DONE 3" in out
        # Attempt 1's actor was killed (the hang), attempt 2 returned: by the time each end
        # was reported, nothing either started runs (no waiting here).
        assert len(families(pids)) == 2 and len(family_pids(pids)) == 8
        assert [pid for pid in family_pids(pids) if pid_alive(pid)] == []
    finally:
        for pid in family_pids(pids):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    (trial,) = state_trials(storage / "run")
    assert [f["kind"] for f in trial["failures"]] == ["hang"]
    folder = storage / "run" / trial["dir_name"]
    rows = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
    assert [row["training_iteration"] for row in rows] == [1, 2, 3]
    own_cgroup = "/ftnb." in rows[-1]["cgroup"] and rows[-1]["cgroup"].endswith(".rank0")
    assert own_cgroup is (cgroups == "cgroup"), rows[-1]["cgroup"]
    # 2 MB printed into a 64 KiB file: its first lines, a note, and its last lines, attempt
    # 1's last line (printed just before its actor hung and was killed) included.
    stdout = (folder / "stdout").read_text()
    assert len(stdout.encode()) <= CAP
    assert stdout.startswith("FIRST-attempt-1\n")
    assert "bytes of output left out here" in stdout
    for line in ("LAST-attempt-1", "FIRST-attempt-2", "LAST-attempt-2"):
        assert f"\n{line}\n" in stdout
    assert stdout.index("LAST-attempt-1") < stdout.index("FIRST-attempt-2")
