"""ftnb on a Ray cluster against Ray Tune on the same cluster (issue 15).

Each repetition starts a real multi-node Ray cluster on this machine (``ray.cluster_utils``: a
head without CPUs and worker nodes of one CPU each, the health checks tuned as
docs/how-to/ray-clusters.md advises, so a lost node is noticed in about 1.5 s instead of Ray's
default 14 s), runs one framework's experiment on it from this process (ftnb with
``RunConfig(executor=RayExecutor(address, shared_storage=True))``, Ray Tune after
``ray.init(address)``), and shuts it down. The storage folder is on this machine's disk, which
every node of the cluster shares.

The workloads are registered in :mod:`bench.workloads`; the trainables are
:mod:`bench.trainables`' (the same for both frameworks).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional

from . import frameworks
from .trainables import checkpointing_trainable, read_events, reporting_trainable

__all__ = ["ray_first_result", "ray_many_trials", "ray_node_loss"]

#: The tuned health checks of docs/how-to/ray-clusters.md (and of the tests' cluster): a node that
#: stops answering is declared dead after 3 missed checks 0.5 s apart.
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_timeout_ms": 500, "health_check_initial_delay_ms": 0}


@contextlib.contextmanager
def local_cluster(worker_nodes: int) -> Iterator[Any]:
    """A Ray cluster on this machine: a head without CPUs (the driver's node) and
    ``worker_nodes`` nodes of 1 CPU each; shut down, with this process's connection, on exit."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # A raylet waits 30 s for its node's agents to start, then aborts: not enough on a 2-CPU
    # machine under heavy load (the cluster's start is not timed).
    os.environ.setdefault("RAY_agent_register_timeout_ms", "300000")
    cluster = _start_cluster(worker_nodes)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def _patient_node_registration(wait_s: float) -> Iterator[None]:
    """Ray gives a node it starts a fixed 30 s to register with the GCS (``ray._private.node``),
    which a 2-CPU machine under heavy load does not always meet: its lookup retries here for
    up to ``wait_s``. Only the cluster's start, which no figure times, waits so."""
    import ray._private.services as services

    original = services.get_node

    def get_node(gcs_address: str, node_id: str) -> Any:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return original(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = get_node
    try:
        yield
    finally:
        services.get_node = original


def _start_cluster(worker_nodes: int, tries: int = 2) -> Any:
    """Start the cluster of :func:`local_cluster` (patiently, and again if that fails: a busy
    machine's trouble, not a figure)."""
    from ray.cluster_utils import Cluster

    for attempt in range(tries):
        cluster = Cluster()
        try:
            with _patient_node_registration(180):
                # (The first node added is the head.)
                cluster.add_node(num_cpus=0, include_dashboard=False,
                                 _system_config=HEALTH_CHECKS)
                for _ in range(worker_nodes):
                    cluster.add_node(num_cpus=1)
                cluster.wait_for_nodes()
            return cluster
        except Exception:
            cluster.shutdown()
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _connect(framework: str, cluster: Any) -> Any:
    """What the framework's driver runs the experiment with: ftnb an executor of the cluster
    (it connects on its first attempt), Ray Tune a connection made here."""
    if framework == "ftnb":
        from ftnb.execution.ray import RayExecutor

        return RayExecutor(cluster.address, shared_storage=True)
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    return None


def ray_many_trials(framework: str, storage_dir: str, trials: int, reports: int,
                    concurrent: int, nodes: int) -> dict:
    """A grid of short trials (each reports a few times), 1 CPU each, on a cluster of `nodes`
    one-CPU worker nodes; every attempt is a Ray actor of its own (Ray Tune's default).

    fit_s: wall time of fit() (the cluster already up, the driver connected for Ray Tune; for
    ftnb its first attempt connects); trials_per_s and results_per_s follow from it.
    """
    with local_cluster(nodes) as cluster:
        executor = _connect(framework, cluster)
        out_dir = os.path.join(storage_dir, "out")
        os.makedirs(out_dir)
        run = frameworks.run_experiment(
            framework, reporting_trainable, storage_dir=storage_dir, name="many",
            trials=trials, max_concurrent=concurrent, executor=executor,
            config={"framework": framework, "reports": reports, "out_dir": out_dir})
    return {"fit_s": run.fit_s, "trials_per_s": trials / run.fit_s,
            "results_per_s": trials * reports / run.fit_s}


def _node_of_process(cluster: Any, pid: int) -> Any:
    """The cluster's node whose raylet started process ``pid`` (a Ray worker is the raylet's
    child)."""
    import psutil

    ancestors = {p.pid for p in psutil.Process(pid).parents()}
    for node in cluster.list_all_nodes():
        raylet = node.all_processes["raylet"][0].process.pid
        if raylet in ancestors:
            return node
    raise RuntimeError(f"process {pid} is not a worker of any node of the cluster")


class _NodeRemover(threading.Thread):
    """Removes the node of the trial's process once it has reported iteration `at` (the
    events of bench.trainables), as a cloud takes a machine away: its processes SIGKILLed."""

    def __init__(self, cluster: Any, out_dir: str, at: int, deadline_s: float = 300) -> None:
        super().__init__(name="bench-node-remover", daemon=True)
        self.cluster, self.out_dir, self.at = cluster, out_dir, at
        self.deadline = time.monotonic() + deadline_s
        self.removed_at: Optional[float] = None
        self.pid: Optional[int] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set() and time.monotonic() < self.deadline:
                reached = [e for e in read_events(self.out_dir)
                           if e["event"] == "iteration" and e["iteration"] >= self.at]
                if reached:
                    self.pid = reached[0]["pid"]
                    node = _node_of_process(self.cluster, self.pid)
                    self.removed_at = time.time()
                    self.cluster.remove_node(node, allow_graceful=False)
                    return
                time.sleep(0.01)
        except BaseException as exc:  # reported by the workload
            self.error = exc


def _ghost_writes(events: list[dict], lost_pid: int, removed_at: float) -> int:
    """Reports acknowledged to the lost node's process (iteration events: each is logged once
    its report returned, i.e. its row and checkpoint were persisted) after its replacement
    started."""
    restarted = min((e["t"] for e in events if e["event"] == "start" and e["pid"] != lost_pid
                     and e["t"] >= removed_at), default=None)
    if restarted is None:
        return 0
    return sum(1 for e in events if e["event"] == "iteration" and e["pid"] == lost_pid
               and e["t"] >= restarted)


def ray_node_loss(framework: str, storage_dir: str, iterations: int, iter_s: float,
                  lose_at: int, nodes: int, max_failures: int) -> dict:
    """One trial checkpointing every iteration on a cluster of `nodes` one-CPU worker nodes;
    once it reported iteration `lose_at`, its node is removed (its raylet and processes
    SIGKILLed), and it restarts on another node from its latest checkpoint.

    to_first_report_s: from the removal to the first report() of the restarted attempt
    returning (its first `iter_s` iteration included); to_restart_s: to the restarted
    trainable's first line. iterations_twice: iterations reported with a checkpoint twice (0:
    it resumed right after its last checkpoint). ghost_writes: reports of the lost node's
    process acknowledged after its replacement started (0: nothing of it was written then).
    """
    from .workloads import _iterations_twice

    with local_cluster(nodes) as cluster:
        executor = _connect(framework, cluster)
        out_dir = os.path.join(storage_dir, "out")
        os.makedirs(out_dir)
        remover = _NodeRemover(cluster, out_dir, lose_at)
        remover.start()
        try:
            frameworks.run_experiment(
                framework, checkpointing_trainable, storage_dir=storage_dir, name="loss",
                trials=1, max_concurrent=1, max_failures=max_failures, executor=executor,
                config={"framework": framework, "out_dir": out_dir, "iterations": iterations,
                        "iter_s": iter_s})
        finally:
            remover.done.set()
            remover.join()
    if remover.error is not None:
        raise remover.error
    if remover.removed_at is None:
        raise RuntimeError(f"{framework}: the trial finished before its node was removed")
    events = read_events(out_dir)
    after = [e for e in events if e["t"] >= remover.removed_at and e["pid"] != remover.pid]
    first = next(e for e in after if e["event"] == "iteration")
    restart = next(e for e in after if e["event"] == "start")
    return {
        "to_first_report_s": first["t"] - remover.removed_at,
        "to_restart_s": restart["t"] - remover.removed_at,
        "iterations_twice": _iterations_twice(events),
        "ghost_writes": _ghost_writes(events, remover.pid, remover.removed_at),
    }


def _first_iteration_at(out_dir: str, timeout_s: float, alive: Callable[[], bool]) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        times = [e["t"] for e in read_events(out_dir) if e["event"] == "iteration"]
        if times:
            return min(times)
        if not alive():
            break
        time.sleep(0.005)
    raise RuntimeError(f"no first result in {out_dir} (the experiment ended, or "
                       f"{timeout_s} s passed)")


def ray_first_result(framework: str, storage_dir: str, iterations: int, nodes: int) -> dict:
    """From a notebook's call to the first result, on a running cluster of `nodes` one-CPU
    worker nodes: ftnb with ``ftnb.launch(..., run_config=RunConfig(executor="ray"))`` and
    ``RAY_ADDRESS`` set (what ``%ftrun --executor ray`` calls: a detached supervisor that
    connects to the cluster and starts the trial's actor), Ray Tune with ``ray.init(address)``
    and ``Tuner(...).fit()``.

    to_first_result_s: until the trial's first report() returned (its row persisted);
    complete_s: until the experiment was over (ftnb: ``handle.wait()`` returned).
    """
    with local_cluster(nodes) as cluster:
        out_dir = os.path.join(storage_dir, "out")
        os.makedirs(out_dir)
        config = {"framework": framework, "out_dir": out_dir, "iterations": iterations,
                  "iter_s": 0.0, "i": 0}
        if framework == "ftnb":
            import ftnb

            os.environ["RAY_ADDRESS"] = cluster.address
            os.environ["FTNB_SHARED_STORAGE"] = "1"
            start = time.time()
            handle = ftnb.launch(
                checkpointing_trainable, param_space=config, quiet=True,
                resources_per_trial={"cpu": 1},
                run_config=ftnb.RunConfig(name="first", storage_path=storage_dir, verbose=0,
                                          executor="ray"))
            first = _first_iteration_at(out_dir, 300, handle.is_live)
            grid = handle.wait(timeout=300)
            complete = time.time()
            if grid.num_errors or grid.num_terminated != 1:
                raise RuntimeError(f"ftnb.launch on Ray: {grid.errors}")
        else:
            import ray.tune

            start = time.time()
            ray.init(address=cluster.address, log_to_driver=False)
            from .trainables import ray_api

            api = ray_api()
            grid = ray.tune.Tuner(
                ray.tune.with_resources(checkpointing_trainable, {"cpu": 1}),
                param_space=config,
                run_config=api.RunConfig(name="first", storage_path=storage_dir,
                                         verbose=0)).fit()
            complete = time.time()
            if grid.num_errors:
                raise RuntimeError(f"Ray Tune: {grid.errors}")
            first = _first_iteration_at(out_dir, 1, lambda: False)
    return {"to_first_result_s": first - start, "complete_s": complete - start}

