"""``AxSearch``: Ax's Bayesian optimization (``AxClient``) as an ftnb searcher, Ray Tune's
``ray.tune.search.ax.AxSearch`` (``pip install 'ftnb[ax]'``).

Its state is Ax's own JSON snapshot of the client (``AxClient.to_json_snapshot``: the
experiment, its trials and data, the generation strategy and where it stands), never a pickle,
with the Ax trial index of each live ftnb trial; :mod:`ftnb.core.searching` writes it in
``searcher_state.json`` in step with the trial records, so that a restore (after a driver
SIGKILL too) builds the client again from the snapshot (``AxClient.from_json_snapshot``) and its
next suggestions continue the study (Sobol goes on where it was, the model sees every result).
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Optional, Union

from .libraries import (
    checked_points,
    encoded_space,
    json_value,
    missing_library,
    no_objective_error,
    no_space_error,
    plain,
)

try:
    from ax.exceptions.core import DataRequiredError
    from ax.exceptions.generation_strategy import MaxParallelismReachedException
    from ax.service.ax_client import AxClient, ObjectiveProperties
except ImportError:  # pragma: no cover - depends on the environment
    raise missing_library(__name__) from None

from ..config import metric_value
from .domains import Categorical, Domain, searched_domains
from .flatten import flatten_dict, unflatten_dict
from .numeric import LogRandInt, LogUniform, QLogRandInt, QRandInt, RandInt, Uniform
from .searcher import Searcher, Suggestion
from .space_json import decode_space

__all__ = ["AxSearch", "convert_search_space"]

logger = logging.getLogger(__name__)


def convert_search_space(space: dict) -> list[dict]:
    """Ax's parameter list for the domains of an ftnb space (nested keys as ``"a/b"`` names, as
    in Ray); plain values are left out (they stay the config's). Ax does not quantize: a ``q``
    is dropped with a warning, as in Ray.

    Raises ValueError for what Ax cannot search: a ``grid_search``, ``randn``, a
    ``sample_from``.
    """
    out = [_parameter(name, domain)
           for name, domain in searched_domains(space, "AxSearch").items()]
    return out


def _parameter(name: str, domain: Domain) -> dict:
    where = f"param_space[{name!r}] = {domain!r}"
    q = getattr(domain, "q", None)
    if q is not None and not (isinstance(domain, (QRandInt, QLogRandInt)) and q == 1):
        warnings.warn(f"AxSearch: {where}: Ax does not quantize; its q is dropped.",
                      UserWarning, stacklevel=4)
    if isinstance(domain, (Uniform, LogUniform)):
        return {"name": name, "type": "range", "bounds": [domain.lower, domain.upper],
                "value_type": "float", "log_scale": isinstance(domain, LogUniform)}
    if isinstance(domain, (RandInt, LogRandInt)):  # (upper exclusive, as in Ray)
        return {"name": name, "type": "range", "bounds": [domain.lower, domain.upper - 1],
                "value_type": "int", "log_scale": isinstance(domain, LogRandInt)}
    if isinstance(domain, (QRandInt, QLogRandInt)):  # (upper inclusive)
        return {"name": name, "type": "range", "bounds": [domain.lower, domain.upper],
                "value_type": "int", "log_scale": isinstance(domain, QLogRandInt)}
    if isinstance(domain, Categorical):
        return {"name": name, "type": "choice", "values": list(domain.categories)}
    raise ValueError(f"AxSearch cannot search {where} ({domain.kind}): Ax has no such "
                     "parameter. Fix: use uniform, loguniform, randint, lograndint or choice "
                     "there (or Ax's own parameter list as space=...).")


class AxSearch(Searcher):
    """Ax's ``AxClient`` as a searcher (Ray Tune's ``ray.tune.search.ax.AxSearch``).

    Args:
        space: what to search: None (the Tuner's ``param_space``: ftnb domains), a dict of
            ftnb domains, or Ax's own parameter list (``[{"name": "x", "type": "range",
            "bounds": [0.0, 1.0]}, ...]``; ``"a/b"`` names nest).
        metric, mode: what to optimize (default: ``TuneConfig(metric=..., mode=...)``, or the
            objective of ``ax_client``'s experiment).
        points_to_evaluate: configs to run first (attached to the Ax experiment).
        parameter_constraints: Ax's, e.g. ``["x1 + x2 <= 2.0"]``.
        outcome_constraints: Ax's, e.g. ``["constraint_metric <= 1.0"]`` (each metric named
            must be in the trial's last result).
        ax_client: an ``AxClient`` of your own (with or without its experiment).
        **ax_kwargs: arguments of the ``AxClient`` it makes (``random_seed``,
            ``generation_strategy``, ``verbose_logging`` (False by default), ...).

    A trial's last result is told to Ax when it ends (its metric and the outcome constraints'
    metrics); a NaN or infinite value abandons the Ax trial, an ERRORED trial without a result
    is logged as failed. Example::

        from ftnb.search.ax import AxSearch

        ftnb.Tuner(train, param_space={"x": ftnb.uniform(0, 1), "y": ftnb.uniform(0, 1)},
                   tune_config=ftnb.TuneConfig(
                       metric="loss", mode="min", num_samples=20,
                       search_alg=AxSearch(parameter_constraints=["x + y <= 1.5"])))
    """

    #: Ray's static method: the library's space for an ftnb space.
    convert_search_space = staticmethod(convert_search_space)

    def __init__(self, space: Union[None, dict, list] = None, metric: Optional[str] = None,
                 mode: Optional[str] = None, points_to_evaluate: Optional[list] = None,
                 parameter_constraints: Optional[list] = None,
                 outcome_constraints: Optional[list] = None,
                 ax_client: Optional[AxClient] = None, **ax_kwargs: Any) -> None:
        super().__init__(metric=metric, mode=mode)
        if space is not None and not isinstance(space, (dict, list)):
            raise TypeError(f"AxSearch(space={space!r}) must be a dict of ftnb domains, Ax's "
                            "parameter list, or None (the Tuner's param_space).")
        if ax_client is not None and not isinstance(ax_client, AxClient):
            raise TypeError(f"AxSearch(ax_client={ax_client!r}) must be an "
                            "ax.service.ax_client.AxClient.")
        for name, value in (("parameter_constraints", parameter_constraints),
                            ("outcome_constraints", outcome_constraints)):
            if value is not None and not (isinstance(value, list)
                                          and all(isinstance(v, str) for v in value)):
                raise TypeError(f"AxSearch({name}={value!r}) must be a list of Ax's constraint "
                                "strings, e.g. ['x + y <= 1.0'].")
        self._given_space = space
        self._space: Optional[list] = None
        if isinstance(space, dict) and space:
            self._space = convert_search_space(space)
        elif isinstance(space, list) and space:
            self._space = [dict(p) for p in space]
        self._parameter_constraints = parameter_constraints
        self._outcome_constraints = outcome_constraints
        self._ax_kwargs = {"verbose_logging": False, **ax_kwargs}
        self._given_client = ax_client is not None
        self._ax: Optional[AxClient] = ax_client
        self._given_points = checked_points("AxSearch", points_to_evaluate)
        self._points = [flatten_dict(p) for p in self._given_points]
        self._live: dict[str, int] = {}  # ftnb trial id -> Ax trial index

    # -- set-up --------------------------------------------------------------------------------
    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        if self._has_experiment():
            self._take_objective()
            return False
        super().set_search_properties(metric, mode, config)
        if self._space is not None:
            self._setup()
            return False
        self._space = convert_search_space(config)
        self._setup()
        return True

    def _has_experiment(self) -> bool:
        if self._ax is None:
            return False
        try:
            self._ax.experiment
        except (ValueError, AttributeError, AssertionError):
            return False
        return True

    def _take_objective(self) -> None:
        """metric and mode from the Ax experiment's objective."""
        objective = self._ax.experiment.optimization_config.objective  # type: ignore[union-attr]
        self._metric = objective.metric_names[0]
        self._mode = "min" if objective.minimize else "max"

    def _setup(self) -> AxClient:
        """The client, its experiment created when it has none yet."""
        if self._has_experiment():
            self._take_objective()
            return self._ax  # type: ignore[return-value]
        if not self._space:
            raise no_space_error("AxSearch", " (ftnb domains or Ax's parameter list), an "
                                 "ax_client with an experiment,")
        if not self._metric or not self._mode:
            raise no_objective_error("AxSearch", self._metric, self._mode)
        if self._ax is None:
            self._ax = AxClient(**self._ax_kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Ax's notes on how it reads choice parameters)
            self._ax.create_experiment(
                parameters=self._space,
                objectives={self._metric: ObjectiveProperties(minimize=self._mode != "max")},
                parameter_constraints=self._parameter_constraints,
                outcome_constraints=self._outcome_constraints)
        return self._ax

    @property
    def ax_client(self) -> AxClient:
        """The ``AxClient`` (its experiment created on first use)."""
        return self._setup()

    # -- searching -----------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> Suggestion:
        client = self._setup()
        index = self._live.get(trial_id)
        if index is not None:  # asked again for the same trial: the same config
            parameters = client.experiment.trials[index].arm.parameters
        elif self._points:
            parameters, index = client.attach_trial(self._points[0])
            self._points.pop(0)
        else:
            try:
                parameters, index = client.get_next_trial()
            except (MaxParallelismReachedException, DataRequiredError):
                return None  # (it waits for results: asked again when a trial ends)
        self._live[trial_id] = index
        return unflatten_dict(plain(parameters))

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        index = self._live.pop(trial_id, None)
        if index is None:
            return
        client = self._setup()
        if not result:
            client.log_trial_failure(trial_index=index)
            return
        config = client.experiment.optimization_config
        names = [self._metric] + sorted(set(config.metric_names) - {self._metric})
        data = {}
        for name in names:
            value = metric_value(result, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value)):
                reason = f"{name}={value!r} in the last result of trial {trial_id}"
                logger.warning("AxSearch: %s: the Ax trial is abandoned", reason)
                client.abandon_trial(trial_index=index, reason=reason)
                return
            data[name] = (float(value), None)
        client.complete_trial(trial_index=index, raw_data=data)

    def end_search(self, recorded: set) -> None:
        """Abandon the Ax trials suggested for trial ids that never became ftnb trials."""
        for trial_id in [t for t in self._live if t not in recorded]:
            self._setup().abandon_trial(trial_index=self._live.pop(trial_id),
                                        reason="suggested, never run")

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        snapshot = self._ax.to_json_snapshot() if self._has_experiment() else None
        return {"ax_snapshot": snapshot, "live": dict(self._live), "points": self._points}

    def set_state(self, state: dict) -> None:
        snapshot = state.get("ax_snapshot")
        if snapshot is not None:
            verbose = self._ax_kwargs.get("verbose_logging", False)
            self._ax = AxClient.from_json_snapshot(snapshot, verbose_logging=verbose)
            self._take_objective()
        self._live = {k: int(v) for k, v in (state.get("live") or {}).items()}
        self._points = [dict(p) for p in state.get("points") or []]

    def describe(self) -> Optional[dict]:
        space: Any = self._given_space  # (None, or Ax's parameter list)
        if isinstance(space, dict):
            encoded = encoded_space(space)
            if space and encoded is None:
                return None  # (objects in the space: given again at a restore)
            space = {"ftnb": encoded} if space else None
        description = {"class": "ftnb.search.ax.AxSearch", "space": space,
                       "metric": self._metric, "mode": self._mode,
                       "points_to_evaluate": self._given_points,
                       "parameter_constraints": self._parameter_constraints,
                       "outcome_constraints": self._outcome_constraints, **self._ax_kwargs}
        if self._given_client or not json_value(description):
            return None  # (an object: a client, a generation strategy; given again at a restore)
        return description

    def __repr__(self) -> str:
        return f"AxSearch(metric={self._metric!r}, mode={self._mode!r})"


def from_description(data: dict) -> AxSearch:
    """The AxSearch that :meth:`AxSearch.describe` described."""
    arguments = {k: v for k, v in data.items() if k != "class"}
    space = arguments.pop("space", None)
    if isinstance(space, dict):
        space = decode_space(space["ftnb"])
    return AxSearch(space=space, **arguments)
