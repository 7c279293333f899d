"""``ftnb.put`` objects in configs and param spaces: binding a space's objects to refs before
its trials start, resolving refs back to objects inside a trial, and finding the placeholders
that stand for refs in the JSON state of an experiment.

A dataset, a DataFrame or a model passed in a ``param_space`` would otherwise be pickled into
every trial's launch message and unpickled into every trial's own memory: :func:`bind_objects`
puts each such object once, and the trials receive small refs. So is a large plain value (a
list or a string of more than :data:`SHARED_PLAIN_BYTES` as JSON, with no search domain in
it): copied into every trial's config, it would be written into every trial's ``params.json``
and ``trial.json`` and into the experiment state, twice. A trial's ``config`` holds the same
value either way.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ..search.domains import Categorical, Domain, is_grid_search
from ..search.messages import format_key_path
from ..search.variants import make_sequence
from .describe import type_name
from .file_format import UnpicklableError
from .store import ObjectRef, adopt, get, is_placeholder, put

__all__ = ["SHARED_PLAIN_BYTES", "bind_objects", "resolve_refs", "walk_placeholders"]

#: A plain (JSON) list, tuple or string of a search space larger than this as JSON (64 KiB) is
#: put with ``ftnb.put`` like an object, not copied into every trial's config and the state.
SHARED_PLAIN_BYTES = 64 << 10


def _rebuild_dict(value: dict, new: dict[Any, Any]) -> dict:
    """``value`` itself when no item changed, else a copy (of the same dict type) with ``new``."""
    if all(new[k] is v for k, v in value.items()):
        return value
    if type(value) is dict:
        return new
    out = copy.copy(value)  # keeps a defaultdict's factory, an OrderedDict's type
    out.update(new)
    return out


def _rebuild_seq(value: Any, items: list[Any]) -> Any:
    """``value`` itself when no item changed, else a list/tuple/namedtuple of ``items``."""
    if all(a is b for a, b in zip(items, value)):
        return value
    return make_sequence(type(value), items)


def resolve_refs(config: Any) -> Any:
    """``config`` with every :class:`ObjectRef` (in nested dicts, lists, tuples) replaced by
    :func:`get` of it. Containers holding no ref are returned as they are, not copied.

    >>> cfg = {"lr": 0.1, "layers": [64, 64]}
    >>> resolve_refs(cfg) is cfg
    True
    """
    if isinstance(config, ObjectRef):
        return get(config)
    if isinstance(config, dict):
        return _rebuild_dict(config, {k: resolve_refs(v) for k, v in config.items()})
    if isinstance(config, (list, tuple)):
        return _rebuild_seq(config, [resolve_refs(v) for v in config])
    return config


# Exact types that are JSON leaves; skipping them keeps walks of long number lists cheap.
_ATOMS = frozenset({int, float, str, bool, type(None)})


def _is_json_leaf(value: Any) -> bool:
    """JSON scalars, and numpy/torch 0-d scalars (state files store them as numbers)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    try:
        shape = getattr(value, "shape", None)
        return shape is not None and tuple(shape) == () and callable(getattr(value, "item", None))
    except Exception:
        return False


def _holds(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a search domain, grid axis or ref (``kinds``) occurs in nested dicts/lists."""
    if isinstance(value, kinds) or is_grid_search(value):
        return True
    if isinstance(value, Mapping):
        return any(_holds(v, kinds) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(type(v) not in _ATOMS and _holds(v, kinds) for v in value)
    return False


def _holds_object(value: Any) -> bool:
    """Whether a non-JSON leaf occurs in nested dicts/lists/tuples."""
    if isinstance(value, dict):
        return any(_holds_object(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(type(v) not in _ATOMS and _holds_object(v) for v in value)
    return not _is_json_leaf(value)


def _json_larger_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (a list, tuple or string of JSON values) takes more than ``limit``
    bytes as JSON, about: counted item by item, stopping as soon as it does (a long list costs
    the items up to the limit, not all of them)."""
    total = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            total += len(item) + 3
        elif isinstance(item, bool) or item is None:
            total += 6
        elif isinstance(item, (int, float)):
            total += len(repr(item)) + 2
        elif isinstance(item, dict):
            total += 2
            for key, child in item.items():
                total += len(str(key)) + 4
                pending.append(child)
        elif isinstance(item, (list, tuple)):
            total += 2
            pending.extend(item)
        else:
            total += 8  # (a 0-d numpy/torch scalar)
        if total > limit:
            return True
    return False


_SEARCH_OR_REF = (Domain, ObjectRef)


class _Binder:
    """State of one :func:`bind_objects` walk: refs by ``id(object)``, and what was put."""

    def __init__(self, adopt_refs: bool = False) -> None:
        self.refs: dict[int, ObjectRef] = {}
        self.bound: list[tuple[str, ObjectRef]] = []
        self.adopt_refs = adopt_refs

    def bind(self, value: Any, path: tuple[str | int, ...]) -> Any:
        if isinstance(value, ObjectRef):
            return adopt(value) if self.adopt_refs else value
        if isinstance(value, str) and len(value) > SHARED_PLAIN_BYTES:
            return self.put(value, path)  # (a large plain value: see the module docstring)
        if _is_json_leaf(value):
            return value
        if isinstance(value, Categorical):
            categories = self.bind_items(value.categories, path + ("categories",))
            if categories is value.categories:
                return value
            domain = copy.copy(value)  # the caller's domain keeps its objects
            domain.categories = categories
            return domain
        if isinstance(value, Domain):
            return value
        if isinstance(value, dict):
            if is_grid_search(value):
                key = next(iter(value))
                return _rebuild_dict(value, {key: self.bind_items(value[key], path + (key,))})
            return _rebuild_dict(value, {k: self.bind(v, path + (k,)) for k, v in value.items()})
        if isinstance(value, (list, tuple)) and _holds(value, _SEARCH_OR_REF):
            return self.bind_items(value, path)
        if isinstance(value, (list, tuple)) and not _holds_object(value):
            if _json_larger_than(value, SHARED_PLAIN_BYTES):
                return self.put(value, path)  # (a large plain value: see the module docstring)
            return value
        if isinstance(value, Mapping) and _holds(value, _SEARCH_OR_REF):
            return value  # a user Mapping type that search resolves as a dict: left alone
        # Any other object, and a whole search-free list holding objects (one file for a list
        # of 10 000 tensors, not 10 000 files and mappings per trial).
        return self.put(value, path)

    def bind_items(self, items: Any, path: tuple[str | int, ...]) -> Any:
        """Bind each element of a list/tuple (grid options, choice categories, mixed lists)."""
        return _rebuild_seq(items, [self.bind(v, path + (i,)) for i, v in enumerate(items)])

    def put(self, value: Any, path: tuple[str | int, ...]) -> ObjectRef:
        ref = self.refs.get(id(value))
        if ref is None:
            try:
                ref = put(value)
            except UnpicklableError as exc:
                raise TypeError(
                    f"param_space[{format_key_path(path)!r}] holds a {type_name(type(value))} that "
                    f"cannot be pickled ({exc.cause}), so trials cannot receive it. Fix: create "
                    "it inside the trainable (pass a path or settings in the config instead), "
                    "or make it picklable (define __getstate__/__setstate__)."
                ) from exc
            self.refs[id(value)] = ref
            self.bound.append((format_key_path(path), ref))
        return ref


def bind_objects(space: Any, adopt_refs: bool = False) -> tuple[Any, list[tuple[str, ObjectRef]]]:
    """Replace every non-JSON leaf of a search space by ``put(leaf)``.

    Walks nested dicts, lists and tuples, grid axes (``{"grid_search": [...]}``, each option
    separately) and :func:`~ftnb.search.choice` categories; leaves JSON scalars, numpy/torch
    0-d scalars, other domains and existing refs alone. The same object used twice becomes
    one ref. A list or tuple without domains, grid axes or refs inside is stored whole, as one
    object, when it holds an object or is larger than :data:`SHARED_PLAIN_BYTES` as JSON (so
    is such a string); smaller plain ones stay in the space. Returns the new space (the caller's is not modified; unchanged containers are
    shared) and ``(key_path, ref)`` for each object stored, with key paths like ``"model"``,
    ``"data/train"``, ``"opt/grid_search[1]"`` or ``"act/categories[0]"``.

    ``adopt_refs=True`` also :func:`adopt` the refs found (a detached supervisor does, so the
    objects outlive the kernel that put them).

    Raises TypeError naming the key path when an object cannot be pickled.
    """
    binder = _Binder(adopt_refs)
    return binder.bind(space, ()), binder.bound


def walk_placeholders(encoded: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(key_path, placeholder)`` for every :meth:`ObjectRef.placeholder` in an encoded
    (JSON) space or config, with the key paths of :func:`bind_objects`.

    >>> walk_placeholders({"data": {"train": {"__ftnb_ref__": "3fa2c1", "type": "t"}}})
    [('data/train', {'__ftnb_ref__': '3fa2c1', 'type': 't'})]
    """
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if is_placeholder(node):
            found.append((format_key_path(path), node))
        elif isinstance(node, dict):
            for key, child in node.items():
                walk(child, path + (str(key),))
        elif isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, path + (i,))

    walk(encoded, ())
    return found
