"""How an experiment stops when its storage refuses a write (a full disk, a read-only mount, a
forbidden bucket): :class:`StorageStop`.

Retrying into such a storage helps nobody, so the first refusal, the driver's own or a trial's,
stops the experiment: no attempt starts any more, running trials end at their next report,
the experiment ends INTERRUPTED with the fault recorded (``ExperimentState.storage_fault``),
and the line that resumes it once the storage is fixed is said. Only the first fault is
recorded: the rest follow from it. The driver holds a little space in the experiment's folder
(the space reserve) from its start, and frees it at the first fault, so that the records that
say what happened still fit on a full disk.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional

from ..config import FailureConfig
from ..storage import ExperimentPaths
from ..storage.faults import StorageFault, is_storage_fault, storage_fault, waiting_out_faults
from . import policy
from .records import ExperimentState, TrialStatus

__all__ = ["StorageStop"]


class StorageStop:
    """The storage faults of one driver session: its space reserve, the first fault, and the
    stop it causes (through ``stop``, the controller's, with :data:`policy.STORAGE_FAULT`).

    ``stopping`` says why the experiment is already stopping (None: it is not): a write of a
    stopping driver does not wait out an outage. ``changed`` marks the state as needing a
    save."""

    def __init__(self, paths: ExperimentPaths, state: ExperimentState,
                 failure_config: FailureConfig, *, stop: Callable[[str], None],
                 stopping: Callable[[], Optional[str]], changed: Callable[[], None]) -> None:
        self.paths = paths
        self.storage = paths.storage
        self.state = state
        state.storage_fault = None  # (a fault that stopped an earlier driver was fixed since)
        self.failure_config = failure_config
        self._stop = stop
        self._stopping = stopping
        self._changed = changed
        self._reserved = False  # whether the driver holds space in the experiment's folder

    def reserve(self) -> None:
        """Hold space for the driver's last words should the disk fill (released at the first
        fault, or by :meth:`release`)."""
        self._reserved = self.storage.reserve_space(self.paths.space_reserve)

    def release(self) -> None:
        """Free the space reserve, if it is held."""
        if self._reserved:
            self._reserved = False
            self.storage.release_space(self.paths.space_reserve)

    def fault(self, fault: Any, trial_id: Optional[str] = None) -> None:
        """The storage refused a write (``fault``: a :class:`~ftnb.storage.faults.StorageFault`,
        or a trial's record of one): record it (the first only), free the reserve, say so and
        stop the experiment."""
        if self.state.storage_fault is not None:
            return
        if isinstance(fault, StorageFault):
            record = {**fault.as_dict(), "message": str(fault)}
        else:
            record = dict(fault)
        record.update(trial_id=trial_id, time=time.time())
        self.release()  # room for the records that say what happened
        self.state.storage_fault = record
        self._changed()
        whose = f"trial {trial_id}'s" if trial_id else "the driver's"
        print(f"\nftnb: {whose} storage refused a write: {record.get('message')}\nftnb: "
              f"stopping experiment {self.state.name!r}: no trial starts; running trials "
              "end at their next report.", file=sys.stderr, flush=True)
        self._stop(policy.STORAGE_FAULT)

    def tolerating(self, write: Callable[[], Any]) -> None:
        """``write()``; a storage fault it raises stops the experiment (once) and is otherwise
        swallowed: the driver goes on draining its trials and saves what it can."""
        try:
            waiting_out_faults(
                write, None if self._stopping() else self.failure_config.storage_wait_s,
                "the driver")
        except OSError as exc:
            if not is_storage_fault(exc):
                raise
            self.fault(storage_fault(exc))

    def say(self, resume_hint: Optional[str]) -> None:
        """Print why the experiment stopped, how far it got, and how to resume it."""
        fault = self.state.storage_fault or {}
        counts = self.state.counts()
        done = counts.get(TrialStatus.TERMINATED.value, 0) + counts.get(
            TrialStatus.ERRORED.value, 0)
        print(f"\nftnb: experiment {self.state.name!r} stopped: its storage refused a write.\n"
              f"    {fault.get('message')}\n"
              f"ftnb: {done} of {len(self.state.trials)} trials finished; the others were "
              "paused with their checkpoints, every acknowledged report kept. Once the "
              "storage is fixed, resume it with:\n"
              f"    {resume_hint or 'the same call again'}",
              file=sys.stderr, flush=True)
