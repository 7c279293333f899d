"""Population Based Training (Ray Tune's ``PopulationBasedTraining``), fault-tolerant.

At each perturbation interval of ``time_attr`` a trial's report waits for the scheduler (a
decision point). A trial in the bottom ``quantile_fraction`` of the population then *exploits*
one of the top ``quantile_fraction``: it is restarted (a new attempt, never a failure) from that
trial's latest checkpoint with that trial's config, *explored* (resampled with
``resample_probability``, else numbers scaled by one of ``perturbation_factors`` and list values
shifted to a neighbour, then ``custom_explore_fn``).

    from ftnb.schedulers import PopulationBasedTraining

    pbt = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=4,
        hyperparam_mutations={"lr": ftnb.loguniform(1e-4, 1e-1), "batch": [16, 32, 64]})
    ftnb.Tuner(train, param_space=space, tune_config=ftnb.TuneConfig(
        metric="loss", mode="min", num_samples=8, scheduler=pbt)).fit()

How ftnb carries an exploit out (the controller's part, ``ftnb.core.exploits``): when the
decision is made the donor's checkpoint is copied into the exploiting trial's folder (so the
donor's checkpoint retention can never delete it from under it); the decision is saved with the
experiment state before the trial is answered; once the trial's attempt has ended at that report,
its record takes the new config and the copy as its latest checkpoint in one atomic write, and
it starts again from there. A driver killed at any moment leaves either no exploit or the whole
of it, never a trial with the new config and its old checkpoint (or the reverse), and a restore
finishes one that was decided and not yet carried out, once.

The population's state (scores, perturbation times, the exploit history: Ray's
``pbt_global.txt`` / ``pbt_policy_<trial>.txt``) is plain JSON in the experiment state, saved in
step with the trial records; :func:`pbt_history` reads it. See docs/schedulers.md.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
from typing import Any, Callable, Optional, Sequence

from .decision_points import DecisionPoints
from .pbt_explore import (
    _check_mutations,
    _has_function,
    _missing_keys,
    _mutated,
    explore,
    quantiles,
)
from .trial_scheduler import (
    FIFOScheduler,
    SchedulerController,
    Trial,
    TrialScheduler,
    _checked_metric,
    _checked_mode,
    _checked_number,
    _checked_time_attr,
)

__all__ = ["PopulationBasedTraining", "explore", "pbt_history", "quantiles"]

logger = logging.getLogger(__name__)

_OWNER = "PopulationBasedTraining"
_FINISHED = ("TERMINATED", "ERRORED")


class PopulationBasedTraining(FIFOScheduler):
    """Population Based Training (Ray Tune's ``tune.schedulers.PopulationBasedTraining``).

    Args (Ray's): ``time_attr`` (a result key that grows: ``training_iteration``,
    ``time_total_s``, ...), ``metric``/``mode`` (or TuneConfig's), ``perturbation_interval``,
    ``burn_in_period``, ``hyperparam_mutations``, ``quantile_fraction`` (0 to 0.5),
    ``resample_probability``, ``perturbation_factors``, ``custom_explore_fn``, ``log_config``
    (keep the old and new configs in the exploit history), ``require_attrs`` (a report without
    ``time_attr`` or the metric is an error; False: it is ignored), ``synch`` (synchronous PBT:
    every trial waits at each perturbation point until the whole population reached it).

    Perturbation points: the first report at or past ``max(burn_in_period,
    perturbation_interval) + n * perturbation_interval`` (n = 0, 1, ...) of each trial. With
    ``training_iteration`` that is exactly Ray's rule; with a time in seconds Ray's points drift
    with each report (the interval counts from the last perturbation), ftnb's stay on the grid.

    An exploiting trial keeps its own ``training_iteration`` count and ``time_total_s`` (its
    result log has each iteration once); what it takes from the donor is the checkpoint (the
    state the trainable restores) and the config. Ray's restored trainable takes the donor's
    iteration count instead. Report a checkpoint at least every ``perturbation_interval``: the
    donor's latest checkpoint is what is copied.
    """

    #: Its trials continue from others' checkpoints (the controller removes the staged copies
    #: a dead driver left when such a trial ends).
    _ftnb_exploits = True

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Optional[dict] = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: Sequence[float] = (1.2, 0.8),
        custom_explore_fn: Optional[Callable[[dict], dict]] = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
    ) -> None:
        _checked_time_attr(_OWNER, time_attr, "'training_iteration' or 'time_total_s'")
        self._metric = _checked_metric(_OWNER, metric)
        self._mode = _checked_mode(_OWNER, mode)
        _checked_number(_OWNER, "perturbation_interval", perturbation_interval)
        _checked_number(_OWNER, "burn_in_period", burn_in_period, above=False)
        hyperparam_mutations = {} if hyperparam_mutations is None else hyperparam_mutations
        _check_mutations(hyperparam_mutations)
        if custom_explore_fn is not None and not callable(custom_explore_fn):
            raise TypeError(f"{_OWNER}(custom_explore_fn={custom_explore_fn!r}) must be a "
                            "function that takes a config (dict) and returns it explored.")
        if not hyperparam_mutations and custom_explore_fn is None:
            raise ValueError(
                f"{_OWNER}() needs hyperparam_mutations or custom_explore_fn (what to change in "
                "an exploiting trial's config). Fix: e.g. hyperparam_mutations={'lr': "
                "ftnb.loguniform(1e-4, 1e-1)}.")
        ok = isinstance(quantile_fraction, (int, float)) and not isinstance(
            quantile_fraction, bool) and 0 <= quantile_fraction <= 0.5
        if not ok:
            raise ValueError(f"{_OWNER}(quantile_fraction={quantile_fraction!r}) is invalid. "
                             "Fix: a number from 0 to 0.5 (0.25: the bottom quarter exploits "
                             "the top quarter).")
        ok = isinstance(resample_probability, (int, float)) and not isinstance(
            resample_probability, bool) and 0 <= resample_probability <= 1
        if not ok:
            raise ValueError(f"{_OWNER}(resample_probability={resample_probability!r}) is "
                             "invalid. Fix: a probability from 0 to 1.")
        factors = list(perturbation_factors) if isinstance(
            perturbation_factors, (list, tuple)) else None
        if not factors or not all(isinstance(f, (int, float)) and not isinstance(f, bool)
                                  and math.isfinite(f) for f in factors):
            raise ValueError(f"{_OWNER}(perturbation_factors={perturbation_factors!r}) is "
                             "invalid. Fix: a tuple of numbers, e.g. (1.2, 0.8).")
        for name, flag in (("log_config", log_config), ("require_attrs", require_attrs),
                           ("synch", synch)):
            if not isinstance(flag, bool):
                raise TypeError(f"{_OWNER}({name}={flag!r}) must be True or False.")
        self._time_attr = time_attr
        self._perturbation_interval = perturbation_interval
        self._burn_in_period = burn_in_period
        self._hyperparam_mutations = hyperparam_mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._perturbation_factors = tuple(factors)
        self._custom_explore_fn = custom_explore_fn
        self._log_config = log_config
        self._require_attrs = require_attrs
        self._synch = synch
        #: The first perturbation point; the next are every perturbation_interval after it.
        self._start = max(float(burn_in_period), float(perturbation_interval))
        # -- the state (get_state / set_state) --
        #: Per trial id: last_score (signed: higher is better), last_train_time,
        #: last_perturbation_time, last_result ({time_attr, metric}).
        self._trial_state: dict[str, dict] = {}
        self._next_perturbation_sync = self._start
        self._num_checkpoints = 0
        self._num_perturbations = 0
        #: Every exploit decided, in order (Ray's pbt_global.txt).
        self._history: list[dict] = []
        #: Trials told to exploit that have not been started again since (not state: a restore
        #: starts every trial again anyway). They wait for a start, not for their turn.
        self._restarting: set[str] = set()

    # -- settings ------------------------------------------------------------------------------
    def _ftnb_settings(self) -> Optional[dict]:
        if type(self) is not PopulationBasedTraining or self._custom_explore_fn is not None:
            return None
        from ..search import encode_space

        if _has_function(self._hyperparam_mutations):
            return None

        def not_json(value: Any) -> Any:
            raise _NotJSON

        try:
            mutations = encode_space(self._hyperparam_mutations, not_json)
        except _NotJSON:
            return None  # (objects among a list's values: it must be given again)
        return {
            "time_attr": self._time_attr, "metric": self._metric, "mode": self._mode,
            "perturbation_interval": self._perturbation_interval,
            "burn_in_period": self._burn_in_period,
            "hyperparam_mutations": mutations,
            "quantile_fraction": self._quantile_fraction,
            "resample_probability": self._resample_probability,
            "perturbation_factors": list(self._perturbation_factors),
            "log_config": self._log_config, "require_attrs": self._require_attrs,
            "synch": self._synch,
        }

    @classmethod
    def _from_settings(cls, settings: dict) -> "PopulationBasedTraining":
        from ..search.space_json import decode_space

        settings = dict(settings)
        settings["hyperparam_mutations"] = decode_space(settings.get("hyperparam_mutations"))
        settings["perturbation_factors"] = tuple(settings.get("perturbation_factors")
                                                 or (1.2, 0.8))
        return cls(**settings)

    @property
    def metric_op(self) -> float:
        return 1.0 if self._mode != "min" else -1.0

    # -- Ray's hooks ---------------------------------------------------------------------------
    def on_trial_add(self, tune_controller: SchedulerController, trial: Trial) -> None:
        config = trial.config if isinstance(trial.config, dict) else {}
        missing = _missing_keys(config, self._hyperparam_mutations)
        if missing:
            raise ValueError(
                f"{_OWNER}(hyperparam_mutations=...) mutates {', '.join(missing)}, which trial "
                f"{trial.trial_id}'s config does not have (Ray samples it into the config; ftnb "
                "keeps a trial's config as its search space made it). Fix: put the key in "
                "param_space too, e.g. param_space={'lr': ftnb.loguniform(1e-4, 1e-1)}.")
        self._trial_state.setdefault(trial.trial_id, _new_state())

    def _ftnb_check_space(self, param_space: Any) -> None:
        """Before a new experiment starts: every key of ``hyperparam_mutations`` is in
        ``param_space`` (ValueError naming the missing ones and the fix)."""
        if not isinstance(param_space, dict):
            return
        missing = _missing_keys(param_space, self._hyperparam_mutations)
        if missing:
            raise ValueError(
                f"{_OWNER}(hyperparam_mutations=...) mutates {', '.join(missing)}, which "
                "param_space does not have (Ray samples it into the config; ftnb keeps a "
                "trial's config as its search space made it). Fix: put the key in param_space "
                "too, e.g. param_space={'lr': ftnb.loguniform(1e-4, 1e-1)}.")

    def decision_points(self, trial: Trial) -> Optional[DecisionPoints]:
        return DecisionPoints(self._time_attr, every=float(self._perturbation_interval),
                              offset=self._start - float(self._perturbation_interval))

    def stop_note(self, trial: Trial) -> Optional[str]:
        return None

    def _grid_index(self, time: float) -> int:
        """How many perturbation points ``time`` has reached."""
        if time < self._start:
            return 0
        return int((time - self._start) // self._perturbation_interval) + 1

    def on_trial_result(self, tune_controller: SchedulerController, trial: Trial,
                        result: dict) -> str:
        from ..storage.result_log import metric_value

        time = metric_value(result, self._time_attr)
        score = metric_value(result, self._metric) if self._metric else None
        for name, value in ((f"time_attr={self._time_attr!r}", time),
                            (f"metric={self._metric!r}", score)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                if self._require_attrs:
                    raise ValueError(
                        f"{_OWNER}({name}): trial {trial.trial_id}'s report at "
                        f"training_iteration={result.get('training_iteration')} has no number "
                        f"there (keys: {sorted(result)[:20]}). Fix: report it, or pass "
                        f"{_OWNER}(require_attrs=False) to skip such reports.")
                return TrialScheduler.CONTINUE
        state = self._trial_state.setdefault(trial.trial_id, _new_state())
        if time < self._burn_in_period:
            return TrialScheduler.CONTINUE
        if self._grid_index(time) <= self._grid_index(state["last_perturbation_time"]):
            return TrialScheduler.CONTINUE
        state["last_score"] = self.metric_op * score
        state["last_train_time"] = time
        state["last_result"] = {self._time_attr: time, self._metric: score}
        self._scored(trial, time, state["last_score"])
        if not self._synch:
            state["last_perturbation_time"] = time
            lower, upper = self._quantiles(tune_controller)
            if trial.trial_id in upper:
                self._num_checkpoints += 1
            if trial.trial_id in lower and self._exploit(tune_controller, trial, upper):
                return TrialScheduler.PAUSE
            for other in tune_controller.get_trials():
                if other.trial_id != trial.trial_id and other.trial_id not in (
                        self._restarting) and tune_controller.status_of(other) in (
                        "PENDING", "PAUSED"):
                    return TrialScheduler.PAUSE  # (time-multiplexed: as Ray, the others' turn)
            return TrialScheduler.CONTINUE
        # Synchronous: wait until every live trial reached this point.
        behind = [t for t in tune_controller.get_trials()
                  if t.trial_id != trial.trial_id and t.status not in _FINISHED
                  and self._trial_state.get(t.trial_id, _new_state())["last_train_time"]
                  < self._next_perturbation_sync]
        if behind:
            return TrialScheduler.PAUSE
        lower, upper = self._quantiles(tune_controller)
        exploited = False
        for trial_id in list(self._trial_state):
            other = tune_controller.get_trial(trial_id)
            if other.status in _FINISHED:
                continue
            self._trial_state[trial_id]["last_perturbation_time"] = time
        self._num_checkpoints += len(upper)
        for trial_id in lower:
            other = trial if trial_id == trial.trial_id else tune_controller.get_trial(trial_id)
            done = self._exploit(tune_controller, other, upper)
            exploited = exploited or (done and trial_id == trial.trial_id)
        times = [s["last_train_time"] for s in self._trial_state.values()]
        self._next_perturbation_sync = max(
            self._next_perturbation_sync + self._perturbation_interval, max(times))
        return TrialScheduler.PAUSE if exploited else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: SchedulerController, trial: Trial,
                          result: Optional[dict]) -> None:
        self._trial_ended(trial)

    def on_trial_error(self, tune_controller: SchedulerController, trial: Trial) -> None:
        self._trial_ended(trial)

    def _trial_ended(self, trial: Trial) -> None:
        self._trial_state.setdefault(trial.trial_id, _new_state())["finished"] = True
        self._restarting.discard(trial.trial_id)
        # An exploit decided at the report where the trial ended anyway (its stop criterion,
        # a stop): it never continued, so it did not exploit (the history says what happened).
        mine = [e for e in self._history if e["trial_id"] == trial.trial_id]
        if mine and mine[-1]["iteration"] >= int(trial.iteration) and (
                (trial.latest_checkpoint or {}).get("dir_name") != mine[-1]["checkpoint"]):
            self._history.remove(mine[-1])
            self._num_perturbations -= 1

    def choose_trial_to_run(self, tune_controller: SchedulerController) -> Optional[Trial]:
        """The PENDING or PAUSED trial that is furthest behind (Ray's fair share of time); in
        synchronous mode only one that has not reached the next perturbation point."""
        candidates = []
        for trial in tune_controller.get_trials():
            if trial.status not in ("PENDING", "PAUSED"):
                continue
            last = self._trial_state.get(trial.trial_id, _new_state())["last_train_time"]
            if self._synch and last >= self._next_perturbation_sync:
                continue
            candidates.append((last, trial))
        if not candidates:
            return None
        chosen = min(candidates, key=lambda c: c[0])[1]
        self._restarting.discard(chosen.trial_id)
        return chosen

    def debug_string(self) -> str:
        return (f"PopulationBasedTraining: {self._num_checkpoints} checkpoints, "
                f"{self._num_perturbations} perturbs")

    # -- exploit -------------------------------------------------------------------------------
    def _scored(self, trial: Trial, time: float, score: float) -> None:
        """``trial`` reached a perturbation point at ``time`` with ``score`` (signed: higher is
        better), before any exploit is decided there (Ray's ``_save_trial_state``; PB2 records
        the population's data here)."""

    def _explored(self, trial: Trial, donor: Trial) -> dict:
        """The config ``trial`` continues with, made from ``donor``'s (Ray's
        ``_get_new_config``; PB2 asks its bandit instead)."""
        return explore(donor.config, self._hyperparam_mutations, self._resample_probability,
                       self._perturbation_factors, self._custom_explore_fn)

    def _quantiles(self, tune_controller: SchedulerController) -> tuple[list[str], list[str]]:
        scores = {}
        for trial_id, state in self._trial_state.items():
            if state["last_score"] is None or state.get("finished"):
                continue
            if tune_controller.get_trial(trial_id).status in _FINISHED:
                continue
            scores[trial_id] = state["last_score"]
        return quantiles(scores, self._quantile_fraction, len(self._trial_state))

    def _exploit(self, tune_controller: SchedulerController, trial: Trial,
                 upper: list[str]) -> bool:
        """Have ``trial`` continue from a top trial's latest checkpoint with its config
        explored; False when there is no top trial with a checkpoint (nothing happens)."""
        candidates = [t for t in upper if t != trial.trial_id]
        if not candidates:
            return False
        donor = tune_controller.get_trial(random.choice(candidates))
        if not donor.latest_checkpoint:
            logger.info("[pbt]: trial %s has no checkpoint; trial %s does not exploit it",
                        donor.trial_id, trial.trial_id)
            return False
        old_config = donor.config
        new_config = self._explored(trial, donor)
        exploit = getattr(tune_controller, "exploit_trial", None)
        if exploit is None:
            raise TypeError(f"{_OWNER} needs a controller that can restart a trial from another "
                            "trial's checkpoint (ftnb's); this one cannot.")
        record = exploit(trial, donor, new_config)
        if record is None:
            return False
        state = self._trial_state.setdefault(trial.trial_id, _new_state())
        donor_state = self._trial_state.get(donor.trial_id, _new_state())
        entry = {
            "trial_id": trial.trial_id,
            "donor_id": donor.trial_id,
            "iteration": int(trial.iteration),
            "donor_iteration": int(donor.iteration),
            "donor_checkpoint": record["donor_checkpoint"],
            "donor_checkpoint_iteration": record["donor_checkpoint_iteration"],
            "checkpoint": record["into"],
            "score": state["last_score"] * self.metric_op
            if state["last_score"] is not None else None,
            "donor_score": donor_state["last_score"] * self.metric_op
            if donor_state["last_score"] is not None else None,
        }
        if self._log_config:
            entry["donor_config"] = old_config
            entry["config"] = record["config"]
        self._history.append(entry)
        self._restarting.add(trial.trial_id)
        self._num_perturbations += 1
        logger.info("[PBT] [Exploit] trial %s (score %s) continues from trial %s's %s "
                    "(score %s) with %s", trial.trial_id, entry["score"], donor.trial_id,
                    record["donor_checkpoint"], entry["donor_score"],
                    _mutated(record["config"], self._hyperparam_mutations))
        return True

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {
            "trials": copy.deepcopy(self._trial_state),
            "next_perturbation_sync": self._next_perturbation_sync,
            "num_checkpoints": self._num_checkpoints,
            "num_perturbations": self._num_perturbations,
            "history": copy.deepcopy(self._history),
        }

    def set_state(self, state: dict) -> None:
        self._trial_state = {k: {**_new_state(), **v}
                             for k, v in (state.get("trials") or {}).items()}
        self._next_perturbation_sync = state.get("next_perturbation_sync", self._start)
        self._num_checkpoints = int(state.get("num_checkpoints") or 0)
        self._num_perturbations = int(state.get("num_perturbations") or 0)
        self._history = list(state.get("history") or [])

    @property
    def history(self) -> list[dict]:
        """Every exploit decided so far, oldest first (see :func:`pbt_history`)."""
        return copy.deepcopy(self._history)


class _NotJSON(Exception):
    pass


def _new_state() -> dict:
    return {"last_score": None, "last_train_time": 0.0, "last_perturbation_time": 0.0,
            "last_result": None}


def pbt_history(path: str, filesystem: Any = None) -> dict:
    """The exploits of the PBT experiment at ``path`` (Ray's ``pbt_global.txt`` and
    ``pbt_policy_<trial>.txt``, as JSON): ``{"global": [...], "policies": {trial_id: [...]}}``.

    Each entry: ``trial_id`` (the exploiting trial), ``donor_id``, ``iteration`` (the exploiting
    trial's training_iteration when it exploited), ``donor_iteration``, ``donor_checkpoint`` (the
    donor's checkpoint folder) and its ``donor_checkpoint_iteration``, ``checkpoint`` (the copy in
    the exploiting trial's folder it continued from), the two scores, and with ``log_config``
    ``donor_config`` and ``config`` (the explored config it continued with). A trial's policy is
    its donor's policy up to the exploit followed by the exploit (Ray's per-trial file).
    """
    from ..storage import ExperimentPaths

    paths = ExperimentPaths.at(path, filesystem)
    data = None
    for state_file in (paths.state, paths.state_backup):  # (the previous one if unreadable)
        try:
            data = json.loads(paths.storage.read_bytes(state_file))
            break
        except (FileNotFoundError, ValueError):
            continue
    if not isinstance(data, dict):
        raise FileNotFoundError(f"no readable experiment state at {paths.uri}")
    record = data.get("scheduler") or {}
    history = list((record.get("state") or {}).get("history") or [])
    policies: dict[str, list] = {}
    for entry in history:
        policies[entry["trial_id"]] = [*policies.get(entry["donor_id"], []), entry]
    return {"global": history, "policies": policies}
