"""The functions that build a param space, with Ray Tune's names: :func:`grid_search`,
:func:`choice`, :func:`uniform`, :func:`loguniform`, :func:`randint`, :func:`sample_from`.

Each checks its arguments when it is called, so that a mistake is reported where it is written
(naming the argument, the value and the fix), not when the variants are generated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .domains import (
    GRID_SEARCH_KEY,
    Categorical,
    LogUniform,
    RandInt,
    SampleFrom,
    Uniform,
    is_grid_search,
)
from .messages import short_repr

__all__ = ["grid_search", "choice", "uniform", "loguniform", "randint", "sample_from"]


def _check_real(func: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{func}() argument {name!r} must be a real number; got "
            f"{type(value).__name__}: {short_repr(value)}. Fix: pass an int or float."
        )
    if not math.isfinite(value):
        raise ValueError(
            f"{func}() argument {name!r} must be finite; got {value!r}. "
            f"Fix: pass a finite bound."
        )
    return value


def grid_search(values: Iterable[Any]) -> dict[str, list[Any]]:
    """A grid axis: every value is tried, combined with other axes by cartesian product.

    Returns Ray's representation, ``{"grid_search": [...]}``.

    >>> grid_search([0.1, 0.01])
    {'grid_search': [0.1, 0.01]}
    """
    if isinstance(values, (str, bytes)) or isinstance(values, (Mapping, set, frozenset)):
        hint = "sorted(...) " if isinstance(values, (set, frozenset)) else ""
        raise TypeError(
            f"grid_search() argument 'values' must be a list of values; got "
            f"{type(values).__name__}: {short_repr(values)}. "
            f"Fix: pass a list, e.g. grid_search({hint}[...])."
        )
    try:
        items = list(values)
    except TypeError:
        raise TypeError(
            f"grid_search() argument 'values' must be an iterable; got "
            f"{type(values).__name__}: {short_repr(values)}. "
            f"Fix: pass a list, e.g. grid_search([1, 2, 3])."
        ) from None
    if not items:
        raise ValueError(
            "grid_search() argument 'values' is empty, which would produce zero trials. "
            "Fix: pass at least one value, e.g. grid_search([0.1])."
        )
    return {GRID_SEARCH_KEY: items}


def choice(categories: Sequence[Any]) -> Categorical:
    """Pick one of ``categories`` uniformly at random per variant.

    >>> choice(["adam", "sgd"]).categories
    ['adam', 'sgd']
    """
    if isinstance(categories, (str, bytes)) or not isinstance(categories, Sequence):
        hint = ""
        if isinstance(categories, (set, frozenset)):
            hint = " (sets have no stable order, which breaks seeded reproducibility)"
        raise TypeError(
            f"choice() argument 'categories' must be a list or tuple; got "
            f"{type(categories).__name__}: {short_repr(categories)}{hint}. "
            f"Fix: pass a list, e.g. choice(['a', 'b'])."
        )
    if len(categories) == 0:
        raise ValueError(
            "choice() argument 'categories' is empty. "
            "Fix: pass at least one category, e.g. choice(['adam', 'sgd'])."
        )
    for i, cat in enumerate(categories):
        if _contains_grid(cat):
            raise ValueError(
                f"choice() category {i} contains a grid_search: {short_repr(cat)}. "
                f"A random choice cannot expand a grid. Fix: use grid_search([...]) "
                f"at the outer level instead of choice."
            )
    return Categorical(categories)


def _contains_grid(value: Any) -> bool:
    if is_grid_search(value):
        return True
    if isinstance(value, Mapping):
        return any(_contains_grid(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_contains_grid(v) for v in value)
    return False


def uniform(low: float, high: float) -> Uniform:
    """Float uniformly distributed between ``low`` and ``high``.

    >>> import random
    >>> 0.1 <= uniform(0.1, 1.0).sample(random.Random(0)) <= 1.0
    True
    """
    _check_real("uniform", "low", low)
    _check_real("uniform", "high", high)
    if not low < high:
        raise ValueError(
            f"uniform() needs low < high; got low={low!r}, high={high!r}. "
            f"Fix: pass the smaller bound first, e.g. uniform({min(low, high)!r}, "
            f"{max(low, high)!r}), or use a plain value if they are equal."
        )
    return Uniform(low, high)


def loguniform(low: float, high: float, base: float = 10) -> LogUniform:
    """Float log-uniformly distributed between ``low`` and ``high`` (``0 < low < high``).

    Typical for learning rates: ``loguniform(1e-5, 1e-1)``.
    """
    _check_real("loguniform", "low", low)
    _check_real("loguniform", "high", high)
    _check_real("loguniform", "base", base)
    if low <= 0:
        raise ValueError(
            f"loguniform() argument 'low' must be > 0; got low={low!r}. "
            f"Fix: use a small positive lower bound such as 1e-8, or uniform() for ranges "
            f"that include zero."
        )
    if not low < high:
        raise ValueError(
            f"loguniform() needs low < high; got low={low!r}, high={high!r}. "
            f"Fix: pass the smaller bound first, e.g. loguniform({min(low, high)!r}, "
            f"{max(low, high)!r})."
        )
    if base <= 0 or base == 1:
        raise ValueError(
            f"loguniform() argument 'base' must be > 0 and != 1; got base={base!r}. "
            f"Fix: leave the default base=10."
        )
    return LogUniform(low, high, base)


def randint(low: int, high: int) -> RandInt:
    """Integer uniformly distributed in ``[low, high)``; ``high`` is exclusive, like Ray.

    >>> import random
    >>> randint(0, 1).sample(random.Random(0))
    0
    """
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"randint() argument {name!r} must be an int; got "
                f"{type(value).__name__}: {short_repr(value)}. "
                f"Fix: pass an int, e.g. randint(1, 10)."
            )
    if not low < high:
        raise ValueError(
            f"randint() needs low < high (high is exclusive); got low={low!r}, high={high!r}. "
            f"Fix: use randint({low!r}, {low + 1!r}) for the single value {low!r}, "
            f"or swap the bounds."
        )
    return RandInt(low, high)


def sample_from(func: Callable[..., Any]) -> SampleFrom:
    """Value computed per variant by ``func(spec)``, after all other domains.

    ``spec.config`` holds the variant resolved so far (see :class:`SampleSpec`)::

        {"lr": loguniform(1e-4, 1e-1), "warmup_lr": sample_from(lambda spec: spec.config.lr / 10)}

    A sample_from may read another sample_from; cycles raise ``ValueError``.
    """
    if not callable(func):
        raise TypeError(
            f"sample_from() argument 'func' must be callable; got "
            f"{type(func).__name__}: {short_repr(func)}. "
            f"Fix: pass a function, e.g. sample_from(lambda spec: spec.config.lr * 2)."
        )
    return SampleFrom(func)
