"""Exact stopping (issue 31): the report throughput of one trial with a custom Stopper (which
decides in the driver, so every report waits for its decision) against the same trial without
one, in one run, for ftnb and Ray Tune.

Figures: ``reports_per_s`` (no stopper), ``stopper_reports_per_s`` (a ``Stopper`` subclass that
never stops: its ``__call__`` sees every result, in the driver), and ``stopper_vs_plain``, the
second divided by the first (the cost of exactness: 1.0 is free).
"""

from __future__ import annotations

from typing import Any

from . import frameworks
from .trainables import throughput_trainable

__all__ = ["stopper_throughput"]


def _never_stopper(framework: str) -> Any:
    """A Stopper subclass of ``framework`` that sees every result and never stops."""
    if framework == "ftnb":
        from ftnb import Stopper
    else:
        from ray.tune import Stopper

    class NeverStopper(Stopper):
        def __init__(self) -> None:
            self.seen = 0

        def __call__(self, trial_id: str, result: dict) -> bool:
            self.seen += 1
            return False

        def stop_all(self) -> bool:
            return False

    return NeverStopper()


def _reports_per_s(framework: str, storage_dir: str, name: str, reports: int,
                   stop: Any) -> float:
    import json
    import os

    from .trainables import output_path

    out_dir = os.path.join(storage_dir, f"out-{name}")
    os.makedirs(out_dir, exist_ok=True)
    config = {"framework": framework, "out_dir": out_dir, "reports": reports, "checks": 0,
              "exp_dir": os.path.join(storage_dir, name)}
    frameworks.run_experiment(framework, throughput_trainable, storage_dir=storage_dir,
                              name=name, trials=1, max_concurrent=1, config=config, stop=stop)
    with open(output_path({**config, "i": 0})) as f:
        stats = json.load(f)
    return stats["reports"] / stats["total_s"]


def stopper_throughput(framework: str, storage_dir: str, reports: int) -> dict:
    """One trial calling report() in a tight loop, without a stopper and then with a custom
    Stopper (exact mode in ftnb: each report waits for the driver's decision).

    reports_per_s: without; stopper_reports_per_s: with; stopper_vs_plain: their ratio.
    """
    plain = _reports_per_s(framework, storage_dir, "plain", reports, None)
    exact = _reports_per_s(framework, storage_dir, "exact", reports, _never_stopper(framework))
    return {"reports_per_s": plain, "stopper_reports_per_s": exact,
            "stopper_vs_plain": exact / plain}
