"""What XGBoost's and LightGBM's report callbacks share (Ray's ``RayReportCallback`` logic,
imported by neither library): the arguments, checked before training starts; the metrics of an
iteration picked (a list) or renamed (a dict) from the library's evaluation log, flattened with
``-`` (``"eval-logloss"``) and post-processed; and the report, with a checkpoint holding the
model saved under ``filename`` when due (only rank 0's in a group, for the Train names)."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Optional

from ..storage.result_log import flatten_row

__all__ = ["BoostingReport", "missing_library"]


def missing_library(module: str, extra: str, what: str) -> ImportError:
    """The error for ``what`` when ``module`` is not installed: the extra that brings it."""
    return ImportError(f"{what} needs the {module!r} package, which is not installed. Fix: pip "
                       f"install 'ftnb[{extra}]' (or pip install {module}).")


class BoostingReport:
    """The settings and the report of one boosting callback (``owner`` names it in errors)."""

    def __init__(self, owner: str, metrics: Any, filename: str, frequency: int,
                 checkpoint_at_end: bool, results_postprocessing_fn: Optional[Callable],
                 rank_zero_checkpoints: bool) -> None:
        if isinstance(metrics, str):
            metrics = [metrics]
        ok = metrics is None or (isinstance(metrics, list) and all(
            isinstance(m, str) for m in metrics)) or (isinstance(metrics, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in metrics.items()))
        if not ok:
            raise TypeError(
                f"{owner}(metrics={metrics!r}) must be a metric name, a list of them, or a dict "
                "{name to report: the library's metric}. Fix: e.g. metrics={'loss': "
                "'eval-logloss'}.")
        if not isinstance(filename, str) or not filename or os.sep in filename:
            raise ValueError(f"{owner}(filename={filename!r}) must be a plain file name. Fix: "
                             "e.g. filename='model.ubj'.")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ValueError(f"{owner}(frequency={frequency!r}) must be a whole number >= 0 "
                             "(0: no checkpoints during training).")
        if not isinstance(checkpoint_at_end, bool):
            raise TypeError(f"{owner}(checkpoint_at_end={checkpoint_at_end!r}) must be True or "
                            "False.")
        if results_postprocessing_fn is not None and not callable(results_postprocessing_fn):
            raise TypeError(f"{owner}(results_postprocessing_fn={results_postprocessing_fn!r})"
                            " must be a function of the metrics dict returning a dict.")
        self.owner = owner
        self.metrics = metrics
        self.filename = filename
        self.frequency = frequency
        self.checkpoint_at_end = checkpoint_at_end
        self.postprocess = results_postprocessing_fn
        self.rank_zero_checkpoints = rank_zero_checkpoints

    def report_dict(self, evals_log: dict, last_only: bool) -> dict:
        """The metrics to report from the evaluation log ``evals_log`` (nested dicts), flattened
        with ``-``; ``last_only``: its values are histories, whose last entry is reported."""
        flat = flatten_row(dict(evals_log), sep="-")
        if last_only:
            flat = {k: v[-1] if isinstance(v, (list, tuple)) and v else v
                    for k, v in flat.items()}
        if not self.metrics:
            picked = flat
        else:
            names = self.metrics if isinstance(self.metrics, dict) else {m: m for m in self.metrics}
            missing = [source for source in names.values() if source not in flat]
            if missing:
                from ..session import UsageError

                raise UsageError(
                    f"{self.owner}(metrics=...) names {missing[0]!r}, which the library does not "
                    f"log (it logs: {', '.join(sorted(flat)) or 'nothing'}). Fix: name one of "
                    "those (its evals name, a dash, the metric: 'eval-logloss').")
            picked = {key: flat[source] for key, source in names.items()}
        return self.postprocess(picked) if self.postprocess else picked

    def report(self, metrics: dict, save_model: Optional[Callable[[str], None]]) -> None:
        """``ftnb.report(metrics)``, with a checkpoint of the model (``save_model(path)`` writes
        it) when given, on rank 0 only for a Train callback."""
        import ftnb

        if save_model is not None and self.rank_zero_checkpoints \
                and ftnb.get_context().get_world_rank() != 0:
            save_model = None
        if save_model is None:
            ftnb.report(metrics)
            return
        with tempfile.TemporaryDirectory() as folder:
            save_model(os.path.join(folder, self.filename))
            ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(folder))
