"""Variant generation: a param space compiled into a small tree, its grid expanded, its
domains drawn, one concrete config per variant (:func:`generate_variants`), and what can be
known without generating (:func:`count_variants`, :func:`validate_param_space`,
:func:`varying_keys`). Only the stdlib is imported here so that ``import ftnb`` stays fast.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from typing import Any, Iterator, NoReturn

from .domains import (
    GRID_SEARCH_KEY,
    Categorical,
    Domain,
    SampleFrom,
    SampleSpec,
    UnresolvedDependency,
    is_grid_search,
    unwrap_config_views,
)
from .flatten import flatten_dict
from .messages import format_key_path, short_repr

__all__ = [
    "count_variants",
    "generate_variants",
    "iter_variants",
    "with_point",
    "make_sequence",
    "validate_param_space",
    "varying_keys",
]


# --------------------------------------------------------------------------- compiled tree
#
# The space is compiled once per call into a small node tree so that large
# search-free subtrees (e.g. a list of a million samples) are scanned once,
# not once per variant, and so counting never needs to enumerate.


class _Const:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _DictNode:
    __slots__ = ("items",)

    def __init__(self, items: list[tuple[str, _Node]]) -> None:
        self.items = items


class _SeqNode:
    __slots__ = ("seq_type", "items")

    def __init__(self, seq_type: type, items: list[_Node]) -> None:
        self.seq_type = seq_type
        self.items = items


class _GridNode:
    __slots__ = ("options",)

    def __init__(self, options: list[_Node]) -> None:
        self.options = options


class _DomainNode:
    __slots__ = ("domain", "categories", "nested")

    def __init__(self, domain: Domain, categories: list[_Node] | None = None) -> None:
        self.domain = domain
        # Compiled choice() categories; ``nested`` is True when at least one
        # holds domains that must be resolved after it is chosen.
        self.categories = categories
        self.nested = categories is not None and not all(isinstance(c, _Const) for c in categories)


_Node = _Const | _DictNode | _SeqNode | _GridNode | _DomainNode


def _compile(value: Any, path: tuple[str | int, ...]) -> _Node:
    if isinstance(value, Domain):
        if isinstance(value, Categorical):
            cats = [_compile(c, path) for c in value.categories]
            if any(_has_grid(c) for c in cats):
                raise ValueError(
                    f"param_space[{format_key_path(path)!r}]: a choice() category contains a "
                    f"grid_search. Fix: move the grid_search outside the choice."
                )
            return _DomainNode(value, cats)
        return _DomainNode(value)
    if isinstance(value, Mapping):
        if GRID_SEARCH_KEY in value and len(value) == 1:
            options = value[GRID_SEARCH_KEY]
            if not isinstance(options, list):
                raise TypeError(
                    f"param_space[{format_key_path(path)!r}] looks like a grid axis but its "
                    f"'grid_search' value is {type(options).__name__}: {short_repr(options)}. "
                    f"Fix: use ftnb.grid_search([...]) or {{'grid_search': [...]}} with a list."
                )
            if not options:
                raise ValueError(
                    f"param_space[{format_key_path(path)!r}] is an empty grid_search, which would "
                    f"produce zero trials. Fix: list at least one value."
                )
            return _GridNode([_compile(o, path) for o in options])
        if type(value) is not dict and not _scan(value, path):
            # A user's Mapping type (e.g. a dataset dict) with nothing to
            # resolve is a leaf object: keep it, identity included.
            return _Const(value)
        items: list[tuple[str, _Node]] = []
        for k, v in value.items():
            if not isinstance(k, str):
                _bad_key(k, path)
            items.append((k, _compile(v, path + (k,))))
        return _DictNode(items)
    if isinstance(value, (list, tuple)):
        if not _scan(value, path):
            # Search-free sequences (possibly millions of samples, or dicts)
            # are leaves kept as-is, without a node per element.
            return _Const(value)
        return _SeqNode(type(value), [_compile(v, path + (i,)) for i, v in enumerate(value)])
    return _Const(value)


# Exact types that can never hold a domain; skipping them keeps scans of
# large leaf lists (millions of numbers) cheap.
_ATOMS = frozenset({int, float, complex, str, bytes, bool, type(None)})


def _scan(value: Any, path: tuple[str | int, ...]) -> bool:
    """Check key types and return True if a domain or grid axis occurs inside
    ``value`` (through dicts, lists and tuples)."""
    if isinstance(value, Domain):
        return True
    if isinstance(value, Mapping):
        if is_grid_search(value):
            return True
        for k, v in value.items():
            if not isinstance(k, str):
                _bad_key(k, path)
            if type(v) not in _ATOMS and _scan(v, path + (k,)):
                return True
        return False
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if type(v) not in _ATOMS and _scan(v, path + (i,)):
                return True
    return False


def _bad_key(key: Any, path: tuple[str | int, ...]) -> NoReturn:
    where = f" under {format_key_path(path)!r}" if path else ""
    raise TypeError(
        f"param_space keys must be str; got {type(key).__name__} key {key!r}{where}. "
        f"Fix: use string keys, e.g. {str(key)!r}."
    )


def _has_grid(node: _Node) -> bool:
    if isinstance(node, _GridNode):
        return True
    if isinstance(node, _DictNode):
        return any(_has_grid(n) for _, n in node.items)
    if isinstance(node, _SeqNode):
        return any(_has_grid(n) for n in node.items)
    return False


def _count(node: _Node) -> int:
    if isinstance(node, _GridNode):
        return sum(_count(o) for o in node.options)
    if isinstance(node, _DictNode):
        return math.prod(_count(n) for _, n in node.items)
    if isinstance(node, _SeqNode):
        return math.prod(_count(n) for n in node.items)
    return 1


def _expand(node: _Node) -> list[_Node]:
    """All grid combinations of ``node`` as grid-free templates (first key slowest)."""
    if isinstance(node, _GridNode):
        return [t for o in node.options for t in _expand(o)]
    if isinstance(node, _DictNode):
        if not _has_grid(node):
            return [node]
        keys = [k for k, _ in node.items]
        combos = itertools.product(*(_expand(n) for _, n in node.items))
        return [_DictNode(list(zip(keys, combo))) for combo in combos]
    if isinstance(node, _SeqNode):
        if not _has_grid(node):
            return [node]
        combos = itertools.product(*(_expand(n) for n in node.items))
        return [_SeqNode(node.seq_type, list(combo)) for combo in combos]
    return [node]


class _DraftTuple(list):  # type: ignore[type-arg]
    """A tuple (or namedtuple) whose sample_from slots are filled in later.

    Tuples are immutable, so one holding a pending sample_from is built as a
    list first and converted once all functions of the variant have run.
    """

    __slots__ = ("seq_type",)


def make_sequence(seq_type: type, items: list[Any]) -> Any:
    """A ``seq_type`` (list, tuple, namedtuple or another tuple type) of ``items``; a plain
    tuple when ``seq_type`` cannot be built from a list."""
    if seq_type is list:
        return items
    if hasattr(seq_type, "_fields"):  # namedtuple takes positional fields
        return seq_type(*items)
    try:
        return seq_type(items)
    except TypeError:
        return tuple(items)


class _VariantState:
    """Bookkeeping while one variant is resolved."""

    __slots__ = ("rng", "pending", "tuples")

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # (container, key, function, path) of every sample_from slot.
        self.pending: list[tuple[Any, str | int, SampleFrom, tuple[str | int, ...]]] = []
        # (container, key, draft) in post-order: inner tuples before outer ones.
        self.tuples: list[tuple[Any, str | int, _DraftTuple]] = []

    def placed(self, container: Any, key: str | int, path: tuple[str | int, ...]) -> None:
        value = container[key]
        if isinstance(value, SampleFrom):
            self.pending.append((container, key, value, path))
        elif isinstance(value, _DraftTuple):
            self.tuples.append((container, key, value))


def _resolve(node: _Node, state: _VariantState, path: tuple[str | int, ...]) -> Any:
    """Value of a grid-free template with every non-function domain drawn;
    sample_from slots still hold their :class:`SampleFrom` (see ``state``)."""
    if isinstance(node, _Const):
        return node.value
    if isinstance(node, _DictNode):
        out: dict[str, Any] = {}
        for k, child in node.items:
            out[k] = _resolve(child, state, path + (k,))
            state.placed(out, k, path + (k,))
        return out
    if isinstance(node, _SeqNode):
        before = len(state.pending)
        # Build tuples as a draft from the start: pending slots point into it.
        seq: list[Any] = [] if node.seq_type is list else _DraftTuple()
        for i, child in enumerate(node.items):
            seq.append(_resolve(child, state, path + (i,)))
            state.placed(seq, i, path + (i,))
        if isinstance(seq, _DraftTuple):
            if len(state.pending) == before:
                return make_sequence(node.seq_type, list(seq))
            seq.seq_type = node.seq_type
        return seq
    if isinstance(node, _DomainNode):
        dom = node.domain
        if isinstance(dom, SampleFrom):
            return dom
        if node.categories is not None and node.nested:
            # Same single randrange draw as Categorical.draw, then resolve
            # whatever domains the chosen category holds.
            idx = state.rng.randrange(len(node.categories))
            return _resolve(node.categories[idx], state, path)
        return dom.draw(state.rng)
    raise AssertionError(f"unexpected node {node!r}")  # grids are expanded before


def _resolve_functions(draft: dict[str, Any], state: _VariantState) -> None:
    spec = SampleSpec(draft, state.rng)
    remaining = state.pending
    # Each pass runs every function whose inputs are ready; a pass without
    # progress means the functions read each other in a cycle.
    while remaining:
        blocked: list[tuple[Any, str | int, SampleFrom, tuple[str | int, ...]]] = []
        missing: list[str] = []
        for container, key, dom, path in remaining:
            try:
                value = dom.draw(state.rng, spec)
            except UnresolvedDependency as exc:
                blocked.append((container, key, dom, path))
                missing.append(f"{format_key_path(path)} reads {format_key_path(exc.path)}")
                continue
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(
                        f"while evaluating sample_from at param_space[{format_key_path(path)!r}]"
                    )
                raise
            container[key] = unwrap_config_views(value)
        if len(blocked) == len(remaining):
            raise ValueError(
                f"sample_from functions depend on each other in a cycle ({'; '.join(missing)}). "
                f"Fix: make at least one of them depend only on non-sample_from values."
            )
        remaining = blocked


def _resolve_variant(template: _Node, rng: random.Random) -> dict[str, Any]:
    state = _VariantState(rng)
    config: dict[str, Any] = _resolve(template, state, ())
    _resolve_functions(config, state)
    for container, key, draft in state.tuples:
        container[key] = make_sequence(draft.seq_type, list(draft))
    return config


# --------------------------------------------------------------------------- public API


def _compile_space(param_space: Mapping[str, Any] | None) -> _Node:
    if param_space is None:
        return _DictNode([])
    if not isinstance(param_space, Mapping):
        raise TypeError(
            "param_space must be a dict of config keys to values or search-space domains "
            "(e.g. {'lr': ftnb.loguniform(1e-4, 1e-1)}); got "
            f"{type(param_space).__name__}: {short_repr(param_space)}. Fix: pass a dict."
        )
    if is_grid_search(param_space):
        raise TypeError(
            "param_space must be a dict of config keys, not a bare grid_search(...). "
            "Fix: name the axis, e.g. {'lr': ftnb.grid_search([...])}."
        )
    node = _compile(param_space, ())
    if isinstance(node, _Const):  # a non-dict Mapping without domains
        node = _DictNode([(k, _Const(v)) for k, v in param_space.items()])
    return node


def _check_num_samples(num_samples: int) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int):
        raise TypeError(
            f"num_samples must be an int; got {type(num_samples).__name__}: "
            f"{short_repr(num_samples)}. Fix: pass e.g. num_samples=4."
        )
    if num_samples < 1:
        raise ValueError(
            f"num_samples must be >= 1; got num_samples={num_samples}. "
            f"Fix: pass num_samples=1 to run each grid combination once."
        )


def validate_param_space(param_space: Mapping[str, Any] | None) -> None:
    """Raise ``TypeError``/``ValueError`` if ``param_space`` is not a valid space.

    ``None`` is allowed (no config). Keys must be strings at every depth; grid
    axes must be non-empty lists.

    >>> from ftnb.search import uniform
    >>> validate_param_space({"model": {"lr": uniform(0.1, 1.0)}})
    >>> validate_param_space([1, 2])
    Traceback (most recent call last):
    ...
    TypeError: param_space must be a dict ...; got list: [1, 2]. Fix: pass a dict.
    """
    _compile_space(param_space)


def count_variants(param_space: Mapping[str, Any] | None, num_samples: int = 1) -> int:
    """Number of configs :func:`generate_variants` would return, without generating.

    >>> from ftnb.search import grid_search
    >>> count_variants({"a": grid_search([1, 2]), "b": grid_search([3, 4, 5])}, num_samples=2)
    12
    """
    _check_num_samples(num_samples)
    return _count(_compile_space(param_space)) * num_samples


def generate_variants(
    param_space: Mapping[str, Any] | None,
    num_samples: int = 1,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """Resolve a param space into concrete configs.

    The grid (cartesian product of every grid axis, nested ones included) is
    repeated ``num_samples`` times; order is ``for sample: for combo in grid``
    with the first grid key (depth-first, insertion order) varying slowest.
    Random domains are drawn independently for every variant from one
    ``random.Random(seed)`` in a fixed order, so a seed reproduces the list
    exactly. :func:`sample_from` functions run after the other domains of
    their variant.

    Dicts are rebuilt per variant; every other leaf object (arrays, datasets,
    models, lists without domains in them) is the *same* object as in
    ``param_space``, never copied.

    >>> from ftnb.search import grid_search
    >>> generate_variants({"a": grid_search([1, 2]), "b": "x"}, num_samples=2)
    [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}, {'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}]

    Note: Ray varies the first grid axis *fastest* (and sorts axes by path);
    ftnb uses the more readable nested-loop order instead.
    """
    _check_num_samples(num_samples)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(
            f"seed must be an int or None; got {type(seed).__name__}: {short_repr(seed)}. "
            f"Fix: pass e.g. seed=0."
        )
    templates = _expand(_compile_space(param_space))
    rng = random.Random(seed)
    return [_resolve_variant(t, rng) for _ in range(num_samples) for t in templates]


def iter_variants(
    param_space: Mapping[str, Any] | None,
    num_samples: int | None,
    rng: random.Random,
    points_to_evaluate: list[Mapping[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """The configs of :func:`generate_variants`, one at a time, drawn with ``rng``:
    ``num_samples=None`` never ends (``TuneConfig(num_samples=-1)``).

    ``points_to_evaluate`` (Ray's ``BasicVariantGenerator``): each point replaces one sample and
    comes first, its values fixed (:func:`with_point`) and the rest of the space resolved as
    usual; a grid axis the point does not fix still gives one config per grid value. Without
    points, the configs are exactly :func:`generate_variants`' for the same ``rng``.
    """
    points = list(points_to_evaluate or [])
    for point in points:
        for template in _expand(_compile_space(with_point(param_space, point))):
            yield _resolve_variant(template, rng)
    templates = _expand(_compile_space(param_space))
    samples = itertools.count() if num_samples is None else range(
        max(0, num_samples - len(points)))
    for _ in samples:
        for template in templates:
            yield _resolve_variant(template, rng)


def with_point(param_space: Mapping[str, Any] | None, point: Mapping[str, Any]) -> dict:
    """``param_space`` with the values of ``point`` (a partial config, nested like the space)
    in place of its domains, grid axes and values; keys the space lacks are added.

    >>> from ftnb.search import grid_search, uniform
    >>> with_point({"a": grid_search([1, 2]), "m": {"lr": uniform(0, 1), "k": 3}}, {"m": {"lr": 0.5}})
    {'a': {'grid_search': [1, 2]}, 'm': {'lr': 0.5, 'k': 3}}
    """
    if not isinstance(point, Mapping):
        raise TypeError(
            f"points_to_evaluate must be a list of dicts (partial configs); got an item of type "
            f"{type(point).__name__}: {short_repr(point)}. Fix: e.g. [{{'lr': 0.01}}]."
        )
    out: dict[str, Any] = dict(param_space or {})
    for key, value in point.items():
        current = out.get(key)
        if (isinstance(value, Mapping) and isinstance(current, Mapping)
                and not is_grid_search(current) and not isinstance(current, Domain)):
            out[key] = with_point(current, value)
        else:
            out[key] = value
    return out


def varying_keys(param_space: Mapping[str, Any] | None, sep: str = "/") -> list[str]:
    """Flattened key paths whose values can differ between variants.

    Every domain and grid axis contributes its path. A grid axis or choice
    whose values are dicts contributes the flattened keys inside those dicts
    instead, matching the columns of flattened configs. Domains inside lists
    report the list's path (a list is a single column).

    >>> from ftnb.search import grid_search, loguniform
    >>> varying_keys({"model": {"lr": loguniform(1e-4, 1e-1), "depth": 3},
    ...               "opt": grid_search([{"name": "adam"}, {"name": "sgd", "momentum": 0.9}])})
    ['model/lr', 'opt/name', 'opt/momentum']
    """
    keys: dict[str, None] = {}  # insertion-ordered set

    def add(path: tuple[str, ...]) -> None:
        if path:
            keys[sep.join(path)] = None

    def add_values(node: _Node, path: tuple[str, ...]) -> None:
        # ``node`` is one possible value of a varying point: all its leaves vary.
        if isinstance(node, _DictNode) and node.items:
            for k, child in node.items:
                add_values(child, path + (k,))
        elif isinstance(node, _Const) and isinstance(node.value, Mapping) and node.value:
            for k in flatten_dict(node.value, sep):
                add(path + (k,))
        elif isinstance(node, _GridNode):
            for option in node.options:
                add_values(option, path)
        elif isinstance(node, _DomainNode) and node.categories is not None:
            for category in node.categories:
                add_values(category, path)
        else:
            add(path)

    def walk(node: _Node, path: tuple[str, ...]) -> None:
        if isinstance(node, _DictNode):
            for k, child in node.items:
                walk(child, path + (k,))
        elif isinstance(node, (_GridNode, _DomainNode)):
            add_values(node, path)
        elif isinstance(node, _SeqNode):
            add(path)

    walk(_compile_space(param_space), ())
    return list(keys)
