"""Searchers over a third-party optimizer whose state is what it observed: the base of
:class:`~ftnb.search.hyperopt.HyperOptSearch`, :class:`~ftnb.search.bayesopt.BayesOptSearch` and
:class:`~ftnb.search.nevergrad.NevergradSearch`.

Why observations and not the optimizer: HyperOpt's ``Trials``, a ``BayesianOptimization`` and a
Nevergrad optimizer hold numpy arrays, closures and random generators; storing them would mean a
pickle, and nothing read from an experiment's folder may name code to run. What they learned is
a function of what they were shown, so the state (:meth:`ObservingSearcher.get_state`) is plain
JSON: each point the optimizer suggested, in the optimizer's own terms (HyperOpt's ``vals``,
BayesOpt's parameters, Nevergrad's value), by trial id in the order suggested, and each outcome
(the metric's value, or an error) in the order told. A restore (:meth:`ObservingSearcher.
set_state`, called after the searcher was set up) builds a fresh optimizer and replays them:
the points asked, then the outcomes told, as the first run did. What the optimizer draws next
is seeded by the searcher's seed and the number of suggestions so far
(:func:`~ftnb.search.libraries.step_seed`), so a restored study goes on with new points,
never the first ones again.

The rules of :mod:`ftnb.core.searching` hold with it: ``suggest`` is idempotent by trial id (a
trial id asked again gets its point again), and an outcome told twice is told once.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from ..config import metric_value
from .domains import is_grid_search
from .libraries import (
    checked_points,
    checked_seed,
    json_value,
    library_of,
    no_objective_error,
    no_space_error,
)
from .searcher import Searcher, Suggestion

__all__ = ["ObservationLog", "ObservingSearcher", "grid_error", "space_leaves"]


def grid_error(searcher: str, path: str) -> ValueError:
    """The error for a ``grid_search`` at ``path`` of a space these searchers sample."""
    return ValueError(
        f"{searcher} cannot search param_space[{path!r}], a grid_search: it samples, it does "
        "not enumerate. Fix: use ftnb.choice([...]) there, or run the grid without a "
        "search_alg.")


def space_leaves(space: Optional[dict], searcher: str) -> dict[str, Any]:
    """The leaves of a Tune space by ``"a/b"`` key (domains, constants). Raises ValueError for a
    ``grid_search``: these searchers sample, they do not enumerate."""
    out: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if is_grid_search(value):
            raise grid_error(searcher, path)
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}/{key}" if path else str(key))
        else:
            out[path] = value

    walk(space or {}, "")
    return out


class ObservationLog:
    """What an optimizer was shown: ``asked`` (trial id -> point, in the order suggested) and
    ``told`` (``[trial id, value or None, error]``, in the order told). Plain JSON."""

    def __init__(self) -> None:
        self.asked: dict[str, Any] = {}
        self.told: list[list] = []
        self._told_ids: set = set()

    def ask(self, trial_id: str, point: Any) -> None:
        self.asked[trial_id] = point

    def tell(self, trial_id: str, value: Optional[float], error: bool) -> None:
        self.told.append([trial_id, value, error])
        self._told_ids.add(trial_id)

    def was_told(self, trial_id: str) -> bool:
        return trial_id in self._told_ids

    def to_json(self) -> dict:
        return {"asked": [[k, v] for k, v in self.asked.items()], "told": self.told}

    @classmethod
    def from_json(cls, data: dict) -> "ObservationLog":
        log = cls()
        for trial_id, point in data.get("asked") or []:
            log.ask(str(trial_id), point)
        for trial_id, value, error in data.get("told") or []:
            log.tell(str(trial_id), None if value is None else float(value), bool(error))
        return log


class ObservingSearcher(Searcher):
    """A searcher over an optimizer that learns only from what it is shown (see the module's
    docstring). A subclass builds the optimizer (:meth:`_new_optimizer`), asks it for a point
    (:meth:`_ask`), turns a point into a config (:meth:`_config`), and shows it an outcome
    (:meth:`_tell`); :meth:`_replay_ask` puts a point asked before a restore into a fresh one.
    It needs a single metric; ``mode`` says whether lower or higher is better."""

    def __init__(self, metric: Optional[str], mode: Optional[str],
                 points_to_evaluate: Optional[list], seed: Optional[int],
                 seed_argument: str = "seed") -> None:
        name = type(self).__name__
        if isinstance(metric, list) or isinstance(mode, list):
            raise ValueError(f"{name}(metric={metric!r}, mode={mode!r}) optimizes one metric: "
                             "give a metric name and 'min' or 'max'.")
        super().__init__(metric=metric, mode=mode)
        self._points = checked_points(name, points_to_evaluate)
        #: Drawn when not given, and kept in the state: a restore draws on from it.
        self._seed = checked_seed(name, seed_argument, seed)
        self._log = ObservationLog()
        self._set_up = False

    # -- what a subclass provides --------------------------------------------------------------
    def _has_space(self) -> bool:
        raise NotImplementedError

    def _new_optimizer(self) -> None:
        """Build the optimizer anew (nothing shown to it yet)."""
        raise NotImplementedError

    def _ask(self, trial_id: str, point: Optional[dict]) -> Suggestion:
        """A new point (JSON) for ``trial_id``: the optimizer's, or the given ``point`` of
        ``points_to_evaluate``; None for "not now", :attr:`Searcher.FINISHED` for "no more"."""
        raise NotImplementedError

    def _replay_ask(self, trial_id: str, point: Any) -> None:
        """Show a fresh optimizer the point ``trial_id`` was given before a restore."""

    def _config(self, point: Any) -> dict:
        """The config of ``point``."""
        raise NotImplementedError

    def _tell(self, trial_id: str, value: Optional[float], error: bool) -> None:
        """Show the optimizer the outcome of ``trial_id``: ``value`` is the metric's (None when
        the trial errored or did not report a finite one)."""
        raise NotImplementedError

    # -- set-up --------------------------------------------------------------------------------
    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        super().set_search_properties(metric, mode, config)
        if self._has_space():  # a space of its own
            self._start()
            return False
        self._take_space(config)
        self._start()
        return True

    def _take_space(self, config: dict) -> None:
        """Take the Tuner's ``param_space`` as the space to search (``TuneConfig``)."""
        raise NotImplementedError

    def _start(self) -> None:
        self._check_ready()
        self._new_optimizer()
        self._set_up = True
        self._log = self._replayed(self._log)

    def _check_ready(self) -> None:
        name = type(self).__name__
        if not self._has_space():
            raise no_space_error(name)
        if not self._metric or self._mode not in ("min", "max"):
            raise no_objective_error(name, self._metric, self._mode)

    def _ensure_started(self) -> None:
        if not self._set_up:
            self._start()

    # -- searching -----------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> Suggestion:
        self._ensure_started()
        if trial_id in self._log.asked:
            # Asked again (a restore): the same point.
            if self._log.was_told(trial_id):
                raise RuntimeError(f"{type(self).__name__}.suggest({trial_id!r}): that trial "
                                   "ended.")
            return self._config(self._log.asked[trial_id])
        index = len(self._log.asked)
        given = self._points[index] if index < len(self._points) else None
        point = self._ask(trial_id, given)
        if point is None or (isinstance(point, str) and point == Searcher.FINISHED):
            return point
        self._log.ask(trial_id, point)
        return self._config(point)

    @property
    def num_suggested(self) -> int:
        """How many points it suggested (the draws so far, for
        :func:`~ftnb.search.libraries.step_seed`)."""
        return len(self._log.asked)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        if trial_id not in self._log.asked or self._log.was_told(trial_id):
            return  # not its trial, or told already
        value = None
        if result and not error and self._metric:
            raw = metric_value(result, self._metric)
            if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
                value = float(raw)
        self._log.tell(trial_id, value, error)
        self._tell(trial_id, value, error)

    def metric_op(self) -> float:
        """1.0 when lower is better, -1.0 when higher is (the optimizers minimize)."""
        return -1.0 if self._mode == "max" else 1.0

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {"seed": self._seed, "observations": self._log.to_json()}

    def set_state(self, state: dict) -> None:
        """A fresh optimizer, shown what the saved one was shown (when it is set up; else at
        its set-up)."""
        if state.get("seed") is not None:
            self._seed = int(state["seed"])
        log = ObservationLog.from_json(state.get("observations") or {})
        if self._set_up:
            self._new_optimizer()
            log = self._replayed(log)
        self._log = log

    def _replayed(self, log: ObservationLog) -> ObservationLog:
        """Show the (fresh) optimizer ``log``: the points asked, then the outcomes told."""
        self._log = ObservationLog()
        for trial_id, point in log.asked.items():
            self._log.ask(trial_id, point)
            self._replay_ask(trial_id, point)
        for trial_id, value, error in log.told:
            if trial_id in self._log.asked and not self._log.was_told(trial_id):
                self._log.tell(trial_id, value, error)
                self._tell(trial_id, value, error)
        return self._log

    # -- description -----------------------------------------------------------------------
    def describe(self) -> Optional[dict]:
        """Its constructor's arguments, when they are all JSON (a space of ftnb domains or
        none, an optimizer named in its library's table): a restore builds it again from
        them (its module's ``from_description``); None otherwise."""
        arguments = self._arguments()
        lib = library_of(f"{type(self).__module__}.{type(self).__name__}")
        if arguments is None or lib is None:
            return None  # (a library's own objects, or a subclass of the user's)
        description = {"class": lib.class_name, "metric": self._metric, "mode": self._mode,
                       "points_to_evaluate": self._points, **arguments}
        return description if json_value(description) else None

    def _arguments(self) -> Optional[dict]:
        """Its own constructor arguments as JSON, None when one is not (see :meth:`describe`)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(metric={self._metric!r}, mode={self._mode!r})"
