"""ftnb.WorkerGroup on Ray (issue 16): workers as Ray actors on the real multi-node cluster of
``ray_cluster`` (a head without CPUs, three 1-CPU nodes).

The workers spread over the nodes; a node removed during a map fails its worker's call with kind
node_lost while the others' results come back, and the next map recreates it on a node left
with the pushed state. A worker whose process is SIGKILLed, that raises or that hangs past
call_timeout_s fails alone; validate=True names the worker whose factory failed. Inside a
trainable on the Ray executor the workers are actors without being asked to, and they die with
the trial's actor when it is SIGKILLed; a SIGKILLed script takes its workers with it too.

The drivers run as child processes that connect by the cluster's address (this process never
connects, see conftest.py); a test that removes a node adds one back.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from procs import pid_alive, run_script, wait_for

pytestmark = [pytest.mark.ray]

COMMON = """
import json, os, signal, sys, threading, time
import ray
import ftnb
from ftnb.elastic import worker_index


class Runner:
    def __init__(self, index):
        self.index = index
        self.states = []

    def set_state(self, state):
        self.states.append(state)


def whoami(runner):
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
            "index": worker_index(), "factory_index": runner.index, "states": runner.states}


def wait_in_call(runner, folder, release=None):
    # Says it is in its call, then waits for `release` (or for ever: the test kills something).
    open(os.path.join(folder, f"busy-{worker_index()}-{os.getpid()}"), "w").close()
    while release is None or not os.path.exists(release):
        time.sleep(0.02)
    return whoami(runner)


def show(results):
    return json.dumps([{"index": r.index, "ok": r.ok, "value": r.value,
                        "kind": (r.error or {}).get("kind"),
                        "message": (r.error or {}).get("message")} for r in results])
"""


def _lines(proc) -> dict:
    """Read the driver's ``KEY json`` lines until it ends; {KEY: value}."""
    out, _ = proc.communicate(timeout=120)
    found = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key.isupper() and rest[:1] in "[{\"":
            found[key] = json.loads(rest)
    return found | {"_out": out}


def _read_line(proc, key: str):
    """The next ``KEY json`` line of a running driver."""
    seen = []
    for line in proc.stdout:
        if line.startswith(key + " "):
            return json.loads(line.split(" ", 1)[1])
        seen.append(line)
    raise AssertionError(f"the driver ended without printing {key}:\n" + "".join(seen[-40:]))


def _busy(folder, n: int) -> list[int]:
    """The pids of the workers in their call, once ``n`` are."""
    def found():
        names = [p for p in os.listdir(folder) if p.startswith("busy-")]
        return len(names) >= n and sorted(names)
    return [int(name.split("-")[2]) for name in wait_for(found, 60, f"{n} workers in a call")]


def _wait_dead(pids, what: str) -> None:
    wait_for(lambda: not any(pid_alive(p) for p in pids), 30, what)


def _kill(proc) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


LOST_NODE = COMMON + """
# A lost node's actors can be gone before the GCS's health checks call the node dead: Ray then
# waits a moment (1 s) for the cause and, under load, raises ActorUnavailableError with none,
# the node still listed alive (CI saw it). 0 makes that case certain here: it must still be
# node_lost.
os.environ["RAY_timeout_ms_task_wait_for_death_info"] = "0"
ray.init(address=sys.argv[1], log_to_driver=False)
folder = sys.argv[2]
pushed = []


def get_state():
    pushed.append(f"v{len(pushed) + 1}")
    return pushed[-1]


group = ftnb.WorkerGroup(Runner, 3, executor="ray", resources_per_worker={"cpu": 0.5},
                         get_state=get_state)
print("FIRST", show(group.map(whoami)), flush=True)
# The test removes worker 1's node while the three are in this call, then releases them.
print("LOST", show(group.map(wait_in_call, folder, os.path.join(folder, "release"))), flush=True)
print("STATS", json.dumps(group.stats), flush=True)
again = group.map(whoami)
for name in os.listdir(folder):  # (before AGAIN: the test then waits for new busy marks)
    os.unlink(os.path.join(folder, name))
print("AGAIN", show(again), flush=True)
group.map(wait_in_call, folder)  # the test SIGKILLs this script meanwhile
"""


def test_workers_spread_over_nodes_and_a_lost_nodes_worker_comes_back_on_another(
        tmp_path, ray_cluster):
    folder = tmp_path / "marks"
    folder.mkdir()
    proc = run_script(tmp_path, LOST_NODE, ray_cluster.address, str(folder))
    try:
        first = _read_line(proc, "FIRST")
        assert [(r["ok"], r["value"]["index"], r["value"]["factory_index"]) for r in first] \
            == [(True, i, i) for i in range(3)]
        nodes = [r["value"]["node"] for r in first]
        assert len(set(nodes)) == 3  # SPREAD: one worker on each node
        assert os.getpid() not in [r["value"]["pid"] for r in first]

        _busy(folder, 3)
        lost_node = next(n for n in ray_cluster.list_all_nodes() if n.node_id == nodes[1])
        ray_cluster.remove_node(lost_node, allow_graceful=False)
        (folder / "release").write_text("")

        lost = _read_line(proc, "LOST")
        assert [(r["index"], r["ok"]) for r in lost] == [(0, True), (1, False), (2, True)]
        assert lost[1]["kind"] == "node_lost", lost[1]
        assert "its node" in lost[1]["message"]
        stats = _read_line(proc, "STATS")
        assert stats["worker_failures_node_lost"] == 1 and stats["workers_healthy"] == 2

        again = _read_line(proc, "AGAIN")
        assert [r["ok"] for r in again] == [True] * 3
        recreated = again[1]["value"]
        assert (recreated["index"], recreated["factory_index"]) == (1, 1)
        assert recreated["node"] in (nodes[0], nodes[2])  # on a node left
        assert recreated["states"] == ["v1"]  # pushed before it took work
        assert [again[i]["value"]["states"] for i in (0, 2)] == [[], []]
        assert [again[i]["value"]["pid"] for i in (0, 2)] == \
            [first[i]["value"]["pid"] for i in (0, 2)]

        # The script SIGKILLed in a map: Ray ends the actors it owned.
        workers = _busy(folder, 3)
        proc.kill()
        _wait_dead(workers, "the killed script's worker actors to be gone")
    finally:
        _kill(proc)
        ray_cluster.add_node(num_cpus=1)  # the next test finds three worker nodes again
        ray_cluster.wait_for_nodes()


FAILURES = COMMON + """
import ray._private.state
ray.init(address=sys.argv[1], log_to_driver=False)
folder = sys.argv[2]
state = ["v0"]


def misbehave(runner):
    index = worker_index()
    if index == 0:
        raise ValueError("planned failure in worker 0")
    if index == 1:
        threading.Event().wait()  # hangs until the group kills it
    os.kill(os.getpid(), signal.SIGKILL)


def actors():
    # The pids of the live worker actors.
    return [a["Pid"] for a in ray._private.state.actors().values()
            if a["ActorClassName"] == "_WorkerActor" and a["State"] == "ALIVE" and a["Pid"]]


def started(old, n):
    # The pids of `n` live worker actors not in `old`, once there are (60 s at most).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = [p for p in actors() if p not in old]
        if len(new) >= n:
            return new
        time.sleep(0.05)
    return []


with ftnb.WorkerGroup(Runner, 3, executor="ray", resources_per_worker={"cpu": 0.5},
                      call_timeout_s=3.0, get_state=lambda: state[0]) as group:
    before = group.map(whoami)
    print("BEFORE", show(before), flush=True)
    print("FAILED", show(group.map(misbehave)), flush=True)
    print("STATS", json.dumps(group.stats), flush=True)
    # The replacements' actors start as the failures are seen, before the next map.
    print("STARTED", json.dumps(started([r.value["pid"] for r in before], 3)), flush=True)
    state[0] = "v1"
    again = group.map(whoami)
    print("AGAIN", show(again), flush=True)
    # A replacement still starting when the group closes is ended with it.
    group.map(lambda runner: worker_index() == 2 and os.kill(os.getpid(), signal.SIGKILL))
deadline = time.monotonic() + 30
while actors() and time.monotonic() < deadline:
    time.sleep(0.05)
print("ALIVE", json.dumps(actors()), flush=True)


def make(index):
    if index == 1:
        raise RuntimeError("no simulator license on this worker")
    return Runner(index)


try:
    ftnb.WorkerGroup(make, 3, executor="ray", resources_per_worker={"cpu": 0.5})
except ftnb.WorkerGroupError as exc:
    print("REFUSED", json.dumps(str(exc)), flush=True)
try:
    ftnb.WorkerGroup(Runner, 2, executor="ray", resources_per_worker={"cpu": 1, "tpu_v9": 1})
except ValueError as exc:
    print("NO_ROOM", json.dumps(str(exc)), flush=True)
"""


def test_a_worker_that_raises_hangs_or_is_sigkilled_fails_alone_and_validate_names_it(
        tmp_path, ray_cluster):
    proc = run_script(tmp_path, FAILURES, ray_cluster.address, str(tmp_path))
    try:
        found = _lines(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 0, found["_out"]
    before = [r["value"]["pid"] for r in found["BEFORE"]]
    raised, hung, killed = found["FAILED"]
    assert (raised["ok"], raised["kind"], raised["message"]) == \
        (False, "exception", "planned failure in worker 0")
    assert (hung["ok"], hung["kind"]) == (False, "timeout")
    assert "call_timeout_s=3.0" in hung["message"]
    assert (killed["ok"], killed["kind"]) == (False, "signal"), killed
    stats = found["STATS"]
    assert (stats["worker_failures_exception"], stats["worker_failures_timeout"],
            stats["worker_failures_signal"], stats["workers_healthy"],
            stats["worker_restarts"]) == (1, 1, 1, 0, 3)
    # The three were ended (ray.kill for the first two) and recreated in their slots: their
    # new actors were up before the next map, which they answered with the state of then.
    _wait_dead(before, "the failed workers' actors to be gone")
    started = found["STARTED"]
    assert len(started) == 3 and set(started).isdisjoint(before)
    again = found["AGAIN"]
    assert [(r["ok"], r["value"]["index"]) for r in again] == [(True, i) for i in range(3)]
    assert sorted(r["value"]["pid"] for r in again) == sorted(started)
    assert [r["value"]["states"] for r in again] == [["v1"]] * 3
    assert found["ALIVE"] == []  # worker 2's replacement, starting at close, too

    refused = found["REFUSED"]
    assert "1 of 3 workers failed to start" in refused
    assert "worker 1: exception RuntimeError: no simulator license" in refused
    assert "validate=False" in refused
    no_room = found["NO_ROOM"]
    assert "'tpu_v9': 1.0" in no_room and "no alive node" in no_room and "Fix:" in no_room


TUNER = COMMON + """
import ray._private.state
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths

folder = sys.argv[1]


def trainable(config):
    attempt = ftnb.get_context().attempt
    # No executor given: in a trial on the Ray executor the workers are Ray actors.
    with ftnb.WorkerGroup(Runner, 2, resources_per_worker={"cpu": 0.5}) as group:
        workers = [r.value for r in group.map(whoami)]
        path = os.path.join(config["dir"], f"attempt-{attempt}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"trial": os.getpid(), "executor": group.executor,
                       "workers": workers}, f)
        os.replace(path + ".tmp", path)
        if attempt == 1:
            group.map(wait_in_call, config["dir"])  # the test SIGKILLs this trial meanwhile
        ftnb.report({"workers": len(workers), **group.stats})


results = ftnb.Tuner(trainable, param_space={"dir": folder}, run_config=ftnb.RunConfig(
    storage_path=folder, name="elastic", verbose=0, executor="ray",
    failure_config=ftnb.FailureConfig(max_failures=1))).fit()
(trial,) = ExperimentState.load(ExperimentPaths.at(results.experiment_path)).trials
print("TRIAL", json.dumps({"status": trial.status, "kinds": [f.kind for f in trial.failures],
                           "workers": results[0].metrics["workers"]}), flush=True)
# What the cluster's GCS says of the workers' actors (the trial's two groups).
if not ray.is_initialized():
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
deadline = time.monotonic() + 30
while True:
    actors = [a for a in ray._private.state.actors().values()
              if a["ActorClassName"] == "_WorkerActor" and a["State"] != "DEAD"]
    if not actors or time.monotonic() > deadline:
        break
    time.sleep(0.1)
print("ALIVE", json.dumps([a["Pid"] for a in actors]), flush=True)
"""


def test_a_trials_group_on_the_ray_executor_is_actors_that_die_with_the_trial(
        tmp_path, ray_cluster):
    folder = tmp_path / "marks"
    folder.mkdir()
    proc = run_script(tmp_path, TUNER, str(folder),
                      env={"RAY_ADDRESS": ray_cluster.address, "FTNB_SHARED_STORAGE": "1"})
    try:
        first = json.loads(wait_for(lambda: (p := folder / "attempt-1.json").exists()
                                    and p.read_text(), 90, "the first attempt's workers"))
        assert first["executor"] == "ray"
        workers = [w["pid"] for w in first["workers"]]
        assert first["trial"] not in workers and all(w["node"] for w in first["workers"])
        assert sorted(_busy(folder, 2)) == sorted(workers)
        os.kill(first["trial"], signal.SIGKILL)  # the trial's actor process
        _wait_dead(workers, "the SIGKILLed trial's worker actors to be gone")
        found = _lines(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 0, found["_out"]
    second = json.loads((folder / "attempt-2.json").read_text())
    assert second["executor"] == "ray"
    assert set(w["pid"] for w in second["workers"]).isdisjoint(workers)
    assert found["TRIAL"] == {"status": "TERMINATED", "kinds": ["signal"], "workers": 2}
    assert found["ALIVE"] == []


SPARE = COMMON + """
import ray._private.state
ray.init(address=sys.argv[1], log_to_driver=False)
pushed = []


def get_state():
    pushed.append(f"v{len(pushed) + 1}")
    return pushed[-1]


def die(runner, victim):
    if worker_index() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    return whoami(runner)


def actors():
    # The pids of the live worker actors: the group's workers and its spare.
    return [a["Pid"] for a in ray._private.state.actors().values()
            if a["ActorClassName"] == "_WorkerActor" and a["State"] == "ALIVE" and a["Pid"]]


def new_spare(workers, old=()):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        spares = [p for p in actors() if p not in workers and p not in old]
        if spares:
            return spares
        time.sleep(0.05)
    return []


def pids(results):
    return [r.value["pid"] for r in results]


with ftnb.WorkerGroup(Runner, 2, executor="ray", resources_per_worker={"cpu": 0.5},
                      spare_workers=1, get_state=get_state) as group:
    first = pids(group.map(whoami))
    print("FIRST", json.dumps({"workers": first, "spares": new_spare(first)}), flush=True)
    print("LOST", show(group.map(die, 1)), flush=True)
    again = group.map(whoami)
    print("AGAIN", show(again), flush=True)
    spares = new_spare(pids(again), first)
    print("SPARE", json.dumps(spares), flush=True)
    # A spare that died is passed over: the next failed slot gets a new actor.
    os.kill(spares[0], signal.SIGKILL)
    group.map(die, 0)
    third = group.map(whoami)
    print("THIRD", show(third), flush=True)
    print("SPARE3", json.dumps(new_spare(pids(third), first + spares)), flush=True)
    print("STATS", json.dumps(group.stats), flush=True)
deadline = time.monotonic() + 30
while actors() and time.monotonic() < deadline:
    time.sleep(0.05)
print("ALIVE", json.dumps(actors()), flush=True)
"""


def test_a_spare_takes_a_failed_workers_slot_with_the_state_and_a_new_spare_starts(
        tmp_path, ray_cluster):
    proc = run_script(tmp_path, SPARE, ray_cluster.address)
    try:
        found = _lines(proc)
    finally:
        _kill(proc)
    assert proc.returncode == 0, found["_out"]
    workers, (spare,) = found["FIRST"]["workers"], found["FIRST"]["spares"]
    assert [(r["ok"], r["kind"]) for r in found["LOST"]] == [(True, None), (False, "signal")]
    again = [r["value"] for r in found["AGAIN"]]
    # The spare's process took slot 1, built its object for that index, and got the state
    # before its first call; worker 0 is untouched.
    assert (again[1]["pid"], again[1]["index"], again[1]["factory_index"]) == (spare, 1, 1)
    assert again[1]["states"] == ["v1"]
    assert (again[0]["pid"], again[0]["states"]) == (workers[0], [])
    (spare2,) = found["SPARE"]  # a new one, started in the background
    assert spare2 not in workers + [spare]
    # The new spare was SIGKILLed: slot 0 got a new actor instead, with the state.
    third = [r["value"] for r in found["THIRD"]]
    assert [r["ok"] for r in found["THIRD"]] == [True, True]
    assert third[0]["pid"] not in (workers[0], spare2) and third[0]["states"] == ["v2"]
    assert third[1]["pid"] == spare
    (spare3,) = found["SPARE3"]
    assert spare3 not in (spare, spare2, third[0]["pid"])
    stats = found["STATS"]
    assert (stats["worker_restarts"], stats["worker_failures_signal"],
            stats["workers_healthy"]) == (2, 2, 2)
    assert found["ALIVE"] == []  # the spare ended with the group
