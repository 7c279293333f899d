"""Running an experiment by its name: start it, or resume it when it is stored, with a
:class:`ftnb.Tuner` (what :func:`ftnb.launch`, its supervisor, ``ftnb run``, ``ftnb resume``
and ``TorchTrainer.fit`` call). The decision is :func:`ftnb.lifecycle.start_or_resume.
start_or_resume`; this front door gives it the Tuner.
"""

from __future__ import annotations

from typing import Any, Optional

from .lifecycle import start_or_resume as _by_name
from .tuner import Tuner

__all__ = ["start_or_resume"]


def start_or_resume(trainable: Any, **options: Any) -> tuple[Tuner, Optional[str]]:
    """The Tuner that starts experiment ``name`` or resumes it (then also the line that says
    so); the keyword arguments are those of :func:`ftnb.lifecycle.start_or_resume.
    start_or_resume` (``name``, ``param_space``, ``storage_path``, ``tune_config``,
    ``run_config``, ``resources_per_trial``, ``takeover``, ``restart_errored``,
    ``allow_different_trainable``, ``caller``)."""
    return _by_name.start_or_resume(Tuner, trainable, **options)
