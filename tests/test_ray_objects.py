"""``ftnb.put`` refs on the Ray executor, on a real Ray cluster (``ray_cluster``): a numpy array
and a DataFrame put into a ``param_space`` reach trials on any node, through Ray's object store.

Every node of the test cluster shares this machine's ``/dev/shm``, where ``ftnb.put`` keeps its
files, so a trial could read them from there without Ray. To prove the objects travel through
Ray, the driver deletes their files before the run (it keeps them, loaded, in memory: ``ftnb.get``
memoizes): no file is left on the machine for a trial to read, and a trial that went to the file
would end with ``ObjectUnavailableError``."""

from __future__ import annotations

import json
import pathlib

import pytest

from procs import run_script

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DRIVER = """
import json, os, sys
import numpy as np
import pandas as pd
import ftnb
from ftnb.execution.ray import RayExecutor
import ray_trainables

args = json.loads(sys.argv[1])
array = ftnb.put(np.arange(1, 1001, dtype=np.float64))
frame = ftnb.put(pd.DataFrame({"a": range(500), "b": np.linspace(0.0, 1.0, 500)}))
for ref in (array, frame):
    ftnb.get(ref)  # loaded here (and kept: get memoizes)...
    os.unlink(ref.path)  # ...while no file is left for a trial to read
executor = RayExecutor(args["address"], shared_storage=True)
grid = ftnb.run(
    ray_trainables.uses_objects, name="run",
    param_space={"array": array, "frame": frame, "lr": ftnb.grid_search([1.0, 2.0, 3.0])},
    run_config=ftnb.RunConfig(name="run", storage_path=args["storage"], verbose=0,
                              executor=executor,
                              failure_config=ftnb.FailureConfig(max_failures=0)))
print("ERRORS", [str(r.error) for r in grid if r.error], flush=True)
print("CACHED", len(executor._ray_objects), flush=True)
print("RESULTS", json.dumps([r.metrics for r in grid]), flush=True)
"""


def test_put_objects_reach_trials_on_any_node_through_rays_object_store(tmp_path: pathlib.Path,
                                                                        ray_cluster):
    process = run_script(tmp_path, DRIVER, json.dumps(
        {"address": ray_cluster.address, "storage": str(tmp_path / "results")}))
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    assert "ERRORS []" in out, out
    assert "CACHED 2" in out  # one Ray object per ref, shared by the three trials
    results = json.loads(out.split("RESULTS ", 1)[1].splitlines()[0])
    assert sorted(r["value"] for r in results) == [1.0, 2.0, 3.0]  # lr * array[0]
    for row in results:
        assert row["training_iteration"] == 3
        assert (row["array_type"], row["frame_type"]) == ("ndarray", "DataFrame")
        assert row["array_sum"] == sum(range(1, 1001))
        assert row["rows"] == 500 and row["frame_sum"] == pytest.approx(250.0)
    assert len({row["node"] for row in results}) >= 2  # one CPU a node: several nodes ran them
