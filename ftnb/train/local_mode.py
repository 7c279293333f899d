"""Local mode (``ScalingConfig(num_workers=0)``): what it runs on, and what it cannot go with,
checked before anything starts."""

from __future__ import annotations

from typing import Any

__all__ = ["caller_executor"]


def caller_executor(executor: Any, tune_config: Any) -> Any:
    """The executor of a local-mode run (:class:`~ftnb.execution.caller.CallerExecutor`), after
    refusing what cannot go with it: another executor named in ``RunConfig(executor=...)``, and a
    scheduler (it decides at reports, which nothing can answer while the caller runs the loop)."""
    from ..execution.caller import CallerExecutor

    if executor is not None and executor != "local" and not isinstance(executor, CallerExecutor):
        shown = executor if isinstance(executor, str) else type(executor).__name__
        raise ValueError(
            f"ScalingConfig(num_workers=0) with RunConfig(executor={shown!r}): local mode runs "
            "the training loop in this process, so it runs on no executor. Fix: "
            "ScalingConfig(num_workers=1) to run one rank on that executor, or leave "
            "RunConfig(executor=...) out.")
    scheduler = getattr(tune_config, "scheduler", None)
    if scheduler is not None and type(scheduler).__name__ != "FIFOScheduler":
        raise ValueError(
            f"ScalingConfig(num_workers=0) with TuneConfig(scheduler={type(scheduler).__name__}"
            "(...)): local mode runs each trial's loop in this process, one after another, "
            "where the scheduler's decisions at reports cannot be waited for. Fix: "
            "ScalingConfig(num_workers=1), or no scheduler while debugging.")
    return CallerExecutor()
