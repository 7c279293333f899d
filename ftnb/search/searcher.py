"""Search algorithms: the :class:`Searcher` interface (Ray Tune's names) and
:class:`BasicVariantGenerator`, the default one.

A searcher suggests the config of each new trial (:meth:`Searcher.suggest`) and is told how
trials went (:meth:`Searcher.on_trial_result`, :meth:`Searcher.on_trial_complete`). The
controller asks it for a trial only when one can start, so a searcher that learns from results
(:class:`~ftnb.search.optuna.OptunaSearch`) sees every result that came before.

Fault tolerance (beyond Ray's pickles): a searcher's state is plain JSON
(:meth:`Searcher.get_state` / :meth:`Searcher.set_state`), kept in the experiment's folder by
:class:`ftnb.core.searching.PersistedSearcher` in step with the trial records, so that after the
driver is killed at any moment and restored, no config is suggested twice or lost and each
trial's outcome is told once. A searcher with a storage of its own (Optuna's study) keeps it in
the experiment's folder too (:meth:`Searcher.attach_storage`).

Only the stdlib is imported here so that ``import ftnb`` stays fast.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Union

from .messages import short_repr

if TYPE_CHECKING:
    from ..storage import ExperimentPaths

__all__ = ["BasicVariantGenerator", "Searcher", "Suggestion"]

#: What :meth:`Searcher.suggest` returns: a config, None ("not now"), or
#: :attr:`Searcher.FINISHED` ("no more trials").
Suggestion = Union[dict, None, str]


class Searcher:
    """Base class of search algorithms (Ray Tune's ``ray.tune.search.Searcher``).

    Subclass it and implement :meth:`suggest` and :meth:`on_trial_complete` (and
    :meth:`on_trial_result` to learn from intermediate results); implement :meth:`get_state`
    and :meth:`set_state` (plain JSON) so that the search survives a restore. Example::

        class RandomLR(ftnb.search.Searcher):
            def __init__(self, metric="loss", mode="min"):
                super().__init__(metric=metric, mode=mode)
                self.rng = random.Random(0)
                self.best = None

            def suggest(self, trial_id):
                return {"lr": 10 ** self.rng.uniform(-4, -1)}

            def on_trial_complete(self, trial_id, result=None, error=False):
                if result and (self.best is None or result[self.metric] < self.best):
                    self.best = result[self.metric]

            def get_state(self):
                return {"rng": list(self.rng.getstate()[1]), "best": self.best}

            def set_state(self, state):
                self.rng.setstate((3, tuple(state["rng"]), None))
                self.best = state["best"]

        ftnb.Tuner(train, tune_config=ftnb.TuneConfig(search_alg=RandomLR(), num_samples=20))
    """

    #: What :meth:`suggest` returns when the search is over (no more trials, ever).
    FINISHED = "FINISHED"

    def __init__(self, metric: Union[str, list, None] = None,
                 mode: Union[str, list, None] = None) -> None:
        _check_objectives(type(self).__name__, metric, mode)
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> Optional[str]:
        """The metric it optimizes (its own, or ``TuneConfig(metric=...)``)."""
        return self._metric

    @property
    def mode(self) -> Optional[str]:
        """``"min"`` or ``"max"`` (its own, or ``TuneConfig(mode=...)``)."""
        return self._mode

    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        """Called once before the first suggestion with ``TuneConfig``'s metric and mode and the
        Tuner's ``param_space`` (``spec``: ``num_samples``, ``seed``). Return False when the
        searcher cannot take them (it has a space of its own); the base class takes the metric
        and mode it was not given."""
        if self._metric is None and metric is not None:
            self._metric = metric
        if self._mode is None and mode is not None:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> Suggestion:
        """The config of the new trial ``trial_id``; None when it cannot say now (it waits for
        results: it is asked again later), :attr:`FINISHED` when the search is over.

        The returned config is laid over ``param_space``: keys it leaves out keep the space's
        values (their domains drawn at random), as in Ray Tune."""
        raise NotImplementedError(f"{type(self).__name__} must implement suggest(trial_id)")

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """A result the trial ``trial_id`` reported (each ``training_iteration`` once, even
        across restores)."""

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        """The trial ``trial_id`` ended: ``result`` is its last result (None if it reported
        none), ``error`` True when it ERRORED. Told once per trial, even across restores."""

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """Ray's hook for a searcher that limits its own concurrency: return True to take
        ``max_concurrent`` itself (:class:`~ftnb.search.ConcurrencyLimiter` then leaves it
        to it)."""
        return False

    def set_scheduler(self, scheduler: Any) -> None:
        """Called by ftnb before the first suggestion with the experiment's trial scheduler
        (``TuneConfig(scheduler=...)``; None: the default), for a searcher that works with its
        scheduler (TuneBOHB asks HyperBandForBOHB at which budget a result was evaluated)."""

    # -- state: plain JSON, never a pickle -----------------------------------------------------
    def get_state(self) -> dict:
        """The searcher's state as JSON-able values (dicts, lists, str, numbers, bools, None),
        enough for :meth:`set_state` on a new instance to go on where this one is. The default
        holds nothing: a searcher without state of its own starts afresh on a restore (its
        trials and their outcomes are kept by ftnb)."""
        return {}

    def set_state(self, state: dict) -> None:
        """Take back what :meth:`get_state` returned (on a new instance, at a restore)."""

    def save(self, checkpoint_path: str) -> None:
        """Ray's ``Searcher.save``: write :meth:`get_state` to ``checkpoint_path`` as JSON
        (ftnb never pickles a searcher)."""
        self.flush()
        with open(checkpoint_path, "w") as f:
            json.dump({"searcher": type(self).__name__, "state": self.get_state()}, f)

    def restore(self, checkpoint_path: str) -> None:
        """Ray's ``Searcher.restore``: :meth:`set_state` from a file :meth:`save` wrote."""
        with open(checkpoint_path) as f:
            self.set_state(json.load(f)["state"])

    # -- ftnb's hooks (a searcher with a storage of its own) -----------------------------------
    def attach_storage(self, paths: "ExperimentPaths", resuming: bool) -> None:
        """Called by ftnb before anything else, with the experiment's folder: a searcher that
        keeps a storage of its own (Optuna's study) opens it there (``resuming``: the
        experiment is being restored; its storage holds the earlier suggestions)."""

    def flush(self) -> None:
        """Make durable what the searcher's own storage holds in memory: ftnb calls it before it
        saves :meth:`get_state` (which must then only refer to durable things)."""

    def end_search(self, recorded: set) -> None:
        """Called by ftnb once the experiment makes no more trials, with the ids of its trials
        (``recorded``): a searcher with a storage of its own closes there what it suggested for
        a trial id that never became a trial (asked for just before a driver died, and not
        asked for again)."""

    def describe(self) -> Optional[dict]:
        """A JSON description from which ftnb can build this searcher again at a restore
        without the caller giving it (``{"class": dotted name, ...arguments}``), or None when
        it cannot (a function, a sampler object): the restore then needs
        ``Tuner.restore(..., search_alg=...)``. Only ftnb's own searchers are rebuilt."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(metric={self._metric!r}, mode={self._mode!r})"


class BasicVariantGenerator(Searcher):
    """Ray Tune's default search: the grid of ``param_space`` repeated ``num_samples`` times,
    random domains drawn anew for each config (what ftnb does without a ``search_alg``).

    Args:
        points_to_evaluate: configs (whole or partial) to run first; each replaces one sample,
            its values fixed and the rest of the space resolved as usual (a grid axis a point
            does not fix still gives one trial per value), as in Ray Tune.
        max_concurrent: at most this many of its trials run at once (0: no limit).
        random_state: a seed (int) for its draws (default: ``TuneConfig(seed=...)``).

    With ``TuneConfig(num_samples=-1)`` it never runs out: trials are made one by one as they
    can start, until ``TuneConfig(time_budget_s=...)``, a stopper or a stop request ends the
    experiment. Its state is the seed and how many configs it made (a restore draws them again
    and goes on).

    Example::

        ftnb.Tuner(train, param_space={"lr": ftnb.loguniform(1e-4, 1e-1)},
                   tune_config=ftnb.TuneConfig(
                       num_samples=8,
                       search_alg=BasicVariantGenerator(points_to_evaluate=[{"lr": 0.01}])))
    """

    def __init__(self, points_to_evaluate: Optional[list] = None, max_concurrent: int = 0,
                 constant_grid_search: bool = False, random_state: Optional[int] = None) -> None:
        super().__init__()
        if points_to_evaluate is not None and not isinstance(points_to_evaluate, list):
            raise TypeError(
                f"BasicVariantGenerator(points_to_evaluate={short_repr(points_to_evaluate)}) "
                "must be a list of dicts (partial configs). Fix: e.g. [{'lr': 0.01}].")
        for point in points_to_evaluate or []:
            if not isinstance(point, Mapping):
                raise TypeError(
                    "BasicVariantGenerator(points_to_evaluate=...) must be a list of dicts; "
                    f"got an item {short_repr(point)}. Fix: e.g. [{{'lr': 0.01}}].")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or (
                max_concurrent < 0):
            raise ValueError(f"BasicVariantGenerator(max_concurrent={max_concurrent!r}) must be "
                             "a whole number >= 0 (0: no limit).")
        if constant_grid_search:
            raise ValueError(
                "BasicVariantGenerator(constant_grid_search=True) is not supported by ftnb: "
                "each grid combination draws its own random values. Fix: leave it False, or "
                "put the values to keep constant in the grid itself.")
        if random_state is not None and (isinstance(random_state, bool)
                                         or not isinstance(random_state, int)):
            raise TypeError(f"BasicVariantGenerator(random_state={short_repr(random_state)}) "
                            "must be an int seed or None (ftnb stores it as JSON).")
        self.points_to_evaluate = [dict(p) for p in points_to_evaluate or []]
        self.max_concurrent = max_concurrent
        self.random_state = random_state
        self._space: Optional[dict] = None
        self._num_samples: Optional[int] = 1
        self._seed: Optional[int] = None
        self._made = 0  # configs suggested so far
        self._iterator: Optional[Iterator[dict]] = None
        self._live: set = set()

    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        super().set_search_properties(metric, mode, config)
        self._space = dict(config or {})
        num_samples = spec.get("num_samples", 1)
        self._num_samples = None if num_samples == -1 else num_samples
        seed = self.random_state if self.random_state is not None else spec.get("seed")
        self._seed = seed if seed is not None else random.SystemRandom().getrandbits(63)
        self._iterator = None
        return True

    def variants(self) -> list:
        """Every config, at once (a finite ``num_samples``): exactly :func:`generate_variants`'
        configs without points to evaluate."""
        from .variants import iter_variants

        if self._num_samples is None:
            raise ValueError("BasicVariantGenerator.variants(): num_samples=-1 never ends.")
        return list(iter_variants(self._space, self._num_samples, random.Random(self._seed),
                                  self.points_to_evaluate))

    def _configs(self) -> Iterator[dict]:
        from .variants import iter_variants

        if self._iterator is None:
            self._iterator = iter_variants(self._space, self._num_samples,
                                           random.Random(self._seed), self.points_to_evaluate)
            for _ in range(self._made):  # a restore: the configs made before, drawn again
                next(self._iterator, None)
        return self._iterator

    def suggest(self, trial_id: str) -> Suggestion:
        if self._space is None:
            raise RuntimeError("BasicVariantGenerator.suggest() before set_search_properties(): "
                               "give it to ftnb.TuneConfig(search_alg=...), which sets it up.")
        if self.max_concurrent and len(self._live) >= self.max_concurrent:
            return None
        config = next(self._configs(), None)
        if config is None:
            return Searcher.FINISHED
        self._made += 1
        self._live.add(trial_id)
        return config

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        self._live.discard(trial_id)

    def get_state(self) -> dict:
        return {"seed": self._seed, "made": self._made, "live": sorted(self._live)}

    def set_state(self, state: dict) -> None:
        self._seed = state.get("seed", self._seed)
        self._made = int(state.get("made", 0))
        self._live = set(state.get("live", []))
        self._iterator = None

    def describe(self) -> Optional[dict]:
        return {"class": "ftnb.search.BasicVariantGenerator",
                "points_to_evaluate": self.points_to_evaluate,
                "max_concurrent": self.max_concurrent, "random_state": self.random_state}

    def __repr__(self) -> str:
        return (f"BasicVariantGenerator(points_to_evaluate={len(self.points_to_evaluate)} "
                f"points, max_concurrent={self.max_concurrent})")


def _check_objectives(owner: str, metric: Any, mode: Any) -> None:
    """Ray's rules for a searcher's ``metric``/``mode``: a name and "min"/"max", or (a
    multi-objective searcher's) a list of names and a list of "min"/"max"/"obs" as long."""
    if isinstance(metric, list) or isinstance(mode, list):
        names_ok = metric is None or (isinstance(metric, list) and metric
                                      and all(isinstance(m, str) for m in metric))
        modes_ok = mode is None or (isinstance(mode, list)
                                    and all(m in ("min", "max", "obs") for m in mode))
        if not (names_ok and modes_ok) or (metric is not None and mode is not None
                                           and len(metric) != len(mode)):
            raise ValueError(
                f"{owner}(metric={metric!r}, mode={mode!r}): a multi-objective searcher takes "
                'a list of metric names and a list of modes ("min", "max" or "obs") as long. '
                'Fix: e.g. metric=["loss", "accuracy"], mode=["min", "max"].')
        return
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f'{owner}(mode={mode!r}) is invalid. Fix: "min" or '
                         '"max" (or leave it out to take TuneConfig(mode=...)).')
    if metric is not None and not isinstance(metric, str):
        raise TypeError(f"{owner}(metric={metric!r}) must be a metric name "
                        "(str), or None to take TuneConfig(metric=...).")
