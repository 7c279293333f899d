"""``NevergradSearch``: a Nevergrad optimizer as an ftnb searcher (Ray Tune's
``ray.tune.search.nevergrad.NevergradSearch``; ``pip install 'ftnb[nevergrad]'``).

The optimizer is a Nevergrad optimizer class or configured optimizer (``ng.optimizers.OnePlusOne``,
``ng.optimizers.CMA``, ...), built over the space, or an optimizer instance built over its own
parametrization. The space is a Tune space (the Tuner's ``param_space`` or ``space=``) or a
Nevergrad parametrization (``ng.p.Dict``, ``ng.p.Instrumentation``).

Its state is the values it suggested and their outcomes, as JSON: a restore builds the
optimizer afresh and tells it the same observations (:mod:`ftnb.search.observing`), so the
study goes on after a driver's death (its random generator reseeded from the searcher's seed
and the number of suggestions, so that it draws anew).

Example::

    import nevergrad as ng
    from ftnb.search import ConcurrencyLimiter
    from ftnb.search.nevergrad import NevergradSearch

    search_alg = ConcurrencyLimiter(NevergradSearch(optimizer=ng.optimizers.OnePlusOne), 4)
"""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Any, Optional, Union

from .libraries import encoded_space, missing_library, plain, step_seed

try:
    import nevergrad as ng
    from nevergrad.optimization.base import ConfiguredOptimizer, Optimizer
except ImportError:  # pragma: no cover - depends on the environment
    raise missing_library(__name__) from None

from .domains import Categorical, Domain
from .flatten import flatten_dict, unflatten_dict
from .numeric import LogRandInt, LogUniform, QLogRandInt, QRandInt, RandInt, Uniform
from .observing import ObservingSearcher, space_leaves
from .searcher import Suggestion
from .space_json import decode_space

__all__ = ["NevergradSearch", "convert_search_space", "optimizer_name"]

logger = logging.getLogger(__name__)


class NevergradSearch(ObservingSearcher):
    """A Nevergrad optimizer (Ray Tune's ``NevergradSearch``, the same arguments).

    Args:
        optimizer: a Nevergrad optimizer class or configured optimizer (built over the space
            with ``optimizer_kwargs``), or an optimizer instance (its own parametrization; then
            ``space`` is None, or a list of parameter names for an array parametrization).
        optimizer_kwargs: arguments of the optimizer class (``budget``, ``num_workers``).
        space: a dict of ftnb domains, or a Nevergrad parametrization (``ng.p.Dict``,
            ``ng.p.Instrumentation`` with keyword arguments); None: the Tuner's ``param_space``.
        metric, mode: what to optimize (default: ``TuneConfig(metric=..., mode=...)``).
        points_to_evaluate: configs to run first (by key; nested keys as ``"a/b"`` or nested
            dicts).
    """

    @staticmethod
    def convert_search_space(spec: dict) -> Any:
        """Ray's ``NevergradSearch.convert_search_space``: :func:`convert_search_space`."""
        return convert_search_space(spec)

    def __init__(self, optimizer: Any = None, optimizer_kwargs: Optional[dict] = None,
                 space: Union[dict, list, Any, None] = None, metric: Optional[str] = None,
                 mode: Optional[str] = None, points_to_evaluate: Optional[list] = None) -> None:
        super().__init__(metric, mode, points_to_evaluate, None)
        self._optimizer_kwargs = dict(optimizer_kwargs or {})
        self._given_space = space
        self._factory: Any = None
        self._template: Optional[Optimizer] = None  # an instance, as given (never told)
        self._given: Optional[Optimizer] = None
        self._names: Optional[list] = None
        self._parametrization: Any = None
        self._converted = False  # the space was a Tune space (flat "a/b" keys)
        if isinstance(optimizer, Optimizer):
            if space is not None and not isinstance(space, list):
                raise ValueError(
                    "NevergradSearch(optimizer=<an optimizer instance>, space=...): the instance "
                    "has its parametrization; space must be None or a list of parameter names. "
                    "Fix: pass the optimizer class (ng.optimizers.OnePlusOne) with space=..., "
                    "or leave space out.")
            if self._optimizer_kwargs:
                raise ValueError(
                    "NevergradSearch(optimizer=<an optimizer instance>, optimizer_kwargs=...): "
                    "the instance is built already. Fix: pass the optimizer class with "
                    "optimizer_kwargs, or leave optimizer_kwargs out.")
            self._names = list(space) if space is not None else None
            self._given = optimizer
            self._template = copy.deepcopy(optimizer)
            self._check_instance(optimizer)
        elif (inspect.isclass(optimizer) and issubclass(optimizer, Optimizer)) or isinstance(
                optimizer, ConfiguredOptimizer):
            self._factory = optimizer
            if isinstance(space, dict) and space:
                self._parametrization, self._converted = convert_search_space(space), True
            elif space is not None and not isinstance(space, dict):
                if not isinstance(space, ng.p.Parameter):
                    raise TypeError(f"NevergradSearch(space={space!r}) must be a dict of ftnb "
                                    "domains, a Nevergrad parametrization, or None.")
                self._parametrization = space
        else:
            raise ValueError(
                f"NevergradSearch(optimizer={optimizer!r}) must be a Nevergrad optimizer class "
                "or configured optimizer (ng.optimizers.OnePlusOne, ng.optimizers.CMA) or an "
                "optimizer instance.")
        self._opt: Optional[Optimizer] = None
        self._candidates: dict[str, Any] = {}

    def _check_instance(self, opt: Optimizer) -> None:
        param = opt.parametrization
        if isinstance(param, ng.p.Instrumentation):
            if param.kwargs and param.args:
                raise ValueError("NevergradSearch: an instrumented optimizer must use keyword "
                                 "arguments only.")
            if param.kwargs and self._names is not None:
                raise ValueError("NevergradSearch: an optimizer instrumented with keyword "
                                 "arguments takes space=None (the names are its keywords).")
        if self._names is not None and opt.dimension != len(self._names):
            raise ValueError(f"NevergradSearch(space={self._names!r}): {len(self._names)} names "
                             f"for an optimizer of dimension {opt.dimension}. Fix: one name "
                             "per dimension.")
        if self._names is None and not isinstance(param, (ng.p.Dict, ng.p.Instrumentation)):
            raise ValueError("NevergradSearch: an optimizer over an array needs its parameters' "
                             "names: space=['x', 'y', ...].")

    def _arguments(self) -> Optional[dict]:
        name = optimizer_name(self._factory)
        given = self._given_space  # (None, a dict of ftnb domains, or a parametrization)
        space = encoded_space(given) if isinstance(given, dict) and given else None
        if name is None or (given is not None and not isinstance(given, dict)) or (
                given and space is None):
            return None  # (an instance, a class or configuration of the user's, a parametrization)
        return {"optimizer": name, "optimizer_kwargs": self._optimizer_kwargs, "space": space}

    def _has_space(self) -> bool:
        return self._template is not None or self._parametrization is not None

    def _take_space(self, config: dict) -> None:
        self._parametrization, self._converted = convert_search_space(config), True

    def _new_optimizer(self) -> None:
        if self._template is not None:
            opt = self._given if self._given is not None else copy.deepcopy(self._template)
            self._given = None  # the instance given is used once; a restore starts a copy
        else:
            opt = self._factory(self._parametrization, **self._optimizer_kwargs)
        self._opt = opt
        self._candidates = {}

    @property
    def optimizer(self) -> Optimizer:
        """The Nevergrad optimizer."""
        self._ensure_started()
        assert self._opt is not None
        return self._opt

    # -- points --------------------------------------------------------------------------------
    def _ask(self, trial_id: str, point: Optional[dict]) -> Suggestion:
        opt = self.optimizer
        if point is not None:
            self._suggest_point(opt, point)
        candidate = opt.ask()
        self._candidates[trial_id] = candidate
        value = candidate.value
        if isinstance(opt.parametrization, ng.p.Instrumentation):
            value = [list(candidate.args), dict(candidate.kwargs)]
        return plain(value)

    def _suggest_point(self, opt: Optimizer, point: dict) -> None:
        param = opt.parametrization
        if isinstance(param, ng.p.Instrumentation):
            opt.suggest(**point)
        elif self._names is not None:
            flat = flatten_dict(point)
            opt.suggest([flat[n] for n in self._names])
        else:
            opt.suggest(flatten_dict(point) if self._converted else point)

    def _replay_ask(self, trial_id: str, point: Any) -> None:
        # Suggested then asked, as a point to evaluate is: the optimizer counts it as asked
        # (OnePlusOne would otherwise start again from the space's centre).
        opt = self.optimizer
        try:
            if isinstance(opt.parametrization, ng.p.Instrumentation):
                opt.suggest(*point[0], **point[1])
            else:
                opt.suggest(point)
            self._candidates[trial_id] = opt.ask()
        except Exception as exc:  # a value JSON changed (a tuple become a list)
            logger.warning("NevergradSearch: trial %s's point %r cannot be shown to the "
                           "restored optimizer (%s); its outcome is left out", trial_id, point,
                           exc)

    def _start(self) -> None:
        super()._start()
        self._reseed()

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self._reseed()

    def _reseed(self) -> None:
        if self._opt is not None and self.num_suggested:
            # A restored optimizer draws anew, not its first draws again.
            self._opt.parametrization.random_state.seed(
                step_seed(self._seed, self.num_suggested))

    def _config(self, point: Any) -> dict:
        if isinstance(point, list) and len(point) == 2 and isinstance(point[1], dict) and \
                self._is_instrumentation():
            args, kwargs = point
            if kwargs:
                return unflatten_dict(dict(kwargs))
            point = args[0] if len(args) == 1 else list(args)
        if self._names is not None:
            return unflatten_dict(dict(zip(self._names, point)))
        if not isinstance(point, dict):
            raise TypeError(f"NevergradSearch: the optimizer suggested {point!r}, not a dict of "
                            "parameters. Fix: an ng.p.Dict or ng.p.Instrumentation with keyword "
                            "arguments, or space=[names] for an array.")
        return unflatten_dict(dict(point)) if self._converted else dict(point)

    def _is_instrumentation(self) -> bool:
        return isinstance(self.optimizer.parametrization, ng.p.Instrumentation)

    # -- outcomes ------------------------------------------------------------------------------
    def _tell(self, trial_id: str, value: Optional[float], error: bool) -> None:
        candidate = self._candidates.pop(trial_id, None)
        if candidate is None or value is None:
            return
        try:
            self.optimizer.tell(candidate, self.metric_op() * value)
        except ng.errors.TellNotAskedNotSupportedError:  # replayed into such an optimizer
            logger.warning("NevergradSearch: %s cannot be told points it did not ask for: "
                           "the restored optimizer leaves trial %s's outcome out",
                           type(self.optimizer).__name__, trial_id)


def optimizer_name(optimizer: Any) -> Optional[str]:
    """The name of ``optimizer`` (a class or configured optimizer) in Nevergrad's registry of
    optimizers (``"OnePlusOne"``), None when it is not one of them."""
    if optimizer is None:
        return None
    return next((name for name, item in ng.optimizers.registry.items() if item is optimizer),
                None)


def from_description(data: dict) -> NevergradSearch:
    """The NevergradSearch that :meth:`NevergradSearch.describe` described: its optimizer
    found by name in Nevergrad's registry."""
    name = data.get("optimizer")
    optimizer = ng.optimizers.registry.get(name) if isinstance(name, str) else None
    if optimizer is None:
        raise ValueError(f"NevergradSearch: Nevergrad has no optimizer named {name!r} (another "
                         "version of Nevergrad?). Fix: pass the searcher again: "
                         "Tuner.restore(..., search_alg=NevergradSearch(...)).")
    space = data.get("space")
    return NevergradSearch(optimizer=optimizer, optimizer_kwargs=data.get("optimizer_kwargs"),
                           space=decode_space(space) if space else None,
                           metric=data.get("metric"), mode=data.get("mode"),
                           points_to_evaluate=data.get("points_to_evaluate") or None)


def convert_search_space(space: dict) -> Any:
    """A Nevergrad ``ng.p.Dict`` for an ftnb space (Ray's ``NevergradSearch.
    convert_search_space``), its keys the nested keys as ``"a/b"``; plain values are left out
    (they stay the config's). Quantization is dropped (with a warning, as in Ray). Raises
    ValueError for a ``grid_search`` and what Nevergrad cannot sample (``randn``,
    ``sample_from``)."""
    out = {}
    for key, value in space_leaves(space, "NevergradSearch").items():
        if isinstance(value, Domain):
            out[key] = _parameter(value, key)
    return ng.p.Dict(**out)


def _parameter(domain: Domain, key: str) -> Any:
    if getattr(domain, "q", None) not in (None, 1):
        logger.warning("NevergradSearch: param_space[%r]: Nevergrad does not quantize; "
                       "the quantization is dropped", key)
    if isinstance(domain, Uniform):
        return ng.p.Scalar(lower=domain.lower, upper=domain.upper)
    if isinstance(domain, LogUniform):
        return ng.p.Log(lower=domain.lower, upper=domain.upper)
    if isinstance(domain, (QRandInt, QLogRandInt)):  # upper inclusive
        cls = ng.p.Log if isinstance(domain, QLogRandInt) else ng.p.Scalar
        return cls(lower=domain.lower, upper=domain.upper).set_integer_casting()
    if isinstance(domain, (RandInt, LogRandInt)):  # upper exclusive
        cls = ng.p.Log if isinstance(domain, LogRandInt) else ng.p.Scalar
        return cls(lower=domain.lower, upper=domain.upper - 1).set_integer_casting()
    if isinstance(domain, Categorical):
        return ng.p.Choice(domain.categories)
    raise ValueError(f"NevergradSearch cannot sample param_space[{key!r}] = {domain!r} "
                     f"({domain.kind}). Fix: use uniform, loguniform, randint, lograndint, "
                     "qrandint or choice there.")
