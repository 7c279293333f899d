"""Ray Tune's ``ray.tune.execution.tune_controller`` name: :class:`TuneController`, what a
trial scheduler and a resources allocation function may ask of the controller (a protocol: the
object they get is the controller's view, see :mod:`ftnb.schedulers.trial_view`)."""

from __future__ import annotations

from ..schedulers.trial_view import TuneController

__all__ = ["TuneController"]
