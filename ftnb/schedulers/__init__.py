"""Trial schedulers, with Ray Tune's names (``ray.tune.schedulers``): they decide, from the
results, which trials go on, which pause and which stop early.

    from ftnb.schedulers import ASHAScheduler

    tuner = ftnb.Tuner(train, param_space=space, tune_config=ftnb.TuneConfig(
        metric="loss", mode="min", num_samples=100,
        scheduler=ASHAScheduler(max_t=27, grace_period=1, reduction_factor=3)))

* :class:`FIFOScheduler` (the default): every trial runs to its end, in order.
* :class:`ASHAScheduler` / :class:`AsyncHyperBandScheduler`: asynchronous successive halving.
* :class:`HyperBandScheduler`: synchronous HyperBand (pauses trials at their bracket's
  milestones and resumes the best from their checkpoints).
* :class:`MedianStoppingRule`: stops a trial doing worse than the median of the others.
* :class:`PopulationBasedTraining`: the worse trials continue from the better ones'
  checkpoints with mutated configs.

A trial a scheduler stops ends exactly at the report that decided it, and reads ``STOPPED``
(with the reason as its note) in every view, never as completed. The scheduler's state is JSON
in the experiment state, saved before each decision is carried out: after a restore (a driver
SIGKILLed at any moment included) its decisions stand and its later ones are the same.
See docs/schedulers.md.
"""

from __future__ import annotations

from typing import Any, Optional

from .async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
from .hyperband import HyperBandScheduler
from .median_stopping_rule import MedianStoppingRule
from .pbt import PopulationBasedTraining, pbt_history
from .trial_scheduler import FIFOScheduler, SchedulerController, TrialScheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "SchedulerController",
    "TrialScheduler",
    "check_scheduler",
    "describe_scheduler",
    "initial_record",
    "pbt_history",
    "same_scheduler",
    "scheduler_from_description",
]

#: ftnb's schedulers, rebuilt by name from a stored description.
_BUILT_IN = {cls.__name__: cls for cls in (FIFOScheduler, AsyncHyperBandScheduler,
                                           ASHAScheduler, HyperBandScheduler,
                                           MedianStoppingRule, PopulationBasedTraining)}


def describe_scheduler(scheduler: TrialScheduler) -> dict:
    """What the experiment state records of ``scheduler``: its class's name and, for ftnb's own,
    the arguments that rebuild it (``settings``; None for a class of the user's)."""
    return {"class": type(scheduler).__name__, "settings": scheduler._ftnb_settings()}


def scheduler_from_description(description: dict) -> Optional[TrialScheduler]:
    """The scheduler ``description`` (:func:`describe_scheduler`) describes, rebuilt; None when
    it is a class of the user's (it must be given again)."""
    settings = description.get("settings")
    cls = _BUILT_IN.get(str(description.get("class")))
    if cls is None or settings is None:
        return None
    if hasattr(cls, "_from_settings"):
        return cls._from_settings(settings)
    return cls(**settings)


def same_scheduler(description: dict, scheduler: Any) -> bool:
    """Whether ``scheduler`` is the one ``description`` records (same class and arguments)."""
    if type(scheduler).__name__ != description.get("class"):
        return False
    stored = description.get("settings")
    given = scheduler._ftnb_settings()
    if stored is None or given is None:
        return True  # a class of the user's: its arguments are not recorded
    # metric and mode may come from TuneConfig: compare what the scheduler was given.
    return all(given.get(k) in (None, v) for k, v in stored.items())


def check_scheduler(scheduler: Any, metric: Optional[str], mode: Optional[str]) -> None:
    """``TuneConfig(scheduler=...)`` checked, before any work: a :class:`TrialScheduler`, whose
    metric and mode agree with TuneConfig's (it takes them when it has none), and that has
    both when it compares trials. Raises TypeError or ValueError naming the fix."""
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(
            f"TuneConfig(scheduler={scheduler!r}) must be an ftnb.schedulers.TrialScheduler "
            "(ASHAScheduler, HyperBandScheduler, MedianStoppingRule, FIFOScheduler, or a "
            "subclass of your own). Fix: e.g. from ftnb.schedulers import ASHAScheduler; "
            "TuneConfig(metric='loss', mode='min', scheduler=ASHAScheduler()).")
    if not scheduler.set_search_properties(metric, mode):
        raise ValueError(
            f"TuneConfig(metric={metric!r}, mode={mode!r}) and the scheduler's own "
            f"(metric={scheduler.metric!r}, mode={scheduler.mode!r}) differ. Fix: give them "
            "once, in TuneConfig or in the scheduler.")
    compares = isinstance(scheduler, (AsyncHyperBandScheduler, HyperBandScheduler,
                                      MedianStoppingRule, PopulationBasedTraining))
    if compares and (not scheduler.metric or not scheduler.mode):
        raise ValueError(
            f"{type(scheduler).__name__} compares trials by a metric, but has "
            f"metric={scheduler.metric!r}, mode={scheduler.mode!r}. Fix: "
            "TuneConfig(metric='loss', mode='min', scheduler=...) (or pass them to the "
            "scheduler).")


def initial_record(scheduler: TrialScheduler) -> dict:
    """What a new experiment's state records of its scheduler before any trial runs (so that a
    driver killed at once still leaves it to the restore)."""
    return {**describe_scheduler(scheduler), "state": scheduler.get_state(), "fed": {},
            "decided": {}, "ended": []}
