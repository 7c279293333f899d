"""The workloads, their registry, and the targets the table checks.

A workload is ``fn(framework, storage_dir, **size) -> {figure: number}``, registered with
:func:`workload` together with its full and ``--quick`` sizes, the framework variants it runs
for (:class:`Variant`) and its :class:`Target` s. Figure names end in their unit (``_ms``,
``_s``, ``_per_s``, ``_mb``). The trainables live in :mod:`bench.trainables`; they leave their
own measurements in the benchmark's ``out`` folder, which the workload reads once the
experiment is over.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import frameworks
from .procs import TreeSampler, subprocess_env, usable_cpus
from .trainables import (
    checkpoint_trainable,
    checkpointing_trainable,
    output_path,
    percentile,
    read_events,
    reporting_trainable,
    throughput_trainable,
)

__all__ = ["WORKLOADS", "Target", "Variant", "Workload", "percentile", "run_in_storage"]


#: What a framework's variant needs to import, by default (Variant.needs overrides it), and
#: what the table's notes call it.
NEEDS = {"ftnb": "ftnb", "ray": "ray.tune", "torchrun": "torch.distributed.run",
         "optuna": "optuna"}
MODULE_NAMES = {"ray.tune": "Ray Tune", "ray.train.torch": "Ray Train",
                "torch.distributed.run": "torchrun", "torch": "torch", "optuna": "Optuna"}


@dataclass(frozen=True)
class Variant:
    """One way to run a workload: a framework, and keyword arguments of its own (Ray's
    ``reuse_actors=True``). ``label`` names a non-default variant in the table. ``needs``: the
    module it cannot run without (default ``NEEDS[framework]``); a variant whose module does
    not import is skipped with a note."""

    framework: str
    label: str = ""
    params: dict = field(default_factory=dict)
    needs: str = ""

    @property
    def key(self) -> str:
        return f"{self.framework}[{self.label}]" if self.label else self.framework

    @property
    def module(self) -> str:
        return self.needs or NEEDS[self.framework]


FTNB, RAY = Variant("ftnb"), Variant("ray")


@dataclass(frozen=True)
class Target:
    """A goal for one figure: ``ratio>=`` / ``ratio<=`` bound the ratio of ftnb's figure to
    framework ``against``'s (default Ray's, the variant labelled ``ray_label``), ``ftnb>=`` /
    ``ftnb<=`` bound ftnb's own figure."""

    figure: str
    rule: str
    bound: float
    ray_label: str = ""
    against: str = "ray"

    def describe(self, explicit: bool = False) -> str:
        """``ratio<=0.1`` (against Ray), ``ftnb/torchrun<=0.3`` (against another framework, or
        against Ray when ``explicit``: a row compared with several), ``ftnb<=0``."""
        if self.rule.startswith("ratio") and (explicit or self.against != "ray"):
            return f"ftnb/{self.against}{self.rule[-2:]}{self.bound:g}"
        return f"{self.rule}{self.bound:g}"

    def met(self, ftnb: Optional[float], other: Optional[float]) -> Optional[bool]:
        """Whether the medians meet it (``other``: the median of ``against``); None when a
        figure it needs is missing."""
        subject, rule = self.rule[:-2], self.rule[-2:]
        if ftnb is None or (subject == "ratio" and not other):
            return None
        value = ftnb / other if subject == "ratio" else ftnb
        return value >= self.bound if rule == ">=" else value <= self.bound


@dataclass
class Workload:
    name: str
    fn: Callable[..., dict]
    description: str
    full: dict
    quick: dict
    variants: tuple = (FTNB, RAY)
    targets: tuple = ()
    timeout_s: float = 600  # for one repetition (its fresh process)

    def params(self, quick: bool) -> dict:
        return dict(self.quick if quick else self.full)

    @property
    def others(self) -> list[str]:
        """The frameworks ftnb is compared with, in the order of the table's columns."""
        from . import FRAMEWORKS

        present = {v.framework for v in self.variants}
        return [f for f in FRAMEWORKS if f != "ftnb" and f in present]


WORKLOADS: dict[str, Workload] = {}


def workload(name: str, *, full: dict, quick: dict, variants: tuple = (FTNB, RAY),
             targets: tuple = (), timeout_s: float = 600):
    """Register ``fn`` as workload ``name``; its docstring's first paragraph describes it."""

    def register(fn: Callable[..., dict]) -> Callable[..., dict]:
        summary = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        WORKLOADS[name] = Workload(name, fn, summary, full, quick, variants, targets, timeout_s)
        return fn

    return register


def unit_of(figure: str) -> str:
    for suffix, unit in (("_per_s", "1/s"), ("_ms", "ms"), ("_s", "s"), ("_mb", "MB")):
        if figure.endswith(suffix):
            return unit
    return ""


def run_in_storage(name: str, framework: str, params: dict, storage_root: Optional[str]) -> dict:
    """One repetition of workload ``name`` in a new temporary folder under ``storage_root``,
    deleted afterwards together with whatever the framework started in this process."""
    storage = tempfile.mkdtemp(prefix=f"ftnb-bench-{name}-", dir=storage_root or None)
    try:
        return WORKLOADS[name].fn(framework, storage, **params)
    finally:
        frameworks.shutdown(framework)
        shutil.rmtree(storage, ignore_errors=True)


def _read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _out_dir(storage_dir: str, name: str = "out") -> str:
    """A folder of the benchmark's own, beside (not inside) the experiment's folder."""
    path = os.path.join(storage_dir, name)
    os.makedirs(path)
    return path


def _iterations_twice(events: list[dict]) -> int:
    """How many (trial, iteration) pairs were reported with their checkpoint more than once."""
    counts = Counter((e["i"], e["iteration"]) for e in events if e["event"] == "iteration")
    return sum(n - 1 for n in counts.values())


# ---- startup -----------------------------------------------------------------------------------


def _startup_code(framework: str) -> str:
    return (
        "import time; _t = time.perf_counter(); "
        f"{frameworks.import_statement(framework)}; "
        "_i = time.perf_counter(); "
        "from bench.frameworks import init, shutdown; "
        "_j = time.perf_counter(); "
        f"init({framework!r}); "
        "print(_i - _t, time.perf_counter() - _j, flush=True); "
        f"shutdown({framework!r})"
    )


@workload(
    "startup",
    full={"runs": 3},
    quick={"runs": 1},
    targets=(Target("import_ms", "ratio<=", 0.1),),
)
def startup(framework: str, storage_dir: str, runs: int) -> dict:
    """Fresh Python process: import the Tune API, then (Ray) ray.init(); medians of `runs`.

    import_ms: ``import ftnb`` / ``import ray.tune``. init_ms (Ray only): ``ray.init()`` with the
    benchmark's arguments; ftnb needs no such step. ready_ms: the two together, the time from
    the first line of a script until it can build a Tuner.
    """
    import_s, init_s = [], []
    for run in range(runs + 1):  # run 0 only warms the page and bytecode caches
        out = subprocess.run(
            [sys.executable, "-c", _startup_code(framework)],
            cwd=storage_dir,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        if run:
            imp, ini = (float(x) for x in out.stdout.strip().splitlines()[-1].split())
            import_s.append(imp)
            init_s.append(ini)
    figures = {
        "import_ms": statistics.median(import_s) * 1e3,
        "ready_ms": statistics.median(a + b for a, b in zip(import_s, init_s)) * 1e3,
    }
    if framework == "ray":
        figures["init_ms"] = statistics.median(init_s) * 1e3
    return figures


# ---- trial_start_latency and many_trials -------------------------------------------------------


def _reporting_experiment(
    framework: str, storage_dir: str, name: str, trials: int, concurrent: int, reports: int,
    reuse_actors: bool = False,
) -> tuple[frameworks.ExperimentRun, str]:
    out_dir = _out_dir(storage_dir)
    run = frameworks.run_experiment(
        framework,
        reporting_trainable,
        storage_dir=storage_dir,
        name=name,
        trials=trials,
        max_concurrent=min(concurrent, usable_cpus()),
        config={"framework": framework, "reports": reports, "out_dir": out_dir},
        reuse_actors=reuse_actors,
    )
    return run, out_dir


@workload(
    "trial_start_latency",
    full={"trials": 40, "concurrent": 2},
    quick={"trials": 4, "concurrent": 2},
    variants=(FTNB,),  # Ray Tune does not record when it started an attempt
)
def trial_start_latency(framework: str, storage_dir: str, trials: int, concurrent: int) -> dict:
    """Attempt started -> trainable's first line / first report returned; trivial trials (ftnb).

    The first trial also waits for ftnb's one-off start of its fork server
    (first_trial_to_first_line_ms); the percentiles are over all trials.
    """
    run, out_dir = _reporting_experiment(framework, storage_dir, "start", trials, concurrent, 1)
    to_line, to_report = [], []
    for info in sorted(run.trials, key=lambda i: i.first_attempt_started):
        timing = _read_json(output_path({"out_dir": out_dir, "i": info.key}))
        to_line.append(timing["entry"] - info.first_attempt_started)
        to_report.append(timing["first_report_acked"] - info.first_attempt_started)
    return {
        "first_trial_to_first_line_ms": to_line[0] * 1e3,
        "to_first_line_p50_ms": percentile(to_line, 50) * 1e3,
        "to_first_line_p95_ms": percentile(to_line, 95) * 1e3,
        "to_first_report_p50_ms": percentile(to_report, 50) * 1e3,
        "to_first_report_p95_ms": percentile(to_report, 95) * 1e3,
        "trials_per_s": trials / run.fit_s,
    }


@workload(
    "many_trials",
    full={"trials": 40, "reports": 10, "concurrent": 2},
    quick={"trials": 4, "reports": 3, "concurrent": 2},
    variants=(FTNB, RAY, Variant("ray", "reuse_actors", {"reuse_actors": True})),
    targets=(
        Target("trials_per_s", "ratio>=", 10),
        Target("trials_per_s", "ratio>=", 3, ray_label="reuse_actors"),
        Target("peak_tree_rss_mb", "ratio<=", 0.25),
    ),
)
def many_trials(
    framework: str, storage_dir: str, trials: int, reports: int, concurrent: int,
    reuse_actors: bool = False,
) -> dict:
    """A grid of short trials (each reports a few times), 1 CPU each; also the memory figures.

    fit_s: wall time of fit(); trials_per_s and results_per_s follow from it. The memory
    figures: peak_tree_rss_mb, the largest sum of the resident set sizes of the driver process
    and all its descendants (trial processes; ftnb's fork server; Ray's raylet, GCS and
    workers), sampled every 50 ms during the run, and peak_tree_processes, their number then.
    """
    with TreeSampler(os.getpid(), 0.05) as tree:
        run, _ = _reporting_experiment(
            framework, storage_dir, "many", trials, concurrent, reports, reuse_actors
        )
    return {
        "fit_s": run.fit_s,
        "trials_per_s": trials / run.fit_s,
        "results_per_s": trials * reports / run.fit_s,
        "peak_tree_rss_mb": tree.peak_rss / 1e6,
        "peak_tree_processes": tree.peak_processes,
    }


# ---- report_throughput and checkpoint_io -------------------------------------------------------


def _single_trial(framework: str, storage_dir: str, trainable: Callable, name: str,
                  **config: Any) -> dict:
    """Run one trial of ``trainable`` with ``config`` (plus the framework, out_dir and the
    experiment's folder, exp_dir) and return what it left in the out dir."""
    out_dir = _out_dir(storage_dir)
    config = {"framework": framework, "out_dir": out_dir, "i": 0,
              "exp_dir": os.path.join(storage_dir, name), **config}
    frameworks.run_experiment(
        framework, trainable, storage_dir=storage_dir, name=name, trials=1, max_concurrent=1,
        config={k: v for k, v in config.items() if k != "i"},
    )
    return _read_json(output_path(config))


@workload(
    "report_throughput",
    full={"reports": 5000, "checks": 20},
    quick={"reports": 200, "checks": 5},
    targets=(
        Target("reports_per_s", "ratio>=", 20),
        Target("unpersisted_acks", "ftnb<=", 0),
    ),
)
def report_throughput(framework: str, storage_dir: str, reports: int, checks: int) -> dict:
    """One trial calling report() with a small dict in a tight loop, timed inside the trial.

    reports_per_s over the whole loop; report_p50_ms / report_p99_ms of one call.
    unpersisted_acks: of `checks` further reports, how many had returned before their row was
    in the trial's result.json in the experiment folder (0: every acknowledged report is on
    disk, where a restore reads it).
    """
    stats = _single_trial(framework, storage_dir, throughput_trainable, "throughput",
                          reports=reports, checks=checks)
    return {
        "reports_per_s": stats["reports"] / stats["total_s"],
        "report_p50_ms": stats["p50_s"] * 1e3,
        "report_p99_ms": stats["p99_s"] * 1e3,
        "unpersisted_acks": stats["unpersisted_acks"],
    }


@workload(
    "checkpoint_io",
    full={"checkpoints": 10, "size_mb": 100},
    quick={"checkpoints": 2, "size_mb": 4},
    targets=(
        Target("vs_raw", "ftnb>=", 0.95),
        Target("refsync_vs_raw", "ftnb<=", 0.1),
    ),
)
def checkpoint_io(framework: str, storage_dir: str, checkpoints: int, size_mb: float) -> dict:
    """One trial reporting `checkpoints` checkpoints of one `size_mb` file, each paired with a
    raw write+fsync of the same bytes to the same disk right after it.

    checkpoint_s: median seconds of one report(checkpoint=...) call; checkpoint_mb_per_s and
    raw_mb_per_s: the size over the median checkpoint and raw times. vs_raw: the median over
    the pairs of raw time / checkpoint time (1.0: the checkpoint is as fast as the disk).
    refsync_vs_raw: the median over the pairs of (fsync() of the persisted copy after report()
    returned) / raw time: about 0 when the framework had fsynced the checkpoint, near 1 when
    its bytes were still only in the page cache.
    """
    work_dir = _out_dir(storage_dir, "work")
    stats = _single_trial(
        framework, storage_dir, checkpoint_trainable, "ckpt", checkpoints=checkpoints,
        size_mb=size_mb, work_dir=work_dir,
    )
    pairs, mb = stats["pairs"], stats["bytes"] / 1e6
    checkpoint_s = statistics.median(p["checkpoint_s"] for p in pairs)
    raw_s = statistics.median(p["raw_s"] for p in pairs)
    return {
        "checkpoint_s": checkpoint_s,
        "checkpoint_mb_per_s": mb / checkpoint_s,
        "raw_mb_per_s": mb / raw_s,
        "vs_raw": statistics.median(p["raw_s"] / p["checkpoint_s"] for p in pairs),
        "refsync_vs_raw": statistics.median(p["refsync_s"] / p["raw_s"] for p in pairs),
    }


# ---- failure_recovery and restore --------------------------------------------------------------


def _recovery_figures(events: list[dict], mode: str) -> dict:
    fail = next(e for e in events if e["event"] == "fail")
    after = [e for e in events if e["t"] >= fail["t"] and e["pid"] != fail["pid"]]
    restart = next(e for e in after if e["event"] == "start")
    first = next(e for e in after if e["event"] == "iteration")
    return {
        f"{mode}_to_first_report_s": first["t"] - fail["t"],
        f"{mode}_to_restart_s": restart["t"] - fail["t"],
        f"{mode}_iterations_twice": _iterations_twice(events),
    }


@workload(
    "failure_recovery",
    full={"iterations": 10, "iter_s": 0.1, "fail_at": 5, "max_failures": 3},
    quick={"iterations": 4, "iter_s": 0.02, "fail_at": 2, "max_failures": 3},
    targets=(
        Target("raise_to_first_report_s", "ratio<=", 0.1),
        Target("sigkill_to_first_report_s", "ratio<=", 0.1),
        Target("raise_iterations_twice", "ftnb<=", 0),
        Target("sigkill_iterations_twice", "ftnb<=", 0),
    ),
)
def failure_recovery(
    framework: str, storage_dir: str, iterations: int, iter_s: float, fail_at: int,
    max_failures: int,
) -> dict:
    """One trial checkpointing every iteration fails at `fail_at` on its first attempt, once by
    raising (raise_*) and once by SIGKILL of its own process (sigkill_*).

    *_to_first_report_s: from the failure to the first report() of the restarted attempt
    returning (that attempt's first iteration, `iter_s`, included); *_to_restart_s: to the first
    line of the restarted trainable; *_iterations_twice: iterations reported with a checkpoint
    twice (0: the trial resumed right after its last checkpoint).
    """
    figures: dict = {}
    for mode in ("raise", "sigkill"):
        out_dir = _out_dir(storage_dir, f"out-{mode}")
        frameworks.run_experiment(
            framework,
            checkpointing_trainable,
            storage_dir=storage_dir,
            name=f"fail-{mode}",
            trials=1,
            max_concurrent=1,
            max_failures=max_failures,
            config={"framework": framework, "out_dir": out_dir, "iterations": iterations,
                    "iter_s": iter_s, "fail_at": fail_at, "fail_mode": mode},
        )
        figures.update(_recovery_figures(read_events(out_dir), mode))
    return figures


def _start_driver(spec: dict, log_path: str) -> subprocess.Popen:
    """The experiment's driver: ``python -m bench._driver SPEC`` (a user's script)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "bench._driver", json.dumps(spec)],
            env=subprocess_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _wait_for_first_iteration(proc: subprocess.Popen, out_dir: str, log_path: str,
                              timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(e["event"] == "iteration" for e in read_events(out_dir)):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"the driver reported no iteration (exit {proc.poll()}):\n{tail}")
        time.sleep(0.02)


def _run_and_kill_driver(spec: dict, storage_dir: str, kill_after_s: float) -> TreeSampler:
    """Start the driver, SIGKILL it ``kill_after_s`` after its first checkpointed iteration,
    and return the sampler that saw its process tree until then."""
    log_path = os.path.join(storage_dir, "driver.log")
    proc = _start_driver(spec, log_path)
    tree = TreeSampler(proc.pid, 0.05)
    try:
        with tree:
            _wait_for_first_iteration(proc, spec["config"]["out_dir"], log_path)
            time.sleep(kill_after_s)
    finally:
        proc.kill()
        proc.wait()
    return tree


@workload(
    "restore",
    full={"trials": 8, "iterations": 20, "iter_s": 0.1, "concurrent": 2, "kill_after_s": 4.0},
    # (quick: 1.3 s of iterations left after the kill, so a busy machine cannot let the trials
    # finish before it)
    quick={"trials": 2, "iterations": 30, "iter_s": 0.05, "concurrent": 2, "kill_after_s": 0.2},
    targets=(
        Target("first_new_result_s", "ratio<=", 0.2),
        Target("iterations_twice", "ftnb<=", 0),
        Target("stale_processes", "ftnb<=", 0),
    ),
)
def restore(
    framework: str, storage_dir: str, trials: int, iterations: int, iter_s: float,
    concurrent: int, kill_after_s: float,
) -> dict:
    """Driver SIGKILLed `kill_after_s` after its first checkpoint; then can_restore + restore().fit().

    Trials as in failure_recovery, without failures. Times count from the start of the restore
    in a fresh process (for Ray, its ray.init() included, as Tuner.restore() needs one):
    first_new_result_s until a restored trial's first report() returned, complete_s until
    fit() returned. iterations_twice: iterations reported with a checkpoint twice (0: every
    trial resumed right after its last checkpoint). stale_processes: the most processes of the
    killed driver's tree (its trials, and Ray's raylet, GCS and workers) still running when a
    restored trial started (0: nothing of the old experiment can still write into it).
    """
    name, temp_root = "restore", tempfile.mkdtemp(prefix="rb-", dir="/tmp")
    out_dir = _out_dir(storage_dir)
    exp_dir = os.path.join(storage_dir, name)
    config = {"framework": framework, "out_dir": out_dir, "iterations": iterations,
              "iter_s": iter_s, "stale_file": os.path.join(out_dir, "stale.json")}
    spec = {
        "framework": framework, "storage_dir": storage_dir, "name": name, "trials": trials,
        "concurrent": min(concurrent, usable_cpus()), "temp_root": temp_root, "config": config,
    }
    tree = _run_and_kill_driver(spec, storage_dir, kill_after_s)
    try:
        with open(config["stale_file"], "w") as f:
            json.dump(list(tree.seen.items()), f)
        start = time.time()
        if not frameworks.can_restore(framework, exp_dir):
            raise RuntimeError(f"{framework}: can_restore({exp_dir!r}) is False")
        frameworks.restore_experiment(framework, exp_dir, checkpointing_trainable, trials)
        complete_s = time.time() - start
    finally:
        tree.kill_survivors()
        shutil.rmtree(temp_root, ignore_errors=True)
    events = [e for e in read_events(out_dir) if e["t"] >= start and e["pid"] not in tree.seen]
    if not any(e["event"] == "iteration" for e in events):
        raise RuntimeError(f"{framework}: no iteration after the restore: the trials finished "
                           f"before the driver was killed (raise iterations or lower "
                           f"kill_after_s={kill_after_s})")
    return {
        "first_new_result_s": min(e["t"] for e in events if e["event"] == "iteration") - start,
        "complete_s": complete_s,
        "iterations_twice": _iterations_twice(read_events(out_dir)),
        "stale_processes": max(e["stale"] for e in events if e["event"] == "start"),
    }


# ---- widget_updater (bench/widget_load.py) ----------------------------------------------------
# In its own module, which keeps the notebook side (jupyter_client) out of this one.
from . import widget_load  # noqa: E402

workload(
    "widget_updater",
    full=widget_load.FULL,
    quick=widget_load.QUICK,
    variants=(FTNB,),
    targets=(Target("kernel_cpu_pct", "ftnb<=", widget_load.TARGET_CPU_PCT),),
)(widget_load.widget_updater)


# ---- group_recovery, group_start, ddp_steps (bench/group_workloads.py) ------------------------
# Data-parallel jobs of 2 ranks: ftnb.TorchTrainer, Ray Train ("ray") and torchrun.
from . import group_workloads  # noqa: E402

GROUP_VARIANTS = (
    Variant("ftnb", needs="torch"),
    Variant("ray", needs="ray.train.torch"),
    Variant("torchrun"),
)

workload(
    "group_recovery",
    full={"kills": 20, "step_s": 0.05, "settle_s": 0.5, "deadline_s": 60.0},
    quick={"kills": 2, "step_s": 0.02, "settle_s": 0.2, "deadline_s": 60.0},
    variants=GROUP_VARIANTS,
    targets=(
        Target("recovery_s", "ratio<=", 0.3, against="torchrun"),
        Target("recovery_s", "ratio<=", 0.1),
        Target("failed_reformations", "ftnb<=", 0),
        Target("stale_resumes", "ftnb<=", 0),
    ),
    timeout_s=1800,  # Ray Train: 20 re-formations of several seconds each
)(group_workloads.group_recovery)

workload(
    "group_start",
    full={"runs": 1, "steps": 3},
    quick={"runs": 1, "steps": 2},
    variants=GROUP_VARIANTS,
)(group_workloads.group_start)

workload(
    "ddp_steps",
    full={"steps": 3000, "timed_from": 100, "report_every": 50},
    quick={"steps": 200, "timed_from": 50, "report_every": 50},
    variants=GROUP_VARIANTS,
    targets=(Target("steps_per_s", "ratio>=", 0.95, against="torchrun"),),
)(group_workloads.ddp_steps)


# ---- scale_trials, scale_simulation (bench/scale_workloads.py) ---------------------------------
# Thousands of trivial trials: the driver's cost per trial, its state saves, from_path.
from . import scale_workloads  # noqa: E402

workload(
    "scale_trials",
    full={"sizes": [100, 2000, 10000], "ray_sizes": [100, 2000], "concurrent": 2},
    quick={"sizes": [20, 100], "ray_sizes": [20], "concurrent": 2},
    # Ray Tune starts about one trial a second without reuse_actors: only with it.
    variants=(FTNB, Variant("ray", "reuse_actors", {"reuse_actors": True})),
    targets=(
        Target("rate_vs_smallest", "ftnb>=", 0.9),
        Target("from_path_s", "ftnb<=", 0.5),
    ),
    timeout_s=1800,
)(scale_workloads.scale_trials)

workload(
    "scale_simulation",
    full={"trials": 10000, "concurrent": 8},
    quick={"trials": 100, "concurrent": 8},
    variants=(FTNB,),
    timeout_s=1800,
)(scale_workloads.scale_simulation)

workload(
    "scale_s3_requests",
    full={"trials": 1000, "concurrent": 8},
    quick={"trials": 20, "concurrent": 4},
    variants=(Variant("ftnb", needs="moto.server"),),
    timeout_s=1800,
)(scale_workloads.scale_s3_requests)


# ---- elastic_map (bench/elastic_workloads.py) ---------------------------------------------------
# ftnb.WorkerGroup (issue 16): lost workers, recreation with state, per-map cost vs a Pool.
from . import elastic_workloads  # noqa: E402

workload(
    "elastic_map",
    full={"kills": 12, "hangs": 2, "timeout_s": 1.0, "call_s": 0.05, "state_mb": 10,
          "maps": 2000, "block": 100, "gap_kills": 6, "gap_s": 3.0},
    quick={"kills": 2, "hangs": 1, "timeout_s": 0.5, "call_s": 0.01, "state_mb": 1,
           "maps": 100, "block": 50, "gap_kills": 1, "gap_s": 0.5},
    variants=(FTNB,),
    targets=(
        Target("death_step_vs_timeout", "ftnb<=", 1.1),
        Target("hang_step_vs_timeout", "ftnb<=", 1.1),
        Target("recreate_sync_s", "ftnb<=", 1.0),
        Target("recreate_gap_wait_s", "ftnb<=", 1.0),
        Target("map_overhead_ms", "ftnb<=", 1.0),
    ),
)(elastic_workloads.elastic_map)

workload(
    "elastic_map_ray",
    full={"kills": 12, "hangs": 2, "timeout_s": 1.0, "call_s": 0.05, "state_mb": 10, "maps": 200,
          "gap_kills": 6, "gap_s": 3.0},
    quick={"kills": 2, "hangs": 1, "timeout_s": 0.5, "call_s": 0.01, "state_mb": 1, "maps": 20,
           "gap_kills": 1, "gap_s": 0.5},
    variants=(Variant("ftnb", needs="ray"),),
    targets=(
        Target("death_step_vs_timeout", "ftnb<=", 1.1),
        Target("hang_step_vs_timeout", "ftnb<=", 1.1),
        Target("recreate_sync_s", "ftnb<=", 1.0),  # missed: Ray starts a worker process in 2-5 s
        # With 3 s of the caller's work between the maps, during which the replacement starts:
        Target("recreate_gap_wait_s", "ftnb<=", 1.0),
        Target("recreate_sync_spare_s", "ftnb<=", 1.0),  # with spare_workers=1
    ),
)(elastic_workloads.elastic_map_ray)


# ---- ray_many_trials, ray_node_loss, ray_first_result (bench/ray_workloads.py) -----------------
# ftnb's Ray executor against Ray Tune, each on a fresh local multi-node Ray cluster (issue 15).
from . import ray_workloads  # noqa: E402

RAY_CLUSTER_VARIANTS = (Variant("ftnb", needs="ray"), RAY)

workload(
    "ray_many_trials",
    full={"trials": 16, "reports": 10, "concurrent": 2, "nodes": 2},
    quick={"trials": 4, "reports": 3, "concurrent": 2, "nodes": 2},
    variants=RAY_CLUSTER_VARIANTS,
    targets=(Target("trials_per_s", "ratio>=", 1.0),),
)(ray_workloads.ray_many_trials)

workload(
    "ray_node_loss",
    full={"iterations": 20, "iter_s": 0.1, "lose_at": 5, "nodes": 3, "max_failures": 3},
    quick={"iterations": 8, "iter_s": 0.05, "lose_at": 2, "nodes": 2, "max_failures": 3},
    variants=RAY_CLUSTER_VARIANTS,
    targets=(
        Target("to_first_report_s", "ratio<=", 1.0),
        Target("iterations_twice", "ftnb<=", 0),
        Target("ghost_writes", "ftnb<=", 0),
    ),
)(ray_workloads.ray_node_loss)

workload(
    "ray_first_result",
    full={"iterations": 3, "nodes": 1},
    quick={"iterations": 2, "nodes": 1},
    variants=RAY_CLUSTER_VARIANTS,
)(ray_workloads.ray_first_result)


# ---- lease_heartbeat (bench/lease_workloads.py) -------------------------------------------------
# The owner lease's heartbeat on a disk and on S3 (moto): what chooses the default TTL (issue 19).
from . import lease_workloads  # noqa: E402

workload(
    "lease_heartbeat",
    full={"beats": 200, "interval_s": 5.0, "ttl_s": 30.0},
    quick={"beats": 20, "interval_s": 0.5, "ttl_s": 3.0},
    variants=(FTNB,),
    targets=(Target("beat_s3_busy_pct", "ftnb<=", 1.0),),
)(lease_workloads.lease_heartbeat)


# ---- lab_listing (bench/lab_workloads.py) -------------------------------------------------------
# The JupyterLab panel's list through the server extension's route, local disk and S3 (moto),
# against `ftnb ls`; the server's idle CPU with and without the extension (issue 17).
from . import lab_workloads  # noqa: E402

workload(
    "lab_listing",
    full={"experiments": 1000, "repeats": 3, "s3_repeats": 1, "idle_s": 10.0},
    quick={"experiments": 100, "repeats": 1, "s3_repeats": 1, "idle_s": 2.0},
    variants=(FTNB,),
    targets=(Target("list_local_s", "ftnb<=", 1.0), Target("list_s3_s", "ftnb<=", 5.0)),
    timeout_s=1800,
)(lab_workloads.lab_listing)


# ---- asha (bench/scheduler_workloads.py) --------------------------------------------------------
# ASHA over 200 short trials, ftnb's scheduler against Ray Tune's, end to end (issue 18).
from . import scheduler_workloads  # noqa: E402

workload(
    "asha",
    full={"trials": 200, "max_t": 9, "grace_period": 1, "reduction_factor": 3,
          "concurrent": 2, "step_s": 0.01},
    quick={"trials": 12, "max_t": 3, "grace_period": 1, "reduction_factor": 3,
           "concurrent": 2, "step_s": 0.0},
    variants=(FTNB, RAY, Variant("ray", "reuse_actors", {"reuse_actors": True})),
    targets=(
        Target("wall_s", "ratio<=", 0.2),
        Target("wall_s", "ratio<=", 0.2, ray_label="reuse_actors"),
    ),
    timeout_s=1800,
)(scheduler_workloads.asha_sweep)


# ---- optuna_overhead (bench/search_workloads.py) -------------------------------------------------
# OptunaSearch per suggestion, its study durable in the experiment folder, against Optuna's own
# ask/tell with the study in memory (issue 18: at most Optuna's + 5 ms).
from . import search_workloads  # noqa: E402

workload(
    "optuna_overhead",
    full={"trials": 200, "results": 3},
    quick={"trials": 10, "results": 2},
    variants=(Variant("ftnb", needs="optuna"), Variant("optuna")),
    targets=(Target("overhead_ms", "ftnb<=", 5.0),),
    timeout_s=900,
)(search_workloads.optuna_overhead)


# ---- stopper_throughput (bench/stopper_workloads.py) ----------------------------------------------
# Report throughput with a custom Stopper (every report waits for the driver) against without,
# in one run (issue 31: say the cost of exact stopping).
from . import stopper_workloads  # noqa: E402

workload(
    "stopper_throughput",
    full={"reports": 3000},
    quick={"reports": 100},
    targets=(Target("stopper_reports_per_s", "ratio>=", 1.0),),
)(stopper_workloads.stopper_throughput)


# ---- searcher_overhead (bench/searcher_workloads.py) ----------------------------------------------
# ftnb's HyperOpt, BayesOpt, Nevergrad, BOHB and Optuna searchers per trial (suggest, result,
# outcome) against Ray Tune's, in one process (issue 31: at most 1.0x Ray's).
from . import searcher_workloads  # noqa: E402

workload(
    "searcher_overhead",
    full={"trials": 30},
    quick={"trials": 5},
    variants=(FTNB,),
    targets=tuple(Target(f"{name}_vs_ray", "ftnb<=", 1.0)
                  for name in searcher_workloads.SEARCHERS),
    timeout_s=1200,
)(searcher_workloads.searcher_overhead)
