"""Ray Tune's ``TBXLoggerCallback`` (``ray.tune.logger``): TensorBoard event files in each
trial's folder, through ``tensorboardX`` (``pip install 'ftnb[tensorboard]'``).

    from ftnb.logger import TBXLoggerCallback
    ftnb.Tuner(train, run_config=ftnb.RunConfig(callbacks=[TBXLoggerCallback()])).fit()
    # tensorboard --logdir ~/ftnb_results/<name>

Every numeric metric of each report is a scalar ``ray/tune/<metric>`` (nested ones
``ray/tune/outer/inner``) at step ``training_iteration``. Exactly one point per iteration, also
after retries and restores: when a trial goes back to an earlier checkpoint (a retry, a driver
that died), its event file is written again from the persisted results, so the iterations it
redoes are not in it twice.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Optional

from .callback import Callback

__all__ = ["TBXLoggerCallback"]

#: The event file's suffix: one file per trial, the one this callback rewrites.
_SUFFIX = ".ftnb"


class TBXLoggerCallback(Callback):
    """Write each trial's results as TensorBoard scalars into its folder (local storage)."""

    def __init__(self) -> None:
        self._writers: dict[str, Any] = {}
        self._last_step: dict[str, int] = {}
        self._paths: Any = None

    def setup(self, stop: Any = None, num_samples: Optional[int] = None,
              total_num_samples: Optional[int] = None, **info: Any) -> None:
        self._paths = info.get("paths")
        if info.get("restored"):
            for trial in info.get("trials") or []:
                self._rewrite(trial, upto=None)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        step = result.get("training_iteration") or 0
        if step <= self._last_step.get(trial.trial_id, 0):
            self._rewrite(trial, upto=step - 1)  # it went back to a checkpoint: redo the file
        writer = self._writer(trial)
        if writer is None:
            return
        self._add(writer, result)
        writer.flush()
        self._last_step[trial.trial_id] = step

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial.trial_id)

    on_trial_error = on_trial_complete

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for trial_id in list(self._writers):
            self._close(trial_id)

    # -- the files -----------------------------------------------------------------------------
    def _folder(self, trial: Any) -> Optional[str]:
        if self._paths is None or not self._paths.storage.is_local:
            return None
        return self._paths.trial(trial.dir_name).dir

    def _writer(self, trial: Any) -> Any:
        writer = self._writers.get(trial.trial_id)
        if writer is None:
            folder = self._folder(trial)
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

    def _rewrite(self, trial: Any, upto: Optional[int]) -> None:
        """Write the trial's event file anew from its persisted results (up to iteration
        ``upto``; None: all)."""
        folder = self._folder(trial)
        if folder is None:
            return
        self._close(trial.trial_id)
        for path in glob.glob(os.path.join(folder, f"events.out.tfevents.*{_SUFFIX}")):
            os.remove(path)
        rows = self._paths.trial(trial.dir_name).read_results()
        seen: dict[int, dict] = {}
        for row in rows:  # the last row of an iteration wins (it is the one kept)
            step = row.get("training_iteration") or 0
            if upto is None or step <= upto:
                seen[step] = row
        writer = self._writer(trial)
        for step in sorted(seen):
            self._add(writer, seen[step])
        writer.flush()
        self._last_step[trial.trial_id] = max(seen, default=0)

    @staticmethod
    def _add(writer: Any, row: dict) -> None:
        from .storage.result_log import flatten_row

        step = row.get("training_iteration") or 0
        walltime = row.get("timestamp")
        for key, value in flatten_row(row).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in (
                    "training_iteration", "timestamp", "attempt"):
                writer.add_scalar(f"ray/tune/{key}", value, global_step=step, walltime=walltime)
