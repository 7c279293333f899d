"""Search-space domains (Ray Tune's names): what a varying value of a param space is.

A domain (:class:`Categorical`, :class:`SampleFrom`, and the numeric ones of
:mod:`ftnb.search.numeric`) draws one value per variant; a grid axis is Ray's plain
``{"grid_search": [...]}`` dict (:func:`is_grid_search`). :class:`SampleSpec` is what a
``sample_from`` function receives: a read-only view of its variant. :func:`encode_space` writes
a space as JSON for the experiment's state. The functions users call to create domains are in
:mod:`ftnb.search.constructors`. Only the stdlib is imported here so that ``import ftnb`` stays
fast.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .messages import format_key_path, short_repr

__all__ = [
    "GRID_SEARCH_KEY",
    "DOMAIN_JSON_KEY",
    "Domain",
    "Categorical",
    "SampleFrom",
    "SampleSpec",
    "UnresolvedDependency",
    "is_grid_search",
    "searched_domains",
    "encode_space",
    "unwrap_config_views",
]

#: The single key of a grid-axis dict, exactly as Ray Tune spells it.
GRID_SEARCH_KEY = "grid_search"
#: Marker key in :meth:`Domain.to_json` placeholders.
DOMAIN_JSON_KEY = "__ftnb_domain__"

_JSON_SCALARS = (str, int, float, bool, type(None))


# --------------------------------------------------------------------------- helpers


def _default_encode_leaf(value: Any) -> Any:
    # Used when no callback is given: a readable, JSON-able stand-in.
    return {"__ftnb_repr__": short_repr(value, 200), "type": type(value).__qualname__}


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


def holds_domain(value: Any) -> bool:
    """True if ``value`` is, or holds somewhere inside its dicts, lists and tuples, a
    :class:`Domain` or a grid axis (something a searcher samples).

    >>> holds_domain({"a": [1, {"grid_search": [1, 2]}]}), holds_domain({"a": [1, 2]})
    (True, False)
    """
    if isinstance(value, Domain) or is_grid_search(value):
        return True
    if isinstance(value, dict):
        return any(holds_domain(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_domain(v) for v in value)
    return False


def searched_domains(space: Any, owner: str, leaves: tuple = ()) -> dict[str, Any]:
    """The domains of ``space`` by ``"a/b"`` name (nested keys joined by ``/``, as Ray's
    searchers name them), for a searcher ``owner`` that samples them, with the values of the
    types ``leaves`` (a library's own distributions) as they are; plain values are left out
    (they stay the config's). Raises ValueError, naming the key and the fix, for a grid axis
    (a sampler does not enumerate) and for a domain inside a list.

    >>> from ftnb.search import uniform
    >>> searched_domains({"m": {"lr": uniform(0, 1)}, "n": 2}, "MySearch")
    {'m/lr': Uniform(lower=0, upper=1)}
    """
    out: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, (Domain, *leaves)):
            out[path] = value
        elif is_grid_search(value):
            raise ValueError(
                f"{owner} cannot search param_space[{path!r}], a grid_search: it samples, it "
                "does not enumerate. Fix: use ftnb.choice([...]) there, or run the grid "
                "without a search_alg.")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{path}/{key}" if path else str(key))
        elif isinstance(value, (list, tuple)) and holds_domain(value):
            raise ValueError(f"{owner} cannot search domains inside a list "
                             f"(param_space[{path!r}]). Fix: use a dict of domains there.")

    walk(space or {}, "")
    return out


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


class UnresolvedDependency(Exception):
    """Raised when a sample_from reads another sample_from not yet resolved; variant
    generation catches it and runs that function again once its input is there."""

    def __init__(self, path: tuple[str | int, ...]) -> None:
        super().__init__(f"{format_key_path(path)} is not resolved yet")
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
            raise UnresolvedDependency(self._path + (key,))
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
            where = format_key_path(self._path) if self._path else "config"
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
        return f"<config view {short_repr(dict(self._data), 200)}>"


def unwrap_config_views(value: Any) -> Any:
    """``value`` with every :class:`SampleSpec` config view in it copied into a plain dict."""
    # A sample_from returning spec.config.sub must not leak a view (or alias
    # another variant's dict) into the resolved config.
    if isinstance(value, _ConfigView):
        return {k: unwrap_config_views(v) for k, v in value._data.items()}
    return value


class Domain:
    """Base class of search-space domains (Ray Tune calls them the same).

    Subclasses implement :meth:`draw` and :meth:`to_json`; :meth:`sample` is Ray's.
    """

    #: Short name used in :meth:`to_json` placeholders.
    kind: str = "domain"

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> Any:
        """One value drawn with ``rng`` (what variant generation calls; ``spec`` is only used
        by :class:`SampleFrom`)."""
        raise NotImplementedError

    def sample(self, config: Any = None, size: int = 1, random_state: Any = None) -> Any:
        """Ray's ``Domain.sample``: one value when ``size`` is 1, else a list of ``size``.

        ``random_state`` is a seed (int), a :class:`random.Random`, a numpy ``Generator`` or
        ``RandomState`` (which seeds a :class:`random.Random` with one draw), or None: Python's
        global ``random`` state (Ray uses numpy's global state). ``config`` is what a
        :func:`sample_from` function reads as ``spec.config`` (a list: one config per value).
        ``sample(rng)`` with a :class:`random.Random` first, ftnb's earlier form, still works.

        >>> from ftnb.search import quniform
        >>> quniform(0, 1, 0.25).sample(random_state=0)
        0.75
        >>> len(quniform(0, 1, 0.25).sample(size=3, random_state=0))
        3
        """
        if isinstance(config, random.Random) and random_state is None:
            config, random_state = None, config
        count = _check_size(size)
        rng = _as_rng(random_state)
        values = [self.draw(rng, self._spec(config, i, rng)) for i in range(count)]
        return values[0] if count == 1 else values

    def _spec(self, config: Any, index: int, rng: random.Random) -> SampleSpec | None:
        # Only a sample_from reads the config.
        return None

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

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> Any:
        # randrange (not rng.choice) so the raw index is shared with the
        # generator's nested-resolution path and draws stay in lockstep.
        return self.categories[rng.randrange(len(self.categories))]

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        enc = encode_leaf or _default_encode_leaf
        categories = [_encode(c, enc) for c in self.categories]
        return {DOMAIN_JSON_KEY: self.kind, "categories": categories}


class SampleFrom(Domain):
    """Value computed by ``func(spec)``; created by :func:`sample_from`."""

    kind = "sample_from"

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self._pass_spec = _accepts_argument(func)

    def draw(self, rng: random.Random, spec: SampleSpec | None = None) -> Any:
        if not self._pass_spec:
            return self.func()
        return self.func(spec if spec is not None else SampleSpec({}, rng))

    def _spec(self, config: Any, index: int, rng: random.Random) -> SampleSpec:
        if isinstance(config, list):
            config = config[index]
        return SampleSpec(config if config is not None else {}, rng)

    def to_json(self, encode_leaf: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        name = getattr(self.func, "__qualname__", None)
        if not isinstance(name, str):
            name = short_repr(self.func, 200)
        return {DOMAIN_JSON_KEY: self.kind, "function": name}


def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(
            f"sample() argument 'size' must be an int; got {type(size).__name__}: "
            f"{short_repr(size)}. Fix: pass e.g. size=4."
        )
    if size < 1:
        raise ValueError(f"sample() argument 'size' must be >= 1; got size={size}. "
                         f"Fix: pass size=1 for one value.")
    return size


def _as_rng(random_state: Any) -> Any:
    """A :class:`random.Random` (or the ``random`` module: the global state) for
    :meth:`Domain.sample`'s ``random_state``."""
    if random_state is None:
        return random  # the module's functions share its global generator
    if isinstance(random_state, random.Random):
        return random_state
    if isinstance(random_state, int) and not isinstance(random_state, bool):
        return random.Random(random_state)
    # numpy, never imported here: a Generator has integers(), a RandomState randint().
    if callable(getattr(random_state, "integers", None)):
        return random.Random(int(random_state.integers(0, 2**63 - 1)))
    if callable(getattr(random_state, "randint", None)):
        return random.Random(int(random_state.randint(0, 2**31 - 1)))
    raise TypeError(
        f"sample() argument 'random_state' must be None, an int seed, a random.Random or a "
        f"numpy Generator/RandomState; got {type(random_state).__name__}: "
        f"{short_repr(random_state)}. Fix: pass e.g. random_state=0."
    )


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


# --------------------------------------------------------------------------- JSON


def encode_space(param_space: Any, encode_leaf: Callable[[Any], Any]) -> Any:
    """JSON-able description of a param space, for storing in experiment state.

    Domains become their :meth:`Domain.to_json` placeholder, grid axes stay
    ``{"grid_search": [...]}`` with encoded values, dicts and lists/tuples are
    recursed (tuples become lists), JSON scalars (str, int, float, bool, None)
    are kept, and every other leaf is replaced by ``encode_leaf(leaf)``.

    >>> from ftnb.search import uniform
    >>> encode_space({"lr": uniform(0.1, 1.0), "data": object()}, lambda v: "<object>")
    {'lr': {'__ftnb_domain__': 'uniform', 'low': 0.1, 'high': 1.0}, 'data': '<object>'}
    """
    if param_space is None:
        return None
    return _encode(param_space, encode_leaf)
