"""Population Based Bandits (Ray Tune's ``ray.tune.schedulers.pb2.PB2``), fault-tolerant.

PB2 is Population Based Training whose explore step is a bandit: at each perturbation point a
trial in the bottom ``quantile_fraction`` exploits a top one exactly as
:class:`~ftnb.schedulers.PopulationBasedTraining` does (the same three-step exploit: the donor's
checkpoint staged, the decision saved, then the trial's record takes the new config and the copy
in one write), and its new config is the point of ``hyperparam_bounds`` that a GP-UCB bandit
picks: a Gaussian process with the time-varying kernel of the PB2 paper (Parker-Holder et al.,
2020), fitted on how fast each trial's score changed over its recent intervals, given where the
new interval starts (the time, and the donor's score). See :mod:`ftnb.schedulers.pb2_bandit`.

    from ftnb.schedulers import PB2

    pb2 = PB2(time_attr="training_iteration", perturbation_interval=4,
              hyperparam_bounds={"lr": [1e-4, 1e-1], "momentum": [0.8, 0.99]})
    ftnb.Tuner(train, param_space={"lr": ftnb.loguniform(1e-4, 1e-1),
                                   "momentum": ftnb.uniform(0.8, 0.99)},
               tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=8,
                                           scheduler=pb2)).fit()

Ray fits the GP with GPy; ftnb with scikit-learn (``pip install 'ftnb[pb2]'``), imported only
when a config is explored. The bandit's data (one row per trial and perturbation point) is JSON
in the experiment state with the population's, saved before each decision is carried out, so a
restore after a driver SIGKILL continues with the same data. See docs/schedulers.md.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import random
import sys
from typing import Any, Callable, Optional

from .pbt import PopulationBasedTraining, _missing_keys
from .trial_scheduler import SchedulerController, Trial

__all__ = ["PB2"]

logger = logging.getLogger(__name__)

_OWNER = "PB2"

#: The bandit's rows kept in the state (the GP is fitted on the latest
#: :data:`~ftnb.schedulers.pb2_bandit.WINDOW` changes; older rows only weigh on the state saves).
_MAX_ROWS = 600


def _has_sklearn() -> bool:
    """Whether scikit-learn can be imported (without importing it: that takes a second)."""
    try:
        return importlib.util.find_spec("sklearn") is not None
    except ValueError:  # (in sys.modules without a spec: None there blocks the import)
        return sys.modules.get("sklearn") is not None


def _bounds_paths(bounds: Any, path: tuple = ()) -> list[tuple[tuple, tuple[float, float]]]:
    """``hyperparam_bounds`` checked and flattened: ``[(key path, (low, high)), ...]``."""
    where = "hyperparam_bounds" + "".join(f"[{k!r}]" for k in path)
    if not isinstance(bounds, dict):
        raise TypeError(f"{_OWNER}({where}={bounds!r}) must be a dict of [low, high] bounds, "
                        "e.g. hyperparam_bounds={'lr': [1e-4, 1e-1]}.")
    flat = []
    for key, value in bounds.items():
        here = f"{where}[{key!r}]"
        if isinstance(value, dict):
            if not value:
                raise ValueError(f"{_OWNER}({here}={{}}) has no bounds. Fix: give the nested "
                                 "hyperparameters' [low, high], or leave the key out.")
            flat += _bounds_paths(value, path + (key,))
            continue
        numbers = isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value)
        if not numbers:
            raise ValueError(
                f"{_OWNER}({here}={value!r}) must be [low, high], two finite numbers (PB2 "
                "explores continuous ranges, as Ray's). Fix: e.g. [1e-4, 1e-1]; for categories "
                "use PopulationBasedTraining(hyperparam_mutations={...: [a, b, c]}).")
        low, high = value
        if low > high:
            raise ValueError(f"{_OWNER}({here}={value!r}) has low > high. Fix: "
                             f"[{high!r}, {low!r}].")
        flat.append((path + (key,), (low, high)))
    return flat


def _as_lists(bounds: dict) -> dict:
    return {k: _as_lists(v) if isinstance(v, dict) else list(v) for k, v in bounds.items()}


def _get(config: Any, path: tuple) -> Any:
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config


def _set(config: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value


class PB2(PopulationBasedTraining):
    """Population Based Bandits (Ray Tune's ``tune.schedulers.pb2.PB2``): PBT whose exploiting
    trials take a config a GP-UCB bandit picks within ``hyperparam_bounds``.

    Args (Ray's): ``time_attr``, ``metric``/``mode`` (or TuneConfig's),
    ``perturbation_interval``, ``hyperparam_bounds`` (``{name: [low, high]}``, nested dicts for
    nested configs), ``quantile_fraction`` (0 to 0.5), ``log_config``, ``require_attrs``,
    ``synch``, ``custom_explore_fn`` (called with the bandit's config, returns it).

    The perturbation points, the exploit and the history (:func:`ftnb.schedulers.pbt_history`)
    are PopulationBasedTraining's. The first exploits, before any trial has two scores with
    the same config, take the donor's config as it is (as Ray's PB2: nothing to learn from yet).
    A value that is an ``int`` in the donor's config stays one (rounded within the bounds).
    Every bounded key must be in ``param_space`` (Ray samples a missing one uniformly; ftnb
    keeps a trial's config as its space made it): a missing key is a ``ValueError``.
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        perturbation_interval: float = 60.0,
        hyperparam_bounds: Optional[dict] = None,
        quantile_fraction: float = 0.25,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        custom_explore_fn: Optional[Callable[[dict], dict]] = None,
    ) -> None:
        if not _has_sklearn():
            raise ImportError("PB2 fits a Gaussian process with scikit-learn, which is not "
                              "installed. Fix: pip install 'ftnb[pb2]' (or pip install "
                              "scikit-learn).")
        if not hyperparam_bounds:
            raise ValueError(f"{_OWNER}(hyperparam_bounds={hyperparam_bounds!r}) must say what "
                             "to explore. Fix: e.g. hyperparam_bounds={'lr': [1e-4, 1e-1]}.")
        flat = _bounds_paths(hyperparam_bounds)
        try:
            super().__init__(
                time_attr=time_attr, metric=metric, mode=mode,
                perturbation_interval=perturbation_interval,
                hyperparam_mutations=_as_lists(hyperparam_bounds),
                quantile_fraction=quantile_fraction, resample_probability=0.0,
                custom_explore_fn=custom_explore_fn, log_config=log_config,
                require_attrs=require_attrs, synch=synch)
        except (TypeError, ValueError) as exc:  # (PBT's checks: say whose arguments they are)
            raise type(exc)(str(exc).replace("PopulationBasedTraining(", f"{_OWNER}(")) from None
        self._hyperparam_bounds = _as_lists(hyperparam_bounds)
        self._paths = [path for path, _ in flat]
        self._bounds = [bounds for _, bounds in flat]
        # -- the bandit's state (get_state / set_state) --
        #: One row per trial and perturbation point: trial, time, reward (signed), values.
        self._rows: list[dict] = []
        #: The values picked since the data last moved on in time (GP-BUCB's batch), and that
        #: time.
        self._pending: list[list[float]] = []
        self._pending_time: Optional[float] = None
        #: The row an exploit being decided adds when it is carried out (not state).
        self._proposal: Optional[dict] = None

    # -- settings ------------------------------------------------------------------------------
    def _ftnb_settings(self) -> Optional[dict]:
        if type(self) is not PB2 or self._custom_explore_fn is not None:
            return None  # (a function: it must be given again)
        return {
            "time_attr": self._time_attr, "metric": self._metric, "mode": self._mode,
            "perturbation_interval": self._perturbation_interval,
            "hyperparam_bounds": copy.deepcopy(self._hyperparam_bounds),
            "quantile_fraction": self._quantile_fraction,
            "log_config": self._log_config, "require_attrs": self._require_attrs,
            "synch": self._synch,
        }

    @classmethod
    def _from_settings(cls, settings: dict) -> "PB2":
        return cls(**settings)

    # -- checks --------------------------------------------------------------------------------
    def _missing(self, config: Any, what: str) -> None:
        missing = _missing_keys(config, self._hyperparam_mutations)
        if missing:
            raise ValueError(
                f"{_OWNER}(hyperparam_bounds=...) explores {', '.join(missing)}, which {what} "
                "does not have (Ray samples it into the config; ftnb keeps a trial's config as "
                "its search space made it). Fix: put the key in param_space too, e.g. "
                "param_space={'lr': ftnb.loguniform(1e-4, 1e-1)}.")

    def _ftnb_check_space(self, param_space: Any) -> None:
        if isinstance(param_space, dict):
            self._missing(param_space, "param_space")

    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        config = trial.config if isinstance(trial.config, dict) else {}
        self._missing(config, f"trial {trial.trial_id}'s config")
        self._values(trial)
        super().on_trial_add(tune_controller, trial)

    def _values(self, trial: Trial) -> list[float]:
        values = []
        for path in self._paths:
            value = _get(trial.config, path)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"{_OWNER}(hyperparam_bounds=...): trial {trial.trial_id}'s "
                    f"{'/'.join(map(str, path))}={value!r} is not a number, so the bandit cannot "
                    "explore it. Fix: a number in param_space (e.g. ftnb.uniform(low, high)), "
                    "or leave the key out of hyperparam_bounds.")
            values.append(float(value))
        return values

    # -- the bandit ----------------------------------------------------------------------------
    def _scored(self, trial: Trial, time: float, score: float) -> None:
        row = {"trial": trial.trial_id, "time": time, "reward": score,
               "values": self._values(trial)}
        mine = [r for r in self._rows if r["trial"] == trial.trial_id]
        if mine and mine[-1]["time"] == time and mine[-1]["values"] == row["values"]:
            self._rows.remove(mine[-1])  # (the same point reported again: the latest counts)
        self._add_row(row)

    def _add_row(self, row: dict) -> None:
        self._rows.append(row)
        if len(self._rows) <= _MAX_ROWS:
            return
        # The oldest go, but never a trial's last row (its next change starts there).
        keep = set({r["trial"]: i for i, r in enumerate(self._rows)}.values())
        by_age = sorted(range(len(self._rows)), key=lambda i: (self._rows[i]["time"], i))
        drop = set([i for i in by_age if i not in keep][:len(self._rows) - _MAX_ROWS])
        self._rows = [r for i, r in enumerate(self._rows) if i not in drop]

    def _explored(self, trial: Trial, donor: Trial) -> dict:
        from .pb2_bandit import suggest

        latest_time = max((r["time"] for r in self._rows), default=0.0)
        if self._pending_time is None or latest_time > self._pending_time:
            self._pending, self._pending_time = [], latest_time  # a new batch
        state = self._trial_state.get(trial.trial_id) or {}
        donor_state = self._trial_state.get(donor.trial_id) or {}
        time = float(state.get("last_train_time") or 0.0)
        reward = donor_state.get("last_score")
        reward = float(reward) if reward is not None else 0.0
        picked = suggest(self._rows, self._bounds, time=time, reward=reward,
                         pending=self._pending, seed=random.getrandbits(32))
        new = copy.deepcopy(donor.config)
        if picked is None:
            logger.info("[pb2]: nothing to learn from; trial %s takes trial %s's config as it is",
                        trial.trial_id, donor.trial_id)
        else:
            for path, (low, high), value in zip(self._paths, self._bounds, picked):
                if isinstance(_get(donor.config, path), int):
                    value = min(max(round(value), math.ceil(low)), math.floor(high))
                _set(new, path, value)
        if self._custom_explore_fn is not None:
            new = self._custom_explore_fn(new)
            if not isinstance(new, dict):
                raise TypeError(f"{_OWNER}(custom_explore_fn={self._custom_explore_fn!r}) "
                                f"returned {new!r}; it must return the config (a dict).")
        values = [_get(new, path) for path in self._paths]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            values = picked if picked is not None else self._values(donor)
        self._proposal = {"trial": trial.trial_id, "time": time, "reward": reward,
                          "values": [float(v) for v in values]}
        return new

    def _exploit(self, tune_controller: SchedulerController, trial: Trial,
                 upper: list[str]) -> bool:
        self._proposal = None
        done = super()._exploit(tune_controller, trial, upper)
        if done and self._proposal is not None:
            # The trial's next interval starts from the donor's score with the new values.
            self._add_row(self._proposal)
            self._pending.append(list(self._proposal["values"]))
        self._proposal = None
        return done

    def debug_string(self) -> str:
        return (f"PB2: {self._num_checkpoints} checkpoints, {self._num_perturbations} perturbs, "
                f"{len(self._rows)} data rows")

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {**super().get_state(),
                "pb2": {"rows": copy.deepcopy(self._rows),
                        "pending": copy.deepcopy(self._pending),
                        "pending_time": self._pending_time}}

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        mine = state.get("pb2") or {}
        self._rows = [dict(r) for r in mine.get("rows") or []]
        self._pending = [list(v) for v in mine.get("pending") or []]
        self._pending_time = mine.get("pending_time")
