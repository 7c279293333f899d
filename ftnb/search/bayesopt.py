"""``BayesOptSearch``: Bayesian optimization with a Gaussian process (the ``bayesian-optimization``
package) as an ftnb searcher (Ray Tune's ``ray.tune.search.bayesopt.BayesOptSearch``;
``pip install 'ftnb[bayesopt]'``).

It searches continuous parameters: ``(low, high)`` bounds, or ftnb's ``uniform`` and
``loguniform`` domains (searched as uniform within their bounds, as Ray does). Its state is the
points it suggested and their outcomes, as JSON: a restore shows a fresh optimizer the same
observations (:mod:`ftnb.search.observing`), so the study goes on after a driver's death. Each
suggestion fits the Gaussian process to the observations so far (as ``bayes_opt`` does at
every ``suggest``) with a draw seeded by ``random_state`` and the number of draws so far.

Example::

    from ftnb.search.bayesopt import BayesOptSearch

    search_alg = BayesOptSearch(utility_kwargs={"kind": "ucb", "kappa": 2.5, "xi": 0.0},
                                random_search_steps=4)
    ftnb.Tuner(train, param_space={"width": ftnb.uniform(0, 20), "height": ftnb.uniform(-100, 100)},
               tune_config=ftnb.TuneConfig(metric="mean_loss", mode="min", search_alg=search_alg,
                                           num_samples=20)).fit()
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Optional

from .libraries import missing_library, plain, step_seed

try:
    from bayes_opt import BayesianOptimization, UtilityFunction
except ImportError:  # pragma: no cover - depends on the environment
    raise missing_library(__name__) from None

from .domains import Domain
from .flatten import flatten_dict, unflatten_dict
from .numeric import LogUniform, Uniform
from .observing import ObservingSearcher, space_leaves
from .searcher import Searcher, Suggestion

__all__ = ["BayesOptSearch", "convert_search_space"]

#: Draws in a row that may all be duplicates before it answers "not now" (no ``patience``).
_MAX_REDRAWS = 10


class BayesOptSearch(ObservingSearcher):
    """Bayesian optimization (Ray Tune's ``BayesOptSearch``, the same arguments).

    Args:
        space: ``{"name": (low, high)}`` (nested keys as ``"a/b"``) or a dict of ftnb
            ``uniform``/``loguniform`` domains; None: the Tuner's ``param_space``.
        metric, mode: what to optimize (default: ``TuneConfig(metric=..., mode=...)``).
        points_to_evaluate: configs to run first (every parameter set).
        utility_kwargs: the acquisition function, ``bayes_opt.UtilityFunction``'s arguments
            (default ``{"kind": "ucb", "kappa": 2.576, "xi": 0.0}``).
        random_state: the seed of its draws.
        random_search_steps: random points to run, and wait for, before the Gaussian process
            is fitted to their results together.
        verbose: ``bayes_opt``'s verbosity.
        patience: end the search (:attr:`Searcher.FINISHED`) once one config was drawn more
            than this many times (None: never).
        skip_duplicate: draw again rather than suggest a config twice.
    """

    @staticmethod
    def convert_search_space(spec: dict) -> Any:
        """Ray's ``BayesOptSearch.convert_search_space``: :func:`convert_search_space`."""
        return convert_search_space(spec)

    def __init__(self, space: Optional[dict] = None, metric: Optional[str] = None,
                 mode: Optional[str] = None, points_to_evaluate: Optional[list] = None,
                 utility_kwargs: Optional[dict] = None, random_state: int = 42,
                 random_search_steps: int = 10, verbose: int = 0, patience: Optional[int] = 5,
                 skip_duplicate: bool = True, analysis: Any = None) -> None:
        super().__init__(metric, mode, points_to_evaluate, random_state, "random_state")
        if analysis is not None:
            raise ValueError("BayesOptSearch(analysis=...) is not supported by ftnb: give the "
                             "earlier results as points_to_evaluate, or restore the experiment "
                             "that produced them (Tuner.restore).")
        if space is not None and not isinstance(space, dict):
            raise TypeError(f"BayesOptSearch(space={space!r}) must be a dict of (low, high) "
                            "bounds or ftnb domains, or None.")
        if utility_kwargs is None:
            utility_kwargs = {"kind": "ucb", "kappa": 2.576, "xi": 0.0}
        try:
            self._utility = UtilityFunction(**utility_kwargs)
        except (TypeError, NotImplementedError) as exc:
            raise ValueError(f"BayesOptSearch(utility_kwargs={utility_kwargs!r}): {exc}. Fix: "
                             "e.g. {'kind': 'ucb', 'kappa': 2.576, 'xi': 0.0} ('ucb', 'ei' "
                             "or 'poi').") from None
        if isinstance(random_search_steps, bool) or not isinstance(random_search_steps, int) \
                or random_search_steps < 0:
            raise ValueError(f"BayesOptSearch(random_search_steps={random_search_steps!r}) must "
                             "be a whole number >= 0.")
        self._given_space = space
        self._utility_kwargs = dict(utility_kwargs)
        self._random_search_steps = random_search_steps
        self._verbose = verbose
        self._patience = patience
        self._skip_duplicate = skip_duplicate
        self._bounds: Optional[dict] = convert_search_space(space) if space else None
        self._registered: list[tuple[dict, float]] = []  # what the Gaussian process is fitted to
        self._buffered: list[tuple[dict, float]] = []  # random search results, held back
        self._counts: dict[str, int] = {}  # times each config was drawn
        self._drawn_by: dict[str, str] = {}  # each config's first trial
        self._draws = 0  # optimizer draws so far (skipped duplicates included)
        self._random_made = 0  # random-search points suggested

    def _has_space(self) -> bool:
        return self._bounds is not None

    def _take_space(self, config: dict) -> None:
        self._bounds = convert_search_space(config)

    def _new_optimizer(self) -> None:
        self._registered, self._buffered, self._counts = [], [], {}
        self._drawn_by = {}

    def optimizer(self, seed: Optional[int] = None) -> BayesianOptimization:
        """A ``BayesianOptimization`` shown every result registered so far."""
        self._ensure_started()
        opt = BayesianOptimization(f=None, pbounds=self._bounds, verbose=self._verbose,
                                   random_state=self._seed if seed is None else seed,
                                   allow_duplicate_points=True)
        for params, target in self._registered:
            opt.register(params=params, target=target)
        return opt

    # -- points --------------------------------------------------------------------------------
    def _ask(self, trial_id: str, point: Optional[dict]) -> Suggestion:
        random_phase = len(self._buffered) < self._random_search_steps
        if random_phase and point is None and self._random_made >= self._random_search_steps \
                and self._random_live():
            return None  # wait for the random points' results
        for _ in range(_MAX_REDRAWS):
            params = self._params_of(point) if point is not None else self._draw()
            key = _key(params)
            seen = key in self._counts
            if seen and point is None and self._skip_duplicate and not self._log.was_told(
                    self._drawn_by[key]):
                # The Gaussian process does not know of running trials: it draws a running
                # one again until its result is in. Wait for it (Ray counts it towards
                # patience, and ends the search while the trial runs).
                return None
            self._counts[key] = self._counts.get(key, 0) + 1
            if self._patience is not None and self._counts[key] > self._patience:
                return Searcher.FINISHED
            if not (seen and self._skip_duplicate) or point is not None:
                break
        else:
            return None
        if random_phase:
            self._random_made += 1
        self._drawn_by.setdefault(key, trial_id)
        return params

    def _random_live(self) -> bool:
        """Whether a point it suggested has no outcome yet."""
        return any(not self._log.was_told(t) for t in self._log.asked)

    def _draw(self) -> dict:
        opt = self.optimizer(step_seed(self._seed, self._draws))
        self._draws += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {k: float(v) for k, v in plain(opt.suggest(self._utility)).items()}

    def _params_of(self, point: dict) -> dict:
        flat = flatten_dict(point)
        assert self._bounds is not None
        if set(flat) != set(self._bounds) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat.values()):
            raise ValueError(
                f"BayesOptSearch(points_to_evaluate=...): {point!r} must give a number for each "
                f"parameter of the space, {sorted(self._bounds)}, and nothing else.")
        return {k: float(v) for k, v in flat.items()}

    def _replay_ask(self, trial_id: str, point: Any) -> None:
        key = _key(point)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._drawn_by.setdefault(key, trial_id)

    def _config(self, point: Any) -> dict:
        return unflatten_dict(dict(point))

    # -- outcomes ------------------------------------------------------------------------------
    def _tell(self, trial_id: str, value: Optional[float], error: bool) -> None:
        if value is None:
            return
        params = dict(self._log.asked[trial_id])
        target = -self.metric_op() * value  # bayes_opt maximizes
        if len(self._buffered) >= self._random_search_steps:
            self._registered.append((params, target))
            return
        self._buffered.append((params, target))
        if len(self._buffered) == self._random_search_steps:
            self._registered.extend(self._buffered)

    def _arguments(self) -> Optional[dict]:
        # A space given is stored as the bounds it searches: ``(low, high)`` or a domain's.
        bounds = {k: list(v) for k, v in self._bounds.items()} if (
            self._given_space and self._bounds is not None) else None
        return {"space": bounds, "utility_kwargs": self._utility_kwargs,
                "random_state": self._seed, "random_search_steps": self._random_search_steps,
                "verbose": self._verbose, "patience": self._patience,
                "skip_duplicate": self._skip_duplicate}

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {**super().get_state(), "draws": self._draws, "random_made": self._random_made}

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self._draws = int(state.get("draws", self._draws))
        self._random_made = int(state.get("random_made", self._random_made))


def from_description(data: dict) -> BayesOptSearch:
    """The BayesOptSearch that :meth:`BayesOptSearch.describe` described."""
    bounds = data.get("space")
    return BayesOptSearch(
        space={k: (float(low), float(high)) for k, (low, high) in bounds.items()} if bounds
        else None, metric=data.get("metric"), mode=data.get("mode"),
        points_to_evaluate=data.get("points_to_evaluate") or None,
        utility_kwargs=data.get("utility_kwargs"), random_state=data.get("random_state", 42),
        random_search_steps=data.get("random_search_steps", 10),
        verbose=data.get("verbose", 0), patience=data.get("patience", 5),
        skip_duplicate=data.get("skip_duplicate", True))


def _key(params: dict) -> str:
    return json.dumps(sorted(params.items()))


def convert_search_space(space: dict) -> dict:
    """``bayes_opt``'s bounds for an ftnb space (Ray's ``BayesOptSearch.convert_search_space``):
    ``{"a/b": (low, high)}``. ``(low, high)`` pairs are taken as they are; a ``loguniform`` is
    searched uniformly within its bounds (with a warning, as in Ray); plain values are left out.
    Raises ValueError for a ``grid_search`` and for integers and choices, which a Gaussian
    process over real numbers cannot search."""
    out: dict[str, tuple] = {}
    for key, value in space_leaves(space, "BayesOptSearch").items():
        if isinstance(value, tuple) and len(value) == 2:
            out[key] = (float(value[0]), float(value[1]))
        elif isinstance(value, (Uniform, LogUniform)):
            if isinstance(value, LogUniform) or value.q is not None:
                warnings.warn(f"BayesOptSearch: param_space[{key!r}] = {value!r} is searched "
                              "uniformly between its bounds (BayesOpt has no log scale or "
                              "quantization).", UserWarning, stacklevel=3)
            out[key] = (float(value.lower), float(value.upper))
        elif isinstance(value, Domain):
            raise ValueError(f"BayesOptSearch cannot search param_space[{key!r}] = {value!r} "
                             f"({value.kind}): a Gaussian process over real numbers searches "
                             "only uniform(low, high) and loguniform(low, high). Fix: one of "
                             "those, or another searcher (HyperOptSearch, OptunaSearch).")
    return out
