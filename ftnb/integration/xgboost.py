"""Ray Tune's XGBoost callback (``ray.tune.integration.xgboost``), ``pip install
'ftnb[xgboost]'``::

    import xgboost
    from ftnb.integration.xgboost import TuneReportCheckpointCallback

    def train_fn(config):
        xgboost.train(config, dtrain, evals=[(dtest, "eval")], verbose_eval=False,
                      callbacks=[TuneReportCheckpointCallback(
                          metrics={"loss": "eval-logloss"}, frequency=1)])

Each boosting round is one ``ftnb.report`` (its metrics picked from XGBoost's evaluation log,
``"<evals name>-<metric>"``); every ``frequency`` rounds, and at the end with
``checkpoint_at_end``, the report carries a checkpoint holding the model (``filename``,
``model.ubj`` by default), which ``TuneReportCheckpointCallback.get_model(checkpoint)`` loads.
With ``xgboost.cv`` each value is the round's ``(mean, std)``: ``results_postprocessing_fn``
turns them into numbers. As in Ray, a trial resumed from such a checkpoint passes the model on
to ``xgboost.train(..., xgb_model=...)`` itself; its rounds continue the trial's iterations.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .boosting import BoostingReport, missing_library

try:
    import xgboost
    from xgboost.callback import TrainingCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_library("xgboost", "xgboost",
                          "ftnb.integration.xgboost (TuneReportCheckpointCallback)") from exc

__all__ = ["TuneReportCheckpointCallback"]


class XGBoostReportCallback(TrainingCallback):
    """Ray's ``RayReportCallback`` for XGBoost: the logic of both names (see the module)."""

    CHECKPOINT_NAME = "model.ubj"
    #: Whether only rank 0 of a group saves checkpoints (the Train name).
    _rank_zero_checkpoints = False

    def __init__(self, metrics: Any = None, filename: str = CHECKPOINT_NAME, frequency: int = 0,
                 checkpoint_at_end: bool = True,
                 results_postprocessing_fn: Optional[Callable[[dict], dict]] = None) -> None:
        super().__init__()
        self._settings = BoostingReport(type(self).__name__, metrics, filename, frequency,
                                        checkpoint_at_end, results_postprocessing_fn,
                                        self._rank_zero_checkpoints)
        self._evals_log: Optional[dict] = None
        self._last_checkpoint_iteration: Optional[int] = None

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = CHECKPOINT_NAME) -> "xgboost.Booster":
        """The model a checkpoint of this callback holds (``filename`` as it was saved)."""
        import os

        with checkpoint.as_directory() as folder:
            booster = xgboost.Booster()
            booster.load_model(os.path.join(folder, filename))
            return booster

    def _save(self, model: "xgboost.Booster") -> Callable[[str], None]:
        return lambda path: model.save_model(path)

    def after_iteration(self, model: Any, epoch: int, evals_log: dict) -> bool:
        self._evals_log = evals_log
        settings = self._settings
        due = settings.frequency != 0 and (epoch + 1) % settings.frequency == 0
        report = settings.report_dict(evals_log, last_only=True)
        if due:
            self._last_checkpoint_iteration = epoch
        settings.report(report, self._save(model) if due else None)
        return False  # (True would stop the training)

    def after_training(self, model: Any) -> Any:
        settings = self._settings
        if not settings.checkpoint_at_end:
            return model
        if (self._last_checkpoint_iteration is not None
                and model.num_boosted_rounds() - 1 == self._last_checkpoint_iteration):
            return model  # its last round already carried a checkpoint
        report = settings.report_dict(self._evals_log, last_only=True) if self._evals_log \
            else {}
        settings.report(report, self._save(model))
        return model


class TuneReportCheckpointCallback(XGBoostReportCallback):
    """Reports each boosting round to ftnb, with checkpoints of the model (Ray Tune's name):
    ``metrics`` (a name, a list of names, or a dict {reported name: XGBoost's name}; None:
    all), ``filename``, ``frequency`` (rounds between checkpoints; 0: none during training),
    ``checkpoint_at_end``, ``results_postprocessing_fn`` (for ``xgboost.cv``)."""
