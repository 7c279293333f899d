"""The controller loop: schedule attempts, handle their events, apply the failure policy, and
persist the experiment state.

The loop is single-threaded and owns the experiment state. It knows nothing of a machine: it
hands an :class:`~ftnb.execution.contract.Executor` typed attempt specifications and reads back
typed events; the executor owns processes, resources, environments and output files. Every
decision (retry, preemption, repeated error, fail-fast, retention) comes from
:mod:`ftnb.core.policy` and is carried out here; the trials' files are kept in line with their
records by :class:`~ftnb.core.trial_files.TrialFiles`. UIs are listeners: they are told what
happened and never steer. Restoring an experiment (bringing its records up to date before this
loop runs) is :mod:`ftnb.restore`'s.
"""

from __future__ import annotations

import heapq
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from ..config import RunConfig, metric_value
from ..execution.contract import (
    AttemptEvent,
    AttemptFence,
    AttemptSpec,
    DoneEvent,
    ErrorEvent,
    EventKind,
    Executor,
    ExitEvent,
    OutputEvent,
    ResultEvent,
    StartedEvent,
)
from ..execution.resources import TrialResources
from ..storage import ExperimentPaths, TrialPaths, checkpoint_index
from ..storage.control import STOP_TRIAL, ControlInbox
from ..storage.faults import StorageFault, is_storage_fault, storage_fault, waiting_out_faults
from ..storage.lease import Lease, LeaseLostError
from . import exploits, policy
from .hang_watch import silent_attempts
from .index_upkeep import index_entry_writer
from .records import (
    AttemptRecord,
    ExperimentState,
    ExperimentStatus,
    FailureKind,
    FailureRecord,
    TrialRecord,
    TrialStatus,
    encode_value,
    parse_trial_record,
)
from .searching import FINISHED, PersistedSearcher
from .trial_files import TrialFiles

__all__ = ["Controller", "ExperimentListener"]

STATE_SAVE_INTERVAL_S = 1.0

#: Set (True) on a KeyboardInterrupt once the controller printed the line that resumes the
#: experiment: a script that does not catch it has nothing more to say.
RESUME_LINE_PRINTED = "_ftnb_resume_line_printed"


def say_interrupted(exc: KeyboardInterrupt, name: str, resume_hint: str, what: str) -> None:
    """Print the line that resumes the interrupted experiment ``name`` (``what`` says what was
    done), and mark ``exc`` so that a script that does not catch it ends on that line."""
    print(f"\nftnb: experiment {name!r} interrupted; {what}. Resume it with:\n    {resume_hint}",
          file=sys.stderr, flush=True)
    setattr(exc, RESUME_LINE_PRINTED, True)  # see Tuner.fit


class ExperimentListener(Protocol):
    """What a UI may be told. Every method is optional (see :class:`NullListener`)."""

    def on_experiment_start(self, state: ExperimentState) -> None: ...
    def on_trial_start(self, state: ExperimentState, trial: TrialRecord) -> None: ...
    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None: ...
    def on_trial_failure(
        self, state: ExperimentState, trial: TrialRecord, failure: FailureRecord
    ) -> None: ...
    def on_trial_complete(self, state: ExperimentState, trial: TrialRecord) -> None: ...
    def on_output(self, trial_id: str, stream: str, text: str) -> None: ...
    def on_tick(self, state: ExperimentState) -> None: ...
    def on_experiment_end(self, state: ExperimentState) -> None: ...


class NullListener:
    """The do-nothing listener; subclass it and override what you need."""

    def on_experiment_start(self, state: ExperimentState) -> None:
        pass

    def on_trial_start(self, state: ExperimentState, trial: TrialRecord) -> None:
        pass

    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None:
        pass

    def on_trial_failure(
        self, state: ExperimentState, trial: TrialRecord, failure: FailureRecord
    ) -> None:
        pass

    def on_trial_complete(self, state: ExperimentState, trial: TrialRecord) -> None:
        pass

    def on_output(self, trial_id: str, stream: str, text: str) -> None:
        pass

    def on_tick(self, state: ExperimentState) -> None:
        pass

    def on_experiment_end(self, state: ExperimentState) -> None:
        pass


@dataclass
class _Live:
    """What the controller tracks about a running attempt, beyond the persisted record."""

    attempt: int
    errors: dict[int, ErrorEvent] = field(default_factory=dict)  # by rank, first each
    outcome: Optional[str] = None
    preempted: bool = False
    stop_requested_at: Optional[float] = None
    reported: bool = False  # a result of this attempt arrived
    #: The scheduler paused the trial: its attempt ends at a report, the trial waits PAUSED.
    pausing: bool = False
    #: When (time.monotonic()) the attempt's process started (None: not yet; on Ray it may
    #: wait for room) or last reported: FailureConfig(hang_timeout_s) counts from there; and
    #: how long it had been silent, once killed for it.
    heard_at: Optional[float] = None
    silent_for_s: Optional[float] = None


class Controller:
    """Runs one experiment to completion (or until stopped) on an executor."""

    def __init__(
        self,
        *,
        paths: ExperimentPaths,
        state: ExperimentState,
        trainable: Any,
        configs: dict[str, Any],
        run_config: RunConfig,
        max_concurrent: Optional[int],
        resources: TrialResources,
        executor: Executor,
        listeners: list[Any],
        lease: Optional[Lease] = None,
        resume_hint: Optional[str] = None,
        control: Optional[ControlInbox] = None,
        num_workers: int = 1,
        collective_timeout_s: float = 30.0,
        search: Optional[PersistedSearcher] = None,
        scheduler: Any = None,
    ) -> None:
        self.paths = paths
        self.storage = paths.storage
        self.state = state
        state.storage_fault = None  # (a fault that stopped an earlier driver was fixed since)
        self.trainable = trainable
        self.configs = configs
        self.run_config = run_config
        self.failure_config = run_config.failure_config
        self.checkpoint_config = run_config.checkpoint_config
        self.max_concurrent = max_concurrent or sys.maxsize
        self.resources = resources
        #: Requests of single trials that differ from ``resources`` (ftnb.with_resources with
        #: a function of the config), by trial id.
        self.trial_resources: dict[str, TrialResources] = {}
        #: Ranks per attempt (a group: TorchTrainer), each asking for ``resources``.
        self.num_workers = num_workers
        self.collective_timeout_s = collective_timeout_s
        self.executor = executor
        self.listeners = listeners
        #: The search algorithm that makes the trials as they can start (TuneConfig(search_alg=
        #: ...), num_samples=-1), its state kept in the experiment's folder; None when every
        #: trial was made when the experiment started.
        self.search = search
        if search is not None:
            self.listeners = [_SearchResults(search), *listeners]
        #: Fills in a trial the searcher made (its name and folder name; returns its resources
        #: when they are a function of its config): set by the Tuner.
        self.trial_setup: Optional[Callable[[TrialRecord, Any], Optional[TrialResources]]] = None
        #: Why no more trials are asked for (a time budget, a searcher that cannot go on).
        self.search_ended: Optional[str] = None
        #: Trials the searcher made that the state on disk does not list yet: its file keeps
        #: their suggestions until a save lists them (a restore records them from there).
        self._unlisted: list[str] = []
        self._adopting = False
        self.lease = lease
        self.resume_hint = resume_hint
        self.control = control
        #: The trials' files kept in line with their records (result rows a restarted attempt
        #: redoes, checkpoint debris, retention); restore uses it before the loop runs.
        self.trial_files = TrialFiles(paths, run_config.checkpoint_config, lease)
        #: The experiment's entry in its storage folder's index (what listings read).
        self.index_entry = index_entry_writer(paths, lease)
        #: The trial scheduler (TuneConfig(scheduler=...), :mod:`ftnb.schedulers`): None for
        #: the default, every trial to its end in order (no decision points, nothing saved).
        self.scheduler = scheduler
        self._scheduler_view = _SchedulerView(self)
        #: What the state records besides the scheduler's own state: per trial, the last
        #: training_iteration it was fed (every trial it knows); the STOP and PAUSE decisions
        #: made and not yet shown by the trial's status; the trials it was told ended.
        self._fed: dict[str, int] = {}
        self._decided: dict[str, dict] = {}
        self._told_ended: set[str] = set()
        #: Answers owed to reports that wait for a decision: (trial id, iteration, answer),
        #: given once the state that holds the decisions is saved.
        self._answers: list[tuple[str, int, str]] = []
        #: Whether the scheduler was brought up to date with the stored experiment (until then
        #: a save keeps the stored record: a restore saves before the loop runs).
        self._scheduler_ready = False
        self.live: dict[str, _Live] = {}
        self._reserved = False  # whether the driver holds space in the experiment's folder
        self.stopping: Optional[str] = None  # None, or why the experiment is being stopped
        self._dirty = False
        self._last_save = 0.0
        #: Ids of the trials persisted since the last save (see ExperimentState.save_changes).
        self._changed: set[str] = set()
        #: The PENDING trials in the order they start: ``(0 if resumed else 1, position, id)``,
        #: a heap. Entries of trials that are no longer PENDING are dropped when they come up.
        self._queue: list[tuple[int, int, str]] = []

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> ExperimentState:
        """Run the experiment until every trial is done or it is stopped; the executor is shut
        down when this returns or raises."""
        try:
            return self._run()
        finally:
            self.executor.shutdown()

    def _run(self) -> ExperimentState:
        # Space for the driver's last words should the disk fill (released at the first fault).
        self._reserved = self.storage.reserve_space(self.paths.space_reserve)
        try:
            return self._run_reserved()
        finally:
            if self._reserved:
                self.storage.release_space(self.paths.space_reserve)

    def _run_reserved(self) -> ExperimentState:
        self.state.begin_driver_session()
        if self.scheduler is not None:
            self._restore_scheduler()
        self._queue = []
        for position, trial in enumerate(self.state.trials):
            if trial.status == TrialStatus.PENDING:
                self._enqueue(trial, position)
        if self.search is not None:
            # A restore: the trials of the suggestions that the state does not list are
            # recorded first (from their own record when they got that far); then the searcher
            # hears what it missed.
            self.search.guard = self._guard
            listed = {t.trial_id for t in self.state.trials}
            self._adopting = True  # (recover tells their results before their outcomes)
            for trial_id, config, dir_name in self.search.unlisted(listed):
                self._adopt(trial_id, config, dir_name)
            self._adopting = False
            self.search.recover(self.state.trials, self._rows_of)
        self._emit("on_experiment_start", self.state)
        try:
            while True:
                try:
                    if self._step():
                        break
                except OSError as exc:
                    # The storage refused one of the driver's own writes: not a crash. The
                    # experiment stops as when a trial's write was refused (see _storage_fault).
                    if not is_storage_fault(exc):
                        raise
                    self._storage_fault(storage_fault(exc))
        except BaseException as exc:
            self._interrupt(exc)
            raise
        self.state.status = self._final_status()
        if self.search is not None and not self._may_search() and (
                self.state.status != ExperimentStatus.INTERRUPTED):
            # The search is over for good: what the searcher asked for and no trial ever
            # recorded (the driver died in between, and none was asked for again) is closed.
            self.search.close({t.trial_id for t in self.state.trials})
        self.save(final=True)
        self._emit("on_experiment_end", self.state)
        if self.state.storage_fault is not None:
            self._say_storage_fault()
        return self.state

    def _step(self) -> bool:
        """One turn of the loop; True when the experiment is over."""
        if self.stopping is None:
            self._schedule()
        if not self.live and (self.stopping or (
                self._next_pending() is None and not self._may_search())):
            return True
        for event in self.executor.poll(0.1):
            self._handle(event)
        self._answer_decisions()
        self._enforce_stop_deadlines()
        self._kill_hung()
        self._take_control_requests()
        if self.lease is not None and self.lease.lost:
            raise LeaseLostError(self.lease.lost)
        self._emit("on_tick", self.state)
        if self._dirty and time.time() - self._last_save >= STATE_SAVE_INTERVAL_S:
            self.save()
        return False

    # -- storage faults ------------------------------------------------------------------------
    def _storage_fault(self, fault: Any, trial_id: Optional[str] = None) -> None:
        """The storage refused a write (``fault``: a :class:`~ftnb.storage.faults.StorageFault`,
        or a trial's record of one): retrying into a full, read-only or forbidden storage helps
        nobody. No attempt starts any more; running trials end at their next report (their
        own writes may fail the same way: that ends them too); the experiment ends
        INTERRUPTED, its fault recorded, what can be saved saved, and the line that resumes it
        said. Only the first fault is recorded: the rest follow from it."""
        if self.state.storage_fault is not None:
            return
        if isinstance(fault, StorageFault):
            record = {**fault.as_dict(), "message": str(fault)}
        else:
            record = dict(fault)
        record.update(trial_id=trial_id, time=time.time())
        if self._reserved:  # room for the records that say what happened
            self._reserved = False
            self.storage.release_space(self.paths.space_reserve)
        self.state.storage_fault = record
        self._dirty = True
        whose = f"trial {trial_id}'s" if trial_id else "the driver's"
        print(f"\nftnb: {whose} storage refused a write: {record.get('message')}\nftnb: "
              f"stopping experiment {self.state.name!r}: no trial starts; running trials "
              "end at their next report.", file=sys.stderr, flush=True)
        self.stop(policy.STORAGE_FAULT)

    def _tolerating_storage_faults(self, write: Callable[[], Any]) -> None:
        """``write()``; a storage fault it raises stops the experiment (once) and is otherwise
        swallowed: the driver goes on draining its trials and saves what it can."""
        try:
            waiting_out_faults(write, None if self.stopping else self.failure_config.storage_wait_s,
                               "the driver")
        except OSError as exc:
            if not is_storage_fault(exc):
                raise
            self._storage_fault(storage_fault(exc))

    def _say_storage_fault(self) -> None:
        fault = self.state.storage_fault or {}
        counts = self.state.counts()
        done = counts.get(TrialStatus.TERMINATED.value, 0) + counts.get(
            TrialStatus.ERRORED.value, 0)
        print(f"\nftnb: experiment {self.state.name!r} stopped: its storage refused a write.\n"
              f"    {fault.get('message')}\n"
              f"ftnb: {done} of {len(self.state.trials)} trials finished; the others were "
              "paused with their checkpoints, every acknowledged report kept. Once the "
              "storage is fixed, resume it with:\n"
              f"    {self.resume_hint or 'the same call again'}",
              file=sys.stderr, flush=True)

    def stop(self, reason: str = "stopped") -> None:
        """Stop the experiment cleanly: running trials end at their next report and are PAUSED
        with their checkpoints; pending trials stay PENDING. Safe to call from a listener."""
        if self.stopping is not None:
            return
        self.stopping = reason
        for trial_id in list(self.live):
            self._request_stop(trial_id)

    def stop_trial(self, trial_id: str, reason: str = "stopped by user") -> None:
        """End one trial cleanly, the others go on: a running trial stops at its next report
        (or is killed after the grace period), a waiting one never starts; either is
        TERMINATED with what it reported and checkpointed, and ``reason`` as its note."""
        trial = next((t for t in self.state.trials if t.trial_id == trial_id), None)
        if trial is None or trial.status in (TrialStatus.TERMINATED, TrialStatus.ERRORED):
            return
        trial.note = reason
        if trial_id in self.live:
            self.live[trial_id].pausing = False  # a stop wins over a scheduler's pause
            self._request_stop(trial_id)
            return
        self._complete(trial, TrialStatus.TERMINATED)
        self._persist_trial(trial)
        self._dirty = True

    def _take_control_requests(self) -> None:
        if self.control is None or self.stopping is not None:
            return
        for request in self.control.take():
            if request.action == STOP_TRIAL and request.trial_id:
                self.stop_trial(request.trial_id, request.reason)
            else:
                self.stop(request.reason)

    def _final_status(self) -> str:
        return policy.experiment_status(self.stopping, (t.status for t in self.state.trials))

    def _enqueue(self, trial: TrialRecord, position: Optional[int] = None) -> None:
        """Queue a PENDING trial to start. Trials that already made progress go first (their
        work is the most valuable), then in the experiment's order."""
        if position is None:
            position = self.state.position(trial.trial_id)
        heapq.heappush(self._queue, (0 if trial.attempts else 1, position, trial.trial_id))

    def _next_pending(self) -> Optional[TrialRecord]:
        """The PENDING trial to start next, or None; the queue is kept, so that no loop over
        every trial runs at each tick."""
        while self._queue:
            trial = self.state.trial(self._queue[0][2])
            if trial.status == TrialStatus.PENDING and trial.trial_id not in self.live:
                return trial
            heapq.heappop(self._queue)  # started, or stopped, since it was queued
        return None

    def _schedule(self) -> None:
        if self.scheduler is not None:
            self._start_chosen()
        while True:
            trial = self._next_pending()
            if trial is None:
                # The searcher is asked only when a trial can start now, so that it sees every
                # result that came before.
                if not self._may_search() or len(self.live) >= self.max_concurrent or (
                        not self.executor.has_room(self.resources, self.num_workers)):
                    return
                trial = self._suggest_trial()
                if trial is None:
                    return
            if len(self.live) >= self.max_concurrent:
                return
            if not self._has_room_for(trial):
                return
            heapq.heappop(self._queue)
            self._start_attempt(trial)

    # -- trials a searcher makes ---------------------------------------------------------------
    def end_search(self, reason: str) -> None:
        """Ask the searcher for no more trials (a time budget ran out); those made go on as
        they are told. Safe to call from a listener."""
        if self.search_ended is None:
            self.search_ended = reason

    def _may_search(self) -> bool:
        return (self.search is not None and self.search_ended is None
                and self.search.may_suggest)

    def _suggest_trial(self) -> Optional[TrialRecord]:
        """A new trial from the searcher, recorded and queued; None when it has none now."""
        assert self.search is not None
        trial_id = self.search.trial_id(len(self.state.trials))
        self._guard()
        answer = self.search.suggest(trial_id)
        if answer is None:
            if not self.live and self._next_pending() is None:
                # Nothing runs that could change its answer: waiting would never end.
                self.search_ended = (f"{self.search.searcher!r} suggested nothing while no "
                                     "trial was running")
                print(f"ftnb: experiment {self.state.name!r}: {self.search_ended}; no more "
                      "trials are made.", file=sys.stderr, flush=True)
            return None
        if answer == FINISHED:
            return None
        trial = TrialRecord(trial_id=trial_id, dir_name=trial_id, config=encode_value(answer))
        if self.trial_setup is not None:
            request = self.trial_setup(trial, answer)
            if request is not None:
                self.trial_resources[trial_id] = request
        # Durable before anything of the trial is written: a restore records it from there.
        self.search.hold(trial_id, trial.dir_name)
        return self._record_trial(trial, answer)

    def _record_trial(self, trial: TrialRecord, config: Any) -> TrialRecord:
        """Lay out the folder and record of a trial the searcher made, and queue it. The state
        lists it at the next save (the searcher's file holds its suggestion until then: saving
        the whole state per trial would cost more than the trial, on a local disk's fsyncs)."""
        self.state.trials.append(trial)
        self.configs[trial.trial_id] = config
        trial_paths = self.paths.trial(trial.dir_name)
        self._guard()
        self.storage.makedirs(trial_paths.dir)
        self.storage.write_atomic(
            trial_paths.params, json.dumps(trial.config, indent=1, default=str) + "\n",
            durable=False)
        self._persist_trial(trial)
        self._unlisted.append(trial.trial_id)
        self._dirty = True
        if trial.status == TrialStatus.PENDING:
            self._enqueue(trial)
        return trial

    def _adopt(self, trial_id: str, config: Any, dir_name: str) -> None:
        """After a restore: record the trial of a suggestion that the state did not list. Its
        own record, when it was written, says how far it got (it may have run: its files are
        reconciled as a listed trial's are); a finished one stays finished."""
        trial_paths = self.paths.trial(dir_name)
        record = None
        try:
            record = parse_trial_record(self.storage.read_bytes(trial_paths.record), trial_id)
        except FileNotFoundError:
            pass
        if record is None:
            record = TrialRecord(trial_id=trial_id, dir_name=dir_name,
                                 config=encode_value(config))
        else:
            trial_paths.remove_leftover_temps()
            self.trial_files.reconcile(record, self.state.updated)
            if record.status not in (TrialStatus.TERMINATED, TrialStatus.ERRORED):
                record.status = TrialStatus.PENDING.value
        self._record_trial(record, config)

    def _rows_of(self, trial: TrialRecord) -> list:
        return self.paths.trial(trial.dir_name).read_results()

    def _resources_of(self, trial: TrialRecord) -> TrialResources:
        return self.trial_resources.get(trial.trial_id, self.resources)

    def _config_resources(self, trial_id: str, config: Any) -> Optional[TrialResources]:
        """What a trial with ``config`` asks for when ftnb.with_resources was given a function
        of the config (None otherwise)."""
        resources_of = getattr(self.trainable, "_ftnb_resources_of", None)
        return resources_of(trial_id, config) if resources_of is not None else None

    def _has_room_for(self, trial: TrialRecord) -> bool:
        """Whether ``trial`` (not running) can start now. An exploit decided for it (a restore
        finishes one) is carried out first: its new config may ask for other resources."""
        if exploits.is_exploit(self._decided.get(trial.trial_id)):
            self._carry_out_exploit(trial)
        return self.executor.has_room(self._resources_of(trial), self.num_workers)

    # -- starting an attempt -------------------------------------------------------------------
    def _start_attempt(self, trial: TrialRecord) -> None:
        # (A decided exploit was carried out by _has_room_for, which every start follows.)
        latest = trial.latest_checkpoint
        start_iteration = latest["iteration"] if latest else 0
        rows = self.trial_files.rows_up_to(trial, start_iteration)
        if rows and self._meets_stop_criterion(rows[-1]):
            # It met its stop criterion at the report it would resume from (its driver died
            # before seeing it end): it is done, not run past its criterion.
            trial.iteration = start_iteration
            trial.last_result = rows[-1]
            self._complete(trial, TrialStatus.TERMINATED)
            self._persist_trial(trial)
            self._dirty = True
            return
        attempt = AttemptRecord(
            number=len(trial.attempts) + 1,
            started=time.time(),
            start_iteration=start_iteration,
            restored_from=latest["dir_name"] if latest else None,
            num_workers=self.num_workers,
        )
        trial.attempts.append(attempt)
        trial.status = TrialStatus.RUNNING.value
        trial.iteration = start_iteration
        trial.last_result = rows[-1] if rows else None
        self._persist_trial(trial)

        fence = None
        if self.lease is not None:
            fence = AttemptFence(**self.lease.fence_spec(), epoch=self.lease.info.epoch)
        spec = AttemptSpec(
            trial_id=trial.trial_id,
            attempt=attempt.number,
            trainable=self.trainable,
            config=self.configs[trial.trial_id],
            storage=self.storage,
            experiment_dir=self.paths.dir,
            experiment_name=self.state.name,
            trial_dir_name=trial.dir_name,
            trial_name=trial.name,
            resources=self._resources_of(trial),
            num_workers=self.num_workers,
            restore_checkpoint=latest["dir_name"] if latest else None,
            start_iteration=start_iteration,
            time_offset_s=latest.get("time_total_s", 0.0) if latest else 0.0,
            next_checkpoint_index=trial.next_checkpoint_index,
            rows=rows,
            stop=self.run_config.stop,
            checkpoint_score_attribute=self.checkpoint_config.checkpoint_score_attribute,
            metric=self.state.settings.get("metric"),
            preemption_grace_period_s=self.failure_config.preemption_grace_period_s,
            fence=fence,
            collective_timeout_s=self.collective_timeout_s,
            decision_points=self._decision_points(trial),
            storage_wait_s=self.failure_config.storage_wait_s,
        )
        self.live[trial.trial_id] = _Live(attempt.number)
        try:
            self.executor.start(spec)
        except BaseException:
            self.live.pop(trial.trial_id, None)
            raise
        # Saved by the throttle: a full save per start would make an experiment quadratic in its
        # trial count, and restore reconciles RUNNING trials from their result files anyway.
        self._dirty = True
        self._emit("on_trial_start", self.state, trial)

    # -- events --------------------------------------------------------------------------------
    def _handle(self, event: AttemptEvent) -> None:
        if isinstance(event, OutputEvent):
            if self.run_config.verbose >= 1:
                self._emit("on_output", event.trial_id, event.stream, event.text)
            return
        live = self.live.get(event.trial_id)
        if live is None or live.attempt != event.attempt:
            return  # an attempt this controller no longer waits for
        trial = self.state.trial(event.trial_id)
        kind = event.kind
        if kind is EventKind.RESULT:
            assert isinstance(event, ResultEvent)
            live.heard_at = time.monotonic()
            if not live.reported:
                live.reported = True
                self._note_recovery(trial)
            self._on_result(trial, event.row, event.awaits_decision)
        elif kind is EventKind.STARTED:
            assert isinstance(event, StartedEvent)
            trial.attempts[-1].pid = event.pids[0] if event.pids else None
            live.heard_at = time.monotonic()
            if len(event.pids) > 1:
                trial.attempts[-1].pids = list(event.pids)
        elif kind is EventKind.ERROR:
            assert isinstance(event, ErrorEvent)
            live.errors.setdefault(event.rank, event)
        elif kind is EventKind.PREEMPTED:
            live.preempted = True
        elif kind is EventKind.DONE:
            assert isinstance(event, DoneEvent)
            live.outcome = event.outcome
        elif kind is EventKind.EXIT:
            assert isinstance(event, ExitEvent)
            self._on_exit(trial, live, event)

    def _note_recovery(self, trial: TrialRecord) -> None:
        """The attempt's first report: if it follows a failure of the attempt before, record how
        long the restart took (from the failure to this first step from the checkpoint)."""
        if not trial.failures:
            return
        failure = trial.failures[-1]
        if failure.attempt == trial.attempts[-1].number - 1 and failure.recovered_s is None:
            failure.recovered_s = round(max(0.0, time.time() - failure.time), 3)

    def _on_result(self, trial: TrialRecord, row: dict, awaits_decision: bool = False) -> None:
        trial.iteration = row.get("training_iteration", trial.iteration)
        trial.last_result = row
        name = row.get("checkpoint_dir_name")
        if name:
            entry = {
                "dir_name": name,
                "iteration": trial.iteration,
                "time_total_s": row.get("time_total_s", 0.0),
            }
            attr = self.checkpoint_config.checkpoint_score_attribute
            if attr:
                entry["score"] = metric_value(row, attr)
            trial.checkpoints.append(entry)
            trial.latest_checkpoint = entry
            index = checkpoint_index(name)
            if index is not None:
                trial.next_checkpoint_index = max(trial.next_checkpoint_index, index + 1)
            self.trial_files.apply_retention(trial)
        self._dirty = True
        self._emit("on_result", self.state, trial, row)
        if self.scheduler is not None and not awaits_decision and self._meets_stop_criterion(
                row):
            # Ray asks no scheduler about a result that meets the stop criterion: the trial
            # ends there (a PBT exploit decided at it would never run).
            self._fed[trial.trial_id] = max(self._fed.get(trial.trial_id, 0),
                                            int(row.get("training_iteration") or 0))
        elif self.scheduler is not None:
            self._decide(trial, row, awaits_decision)
        elif awaits_decision:  # (only a scheduler publishes decision points)
            self._answers.append((trial.trial_id, int(trial.iteration), "continue"))

    def _on_exit(self, trial: TrialRecord, live: _Live, exit_event: ExitEvent) -> None:
        self.live.pop(trial.trial_id, None)
        attempt = trial.attempts[-1]
        attempt.ended = time.time()
        attempt.end_iteration = trial.iteration
        group = len(exit_event.ranks) > 1
        cause = exit_event.cause
        if group:
            # The cause is the rank that failed first: its error, or (killed, hung) its exit.
            first = exit_event.first_failing_rank
            error = live.errors.get(first) if first is not None else next(
                iter(live.errors.values()), None)
        else:
            error = live.errors.get(exit_event.first_failing_rank) or next(
                iter(live.errors.values()), None)
        end = policy.AttemptEnd(
            outcome=live.outcome,
            error=error.as_failure() if error is not None else None,
            preempted=live.preempted,
            exit_code=exit_event.exit_code, oom_killed=exit_event.oom_killed,
            stop_requested=live.stop_requested_at is not None,
            silent_for_s=live.silent_for_s,
            node_lost=exit_event.node_lost, node=exit_event.node,
            rank=exit_event.first_failing_rank if group else None,
            hung=bool(group and cause is not None and cause.hung),
            ranks=tuple(_rank_entries(exit_event, live.errors)) if group else (),
        )
        ending = policy.classify_end(end, attempt=attempt.number, iteration=trial.iteration,
                                     now=time.time())
        if ending.failure is not None and ending.failure.kind == FailureKind.STORAGE.value:
            # Recorded before the driver writes anything of it (error.txt may meet the same
            # full disk): the trial's own fault is the cause.
            fault = error.storage_fault if error is not None else None
            self._storage_fault({**(fault or {}), "message": ending.failure.message},
                                trial.trial_id)
        attempt.outcome = ending.outcome.value
        if ending.failure is not None:
            self._record_failure(trial, ending.failure)
            decision = policy.decide_after_failure(trial, ending.failure, self.failure_config,
                                                   stopping=bool(self.stopping))
            self._carry_out(trial, ending.failure, decision)
        elif ending.stopped_by_controller and self._decided.get(
                trial.trial_id, {}).get("decision") == "STOP":
            self._complete(trial, TrialStatus.TERMINATED)  # its scheduler's stop stands
        elif ending.stopped_by_controller and live.pausing and not self.stopping:
            trial.status = TrialStatus.PAUSED.value  # the scheduler resumes it when it chooses
        elif ending.stopped_by_controller:
            self._complete(trial, TrialStatus.PAUSED if self.stopping else TrialStatus.TERMINATED)
        else:
            self._complete(trial, TrialStatus.TERMINATED)
        if trial.status == TrialStatus.PAUSED and exploits.is_exploit(
                self._decided.get(trial.trial_id)):
            self._carry_out_exploit(trial)
        self._persist_trial(trial)
        self._dirty = True

    def _record_failure(self, trial: TrialRecord, failure: FailureRecord) -> None:
        trial.failures.append(failure)
        self._guard()
        paths = self.paths.trial(trial.dir_name)
        text = failure.describe()
        if failure.rank is not None:  # a group's: where the failing rank's output is
            text += _rank_output_text(paths, failure)
        # (the failure is in the trial's record whatever becomes of this copy for readers)
        self._tolerating_storage_faults(lambda: self.storage.write_atomic(paths.error, text))
        self._emit("on_trial_failure", self.state, trial, failure)

    def _carry_out(self, trial: TrialRecord, failure: FailureRecord,
                   decision: policy.FailureDecision) -> None:
        if decision.status is TrialStatus.PENDING:
            trial.status = TrialStatus.PENDING.value  # started again from its checkpoint
            self._enqueue(trial)
            return
        if decision.status is TrialStatus.ERRORED:
            trial.error = {"reason": decision.reason, "failure": failure.__dict__.copy()}
        self._complete(trial, decision.status)
        if decision.stop_experiment == policy.STORAGE_FAULT:
            self._storage_fault({"message": failure.message}, trial.trial_id)
        elif decision.stop_experiment:
            self.stop(decision.stop_experiment)

    def _complete(self, trial: TrialRecord, status: TrialStatus) -> None:
        trial.status = status.value
        self._emit("on_trial_complete", self.state, trial)
        if self.scheduler is not None and status in (TrialStatus.TERMINATED,
                                                     TrialStatus.ERRORED):
            self._tell_ended(trial)

    # -- the trial scheduler -------------------------------------------------------------------
    def _scheduler_add(self, trial: TrialRecord) -> None:
        """Tell the scheduler of ``trial`` (once; before it first starts)."""
        if trial.trial_id not in self._fed:
            self._fed[trial.trial_id] = 0
            self.scheduler.on_trial_add(self._scheduler_view, trial)

    def _decision_points(self, trial: TrialRecord) -> Any:
        if self.scheduler is None:
            return None
        self._scheduler_add(trial)
        self._decided.pop(trial.trial_id, None)  # (a pause it resumes from)
        self._told_ended.discard(trial.trial_id)  # (an errored trial a restore runs again)
        if trial.note and trial.note.startswith("paused by "):
            trial.note = None
        return self.scheduler.decision_points(trial)

    def _start_chosen(self) -> None:
        """Start (or resume) the trials the scheduler chooses, while there is room; the
        PENDING trials it leaves go in the experiment's order (:meth:`_schedule`)."""
        view = self._scheduler_view
        while len(self.live) < self.max_concurrent:
            trial = self.scheduler.choose_trial_to_run(view)
            if trial is None and not self.live and self._next_pending() is None and (
                    not self._may_search()):
                # Nothing runs (or will) that could make it resume a trial it paused: one goes
                # on rather than the experiment ending with trials left waiting.
                trial = next((t for t in self.state.trials if t.trial_id in self._decided
                              and t.status == TrialStatus.PAUSED), None)
            if trial is None or trial.trial_id in self.live or trial.status not in (
                    TrialStatus.PENDING, TrialStatus.PAUSED):
                return
            if not self._has_room_for(trial):
                return
            if trial.status == TrialStatus.PAUSED:
                trial.status = TrialStatus.PENDING.value
            elif self._queue and self._queue[0][2] == trial.trial_id:
                heapq.heappop(self._queue)  # (an entry left further back is skipped later)
            self._start_attempt(trial)

    def _decide(self, trial: TrialRecord, row: dict, awaits: bool) -> None:
        """The scheduler's decision on ``row``: carried out at once when the trial waits for
        it (answered once the state holding it is saved), else at the trial's next report."""
        trial_id = trial.trial_id
        iteration = int(row.get("training_iteration") or trial.iteration)
        live = self.live.get(trial_id)
        self._fed[trial_id] = max(self._fed.get(trial_id, 0), iteration)
        decision = self.scheduler.on_trial_result(self._scheduler_view, trial, row)
        self._dirty = True
        if decision == "STOP":
            note = self.scheduler.stop_note(trial)
            self._decided[trial_id] = {"decision": "STOP", "iteration": iteration, "note": note}
            trial.note = note
            self._persist_trial(trial)
            answer = "stop"
        elif decision == "PAUSE":
            if not exploits.is_exploit(self._decided.get(trial_id)):  # (an exploit pauses too)
                self._decided[trial_id] = {"decision": "PAUSE", "iteration": iteration}
                trial.note = f"paused by {type(self.scheduler).__name__} at " \
                             f"training_iteration={iteration}"
            if live is not None:
                live.pausing = True
            answer = "pause"
        else:
            answer = "continue"
        if answer == "continue" and live is not None and (
                live.stop_requested_at is not None or self.stopping):
            answer = "stop"  # it is being stopped anyway (a user, a stopper, the experiment)
        if awaits:
            self._answers.append((trial_id, iteration, answer))
        elif answer != "continue" and live is not None:
            self._request_stop(trial_id)

    def _answer_decisions(self) -> None:
        """Answer the reports that wait: first the state that holds the decisions is saved,
        so that a driver killed at any moment never leaves a decision carried out but lost."""
        if not self._answers:
            return
        answers, self._answers = self._answers, []
        if self.scheduler is not None:
            # (Not fsynced: it must survive the driver's death, which it does once written; a
            # machine crash takes the trials' unsynced rows with it, and a restore decides
            # again from the rows that were persisted.)
            self.save(durable=False)
        for trial_id, iteration, answer in answers:
            self.executor.decide(trial_id, iteration, answer)
            if answer != "continue":
                self._request_stop(trial_id)  # (and killed if it does not end in time)

    def _tell_ended(self, trial: TrialRecord) -> None:
        if trial.trial_id in self._told_ended:
            return
        self._told_ended.add(trial.trial_id)
        decided = self._decided.pop(trial.trial_id, None)  # its status shows it now
        if exploits.is_exploit(decided) or getattr(self.scheduler, "_ftnb_exploits", False):
            # (An exploit it will not carry out; or one a dead driver staged and never saved.)
            exploits.remove_staged(self.paths, trial)
        self._scheduler_add(trial)
        if trial.status == TrialStatus.ERRORED:
            self.scheduler.on_trial_error(self._scheduler_view, trial)
        else:
            self.scheduler.on_trial_complete(self._scheduler_view, trial, trial.last_result)
        self._dirty = True

    def _meets_stop_criterion(self, row: Optional[dict]) -> bool:
        """Whether ``row`` meets ``RunConfig(stop={...})``: the trial ends at it. Only a dict
        is judged here (a function or a Stopper keeps its state in the trial's process)."""
        stop = self.run_config.stop
        if not row or not isinstance(stop, dict):
            return False
        for key, threshold in stop.items():
            value = metric_value(row, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(
                    threshold, (int, float)) and value >= threshold:
                return True
        return False

    def _carry_out_exploit(self, trial: TrialRecord) -> None:
        """Carry out the exploit decided for ``trial`` (see :mod:`ftnb.core.exploits`): it
        goes on from the donor's checkpoint with the new config, its record saying both at
        once. The decision is on disk first, so a driver killed meanwhile leaves it to the
        restore, which does it once."""
        decided = self._decided[trial.trial_id]
        if self._dirty:
            self.save(durable=False)
        if exploits.carry_out(self.paths, trial, decided, self._persist_trial, self._guard):
            donor_id = decided["donor"]
            donor = self.state.trial(donor_id)
            self.configs[trial.trial_id] = exploits.live_config(
                trial.config, self.configs.get(donor_id), donor.config)
            # ftnb.with_resources with a function of the config: its next attempt asks for
            # what the new config needs.
            request = self._config_resources(trial.trial_id, self.configs[trial.trial_id])
            if request is not None:
                self.trial_resources[trial.trial_id] = request
            self.trial_files.apply_retention(trial)
        self._decided.pop(trial.trial_id, None)
        self._dirty = True

    def _scheduler_record(self) -> dict:
        """The scheduler as the experiment state records it (see ``ExperimentState.scheduler``)."""
        from ..schedulers import describe_scheduler

        return {**describe_scheduler(self.scheduler),
                "state": self.scheduler.get_state(),
                "fed": dict(self._fed),
                "decided": {k: dict(v) for k, v in self._decided.items()},
                "ended": sorted(self._told_ended)}

    def _restore_scheduler(self) -> None:
        """Bring the scheduler up to date with the experiment as stored (a restore; nothing
        for a new experiment): its saved state, the decisions the previous driver carried out
        (a trial it stopped stays stopped, one it paused waits), the results it had not seen
        (up to where each trial resumes: the rest are redone and seen then), and the trials
        that ended without it being told."""
        view = self._scheduler_view
        stored = self.state.scheduler
        if stored:
            self.scheduler.set_state(stored.get("state") or {})
            self._fed = {k: int(v) for k, v in (stored.get("fed") or {}).items()}
            self._decided = {k: dict(v) for k, v in (stored.get("decided") or {}).items()}
            self._told_ended = set(stored.get("ended") or [])
        for trial in self.state.trials:
            self._scheduler_add(trial)
        for trial_id, decided in list(self._decided.items()):
            trial = self.state.trial(trial_id)
            self._carry_out_at_rest(trial, decided)
        replay = []
        for trial in self.state.trials:
            if not trial.attempts:
                continue
            done = trial.status in (TrialStatus.TERMINATED, TrialStatus.ERRORED)
            upto = float("inf") if done else (trial.latest_checkpoint or {}).get("iteration", 0)
            seen = self._fed.get(trial.trial_id, 0)
            if trial.iteration <= seen:
                continue  # (no file to read: it reported nothing the scheduler missed)
            for row in self.paths.trial(trial.dir_name).read_results():
                iteration = row.get("training_iteration") or 0
                if seen < iteration <= upto:
                    replay.append((row.get("timestamp") or 0.0, iteration, trial, row))
        replay.sort(key=lambda entry: (entry[0], entry[1]))
        for _, iteration, trial, row in replay:
            self._fed[trial.trial_id] = max(self._fed.get(trial.trial_id, 0), iteration)
            if self._meets_stop_criterion(row):
                continue  # (as when it came: see _on_result)
            decision = self.scheduler.on_trial_result(view, trial, row)
            if trial.status in (TrialStatus.TERMINATED, TrialStatus.ERRORED):
                continue
            if decision == "STOP":
                decided = {"decision": "STOP", "iteration": iteration,
                           "note": self.scheduler.stop_note(trial)}
            elif exploits.is_exploit(self._decided.get(trial.trial_id)):
                decided = self._decided[trial.trial_id]  # (it pauses the trial too)
            elif decision == "PAUSE":
                decided = {"decision": "PAUSE", "iteration": iteration}
            else:
                continue
            self._decided[trial.trial_id] = decided
            self._carry_out_at_rest(trial, decided)
        for trial in self.state.trials:
            if trial.status in (TrialStatus.TERMINATED, TrialStatus.ERRORED):
                self._tell_ended(trial)
        self._scheduler_ready = True
        if stored or replay:
            self.save()

    def _carry_out_at_rest(self, trial: TrialRecord, decided: dict) -> None:
        """A decision on a trial that runs no attempt (a restore): a STOP ends it TERMINATED
        with the scheduler's note, a PAUSE leaves it PAUSED for the scheduler to resume."""
        if trial.status in (TrialStatus.TERMINATED, TrialStatus.ERRORED):
            return
        if decided["decision"] == "STOP":
            trial.note = decided.get("note")
            # (Not told to the listeners: the experiment has not started for them yet.)
            trial.status = TrialStatus.TERMINATED.value
            self._tell_ended(trial)
        else:
            trial.status = TrialStatus.PAUSED.value
            trial.note = (f"paused by {type(self.scheduler).__name__} at "
                          f"training_iteration={decided.get('iteration')}")
        self._persist_trial(trial)

    # -- stopping ------------------------------------------------------------------------------
    def _request_stop(self, trial_id: str) -> None:
        live = self.live.get(trial_id)
        if live is None or live.stop_requested_at is not None:
            return
        live.stop_requested_at = time.time()
        self.executor.request_stop(trial_id)

    def _enforce_stop_deadlines(self) -> None:
        grace = self.failure_config.preemption_grace_period_s
        now = time.time()
        for trial_id, live in list(self.live.items()):
            if live.stop_requested_at is not None and now - live.stop_requested_at > grace:
                self.executor.kill(trial_id)

    def _kill_hung(self) -> None:
        """Kill the attempts silent for longer than FailureConfig(hang_timeout_s): each ends
        as a failure of kind ``hang`` (see policy.classify_end), retried like any other."""
        # Not watched: an attempt asked to stop or preempted (its grace period applies), one
        # whose trainable returned (ending is ftnb's part), one already killed for hanging.
        watched = {trial_id: live.heard_at if live.stop_requested_at is None
                   and not live.preempted and live.outcome is None
                   and live.silent_for_s is None else None
                   for trial_id, live in self.live.items()}
        silent = silent_attempts(watched, now=time.monotonic(),
                                 timeout_s=self.failure_config.hang_timeout_s)
        for trial_id, silent_for_s in silent.items():
            self.live[trial_id].silent_for_s = round(silent_for_s, 1)
            self.executor.kill(trial_id)

    def _interrupt(self, exc: BaseException) -> None:
        """The loop itself was interrupted (Ctrl+C, an error in a listener): stop every trial,
        mark the experiment INTERRUPTED and persist, so it can be resumed.

        When another driver took the experiment over, kill the trials and write nothing."""
        self.stopping = self.stopping or "interrupted"
        if isinstance(exc, LeaseLostError) or (self.lease is not None and self.lease.lost):
            self._abandon()
            return
        try:
            for trial_id in list(self.live):
                self._request_stop(trial_id)
            deadline = time.time() + min(10.0, self.failure_config.preemption_grace_period_s)
            while self.live and time.time() < deadline:
                for event in self.executor.poll(0.1):
                    self._handle(event)
                self._answer_decisions()
            for trial_id in list(self.live):
                self.executor.kill(trial_id)
            deadline = time.time() + 5
            while self.live and time.time() < deadline:
                for event in self.executor.poll(0.1):
                    self._handle(event)
            for trial in self.state.trials:
                if trial.status == TrialStatus.RUNNING:
                    trial.status = TrialStatus.PAUSED.value
            self.state.status = ExperimentStatus.INTERRUPTED.value
            self.save(final=True)
        except BaseException:
            pass  # the original exception matters more; the state on disk stays resumable
        if isinstance(exc, KeyboardInterrupt) and self.resume_hint:
            say_interrupted(exc, self.state.name, self.resume_hint,
                            "its trials were stopped and its state saved")

    def _abandon(self) -> None:
        """Another driver owns the experiment now: kill our trials and write nothing more."""
        for trial_id in list(self.live):
            try:
                self.executor.kill(trial_id)
            except Exception:
                pass
        self.live.clear()

    # -- persistence and listeners -------------------------------------------------------------
    def _guard(self) -> None:
        """Before any write that could harm another owner: are we still the owner?"""
        if self.lease is not None:
            self.lease.check()

    def _persist_trial(self, trial: TrialRecord) -> None:
        """Write the trial's own record at once (the experiment state is saved at most once a
        second): a driver killed right after a failure or a start loses nothing of either."""
        self._guard()
        trial.seq += 1
        data = json.dumps(trial.to_json(), default=str, allow_nan=True)
        self._tolerating_storage_faults(lambda: self.storage.write_atomic(
            self.paths.trial(trial.dir_name).record, data, durable=False))
        self._changed.add(trial.trial_id)
        if self.search is not None and not self._adopting and trial.status in (
                TrialStatus.TERMINATED, TrialStatus.ERRORED):
            # After its final record: a restore tells the searcher what it did not hear.
            self.search.on_complete(trial)

    def save(self, final: bool = False, durable: bool = True) -> None:
        """Persist the experiment state now (the loop saves it at most once a second, what
        changed only; ``final``: the driver's last save, the whole state)."""
        self._guard()
        if self.scheduler is not None and self._scheduler_ready:
            self.state.scheduler = self._scheduler_record()
        if final:
            self._tolerating_storage_faults(lambda: self.state.save(self.paths, final=True))
        else:
            self._tolerating_storage_faults(lambda: self.state.save_changes(
                self.paths, self._changed, durable=durable))
        self._tolerating_storage_faults(lambda: self.index_entry.update(
            self.state, changed=bool(self._changed), final=final))
        self._changed = set()
        self._dirty = False
        self._last_save = time.time()
        if self.search is not None and self._unlisted:
            for trial_id in self._unlisted:  # listed now: their suggestions need no keeping
                self.search.recorded(trial_id)
            self._unlisted = []
        if final and self.search is not None:
            self.search.commit()  # (the suggestions it held are all listed now)

    def _emit(self, method: str, *args: Any) -> None:
        for listener in self.listeners:
            fn = getattr(listener, method, None)
            if fn is not None:
                fn(*args)



class _SearchResults(NullListener):
    """Tells the searcher each result (once per ``training_iteration``)."""

    def __init__(self, search: PersistedSearcher) -> None:
        self.search = search

    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None:
        self.search.on_result(trial.trial_id, row)


#: ``_SchedulerView.stop_trial``'s note not given: the scheduler's own (its ``stop_note``).
_SCHEDULER_NOTE: Any = object()


class _SchedulerView:
    """What the trial scheduler sees of the controller and may ask of it
    (:class:`ftnb.schedulers.SchedulerController`; Ray's ``tune_controller``)."""

    def __init__(self, controller: "Controller") -> None:
        self._controller = controller

    def get_trials(self) -> list[TrialRecord]:
        return self._controller.state.trials

    def get_live_trials(self) -> list[TrialRecord]:
        """The trials that are not TERMINATED or ERRORED (Ray's name)."""
        return [t for t in self.get_trials()
                if t.status not in (TrialStatus.TERMINATED, TrialStatus.ERRORED)]

    def get_trial(self, trial_id: str) -> TrialRecord:
        return self._controller.state.trial(trial_id)

    def status_of(self, trial: TrialRecord) -> str:
        live = self._controller.live.get(trial.trial_id)
        if live is not None and live.pausing:
            return TrialStatus.PAUSED.value
        return str(trial.status)

    def stop_trial(self, trial: TrialRecord, note: Any = _SCHEDULER_NOTE) -> None:
        """End ``trial`` (see :class:`ftnb.schedulers.SchedulerController`); ``note`` None:
        it ran its budget (shown as completed)."""
        controller = self._controller
        if note is _SCHEDULER_NOTE:
            note = controller.scheduler.stop_note(trial)
        if trial.trial_id in controller.live:
            controller._decided[trial.trial_id] = {
                "decision": "STOP", "iteration": int(trial.iteration), "note": note}
        controller.stop_trial(trial.trial_id, note)  # type: ignore[arg-type]

    def pause_trial(self, trial: TrialRecord) -> None:
        controller = self._controller
        live = controller.live.get(trial.trial_id)
        if live is None:
            return
        live.pausing = True
        controller._decided[trial.trial_id] = {"decision": "PAUSE",
                                               "iteration": int(trial.iteration)}
        controller._request_stop(trial.trial_id)

    def next_pending_trial(self) -> Optional[TrialRecord]:
        return self._controller._next_pending()

    def exploit_trial(self, trial: TrialRecord, donor: TrialRecord,
                      config: Any) -> Optional[dict]:
        """Have ``trial`` continue from ``donor``'s latest checkpoint with ``config`` (PBT's
        exploit): a new attempt, never a failure, started when the scheduler chooses it (a
        running trial ends at the report being decided: answer PAUSE). The donor's checkpoint is
        copied now. Returns the decision recorded, None when the donor has no checkpoint."""
        controller = self._controller
        if trial.trial_id == donor.trial_id:
            raise ValueError(f"trial {trial.trial_id} cannot exploit itself")
        live = controller.live.get(trial.trial_id)
        if live is not None and (controller.stopping or (
                live.stop_requested_at is not None and not live.pausing)):
            return None  # it is being stopped (a user, a stopper, the experiment): it ends
        # (One the scheduler paused, whose attempt is still ending, may: synchronous PBT.)
        live_config = exploits.live_config(encode_value(config),
                                           controller.configs.get(donor.trial_id), donor.config)
        request = controller._config_resources(trial.trial_id, live_config)
        if request is not None:
            try:
                controller.executor.check_fits(request, controller.num_workers)
            except ValueError as exc:
                print(f"ftnb: trial {trial.trial_id} does not exploit trial {donor.trial_id}: "
                      f"with_resources(...) asks {request.as_dict()} for the explored config "
                      f"{config!r}, which can never be had here ({exc}). It goes on with its "
                      "own config. Fix: a resources function that fits every config the "
                      "scheduler may explore (or hyperparam_mutations that stay within it).",
                      file=sys.stderr, flush=True)
                return None
        decided = exploits.stage(controller.paths, trial, donor, config, controller._guard)
        if decided is None:
            return None
        controller._decided[trial.trial_id] = decided
        trial.note = (f"paused by {type(controller.scheduler).__name__} at training_iteration="
                      f"{decided['iteration']}: continues from trial {donor.trial_id}'s "
                      f"{decided['donor_checkpoint']}")
        if live is not None:
            live.pausing = True
        else:
            controller._persist_trial(trial)
        controller._dirty = True
        return decided


def _rank_output_text(paths: TrialPaths, failure: FailureRecord, count: int = 20) -> str:
    """For error.txt of a group's failure: the failing rank's output files and their last
    ``count`` lines (its stderr without the traceback error.txt already shows)."""
    rank = failure.rank or 0
    traceback = (failure.traceback or "").rstrip().splitlines()
    text = []
    for stream, path in (("stdout", paths.rank_stdout(rank)), ("stderr", paths.rank_stderr(rank))):
        lines = paths.last_lines(path, count + (len(traceback) + 1 if stream == "stderr" else 0))
        while lines and not lines[-1].strip():
            lines.pop()
        ends_in_traceback = (stream == "stderr" and bool(traceback)
                             and lines[-len(traceback):] == traceback)
        if ends_in_traceback:
            lines = lines[:-len(traceback)]
        lines = lines[-count:]
        head = f"Rank {rank}'s {stream}: {paths.storage.uri(path)}"
        if lines:
            after = " (then the traceback above)" if ends_in_traceback else ""
            last = f"{len(lines)} lines" if len(lines) > 1 else "line"
            text += ["", f"{head}, its last {last}{after}:", *lines]
        else:
            text += ["", head + (" (the traceback above)" if ends_in_traceback
                                 else " (nothing printed)")]
    return "\n".join(text) + "\n"


def _rank_entries(exit_event: ExitEvent, errors: dict[int, ErrorEvent]) -> list[dict]:
    """How each rank of a group attempt ended (:attr:`FailureRecord.ranks`), in rank order."""
    from ..execution.contract import is_peer_error

    entries = []
    for rank_exit in exit_event.ranks:
        error = errors.get(rank_exit.rank)
        if rank_exit.hung:
            ended, detail = "hung", "stopped making progress; killed"
        elif error is not None:
            what = f"{error.type}: {error.message}" if error.type else error.message
            detail = what.strip().splitlines()[0][:200] if what.strip() else ""
            ended = "peer" if is_peer_error(error.type, error.message) else "error"
        elif rank_exit.collateral:
            ended, detail = "stopped", "ended by ftnb with the group"
        elif rank_exit.exit_code == 0:
            ended, detail = "clean", ""
        elif rank_exit.signal_number is not None:
            ended, detail = "signal", policy.signal_name(rank_exit.signal_number)
        else:
            ended, detail = "exit", f"code {rank_exit.exit_code}"
        entries.append({"rank": rank_exit.rank, "ended": ended, "detail": detail})
    return entries
