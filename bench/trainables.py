"""The trainables, run inside the trial processes.

They are module-level functions, so every framework pickles them by reference and each trial
process imports this module to find them. It therefore imports only modules that a trial
process has loaded already (json, os, time): its own import cost stays out of the start-up
figures. Each trainable leaves its measurements in ``TIMING_FILE`` in the trial's folder.
"""

from __future__ import annotations

import json
import os
import time

TIMING_FILE = "bench_timing.json"


def trial_api(framework: str):
    """``(report, trial_dir)`` for use inside a trainable of ``framework``."""
    if framework == "ftnb":
        import ftnb

        return ftnb.report, lambda: ftnb.get_context().trial_dir
    raise NotImplementedError(f"the benchmark has no {framework!r} variant yet")


def percentile(values: list, q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _write_json(path: str, data: object) -> None:
    with open(path, "w") as f:
        json.dump(data, f)


def reporting_trainable(config: dict) -> None:
    """Note the wall time at entry, report ``config["reports"]`` times, and leave the entry time
    and the time the first report() returned (the result was persisted) in the trial's folder."""
    entry = time.time()
    report, trial_dir = trial_api(config["framework"])
    first_acked = None
    for step in range(config["reports"]):
        report({"step": step, "loss": 1.0 / (step + 1)})
        if first_acked is None:
            first_acked = time.time()
    _write_json(
        os.path.join(trial_dir(), TIMING_FILE), {"entry": entry, "first_report_acked": first_acked}
    )


def throughput_trainable(config: dict) -> None:
    """Call report() ``config["reports"]`` times with a small dict, timing every call."""
    report, trial_dir = trial_api(config["framework"])
    n = config["reports"]
    clock = time.perf_counter
    latencies = [0.0] * n
    start = clock()
    for i in range(n):
        t = clock()
        report({"loss": 1.0 / (i + 1), "step": i})
        latencies[i] = clock() - t
    total = clock() - start
    _write_json(
        os.path.join(trial_dir(), TIMING_FILE),
        {
            "reports": n,
            "total_s": total,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "max_s": max(latencies),
            "mean_s": total / n,
        },
    )
