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
* :class:`HyperBandForBOHB` (``ftnb.schedulers.hb_bohb``): HyperBand as BOHB runs it, with
  :class:`ftnb.search.bohb.TuneBOHB` (``pip install 'ftnb[bohb]'``).
* :class:`MedianStoppingRule`: stops a trial doing worse than the median of the others.
* :class:`PopulationBasedTraining`: the worse trials continue from the better ones'
  checkpoints with mutated configs.
* :class:`PB2` (``ftnb.schedulers.pb2.PB2``): Population Based Bandits, PBT whose new configs
  a GP-UCB bandit picks within bounds (``pip install 'ftnb[pb2]'``).
* :class:`ResourceChangingScheduler` (``ftnb.schedulers.resource_changing_scheduler``): wraps
  another and changes live trials' resources (``DistributeResources``,
  ``DistributeResourcesToTopJob`` or a function of yours); a change restarts the trial from its
  checkpoint, never as a failure.

A trial a scheduler stops ends exactly at the report that decided it, and reads ``STOPPED``
(with the reason as its note) in every view, never as completed. The scheduler's state is JSON
in the experiment state, saved before each decision is carried out: after a restore (a driver
SIGKILLed at any moment included) its decisions stand and its later ones are the same.
See docs/schedulers.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..lazy_names import lazy_attribute

if TYPE_CHECKING:
    from .trial_scheduler import TrialScheduler

#: Imported on first use, not with the package: the executor contract imports
#: ``ftnb.schedulers.decision_points`` into the driver, the fork server and every trial, none
#: of which needs a scheduler. Public name -> its module in this package; a class named here
#: that subclasses TrialScheduler is one of ftnb's own, rebuilt by name from a stored
#: description (a new scheduler is one line here).
_LAZY = {
    "ASHAScheduler": "async_hyperband",
    "AsyncHyperBandScheduler": "async_hyperband",
    "FIFOScheduler": "trial_scheduler",
    "HyperBandForBOHB": "hb_bohb",
    "HyperBandScheduler": "hyperband",
    "MedianStoppingRule": "median_stopping_rule",
    "PB2": "pb2",
    "PopulationBasedTraining": "pbt",
    "ResourceChangingScheduler": "resource_changing_scheduler",
    "SchedulerController": "trial_scheduler",
    "TrialScheduler": "trial_scheduler",
    "pbt_history": "pbt",
}

# (The names above, and the functions below.)
__all__ = [*_LAZY, "check_scheduler", "describe_scheduler", "initial_record", "same_scheduler",
           "scheduler_from_description"]


def __getattr__(name: str) -> Any:
    return lazy_attribute(globals(), _LAZY, name)


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))


def _own_class(name: Any, value: Any) -> Optional[type]:
    """``value`` when it is ftnb's own scheduler class named ``name``, else None."""
    from .trial_scheduler import TrialScheduler

    if isinstance(value, type) and issubclass(value, TrialScheduler) and (
            value is not TrialScheduler and value.__name__ == name):
        return value
    return None


def _built_in(name: Any) -> Optional[type]:
    """ftnb's own scheduler class named ``name`` (a stored description's ``class``), imported;
    None for any other name."""
    return _own_class(name, __getattr__(name)) if name in _LAZY else None


def _loaded_built_ins() -> list[type]:
    """ftnb's own scheduler classes whose modules are imported (an instance of any other
    cannot exist), without importing the others."""
    import sys

    found = []
    for name, module in _LAZY.items():
        cls = _own_class(name, getattr(sys.modules.get(f"{__name__}.{module}"), name, None))
        if cls is not None:
            found.append(cls)
    return found


def describe_scheduler(scheduler: TrialScheduler) -> dict:
    """What the experiment state records of ``scheduler``: its class's name and, for ftnb's own,
    the arguments that rebuild it (``settings``; None for a class of the user's)."""
    return {"class": type(scheduler).__name__, "settings": scheduler._ftnb_settings()}


def scheduler_from_description(description: dict) -> Optional[TrialScheduler]:
    """The scheduler ``description`` (:func:`describe_scheduler`) describes, rebuilt; None when
    it is a class of the user's (it must be given again)."""
    settings = description.get("settings")
    cls = _built_in(str(description.get("class")))
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
    from .trial_scheduler import FIFOScheduler, TrialScheduler

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
    # Every scheduler of ftnb's but FIFO compares trials (and a subclass of one); a wrapper
    # (ResourceChangingScheduler) compares when the scheduler it wraps does.
    target = getattr(scheduler, "base_scheduler", scheduler)
    compares = isinstance(target, tuple(cls for cls in _loaded_built_ins()
                                        if cls is not FIFOScheduler
                                        and cls.__name__ != "ResourceChangingScheduler"))
    if hasattr(scheduler, "_ftnb_check"):
        scheduler._ftnb_check()
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
