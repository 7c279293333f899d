"""Search-space primitives and variant generation (Ray Tune-compatible names).

A *param space* is a (possibly nested) dict whose leaves are plain values,
search-space *domains* (:func:`choice`, :func:`uniform`, :func:`loguniform`,
:func:`randint`, :func:`sample_from`) or *grid axes* (:func:`grid_search`).
:func:`generate_variants` turns it into a list of concrete configs::

    >>> import ftnb.search as s
    >>> space = {"opt": s.grid_search(["adam", "sgd"]), "lr": s.loguniform(1e-4, 1e-1)}
    >>> variants = s.generate_variants(space, num_samples=2, seed=0)
    >>> [v["opt"] for v in variants]
    ['adam', 'sgd', 'adam', 'sgd']

Only the stdlib is imported here so that ``import ftnb`` stays fast.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

__all__ = [
    "GRID_SEARCH_KEY",
    "DOMAIN_JSON_KEY",
    "Domain",
    "Categorical",
    "Uniform",
    "LogUniform",
    "RandInt",
    "SampleFrom",
    "SampleSpec",
    "grid_search",
    "choice",
    "uniform",
    "loguniform",
    "randint",
    "sample_from",
    "is_grid_search",
    "validate_param_space",
    "generate_variants",
    "count_variants",
    "encode_space",
    "flatten_dict",
    "unflatten_dict",
    "varying_keys",
]

#: The single key of a grid-axis dict, exactly as Ray Tune spells it.
GRID_SEARCH_KEY = "grid_search"
#: Marker key in :meth:`Domain.to_json` placeholders.
DOMAIN_JSON_KEY = "__ftnb_domain__"

_JSON_SCALARS = (str, int, float, bool, type(None))


# --------------------------------------------------------------------------- helpers


def _fmt_path(path: Sequence[str | int]) -> str:
    """Render a key path as ``model/layers[0]/units`` for error messages."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("/" if out else "") + str(part)
    return out or "<root>"


def _short_repr(value: Any, limit: int = 80) -> str:
    # Param spaces may hold datasets; never dump a megabyte into an error message.
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not mask the real error
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_real(func: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{func}() argument {name!r} must be a real number; got "
            f"{type(value).__name__}: {_short_repr(value)}. Fix: pass an int or float."
        )
    if not math.isfinite(value):
        raise ValueError(
            f"{func}() argument {name!r} must be finite; got {value!r}. "
            f"Fix: pass a finite bound."
        )
    return value


def _default_encode_leaf(value: Any) -> Any:
    # Used when no callback is given: a readable, JSON-able stand-in.
    return {"__ftnb_repr__": _short_repr(value, 200), "type": type(value).__qualname__}


def _encode(value: Any, encode_leaf: Callable[[Any], Any]) -> Any:
    """Shared encoder for :func:`encode_space` and :meth:`Categorical.to_json`."""
    if isinstance(value, Domain):
        return value.to_json(encode_leaf)
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, Mapping):
        return {str(k): _encode(v, encode_leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, encode_leaf) for v in value]
    return encode_leaf(value)


def is_grid_search(value: Any) -> bool:
    """True if ``value`` is a grid axis: a dict whose only key is ``"grid_search"``
    and whose value is a list (Ray's representation).

    >>> is_grid_search({"grid_search": [1, 2]})
    True
    """
    return (
        isinstance(value, Mapping)
        and len(value) == 1
        and GRID_SEARCH_KEY in value
        and isinstance(value[GRID_SEARCH_KEY], list)
    )


# --------------------------------------------------------------------------- domains


class SampleSpec:
    """What a :func:`sample_from` function receives.

    ``spec.config`` is a read-only view of the variant's config with every other
    domain and grid axis already resolved; it supports both attribute and item
    access (``spec.config.model.lr`` or ``spec["config"]["model"]["lr"]``, as in
    Ray Tune). ``spec.rng`` is the generator's :class:`random.Random`; draw from
    it (not the global ``random`` module) to stay reproducible under a ``seed``.
    """

    __slots__ = ("config", "rng")

    def __init__(self, config: Mapping[str, Any], rng: random.Random) -> None:
        self.config: Any = config if isinstance(config, _ConfigView) else _ConfigView(config, ())
        self.rng = rng

    def __getitem__(self, key: str) -> Any:
        if key == "config":
            return self.config
        raise KeyError(key)

    def __repr__(self) -> str:
        return f"SampleSpec(config={self.config!r})"


class _UnresolvedDependency(Exception):
    """Raised when a sample_from reads another sample_from not yet resolved."""

    def __init__(self, path: tuple[str | int, ...]) -> None:
        super().__init__(f"{_fmt_path(path)} is not resolved yet")
        self.path = path


class _ConfigView(Mapping[str, Any]):
    """Read-only, attribute-accessible view over a draft config."""

    __slots__ = ("_data", "_path")

    def __init__(self, data: Mapping[str, Any], path: tuple[str | int, ...]) -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_path", path)

    def _wrap(self, key: str, value: Any) -> Any:
        if isinstance(value, Domain):
            # Only sample_from values can still be unresolved at this point.
            raise _UnresolvedDependency(self._path + (key,))
        if isinstance(value, Mapping):
            return _ConfigView(value, self._path + (key,))
        return value

    def __getitem__(self, key: str) -> Any:
        return self._wrap(key, self._data[key])

    def __getattribute__(self, key: str) -> Any:
        # Config keys win over Mapping methods (a key named "items" or "get"
        # must still read as config), as with Ray's dict-backed spec.
        if not key.startswith("_"):
            data = object.__getattribute__(self, "_data")
            if key in data:
                return object.__getattribute__(self, "_wrap")(key, data[key])
        return object.__getattribute__(self, key)

    def __getattr__(self, key: str) -> Any:
        # Reached only when no attribute matched, e.g. a "_private" config key.
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            value = self._data[key]
        except KeyError:
            where = _fmt_path(self._path) if self._path else "config"
            raise AttributeError(
                f"{where} has no key {key!r}; available keys: {sorted(map(str, self._data))}"
            ) from None
        return self._wrap(key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        raise TypeError("spec.config is read-only inside sample_from")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"<config view {_short_repr(dict(self._data), 200)}>"


def _unwrap_views(value: Any) -> Any:
    # A sample_from returning spec.config.sub must not leak a view (or alias
    # another variant's dict) into the resolved config.
    if isinstance(value, _ConfigView):
        return {k: _unwrap_views(v) for k, v in value._data.items()}
    return value


class Domain:
    """Base class of search-space domains (Ray Tune calls them the same).

    Subclasses implement :meth:`sample` and :meth:`to_json`.
    """

    #: Short name used in :meth:`to_json` placeholders.
    kind: str = "domain"

    def sample(self, rng: random.Random, spec: SampleSpec | None = None) -> Any:
        """Draw one value using ``rng`` (``spec`` is only used by :class:`SampleFrom`)."""
        raise NotImplementedError

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        """A JSON-able placeholder such as ``{"__ftnb_domain__": "uniform", ...}``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items() if k != DOMAIN_JSON_KEY)
        return f"{type(self).__name__}({args})"


class Categorical(Domain):
    """Uniform choice among ``categories``; created by :func:`choice`.

    When used through :func:`generate_variants`, domains nested inside the
    chosen category (e.g. a dict holding a ``loguniform``) are resolved too.
    """

    kind = "choice"

    def __init__(self, categories: Sequence[Any]) -> None:
        self.categories: list[Any] = list(categories)

    def sample(self, rng: random.Random, spec: SampleSpec | None = None) -> Any:
        # randrange (not rng.choice) so the raw index is shared with the
        # generator's nested-resolution path and draws stay in lockstep.
        return self.categories[rng.randrange(len(self.categories))]

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        enc = encode_leaf or _default_encode_leaf
        categories = [_encode(c, enc) for c in self.categories]
        return {DOMAIN_JSON_KEY: self.kind, "categories": categories}


class Uniform(Domain):
    """Float uniformly distributed in ``[low, high]``; created by :func:`uniform`."""

    kind = "uniform"

    def __init__(self, low: float, high: float) -> None:
        self.low = low
        self.high = high

    def sample(self, rng: random.Random, spec: SampleSpec | None = None) -> float:
        return rng.uniform(self.low, self.high)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.low, "high": self.high}


class LogUniform(Domain):
    """Float whose logarithm is uniform in ``[log(low), log(high)]``; see :func:`loguniform`."""

    kind = "loguniform"

    def __init__(self, low: float, high: float, base: float = 10) -> None:
        self.low = low
        self.high = high
        self.base = base

    def sample(self, rng: random.Random, spec: SampleSpec | None = None) -> float:
        # The distribution does not depend on the base; it is kept for fidelity
        # with Ray's signature and stored placeholders.
        lo, hi = math.log(self.low, self.base), math.log(self.high, self.base)
        value = self.base ** rng.uniform(lo, hi)
        # pow/log round-trips can land one ulp outside the bounds.
        return min(max(value, self.low), self.high)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.low, "high": self.high, "base": self.base}


class RandInt(Domain):
    """Integer uniformly distributed in ``[low, high)`` (high exclusive, like Ray)."""

    kind = "randint"

    def __init__(self, low: int, high: int) -> None:
        self.low = low
        self.high = high

    def sample(self, rng: random.Random, spec: SampleSpec | None = None) -> int:
        return rng.randrange(self.low, self.high)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        return {DOMAIN_JSON_KEY: self.kind, "low": self.low, "high": self.high}


class SampleFrom(Domain):
    """Value computed by ``func(spec)``; created by :func:`sample_from`."""

    kind = "sample_from"

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self._pass_spec = _accepts_argument(func)

    def sample(self, rng: random.Random, spec: SampleSpec | None = None) -> Any:
        if not self._pass_spec:
            return self.func()
        return self.func(spec if spec is not None else SampleSpec({}, rng))

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        name = getattr(self.func, "__qualname__", None)
        if not isinstance(name, str):
            name = _short_repr(self.func, 200)
        return {DOMAIN_JSON_KEY: self.kind, "function": name}


def _accepts_argument(func: Callable[..., Any]) -> bool:
    # Ray calls zero-argument functions without a spec; keep that convenience.
    import inspect  # local: only needed when sample_from is used

    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without signatures: assume spec
        return True
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL):
            return True
    return False


# --------------------------------------------------------------------------- constructors


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
            f"{type(values).__name__}: {_short_repr(values)}. "
            f"Fix: pass a list, e.g. grid_search({hint}[...])."
        )
    try:
        items = list(values)
    except TypeError:
        raise TypeError(
            f"grid_search() argument 'values' must be an iterable; got "
            f"{type(values).__name__}: {_short_repr(values)}. "
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
            f"{type(categories).__name__}: {_short_repr(categories)}{hint}. "
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
                f"choice() category {i} contains a grid_search: {_short_repr(cat)}. "
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

    >>> randint(0, 1).sample(random.Random(0))
    0
    """
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"randint() argument {name!r} must be an int; got "
                f"{type(value).__name__}: {_short_repr(value)}. "
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
            f"{type(func).__name__}: {_short_repr(func)}. "
            f"Fix: pass a function, e.g. sample_from(lambda spec: spec.config.lr * 2)."
        )
    return SampleFrom(func)


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
                    f"param_space[{_fmt_path(path)!r}]: a choice() category contains a "
                    f"grid_search. Fix: move the grid_search outside the choice."
                )
            return _DomainNode(value, cats)
        return _DomainNode(value)
    if isinstance(value, Mapping):
        if GRID_SEARCH_KEY in value and len(value) == 1:
            options = value[GRID_SEARCH_KEY]
            if not isinstance(options, list):
                raise TypeError(
                    f"param_space[{_fmt_path(path)!r}] looks like a grid axis but its "
                    f"'grid_search' value is {type(options).__name__}: {_short_repr(options)}. "
                    f"Fix: use ftnb.grid_search([...]) or {{'grid_search': [...]}} with a list."
                )
            if not options:
                raise ValueError(
                    f"param_space[{_fmt_path(path)!r}] is an empty grid_search, which would "
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
    where = f" under {_fmt_path(path)!r}" if path else ""
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


def _make_seq(seq_type: type, items: list[Any]) -> Any:
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
                return _make_seq(node.seq_type, list(seq))
            seq.seq_type = node.seq_type
        return seq
    if isinstance(node, _DomainNode):
        dom = node.domain
        if isinstance(dom, SampleFrom):
            return dom
        if node.categories is not None and node.nested:
            # Same single randrange draw as Categorical.sample, then resolve
            # whatever domains the chosen category holds.
            idx = state.rng.randrange(len(node.categories))
            return _resolve(node.categories[idx], state, path)
        return dom.sample(state.rng)
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
                value = dom.sample(state.rng, spec)
            except _UnresolvedDependency as exc:
                blocked.append((container, key, dom, path))
                missing.append(f"{_fmt_path(path)} reads {_fmt_path(exc.path)}")
                continue
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(
                        f"while evaluating sample_from at param_space[{_fmt_path(path)!r}]"
                    )
                raise
            container[key] = _unwrap_views(value)
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
        container[key] = _make_seq(draft.seq_type, list(draft))
    return config


# --------------------------------------------------------------------------- public API


def _compile_space(param_space: Mapping[str, Any] | None) -> _Node:
    if param_space is None:
        return _DictNode([])
    if not isinstance(param_space, Mapping):
        raise TypeError(
            "param_space must be a dict of config keys to values or search-space domains "
            "(e.g. {'lr': ftnb.loguniform(1e-4, 1e-1)}); got "
            f"{type(param_space).__name__}: {_short_repr(param_space)}. Fix: pass a dict."
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
            f"{_short_repr(num_samples)}. Fix: pass e.g. num_samples=4."
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

    >>> validate_param_space({"model": {"lr": uniform(0.1, 1.0)}})
    >>> validate_param_space([1, 2])
    Traceback (most recent call last):
    ...
    TypeError: param_space must be a dict ...; got list: [1, 2]. Fix: pass a dict.
    """
    _compile_space(param_space)


def count_variants(param_space: Mapping[str, Any] | None, num_samples: int = 1) -> int:
    """Number of configs :func:`generate_variants` would return, without generating.

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

    >>> generate_variants({"a": grid_search([1, 2]), "b": "x"}, num_samples=2)
    [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}, {'a': 1, 'b': 'x'}, {'a': 2, 'b': 'x'}]

    Note: Ray varies the first grid axis *fastest* (and sorts axes by path);
    ftnb uses the more readable nested-loop order instead.
    """
    _check_num_samples(num_samples)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(
            f"seed must be an int or None; got {type(seed).__name__}: {_short_repr(seed)}. "
            f"Fix: pass e.g. seed=0."
        )
    templates = _expand(_compile_space(param_space))
    rng = random.Random(seed)
    return [_resolve_variant(t, rng) for _ in range(num_samples) for t in templates]


def encode_space(param_space: Any, encode_leaf: Callable[[Any], Any]) -> Any:
    """JSON-able description of a param space, for storing in experiment state.

    Domains become their :meth:`Domain.to_json` placeholder, grid axes stay
    ``{"grid_search": [...]}`` with encoded values, dicts and lists/tuples are
    recursed (tuples become lists), JSON scalars (str, int, float, bool, None)
    are kept, and every other leaf is replaced by ``encode_leaf(leaf)``.

    >>> encode_space({"lr": uniform(0.1, 1.0), "data": object()}, lambda v: "<object>")
    {'lr': {'__ftnb_domain__': 'uniform', 'low': 0.1, 'high': 1.0}, 'data': '<object>'}
    """
    if param_space is None:
        return None
    return _encode(param_space, encode_leaf)


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
                    f"a dict, but it already holds {_short_repr(child)}. Fix: drop one of the "
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


def varying_keys(param_space: Mapping[str, Any] | None, sep: str = "/") -> list[str]:
    """Flattened key paths whose values can differ between variants.

    Every domain and grid axis contributes its path. A grid axis or choice
    whose values are dicts contributes the flattened keys inside those dicts
    instead, matching the columns of flattened configs. Domains inside lists
    report the list's path (a list is a single column).

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
