"""The trial scheduler's bookkeeping (``TuneConfig(scheduler=...)``, :mod:`ftnb.schedulers`):
:class:`SchedulerBookkeeping`, which the controller holds, and :class:`SchedulerView`, what the
scheduler sees of the controller.

The scheduler is policy: it is told what happens and answers CONTINUE, PAUSE or STOP (or, PBT,
asks for an exploit). The bookkeeping turns each answer into a typed decision the controller
carries out (:class:`SchedulerAnswer` for a report, :class:`Exploit` for a trial that continues
from another's checkpoint), and records what the experiment state must hold for a restore to
go on exactly where the driver stopped (``ExperimentState.scheduler``):

* ``fed``: per trial, the last ``training_iteration`` the scheduler was fed (every trial it
  knows);
* ``decided``: the STOP, PAUSE and EXPLOIT decisions made and not yet shown by the trial's
  status (a report waiting for its decision is answered only once the state holding it is
  saved: a driver killed at any moment never leaves a decision carried out but lost);
* ``ended``: the trials it was told ended.

On a restore the scheduler gets its saved state back, the decisions the previous driver made are
carried out on the trials at rest, and the results it had not seen are replayed in the order
they came (:meth:`SchedulerBookkeeping.restore`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from . import exploits
from .records import FINISHED_STATUSES, TrialRecord, TrialStatus, encode_value
from ..execution.placement_groups import PlacementGroupFactory
from ..execution.resources import TrialResources
from ..schedulers.decision_points import DecisionPoints
from ..schedulers.stop_criterion import stop_met

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["Exploit", "SchedulerAnswer", "SchedulerBookkeeping", "SchedulerView"]

#: The answers a report that waits for a decision gets (see ``Executor.decide``).
CONTINUE, PAUSE, STOP = "continue", "pause", "stop"


@dataclass(frozen=True)
class SchedulerAnswer:
    """The decision on one report of ``trial_id`` at ``iteration``: ``answer`` is
    ``"continue"``, ``"pause"`` or ``"stop"``. A report that waits for it is answered (once the
    state is saved); one that does not is followed by a stop request unless it continues."""

    trial_id: str
    iteration: int
    answer: str


@dataclass(frozen=True)
class Exploit:
    """An exploit decided for ``trial_id`` and due now: it continues from ``donor_id``'s
    checkpoint staged in its folder with a new config (``decided``, as the state records it;
    see :mod:`ftnb.core.exploits`)."""

    trial_id: str
    donor_id: str
    decided: dict


#: Every report is a decision point (``training_iteration`` >= 0).
EVERY_REPORT = DecisionPoints("training_iteration", from_value=0)
#: Every report is a decision point, for a driver-side stopper only (no scheduler).
EVERY_REPORT_FOR_STOPPER = DecisionPoints("training_iteration", from_value=0, stopper_only=True)


class SchedulerBookkeeping:
    """What the controller knows of its trial scheduler (``scheduler``; None: the default,
    every trial to its end in order, no decision points, nothing saved). Holds the view the
    scheduler is given, and the ``fed`` / ``decided`` / ``ended`` records."""

    def __init__(self, controller: "Controller", scheduler: Any) -> None:
        self.controller = controller
        self.scheduler = scheduler
        self.view = SchedulerView(controller, self)
        #: See the module's docstring: per trial, the last training_iteration fed; the
        #: decisions not yet shown by the trial's status; the trials told they ended.
        self.fed: dict[str, int] = {}
        self.decided: dict[str, dict] = {}
        self.told_ended: set[str] = set()
        #: Whether every report waits for the controller's decision: a driver-side stopper
        #: (a Stopper subclass's __call__) decides at it, so the trial ends exactly there.
        self.every_report = False
        #: Whether the scheduler was brought up to date with the stored experiment (until then
        #: a save keeps the stored record: a restore saves before the loop runs).
        self.ready = False

    # -- decisions -----------------------------------------------------------------------------
    def on_result(self, trial: TrialRecord, row: dict,
                  awaits: bool) -> Optional[SchedulerAnswer]:
        """What to do after ``trial`` reported ``row`` (``awaits``: the report waits for the
        answer); None: nothing (the trial goes on)."""
        if self.scheduler is None:  # (every report waits only for a driver-side stopper)
            if not awaits:
                return None
            answer = STOP if self._being_stopped(trial.trial_id) else CONTINUE
            return SchedulerAnswer(trial.trial_id, int(trial.iteration), answer)
        if not awaits and stop_met(row, self.controller.run_config.stop):
            # Ray asks no scheduler about a result that meets the stop criterion: the trial
            # ends there (a PBT exploit decided at it would never run).
            self.fed[trial.trial_id] = max(self.fed.get(trial.trial_id, 0),
                                           int(row.get("training_iteration") or 0))
            return None
        return self._decide(trial, row)

    def _decide(self, trial: TrialRecord, row: dict) -> SchedulerAnswer:
        """The scheduler's decision on ``row``, recorded: carried out at once when the trial
        waits for it (answered once the state holding it is saved), else at its next report."""
        controller = self.controller
        trial_id = trial.trial_id
        iteration = int(row.get("training_iteration") or trial.iteration)
        live = controller.live.get(trial_id)
        self.fed[trial_id] = max(self.fed.get(trial_id, 0), iteration)
        decision = self.scheduler.on_trial_result(self.view, trial, row)
        controller.dirty = True
        if decision == "STOP":
            note = self.scheduler.stop_note(trial)
            self.decided[trial_id] = {"decision": "STOP", "iteration": iteration, "note": note}
            trial.note = note
            controller.persist_trial(trial)
            answer = STOP
        elif decision == "PAUSE":
            if not exploits.is_exploit(self.decided.get(trial_id)):  # (an exploit pauses too)
                self.decided[trial_id] = {"decision": "PAUSE", "iteration": iteration}
                trial.note = self._paused_note(iteration)
            if live is not None:
                live.pausing = True
            answer = PAUSE
        else:
            answer = CONTINUE
        if answer == CONTINUE and self._being_stopped(trial_id):
            answer = STOP  # it is being stopped anyway (a user, a stopper, the experiment)
        return SchedulerAnswer(trial_id, iteration, answer)

    def _being_stopped(self, trial_id: str) -> bool:
        """Whether the running ``trial_id`` is being stopped anyway (a user, a stopper, the
        experiment)."""
        live = self.controller.live.get(trial_id)
        return live is not None and (live.stop_requested_at is not None
                                     or bool(self.controller.stopping))

    def _paused_note(self, iteration: Any) -> str:
        return (f"paused by {type(self.scheduler).__name__} at "
                f"training_iteration={iteration}")

    def stopped(self, trial_id: str) -> bool:
        """Whether the scheduler's STOP stands for ``trial_id`` (its attempt was stopped)."""
        return self.decided.get(trial_id, {}).get("decision") == "STOP"

    def exploit_due(self, trial: TrialRecord) -> Optional[Exploit]:
        """The exploit decided for ``trial`` and not yet carried out, if any."""
        decided = self.decided.get(trial.trial_id)
        if not exploits.is_exploit(decided):
            return None
        assert decided is not None
        return Exploit(trial.trial_id, decided["donor"], decided)

    def forget(self, trial_id: str) -> None:
        """The decision on ``trial_id`` is carried out: its status shows it now."""
        self.decided.pop(trial_id, None)

    # -- the trials ----------------------------------------------------------------------------
    def add(self, trial: TrialRecord) -> None:
        """Tell the scheduler of ``trial`` (once; before it first starts)."""
        if trial.trial_id not in self.fed:
            self.fed[trial.trial_id] = 0
            self.scheduler.on_trial_add(self.view, trial)

    def decision_points(self, trial: TrialRecord) -> Any:
        """Which reports of ``trial``'s next attempt wait for a decision (None: none): every
        one when a driver-side stopper decides (:attr:`every_report`), else its scheduler's."""
        if self.scheduler is None:
            return EVERY_REPORT_FOR_STOPPER if self.every_report else None
        if self.every_report:
            self._points(trial)
            return EVERY_REPORT
        return self._points(trial)

    def _points(self, trial: TrialRecord) -> Any:
        """The scheduler told of ``trial``'s next attempt; its decision points for it."""
        self.add(trial)
        self.decided.pop(trial.trial_id, None)  # (a pause it resumes from)
        self.told_ended.discard(trial.trial_id)  # (an errored trial a restore runs again)
        if trial.note and trial.note.startswith("paused by "):
            trial.note = None
        return self.scheduler.decision_points(trial)

    def choose(self) -> Optional[TrialRecord]:
        """The trial the scheduler chooses to start (or resume) now, if any: PENDING or
        PAUSED and not running. The controller starts it when there is room."""
        controller = self.controller
        trial = self.scheduler.choose_trial_to_run(self.view)
        if trial is None and not controller.live and (
                controller.starts.next_pending() is None and not controller.may_search()):
            # Nothing runs (or will) that could make it resume a trial it paused: one goes
            # on rather than the experiment ending with trials left waiting.
            trial = next((t for t in controller.state.trials if t.trial_id in self.decided
                          and t.status == TrialStatus.PAUSED), None)
        if trial is None or trial.trial_id in controller.live or trial.status not in (
                TrialStatus.PENDING, TrialStatus.PAUSED):
            return None
        return trial

    def tell_ended(self, trial: TrialRecord) -> None:
        """Tell the scheduler that ``trial`` ended (once), and remove what an exploit it will
        not carry out staged in its folder."""
        if trial.trial_id in self.told_ended:
            return
        self.told_ended.add(trial.trial_id)
        decided = self.decided.pop(trial.trial_id, None)  # its status shows it now
        if exploits.is_exploit(decided) or getattr(self.scheduler, "_ftnb_exploits", False):
            # (An exploit it will not carry out; or one a dead driver staged and never saved.)
            exploits.remove_staged(self.controller.paths, trial)
        self.add(trial)
        if trial.status == TrialStatus.ERRORED:
            self.scheduler.on_trial_error(self.view, trial)
        else:
            self.scheduler.on_trial_complete(self.view, trial, trial.last_result)
        self.controller.dirty = True

    # -- the state -----------------------------------------------------------------------------
    def record(self) -> dict:
        """The scheduler as the experiment state records it (``ExperimentState.scheduler``)."""
        from ..schedulers import describe_scheduler

        return {**describe_scheduler(self.scheduler),
                "state": self.scheduler.get_state(),
                "fed": dict(self.fed),
                "decided": {k: dict(v) for k, v in self.decided.items()},
                "ended": sorted(self.told_ended)}

    def restore(self) -> None:
        """Bring the scheduler up to date with the experiment as stored (a restore; nothing
        for a new experiment): its saved state, the decisions the previous driver carried out
        (a trial it stopped stays stopped, one it paused waits), the results it had not seen
        (up to where each trial resumes: the rest are redone and seen then), and the trials
        that ended without it being told."""
        controller = self.controller
        stored = controller.state.scheduler
        if stored:
            self.scheduler.set_state(stored.get("state") or {})
            self.fed = {k: int(v) for k, v in (stored.get("fed") or {}).items()}
            self.decided = {k: dict(v) for k, v in (stored.get("decided") or {}).items()}
            self.told_ended = set(stored.get("ended") or [])
        for trial in controller.state.trials:
            self.add(trial)
        for trial_id, decided in list(self.decided.items()):
            self._carry_out_at_rest(controller.state.trial(trial_id), decided)
        replay = self._unseen_rows()
        for _, iteration, trial, row in replay:
            self._replay(trial, iteration, row)
        for trial in controller.state.trials:
            if trial.status in FINISHED_STATUSES:
                self.tell_ended(trial)
        self.ready = True
        if stored or replay:
            controller.save()

    def _unseen_rows(self) -> list[tuple[float, int, TrialRecord, dict]]:
        """The stored results the scheduler was not fed, in the order they came: per trial
        those past what it was fed, up to where the trial resumes (all, for a finished one)."""
        replay = []
        for trial in self.controller.state.trials:
            if not trial.attempts:
                continue
            done = trial.status in FINISHED_STATUSES
            upto = float("inf") if done else (trial.latest_checkpoint or {}).get("iteration", 0)
            seen = self.fed.get(trial.trial_id, 0)
            if trial.iteration <= seen:
                continue  # (no file to read: it reported nothing the scheduler missed)
            for row in self.controller.paths.trial(trial.dir_name).read_results():
                iteration = row.get("training_iteration") or 0
                if seen < iteration <= upto:
                    replay.append((row.get("timestamp") or 0.0, iteration, trial, row))
        replay.sort(key=lambda entry: (entry[0], entry[1]))
        return replay

    def _replay(self, trial: TrialRecord, iteration: int, row: dict) -> None:
        """Feed the scheduler a result it missed, and carry out its decision at rest."""
        self.fed[trial.trial_id] = max(self.fed.get(trial.trial_id, 0), iteration)
        if stop_met(row, self.controller.run_config.stop):
            return  # (as when it came: see on_result)
        decision = self.scheduler.on_trial_result(self.view, trial, row)
        if trial.status in FINISHED_STATUSES:
            return
        if decision == "STOP":
            decided = {"decision": "STOP", "iteration": iteration,
                       "note": self.scheduler.stop_note(trial)}
        elif exploits.is_exploit(self.decided.get(trial.trial_id)):
            decided = self.decided[trial.trial_id]  # (it pauses the trial too)
        elif decision == "PAUSE":
            decided = {"decision": "PAUSE", "iteration": iteration}
        else:
            return
        self.decided[trial.trial_id] = decided
        self._carry_out_at_rest(trial, decided)

    def _carry_out_at_rest(self, trial: TrialRecord, decided: dict) -> None:
        """A decision on a trial that runs no attempt (a restore): a STOP ends it TERMINATED
        with the scheduler's note, a PAUSE leaves it PAUSED for the scheduler to resume."""
        if trial.status in FINISHED_STATUSES:
            return
        if decided["decision"] == "STOP":
            trial.note = decided.get("note")
            # (Not told to the listeners: the experiment has not started for them yet.)
            trial.status = TrialStatus.TERMINATED.value
            self.tell_ended(trial)
        else:
            trial.status = TrialStatus.PAUSED.value
            trial.note = self._paused_note(decided.get("iteration"))
        self.controller.persist_trial(trial)


#: ``SchedulerView.stop_trial``'s note not given: the scheduler's own (its ``stop_note``).
_SCHEDULER_NOTE: Any = object()


class SchedulerView:
    """What the trial scheduler sees of the controller and may ask of it
    (:class:`ftnb.schedulers.SchedulerController`; Ray's ``tune_controller``)."""

    def __init__(self, controller: "Controller", book: SchedulerBookkeeping) -> None:
        self._controller = controller
        self._book = book

    def get_trials(self) -> list[TrialRecord]:
        """Every trial of the experiment, in its order."""
        return self._controller.state.trials

    def get_live_trials(self) -> list[TrialRecord]:
        """The trials that are not TERMINATED or ERRORED (Ray's name)."""
        return [t for t in self.get_trials()
                if t.status not in FINISHED_STATUSES]

    def get_trial(self, trial_id: str) -> TrialRecord:
        """The trial ``trial_id``."""
        return self._controller.state.trial(trial_id)

    def status_of(self, trial: TrialRecord) -> str:
        """``trial``'s status, PAUSED already for one whose attempt ends at a pause."""
        live = self._controller.live.get(trial.trial_id)
        if live is not None and live.pausing:
            return TrialStatus.PAUSED.value
        return str(trial.status)

    def stop_trial(self, trial: TrialRecord, note: Any = _SCHEDULER_NOTE) -> None:
        """End ``trial`` (see :class:`ftnb.schedulers.SchedulerController`); ``note`` None:
        it ran its budget (shown as completed)."""
        controller = self._controller
        if note is _SCHEDULER_NOTE:
            note = self._book.scheduler.stop_note(trial)
        if trial.trial_id in controller.live:
            self._book.decided[trial.trial_id] = {
                "decision": "STOP", "iteration": int(trial.iteration), "note": note}
        controller.stop_trial(trial.trial_id, note)  # type: ignore[arg-type]

    def pause_trial(self, trial: TrialRecord) -> None:
        """Pause running ``trial``: its attempt ends, it waits PAUSED to be chosen again."""
        controller = self._controller
        live = controller.live.get(trial.trial_id)
        if live is None:
            return
        live.pausing = True
        self._book.decided[trial.trial_id] = {"decision": "PAUSE",
                                              "iteration": int(trial.iteration)}
        controller.request_stop(trial.trial_id)

    # -- resources (ResourceChangingScheduler; ftnb.execution.tune_controller.TuneController) --
    def get_total_resources(self) -> dict:
        """Everything the executor has, used or not: ``{"CPU": n, "GPU": m}``."""
        capacity = self._controller.executor.capacity()
        return {"CPU": float(capacity.cpus), "GPU": float(capacity.gpus)}

    def get_trial_resources(self, trial: TrialRecord) -> PlacementGroupFactory:
        """What ``trial``'s next attempt asks for (per rank for a group), as bundles."""
        if trial.resource_changes:
            last = trial.resource_changes[-1]
            return PlacementGroupFactory(last["bundles"], last["strategy"])
        request = self._controller.starts.resources_of(trial)
        given = getattr(self._controller.trainable, "_ftnb_resources", None)
        if isinstance(given, PlacementGroupFactory) and (
                TrialResources.from_user(given) == request):
            return given  # (with_resources(PlacementGroupFactory(...)): its bundles)
        return PlacementGroupFactory.from_amounts(request.cpu, request.gpu)

    def resources_problem(self, resources: PlacementGroupFactory) -> Optional[str]:
        """Why an attempt asking for ``resources`` could never start here (None: it could)."""
        try:
            self._controller.executor.check_fits(TrialResources.from_user(resources),
                                                 self._controller.num_workers)
        except ValueError as exc:
            return str(exc)
        return None

    def change_trial_resources(self, trial: TrialRecord, resources: PlacementGroupFactory,
                               by: str) -> None:
        """From now on ``trial``'s attempts ask for ``resources``: recorded in its record's
        ``resource_changes`` (the commit: a restore reads them there); nothing when they
        already do (a restore carrying out a change again)."""
        controller = self._controller
        if self.get_trial_resources(trial) == resources:
            return
        old = controller.starts.resources_of(trial)
        trial.resource_changes.append({
            "iteration": int(trial.iteration), "old": old.as_dict(),
            "new": TrialResources.from_user(resources).as_dict(),
            "bundles": resources.bundles, "strategy": resources.strategy, "by": by,
            "time": time.time()})
        controller.persist_trial(trial)
        controller.dirty = True

    def next_pending_trial(self) -> Optional[TrialRecord]:
        """The PENDING trial the controller would start next, or None."""
        return self._controller.starts.next_pending()

    def may_add_trials(self) -> bool:
        """Whether the searcher may still make trials."""
        return self._controller.may_search()

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
        if not self._exploit_fits(trial, donor, config):
            return None
        decided = exploits.stage(controller.paths, trial, donor, config, controller.guard)
        if decided is None:
            return None
        self._book.decided[trial.trial_id] = decided
        trial.note = (f"paused by {type(self._book.scheduler).__name__} at training_iteration="
                      f"{decided['iteration']}: continues from trial {donor.trial_id}'s "
                      f"{decided['donor_checkpoint']}")
        if live is not None:
            live.pausing = True
        else:
            controller.persist_trial(trial)
        controller.dirty = True
        return decided

    def _exploit_fits(self, trial: TrialRecord, donor: TrialRecord, config: Any) -> bool:
        """Whether what ``trial`` would ask for with the explored ``config`` (a resources
        function of the config) can ever be had here; says why not when it cannot."""
        controller = self._controller
        live_config = exploits.live_config(encode_value(config),
                                           controller.configs.get(donor.trial_id), donor.config)
        request = controller.starts.config_resources(trial.trial_id, live_config)
        if request is None:
            return True
        try:
            controller.executor.check_fits(request, controller.num_workers)
        except ValueError as exc:
            print(f"ftnb: trial {trial.trial_id} does not exploit trial {donor.trial_id}: "
                  f"with_resources(...) asks {request.as_dict()} for the explored config "
                  f"{config!r}, which can never be had here ({exc}). It goes on with its "
                  "own config. Fix: a resources function that fits every config the "
                  "scheduler may explore (or hyperparam_mutations that stay within it).",
                  file=sys.stderr, flush=True)
            return False
        return True
