"""Reconciling a restored experiment's records with its files: the fallbacks its state was
read with are recorded and said (:func:`note_fallbacks`), and every trial is brought up to date
with its own files and set to run, or not, as the restore asks (:func:`resume_trials`; what it
does to the files is :class:`ftnb.core.trial_files.TrialFiles`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.records import ExperimentState, TrialStatus
from ..core.recoveries import PREVIOUS_STATE, recovery, say
from ..core.trial_files import TrialFiles
from ..storage import STATE_BACKUP_FILE, ExperimentPaths

if TYPE_CHECKING:
    from .plan_restore import RestoreFlags

__all__ = ["note_fallbacks", "resume_trials"]


def note_fallbacks(paths: ExperimentPaths, state: ExperimentState) -> None:
    """Record and say it when ``state`` was not read from the latest state file: from its
    previous generation (the latest was damaged or missing), or rebuilt from the trials' files
    (a journal segment both list was); what happened since is taken from the trials' own
    records and result files, but it must not happen in silence."""
    from ..core.state_rebuild import REBUILT

    if state.loaded_from == REBUILT:
        say(state.recoveries[-1:])  # (rebuild_state recorded it)
        return
    if state.loaded_from != paths.state_backup:
        return
    entry = recovery(
        PREVIOUS_STATE,
        f"the experiment state {paths.storage.uri(paths.state)} is damaged or missing; read "
        f"its previous generation ({STATE_BACKUP_FILE}) instead, and the trials' own records "
        "and result files for what happened since.")
    state.recoveries.append(entry)
    say([entry])


def resume_trials(state: ExperimentState, flags: RestoreFlags, trial_files: TrialFiles,
                  missing_folders: frozenset = frozenset()) -> None:
    """Bring every trial up to date with its files and set it to run (or not) as asked; an
    errored trial that runs again gets a fresh failure budget. Then the state is the
    controller's to run. What it fell back to for damaged files (or a trial's folder among
    ``missing_folders``, deleted) is added to ``state.recoveries`` and said
    (:mod:`ftnb.core.recoveries`)."""
    recoveries: list[dict] = []
    for trial in state.trials:
        status = trial.status
        if status == TrialStatus.TERMINATED:
            continue
        if status == TrialStatus.ERRORED:
            if flags.restart_errored:
                trial_files.reset(trial)
            elif flags.resume_errored:
                recoveries += trial_files.reconcile(trial, state.updated,
                                                    trial.trial_id in missing_folders)
            else:
                continue
            trial.failures_forgiven = len(trial.failures)
            trial.error = None
            trial.status = TrialStatus.PENDING.value
            continue
        recoveries += trial_files.reconcile(trial, state.updated,
                                            trial.trial_id in missing_folders)
        if flags.resume_unfinished:
            trial.status = TrialStatus.PENDING.value
        else:
            trial.status = TrialStatus.TERMINATED.value
            trial.note = "not resumed: restored with resume_unfinished=False"
    state.recoveries += recoveries
    say(recoveries)
