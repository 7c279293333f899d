"""``TuneBOHB``: BOHB's model-based sampling (hpbandster's kernel density estimators over a
ConfigSpace), Ray Tune's ``ray.tune.search.bohb.TuneBOHB``, with
:class:`ftnb.schedulers.hb_bohb.HyperBandForBOHB` (``pip install 'ftnb[bohb]'``).

BOHB learns from the results each trial reports at its HyperBand bracket's milestones (the
budget: the milestone's ``time_attr``), as Ray's does. Its state is plain JSON, never a pickle
(``searcher_state.json``, kept by :mod:`ftnb.core.searching` in step with the trial records):
the configs of its live trials, every observation (config, budget, loss) and how many configs it
drew; a restore builds hpbandster's model again from the observations. Each draw is seeded by
the seed and the number of draws so far (numpy's global generator is set for the draw and put
back after it): a restore draws what the dead driver would have drawn next, never its first
configs again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from typing import Any, Iterator, Optional, Union

from .libraries import (
    checked_points,
    checked_seed,
    encoded_space,
    json_value,
    missing_library,
    no_objective_error,
    no_space_error,
    plain,
    step_seed,
)

try:
    import ConfigSpace
    import numpy as np
    from hpbandster.optimizers.config_generators.bohb import BOHB as _BOHBGenerator
except ImportError:  # pragma: no cover - depends on the environment
    raise missing_library(__name__) from None

from ..config import metric_value
from .domains import Categorical, Domain, searched_domains
from .flatten import flatten_dict, unflatten_dict
from .numeric import LogRandInt, LogUniform, QLogRandInt, QRandInt, RandInt, Uniform
from .searcher import Searcher, Suggestion
from .space_json import decode_space

__all__ = ["TuneBOHB", "convert_search_space"]

logger = logging.getLogger(__name__)


def convert_search_space(space: dict) -> "ConfigSpace.ConfigurationSpace":
    """A ConfigSpace for the domains of an ftnb space (nested keys as ``"a/b"`` names, as in
    Ray); plain values are left out (they stay the config's). Quantized domains are searched
    unquantized and rounded when suggested (ConfigSpace 1.x has no ``q``).

    Raises ValueError for what BOHB cannot search: a ``grid_search``, ``randn``, a
    ``sample_from``.
    """
    cs = ConfigSpace.ConfigurationSpace()
    for name, domain in searched_domains(space, "TuneBOHB").items():
        cs.add(_hyperparameter(name, domain))
    return cs


def _hyperparameter(name: str, domain: Domain) -> Any:
    where = f"param_space[{name!r}] = {domain!r}"
    if isinstance(domain, (Uniform, LogUniform)):
        lower, upper = domain.lower, domain.upper
        if domain.q is not None:
            lower = math.ceil(lower / domain.q) * domain.q
            upper = math.floor(upper / domain.q) * domain.q
        return ConfigSpace.UniformFloatHyperparameter(
            name, lower=lower, upper=upper, log=isinstance(domain, LogUniform))
    if isinstance(domain, (RandInt, LogRandInt)):  # (upper exclusive, as in Ray)
        return ConfigSpace.UniformIntegerHyperparameter(
            name, lower=domain.lower, upper=domain.upper - 1, log=isinstance(domain, LogRandInt))
    if isinstance(domain, (QRandInt, QLogRandInt)):  # (upper inclusive)
        return ConfigSpace.UniformIntegerHyperparameter(
            name, lower=domain.lower, upper=domain.upper, log=isinstance(domain, QLogRandInt))
    if isinstance(domain, Categorical):
        return ConfigSpace.CategoricalHyperparameter(name, choices=list(domain.categories))
    raise ValueError(f"TuneBOHB cannot search {where} ({domain.kind}): ConfigSpace has no such "
                     "uniform domain. Fix: use uniform, loguniform, quniform, randint, qrandint, "
                     "lograndint or choice there (or a ConfigSpace of your own).")


def _quanta(space: Any) -> dict:
    """``{name: q}`` of the quantized domains of an ftnb space (rounded when suggested)."""
    if not isinstance(space, dict):
        return {}
    return {name: domain.q for name, domain in searched_domains(space, "TuneBOHB").items()
            if getattr(domain, "q", None) is not None}


def _quantized(value: Any, q: float, hyperparameter: Any) -> Any:
    """``value`` rounded to a multiple of ``q`` within ``hyperparameter``'s bounds."""
    first = math.ceil(hyperparameter.lower / q)
    last = math.floor(hyperparameter.upper / q)
    multiple = min(max(round(value / q), first), last) * q
    return int(multiple) if isinstance(value, int) else round(multiple, 12)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences what statsmodels and pandas say of hpbandster's use of them (a KDE of a
    category seen once divides by zero; deprecations): not the user's to act on."""
    with warnings.catch_warnings():
        for category in (RuntimeWarning, FutureWarning, DeprecationWarning):
            warnings.simplefilter("ignore", category)
        yield


class _Job:
    """What hpbandster's ``new_result`` reads of a finished evaluation (Ray's wrapper)."""

    def __init__(self, loss: Optional[float], budget: float, config: dict) -> None:
        self.result = None if loss is None else {"loss": loss}
        self.kwargs = {"budget": budget, "config": dict(config)}
        self.exception = None


class TuneBOHB(Searcher):
    """BOHB's sampler as a searcher (Ray Tune's ``ray.tune.search.bohb.TuneBOHB``); use it
    with :class:`ftnb.schedulers.hb_bohb.HyperBandForBOHB`.

    Args:
        space: what to search: None (the Tuner's ``param_space``: ftnb domains), a dict of ftnb
            domains (``"a/b"`` names for nested keys) or a ``ConfigSpace.ConfigurationSpace``.
        bohb_config: keyword arguments of hpbandster's BOHB config generator
            (``min_points_in_model``, ``top_n_percent``, ``num_samples``, ``random_fraction``,
            ``bandwidth_factor``, ``min_bandwidth``).
        metric, mode: what to optimize (default: ``TuneConfig(metric=..., mode=...)``).
        points_to_evaluate: configs (whole or partial) to run first.
        seed: the seed of its draws (None: one drawn at random, kept in its state).
        max_concurrent: at most this many of its trials *run* at once (0: no limit); trials
            that HyperBandForBOHB paused do not count, as in Ray. A
            :class:`~ftnb.search.ConcurrencyLimiter` around it sets it.

    Example::

        from ftnb.schedulers.hb_bohb import HyperBandForBOHB
        from ftnb.search.bohb import TuneBOHB

        ftnb.Tuner(train, param_space={"lr": ftnb.loguniform(1e-4, 1e-1)},
                   tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=20,
                                               search_alg=TuneBOHB(seed=0),
                                               scheduler=HyperBandForBOHB(max_t=9)))

    Without HyperBandForBOHB it learns from each trial's last result (its budget: the
    trial's ``training_iteration``); Ray's learns nothing then.
    """

    #: Ray's static method: the library's space for an ftnb space.
    convert_search_space = staticmethod(convert_search_space)

    def __init__(self, space: Union[None, dict, "ConfigSpace.ConfigurationSpace"] = None,
                 bohb_config: Optional[dict] = None, metric: Optional[str] = None,
                 mode: Optional[str] = None, points_to_evaluate: Optional[list] = None,
                 seed: Optional[int] = None, max_concurrent: int = 0) -> None:
        super().__init__(metric=metric, mode=mode)
        if space is not None and not isinstance(space, (dict, ConfigSpace.ConfigurationSpace)):
            raise TypeError(f"TuneBOHB(space={space!r}) must be a dict of ftnb domains, a "
                            "ConfigSpace.ConfigurationSpace, or None (the Tuner's param_space).")
        if bohb_config is not None and not isinstance(bohb_config, dict):
            raise TypeError(f"TuneBOHB(bohb_config={bohb_config!r}) must be a dict of BOHB's "
                            "keyword arguments, e.g. {'min_points_in_model': 4}.")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or (
                max_concurrent < 0):
            raise ValueError(f"TuneBOHB(max_concurrent={max_concurrent!r}) must be a whole "
                             "number >= 0 (0: no limit).")
        self._given_space = space
        self._cs: Optional[ConfigSpace.ConfigurationSpace] = None
        self._quanta: dict = {}
        if isinstance(space, ConfigSpace.ConfigurationSpace):
            self._cs = space
        elif isinstance(space, dict) and space:
            self._cs, self._quanta = convert_search_space(space), _quanta(space)
        self._bohb_config = dict(bohb_config or {})
        self._given_points = checked_points("TuneBOHB", points_to_evaluate)
        self._points = [flatten_dict(p) for p in self._given_points]
        self._given_seed = seed
        self._seed = checked_seed("TuneBOHB", "seed", seed)
        self._max_concurrent = max_concurrent
        self._made = 0  # configs drawn so far
        self._configs: dict[str, dict] = {}  # live trial id -> its config (flat names)
        self._observations: list[list] = []  # [config, budget, loss or None], in order
        self._generator: Optional[Any] = None
        self._scheduler: Any = None

    # -- set-up --------------------------------------------------------------------------------
    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        super().set_search_properties(metric, mode, config)
        if self._given_space is not None and (
                not isinstance(self._given_space, dict) or self._given_space):
            self._check_ready()
            return False
        self._cs, self._quanta = convert_search_space(config), _quanta(config)
        self._generator = None
        self._check_ready()
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self._max_concurrent = max_concurrent
        return True  # (it counts running trials only: paused ones make room, as in Ray)

    def set_scheduler(self, scheduler: Any) -> None:
        from ..schedulers.hb_bohb import HyperBandForBOHB

        # (ResourceChangingScheduler(HyperBandForBOHB(...)): the one it wraps.)
        wrapped = getattr(scheduler, "base_scheduler", scheduler)
        self._scheduler = wrapped if isinstance(wrapped, HyperBandForBOHB) else None
        if self._scheduler is None:
            warnings.warn(
                f"TuneBOHB works with the scheduler HyperBandForBOHB (got {scheduler!r}): it "
                "learns only from each trial's last result here. Fix: TuneConfig(scheduler="
                "ftnb.schedulers.hb_bohb.HyperBandForBOHB(max_t=...)).", UserWarning,
                stacklevel=2)

    def _check_ready(self) -> None:
        if self._cs is None or not list(self._cs.keys()):
            raise no_space_error("TuneBOHB", " (ftnb domains or a ConfigSpace."
                                 "ConfigurationSpace)")
        if not self._metric or not self._mode:
            raise no_objective_error("TuneBOHB", self._metric, self._mode)

    def _model(self) -> Any:
        """hpbandster's config generator, built (again) from every observation so far."""
        if self._generator is None:
            self._check_ready()
            with _quiet():
                generator = _BOHBGenerator(configspace=self._cs, **self._bohb_config)
                for config, budget, loss in self._observations:
                    generator.new_result(_Job(loss, budget, config))
            self._generator = generator
        return self._generator

    # -- searching -----------------------------------------------------------------------------
    def _running(self) -> int:
        paused = self._scheduler.paused_trials() if self._scheduler is not None else set()
        return sum(1 for trial_id in self._configs if trial_id not in paused)

    def suggest(self, trial_id: str) -> Suggestion:
        if trial_id in self._configs:  # asked again for the same trial: the same config
            return unflatten_dict(dict(self._configs[trial_id]))
        if self._max_concurrent and self._running() >= self._max_concurrent:
            return None
        model = self._model()
        draw = self._seeded(model)
        if self._points:
            point = self._points[0]
            unknown = sorted(set(point) - set(draw) - set(self._cs.keys()))  # type: ignore
            if unknown:
                raise ValueError(
                    f"TuneBOHB(points_to_evaluate=...): a point sets {unknown}, which the search "
                    f"space does not have (it has {sorted(self._cs.keys())}). Fix: name the "  # type: ignore
                    "space's keys (nested keys as in the space).")
            config = {**draw, **self._points.pop(0)}
        else:
            config = draw
        self._made += 1
        self._configs[trial_id] = config
        return unflatten_dict(dict(config))

    def _seeded(self, model: Any) -> dict:
        """A config from BOHB's model, drawn with a seed of its own (seed, draws so far)."""
        seed = step_seed(self._seed, self._made)
        self._cs.seed(seed)  # type: ignore[union-attr]
        saved = np.random.get_state()
        np.random.seed(seed)
        try:
            with _quiet():
                config, _ = model.get_config(None)  # (hpbandster ignores the budget)
        finally:
            np.random.set_state(saved)
        config = plain(config)
        for name, q in self._quanta.items():
            if name in config:
                config[name] = _quantized(config[name], q, self._cs[name])  # type: ignore
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self._scheduler is None or trial_id not in self._configs:
            return
        budget = self._scheduler.budget_of(trial_id, result)
        if budget is not None:
            self._observe(self._configs[trial_id], budget, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        config = self._configs.pop(trial_id, None)
        if config is None or self._scheduler is not None or not result:
            return
        budget = result.get("training_iteration")
        if isinstance(budget, (int, float)) and not isinstance(budget, bool):
            self._observe(config, budget, result)

    def _observe(self, config: dict, budget: float, result: dict) -> None:
        value = metric_value(result, self._metric) if self._metric else None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
            value)
        loss = (value if self._mode == "min" else -value) if ok else None
        self._observations.append([dict(config), budget, loss])
        with _quiet():
            self._model().new_result(_Job(loss, budget, config))

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {"seed": self._seed, "made": self._made, "points": self._points,
                "configs": self._configs, "observations": self._observations}

    def set_state(self, state: dict) -> None:
        self._seed = int(state.get("seed", self._seed))
        self._made = int(state.get("made", 0))
        self._points = [dict(p) for p in state.get("points") or []]
        self._configs = {k: dict(v) for k, v in (state.get("configs") or {}).items()}
        self._observations = [list(o) for o in state.get("observations") or []]
        self._generator = None  # built again from the observations when next used

    def describe(self) -> Optional[dict]:
        space: Any = None
        if isinstance(self._given_space, ConfigSpace.ConfigurationSpace):
            space = {"configspace": self._given_space.to_serialized_dict()}
        elif self._given_space:
            space = {"ftnb": encoded_space(self._given_space)}
            if space["ftnb"] is None:
                return None  # (objects in the space: given again at a restore)
        description = {"class": "ftnb.search.bohb.TuneBOHB", "space": space,
                       "bohb_config": self._bohb_config, "metric": self._metric,
                       "mode": self._mode, "points_to_evaluate": self._given_points,
                       "seed": self._given_seed, "max_concurrent": self._max_concurrent}
        return description if json_value(description) else None

    def __repr__(self) -> str:
        return f"TuneBOHB(metric={self._metric!r}, mode={self._mode!r})"


def from_description(data: dict) -> TuneBOHB:
    """The TuneBOHB that :meth:`TuneBOHB.describe` described."""
    stored = data.get("space") or {}
    space: Any = None
    if "configspace" in stored:
        space = ConfigSpace.ConfigurationSpace.from_serialized_dict(stored["configspace"])
    elif "ftnb" in stored:
        space = decode_space(stored["ftnb"])
    return TuneBOHB(space=space, bohb_config=data.get("bohb_config"), metric=data.get("metric"),
                    mode=data.get("mode"), points_to_evaluate=data.get("points_to_evaluate"),
                    seed=data.get("seed"), max_concurrent=data.get("max_concurrent") or 0)
