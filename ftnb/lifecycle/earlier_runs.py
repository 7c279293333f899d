"""A finished experiment started again: ``Tuner(...).fit()`` with the ``RunConfig(name,
storage_path)`` of an experiment that ran to its end starts a new run, as Ray Tune does, and
keeps the earlier run whole beside it.

The earlier run's folder is renamed to ``<name>-<when it started>`` (``sweep-2026-12-06_02-46-21``,
then ``..._2`` if that is taken) in the same storage folder: every result, checkpoint and log
of it stays as it was, ``ftnb ls`` lists it under that name, and ``Tuner.restore`` or
``ftnb.attach`` read it there. The line printed says where it went. Nothing in it is
rewritten, its state included (which keeps the name it ran under: rewriting it would also
stretch its recorded run time to now).

Only a *finished* experiment (its stored status FINISHED or ERRORED: its driver ran it to the
end) is set aside, and only by a plain ``Tuner(...).fit()``: ``ftnb.run``, ``ftnb run`` and
``TorchTrainer.fit`` start *or resume* by name, and so return a finished experiment's results
as they are. An unfinished experiment (interrupted, or run by a live driver) is never moved:
its protection (:func:`~ftnb.lifecycle.plan_new.refuse_existing`, the owner lease) stands.

Ordering: the rename happens under the experiment's owner lease, so no other driver is inside
it; the lease then moves with the folder (marked released there) and a new one is taken at
the original place, where a driver that started meanwhile wins as any racing driver does.
Only on a local disk, where a rename is one atomic step; on an object store a finished
experiment is refused as before (a copy of every checkpoint, half done when a driver dies, is
no way to keep them).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING, Optional

from ..core.records import ExperimentState, ExperimentStatus
from ..storage import ExperimentPaths
from .stored import load_state

if TYPE_CHECKING:
    from ..storage.lease import Lease

__all__ = ["finished_state", "set_aside_finished"]


def finished_state(paths: ExperimentPaths) -> Optional[ExperimentState]:
    """The stored state at ``paths`` when it is an experiment that ran to its end and can be
    set aside here (a local disk); None otherwise."""
    if not paths.storage.is_local or not paths.has_state():
        return None
    state = load_state(paths, what="start a new experiment at")
    return state if ExperimentStatus(state.status).is_finished() else None


def set_aside_finished(paths: ExperimentPaths, lease: "Lease",
                       verbose: int = 1) -> "Lease":
    """Move the finished experiment at ``paths`` (whose lease ``lease`` this driver holds)
    aside to ``<name>-<started>`` and return the lease of the now empty place; ``lease``
    itself when there is nothing to set aside."""
    from ..storage.experiment_index import IndexEntryWriter
    from ..storage.lease import Lease

    state = finished_state(paths)
    if state is None:
        return lease
    earlier = _free_place(paths, state.created)
    os.rename(paths.dir, earlier.dir)
    # The lease moved with the folder: released there, as a driver that ended leaves it.
    Lease(earlier, dataclasses.replace(lease.info), None).release()
    IndexEntryWriter(earlier).update(state, final=True)
    if verbose:
        print(f"ftnb: experiment {paths.name!r} had finished ({state.status}); this fit() "
              f"starts a new run of it. The earlier run (every result and checkpoint) is kept "
              f"at {earlier.uri} (experiment {earlier.name!r}: ftnb ls lists it, "
              f"ftnb.Tuner.restore({earlier.uri!r}, trainable) reads it).", flush=True)
    return Lease.acquire(paths, what="start")


def _free_place(paths: ExperimentPaths, started: float) -> ExperimentPaths:
    storage, folder = paths.storage, paths.storage.parent(paths.dir)
    base = f"{paths.name}-{time.strftime('%Y-%m-%d_%H-%M-%S', time.localtime(started))}"
    place, n = ExperimentPaths.of(storage, base, folder), 1
    while storage.exists(place.dir):
        n += 1
        place = ExperimentPaths.of(storage, f"{base}_{n}", folder)
    return place
