"""A search space read back from its JSON form (:func:`~ftnb.search.encode_space`, what an
experiment's state stores): what a restore needs to go on searching without the caller's space.

Every domain but :func:`~ftnb.search.sample_from` comes back as it was (a function is never
stored); object placeholders stay placeholders (restore re-binds them).
"""

from __future__ import annotations

from typing import Any

from . import constructors as c
from .domains import DOMAIN_JSON_KEY, GRID_SEARCH_KEY

__all__ = ["SpaceNotStoredError", "decode_space"]


class SpaceNotStoredError(ValueError):
    """The stored space holds a domain that cannot be rebuilt from JSON (a ``sample_from``
    function): the caller must give the space again."""


def _domain(data: dict) -> Any:
    kind = data[DOMAIN_JSON_KEY]
    low, high = data.get("low"), data.get("high")
    q, base = data.get("q"), data.get("base", 10)
    if kind == "uniform":
        return c.uniform(low, high)
    if kind == "quniform":
        return c.quniform(low, high, q)
    if kind == "loguniform":
        return c.loguniform(low, high, base)
    if kind == "qloguniform":
        return c.qloguniform(low, high, q, base)
    if kind == "randn":
        return c.randn(data["mean"], data["sd"])
    if kind == "qrandn":
        return c.qrandn(data["mean"], data["sd"], q)
    if kind == "randint":
        return c.randint(low, high)
    if kind == "qrandint":
        return c.qrandint(low, high, q)
    if kind == "lograndint":
        return c.lograndint(low, high, base)
    if kind == "qlograndint":
        return c.qlograndint(low, high, q, base)
    if kind == "choice":
        return c.choice([decode_space(v) for v in data["categories"]])
    raise SpaceNotStoredError(
        f"the stored search space holds a {kind!r} domain ({data.get('function', '')}), whose "
        "code is not stored with the experiment. Fix: pass the search space again "
        "(Tuner.restore(path, trainable, param_space=param_space))."
    )


def decode_space(encoded: Any) -> Any:
    """The space that ``encoded`` (:func:`~ftnb.search.encode_space`'s output) describes.

    >>> from ftnb.search import encode_space, uniform, grid_search
    >>> decode_space(encode_space({"lr": uniform(0, 1), "n": grid_search([1, 2])}, str))
    {'lr': Uniform(lower=0, upper=1), 'n': {'grid_search': [1, 2]}}
    """
    if isinstance(encoded, dict):
        if isinstance(encoded.get(DOMAIN_JSON_KEY), str):
            return _domain(encoded)
        if GRID_SEARCH_KEY in encoded and len(encoded) == 1:
            return {GRID_SEARCH_KEY: [decode_space(v) for v in encoded[GRID_SEARCH_KEY]]}
        return {k: decode_space(v) for k, v in encoded.items()}
    if isinstance(encoded, list):
        return [decode_space(v) for v in encoded]
    return encoded
