"""Ray Tune's LightGBM callback (``ray.tune.integration.lightgbm``), ``pip install
'ftnb[lightgbm]'``::

    import lightgbm
    from ftnb.integration.lightgbm import TuneReportCheckpointCallback

    def train_fn(config):
        lightgbm.train(config, train_set, valid_sets=[test_set], valid_names=["eval"],
                       callbacks=[TuneReportCheckpointCallback(
                           metrics={"loss": "eval-binary_logloss"}, frequency=1)])

Each boosting round is one ``ftnb.report`` (its metrics from LightGBM's evaluation results,
``"<valid name>-<metric>"``; ``lightgbm.cv``'s as ``"...-mean"`` and ``"...-stdv"``); every
``frequency`` rounds, and at the last round with ``checkpoint_at_end``, the report carries a
checkpoint holding the model (``filename``, ``model.txt`` by default), which
``TuneReportCheckpointCallback.get_model(checkpoint)`` loads.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .boosting import BoostingReport, missing_library

try:
    import lightgbm
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_library("lightgbm", "lightgbm",
                          "ftnb.integration.lightgbm (TuneReportCheckpointCallback)") from exc

__all__ = ["TuneReportCheckpointCallback"]


class LightGBMReportCallback:
    """Ray's ``RayReportCallback`` for LightGBM: the logic of both names (see the module)."""

    CHECKPOINT_NAME = "model.txt"
    #: Whether only rank 0 of a group saves checkpoints (the Train name).
    _rank_zero_checkpoints = False

    def __init__(self, metrics: Any = None, filename: str = CHECKPOINT_NAME, frequency: int = 0,
                 checkpoint_at_end: bool = True,
                 results_postprocessing_fn: Optional[Callable[[dict], dict]] = None) -> None:
        self._settings = BoostingReport(type(self).__name__, metrics, filename, frequency,
                                        checkpoint_at_end, results_postprocessing_fn,
                                        self._rank_zero_checkpoints)

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = CHECKPOINT_NAME) -> "lightgbm.Booster":
        """The model a checkpoint of this callback holds (``filename`` as it was saved)."""
        import os

        with checkpoint.as_directory() as folder:
            return lightgbm.Booster(model_file=os.path.join(folder, filename))

    @staticmethod
    def _eval_result(env: Any) -> dict:
        """LightGBM's results of this round as ``{valid name: {metric: value}}`` (a cv's as
        ``metric-mean`` and ``metric-stdv``)."""
        result: dict = {}
        for entry in env.evaluation_result_list:
            data_name, eval_name, value = entry[0:3]
            names = result.setdefault(data_name, {})
            if len(entry) > 4:
                names[eval_name + "-mean"] = value
                names[eval_name + "-stdv"] = entry[4]
            else:
                names[eval_name] = value
        return result

    def __call__(self, env: Any) -> None:
        settings = self._settings
        report = settings.report_dict(self._eval_result(env), last_only=False)
        at_end = settings.checkpoint_at_end and env.iteration == env.end_iteration - 1
        due = settings.frequency != 0 and (env.iteration + 1) % settings.frequency == 0
        model = env.model
        settings.report(report, (lambda path: model.save_model(path)) if at_end or due
                        else None)


class TuneReportCheckpointCallback(LightGBMReportCallback):
    """Reports each boosting round to ftnb, with checkpoints of the model (Ray Tune's name):
    ``metrics`` (a name, a list of names, or a dict {reported name: LightGBM's name}; None:
    all), ``filename``, ``frequency`` (rounds between checkpoints; 0: none during training),
    ``checkpoint_at_end``, ``results_postprocessing_fn`` (for ``lightgbm.cv``)."""
