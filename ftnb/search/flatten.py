"""Nested configs as flat ``"model/lr"`` keys and back: the columns of tables and plots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .messages import short_repr

__all__ = ["flatten_dict", "unflatten_dict"]


def flatten_dict(d: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Flatten nested dicts into ``{"model/lr": ...}`` keys.

    Empty nested dicts are kept as values so :func:`unflatten_dict` round-trips.
    Non-string keys are converted with ``str``.

    >>> flatten_dict({"model": {"lr": 0.1, "layers": 2}, "seed": 0})
    {'model/lr': 0.1, 'model/layers': 2, 'seed': 0}
    """
    out: dict[str, Any] = {}

    def walk(sub: Mapping[Any, Any], prefix: str) -> None:
        for k, v in sub.items():
            key = prefix + str(k)
            if isinstance(v, Mapping) and v:
                walk(v, key + sep)
            else:
                if key in out:
                    raise ValueError(
                        f"flatten_dict: key {key!r} occurs twice (a key containing {sep!r} "
                        f"collides with a nested key). Fix: rename one of them or pass another sep."
                    )
                out[key] = v

    walk(d, "")
    return out


def unflatten_dict(d: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Inverse of :func:`flatten_dict`: ``{"model/lr": 0.1}`` -> ``{"model": {"lr": 0.1}}``.

    >>> unflatten_dict({"model/lr": 0.1, "seed": 0})
    {'model': {'lr': 0.1}, 'seed': 0}
    """
    out: dict[str, Any] = {}
    created: set[int] = {id(out)}  # dicts we own and may extend
    for flat_key, value in d.items():
        parts = str(flat_key).split(sep)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None and part not in node:
                child = {}
                node[part] = child
                created.add(id(child))
            elif isinstance(child, dict) and id(child) not in created:
                # An input value that is itself a dict: copy before extending
                # so the caller's object is never mutated.
                child = dict(child)
                node[part] = child
                created.add(id(child))
            elif not isinstance(child, dict):
                raise ValueError(
                    f"unflatten_dict: key {flat_key!r} needs {sep.join(parts[: i + 1])!r} to be "
                    f"a dict, but it already holds {short_repr(child)}. Fix: drop one of the "
                    f"conflicting keys."
                )
            node = child
        last = parts[-1]
        if last in node:
            raise ValueError(
                f"unflatten_dict: key {flat_key!r} conflicts with another key at the same path. "
                f"Fix: drop one of the conflicting keys."
            )
        node[last] = value
    return out
