"""Population Based Training's pure parts: checking ``hyperparam_mutations``, *exploring* a
config (resample, or scale numbers and shift list values to a neighbour) and splitting a
population into quantiles. No scheduler state and no machine: table-tested
(tests/test_pbt.py), used by :class:`ftnb.schedulers.PopulationBasedTraining` and PB2."""

from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable, Optional, Sequence

__all__ = ["explore", "quantiles"]

_OWNER = "PopulationBasedTraining"


def _is_domain(value: Any) -> bool:
    from ..search import Domain

    return isinstance(value, Domain)


def _check_mutations(mutations: Any, path: str = "hyperparam_mutations") -> None:
    if not isinstance(mutations, dict):
        raise TypeError(f"{_OWNER}({path}={mutations!r}) must be a dict of the hyperparameters "
                        "to mutate, e.g. {'lr': ftnb.loguniform(1e-4, 1e-1), 'batch': [16, 32]}.")
    from ..search import SampleFrom

    for key, value in mutations.items():
        where = f"{path}[{key!r}]"
        if isinstance(value, SampleFrom):
            raise ValueError(
                f"{_OWNER}({where}={value!r}): a sample_from domain cannot be mutated (its "
                "function draws whole configs). Fix: ftnb.uniform/loguniform/randint/..., a list "
                "of values, or a function of no arguments that returns a value.")
        if isinstance(value, dict):
            _check_mutations(value, where)
        elif isinstance(value, tuple):
            raise TypeError(f"{_OWNER}({where}={value!r}): give the categories as a list.")
        elif isinstance(value, list):
            if not value:
                raise ValueError(f"{_OWNER}({where}=[]) has no values. Fix: list the values "
                                 "the hyperparameter may take, in order.")
        elif not (_is_domain(value) or callable(value)):
            raise TypeError(
                f"{_OWNER}({where}={value!r}) must be a list of values (shifted to a neighbour "
                "when perturbed), an ftnb search domain (ftnb.uniform(0, 1), ...) or a function "
                "of no arguments, or a dict of those.")


def _resample(distribution: Any, rng: random.Random) -> Any:
    if isinstance(distribution, list):
        return rng.choice(distribution)
    if _is_domain(distribution):
        return distribution.sample(random_state=rng)
    return distribution()


def _clip(value: Any, distribution: Any) -> Any:
    lower = getattr(distribution, "lower", None)
    upper = getattr(distribution, "upper", None)
    if isinstance(lower, (int, float)) and isinstance(upper, (int, float)):
        return min(max(value, lower), upper)
    return value


def explore(config: dict, mutations: dict, resample_probability: float,
            perturbation_factors: Sequence[float] = (1.2, 0.8),
            custom_explore_fn: Optional[Callable[[dict], dict]] = None,
            rng: Optional[random.Random] = None) -> dict:
    """A copy of ``config`` explored as Ray's PBT does (``_explore``).

    For each key of ``mutations``: a list is categorical (resampled from the list with
    ``resample_probability`` or when the value is not in it, else shifted to a neighbour, the
    ends clamped); a domain or a function is continuous (resampled with
    ``resample_probability``, else multiplied by one of ``perturbation_factors`` and clipped to
    the domain's bounds; an int stays an int); a dict recurses. Then ``custom_explore_fn``.

    >>> explore({"lr": 1.0, "n": 32}, {"lr": lambda: 0.5, "n": [16, 32, 64]}, 0.0,
    ...         rng=random.Random(0))["n"] in (16, 64)
    True
    """
    rng = rng or random  # type: ignore[assignment]
    new = copy.deepcopy(config)
    for key, distribution in mutations.items():
        if isinstance(distribution, dict):
            new[key] = explore(config.get(key) or {}, distribution, resample_probability,
                               perturbation_factors, None, rng)
            continue
        current = config.get(key)
        if isinstance(distribution, list):
            if rng.random() < resample_probability or current not in distribution:
                new[key] = rng.choice(distribution)
            else:
                index = distribution.index(current) + rng.choice((-1, 1))
                new[key] = distribution[min(max(index, 0), len(distribution) - 1)]
            continue
        if rng.random() < resample_probability or not isinstance(current, (int, float)) or (
                isinstance(current, bool)):
            value = _resample(distribution, rng)
        else:
            value = _clip(current * rng.choice(list(perturbation_factors)), distribution)
        if isinstance(current, int) and not isinstance(current, bool):
            value = int(value)
        new[key] = value
    if custom_explore_fn is not None:
        new = custom_explore_fn(new)
        if not isinstance(new, dict):
            raise TypeError(f"{_OWNER}(custom_explore_fn={custom_explore_fn!r}) returned "
                            f"{new!r}; it must return the config (a dict).")
    return new


def quantiles(scores: dict[str, float], quantile_fraction: float,
              population: int) -> tuple[list[str], list[str]]:
    """The trials (ids) in the lower and the upper quantile of ``scores`` (higher is better),
    as Ray's ``_quantiles``: ``ceil(n * quantile_fraction)`` each, at most half of ``n``; a
    single scored trial of a larger ``population`` is the upper quantile alone. Ties keep the
    order of ``scores``.

    >>> quantiles({"a": 1.0, "b": 3.0, "c": 2.0, "d": 0.0}, 0.25, 4)
    (['d'], ['b'])
    """
    ranked = sorted(scores, key=lambda t: scores[t])
    if not ranked:
        return [], []
    if len(ranked) == 1 and population > 1:
        return [], ranked
    count = math.ceil(len(ranked) * quantile_fraction)
    count = min(count, len(ranked) // 2)
    if count <= 0:
        return [], []
    return ranked[:count], ranked[-count:]


def _has_function(mutations: dict) -> bool:
    for value in mutations.values():
        if isinstance(value, dict):
            if _has_function(value):
                return True
        elif not isinstance(value, list) and not _is_domain(value):
            return True
    return False


def _missing_keys(config: dict, mutations: dict, prefix: str = "") -> list[str]:
    missing = []
    for key, value in mutations.items():
        if key not in config:
            missing.append(f"{prefix}{key}")
        elif isinstance(value, dict) and isinstance(config[key], dict):
            missing += _missing_keys(config[key], value, f"{prefix}{key}/")
    return missing


def _mutated(config: dict, mutations: dict) -> dict:
    return {k: config.get(k) for k in mutations}
