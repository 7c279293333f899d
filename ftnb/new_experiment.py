"""A new experiment: what is checked before its folder is touched, its first state, and the
rule that none starts where an experiment is already stored. The names live in
:mod:`ftnb.lifecycle.plan_new`; this path keeps them for the code that imports them here.
"""

from __future__ import annotations

from .lifecycle.plan_new import (  # noqa: F401 (private names kept for their importers)
    NewExperiment,
    NewExperimentPlan,
    _default_name,
    _max_concurrent,
    initial_state,
    plan_new_experiment,
    plan_search,
    refuse_existing,
)

__all__ = ["NewExperimentPlan", "initial_state", "plan_new_experiment", "refuse_existing"]
