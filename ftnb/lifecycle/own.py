"""Owning an experiment: once its owner lease is ours (:class:`ftnb.storage.lease.Lease`),
the previous driver is fenced out, what its trials started on this machine is ended, and what
it left half done in the folder is finished (:func:`take_over`); ``--takeover`` takes the
experiment from a driver at once (:func:`take_over_driver`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from ..core.records import ExperimentState
from ..core.trial_files import lay_out_trial_folders, remove_leftover_temps
from ..storage import ExperimentPaths
from .reconcile import note_fallbacks
from .stored import load_state

if TYPE_CHECKING:
    from ..storage.lease import Lease, LeaseInfo
    from .plan_restore import RestorePlan

__all__ = ["end_strays_of_driver", "take_over", "take_over_driver"]


def take_over(plan: RestorePlan, lease: "Lease") -> ExperimentState:
    """Once ``lease`` (the experiment's owner lease) is ours: make sure the previous driver's
    trials are gone, then re-read the state (``plan.state`` becomes the one read) and finish
    what a dead driver left in the folder: its temporary files are removed, the trials' own
    records merged in, and the trial folders it did not lay out created."""
    from ..storage.lease import fence_out

    paths = plan.paths
    # The dead (or taken over) driver's trials must be gone before anything of ours runs, so
    # no ghost writes after this point.
    fence_out(paths, lease.previous)
    end_strays_of_driver(lease.previous)
    # Re-read now that we own it: the state may have moved since plan_restore read it.
    state = load_state(paths)
    note_fallbacks(paths, state)
    remove_leftover_temps(paths, state)
    state.merge_trial_records(paths)
    lay_out_trial_folders(paths, state, only_missing=True)
    plan.state = state
    return state


def end_strays_of_driver(previous: Optional["LeaseInfo"]) -> None:
    """End what the trials of a driver that did not release its lease started on this machine
    (a server in its own session, a daemon): they outlive its trial processes, which die with
    it (:func:`ftnb.execution.process_tree.end_strays_of`)."""
    from ..storage.lease import host_id

    if previous is not None and not previous.released and previous.host_id == host_id():
        from ..execution.process_tree import end_strays_of

        end_strays_of(previous.token)


def take_over_driver(paths: ExperimentPaths, what: str = "take over") -> Optional[str]:
    """What ``--takeover`` does before a resume (``ftnb resume --takeover``, ``%ftresume
    --takeover``, ``handle.resume(takeover=True)``): take the experiment from its driver at
    once (:func:`ftnb.storage.lease.take_over_now`: the old driver is fenced by a new epoch, its
    trials on this machine killed) and return the line that says so; None when no live driver
    held it. Raises :class:`ftnb.ExperimentLockedError` while the driver is provably alive on
    this machine."""
    from ..storage.lease import take_over_now

    previous = take_over_now(paths, what)
    if previous is None:
        return None
    end_strays_of_driver(previous)
    silent = max(0.0, time.time() - previous.heartbeat)
    return (f"ftnb: took experiment {paths.name!r} over from its driver ({previous.describe()}, "
            f"last heartbeat {silent:.0f} s ago); should that driver wake up, it finds its lease "
            "taken and stops before writing anything more.")
