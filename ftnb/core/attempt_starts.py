"""Which trial starts next, and its attempt's start: :class:`AttemptStarts`, which the
controller holds.

PENDING trials wait in a queue: those that already made progress first (their work is the most
valuable), then in the experiment's order. A trial scheduler chooses first (it may resume a
trial it paused); a searcher is asked for a new trial only when one can start now, so that it
sees every result that came before. A trial starts when the executor has room for what it asks
(``ftnb.with_resources``, maybe a function of its config); an exploit decided for it is carried
out first, since its new config may ask for other resources. Its attempt resumes from its
latest checkpoint, with the rows up to it, as a typed
:class:`~ftnb.execution.contract.AttemptSpec`.
"""

from __future__ import annotations

import heapq
import time
from typing import TYPE_CHECKING, Any, Optional

from ..execution.contract import AttemptFence, AttemptSpec
from ..execution.resources import TrialResources
from ..schedulers.stop_criterion import stop_met
from . import exploits
from .live_attempt import LiveAttempt
from .records import AttemptRecord, ExperimentState, TrialRecord, TrialStatus
from .scheduling import Exploit

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["AttemptStarts"]


class AttemptStarts:
    """The queue of PENDING trials and the starts of their attempts, for ``controller`` (which
    owns the state, the executor and the running attempts)."""

    def __init__(self, controller: "Controller") -> None:
        self.controller = controller
        #: The PENDING trials in the order they start: ``(0 if resumed else 1, position, id)``,
        #: a heap. Entries of trials that are no longer PENDING are dropped when they come up.
        self._queue: list[tuple[int, int, str]] = []
        #: Ranks of the attempt about to start, by trial (an elastic group's size that fits).
        self._sizes: dict[str, int] = {}

    # -- the queue -----------------------------------------------------------------------------
    def queue_pending(self, state: ExperimentState) -> None:
        """Queue every PENDING trial of ``state`` (anew)."""
        self._queue = []
        for position, trial in enumerate(state.trials):
            if trial.status == TrialStatus.PENDING:
                self.enqueue(trial, position)

    def enqueue(self, trial: TrialRecord, position: Optional[int] = None) -> None:
        """Queue a PENDING trial to start. Trials that already made progress go first (their
        work is the most valuable), then in the experiment's order."""
        if position is None:
            position = self.controller.state.position(trial.trial_id)
        heapq.heappush(self._queue, (0 if trial.attempts else 1, position, trial.trial_id))

    def next_pending(self) -> Optional[TrialRecord]:
        """The PENDING trial to start next, or None; the queue is kept, so that no loop over
        every trial runs at each tick."""
        state, live = self.controller.state, self.controller.live
        while self._queue:
            trial = state.trial(self._queue[0][2])
            if trial.status == TrialStatus.PENDING and trial.trial_id not in live:
                return trial
            heapq.heappop(self._queue)  # started, or stopped, since it was queued
        return None

    # -- what starts ---------------------------------------------------------------------------
    def start_what_fits(self) -> None:
        """Start the trials that can start now: the scheduler's choices, then the queue's, then
        new ones from the searcher."""
        c = self.controller
        if c.scheduler is not None:
            self._start_chosen()
        while True:
            trial = self.next_pending()
            if trial is None:
                # The searcher is asked only when a trial can start now, so that it sees every
                # result that came before.
                if not c.may_search() or len(c.live) >= c.max_concurrent or (
                        not c.executor.has_room(c.resources, c.num_workers)):
                    return
                assert c.searched is not None
                trial = c.searched.suggest_trial()
                if trial is None:
                    return
            if len(c.live) >= c.max_concurrent:
                return
            if not self._has_room_for(trial):
                return
            heapq.heappop(self._queue)
            self._start_attempt(trial)

    def _start_chosen(self) -> None:
        """Start (or resume) the trials the scheduler chooses, while there is room; the
        PENDING trials it leaves go in the experiment's order (:meth:`start_what_fits`)."""
        c = self.controller
        while len(c.live) < c.max_concurrent:
            trial = c.scheduling.choose()
            if trial is None or not self._has_room_for(trial):
                return
            if trial.status == TrialStatus.PAUSED:
                trial.status = TrialStatus.PENDING.value
            elif self._queue and self._queue[0][2] == trial.trial_id:
                heapq.heappop(self._queue)  # (an entry left further back is skipped later)
            self._start_attempt(trial)

    def _has_room_for(self, trial: TrialRecord) -> bool:
        """Whether ``trial`` (not running) can start now. An exploit decided for it (a restore
        finishes one) is carried out first: its new config may ask for other resources."""
        exploit = self.controller.scheduling.exploit_due(trial)
        if exploit is not None:
            self.carry_out_exploit(trial, exploit)
        size = self.controller.resizing.size_to_start(trial, self.resources_of(trial))
        if size is None:
            return False
        self._sizes[trial.trial_id] = size  # the start that follows takes it
        return True

    # -- resources and configs -----------------------------------------------------------------
    def resources_of(self, trial: TrialRecord) -> TrialResources:
        """What each rank of ``trial``'s attempts asks for."""
        if trial.resource_changes:  # (a scheduler changed them: ResourceChangingScheduler)
            return TrialResources.from_user(trial.resource_changes[-1]["new"])
        c = self.controller
        return c.trial_resources.get(trial.trial_id, c.resources)

    def config_resources(self, trial_id: str, config: Any) -> Optional[TrialResources]:
        """What a trial with ``config`` asks for when ftnb.with_resources was given a function
        of the config (None otherwise)."""
        resources_of = getattr(self.controller.trainable, "_ftnb_resources_of", None)
        return resources_of(trial_id, config) if resources_of is not None else None

    def carry_out_exploit(self, trial: TrialRecord, exploit: Exploit) -> None:
        """Carry out the exploit decided for ``trial`` (see :mod:`ftnb.core.exploits`): it
        goes on from the donor's checkpoint with the new config, its record saying both at
        once. The decision is on disk first, so a driver killed meanwhile leaves it to the
        restore, which does it once."""
        c = self.controller
        if c.dirty:
            c.save(durable=False)
        if exploits.carry_out(c.paths, trial, exploit.decided, c.persist_trial, c.guard):
            donor = c.state.trial(exploit.donor_id)
            c.configs[trial.trial_id] = exploits.live_config(
                trial.config, c.configs.get(exploit.donor_id), donor.config)
            # ftnb.with_resources with a function of the config: its next attempt asks for
            # what the new config needs.
            request = self.config_resources(trial.trial_id, c.configs[trial.trial_id])
            if request is not None:
                c.trial_resources[trial.trial_id] = request
            c.trial_files.apply_retention(trial)
        c.scheduling.forget(trial.trial_id)
        c.dirty = True

    # -- an attempt's start --------------------------------------------------------------------
    def _start_attempt(self, trial: TrialRecord) -> None:
        # (A decided exploit was carried out by _has_room_for, which every start follows.)
        c = self.controller
        latest = trial.latest_checkpoint
        start_iteration = latest["iteration"] if latest else 0
        rows = c.trial_files.rows_up_to(trial, start_iteration)
        if rows and stop_met(rows[-1], c.run_config.stop):
            # It met its stop criterion at the report it would resume from (its driver died
            # before seeing it end): it is done, not run past its criterion.
            trial.iteration = start_iteration
            trial.last_result = rows[-1]
            c.complete(trial, TrialStatus.TERMINATED)
            c.persist_trial(trial)
            c.dirty = True
            return
        attempt = AttemptRecord(
            number=len(trial.attempts) + 1,
            started=time.time(),
            start_iteration=start_iteration,
            restored_from=latest["dir_name"] if latest else None,
            num_workers=self._sizes.pop(trial.trial_id, c.num_workers),
        )
        trial.attempts.append(attempt)
        c.resizing.started(trial, attempt.num_workers)
        trial.status = TrialStatus.RUNNING.value
        trial.iteration = start_iteration
        trial.last_result = rows[-1] if rows else None
        c.persist_trial(trial)
        spec = self._spec(trial, attempt, rows)
        c.live[trial.trial_id] = LiveAttempt(attempt.number)
        try:
            c.executor.start(spec)
        except BaseException:
            c.live.pop(trial.trial_id, None)
            raise
        # Saved by the throttle: a full save per start would make an experiment quadratic in its
        # trial count, and restore reconciles RUNNING trials from their result files anyway.
        c.dirty = True
        c.emit("on_trial_start", c.state, trial)

    def _spec(self, trial: TrialRecord, attempt: AttemptRecord, rows: list) -> AttemptSpec:
        """What the executor gets to run ``attempt`` of ``trial`` (from its latest checkpoint,
        with ``rows``, the results up to it)."""
        c = self.controller
        latest = trial.latest_checkpoint
        fence = None
        if c.lease is not None:
            fence = AttemptFence(**c.lease.fence_spec(), epoch=c.lease.info.epoch)
        return AttemptSpec(
            trial_id=trial.trial_id,
            attempt=attempt.number,
            trainable=c.trainable,
            config=c.configs[trial.trial_id],
            storage=c.storage,
            experiment_dir=c.paths.dir,
            experiment_name=c.state.name,
            trial_dir_name=trial.dir_name,
            trial_name=trial.name,
            resources=self.resources_of(trial),
            num_workers=attempt.num_workers,
            restore_checkpoint=latest["dir_name"] if latest else None,
            start_iteration=attempt.start_iteration,
            time_offset_s=latest.get("time_total_s", 0.0) if latest else 0.0,
            next_checkpoint_index=trial.next_checkpoint_index,
            rows=rows,
            stop=c.run_config.stop,
            checkpoint_score_attribute=c.checkpoint_config.checkpoint_score_attribute,
            metric=c.state.settings.get("metric"),
            preemption_grace_period_s=c.failure_config.preemption_grace_period_s,
            fence=fence,
            collective_timeout_s=c.collective_timeout_s,
            decision_points=c.scheduling.decision_points(trial),
            storage_wait_s=c.failure_config.storage_wait_s,
            ranked_metrics=self.ranked_metrics(),
        )

    def ranked_metrics(self) -> tuple[tuple[str, str], ...]:
        """The metrics that rank the trials, each with who ranks by it: TuneConfig's, the
        scheduler's, the searcher's (a multi-objective one's each); each metric once."""
        c = self.controller
        named: dict[str, str] = {}
        metric = c.state.settings.get("metric")
        if isinstance(metric, str):
            named[metric] = f"TuneConfig(metric={metric!r})"
        searcher = getattr(c.search, "searcher", None)
        for ranker in (c.scheduler, searcher):
            metrics = getattr(ranker, "metric", None)
            for one in [metrics] if isinstance(metrics, str) else (metrics or []):
                if isinstance(one, str):
                    named.setdefault(one, f"{type(ranker).__name__}(metric={one!r})")
        return tuple(named.items())
