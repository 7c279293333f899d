"""Ray Tune's logger callbacks (``ray.tune.logger``): :class:`LoggerCallback`, the base with
Ray's ``log_trial_*`` hooks, and the built-in loggers, each run in the driver:

- :class:`TBXLoggerCallback`: TensorBoard event files in each trial's folder, through
  ``tensorboardX`` (``pip install 'ftnb[tensorboard]'``).
- :class:`~ftnb.air.integrations.mlflow.MLflowLoggerCallback`: one MLflow run per trial
  (``pip install 'ftnb[mlflow]'``).
- :class:`~ftnb.air.integrations.wandb.WandbLoggerCallback`: one Weights & Biases run per trial
  (``pip install 'ftnb[wandb]'``).

::

    from ftnb.logger import TBXLoggerCallback
    ftnb.Tuner(train, run_config=ftnb.RunConfig(callbacks=[TBXLoggerCallback()])).fit()
    # tensorboard --logdir ~/ftnb_results/<name>

Exactly once. Each built-in logger holds every iteration of a trial exactly once, also after
retries and after a driver that died and an experiment restored (a SIGKILL included): the
persisted results (``result.json``) are the truth, and

- when the experiment is restored, each trial's logger is brought up to date from them: the
  iterations the dead driver did not deliver are logged, the ones it did are not logged again;
- when a trial goes back to a checkpoint (a retry, a restore), the iterations it does again are
  not logged twice. TensorBoard's event file is ftnb's own, so it is rewritten: the redone
  iteration's values replace the earlier ones. MLflow and W&B runs only grow (as their servers
  require), so there the first values logged for an iteration stay.

Every numeric metric of a report is logged (nested ones as ``outer/inner``) at step
``training_iteration``.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
from typing import Any, Optional

from .callback import Callback
from .lazy_names import lazy_attribute

__all__ = ["LoggerCallback", "MLflowLoggerCallback", "TBXLoggerCallback", "WandbLoggerCallback"]

_log = logging.getLogger("ftnb")

#: The event file's suffix: one file per trial, the one this callback rewrites.
_SUFFIX = ".ftnb"

#: Built-in loggers in modules that import their packages lazily: name -> module (in ftnb).
_LAZY = {
    "MLflowLoggerCallback": "air.integrations.mlflow",
    "WandbLoggerCallback": "air.integrations.wandb",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(globals(), _LAZY, name)


class LoggerCallback(Callback):
    """Base class of a logger (Ray Tune's ``tune.logger.LoggerCallback``): override the
    ``log_trial_*`` hooks, each called in the driver with the trial's record::

        class PrintLogger(ftnb.logger.LoggerCallback):
            def log_trial_result(self, iteration, trial, result):
                print(trial.trial_id, result["training_iteration"], result["loss"])
    """

    #: Set when the logger could not start: its hooks do nothing (one error was logged).
    _off = False

    def log_trial_start(self, trial: Any) -> None:
        """A trial's attempt started."""

    def log_trial_restore(self, trial: Any) -> None:
        """A trial's attempt started from its latest checkpoint."""

    def log_trial_save(self, trial: Any) -> None:
        """A trial persisted a checkpoint."""

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        """A trial's report was persisted: ``result`` is its row."""

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        """A trial ended (``failed``: ERRORED)."""

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._off:
            self.log_trial_start(trial)

    def on_trial_restore(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._off:
            self.log_trial_restore(trial)

    def on_trial_save(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._off:
            self.log_trial_save(trial)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        if not self._off:
            self.log_trial_result(iteration, trial, result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._off:
            self.log_trial_end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if not self._off:
            self.log_trial_end(trial, failed=True)


def require(module: str, extra: str, what: str) -> None:
    """Raise an ImportError naming the extra to install when ``module`` is not installed
    (checked without importing it)."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{what} needs the {module!r} package. Fix: pip install "
                          f"'ftnb[{extra}]'.")


def numeric_metrics(row: dict, exclude: tuple = ()) -> dict:
    """The numeric values of ``row`` (nested ones as ``"outer/inner"``; not booleans), less the
    keys in ``exclude`` and those under an excluded ``"prefix/"``."""
    from .storage.result_log import flatten_row

    out = {}
    for key, value in flatten_row(row).items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if any(key == item or key.startswith(item + "/") for item in exclude):
            continue
        out[key] = value
    return out


def shown_config(config: Any) -> Any:
    """A trial's recorded config as a tracker shows it: an object that is not JSON (recorded as
    a placeholder: a model, an ``ftnb.put`` ref) as its ``repr``."""
    if isinstance(config, dict):
        if "repr" in config and ("__ftnb_object__" in config or "__ftnb_ref__" in config):
            return config["repr"]
        return {key: shown_config(value) for key, value in config.items()}
    if isinstance(config, (list, tuple)):
        return [shown_config(value) for value in config]
    return config


def step_of(row: dict) -> int:
    """A row's iteration: the step every built-in logger logs it at."""
    return int(row.get("training_iteration") or 0)


class IterationLogger(LoggerCallback):
    """What the built-in loggers share: each trial's iterations reach the logger's sink exactly
    once, however often the trial goes back to a checkpoint or the driver dies.

    A subclass says how its sink is opened (:meth:`_open`), brought up to date with a trial's
    persisted rows (:meth:`_replay`) and written (``log_trial_result``, only ever called with an
    iteration the sink does not hold). ``_rewrites``: the sink can be rewritten (a file of
    ftnb's own): an iteration done again replaces the earlier one; otherwise (a tracking
    server) the first one stays.
    """

    _rewrites = False

    def setup(self, stop: Any = None, num_samples: Optional[int] = None,
              total_num_samples: Optional[int] = None, **info: Any) -> None:
        self._paths = info.get("paths")
        self._restored = bool(info.get("restored"))
        #: The last iteration each trial's sink holds (absent: not known to hold any).
        self._last_step: dict[str, int] = {}
        try:
            self._open(**info)
        except BaseException:
            self._off = True  # the error is logged once; no hook tries again
            raise
        if self._restored:
            for trial in info.get("trials") or []:
                try:
                    self._catch_up(trial)
                except Exception:  # that trial's history only: the others are still caught up
                    _log.exception("ftnb: %s could not bring trial %s up to date from its "
                                   "persisted results", type(self).__name__, trial.trial_id)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        if self._off:
            return
        step = step_of(result)
        last = self._last_step.get(trial.trial_id)
        if last is not None and step <= last:  # the trial went back to a checkpoint
            if not self._rewrites:
                return  # its sink holds this iteration already
            self._replay(trial, self.kept_rows(trial, upto=step - 1))
        self.log_trial_result(iteration, trial, result)
        self._last_step[trial.trial_id] = step

    # -- what subclasses fill in ---------------------------------------------------------------
    def _open(self, **info: Any) -> None:
        """Set up the sink, once, before any trial is logged (``info``: :meth:`setup`'s)."""

    def _replay(self, trial: Any, rows: list[dict]) -> int:
        """Make the trial's sink hold each of ``rows`` (its persisted rows, one per iteration,
        in order) exactly once; return the last iteration it holds (0: none)."""
        raise NotImplementedError

    def _ended_before(self, trial: Any) -> bool:
        """Whether the trial's sink was closed for good by an earlier driver (nothing to do)."""
        return False

    # -- shared --------------------------------------------------------------------------------
    def _catch_up(self, trial: Any) -> None:
        """On restore: bring the trial's sink up to date with its persisted rows, and close it
        if the trial ended while the driver that died could not."""
        from .core.records import TrialStatus

        finished = TrialStatus(trial.status).is_finished()
        if finished and self._ended_before(trial):
            return
        self._last_step[trial.trial_id] = self._replay(trial, self.kept_rows(trial))
        if finished:
            self.log_trial_end(trial, failed=trial.status == TrialStatus.ERRORED.value)

    def kept_rows(self, trial: Any, upto: Optional[int] = None) -> list[dict]:
        """The trial's persisted rows, one per iteration (the last row of an iteration is the
        kept one), up to iteration ``upto`` (None: all), in order."""
        if self._paths is None:
            return []
        seen: dict[int, dict] = {}
        for row in self._paths.trial(trial.dir_name).read_results():
            step = step_of(row)
            if upto is None or step <= upto:
                seen[step] = row
        return [seen[step] for step in sorted(seen)]

    def trial_folder(self, trial: Any) -> Optional[str]:
        """The trial's folder when the experiment is on local disk (else None)."""
        if self._paths is None or not self._paths.storage.is_local:
            return None
        return self._paths.trial(trial.dir_name).dir

    def read_record(self, trial: Any, name: str) -> Optional[dict]:
        """The logger's own record ``name`` in the trial's folder (None: none yet)."""
        if self._paths is None:
            return None
        trial_paths = self._paths.trial(trial.dir_name)
        try:
            return json.loads(trial_paths.storage.read_bytes(trial_paths.logger_record(name)))
        except FileNotFoundError:
            return None

    def write_record(self, trial: Any, name: str, record: dict) -> None:
        """Replace the logger's record ``name`` in the trial's folder (atomically)."""
        if self._paths is None:
            return
        trial_paths = self._paths.trial(trial.dir_name)
        trial_paths.storage.write_json_atomic(trial_paths.logger_record(name), record)


def trial_name(trial: Any) -> str:
    """The name a trial is shown with (``TuneConfig(trial_name_creator=...)``'s, or its id)."""
    return getattr(trial, "name", None) or trial.trial_id


class TBXLoggerCallback(IterationLogger):
    """Write each trial's results as TensorBoard scalars into its folder (local storage):
    ``ray/tune/<metric>`` at step ``training_iteration``."""

    _rewrites = True

    def __init__(self) -> None:
        self._writers: dict[str, Any] = {}

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        writer = self._writer(trial)
        if writer is None:
            return
        self._add(writer, result)
        writer.flush()

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        self._close(trial.trial_id)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for trial_id in list(self._writers):
            self._close(trial_id)

    # -- the files -----------------------------------------------------------------------------
    def _writer(self, trial: Any) -> Any:
        writer = self._writers.get(trial.trial_id)
        if writer is None:
            folder = self.trial_folder(trial)
            if folder is None:
                return None
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise ImportError("TBXLoggerCallback needs tensorboardX. Fix: pip install "
                                  "'ftnb[tensorboard]' (or tensorboardX).") from None
            writer = SummaryWriter(logdir=folder, filename_suffix=_SUFFIX, flush_secs=3600)
            self._writers[trial.trial_id] = writer
        return writer

    def _close(self, trial_id: str) -> None:
        writer = self._writers.pop(trial_id, None)
        if writer is not None:
            writer.close()

    def _replay(self, trial: Any, rows: list[dict]) -> int:
        """Write the trial's event file anew with ``rows``."""
        folder = self.trial_folder(trial)
        if folder is None:
            return 0
        self._close(trial.trial_id)
        for path in glob.glob(os.path.join(glob.escape(folder), f"events.out.tfevents.*{_SUFFIX}")):
            os.remove(path)
        writer = self._writer(trial)
        for row in rows:
            self._add(writer, row)
        writer.flush()
        return max((step_of(row) for row in rows), default=0)

    @staticmethod
    def _add(writer: Any, row: dict) -> None:
        step = step_of(row)
        walltime = row.get("timestamp")
        for key, value in numeric_metrics(
                row, exclude=("training_iteration", "timestamp", "attempt")).items():
            writer.add_scalar(f"ray/tune/{key}", value, global_step=step, walltime=walltime)
