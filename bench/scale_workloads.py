"""Many trivial trials: how ftnb's driver scales with the number of trials (issue 15, "Scale").

``scale_trials`` runs experiments of 100, 2,000 and 10,000 trivial trials (one report each) on
the local executor and measures, for each size, the trials per second of ``fit()`` and the
driver's CPU per trial; for the largest, each state save's time and bytes against the number of
trials finished then, and ``ResultGrid.from_path`` of the finished experiment. Ray Tune runs the
same trials where it finishes them in the workload's time (its sizes: ``ray_sizes``).

``scale_simulation`` is the simulation behind ``docs/scale.md``: 10,000 trivial trials on the
in-process executor (threads: no process start-up, so the controller is what is left), with the
CPU of the controller's own thread per trial start, per report and per save.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from . import frameworks
from .procs import usable_cpus

__all__ = ["scale_simulation", "scale_trials", "trivial_trainable"]


def trivial_trainable(config: dict) -> None:
    """One report of a constant: the trial does as little as a trial can."""
    if config["framework"] == "ftnb":
        import ftnb

        ftnb.report({"loss": 1.0})
    else:
        from ray import tune

        tune.report({"loss": 1.0})


class SaveTimes:
    """Each state save of the driver in this process: seconds, bytes of the state file, and the
    trials finished then (``ExperimentState.save_changes`` wrapped while it is in use)."""

    def __init__(self) -> None:
        self.saves: list[tuple[int, float, int]] = []  # (finished, seconds, state file bytes)

    def __enter__(self) -> "SaveTimes":
        from ftnb.core.records import ExperimentState

        self._original = original = ExperimentState.save_changes
        saves = self.saves

        def timed(state: Any, paths: Any, changed: Any) -> None:
            start = time.perf_counter()
            original(state, paths, changed)
            elapsed = time.perf_counter() - start
            finished = sum(1 for t in state.trials if t.status == "TERMINATED")
            saves.append((finished, elapsed, len(state._files.last_bytes or b"")))

        ExperimentState.save_changes = timed
        return self

    def __exit__(self, *exc: Any) -> None:
        from ftnb.core.records import ExperimentState

        ExperimentState.save_changes = self._original

    def at(self, fraction: float, total: int) -> tuple[float, float]:
        """(median ms, median state bytes) of the saves made around ``fraction`` of the trials
        finished (within 10% of the trials)."""
        near = [(s, b) for f, s, b in self.saves if abs(f / total - fraction) <= 0.1]
        if not near:
            return float("nan"), float("nan")
        return (statistics.median(s for s, _ in near) * 1e3,
                statistics.median(b for _, b in near))


def _experiment(framework: str, storage_dir: str, name: str, trials: int, concurrent: int,
                executor: Any = None, reuse_actors: bool = False) -> tuple[float, float]:
    """Run ``trials`` trivial trials (ftnb: on ``executor``, default the local one); (fit's wall
    seconds, the driver's CPU seconds)."""
    if framework != "ftnb":
        cpu = time.process_time()
        run = frameworks.run_experiment(
            framework, trivial_trainable, storage_dir=storage_dir, name=name, trials=trials,
            max_concurrent=concurrent, config={"framework": framework},
            reuse_actors=reuse_actors)
        return run.fit_s, time.process_time() - cpu
    import ftnb

    tuner = ftnb.Tuner(
        trivial_trainable,
        param_space={"framework": "ftnb", "i": ftnb.grid_search(list(range(trials)))},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=concurrent),
        run_config=ftnb.RunConfig(name=name, storage_path=storage_dir, verbose=0,
                                  executor=executor),
        resources_per_trial={"cpu": 1},
    )
    cpu, start = time.process_time(), time.perf_counter()
    results = tuner.fit()
    fit_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    if results.num_terminated != trials:
        raise RuntimeError(f"{results.num_terminated}/{trials} trials terminated "
                           f"({results.num_errors} errored)")
    return fit_s, cpu_s


def scale_trials(framework: str, storage_dir: str, sizes: list, ray_sizes: list,
                 concurrent: int, reuse_actors: bool = False) -> dict:
    """100, 2,000 and 10,000 trivial trials on the local executor (1 CPU each, as many at once
    as CPUs): trials_per_s and the driver's CPU per trial at each size; state saves against
    the trials finished; ResultGrid.from_path of the largest.

    trials_per_s_N: N / fit()'s wall time. driver_cpu_ms_per_trial_N: the driver process's CPU
    (its controller, the executor's threads; not the trials' processes) per trial.
    rate_vs_smallest: trials_per_s at the largest size over that at the smallest (1.0: no
    slow-down with more trials). save_ms_at_P / state_kb_at_P (ftnb): the median save and state
    file around P% of the trials finished (the cost must not grow with them). from_path_s /
    from_path_cpu_s: the largest experiment read back with ResultGrid.from_path (ftnb) or
    ExperimentAnalysis (Ray Tune), in this process (its imports done): wall and CPU time.

    Ray Tune runs ``ray_sizes`` only: it starts about one trial a second here (ten with
    ``reuse_actors=True``), so 10,000 trials would take hours.
    """
    concurrent = min(concurrent, usable_cpus())
    sizes = sizes if framework == "ftnb" else ray_sizes
    figures: dict = {}
    rates = {}
    saves = SaveTimes() if framework == "ftnb" else None
    for n in sizes:
        if saves is not None and n == max(sizes):
            with saves:
                fit_s, cpu_s = _experiment(framework, storage_dir, f"scale{n}", n, concurrent)
        else:
            fit_s, cpu_s = _experiment(framework, storage_dir, f"scale{n}", n, concurrent,
                                       reuse_actors=reuse_actors)
        rates[n] = n / fit_s
        figures[f"trials_per_s_{n}"] = rates[n]
        figures[f"driver_cpu_ms_per_trial_{n}"] = cpu_s / n * 1e3
    figures["rate_vs_smallest"] = rates[max(sizes)] / rates[min(sizes)]
    largest = max(sizes)
    if saves is not None:
        for pct in (10, 50, 90):
            ms, size = saves.at(pct / 100, largest)
            figures[f"save_ms_at_{pct}pct"] = ms
            figures[f"state_kb_at_{pct}pct"] = size / 1e3
    figures["from_path_s"], figures["from_path_cpu_s"] = _from_path_s(
        framework, os.path.join(storage_dir, f"scale{largest}"))
    return figures


def _from_path_s(framework: str, path: str) -> tuple[float, float]:
    """The best of three reads of the finished experiment ``path`` (its results' grid): wall
    and CPU seconds (on a loaded machine the wall time is mostly waiting for a CPU)."""
    if framework == "ftnb":
        from ftnb import ResultGrid

        def read() -> Any:
            return ResultGrid.from_path(path)
    else:
        from ray.tune import ExperimentAnalysis

        def read() -> Any:
            return ExperimentAnalysis(path)
    best, best_cpu = float("inf"), float("inf")
    for _ in range(3):
        start, cpu = time.perf_counter(), time.process_time()
        read()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best, best_cpu


def scale_simulation(framework: str, storage_dir: str, trials: int, concurrent: int) -> dict:
    """The simulation of docs/scale.md: `trials` trivial trials on the in-process executor,
    the CPU of the controller's thread accounted to what it did.

    controller_cpu_ms_per_start / _per_report / _per_exit: the CPU (thread time) of starting an
    attempt (its record, its spec, the executor's start), of handling a report, of handling an
    attempt's end; save_ms_p50 / save_ms_max: the journaled state saves; state_kb_max: the
    largest state file written while it ran; trials_per_s: the whole run's.
    """
    from ftnb.core.controller import Controller
    from ftnb.execution.inprocess import InProcessExecutor

    spent = {"start": [0.0, 0], "result": [0.0, 0], "exit": [0.0, 0]}
    originals = {"_start_attempt": Controller._start_attempt, "_on_result": Controller._on_result,
                 "_on_exit": Controller._on_exit}
    keys = {"_start_attempt": "start", "_on_result": "result", "_on_exit": "exit"}

    def timed(name: str) -> Any:
        original, key = originals[name], keys[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[key][0] += time.thread_time() - start
                spent[key][1] += 1
        return call

    for name in originals:
        setattr(Controller, name, timed(name))
    try:
        with SaveTimes() as saves:
            fit_s, _ = _experiment("ftnb", storage_dir, "simulation", trials, concurrent,
                                   executor=InProcessExecutor(output_events=False))
    finally:
        for name, original in originals.items():
            setattr(Controller, name, original)
    save_s = [s for _, s, _ in saves.saves]
    return {
        "trials_per_s": trials / fit_s,
        "controller_cpu_ms_per_start": spent["start"][0] / max(1, spent["start"][1]) * 1e3,
        "controller_cpu_ms_per_report": spent["result"][0] / max(1, spent["result"][1]) * 1e3,
        "controller_cpu_ms_per_exit": spent["exit"][0] / max(1, spent["exit"][1]) * 1e3,
        "saves": len(save_s),
        "save_ms_p50": statistics.median(save_s) * 1e3 if save_s else float("nan"),
        "save_ms_max": max(save_s) * 1e3 if save_s else float("nan"),
        "state_kb_max": max((b for _, _, b in saves.saves), default=0) / 1e3,
    }


def scale_s3_requests(framework: str, storage_dir: str, trials: int, concurrent: int) -> dict:
    """`trials` trivial trials on the in-process executor with the experiment on an S3-protocol
    server (moto, in this process), every S3 request counted by operation: the figures that
    docs/scale.md projects to 10,000 trials and 1,000 nodes.

    puts_per_trial / gets_per_trial / lists_per_trial / deletes_per_trial / heads_per_trial:
    requests over the whole run (driver and trials, state saves included) per trial;
    state_puts_per_save: PUTs of one journaled save (the state, its previous generation, a
    segment); saves: the journaled saves made; from_path_requests: the requests of one
    ResultGrid.from_path of the finished experiment, and from_path_s its time.
    """
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    counts: dict[str, int] = {}
    original = s3fs.S3FileSystem._call_s3

    async def counted(self: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(method, "__name__", str(method))
        counts[name] = counts.get(name, 0) + 1
        return await original(self, method, *args, **kwargs)

    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="k", secret="s",
                               use_listings_cache=False, skip_instance_cache=True)
        fs.mkdir("scale")
        s3fs.S3FileSystem._call_s3 = counted
        import ftnb
        from ftnb.execution.inprocess import InProcessExecutor

        with SaveTimes() as saves:
            tuner = ftnb.Tuner(
                trivial_trainable,
                param_space={"framework": "ftnb", "i": ftnb.grid_search(list(range(trials)))},
                tune_config=ftnb.TuneConfig(max_concurrent_trials=concurrent),
                run_config=ftnb.RunConfig(name="s3", storage_path="s3://scale/runs",
                                          storage_filesystem=fs, verbose=0,
                                          executor=InProcessExecutor(output_events=False)),
                resources_per_trial={"cpu": 1},
            )
            tuner.fit()
        run = dict(counts)
        counts.clear()
        start = time.perf_counter()
        grid = ftnb.ResultGrid.from_path("s3://scale/runs/s3", fs)
        from_path_s = time.perf_counter() - start
        assert grid.num_terminated == trials
        reading = sum(counts.values())
    finally:
        s3fs.S3FileSystem._call_s3 = original
        server.stop()

    def per_trial(*names: str) -> float:
        return sum(run.get(n, 0) for n in names) / trials

    return {
        "puts_per_trial": per_trial("put_object"),
        "gets_per_trial": per_trial("get_object"),
        "heads_per_trial": per_trial("head_object"),
        "lists_per_trial": per_trial("list_objects_v2", "list_objects"),
        "deletes_per_trial": per_trial("delete_object", "delete_objects"),
        "saves": len(saves.saves),
        "from_path_requests": reading,
        "from_path_s": from_path_s,
    }
