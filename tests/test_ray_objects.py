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


def _run_without_errors(tmp_path: pathlib.Path, driver: str, cluster) -> str:
    """Run ``driver`` against the cluster; it must end well, with no trial errored."""
    process = run_script(tmp_path, driver, json.dumps(
        {"address": cluster.address, "storage": str(tmp_path / "results")}))
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    assert "ERRORS []" in out, out
    return out


def test_put_objects_reach_trials_on_any_node_through_rays_object_store(tmp_path: pathlib.Path,
                                                                        ray_cluster):
    out = _run_without_errors(tmp_path, DRIVER, ray_cluster)
    assert "CACHED 2" in out  # one Ray object per ref, shared by the three trials
    results = json.loads(out.split("RESULTS ", 1)[1].splitlines()[0])
    assert sorted(r["value"] for r in results) == [1.0, 2.0, 3.0]  # lr * array[0]
    for row in results:
        assert row["training_iteration"] == 3
        assert (row["array_type"], row["frame_type"]) == ("ndarray", "DataFrame")
        assert row["array_sum"] == sum(range(1, 1001))
        assert row["rows"] == 500 and row["frame_sum"] == pytest.approx(250.0)
    assert len({row["node"] for row in results}) >= 2  # one CPU a node: several nodes ran them


CODE_REFS_DRIVER = """
import json, os, sys
import numpy as np
import ray
import ftnb
from ftnb.execution.ray import RayExecutor

args = json.loads(sys.argv[1])
ray.init(address=args["address"], log_to_driver=False)
driver_node = ray.get_runtime_context().get_node_id()
weights = ftnb.put(np.arange(1, 101, dtype=np.float64))
settings = ftnb.put({"scale": 3.0})  # a global of train, below
for ref in (weights, settings):
    ftnb.get(ref)  # loaded here (get memoizes)...
    os.unlink(ref.path)  # ...and no file is left on the machine for a trial to read


def make_train(weights_ref):
    def train(config):  # refers to weights_ref (a closure) and to settings (a global)
        import ray

        values = ftnb.get(weights_ref)
        ftnb.report({"value": float(values.sum()) * ftnb.get(settings)["scale"],
                     "node": ray.get_runtime_context().get_node_id()})
    return train


grid = ftnb.run(
    make_train(weights), name="run",
    run_config=ftnb.RunConfig(name="run", storage_path=args["storage"], verbose=0,
                              executor=RayExecutor(args["address"], shared_storage=True),
                              failure_config=ftnb.FailureConfig(max_failures=0)))
print("ERRORS", [str(r.error) for r in grid if r.error], flush=True)
print("RESULT", json.dumps({**grid[0].metrics, "driver_node": driver_node}), flush=True)
"""


def test_refs_held_by_the_trainables_code_reach_a_trial_on_another_node(tmp_path: pathlib.Path,
                                                                         ray_cluster):
    # The driver's node is the head, which has no CPU: the trial runs on another node.
    out = _run_without_errors(tmp_path, CODE_REFS_DRIVER, ray_cluster)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["value"] == 3.0 * sum(range(1, 101))
    assert result["node"] != result["driver_node"]


PAYLOAD_READER = """
import pickle, sys
import cloudpickle
from ftnb.objects.store import supply

with open(sys.argv[1], "rb") as f:
    payload, objects = pickle.load(f)
for ref_id, obj in objects.items():  # what the actor does with the objects Ray brought
    supply(ref_id, obj)
spec = cloudpickle.loads(payload)
print("GOT", spec.trainable(spec.config), flush=True)
"""


def test_pickling_an_attempt_notes_every_ref_its_trainable_holds(tmp_path: pathlib.Path):
    """No cluster: the attempt's payload names the refs of the trainable's closure and of its
    config, and a process given their objects (as a Ray actor is) runs it with no file."""
    import os
    import pickle

    import ftnb
    from ftnb.execution.contract import AttemptSpec
    from ftnb.execution.ray_actor import dump_attempt
    from ftnb.storage import ExperimentPaths, Storage

    held, in_config = ftnb.put([1, 2, 3]), ftnb.put({"scale": 10})

    def make_train(ref):
        def train(config):  # a closure over a ref, as a notebook's factory makes
            return sum(ftnb.get(ref)) * ftnb.get(config["settings"])["scale"]
        return train

    experiment = ExperimentPaths.of(Storage(str(tmp_path / "runs")), "exp")
    spec = AttemptSpec(trial_id="t0", attempt=1, trainable=make_train(held),
                       config={"settings": in_config}, storage=experiment.storage,
                       experiment_dir=experiment.dir, experiment_name="exp", trial_dir_name="t0")
    payload, refs = dump_attempt(spec)
    assert set(refs) == {held.id, in_config.id}
    (tmp_path / "attempt.pkl").write_bytes(pickle.dumps(
        (payload, {ref_id: ftnb.get(ref) for ref_id, ref in refs.items()})))
    for ref in (held, in_config):
        os.unlink(ref.path)  # no file left for the reader to find
    process = run_script(tmp_path, PAYLOAD_READER, str(tmp_path / "attempt.pkl"))
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert "GOT 60" in out
