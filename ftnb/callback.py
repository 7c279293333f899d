"""Ray Tune's callbacks (``ray.tune.Callback``): hooks the driver calls as the experiment runs.

    class PrintResults(ftnb.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            print(f"{trial.trial_id}: {result['loss']}")

    ftnb.Tuner(train, run_config=ftnb.RunConfig(callbacks=[PrintResults()])).fit()

They run in the driver, never in a trial. A hook that raises is logged (logger ``ftnb``, with
its traceback) and the experiment goes on. ``trial`` is the trial's record (``trial_id``,
``config``, ``status``, ``last_result``, ``name``, ``dir_name``); ``trials`` all of them.

After a restore the hooks see what happens from then on, as in Ray Tune; the history before it
is not delivered again (the built-in loggers of :mod:`ftnb.logger`, TensorBoard, MLflow and
W&B, bring their files and runs up to date from the persisted results, so each iteration is in
them exactly once: docs/loggers.md).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from .core.records import ExperimentState, FailureRecord, TrialRecord
    from .storage import ExperimentPaths

__all__ = ["Callback", "asks_checkpoints"]

_log = logging.getLogger("ftnb")


class Callback:
    """Base class of a callback: override the hooks you need (all do nothing here)."""

    def setup(self, stop: Any = None, num_samples: Optional[int] = None,
              total_num_samples: Optional[int] = None, **info: Any) -> None:
        """Once, before the first trial starts (``info["restored"]``: the experiment resumes)."""

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        """At the start of each loop of the driver."""

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """At the end of each loop of the driver."""

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial's attempt started."""

    def on_trial_restore(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial's attempt started from its latest checkpoint."""

    def on_trial_save(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial persisted a checkpoint."""

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        """A trial's report was persisted: ``result`` is its row. Setting
        ``result[ftnb.result.SHOULD_CHECKPOINT] = True`` makes a class Trainable checkpoint
        with this result (it is shown the row just before the row is persisted, once)."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial ended without error (TERMINATED)."""

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial failed and will be retried from its latest checkpoint."""

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A trial ended ERRORED."""

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any,
                      **info: Any) -> None:
        """A trial persisted ``checkpoint`` (an :class:`ftnb.Checkpoint`)."""

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Once, when the experiment ended (finished, errored or stopped)."""


class CallbackListener:
    """The controller's listener that calls the callbacks' hooks, each guarded."""

    def __init__(self, callbacks: list, paths: "ExperimentPaths", stop: Any = None) -> None:
        self.callbacks = list(callbacks)
        self.paths = paths
        self.stop = stop
        self.iteration = 0
        self._failed: set[str] = set()  # trials whose failure is not yet known as retried
        #: (trial_id, training_iteration) of rows already shown before they were persisted.
        self._previewed: set[tuple[str, Any]] = set()

    def _call(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for callback in self.callbacks:
            fn: Optional[Callable] = getattr(callback, hook, None)
            if fn is None:
                continue
            try:
                fn(*args, **kwargs)
            except Exception:
                _log.exception("ftnb: %s.%s raised; the experiment goes on",
                               type(callback).__name__, hook)

    def on_experiment_start(self, state: "ExperimentState") -> None:
        self._call("setup", stop=self.stop, num_samples=state.settings.get("num_samples"),
                   total_num_samples=len(state.trials), experiment_path=self.paths.uri,
                   restored=len(state.driver_sessions) > 1, paths=self.paths,
                   trials=state.trials)

    def on_trial_start(self, state: "ExperimentState", trial: "TrialRecord") -> None:
        trials = state.trials
        self._call("on_trial_start", self.iteration, trials, trial)
        if trial.attempts and trial.attempts[-1].restored_from:
            self._call("on_trial_restore", self.iteration, trials, trial)

    def on_result_preview(self, state: "ExperimentState", trial: "TrialRecord",
                          row: dict) -> None:
        """A class trainable's row about to be persisted (see ftnb.core.checkpoint_queries)."""
        self._previewed.add((trial.trial_id, row.get("training_iteration")))
        self._call("on_trial_result", self.iteration, state.trials, trial, row)

    def on_result(self, state: "ExperimentState", trial: "TrialRecord", row: dict) -> None:
        trials = state.trials
        key = (trial.trial_id, row.get("training_iteration"))
        if key in self._previewed:
            self._previewed.discard(key)
        else:
            self._call("on_trial_result", self.iteration, trials, trial, row)
        name = row.get("checkpoint_dir_name")
        if name:
            from .checkpoint import Checkpoint

            path = self.paths.trial(trial.dir_name).checkpoint(name)
            checkpoint = Checkpoint(path, self.paths.storage.fs)
            self._call("on_trial_save", self.iteration, trials, trial)
            self._call("on_checkpoint", self.iteration, trials, trial, checkpoint)

    def on_trial_failure(self, state: "ExperimentState", trial: "TrialRecord",
                         failure: "FailureRecord") -> None:
        self._failed.add(trial.trial_id)  # retried or errored: the next status says which

    def on_trial_complete(self, state: "ExperimentState", trial: "TrialRecord") -> None:
        self._failed.discard(trial.trial_id)
        hook = "on_trial_error" if trial.status == "ERRORED" else "on_trial_complete"
        self._call(hook, self.iteration, state.trials, trial)

    def on_tick(self, state: "ExperimentState") -> None:
        for trial in state.trials:
            if trial.trial_id in self._failed and trial.status == "PENDING":
                self._failed.discard(trial.trial_id)
                self._call("on_trial_recover", self.iteration, state.trials, trial)
        self._call("on_step_begin", self.iteration, state.trials)
        self._call("on_step_end", self.iteration, state.trials)
        self.iteration += 1

    def on_experiment_end(self, state: "ExperimentState") -> None:
        self._call("on_experiment_end", state.trials)


def asks_checkpoints(callbacks: Any) -> bool:
    """Whether any of ``callbacks`` has an ``on_trial_result`` of its own, which may set
    ``SHOULD_CHECKPOINT`` (ftnb's own loggers never do)."""
    for callback in callbacks or ():
        hook = getattr(type(callback), "on_trial_result", None)
        if hook is not None and hook is not Callback.on_trial_result \
                and not type(callback).__module__.startswith("ftnb."):
            return True
    return False
