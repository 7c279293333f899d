"""Restoring an experiment from its folder alone: the names ``Tuner.restore`` is built from,
kept at this path for the code that imports them here. Each step lives in
:mod:`ftnb.lifecycle`, in the order it happens:

1. Finding it (:mod:`ftnb.lifecycle.stored`): :func:`load_state`, :func:`can_restore`.
2. Planning, writing nothing (:mod:`ftnb.lifecycle.plan_restore`, with the stored objects
   re-bound in :mod:`ftnb.lifecycle.rebinding`): :func:`plan_restore` gives a
   :class:`RestorePlan`.
3. Owning it (:mod:`ftnb.lifecycle.own`): the lease taken, the previous driver fenced out and
   what it left ended (:func:`take_over`, :func:`take_over_driver`).
4. Reconciling its trials with their files (:mod:`ftnb.lifecycle.reconcile`):
   :func:`resume_trials`. The controller then runs the trials like any others
   (:mod:`ftnb.lifecycle.run`).
"""

from __future__ import annotations

from .lifecycle.own import end_strays_of_driver, take_over, take_over_driver  # noqa: F401
from .lifecycle.plan_restore import (  # noqa: F401 (private names kept for their importers)
    _STORED_STOP,
    RestoreFlags,
    RestorePlan,
    _from_settings,
    _restored_searcher,
    _stored_tune_config,
    plan_restore,
    restored_scheduler,
)
from .lifecycle.rebinding import (  # noqa: F401
    _LEGACY_OBJECT,
    bind_configs,
    missing_objects_message,
    needed_objects,
    space_differences,
    stored_configs,
    with_originals,
)
from .lifecycle.reconcile import note_fallbacks, resume_trials
from .lifecycle.stored import (  # noqa: F401
    DifferentTrainableError,
    RestoreError,
    _path_str,
    _read_state,
    can_restore,
    check_same_trainable,
    describe_location,
    load_state,
    refuse_remains,
    remains_of_experiment,
)

__all__ = [
    "DifferentTrainableError",
    "RestoreError",
    "RestoreFlags",
    "RestorePlan",
    "bind_configs",
    "can_restore",
    "check_same_trainable",
    "describe_location",
    "load_state",
    "missing_objects_message",
    "needed_objects",
    "note_fallbacks",
    "plan_restore",
    "refuse_remains",
    "remains_of_experiment",
    "resume_trials",
    "space_differences",
    "stored_configs",
    "take_over",
    "take_over_driver",
    "with_originals",
]
