"""The checks of the arguments of the domain constructors (:mod:`ftnb.search.constructors`).

Each raises where the constructor is called, naming the function, the argument, the value
received and the fix; each returns the value it checked.
"""

from __future__ import annotations

import math
from typing import Any

from .messages import short_repr

__all__ = [
    "check_base",
    "check_has_multiple",
    "check_int",
    "check_multiple_of_q",
    "check_ordered",
    "check_positive",
    "check_real",
]


def check_real(func: str, name: str, value: Any) -> float:
    """``value`` if it is a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{func}() argument {name!r} must be a real number; got "
            f"{type(value).__name__}: {short_repr(value)}. Fix: pass an int or float."
        )
    if not math.isfinite(value):
        raise ValueError(
            f"{func}() argument {name!r} must be finite; got {value!r}. "
            f"Fix: pass a finite {'bound' if name in ('lower', 'upper') else 'number'}."
        )
    return value


def check_int(func: str, name: str, value: Any, example: str) -> int:
    """``value`` if it is an int (not a bool); ``example`` is a correct call, for the fix."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{func}() argument {name!r} must be an int; got "
            f"{type(value).__name__}: {short_repr(value)}. Fix: pass an int, e.g. {example}."
        )
    return value


def check_ordered(func: str, lower: float, upper: float, note: str = "") -> None:
    """``lower < upper``; ``note`` says how the bounds are read (e.g. upper exclusive)."""
    if not lower < upper:
        raise ValueError(
            f"{func}() needs lower < upper{note}; got lower={lower!r}, upper={upper!r}. "
            f"Fix: pass the smaller bound first, e.g. {func}(lower={min(lower, upper)!r}, "
            f"upper={max(lower, upper)!r}), or a plain value instead of a domain if they are "
            f"equal."
        )


def check_positive(func: str, name: str, value: float, fix: str) -> None:
    """``value > 0``: a log domain's ``lower``, a step ``q``, a standard deviation ``sd``."""
    if not value > 0:
        raise ValueError(f"{func}() argument {name!r} must be > 0; got {name}={value!r}. "
                         f"Fix: {fix}.")


def check_base(func: str, base: Any) -> float:
    """A logarithm's base: a real number > 0 and != 1."""
    check_real(func, "base", base)
    if base <= 0 or base == 1:
        raise ValueError(
            f"{func}() argument 'base' must be > 0 and != 1; got base={base!r}. "
            f"Fix: leave the default base=10."
        )
    return base


def check_multiple_of_q(func: str, name: str, value: float, q: float) -> None:
    """A quantized float domain's bound is a multiple of ``q`` (Ray refuses the others too)."""
    steps = value / q
    if not math.isclose(steps, round(steps)):
        below, above = math.floor(steps) * q, math.ceil(steps) * q
        raise ValueError(
            f"{func}() argument {name!r} must be a multiple of q (as in Ray); got "
            f"{name}={value!r}, q={q!r}. Fix: use {name}={below:.10g} or {name}={above:.10g}, "
            f"or a q that divides {value!r}."
        )


def check_has_multiple(func: str, lower: int, upper: int, q: int) -> None:
    """Some multiple of ``q`` lies in ``[lower, upper]`` (a quantized integer domain)."""
    if -(-lower // q) > upper // q:
        raise ValueError(
            f"{func}() has no multiple of q between lower and upper; got lower={lower!r}, "
            f"upper={upper!r}, q={q!r}. Fix: widen the bounds to include a multiple of {q!r}, "
            f"or use a smaller q."
        )
