"""Ray's memory monitor, for real: a trial on the Ray executor, and a WorkerGroup worker on Ray,
whose process Ray kills because its node ran low on memory fail as ``oom`` (not as a SIGKILL),
with what Ray said of the node's memory; the group goes on with the worker recreated.

``oom_cluster`` (this module's) is a one-node Ray cluster whose memory monitor kills at this
machine's memory use when it starts plus ``_HEADROOM`` (``memory_usage_threshold`` is a
fraction of the whole machine's memory, whoever uses it), checked every 100 ms. The process
that eats memory takes 100 MB a step, up to ``_MAX_BLOCKS`` of them: far more than the headroom,
so other tests freeing memory meanwhile does not keep it under the threshold, and the machine's
use never goes much past the threshold. It has a cluster of its own because the threshold is
the whole cluster's setting; its tests are in the Ray unit (conftest.py), so no other Ray test
runs beside it.
"""

from __future__ import annotations

import json
import re

import psutil
import pytest
from procs import run_script, state_trials

pytestmark = [pytest.mark.ray]

_HEADROOM = 3.0e9
_MAX_BLOCKS = 100  # of 100 MB

COMMON = """
import json, sys, time
import numpy
import ray
import ftnb
from ftnb.elastic import worker_index
from ftnb.execution.ray import RayExecutor

args = json.loads(sys.argv[1])


def eat_memory():
    # 100 MB a step, written (so resident), until Ray's memory monitor kills this process.
    blocks = []
    for _ in range(args["max_blocks"]):
        blocks.append(numpy.ones(12_500_000))
        time.sleep(0.02)
    raise RuntimeError(f"Ray's memory monitor did not kill this process at {len(blocks) / 10} GB")
"""

TRIAL = COMMON + """
def trainable(config):
    ftnb.report({"step": 1})
    eat_memory()


run_config = ftnb.RunConfig(name="oom", storage_path=args["storage"], verbose=0,
                            executor=RayExecutor(args["address"], shared_storage=True),
                            failure_config=ftnb.FailureConfig(max_failures=0))
ftnb.Tuner(trainable, run_config=run_config).fit()
print("ENDED", flush=True)
"""

GROUP = COMMON + """
ray.init(address=args["address"], log_to_driver=False)


class Worker:
    def __init__(self, index):
        self.index = index


def eat(worker):
    eat_memory()


def hello(worker):
    return f"worker {worker_index()} at your service"


group = ftnb.WorkerGroup(Worker, 1, executor="ray", resources_per_worker={"cpu": 1})
(failed,) = group.map(eat)
print("FAILED", json.dumps({"ok": failed.ok, "error": failed.error}), flush=True)
(again,) = group.map(hello)
print("AGAIN", json.dumps({"ok": again.ok, "value": again.value, "stats": group.stats}),
      flush=True)
group.close()
"""


@pytest.fixture(scope="module")
def oom_cluster():
    pytest.importorskip("ray")
    from conftest import RAY_HEALTH_CHECKS, _patient_ray_cluster_class

    memory = psutil.virtual_memory()
    threshold = (memory.total - memory.available + _HEADROOM) / memory.total
    cluster = _patient_ray_cluster_class()(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "no_monitor": True,
        "_system_config": {**RAY_HEALTH_CHECKS, "memory_usage_threshold": threshold,
                           "memory_monitor_refresh_ms": 100,
                           # (Ray starts its workers at nice 15: on a busy machine the process
                           # that eats memory took minutes to get to the threshold)
                           "worker_niceness": 0}})
    try:
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _run(tmp_path, cluster, script: str) -> str:
    args = {"address": cluster.address, "storage": str(tmp_path / "results"),
            "max_blocks": _MAX_BLOCKS}
    driver = run_script(tmp_path, script, json.dumps(args))
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, out
    return out


def _line(out: str, key: str):
    found = [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(key + " ")]
    assert found, out
    return json.loads(found[-1])


def _says_memory(message: str) -> None:
    """The message names Ray's memory monitor and gives the node's memory use, as Ray said it."""
    assert "Ray's memory monitor killed it" in message, message
    assert "RAY_memory_usage_threshold" in message, message
    assert re.search(r"[\d.]+GB used", message), message


def test_a_trial_killed_by_rays_memory_monitor_fails_as_oom(tmp_path, oom_cluster):
    out = _run(tmp_path, oom_cluster, TRIAL)
    assert "ENDED" in out, out
    (trial,) = state_trials(tmp_path / "results" / "oom")
    assert trial["status"] == "ERRORED", trial
    (failure,) = trial["failures"]
    assert failure["kind"] == "oom", failure  # was: signal, "killed by SIGKILL"
    assert failure["type"] == "OutOfMemoryError", failure
    _says_memory(failure["message"])
    assert "did not kill this process" not in json.dumps(trial)


def test_a_worker_killed_by_rays_memory_monitor_fails_as_oom_and_is_recreated(tmp_path,
                                                                             oom_cluster):
    out = _run(tmp_path, oom_cluster, GROUP)
    failed = _line(out, "FAILED")
    assert not failed["ok"] and failed["error"]["kind"] == "oom", failed
    _says_memory(failed["error"]["message"])
    again = _line(out, "AGAIN")
    assert again["ok"] and again["value"] == "worker 0 at your service", again
    assert again["stats"]["worker_restarts"] == 1, again
