"""The controller loop: schedule attempts, handle their events, apply the failure policy, and
persist the experiment state.

The loop is single-threaded and owns the experiment state. It knows nothing of a machine: it
hands an :class:`~ftnb.execution.contract.Executor` typed attempt specifications and reads back
typed events; the executor owns processes, resources, environments and output files. Every
decision (retry, preemption, repeated error, fail-fast, retention) comes from
:mod:`ftnb.core.policy` and is carried out here, as are the trial scheduler's
(:mod:`ftnb.core.scheduling`, its bookkeeping and typed decisions); the trials' files are kept in
line with their records by :class:`~ftnb.core.trial_files.TrialFiles`. The trials start in
:mod:`ftnb.core.attempt_starts`, a searcher's are made in :mod:`ftnb.core.searched_trials`, and
a refusing storage stops the experiment in :mod:`ftnb.core.storage_stop`; an interrupted loop
leaves it resumable in :mod:`ftnb.core.interruption`. UIs are listeners
(:mod:`ftnb.core.listeners`): they are told what happened and never steer. Restoring an
experiment (bringing its records up to date before this loop runs) is :mod:`ftnb.restore`'s.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, Optional

from ..config import RunConfig
from ..execution.contract import (
    AttemptEvent,
    EventKind,
    Executor,
    ExitEvent,
    OutputEvent,
    ResultEvent,
)
from ..execution.resources import TrialResources
from ..storage import ExperimentPaths
from ..storage.control import STOP_TRIAL, ControlInbox
from ..storage.faults import is_storage_fault, storage_fault
from ..storage.lease import Lease, LeaseLostError
from . import policy
from .attempt_ends import attempt_end, rank_output_text
from .attempt_starts import AttemptStarts
from .checkpoint_queries import CHECKPOINT_QUERY, answer_checkpoint_query
from .index_upkeep import index_entry_writer
from .interruption import RESUME_LINE_PRINTED, interrupt_loop, say_interrupted
from .listeners import ExperimentListener, NullListener
from .live_attempt import (
    VALIDATION_RECORD,
    LiveAttempt,
    hung_attempts,
    record_recovery,
    take_result,
    take_validation,
)
from .resizing import GroupResizing, elastic_sizes
from .records import (
    FINISHED_STATUSES,
    ExperimentState,
    ExperimentStatus,
    FailureKind,
    FailureRecord,
    TrialRecord,
    TrialStatus,
)
from .scheduling import SchedulerAnswer, SchedulerBookkeeping
from .searched_trials import SearchedTrials, SearchResults
from .searching import PersistedSearcher
from .storage_stop import StorageStop
from .trial_files import TrialFiles

__all__ = ["Controller", "ExperimentListener", "NullListener", "RESUME_LINE_PRINTED",
           "say_interrupted"]

STATE_SAVE_INTERVAL_S = 1.0

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
        elastic: Optional[dict] = None,
        search: Optional[PersistedSearcher] = None,
        scheduler: Any = None,
    ) -> None:
        self.paths = paths
        self.storage = paths.storage
        self.state = state
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
        self.resizing = GroupResizing(self, num_workers, *elastic_sizes(num_workers, elastic))
        self.executor = executor
        self.listeners = listeners
        #: The search algorithm that makes the trials as they can start (TuneConfig(search_alg=
        #: ...), num_samples=-1), its state kept in the experiment's folder; None when every
        #: trial was made when the experiment started.
        self.search = search
        #: Makes, records and (after a restore) adopts the searcher's trials.
        self.searched = SearchedTrials(self, search) if search is not None else None
        if search is not None:
            self.listeners = [SearchResults(search), *listeners]
        #: Fills in a trial the searcher made (its name and folder name; returns its resources
        #: when they are a function of its config): set by the Tuner.
        self.trial_setup: Optional[Callable[[TrialRecord, Any], Optional[TrialResources]]] = None
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
        #: What the scheduler was fed and decided (its decisions, typed, are carried out here).
        self.scheduling = SchedulerBookkeeping(self, scheduler)
        #: Answers owed to reports that wait for a decision, given once the state that holds
        #: the decisions is saved.
        self._answers: list[SchedulerAnswer] = []
        self.live: dict[str, LiveAttempt] = {}
        self.stopping: Optional[str] = None  # None, or why the experiment is being stopped
        #: The storage's refusals: the space reserve, the first fault, the stop it causes.
        self.storage_stop = StorageStop(paths, state, run_config.failure_config, stop=self.stop,
                                        stopping=lambda: self.stopping,
                                        changed=self._mark_dirty)
        #: Whether the state changed since it was last saved.
        self.dirty = False
        self._last_save = 0.0
        #: Ids of the trials persisted since the last save (see ExperimentState.save_changes).
        self._changed: set[str] = set()
        #: The queue of PENDING trials, and the starts of their attempts.
        self.starts = AttemptStarts(self)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> ExperimentState:
        """Run the experiment until every trial is done or it is stopped; the executor is shut
        down when this returns or raises."""
        try:
            return self._run()
        finally:
            self.executor.shutdown()

    def _run(self) -> ExperimentState:
        self.storage_stop.reserve()
        try:
            return self._run_reserved()
        finally:
            self.storage_stop.release()

    def _run_reserved(self) -> ExperimentState:
        self.state.begin_driver_session()
        if self.searched is not None:
            self.searched.adopt()  # (before the scheduler restores: it must know every trial)
        if self.scheduler is not None:
            self.scheduling.restore()
        self.starts.queue_pending(self.state)
        if self.searched is not None:
            self.searched.start()
        self.emit("on_experiment_start", self.state)
        try:
            while True:
                try:
                    if self._step():
                        break
                except OSError as exc:
                    # The storage refused one of the driver's own writes: not a crash. The
                    # experiment stops as when a trial's write was refused (see StorageStop).
                    if not is_storage_fault(exc):
                        raise
                    self.storage_stop.fault(storage_fault(exc))
        except BaseException as exc:
            interrupt_loop(self, exc)
            raise
        self.state.status = policy.experiment_status(
            self.stopping, (t.status for t in self.state.trials))
        if self.searched is not None and not self.may_search() and (
                self.state.status != ExperimentStatus.INTERRUPTED):
            self.searched.close({t.trial_id for t in self.state.trials})
        self.save(final=True)
        self.emit("on_experiment_end", self.state)
        if self.state.storage_fault is not None:
            self.storage_stop.say(self.resume_hint)
        return self.state

    def _step(self) -> bool:
        """One turn of the loop; True when the experiment is over."""
        if self.stopping is None:
            self.starts.start_what_fits()
        if not self.live and (self.stopping or (
                self.starts.next_pending() is None and not self.may_search())):
            return True
        self.handle_events()
        self._enforce_stop_deadlines()
        self._kill_hung()
        self.resizing.tick()
        self._take_control_requests()
        if self.lease is not None and self.lease.lost:
            raise LeaseLostError(self.lease.lost)
        self.emit("on_tick", self.state)
        if self.dirty and time.time() - self._last_save >= STATE_SAVE_INTERVAL_S:
            self.save()
        return False

    def stop(self, reason: str = "stopped") -> None:
        """Stop the experiment cleanly: running trials end at their next report and are PAUSED
        with their checkpoints; pending trials stay PENDING. Safe to call from a listener."""
        if self.stopping is not None:
            return
        self.stopping = reason
        for trial_id in list(self.live):
            self.request_stop(trial_id)

    def stop_trial(self, trial_id: str, reason: str = "stopped by user") -> None:
        """End one trial cleanly, the others go on: a running trial stops at its next report
        (or is killed after the grace period), a waiting one never starts; either is
        TERMINATED with what it reported and checkpointed, and ``reason`` as its note."""
        trial = next((t for t in self.state.trials if t.trial_id == trial_id), None)
        if trial is None or trial.status in FINISHED_STATUSES:
            return
        trial.note = reason
        if trial_id in self.live:
            self.live[trial_id].pausing = False  # a stop wins over a scheduler's pause
            self.request_stop(trial_id)
            return
        self.complete(trial, TrialStatus.TERMINATED)
        self.persist_trial(trial)
        self.dirty = True

    def _take_control_requests(self) -> None:
        if self.control is None or self.stopping is not None:
            return
        for request in self.control.take():
            if request.action == STOP_TRIAL and request.trial_id:
                self.stop_trial(request.trial_id, request.reason)
            else:
                self.stop(request.reason)

    # -- trials a searcher makes ---------------------------------------------------------------
    def end_search(self, reason: str) -> None:
        """Ask the searcher for no more trials (a time budget ran out); those made go on as
        they are told. Safe to call from a listener."""
        if self.searched is not None:
            self.searched.end(reason)

    def may_search(self) -> bool:
        """Whether the searcher may still be asked for trials."""
        return self.searched is not None and self.searched.may_search()

    # -- events --------------------------------------------------------------------------------
    def handle_events(self, answer: bool = True) -> None:
        """Handle what the executor tells in one poll (results, exits, output); ``answer``: then
        answer the reports that wait for the scheduler's decisions."""
        for event in self.executor.poll(0.1):
            self._handle(event)
        if answer:
            self._answer_decisions()

    def _handle(self, event: AttemptEvent) -> None:
        if isinstance(event, OutputEvent):
            if self.run_config.verbose >= 1:
                self.emit("on_output", event.trial_id, event.stream, event.text)
            return
        live = self.live.get(event.trial_id)
        if live is None or live.attempt != event.attempt:
            return  # an attempt this controller no longer waits for
        trial = self.state.trial(event.trial_id)
        if event.kind is EventKind.RESULT:
            assert isinstance(event, ResultEvent)
            live.heard_at = time.monotonic()
            if not live.reported:
                live.reported = True
                record_recovery(trial, time.time())
            if VALIDATION_RECORD in event.row:  # a validation's outcome, merged into its row
                if take_validation(trial, event.row,
                                   self.checkpoint_config.checkpoint_score_attribute):
                    self.trial_files.apply_retention(trial)
                self.dirty = True
                return
            if CHECKPOINT_QUERY in event.row:  # a class trainable's row, not persisted yet
                return answer_checkpoint_query(self, trial, event)
            self._on_result(trial, event.row, event.awaits_decision)
        elif event.kind is EventKind.EXIT:
            assert isinstance(event, ExitEvent)
            self._on_exit(trial, live, event)
        else:
            live.hear(event, trial.attempts[-1], time.monotonic())

    def _on_result(self, trial: TrialRecord, row: dict, awaits_decision: bool = False) -> None:
        if take_result(trial, row, self.checkpoint_config.checkpoint_score_attribute):
            self.trial_files.apply_retention(trial)
        self.dirty = True
        self.emit("on_result", self.state, trial, row)
        answer = self.scheduling.on_result(trial, row, awaits_decision)
        if answer is None:
            return
        if awaits_decision:
            self._answers.append(answer)
        elif answer.answer != "continue" and trial.trial_id in self.live:
            self.request_stop(trial.trial_id)

    def _on_exit(self, trial: TrialRecord, live: LiveAttempt, exit_event: ExitEvent) -> None:
        self.live.pop(trial.trial_id, None)
        attempt = trial.attempts[-1]
        attempt.ended = time.time()
        attempt.end_iteration = trial.iteration
        end, error = attempt_end(live, exit_event)
        if self.resizing.ended(trial, live, exit_event, error):
            return  # a resize it was asked for: queued again, not a failure
        ending = policy.classify_end(end, attempt=attempt.number, iteration=trial.iteration,
                                     now=time.time())
        if ending.failure is not None and ending.failure.kind == FailureKind.STORAGE.value:
            # Recorded before the driver writes anything of it (error.txt may meet the same
            # full disk): the trial's own fault is the cause.
            fault = error.storage_fault if error is not None else None
            self.storage_stop.fault({**(fault or {}), "message": ending.failure.message},
                                    trial.trial_id)
        attempt.outcome = ending.outcome.value
        if ending.failure is not None:
            self._record_failure(trial, ending.failure)
            decision = policy.decide_after_failure(trial, ending.failure, self.failure_config,
                                                   stopping=bool(self.stopping))
            self._carry_out(trial, ending.failure, decision)
        elif ending.stopped_by_controller and self.scheduling.stopped(trial.trial_id):
            self.complete(trial, TrialStatus.TERMINATED)  # its scheduler's stop stands
        elif ending.stopped_by_controller and live.pausing and not self.stopping:
            trial.status = TrialStatus.PAUSED.value  # the scheduler resumes it when it chooses
        elif ending.stopped_by_controller:
            self.complete(trial, TrialStatus.PAUSED if self.stopping else TrialStatus.TERMINATED)
        else:
            self.complete(trial, TrialStatus.TERMINATED)
        exploit = self.scheduling.exploit_due(trial)
        if trial.status == TrialStatus.PAUSED and exploit is not None:
            self.starts.carry_out_exploit(trial, exploit)
        self.persist_trial(trial)
        self.dirty = True

    def _record_failure(self, trial: TrialRecord, failure: FailureRecord) -> None:
        trial.failures.append(failure)
        self.guard()
        paths = self.paths.trial(trial.dir_name)
        text = failure.describe()
        if failure.rank is not None:  # a group's: where the failing rank's output is
            text += rank_output_text(paths, failure)
        # (the failure is in the trial's record whatever becomes of this copy for readers)
        self.storage_stop.tolerating(lambda: self.storage.write_atomic(paths.error, text))
        self.emit("on_trial_failure", self.state, trial, failure)

    def _carry_out(self, trial: TrialRecord, failure: FailureRecord,
                   decision: policy.FailureDecision) -> None:
        if decision.status is TrialStatus.PENDING:
            trial.status = TrialStatus.PENDING.value  # started again from its checkpoint
            self.starts.enqueue(trial)
            return
        if decision.status is TrialStatus.ERRORED:
            trial.error = {"reason": decision.reason, "failure": failure.__dict__.copy()}
        self.complete(trial, decision.status)
        if decision.stop_experiment == policy.STORAGE_FAULT:
            self.storage_stop.fault({"message": failure.message}, trial.trial_id)
        elif decision.stop_experiment == "fail_fast":
            # At once, no further result (Ray's): killed, not asked to stop at a report (a
            # trial told both could end at its report before the kill landed). They count as
            # stopped by the controller all the same, PAUSED and resumable.
            self.stopping = self.stopping or "fail_fast"
            now = time.time()
            for trial_id, live in list(self.live.items()):
                if live.stop_requested_at is None:
                    live.stop_requested_at = now
                self.executor.kill(trial_id)
        elif decision.stop_experiment:
            self.stop(decision.stop_experiment)

    def complete(self, trial: TrialRecord, status: TrialStatus) -> None:
        """End ``trial`` with ``status`` (told to the listeners and the scheduler)."""
        trial.status = status.value
        self.emit("on_trial_complete", self.state, trial)
        if self.scheduler is not None and status in (TrialStatus.TERMINATED,
                                                     TrialStatus.ERRORED):
            self.scheduling.tell_ended(trial)

    # -- the trial scheduler's decisions, carried out ------------------------------------------
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
        for answer in answers:
            self.executor.decide(answer.trial_id, answer.iteration, answer.answer)
            if answer.answer != "continue":
                self.request_stop(answer.trial_id)  # (and killed if it does not end in time)

    # -- stopping ------------------------------------------------------------------------------
    def request_stop(self, trial_id: str) -> None:
        """Ask the running ``trial_id`` to stop (once; killed after the grace period)."""
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
        silent = hung_attempts(self.live, now=time.monotonic(),
                               timeout_s=self.failure_config.hang_timeout_s)
        for trial_id, silent_for_s in silent.items():
            self.live[trial_id].silent_for_s = silent_for_s
            self.executor.kill(trial_id)

    # -- persistence and listeners -------------------------------------------------------------
    def guard(self) -> None:
        """Before any write that could harm another owner: are we still the owner?"""
        if self.lease is not None:
            self.lease.check()

    def persist_trial(self, trial: TrialRecord) -> None:
        """Write the trial's own record at once (the experiment state is saved at most once a
        second): a driver killed right after a failure or a start loses nothing of either."""
        self.guard()
        trial.seq += 1
        data = json.dumps(trial.to_json(), default=str, allow_nan=True)
        self.storage_stop.tolerating(lambda: self.storage.write_atomic(
            self.paths.trial(trial.dir_name).record, data, durable=False))
        self._changed.add(trial.trial_id)
        if self.searched is not None:
            self.searched.persisted(trial)

    def save(self, final: bool = False, durable: bool = True) -> None:
        """Persist the experiment state now (the loop saves it at most once a second, what
        changed only; ``final``: the driver's last save, the whole state)."""
        self.guard()
        if self.scheduler is not None and self.scheduling.ready:
            self.state.scheduler = self.scheduling.record()
        if final:
            self.storage_stop.tolerating(lambda: self.state.save(self.paths, final=True))
        else:
            self.storage_stop.tolerating(lambda: self.state.save_changes(
                self.paths, self._changed, durable=durable))
        self.storage_stop.tolerating(lambda: self.index_entry.update(
            self.state, changed=bool(self._changed), final=final))
        self._changed = set()
        self.dirty = False
        self._last_save = time.time()
        if self.searched is not None:
            self.searched.saved(final)

    def _mark_dirty(self) -> None:
        self.dirty = True

    def emit(self, method: str, *args: Any) -> None:
        """Call ``method`` of every listener that has it."""
        for listener in self.listeners:
            fn = getattr(listener, method, None)
            if fn is not None:
                fn(*args)
