"""The trials a search algorithm makes as they can start (``TuneConfig(search_alg=...)``,
``num_samples=-1``): :class:`SearchedTrials`, the controller's side of a
:class:`~ftnb.core.searching.PersistedSearcher`.

It asks the searcher for a trial only when one can start now (so that the searcher sees every
result that came before), records the trial's folder and record, and queues it; the state
lists it at the controller's next save, the searcher's file holding the suggestion until then.
After a restore it records the trials of the suggestions the state did not list (adopts them)
before the searcher hears what it missed. The ordering rules that make a dead driver lose and
repeat nothing are :mod:`ftnb.core.searching`'s.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Optional

from .listeners import NullListener
from .records import FINISHED_STATUSES, ExperimentState, TrialRecord, TrialStatus, encode_value, parse_trial_record
from .searching import FINISHED, PersistedSearcher

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["SearchResults", "SearchedTrials"]


class SearchResults(NullListener):
    """Tells the searcher each result (once per ``training_iteration``)."""

    def __init__(self, search: PersistedSearcher) -> None:
        self.search = search

    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None:
        """Tell the searcher ``row`` of ``trial``."""
        self.search.on_result(trial.trial_id, row)


class SearchedTrials:
    """Makes, records and adopts the trials of ``search`` for ``controller`` (which holds the
    experiment state, its folder and the queue of trials to start)."""

    def __init__(self, controller: "Controller", search: PersistedSearcher) -> None:
        self.controller = controller
        self.search = search
        #: Why no more trials are asked for (a time budget, a searcher that cannot go on).
        self.ended: Optional[str] = None
        #: Trials the searcher made that the state on disk does not list yet: its file keeps
        #: their suggestions until a save lists them (a restore records them from there).
        self._unlisted: list[str] = []
        self._adopting = False

    def may_search(self) -> bool:
        """Whether the searcher may still be asked for trials."""
        return self.ended is None and self.search.may_suggest

    def end(self, reason: str) -> None:
        """Ask the searcher for no more trials (the first reason stands)."""
        if self.ended is None:
            self.ended = reason

    def adopt(self) -> None:
        """Before the trial scheduler is brought up to date (a restore): the searcher meets
        the scheduler, and the trials of the suggestions that the state does not list are
        recorded (from their own record when they got that far), so that the scheduler
        restores with every trial of the experiment (its brackets, its replayed results).
        The searcher hears of outcomes only in :meth:`start`, after the results it missed."""
        controller = self.controller
        self.search.guard = controller.guard
        self.search.searcher.set_scheduler(controller.scheduler)
        listed = {t.trial_id for t in controller.state.trials}
        self._adopting = True  # (until start: recover tells results before outcomes)
        for trial_id, config, dir_name in self.search.unlisted(listed):
            self._adopt(trial_id, config, dir_name)

    def start(self) -> None:
        """Before the loop runs, after :meth:`adopt` and the scheduler's restore: the
        searcher hears the results and outcomes it missed (a restore)."""
        self._adopting = False
        self.search.recover(self.controller.state.trials, self._rows_of)

    def _rows_of(self, trial: TrialRecord) -> list:
        return self.controller.paths.trial(trial.dir_name).read_results()

    def suggest_trial(self) -> Optional[TrialRecord]:
        """A new trial from the searcher, recorded and queued; None when it has none now."""
        controller = self.controller
        trial_id = self.search.trial_id(len(controller.state.trials))
        controller.guard()
        answer = self.search.suggest(trial_id)
        if answer is None:
            if not controller.live and controller.starts.next_pending() is None:
                # Nothing runs that could change its answer: waiting would never end.
                self.ended = (f"{self.search.searcher!r} suggested nothing while no "
                              "trial was running")
                print(f"ftnb: experiment {controller.state.name!r}: {self.ended}; no more "
                      "trials are made.", file=sys.stderr, flush=True)
            return None
        if answer == FINISHED:
            return None
        trial = TrialRecord(trial_id=trial_id, dir_name=trial_id, config=encode_value(answer))
        if controller.trial_setup is not None:
            request = controller.trial_setup(trial, answer)
            if request is not None:
                controller.trial_resources[trial_id] = request
        # Durable before anything of the trial is written: a restore records it from there.
        self.search.hold(trial_id, trial.dir_name)
        return self._record_trial(trial, answer)

    def _record_trial(self, trial: TrialRecord, config: Any) -> TrialRecord:
        """Lay out the folder and record of a trial the searcher made, and queue it. The state
        lists it at the next save (the searcher's file holds its suggestion until then: saving
        the whole state per trial would cost more than the trial, on a local disk's fsyncs)."""
        controller = self.controller
        controller.state.trials.append(trial)
        controller.configs[trial.trial_id] = config
        trial_paths = controller.paths.trial(trial.dir_name)
        controller.guard()
        controller.storage.makedirs(trial_paths.dir)
        controller.storage.write_atomic(
            trial_paths.params, json.dumps(trial.config, indent=1, default=str) + "\n",
            durable=False)
        controller.persist_trial(trial)
        self._unlisted.append(trial.trial_id)
        controller.dirty = True
        if trial.status == TrialStatus.PENDING:
            controller.starts.enqueue(trial)
        return trial

    def _adopt(self, trial_id: str, config: Any, dir_name: str) -> None:
        """After a restore: record the trial of a suggestion that the state did not list. Its
        own record, when it was written, says how far it got (it may have run: its files are
        reconciled as a listed trial's are); a finished one stays finished."""
        controller = self.controller
        trial_paths = controller.paths.trial(dir_name)
        record = None
        try:
            record = parse_trial_record(controller.storage.read_bytes(trial_paths.record),
                                        trial_id)
        except FileNotFoundError:
            pass
        if record is None:
            record = TrialRecord(trial_id=trial_id, dir_name=dir_name,
                                 config=encode_value(config))
        else:
            trial_paths.remove_leftover_temps()
            controller.trial_files.reconcile(record, controller.state.updated)
            if record.status not in FINISHED_STATUSES:
                record.status = TrialStatus.PENDING.value
        self._record_trial(record, config)

    def persisted(self, trial: TrialRecord) -> None:
        """``trial``'s record was written: once it is final, the searcher is told its outcome
        (after the record, so that a restore tells the searcher what it did not hear)."""
        if not self._adopting and trial.status in (TrialStatus.TERMINATED,
                                                   TrialStatus.ERRORED):
            self.search.on_complete(trial)

    def saved(self, final: bool) -> None:
        """The state was saved (``final``: the driver's last save): the trials it lists now
        need their suggestions kept no more."""
        if self._unlisted:
            for trial_id in self._unlisted:
                self.search.recorded(trial_id)
            self._unlisted = []
        if final:
            self.search.commit()  # (the suggestions it held are all listed now)

    def close(self, listed: set[str]) -> None:
        """The search is over for good: what the searcher asked for and no trial ever recorded
        (the driver died in between, and none was asked for again) is closed."""
        self.search.close(listed)
