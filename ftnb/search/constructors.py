"""The functions that build a param space, with Ray Tune's names and signatures:
:func:`grid_search`, :func:`choice`, :func:`uniform`, :func:`quniform`, :func:`loguniform`,
:func:`qloguniform`, :func:`randn`, :func:`qrandn`, :func:`randint`, :func:`qrandint`,
:func:`lograndint`, :func:`qlograndint`, :func:`sample_from`.

Each checks its arguments when it is called, so that a mistake is reported where it is written
(naming the argument, the value and the fix), not when the variants are generated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .argument_checks import (
    check_base,
    check_has_multiple,
    check_int,
    check_multiple_of_q,
    check_ordered,
    check_positive,
    check_real,
)
from .domains import GRID_SEARCH_KEY, Categorical, SampleFrom, is_grid_search
from .messages import short_repr
from .numeric import LogRandInt, LogUniform, Normal, QLogRandInt, QRandInt, RandInt, Uniform

__all__ = [
    "grid_search",
    "choice",
    "uniform",
    "quniform",
    "loguniform",
    "qloguniform",
    "randn",
    "qrandn",
    "randint",
    "qrandint",
    "lograndint",
    "qlograndint",
    "sample_from",
]


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


def uniform(lower: float, upper: float) -> Uniform:
    """Float uniformly distributed between ``lower`` and ``upper``.

    >>> 0.1 <= uniform(0.1, 1.0).sample(random_state=0) <= 1.0
    True
    """
    _check_float_bounds("uniform", lower, upper)
    return Uniform(lower, upper)


def quniform(lower: float, upper: float, q: float) -> Uniform:
    """Float uniformly distributed between ``lower`` and ``upper``, rounded to a multiple of
    ``q`` (both bounds included, and both must be multiples of ``q``, as in Ray).

    >>> quniform(0, 1, 0.1).sample(random_state=1)
    0.1
    """
    _check_float_bounds("quniform", lower, upper)
    _check_float_q("quniform", q, lower, upper)
    return Uniform(lower, upper, q)


def loguniform(lower: float, upper: float, base: float = 10) -> LogUniform:
    """Float log-uniformly distributed between ``lower`` and ``upper`` (``0 < lower < upper``).

    Typical for learning rates: ``loguniform(1e-5, 1e-1)``.
    """
    _check_log_float_bounds("loguniform", lower, upper)
    check_base("loguniform", base)
    return LogUniform(lower, upper, base)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> LogUniform:
    """Float log-uniformly distributed between ``lower`` and ``upper``, rounded to a multiple
    of ``q`` (both bounds included, and both must be multiples of ``q``, as in Ray).

    >>> qloguniform(1e-4, 1e-1, 5e-5).sample(random_state=0)
    0.03415
    """
    _check_log_float_bounds("qloguniform", lower, upper)
    _check_float_q("qloguniform", q, lower, upper)
    check_base("qloguniform", base)
    return LogUniform(lower, upper, base, q)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """Float drawn from a normal distribution of ``mean`` and standard deviation ``sd``.

    >>> isinstance(randn(10, 2).sample(random_state=0), float)
    True
    """
    _check_normal("randn", mean, sd)
    return Normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> Normal:
    """Float drawn from a normal distribution of ``mean`` and ``sd``, rounded to a multiple of
    ``q`` (unbounded).

    >>> qrandn(10, 2, 0.5).sample(random_state=0)
    12.0
    """
    _check_normal("qrandn", mean, sd)
    check_real("qrandn", "q", q)
    check_positive("qrandn", "q", q, "pass the step between values, e.g. q=0.1")
    return Normal(mean, sd, q)


def randint(lower: int, upper: int) -> RandInt:
    """Integer uniformly distributed in ``[lower, upper)``; ``upper`` is exclusive, like Ray.

    >>> randint(0, 1).sample(random_state=0)
    0
    """
    _check_int_bounds("randint", lower, upper, " (upper is exclusive)")
    return RandInt(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> QRandInt:
    """A multiple of ``q`` in ``[lower, upper]``, each equally likely: ``upper`` is
    *inclusive*, as Ray documents.

    >>> sorted(set(qrandint(0, 10, 5).sample(size=50, random_state=0)))
    [0, 5, 10]
    """
    _check_int_bounds("qrandint", lower, upper, " (both are included)")
    _check_int_q("qrandint", q, lower, upper)
    return QRandInt(lower, upper, q)


def lograndint(lower: int, upper: int, base: float = 10) -> LogRandInt:
    """Integer log-uniformly distributed in ``[lower, upper)`` (``0 < lower``; ``upper`` is
    exclusive, like Ray), e.g. ``lograndint(16, 1025)`` for a width.

    >>> 16 <= lograndint(16, 1025).sample(random_state=0) < 1025
    True
    """
    _check_int_bounds("lograndint", lower, upper, " (upper is exclusive)")
    _check_log_int_lower("lograndint", lower)
    check_base("lograndint", base)
    return LogRandInt(lower, upper, base)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> QLogRandInt:
    """A multiple of ``q`` in ``[lower, upper]``, log-uniformly (``0 < lower``; ``upper`` is
    *inclusive*, as Ray documents).

    >>> qlograndint(8, 1024, 8).sample(random_state=0) % 8
    0
    """
    _check_int_bounds("qlograndint", lower, upper, " (both are included)")
    _check_log_int_lower("qlograndint", lower)
    _check_int_q("qlograndint", q, lower, upper)
    check_base("qlograndint", base)
    return QLogRandInt(lower, upper, q, base)


def _check_float_bounds(func: str, lower: float, upper: float) -> None:
    check_real(func, "lower", lower)
    check_real(func, "upper", upper)
    check_ordered(func, lower, upper)


def _check_log_float_bounds(func: str, lower: float, upper: float) -> None:
    check_real(func, "lower", lower)
    check_real(func, "upper", upper)
    plain = "uniform" if func == "loguniform" else "quniform"
    check_positive(func, "lower", lower, f"use a small positive lower bound such as 1e-8, or "
                   f"{plain}() for ranges that include zero")
    check_ordered(func, lower, upper)


def _check_float_q(func: str, q: float, lower: float, upper: float) -> None:
    check_real(func, "q", q)
    check_positive(func, "q", q, "pass the step between values, e.g. q=0.1")
    check_multiple_of_q(func, "lower", lower, q)
    check_multiple_of_q(func, "upper", upper, q)


def _check_normal(func: str, mean: float, sd: float) -> None:
    check_real(func, "mean", mean)
    check_real(func, "sd", sd)
    check_positive(func, "sd", sd, "pass the standard deviation, a positive number such as "
                   "sd=1.0, or a plain value for a constant")


def _check_int_bounds(func: str, lower: int, upper: int, note: str) -> None:
    check_int(func, "lower", lower, f"{func}(1, 10)")
    check_int(func, "upper", upper, f"{func}(1, 10)")
    check_ordered(func, lower, upper, note)


def _check_log_int_lower(func: str, lower: int) -> None:
    plain = "randint" if func == "lograndint" else "qrandint"
    check_positive(func, "lower", lower, f"use lower=1, or {plain}() for ranges that include "
                   f"zero")


def _check_int_q(func: str, q: int, lower: int, upper: int) -> None:
    check_int(func, "q", q, "q=2")
    check_positive(func, "q", q, "pass the step between values, e.g. q=2 (q=1: every integer)")
    check_has_multiple(func, lower, upper, q)


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
