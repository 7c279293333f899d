"""A trainer's ``ScalingConfig`` searched by a Tuner: ``Tuner(trainer, param_space={
"scaling_config": ScalingConfig(num_workers=ftnb.grid_search([1, 2]))})`` makes one trial with
one rank and one with two, as in Ray Tune.

The given ScalingConfig takes the trainer's place for the whole experiment (GPUs, hang limit,
placement); its :data:`~ftnb.train.scaling.SEARCHABLE_FIELDS` (``num_workers``,
``resources_per_worker``) go into the space as ``{"scaling_config": {"num_workers": ...}}``, so
each trial's config holds plain values: stored with the experiment, shown in its table, and
enough to rebuild the trial's group on a restore. Every trial's values are checked as a
ScalingConfig checks them: those a domain lists (``grid_search``, ``choice``) before anything
runs, a sampled one (``randint``) when its trial starts, which then ends ERRORED, saying why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from .scaling import SEARCHABLE_FIELDS, ScalingConfig

__all__ = ["SCALING_KEY", "experiment_scaling", "space_entry", "trial_scaling"]

#: The key of a trainer's param_space (and of each trial's config) that holds its scaling.
SCALING_KEY = "scaling_config"

_WHERE = f"Tuner(TorchTrainer, param_space={{'{SCALING_KEY}': ScalingConfig(...)}})"


def _given(value: Any) -> ScalingConfig:
    if isinstance(value, Mapping):  # Ray takes the ScalingConfig's arguments as a dict too
        try:
            return ScalingConfig(**value)
        except TypeError as exc:
            raise TypeError(f"param_space['{SCALING_KEY}'] = {value!r}: {exc}. Fix: use the "
                            "arguments of ftnb.ScalingConfig, or a ScalingConfig.") from None
    if not isinstance(value, ScalingConfig):
        raise TypeError(
            f"param_space['{SCALING_KEY}'] must be an ftnb.ScalingConfig; got "
            f"{type(value).__name__}: {value!r}. Fix: param_space={{'{SCALING_KEY}': "
            "ftnb.ScalingConfig(num_workers=ftnb.grid_search([1, 2]))}.")
    return value


def _listed(value: Any) -> Optional[list]:
    """The values a domain lists (a grid axis, a choice), or None for one that samples."""
    from ..search.domains import Categorical, is_grid_search

    if is_grid_search(value):
        return list(value["grid_search"])
    if isinstance(value, Categorical):
        return list(value.categories)
    return None


def space_entry(given: Any) -> dict:
    """What ``param_space["scaling_config"]`` (a ScalingConfig, maybe with domains) puts in
    the trials' space: its searchable fields. Every value a domain lists is checked now."""
    scaling = _given(given)
    entry = {"num_workers": scaling.num_workers}
    if scaling.resources_per_worker is not None:
        entry["resources_per_worker"] = scaling.resources_per_worker
    base = experiment_scaling(scaling)
    searched = scaling.searched_fields()
    for name, value in entry.items():
        for one in (_listed(value) or []) if name in searched else [value]:
            trial_scaling(base, {name: one})
    return entry


def experiment_scaling(given: Any) -> ScalingConfig:
    """The ScalingConfig of the whole experiment: ``given``'s, with a searched ``num_workers``
    at the most ranks its domain lists (what must fit; 1 when it samples) and a searched
    ``resources_per_worker`` at the default (each trial asks for its own)."""
    scaling = _given(given)
    searched = scaling.searched_fields()
    if not searched:
        return scaling
    changes: dict = {}
    if "num_workers" in searched:
        listed = [n for n in (_listed(scaling.num_workers) or [])
                  if isinstance(n, int) and not isinstance(n, bool) and n >= 1]
        changes["num_workers"] = max(listed, default=1)
    if "resources_per_worker" in searched:
        changes["resources_per_worker"] = None
    return dataclasses.replace(scaling, **changes)


def trial_scaling(base: ScalingConfig, values: Mapping[str, Any]) -> ScalingConfig:
    """The ScalingConfig of a trial whose config's ``scaling_config`` is ``values``: ``base``
    with them. Raises ScalingConfig's own error, saying which trial value it was, for a bad
    value, and for an elastic range or 0 (local mode), which are a trainer's own choices."""
    shown = ", ".join(f"{k}={values[k]!r}" for k in SEARCHABLE_FIELDS if k in values)
    try:
        scaling = dataclasses.replace(
            base, **{k: values[k] for k in SEARCHABLE_FIELDS if k in values})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{_WHERE} gives a trial {shown}: {exc}") from None
    if scaling.searched_fields() or scaling.elastic or scaling.local_mode or isinstance(
            scaling.num_workers, tuple):
        raise ValueError(
            f"{_WHERE} gives a trial {shown}: a trial's num_workers must be a whole number "
            ">= 1 (an elastic range or 0, local mode, is the trainer's own "
            "ScalingConfig, not a searched value). Fix: num_workers=ftnb.grid_search([1, 2]).")
    return scaling
