"""What ftnb's searchers over third-party optimizers share: the table of those optimizers
(:data:`LIBRARIES`: each searcher's module, the extra that installs its library, the packages),
the error a missing library raises, the checks of the arguments they all take (a seed, the
points to evaluate), the seed of each draw, and library values as plain Python.

The table is also what a restore reads: :mod:`ftnb.core.searching` rebuilds a searcher only by a
class name found here (or one of ftnb's own), and a restore whose searcher's library is missing
names the extra to install (:func:`install_hint`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional

from .domains import Categorical, encode_space
from .messages import short_repr
from .space_json import SpaceNotStoredError, decode_space

__all__ = ["LIBRARIES", "SearcherLibrary", "checked_points", "checked_seed", "encoded_space",
           "install_hint", "json_value", "library_of", "missing_library", "no_objective_error",
           "no_space_error", "plain", "step_seed"]


@dataclass(frozen=True)
class SearcherLibrary:
    """A searcher over a third-party library: ``ftnb.search.<module>.<searcher>``, installed by
    ``pip install 'ftnb[<extra>]'`` (which brings ``packages``)."""

    module: str
    searcher: str
    extra: str
    packages: tuple[str, ...]

    @property
    def class_name(self) -> str:
        """The dotted name a searcher's description carries (``"class"``)."""
        return f"{self.module}.{self.searcher}"

    @property
    def install(self) -> str:
        return f"pip install 'ftnb[{self.extra}]' (or pip install {' '.join(self.packages)})"

    def missing(self) -> ImportError:
        """The error for this searcher when its library is not installed."""
        noun = "package" if len(self.packages) == 1 else "packages"
        return ImportError(f"{self.class_name} needs the {' and '.join(self.packages)} {noun}. "
                           f"Fix: {self.install}.", name=self.packages[0])


#: ftnb's searchers over third-party libraries.
LIBRARIES = (
    SearcherLibrary("ftnb.search.optuna", "OptunaSearch", "optuna", ("optuna",)),
    SearcherLibrary("ftnb.search.hyperopt", "HyperOptSearch", "hyperopt", ("hyperopt",)),
    SearcherLibrary("ftnb.search.bayesopt", "BayesOptSearch", "bayesopt",
                    ("bayesian-optimization",)),
    SearcherLibrary("ftnb.search.nevergrad", "NevergradSearch", "nevergrad", ("nevergrad",)),
    SearcherLibrary("ftnb.search.ax", "AxSearch", "ax", ("ax-platform",)),
    SearcherLibrary("ftnb.search.bohb", "TuneBOHB", "bohb", ("hpbandster", "ConfigSpace")),
)


def library_of(class_name: Optional[str]) -> Optional[SearcherLibrary]:
    """The library of the searcher named ``class_name`` (``"ftnb.search.ax.AxSearch"``)."""
    return next((lib for lib in LIBRARIES if lib.class_name == class_name), None)


def missing_library(module: str) -> ImportError:
    """The error of the searcher module ``module`` (its ``__name__``) whose library is not
    installed: ``raise missing_library(__name__) from None``."""
    return next(lib for lib in LIBRARIES if lib.module == module).missing()


def install_hint(description: Any) -> Optional[str]:
    """``pip install ...`` for the library of the searcher a description
    (:meth:`~ftnb.search.Searcher.describe`) names, a ConcurrencyLimiter's inner one included;
    None for a searcher that needs no library."""
    while isinstance(description, dict):
        lib = library_of(description.get("class"))
        if lib is not None:
            return lib.install
        description = description.get("searcher")
    return None


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays as Python numbers and lists (JSON-able, and what
    a trainable expects in its config); tuples stay tuples.

    >>> import numpy as np  # doctest: +SKIP
    >>> plain({"x": np.float64(0.5), "c": np.str_("a")})  # doctest: +SKIP
    {'x': 0.5, 'c': 'a'}
    """
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if type(value).__module__ == "numpy":
        return plain(value.tolist()) if hasattr(value, "tolist") else value
    return value


def step_seed(seed: int, step: int) -> int:
    """The seed of a searcher's draw number ``step`` (reproducible, and a restored study draws
    anew rather than repeating its first draws); below 2**32, as numpy wants."""
    return (seed * 1_000_003 + step) % 2**32


def checked_seed(owner: str, argument: str, seed: Any) -> int:
    """``seed`` (``owner(argument=seed)``) if an int, one drawn at random if None (a searcher
    keeps it in its state: a restore draws on from it)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"{owner}({argument}={short_repr(seed)}) must be an int or None.")
    return seed if seed is not None else random.SystemRandom().getrandbits(31)


def checked_points(owner: str, points: Any) -> list[dict]:
    """``owner(points_to_evaluate=points)``, a list (or tuple) of configs, as a list of copies."""
    if points is not None and (not isinstance(points, (list, tuple))
                               or not all(isinstance(p, dict) for p in points)):
        raise TypeError(f"{owner}(points_to_evaluate={short_repr(points)}) must be a list of "
                        "dicts (configs), e.g. [{'lr': 0.01}].")
    return [dict(p) for p in points or []]


def no_space_error(owner: str, forms: str = "") -> ValueError:
    """The error of a searcher without a search space; ``forms``: the spaces of its own it takes,
    e.g. ``" (ftnb domains or a ConfigSpace)"``."""
    return ValueError(
        f"{owner} has no search space: give it space=...{forms} or use it through "
        "ftnb.TuneConfig(search_alg=...) with a param_space of ftnb domains.")


def no_objective_error(owner: str, metric: Any, mode: Any) -> ValueError:
    """The error of a searcher set up without a metric or a mode."""
    return ValueError(
        f"{owner} needs a metric and a mode (got metric={metric!r}, mode={mode!r}). Fix: "
        f"{owner}(metric='loss', mode='min') or TuneConfig(metric='loss', mode='min').")


def json_value(value: Any) -> bool:
    """Whether ``value`` is JSON as it is (dicts with string keys, lists, strings, finite numbers,
    booleans, None): what a searcher's description may hold, read back unchanged."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_value(v) for k, v in value.items())
    return False


class _NotStored(Exception):
    """A leaf of a space that a description cannot hold."""


def _refuse(leaf: Any) -> Any:
    raise _NotStored


def encoded_space(space: Any) -> Optional[Any]:
    """The JSON form of a dict of ftnb domains and JSON values, which
    :func:`~ftnb.search.space_json.decode_space` reads back as it was; None for any other
    space (a library's own expressions, an object, a tuple, a ``sample_from`` function)."""
    if not isinstance(space, dict) or _holds_tuple(space):
        return None
    try:
        encoded = encode_space(space, _refuse)
        decode_space(encoded)
    except (_NotStored, SpaceNotStoredError):
        return None
    return encoded


def _holds_tuple(value: Any) -> bool:
    if isinstance(value, tuple):
        return True
    if isinstance(value, dict):
        return any(_holds_tuple(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_tuple(v) for v in value)
    if isinstance(value, Categorical):
        return any(_holds_tuple(v) for v in value.categories)
    return False
