"""Ray Train's XGBoost callback (``ray.train.xgboost.RayTrainReportCallback``): the same as
:class:`ftnb.integration.xgboost.TuneReportCheckpointCallback`, except that in a group of ranks
only rank 0 saves the model into the checkpoint (every rank reports). ``pip install
'ftnb[xgboost]'``."""

from __future__ import annotations

from ..integration.xgboost import XGBoostReportCallback

__all__ = ["RayTrainReportCallback"]


class RayTrainReportCallback(XGBoostReportCallback):
    """Reports each boosting round, with checkpoints of the model saved by rank 0 (Ray Train's
    name; arguments as ``TuneReportCheckpointCallback``'s)."""

    _rank_zero_checkpoints = True
