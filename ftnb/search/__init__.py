"""Search-space primitives and variant generation (Ray Tune-compatible names).

A *param space* is a (possibly nested) dict whose leaves are plain values,
search-space *domains* (:func:`choice`, :func:`uniform`, :func:`quniform`, :func:`loguniform`,
:func:`qloguniform`, :func:`randn`, :func:`qrandn`, :func:`randint`, :func:`qrandint`,
:func:`lograndint`, :func:`qlograndint`, :func:`sample_from`) or *grid axes*
(:func:`grid_search`).
:func:`generate_variants` turns it into a list of concrete configs::

    >>> import ftnb.search as s
    >>> space = {"opt": s.grid_search(["adam", "sgd"]), "lr": s.loguniform(1e-4, 1e-1)}
    >>> variants = s.generate_variants(space, num_samples=2, seed=0)
    >>> [v["opt"] for v in variants]
    ['adam', 'sgd', 'adam', 'sgd']

The package: :mod:`~ftnb.search.domains` (what a domain is, :class:`SampleSpec`, the JSON
form of a space), :mod:`~ftnb.search.numeric` (the numeric domains and their bounds),
:mod:`~ftnb.search.constructors` (the functions above),
:mod:`~ftnb.search.argument_checks` (their argument checks), :mod:`~ftnb.search.variants`
(compiling a space, expanding its grid, drawing its domains), :mod:`~ftnb.search.flatten`
(``"model/lr"`` keys) and :mod:`~ftnb.search.messages` (how errors name a key path). Only the
stdlib is imported here so that ``import ftnb`` stays fast.

Search algorithms (Ray Tune's ``ray.tune.search``): :class:`Searcher` (the interface),
:class:`BasicVariantGenerator` (the default), :class:`ConcurrencyLimiter`, and
``from ftnb.search.optuna import OptunaSearch`` (``pip install 'ftnb[optuna]'``), and Ray's
other searchers at Ray's paths: ``ftnb.search.hyperopt.HyperOptSearch``,
``ftnb.search.bayesopt.BayesOptSearch``, ``ftnb.search.nevergrad.NevergradSearch`` (each its
extra); see docs/search.md.
"""

from typing import Any

from .constructors import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from .domains import (
    DOMAIN_JSON_KEY,
    GRID_SEARCH_KEY,
    Categorical,
    Domain,
    SampleFrom,
    SampleSpec,
    encode_space,
    is_grid_search,
)
from .concurrency import ConcurrencyLimiter
from .flatten import flatten_dict, unflatten_dict
from .numeric import LogRandInt, LogUniform, Normal, QLogRandInt, QRandInt, RandInt, Uniform
from .searcher import BasicVariantGenerator, Searcher
from .variants import count_variants, generate_variants, validate_param_space, varying_keys


#: Searchers over optional libraries, by name: their modules import the library, so only when
#: asked for (``pip install 'ftnb[<module>]'``). Not in ``__all__`` (but OptunaSearch, as
#: before): a star import would need every library.
_OPTIONAL_SEARCHERS = {"OptunaSearch": "optuna", "HyperOptSearch": "hyperopt",
                       "BayesOptSearch": "bayesopt", "NevergradSearch": "nevergrad"}


def __getattr__(name: str) -> Any:
    if name in _OPTIONAL_SEARCHERS:
        import importlib

        return getattr(importlib.import_module(f".{_OPTIONAL_SEARCHERS[name]}", __name__), name)
    raise AttributeError(f"module 'ftnb.search' has no attribute {name!r}")


__all__ = [
    "BasicVariantGenerator",
    "ConcurrencyLimiter",
    "OptunaSearch",
    "Searcher",
    "GRID_SEARCH_KEY",
    "DOMAIN_JSON_KEY",
    "Domain",
    "Categorical",
    "Uniform",
    "LogUniform",
    "RandInt",
    "Normal",
    "QRandInt",
    "LogRandInt",
    "QLogRandInt",
    "SampleFrom",
    "SampleSpec",
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
    "is_grid_search",
    "validate_param_space",
    "generate_variants",
    "count_variants",
    "encode_space",
    "flatten_dict",
    "unflatten_dict",
    "varying_keys",
]
