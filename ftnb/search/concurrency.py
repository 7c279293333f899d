"""``ConcurrencyLimiter``: at most so many trials of a searcher at once (Ray Tune's name)."""

from __future__ import annotations

from typing import Any, Optional

from .searcher import Searcher, Suggestion

__all__ = ["ConcurrencyLimiter"]


class ConcurrencyLimiter(Searcher):
    """Wraps ``searcher`` so that at most ``max_concurrent`` of its trials are unfinished at
    once: past that, :meth:`suggest` answers None ("not now") and the controller asks again when
    a trial ends. A model-based searcher then sees more results before each suggestion.

    With ``batch=True`` it waits for the whole batch of ``max_concurrent`` trials to end, and
    tells the wrapped searcher their outcomes together, before the next batch (Ray's ``batch``).

    Example::

        from ftnb.search import ConcurrencyLimiter
        from ftnb.search.optuna import OptunaSearch

        search_alg = ConcurrencyLimiter(OptunaSearch(), max_concurrent=2)
        ftnb.Tuner(train, param_space=space, tune_config=ftnb.TuneConfig(
            metric="loss", mode="min", search_alg=search_alg, num_samples=20)).fit()

    Its state (the live trials, a batch's outcomes held back) is JSON, kept with the wrapped
    searcher's in the experiment's folder.
    """

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                f"ConcurrencyLimiter(searcher={searcher!r}) must wrap an ftnb.search.Searcher "
                "(OptunaSearch, BasicVariantGenerator, your subclass). Fix: pass one; for the "
                "default search use TuneConfig(max_concurrent_trials=...) instead.")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or (
                max_concurrent < 1):
            raise ValueError(f"ConcurrencyLimiter(max_concurrent={max_concurrent!r}) must be a "
                             "whole number >= 1.")
        if not isinstance(batch, bool):
            raise TypeError(f"ConcurrencyLimiter(batch={batch!r}) must be True or False.")
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.batch = batch
        self.live_trials: set = set()
        self.num_unfinished_live_trials = 0
        self.cached_results: dict = {}
        self._limit = not searcher.set_max_concurrency(max_concurrent)

    @property
    def metric(self) -> Optional[str]:
        return self.searcher.metric

    @property
    def mode(self) -> Optional[str]:
        return self.searcher.mode

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.max_concurrent = max_concurrent
        return True

    def set_search_properties(self, metric: Optional[str], mode: Optional[str],
                              config: dict, **spec: Any) -> bool:
        self._limit = not self.searcher.set_max_concurrency(self.max_concurrent)
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> Suggestion:
        if not self._limit:
            return self.searcher.suggest(trial_id)
        if len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if suggestion not in (None, Searcher.FINISHED):
            self.live_trials.add(trial_id)
            self.num_unfinished_live_trials += 1
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[dict] = None,
                          error: bool = False) -> None:
        if not self._limit:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            return
        if trial_id not in self.live_trials:
            return
        if not self.batch:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            self.live_trials.discard(trial_id)
            self.num_unfinished_live_trials -= 1
            return
        self.cached_results[trial_id] = [result, error]
        self.num_unfinished_live_trials -= 1
        if self.num_unfinished_live_trials > 0:
            return
        for done_id, (done_result, done_error) in self.cached_results.items():
            self.searcher.on_trial_complete(done_id, result=done_result, error=done_error)
            self.live_trials.discard(done_id)
        self.cached_results = {}
        self.num_unfinished_live_trials = 0

    def get_state(self) -> dict:
        return {"live_trials": sorted(self.live_trials),
                "num_unfinished_live_trials": self.num_unfinished_live_trials,
                "cached_results": self.cached_results,
                "searcher": self.searcher.get_state()}

    def set_state(self, state: dict) -> None:
        self.live_trials = set(state.get("live_trials", []))
        self.num_unfinished_live_trials = int(state.get("num_unfinished_live_trials", 0))
        self.cached_results = dict(state.get("cached_results", {}))
        self.searcher.set_state(state.get("searcher", {}))

    def set_scheduler(self, scheduler: Any) -> None:
        self.searcher.set_scheduler(scheduler)

    def attach_storage(self, paths: Any, resuming: bool) -> None:
        self.searcher.attach_storage(paths, resuming)

    def flush(self) -> None:
        self.searcher.flush()

    def end_search(self, recorded: set) -> None:
        self.searcher.end_search(recorded)

    def describe(self) -> Optional[dict]:
        inner = self.searcher.describe()
        if inner is None:
            return None
        return {"class": "ftnb.search.ConcurrencyLimiter", "searcher": inner,
                "max_concurrent": self.max_concurrent, "batch": self.batch}

    def __repr__(self) -> str:
        return f"ConcurrencyLimiter({self.searcher!r}, max_concurrent={self.max_concurrent})"
