"""The numeric domains (Ray Tune's ``uniform``, ``quniform``, ``loguniform``, ``qloguniform``,
``randn``, ``qrandn``, ``randint``, ``qrandint``, ``lograndint``, ``qlograndint``).

Each class draws one value from a :class:`random.Random` (:meth:`~Domain.draw`) and writes
itself as JSON for the experiment's state (:meth:`~Domain.to_json`; the keys ``low``/``high``
are the stored names of ``lower``/``upper``, kept so that experiments stored before the rename
still compare equal on restore). The checks of the arguments are in
:mod:`ftnb.search.constructors`; these classes trust what they are given.

Bounds, as Ray documents them: ``randint`` and ``lograndint`` exclude ``upper``; ``qrandint``
and ``qlograndint`` include it; the float domains draw in ``[lower, upper]``. A quantized value
is a multiple of ``q``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from .domains import DOMAIN_JSON_KEY, Domain, SampleSpec

__all__ = [
    "Uniform",
    "LogUniform",
    "Normal",
    "RandInt",
    "QRandInt",
    "LogRandInt",
    "QLogRandInt",
    "decimal_places",
]


def decimal_places(q: float) -> int:
    """How many decimals ``q`` is written with (``0.05`` -> 2, ``5e-05`` -> 5, ``2`` -> 0).

    >>> decimal_places(0.05), decimal_places(5e-05), decimal_places(2)
    (2, 5, 0)
    """
    text = repr(float(q)).lower()
    mantissa, _, exponent = text.partition("e")
    digits = mantissa.partition(".")[2].rstrip("0")
    return max(0, len(digits) - int(exponent or 0))


def _multiple(k: int, q: float, places: int) -> float:
    # k * q carries binary noise (3 * 0.1 == 0.30000000000000004); rounding to q's own
    # decimals gives the multiple the user wrote the grid in (0.3).
    return float(round(k * q, places))


def _log_uniform(rng: random.Random, low: float, high: float, base: float) -> float:
    return float(base ** rng.uniform(math.log(low, base), math.log(high, base)))


class _Numeric(Domain):
    """What the numeric domains share: ``repr`` from the constructor's argument names."""

    #: Attribute names, in the order of the constructor's arguments (for ``repr``).
    _args: tuple[str, ...] = ()

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._args
                         if getattr(self, name) is not None)
        return f"{type(self).__name__}({args})"


class Uniform(_Numeric):
    """Float uniform in ``[lower, upper]``; with ``q``, rounded to a multiple of ``q``.

    Created by :func:`~ftnb.search.uniform` and :func:`~ftnb.search.quniform`. Quantized, it
    draws uniformly in ``[lower, upper]`` and rounds to the nearest multiple (so ``lower`` and
    ``upper`` come up half as often as the multiples between them, as in Ray).
    """

    _args = ("lower", "upper", "q")

    def __init__(self, lower: float, upper: float, q: float | None = None) -> None:
        self.lower = lower
        self.upper = upper
        self.q = q
        self.kind = "uniform" if q is None else "quniform"
        self._places = 0 if q is None else decimal_places(q)

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> float:
        value = rng.uniform(self.lower, self.upper)
        if self.q is None:
            return value
        return _quantize(value, self.q, self._places, self.lower, self.upper)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        out = {DOMAIN_JSON_KEY: self.kind, "low": self.lower, "high": self.upper}
        if self.q is not None:
            out["q"] = self.q
        return out


class LogUniform(_Numeric):
    """Float whose logarithm is uniform in ``[log(lower), log(upper)]``; with ``q``, rounded
    to a multiple of ``q``. Created by :func:`~ftnb.search.loguniform` and
    :func:`~ftnb.search.qloguniform`. The distribution does not depend on ``base``; it is kept
    for Ray's signature."""

    _args = ("lower", "upper", "q", "base")

    def __init__(self, lower: float, upper: float, base: float = 10,
                 q: float | None = None) -> None:
        self.lower = lower
        self.upper = upper
        self.base = base
        self.q = q
        self.kind = "loguniform" if q is None else "qloguniform"
        self._places = 0 if q is None else decimal_places(q)

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> float:
        value = _log_uniform(rng, self.lower, self.upper, self.base)
        if self.q is None:
            # pow/log round-trips can land one ulp outside the bounds.
            return min(max(value, self.lower), self.upper)
        return _quantize(value, self.q, self._places, self.lower, self.upper)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        out = {DOMAIN_JSON_KEY: self.kind, "low": self.lower, "high": self.upper,
               "base": self.base}
        if self.q is not None:
            out["q"] = self.q
        return out


def _quantize(value: float, q: float, places: int, lower: float, upper: float) -> float:
    # lower and upper are multiples of q (checked), so clamping keeps the value on the grid.
    return min(max(_multiple(round(value / q), q, places), lower), upper)


class Normal(_Numeric):
    """Float drawn from a normal distribution of ``mean`` and ``sd``; with ``q``, rounded to a
    multiple of ``q``. Created by :func:`~ftnb.search.randn` and :func:`~ftnb.search.qrandn`."""

    _args = ("mean", "sd", "q")

    def __init__(self, mean: float = 0.0, sd: float = 1.0, q: float | None = None) -> None:
        self.mean = mean
        self.sd = sd
        self.q = q
        self.kind = "randn" if q is None else "qrandn"
        self._places = 0 if q is None else decimal_places(q)

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> float:
        value = rng.gauss(self.mean, self.sd)
        if self.q is None:
            return value
        return _multiple(round(value / self.q), self.q, self._places)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        out = {DOMAIN_JSON_KEY: self.kind, "mean": self.mean, "sd": self.sd}
        if self.q is not None:
            out["q"] = self.q
        return out


class RandInt(_Numeric):
    """Integer uniform in ``[lower, upper)`` (``upper`` exclusive, like Ray); created by
    :func:`~ftnb.search.randint`."""

    kind = "randint"
    _args = ("lower", "upper")

    def __init__(self, lower: int, upper: int) -> None:
        self.lower = lower
        self.upper = upper

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> int:
        return rng.randrange(self.lower, self.upper)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.lower, "high": self.upper}


class QRandInt(_Numeric):
    """A multiple of ``q`` in ``[lower, upper]`` (``upper`` *inclusive*, like Ray), each equally
    likely; created by :func:`~ftnb.search.qrandint`."""

    kind = "qrandint"
    _args = ("lower", "upper", "q")

    def __init__(self, lower: int, upper: int, q: int = 1) -> None:
        self.lower = lower
        self.upper = upper
        self.q = q

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> int:
        first, last = _multiples(self.lower, self.upper, self.q)
        return self.q * rng.randint(first, last)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.lower, "high": self.upper, "q": self.q}


def _multiples(lower: int, upper: int, q: int) -> tuple[int, int]:
    """``(first, last)``: the multiples of ``q`` in ``[lower, upper]`` are ``q * first`` ...
    ``q * last``."""
    return -(-lower // q), upper // q


class LogRandInt(_Numeric):
    """Integer in ``[lower, upper)`` (``upper`` exclusive, like Ray): a log-uniform draw in
    ``[lower, upper)`` rounded down; created by :func:`~ftnb.search.lograndint`."""

    kind = "lograndint"
    _args = ("lower", "upper", "base")

    def __init__(self, lower: int, upper: int, base: float = 10) -> None:
        self.lower = lower
        self.upper = upper
        self.base = base

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> int:
        value = math.floor(_log_uniform(rng, self.lower, self.upper, self.base))
        return min(max(value, self.lower), self.upper - 1)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.lower, "high": self.upper,
                "base": self.base}


class QLogRandInt(_Numeric):
    """A multiple of ``q`` in ``[lower, upper]`` (``upper`` *inclusive*, like Ray), log-uniformly:
    a log-uniform draw between the first multiple and the last multiple plus ``q``, rounded down
    to a multiple. With ``q=1`` it is ``lograndint(lower, upper + 1)``. Created by
    :func:`~ftnb.search.qlograndint`."""

    kind = "qlograndint"
    _args = ("lower", "upper", "q", "base")

    def __init__(self, lower: int, upper: int, q: int, base: float = 10) -> None:
        self.lower = lower
        self.upper = upper
        self.q = q
        self.base = base

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> int:
        first, last = _multiples(self.lower, self.upper, self.q)
        value = _log_uniform(rng, first * self.q, (last + 1) * self.q, self.base)
        return self.q * min(max(math.floor(value / self.q), first), last)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.lower, "high": self.upper,
                "q": self.q, "base": self.base}
