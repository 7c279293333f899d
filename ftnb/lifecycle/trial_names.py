"""Names of a new experiment's trials: ``TuneConfig(trial_name_creator=...,
trial_dirname_creator=...)`` applied to the trials made when it starts (:func:`name_trials`)
and to those its searcher makes later (:class:`TrialSetup`). A bad name is refused before the
experiment's folder is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import TuneConfig, callable_name
from ..core.records import ExperimentState

__all__ = ["TrialInfo", "TrialSetup", "name_trials"]


@dataclass(frozen=True)
class TrialInfo:
    """What ``TuneConfig(trial_name_creator=..., trial_dirname_creator=...)`` are given about a
    trial, as Ray Tune gives its ``Trial``: its id, config, trainable's name and experiment tag
    (its index and varying values, ``"0_lr=0.01"``)."""

    trial_id: str
    config: dict
    trainable_name: str
    experiment_tag: str

    def __str__(self) -> str:
        return self.trial_id


def name_trials(state: ExperimentState, tune_config: TuneConfig, variants: list,
                 trainable_name: str) -> None:
    """Apply the trial name and folder name creators to the new trials of ``state``; a bad name
    is refused here, before the experiment's folder is written."""
    if tune_config.trial_name_creator is None and tune_config.trial_dirname_creator is None:
        return
    keys = state.settings.get("varying_keys") or []
    seen: dict[str, str] = {}
    for index, (trial, config) in enumerate(zip(state.trials, variants)):
        _name_trial(trial, config, index, tune_config, keys, trainable_name, seen)


def _name_trial(trial: Any, config: dict, index: int, tune_config: TuneConfig, keys: list,
                trainable_name: str, seen: dict) -> None:
    """Apply the name creators to the trial number ``index`` (``seen``: the folder names taken,
    to the trial that has each)."""
    name_of, dirname_of = tune_config.trial_name_creator, tune_config.trial_dirname_creator
    values = ",".join(f"{k}={_config_value(config, k)}" for k in keys)
    info = TrialInfo(trial.trial_id, config, trainable_name,
                     f"{index}_{values}" if values else str(index))
    if name_of is not None:
        trial.name = _created(name_of, info, "trial_name_creator")
    if dirname_of is not None:
        dir_name = _created(dirname_of, info, "trial_dirname_creator")
        if "/" in dir_name or "\\" in dir_name or dir_name in (".", "..") or (
                dir_name.startswith(".") or dir_name.startswith("experiment_state")):
            raise ValueError(
                f"TuneConfig(trial_dirname_creator=...) returned {dir_name!r} for trial "
                f"{trial.trial_id}: it must be a plain folder name, not hidden. Fix: return "
                "a name such as f\"trial_{trial.trial_id}\".")
        if dir_name in seen:
            raise ValueError(
                f"TuneConfig(trial_dirname_creator=...) returned {dir_name!r} for both trial "
                f"{seen[dir_name]} and trial {trial.trial_id}: each trial needs its own "
                "folder. Fix: include trial.trial_id in the name.")
        seen[dir_name] = trial.trial_id
        trial.dir_name = dir_name


class TrialSetup:
    """What the Tuner fills in of a trial its searcher made (the controller's ``trial_setup``):
    its name and folder name (``TuneConfig``'s creators) and its resources when
    ``ftnb.with_resources`` was given a function of the config."""

    def __init__(self, state: ExperimentState, tune_config: TuneConfig, trainable: Any) -> None:
        self.state = state
        self.tune_config = tune_config
        self.trainable = trainable
        self.trainable_name = callable_name(trainable)

    def __call__(self, trial: Any, config: dict) -> Any:
        tc = self.tune_config
        if tc.trial_name_creator is not None or tc.trial_dirname_creator is not None:
            seen = {t.dir_name: t.trial_id for t in self.state.trials}
            _name_trial(trial, config, len(self.state.trials), tc,
                        self.state.settings.get("varying_keys") or [], self.trainable_name, seen)
        if callable(getattr(self.trainable, "_ftnb_resources", None)):
            from ..parameters import trial_resources_of

            _, by_trial = trial_resources_of(self.trainable, {trial.trial_id: config})
            return by_trial.get(trial.trial_id)
        return None


def _config_value(config: Any, dotted: str) -> Any:
    value = config
    for part in str(dotted).split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _created(creator: Any, info: TrialInfo, argument: str) -> str:
    try:
        value = creator(info)
    except Exception as exc:
        raise ValueError(f"TuneConfig({argument}={callable_name(creator)}) failed for trial "
                         f"{info.trial_id}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"TuneConfig({argument}={callable_name(creator)}) must return a non-empty"
                        f" str; got {value!r} for trial {info.trial_id}.")
    return value
