"""Trials whose resources change while the experiment runs (Ray Tune's
``ResourceChangingScheduler``, ``ray.tune.schedulers.resource_changing_scheduler``).

    from ftnb.schedulers import ASHAScheduler, ResourceChangingScheduler
    from ftnb.schedulers.resource_changing_scheduler import DistributeResources

    scheduler = ResourceChangingScheduler(
        base_scheduler=ASHAScheduler(),
        resources_allocation_function=DistributeResources(increase_by={"CPU": 1}))

It wraps a scheduler (FIFO when none is given) and, at every report the wrapped scheduler lets
go on, asks ``resources_allocation_function(tune_controller, trial, result, scheduler)`` what the
trial should have (a :class:`~ftnb.execution.placement_groups.PlacementGroupFactory`, a dict such
as ``{"CPU": 2}``, or None: no change). A different answer *changes* the trial's resources: the
report is a decision point, so the trial ends exactly there (PAUSED, never a failure), and
starts again from its latest checkpoint asking for the new resources; its record keeps each
change (``resource_changes``: iteration, old, new). The trainable reads what it has with
``get_context().get_trial_resources()`` (``Trainable.trial_resources``); checkpoint at every
report so that no iteration is redone.

The scheduler's state (the trials' base resources, the changes decided and not yet carried
out, the wrapped scheduler's own state) is JSON in the experiment state: a driver SIGKILLed at
any moment leaves the changes it decided to the restore, which carries them out once.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

from ..execution.placement_groups import PlacementGroupFactory
from .decision_points import DecisionPoints
from .trial_scheduler import FIFOScheduler, SchedulerController, Trial, TrialScheduler
from .trial_view import Trial as TrialView

__all__ = ["DistributeResources", "DistributeResourcesToTopJob", "ResourceChangingScheduler"]

logger = logging.getLogger(__name__)

_OWNER = "ResourceChangingScheduler"
_EVERY_REPORT = DecisionPoints("training_iteration", from_value=0)
_FINISHED = ("TERMINATED", "ERRORED")
_EPS = 1e-9


def _as_factory(value: Any, what: str) -> Optional[PlacementGroupFactory]:
    """``value`` (a factory, a dict of amounts, or None) as a factory."""
    if value is None or isinstance(value, PlacementGroupFactory):
        return value
    if isinstance(value, dict):
        return PlacementGroupFactory([value])
    raise TypeError(f"{what} returned {value!r} ({type(value).__name__}). Fix: return a "
                    "PlacementGroupFactory, a dict such as {'CPU': 2}, or None (no change).")


def _factory_state(factory: Optional[PlacementGroupFactory]) -> Optional[dict]:
    return None if factory is None else {"bundles": factory.bundles,
                                         "strategy": factory.strategy}


def _factory_from_state(state: Optional[dict]) -> Optional[PlacementGroupFactory]:
    return None if not state else PlacementGroupFactory(state["bundles"], state["strategy"])


class DistributeResources:
    """Spreads the free CPUs and GPUs evenly over the live trials (Ray Tune's
    ``DistributeResources``): at each report, a trial may grow to its share (the executor's
    totals, less ``reserve_resources``, divided by the live trials) in steps of
    ``increase_by`` (default: 1 GPU when the trial's base resources ask for a GPU, else 1
    CPU), at most ``increase_by_times`` steps (-1: no limit), never past what is free, and
    never below the resources it started with. ``add_bundles``: the steps are new bundles;
    otherwise they are spread over the base bundles. A subclass overrides
    :meth:`added_steps`."""

    def __init__(self, add_bundles: bool = False, increase_by: Optional[dict] = None,
                 increase_by_times: int = -1,
                 reserve_resources: Optional[dict] = None) -> None:
        owner = type(self).__name__
        if not isinstance(add_bundles, bool):
            raise TypeError(f"{owner}(add_bundles={add_bundles!r}) must be True or False.")
        self.increase_by = _checked_amounts(owner, "increase_by", increase_by, positive=True)
        self.reserve_resources = _checked_amounts(owner, "reserve_resources",
                                                  reserve_resources, positive=False)
        if isinstance(increase_by_times, bool) or not isinstance(increase_by_times, int) or (
                increase_by_times == 0 or increase_by_times < -1):
            raise ValueError(f"{owner}(increase_by_times={increase_by_times!r}) is invalid. "
                             "Fix: -1 (no limit) or a whole number >= 1.")
        self.add_bundles = add_bundles
        self.increase_by_times = increase_by_times

    def settings(self) -> dict:
        """The arguments that rebuild it."""
        return {"add_bundles": self.add_bundles, "increase_by": self.increase_by,
                "increase_by_times": self.increase_by_times,
                "reserve_resources": self.reserve_resources}

    def __call__(self, tune_controller: Any, trial: Any, result: dict,
                 scheduler: "ResourceChangingScheduler") -> Optional[PlacementGroupFactory]:
        base = scheduler.base_trial_resources
        if base is None or not isinstance(result.get("training_iteration"), int):
            return None
        step = self.step(base)
        totals = tune_controller.get_total_resources()
        total = {k: totals.get(k, 0.0) - (self.reserve_resources or {}).get(k, 0.0)
                 for k in step}
        live = list(tune_controller.get_live_trials())
        # (A change decided and not yet carried out counts at its new resources.)
        used = {k: sum(scheduler.upcoming_trial_resources(tune_controller, t)
                       .required_resources.get(k, 0.0) for t in live) for k in step}
        current = trial.placement_group_factory.required_resources
        base_total = base.required_resources
        have = _steps_in({k: current.get(k, 0.0) - base_total.get(k, 0.0) for k in step}, step)
        free = _steps_in({k: total[k] - used[k] for k in step}, step)
        steps = self.added_steps(tune_controller, trial, result, scheduler, have=have,
                                 free=free, total=total, live=live)
        if self.increase_by_times >= 1:
            steps = min(steps, self.increase_by_times)
        return self.build(base, max(0, steps), step)

    def added_steps(self, tune_controller: Any, trial: Any, result: dict, scheduler: Any, *,
                    have: int, free: int, total: dict, live: list) -> int:
        """How many steps of :meth:`step` the trial should have beyond its base resources:
        its even share, within what it has plus what is free."""
        base_total = scheduler.base_trial_resources.required_resources
        step = self.step(scheduler.base_trial_resources)
        share = _steps_in({k: total[k] / max(1, len(live)) - base_total.get(k, 0.0)
                           for k in step}, step)
        return min(share, have + free)

    def step(self, base: PlacementGroupFactory) -> dict:
        """The amounts a trial grows by at a time."""
        if self.increase_by:
            return dict(self.increase_by)
        return {"GPU": 1.0} if base.required_resources.get("GPU") else {"CPU": 1.0}

    def build(self, base: PlacementGroupFactory, steps: int,
              step: dict) -> PlacementGroupFactory:
        """``base`` grown by ``steps`` times ``step``."""
        bundles = base.bundles
        if self.add_bundles:
            bundles += [dict(step) for _ in range(steps)]
        else:
            for n in range(steps):
                bundle = bundles[n % len(bundles)]
                for key, amount in step.items():
                    bundle[key] = bundle.get(key, 0) + amount
        return PlacementGroupFactory(bundles, base.strategy)


class DistributeResourcesToTopJob(DistributeResources):
    """Gives every free CPU and GPU to the best live trial by ``metric`` and ``mode`` (the
    scheduler's when not given; Ray Tune's ``DistributeResourcesToTopJob``); the others keep
    what they have unless less is free, and never fall below their base resources."""

    def __init__(self, add_bundles: bool = False, increase_by: Optional[dict] = None,
                 increase_by_times: int = -1, reserve_resources: Optional[dict] = None,
                 metric: Optional[str] = None, mode: Optional[str] = None) -> None:
        super().__init__(add_bundles, increase_by, increase_by_times, reserve_resources)
        if mode not in (None, "min", "max"):
            raise ValueError(f"DistributeResourcesToTopJob(mode={mode!r}) is invalid. Fix: "
                             "mode='min' or mode='max' (or None: the scheduler's).")
        self.metric, self.mode = metric, mode

    def settings(self) -> dict:
        return {**super().settings(), "metric": self.metric, "mode": self.mode}

    def added_steps(self, tune_controller: Any, trial: Any, result: dict, scheduler: Any, *,
                    have: int, free: int, total: dict, live: list) -> int:
        metric = self.metric or scheduler.metric
        mode = self.mode or scheduler.mode
        if not metric or not mode:
            raise ValueError("DistributeResourcesToTopJob needs a metric and a mode. Fix: "
                             "DistributeResourcesToTopJob(metric='loss', mode='min') or "
                             "TuneConfig(metric=..., mode=...).")
        sign = 1.0 if mode == "max" else -1.0

        def score(t: Any) -> float:
            value = (result if t.trial_id == trial.trial_id else t.last_result or {}).get(metric)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return sign * value if ok and math.isfinite(value) else -math.inf

        best = max(live, key=score, default=None)
        if best is not None and best.trial_id == trial.trial_id:
            return have + free
        return min(have, have + free)


def _checked_amounts(owner: str, name: str, value: Any, positive: bool) -> Optional[dict]:
    if value is None:
        return None
    fix = f"Fix: e.g. {name}={{'CPU': 1}} (keys 'CPU', 'GPU')."
    if not isinstance(value, dict) or not value:
        raise TypeError(f"{owner}({name}={value!r}) must be a dict of amounts. {fix}")
    checked = {}
    for key, amount in value.items():
        canonical = {"cpu": "CPU", "gpu": "GPU"}.get(str(key).lower())
        ok = isinstance(amount, (int, float)) and not isinstance(amount, bool) and (
            math.isfinite(amount) and (amount > 0 if positive else amount >= 0))
        if canonical is None or not ok:
            raise ValueError(f"{owner}({name}={value!r}): {key!r}: {amount!r} is invalid "
                             f"(a number {'>' if positive else '>='} 0 of CPU or GPU). {fix}")
        checked[canonical] = float(amount)
    return checked


def _steps_in(amounts: dict, step: dict) -> int:
    """How many whole ``step``s fit in ``amounts`` (negative when it is short)."""
    return min(math.floor(amounts.get(k, 0.0) / v + _EPS) for k, v in step.items())


def _default_allocation() -> DistributeResources:
    return DistributeResources()


class ResourceChangingScheduler(TrialScheduler):
    """Changes the resources of live trials (Ray Tune's ``ResourceChangingScheduler``): see the
    module's docstring. ``base_scheduler``: the scheduler whose decisions stand (None: FIFO);
    ``resources_allocation_function``: ``f(tune_controller, trial, result, scheduler)``
    returning the trial's new resources or None (default :class:`DistributeResources`; None:
    resources never change). ``tune_controller`` is an ``ftnb.execution.tune_controller.
    TuneController``, ``trial`` an ``ftnb.experiment.Trial``."""

    def __init__(self, base_scheduler: Optional[TrialScheduler] = None,
                 resources_allocation_function: Optional[Callable[..., Any]] = (
                     _default_allocation())) -> None:
        if base_scheduler is None:
            base_scheduler = FIFOScheduler()
        if not isinstance(base_scheduler, TrialScheduler) or isinstance(
                base_scheduler, ResourceChangingScheduler):
            raise TypeError(f"{_OWNER}(base_scheduler={base_scheduler!r}) must be a "
                            "TrialScheduler other than a ResourceChangingScheduler. Fix: e.g. "
                            "base_scheduler=ASHAScheduler(), or None (FIFO).")
        if resources_allocation_function is not None and not callable(
                resources_allocation_function):
            raise TypeError(
                f"{_OWNER}(resources_allocation_function={resources_allocation_function!r}) "
                "must be callable as f(tune_controller, trial, result, scheduler). Fix: e.g. "
                "DistributeResources().")
        self._base_scheduler = base_scheduler
        self._allocate = resources_allocation_function
        self._base_trial_resources: Optional[PlacementGroupFactory] = None
        #: Per trial, the resources it restarts with: decided at a report, carried out when its
        #: attempt has ended there.
        self._reallocate: dict[str, PlacementGroupFactory] = {}

    # -- the wrapped scheduler -----------------------------------------------------------------
    @property
    def base_scheduler(self) -> TrialScheduler:
        return self._base_scheduler

    @property
    def metric(self) -> Optional[str]:
        return self._base_scheduler.metric

    @property
    def mode(self) -> Optional[str]:
        return self._base_scheduler.mode

    @property
    def base_trial_resources(self) -> Optional[PlacementGroupFactory]:
        """The resources every trial starts from, as Ray has it. ftnb takes those the first
        trial it decides on asked for."""
        return self._base_trial_resources

    @property
    def _ftnb_exploits(self) -> bool:  # (PBT's exploits: see ftnb.core.scheduling)
        return bool(getattr(self._base_scheduler, "_ftnb_exploits", False))

    @property
    def _ftnb_check_space(self) -> Optional[Callable[[Any], None]]:  # (PBT's check)
        return getattr(self._base_scheduler, "_ftnb_check_space", None)

    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              **spec: Any) -> bool:
        return self._base_scheduler.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        self._base_scheduler.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: SchedulerController, trial: Trial) -> None:
        self._reallocate.pop(trial.trial_id, None)
        self._base_scheduler.on_trial_error(tune_controller, trial)

    def on_trial_complete(self, tune_controller: SchedulerController, trial: Trial,
                          result: Optional[dict]) -> None:
        self._reallocate.pop(trial.trial_id, None)
        self._base_scheduler.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: SchedulerController, trial: Trial) -> None:
        self._reallocate.pop(trial.trial_id, None)
        self._base_scheduler.on_trial_remove(tune_controller, trial)

    def _ftnb_check(self) -> None:
        """Refuse, before any work, an allocation function that cannot decide."""
        if isinstance(self._allocate, DistributeResourcesToTopJob) and not (
                (self._allocate.metric or self.metric) and (self._allocate.mode or self.mode)):
            raise ValueError("DistributeResourcesToTopJob ranks trials by a metric, but has "
                             "none. Fix: DistributeResourcesToTopJob(metric='loss', "
                             "mode='min'), or TuneConfig(metric=..., mode=...).")

    def decision_points(self, trial: Trial) -> Optional[DecisionPoints]:
        return _EVERY_REPORT  # (a change ends the trial exactly at the report it is decided at)

    def stop_note(self, trial: Trial) -> Optional[str]:
        return self._base_scheduler.stop_note(trial)

    def debug_string(self) -> str:
        return f"{self._base_scheduler.debug_string()} With {_OWNER}."

    # -- the changes ---------------------------------------------------------------------------
    def on_trial_result(self, tune_controller: SchedulerController, trial: Trial,
                        result: dict) -> str:
        decision = self._base_scheduler.on_trial_result(tune_controller, trial, result)
        if decision not in (TrialScheduler.CONTINUE, TrialScheduler.NOOP):
            return decision
        new = self.reallocate_trial_resources_if_needed(tune_controller, trial, result)
        if new is None:
            return decision
        self._reallocate[trial.trial_id] = new
        return TrialScheduler.PAUSE

    def reallocate_trial_resources_if_needed(self, tune_controller: Any, trial: Trial,
                                             result: dict) -> Optional[PlacementGroupFactory]:
        """The resources ``trial`` should restart with, None when they stay as they are (or
        the function's answer can never be had here: it says so on stderr)."""
        if self._allocate is None:
            return None
        view = TrialView(trial, tune_controller)
        current = view.placement_group_factory
        if self._base_trial_resources is None:
            self._base_trial_resources = current
        name = getattr(self._allocate, "__name__", type(self._allocate).__name__)
        new = _as_factory(self._allocate(tune_controller, view, result, self),
                          f"{_OWNER}(resources_allocation_function={name})")
        if new is None or new == current:
            return None
        problem = tune_controller.resources_problem(new)
        if problem:
            logger.warning("trial %s keeps %s: %s(resources_allocation_function=%s) asked for "
                           "%r, which can never be had here (%s)", trial.trial_id, current,
                           _OWNER, name, new, problem)
            return None
        return new

    def upcoming_trial_resources(self, tune_controller: Any,
                                 trial: Trial) -> PlacementGroupFactory:
        """What ``trial`` asks for once the change decided for it, if any, is carried out."""
        upcoming = self._reallocate.get(trial.trial_id)
        return upcoming if upcoming is not None else tune_controller.get_trial_resources(trial)

    def choose_trial_to_run(self, tune_controller: SchedulerController) -> Optional[Trial]:
        """A trial whose change is due (its attempt ended at the report it was decided at)
        restarts first, with its new resources; else the wrapped scheduler chooses."""
        for trial_id, new in list(self._reallocate.items()):
            trial = tune_controller.get_trial(trial_id)
            if trial.status in _FINISHED:
                del self._reallocate[trial_id]
            elif trial.status == "PAUSED":  # (its attempt ended at the change)
                tune_controller.change_trial_resources(trial, new, by=_OWNER)  # type: ignore
                return trial
            elif tune_controller.status_of(trial) != "PAUSED" and (
                    tune_controller.get_trial_resources(trial) == new):  # type: ignore
                del self._reallocate[trial_id]  # carried out: it runs with them
        return self._base_scheduler.choose_trial_to_run(tune_controller)

    # -- the state -----------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {"base": self._base_scheduler.get_state(),
                "base_trial_resources": _factory_state(self._base_trial_resources),
                "reallocate": {k: _factory_state(v) for k, v in self._reallocate.items()}}

    def set_state(self, state: dict) -> None:
        self._base_scheduler.set_state(state.get("base") or {})
        self._base_trial_resources = _factory_from_state(state.get("base_trial_resources"))
        self._reallocate = {k: _factory_from_state(v)  # type: ignore[misc]
                            for k, v in (state.get("reallocate") or {}).items()}

    def _ftnb_settings(self) -> Optional[dict]:
        from . import describe_scheduler

        allocate = self._allocate
        if type(self) is not ResourceChangingScheduler:
            return None
        if allocate is None:
            function = None
        elif type(allocate) in (DistributeResources, DistributeResourcesToTopJob):
            function = {"class": type(allocate).__name__, "settings": allocate.settings()}
        else:
            return None  # a function of the user's: a restore needs it given again
        base = describe_scheduler(self._base_scheduler)
        if base["settings"] is None:
            return None
        return {"base_scheduler": base, "resources_allocation_function": function}

    @classmethod
    def _from_settings(cls, settings: dict) -> "ResourceChangingScheduler":
        from . import scheduler_from_description

        function = settings.get("resources_allocation_function")
        allocate = None
        if function is not None:
            kind = {"DistributeResources": DistributeResources,
                    "DistributeResourcesToTopJob": DistributeResourcesToTopJob}[function["class"]]
            allocate = kind(**function["settings"])
        return cls(scheduler_from_description(settings["base_scheduler"]), allocate)
