"""Elastic groups (``ScalingConfig(num_workers=(min, max))``): how many ranks each attempt of a
trial gets, when a running group grows, and the record of every re-form.

The controller asks :class:`GroupResizing` three things and carries out its answers:

* :meth:`~GroupResizing.size_to_start` when a trial may start: the most ranks up to its target
  that fit now (the target is ``max``, or after a lost rank the ranks that remain), never fewer
  than ``min``; None while ``min`` do not fit (the trial waits, PENDING, saying so in its note).
* :meth:`~GroupResizing.tick` at each turn of the loop: every ``resize_interval_s`` a healthy
  group smaller than ``max`` with room for another rank is asked to checkpoint at its next report
  with a checkpoint and end (the executor's ``request_resize``): a graceful re-form, never a
  failure.
* :meth:`~GroupResizing.ended` when an attempt ends: a resize the controller asked for puts the
  trial back in the queue (True: the controller does nothing more); a failure lowers the target
  to the ranks that survived it (the failure itself is counted by the policy, as Ray counts it).

Every change of size between two attempts is an entry of the trial's record (``resizes``:
``{"reason", "old_size", "new_size", "time", "attempt", "mode"}``), which ``ftnb status``, the
widget and the panel show. Ranks are new processes at every re-form (``mode: "cold"``).

Sizes live in the driver only: a restored experiment starts each trial's group at what fits,
up to ``max``, as Ray Train does after a driver restart.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from .records import TrialRecord

if TYPE_CHECKING:
    from ..execution.contract import ExitEvent
    from .controller import Controller
    from .live_attempt import LiveAttempt

__all__ = ["GroupResizing", "LOST_RANK_ENDINGS", "elastic_sizes"]

#: How a rank of a failed group ended when it is lost (it must be replaced); the others
#: (``peer``, ``stopped``, ``clean``) survived the failure.
LOST_RANK_ENDINGS = frozenset({"error", "signal", "hung", "exit"})

#: How the note of an elastic trial that waits for its min to fit begins.
WAITING = "waiting for"

#: Why a group changed size (the ``reason`` of a ``resizes`` entry).
REASON_LOST = "rank lost"
REASON_GROW = "capacity returned"
REASON_START = "capacity at start"
REASON_FEWER = "fewer fit"


class GroupResizing:
    """The sizes of an experiment's elastic groups (see the module docstring). With a fixed
    ``num_workers`` it answers ``num_workers`` and does nothing else."""

    def __init__(self, controller: "Controller", min_workers: int, max_workers: int,
                 resize_interval_s: float) -> None:
        self.controller = controller
        self.min_workers = min_workers
        self.max_workers = max(max_workers, min_workers)
        self.resize_interval_s = resize_interval_s
        #: Ranks the next attempt of a trial aims for, and why, when below ``max``.
        self._targets: dict[str, tuple[int, str]] = {}
        #: When each running group last looked for room to grow (time.monotonic()).
        self._looked: dict[str, float] = {}

    @property
    def elastic(self) -> bool:
        return self.max_workers > self.min_workers

    # -- starting ------------------------------------------------------------------------------
    def size_to_start(self, trial: TrialRecord, resources: Any) -> Optional[int]:
        """The ranks ``trial``'s next attempt starts with now; None while fewer than ``min``
        fit."""
        executor = self.controller.executor
        if not self.elastic:
            size = self.fixed_size(trial)
            return size if executor.has_room(resources, size) else None
        target = self._targets.get(trial.trial_id, (self.max_workers, REASON_GROW))[0]
        for size in range(target, self.min_workers - 1, -1):
            if _has_room(executor, resources, size):
                if trial.note and trial.note.startswith(WAITING):
                    trial.note = None
                return size
        note = (f"{WAITING} {self.min_workers} ranks (its min) to fit; other trials hold the "
                "rest")
        if trial.note != note and not trial.note:
            trial.note = note
            self.controller.dirty = True
        return None

    def fixed_size(self, trial: TrialRecord) -> int:
        """The ranks of a trial of a fixed-size group: its own when the trainable says so for
        its config (a Tuner searching a trainer's ScalingConfig(num_workers=...): the
        trainable's ``_ftnb_ranks_of(config)``), else the experiment's."""
        c = self.controller
        ranks_of = getattr(c.trainable, "_ftnb_ranks_of", None)
        size = ranks_of(c.configs.get(trial.trial_id)) if ranks_of is not None else None
        return size or self.min_workers

    def started(self, trial: TrialRecord, size: int) -> None:
        """``trial``'s attempt started with ``size`` ranks: record a change of size."""
        if not self.elastic:
            return
        self._looked[trial.trial_id] = time.monotonic()
        before = [a.num_workers for a in trial.attempts[:-1]]
        old = before[-1] if before else self.max_workers
        if old == size:
            return
        target = self._targets.get(trial.trial_id)
        if size > old:
            reason = REASON_GROW
        elif target is not None and target[1] == REASON_LOST:
            reason = REASON_LOST if size == target[0] else f"{REASON_LOST}; {REASON_FEWER}"
        else:  # its first attempt, or a restart (a preemption, a restored driver)
            reason = REASON_FEWER if before else REASON_START
        trial.resizes.append({"reason": reason, "old_size": old, "new_size": size,
                              "time": time.time(), "attempt": trial.attempts[-1].number,
                              "mode": "cold"})

    # -- growing -------------------------------------------------------------------------------
    def tick(self) -> None:
        """Ask the healthy running groups smaller than ``max`` that have room for another rank
        (looked at every ``resize_interval_s``) to checkpoint and re-form bigger."""
        if not self.elastic:
            return
        c = self.controller
        request = getattr(c.executor, "request_resize", None)
        now = time.monotonic()
        for trial_id, live in c.live.items():
            size = c.state.trial(trial_id).attempts[-1].num_workers
            if (request is None or size >= self.max_workers or live.resizing
                    or live.stop_requested_at is not None or live.preempted or live.errors
                    or not live.reported
                    or now - self._looked.get(trial_id, now) < self.resize_interval_s):
                continue
            self._looked[trial_id] = now
            if _has_room(c.executor, c.starts.resources_of(c.state.trial(trial_id)), 1):
                live.resizing = True
                self._targets.pop(trial_id, None)
                request(trial_id)

    # -- ending --------------------------------------------------------------------------------
    def ended(self, trial: TrialRecord, live: "LiveAttempt", exit_event: "ExitEvent",
              error: Any) -> bool:
        """``trial``'s attempt ended: True when it was a resize the controller asked for (the
        trial is queued again and persisted, nothing counted); after a failure, the next attempt aims for the
        ranks that survived it."""
        if not self.elastic:
            return False
        self._looked.pop(trial.trial_id, None)
        if live.resizing and error is None and not self.controller.stopping \
                and live.outcome == "preempted":
            trial.attempts[-1].outcome = "resized"
            trial.status = "PENDING"
            self.controller.starts.enqueue(trial)
            self.controller.persist_trial(trial)
            self.controller.dirty = True
            return True
        ranks = exit_event.ranks
        if len(ranks) > 1:
            from .attempt_ends import rank_entries

            lost = sum(1 for e in rank_entries(exit_event, live.errors)
                       if e["ended"] in LOST_RANK_ENDINGS)
            if lost:
                survivors = max(len(ranks) - lost, self.min_workers)
                self._targets[trial.trial_id] = (survivors, REASON_LOST)
        return False


def elastic_sizes(min_workers: int, elastic: Optional[dict]) -> tuple[int, float]:
    """``(max_workers, resize_interval_s)`` of what the state records of an elastic group
    (``settings["elastic"]``); a fixed group of ``min_workers`` without it."""
    if not elastic:
        return min_workers, 60.0
    return (int(elastic.get("max_workers") or min_workers),
            float(elastic.get("resize_interval_s") or 60.0))


def _has_room(executor: Any, resources: Any, size: int) -> bool:
    """Whether ``size`` more ranks of ``resources`` fit now (False for a size that can never fit
    this executor's machine or cluster)."""
    try:
        return bool(executor.has_room(resources, size))
    except ValueError:
        return False
