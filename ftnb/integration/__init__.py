"""Ray Tune's framework integrations at Ray's import paths (``ray.tune.integration.*``):
:mod:`ftnb.integration.xgboost` and :mod:`ftnb.integration.lightgbm` (their
``TuneReportCheckpointCallback``). Each imports its library only when it is imported itself
(``pip install 'ftnb[xgboost]'`` / ``'ftnb[lightgbm]'``)."""
