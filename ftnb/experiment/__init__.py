"""Ray Tune's ``ray.tune.experiment`` names: :class:`Trial`, a trial as a resources allocation
function (``ResourceChangingScheduler``) sees it (see :mod:`ftnb.schedulers.trial_view`)."""

from __future__ import annotations

from ..schedulers.trial_view import Trial

__all__ = ["Trial"]
