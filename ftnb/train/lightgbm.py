"""Ray Train's LightGBM callback (``ray.train.lightgbm.RayTrainReportCallback``): the same as
:class:`ftnb.integration.lightgbm.TuneReportCheckpointCallback`, except that in a group of
ranks only rank 0 saves the model into the checkpoint (every rank reports). ``pip install
'ftnb[lightgbm]'``."""

from __future__ import annotations

from ..integration.lightgbm import LightGBMReportCallback

__all__ = ["RayTrainReportCallback"]


class RayTrainReportCallback(LightGBMReportCallback):
    """Reports each boosting round, with checkpoints of the model saved by rank 0 (Ray Train's
    name; arguments as ``TuneReportCheckpointCallback``'s)."""

    _rank_zero_checkpoints = True
