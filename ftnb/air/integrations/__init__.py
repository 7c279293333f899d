"""Experiment trackers as logger callbacks, at Ray's import paths::

    from ftnb.air.integrations.mlflow import MLflowLoggerCallback
    from ftnb.air.integrations.wandb import WandbLoggerCallback

(also importable from :mod:`ftnb.logger` and as ``ftnb.MLflowLoggerCallback`` /
``ftnb.WandbLoggerCallback``).
"""
