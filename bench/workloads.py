"""The workloads and their registry.

A workload is ``fn(framework, storage_dir, **size) -> {figure: number}``, registered with
:func:`workload` together with its full and ``--quick`` sizes. Figure names end in their unit
(``_ms``, ``_us``, ``_s``, ``_per_s``). The trainables live in :mod:`bench.trainables`; they leave
their own measurements in a small JSON file in the trial's folder, which the workload reads once
the experiment is over.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import frameworks
from .trainables import TIMING_FILE, percentile, reporting_trainable, throughput_trainable

__all__ = ["WORKLOADS", "Workload", "percentile", "workload"]


@dataclass
class Workload:
    name: str
    fn: Callable[..., dict]
    description: str
    full: dict
    quick: dict
    variants: tuple = ("ftnb",)  # the frameworks it has a variant for; the others print n/a

    def params(self, quick: bool) -> dict:
        return dict(self.quick if quick else self.full)


WORKLOADS: dict[str, Workload] = {}


def workload(name: str, *, full: dict, quick: dict, variants: tuple = ("ftnb",)):
    """Register ``fn`` as workload ``name``; its docstring's first line is its description."""

    def register(fn: Callable[..., dict]) -> Callable[..., dict]:
        doc = (fn.__doc__ or "").strip().splitlines()
        WORKLOADS[name] = Workload(name, fn, doc[0] if doc else "", full, quick, variants)
        return fn

    return register


def unit_of(figure: str) -> str:
    for suffix, unit in (("_per_s", "1/s"), ("_ms", "ms"), ("_us", "us"), ("_s", "s")):
        if figure.endswith(suffix):
            return unit
    return ""


def _read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _concurrency(wanted: int) -> int:
    """``wanted`` trials at once, or fewer on a machine with fewer CPUs (1 CPU per trial)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(wanted, cpus))


# ---- workloads (run in the driver process) -------------------------------------------------------


@workload("startup", full={"runs": 7}, quick={"runs": 2})
def startup(framework: str, storage_dir: str, runs: int) -> dict:
    """Wall time of importing the framework in a fresh Python process (median of `runs`)."""
    stmt = frameworks.import_statement(framework)
    code = (
        "import time; _t = time.perf_counter(); "
        f"{stmt}; "
        "print(time.perf_counter() - _t)"
    )
    import_s, process_s = [], []
    for run in range(runs + 1):  # run 0 only warms the page and bytecode caches
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=storage_dir,
            capture_output=True,
            text=True,
            check=True,
        )
        if run:
            process_s.append(time.perf_counter() - t)
            import_s.append(float(out.stdout.strip().splitlines()[-1]))
    return {
        "import_ms": statistics.median(import_s) * 1e3,
        "process_ms": statistics.median(process_s) * 1e3,
    }


def _start_figures(infos: list) -> dict:
    to_line, to_report = [], []
    for info in sorted(infos, key=lambda i: i.first_attempt_started):
        timing = _read_json(os.path.join(info.trial_dir, TIMING_FILE))
        started = info.first_attempt_started
        to_line.append(timing["entry"] - started)
        to_report.append(timing["first_report_acked"] - started)
    return {
        # The first trials also wait for the framework's one-off start (ftnb: its fork server).
        "first_trial_to_first_line_ms": to_line[0] * 1e3,
        "to_first_line_p50_ms": percentile(to_line, 50) * 1e3,
        "to_first_line_p95_ms": percentile(to_line, 95) * 1e3,
        "to_first_report_p50_ms": percentile(to_report, 50) * 1e3,
        "to_first_report_p95_ms": percentile(to_report, 95) * 1e3,
    }


@workload(
    "trial_start_latency",
    full={"trials": 40, "concurrent": 2},
    quick={"trials": 4, "concurrent": 2},
)
def trial_start_latency(framework: str, storage_dir: str, trials: int, concurrent: int) -> dict:
    """Attempt started -> trainable's first line / first report returned; trivial trials."""
    run = _reporting_experiment(framework, storage_dir, "start", trials, concurrent, reports=1)
    figures = _start_figures(run.trials)
    figures["fit_s"] = run.fit_s
    figures["trials_per_s"] = trials / run.fit_s
    return figures


@workload(
    "many_trials",
    full={"trials": 40, "reports": 10, "concurrent": 2},
    quick={"trials": 4, "reports": 3, "concurrent": 2},
)
def many_trials(
    framework: str, storage_dir: str, trials: int, reports: int, concurrent: int
) -> dict:
    """Many short trials (each reports a few times), 1 CPU each: whole-experiment throughput."""
    run = _reporting_experiment(framework, storage_dir, "many", trials, concurrent, reports)
    return {
        "fit_s": run.fit_s,
        "trials_per_s": trials / run.fit_s,
        "results_per_s": trials * reports / run.fit_s,
        "to_first_line_p50_ms": _start_figures(run.trials)["to_first_line_p50_ms"],
    }


def _reporting_experiment(
    framework: str, storage_dir: str, name: str, trials: int, concurrent: int, reports: int
) -> frameworks.ExperimentRun:
    return frameworks.run_experiment(
        framework,
        reporting_trainable,
        storage_dir=storage_dir,
        name=name,
        num_samples=trials,
        max_concurrent=_concurrency(concurrent),
        cpus_per_trial=1,
        config={"framework": framework, "reports": reports},
    )


@workload("report_throughput", full={"reports": 5000}, quick={"reports": 200})
def report_throughput(framework: str, storage_dir: str, reports: int) -> dict:
    """One trial calling report() with a small dict in a tight loop, timed inside the trial."""
    run = frameworks.run_experiment(
        framework,
        throughput_trainable,
        storage_dir=storage_dir,
        name="throughput",
        num_samples=1,
        max_concurrent=1,
        cpus_per_trial=1,
        config={"framework": framework, "reports": reports},
    )
    stats = _read_json(os.path.join(run.trials[0].trial_dir, TIMING_FILE))
    return {
        "reports_per_s": stats["reports"] / stats["total_s"],
        "report_p50_us": stats["p50_s"] * 1e6,
        "report_p99_us": stats["p99_s"] * 1e6,
        "fit_s": run.fit_s,
    }
