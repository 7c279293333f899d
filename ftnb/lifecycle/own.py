"""Owning an experiment: once its owner lease is ours (:class:`ftnb.storage.lease.Lease`),
the previous driver is fenced out, what its trials started on this machine is ended, and what
it left half done in the folder is finished (:func:`take_over`); ``--takeover`` takes the
experiment from a driver at once (:func:`take_over_driver`, :func:`take_over_now`), killing
it first when it is stopped on this machine (:func:`end_stopped_driver`).
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

__all__ = ["end_stopped_driver", "end_strays_of_driver", "take_over", "take_over_driver",
           "take_over_now"]


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
    plan.missing_folders = lay_out_trial_folders(paths, state, only_missing=True)
    plan.state = state
    return state


def end_strays_of_driver(previous: Optional["LeaseInfo"]) -> None:
    """End what the trials of a driver that did not release its lease started on this machine
    (a server in its own session, a daemon): they outlive its trial processes, which die with
    it (:func:`ftnb.execution.process_tree.end_strays_of`)."""
    from ..system.processes import host_id

    if previous is not None and not previous.released and previous.host_id == host_id():
        from ..execution.process_tree import end_strays_of

        end_strays_of(previous.token)


def take_over_driver(paths: ExperimentPaths, what: str = "take over") -> Optional[str]:
    """What ``--takeover`` does before a resume (``ftnb resume --takeover``, ``%ftresume
    --takeover``, ``handle.resume(takeover=True)``): take the experiment from its driver at
    once (:func:`take_over_now`: the old driver is fenced by a new epoch, its
    trials on this machine killed) and return the line that says so; None when no live driver
    held it. Raises :class:`ftnb.ExperimentLockedError` while the driver is provably alive on
    this machine."""
    previous = take_over_now(paths, what)
    if previous is None:
        return None
    end_strays_of_driver(previous)
    silent = max(0.0, time.time() - previous.heartbeat)
    return (f"ftnb: took experiment {paths.name!r} over from its driver ({previous.describe()}, "
            f"last heartbeat {silent:.0f} s ago); should that driver wake up, it finds its lease "
            "taken and stops before writing anything more.")


def end_stopped_driver(paths: ExperimentPaths) -> None:
    """Before a takeover: SIGKILL the experiment's driver if it is stopped (SIGSTOP, Ctrl+Z) on
    this machine (its trials die with it; what they started is ended by the taker:
    :func:`end_strays_of_driver`). It may be stopped inside a heartbeat, holding the lease lock
    that the takeover needs (which would then wait forever), and continued it could only be a
    driver without a lease. A driver running on this machine is left alone (a takeover of it is
    refused: :func:`ftnb.storage.lease.refuse_takeover_of_live_driver`)."""
    from ..storage.lease import read_lease
    from ..system.processes import host_id, is_stopped, kill_and_wait

    current = read_lease(paths)
    if (current is None or current.released or current.host_id != host_id()
            or not is_stopped(current.pid)):
        return
    kill_and_wait(current.pid, current.pid_start)


def take_over_now(paths: ExperimentPaths, what: str = "take over") -> Optional["LeaseInfo"]:
    """Take the experiment from its driver at once, without waiting for its lease to expire,
    and leave it free for a resume: a new epoch and token fence the old driver (it, and its
    trials wherever they run, stop before their next write: :class:`ftnb.LeaseLostError`,
    :class:`ftnb.storage.lease.FencedError`), the driver is killed when it is stopped on this
    machine, and the lease is released (the caller ends the old trials' processes on this
    machine: :func:`take_over_driver`). Refused while the driver is provably alive on this
    machine (:func:`ftnb.storage.lease.refuse_takeover_of_live_driver`).

    Returns the lease taken over, or None when there was nothing to take (no owner, or one
    that released the experiment or is dead already)."""
    from ..storage.lease import Lease, fence_out, read_lease, refuse_takeover_of_live_driver

    current = read_lease(paths)
    if current is None or not current.liveness()[0]:
        return None
    refuse_takeover_of_live_driver(paths, current, what)
    end_stopped_driver(paths)
    lease = Lease.acquire(paths, takeover=True, what=what)
    try:
        fence_out(paths, lease.previous)
    finally:
        lease.release()
    return lease.previous
