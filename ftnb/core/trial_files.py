"""A trial's record against its files.

A trial's own process writes every acknowledged report (``result.json``) and checkpoint; the
record the driver keeps (``trial.json``, the experiment state) follows them and may lag behind.
:class:`TrialFiles` keeps the two in line: it brings a record up to date with the files after a
driver died (:meth:`~TrialFiles.reconcile`), starts a trial over (:meth:`~TrialFiles.reset`),
drops the result rows that a restarted attempt redoes (:meth:`~TrialFiles.rows_up_to`), and deletes
checkpoint debris and the checkpoints that retention drops. The controller uses it at every attempt
start and result; restore (:mod:`ftnb.lifecycle`) before it resumes trials. The experiment's trial
folders themselves are laid out by :func:`lay_out_trial_folders`.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

from ..config import CheckpointConfig, metric_value
from ..storage import (
    CHECKPOINT_MARKER,
    ExperimentPaths,
    checkpoint_index,
    is_temporary_checkpoint,
)
from ..storage.checkpoint_files import checkpoint_damage
from ..storage.json_lines import damaged_tail, read_json_lines
from ..storage.lease import Lease
from ..storage.result_log import ResultLog
from . import policy
from .live_attempt import validation_pending
from .recoveries import CHECKPOINT_PASSED_OVER, RESULTS_TAIL_CUT, STARTED_OVER, recovery
from .records import AttemptOutcome, AttemptRecord, ExperimentState, TrialRecord

__all__ = ["TrialFiles", "lay_out_trial_folders", "remove_leftover_temps"]


class TrialFiles:
    """The files of an experiment's trials, kept in line with their records.

    Every write first checks that ``lease`` (when given) is still ours, so that a driver that
    lost the experiment to another never harms the new owner's files.
    """

    def __init__(self, paths: ExperimentPaths, checkpoint_config: CheckpointConfig,
                 lease: Optional[Lease] = None) -> None:
        self.paths = paths
        self.storage = paths.storage
        self.checkpoint_config = checkpoint_config
        self.lease = lease

    def _guard(self) -> None:
        """Before any write that could harm another owner: are we still the owner?"""
        if self.lease is not None:
            self.lease.check()

    # -- starting an attempt -------------------------------------------------------------------
    def rows_up_to(self, trial: TrialRecord, iteration: int) -> list[dict]:
        """The trial's result rows up to ``iteration``; rows past it (reported after the
        checkpoint the trial restarts from) are removed from its files, so that no
        ``training_iteration`` appears twice once the attempt redoes them."""
        if not trial.attempts:
            return []  # a trial that never ran has no rows and no checkpoints yet
        trial_paths = self.paths.trial(trial.dir_name)
        rows = trial_paths.read_results()
        keep = [r for r in rows if r.get("training_iteration", 0) <= iteration]
        if len(keep) != len(rows):
            self._guard()
            ResultLog(trial_paths, existing=keep).rewrite(keep)
            lost = len(rows) - len(keep)
            trial.attempts[-1].lost_iterations = lost
            failure = trial.failures[-1] if trial.failures else None
            if failure is not None and failure.attempt == trial.attempts[-1].number:
                failure.lost_iterations = lost
        self.remove_checkpoint_debris(trial)
        return keep

    def remove_checkpoint_debris(self, trial: TrialRecord) -> None:
        """Delete checkpoint folders that no acknowledged report names (an attempt died while
        writing them) and temporary copies, so the next attempt can reuse their numbers."""
        trial_paths = self.paths.trial(trial.dir_name)
        known = {c["dir_name"] for c in trial.checkpoints}
        latest = trial.latest_checkpoint
        if latest:
            known.add(latest["dir_name"])
        for name in self.storage.listdir(trial_paths.dir):
            index = checkpoint_index(name)
            debris = is_temporary_checkpoint(name) or (
                index is not None and name not in known and index >= trial.next_checkpoint_index
            )
            if debris:
                self._guard()
                self.storage.remove(trial_paths.checkpoint(name), recursive=True)

    # -- retention -----------------------------------------------------------------------------
    def apply_retention(self, trial: TrialRecord) -> None:
        """Delete the checkpoints that the checkpoint config no longer keeps
        (:func:`ftnb.core.policy.checkpoints_to_delete`) and drop them from the record."""
        doomed = policy.checkpoints_to_delete(trial.checkpoints, self.checkpoint_config)
        if not doomed:
            return
        self._guard()
        for entry in doomed:
            self.storage.remove(
                self.paths.trial(trial.dir_name).checkpoint(entry["dir_name"]), recursive=True
            )
        names = {e["dir_name"] for e in doomed}
        trial.checkpoints = [c for c in trial.checkpoints if c["dir_name"] not in names]

    # -- restore -------------------------------------------------------------------------------
    def reconcile(self, trial: TrialRecord, driver_last_saved: float,
                  folder_was_missing: bool = False) -> list[dict]:
        """Bring a trial's record up to date with its files, after its driver died; return what
        it fell back to for damaged files (:mod:`ftnb.core.recoveries` entries).

        The trial's process wrote every acknowledged report (``result.json``) and checkpoint
        itself; the driver's record of them may lag. The files are the truth: the trial resumes
        from the newest complete checkpoint that a result row acknowledged and whose files
        match its marker (an older one when the newest is damaged, none when none is intact);
        lines that are not rows at the end of ``result.json`` are cut off. An attempt left
        running that reported nothing ends at ``driver_last_saved`` (the state's ``updated``).
        """
        trial_paths = self.paths.trial(trial.dir_name)
        rows, recoveries = self._results_without_damaged_tail(trial)
        attr = self.checkpoint_config.checkpoint_score_attribute
        by_name = {c["dir_name"]: c for c in trial.checkpoints}
        highest = trial.next_checkpoint_index - 1
        for row in rows:
            name = row.get("checkpoint_dir_name")
            if not name:
                continue
            highest = max(highest, checkpoint_index(name) or 0)
            if name in by_name and "validation" in row:
                # a validation recorded in the row after the driver last saved its record
                if attr:
                    by_name[name]["score"] = metric_value(row, attr)
                if not validation_pending(row):
                    by_name[name].pop("validation_pending", None)
            if name not in by_name:
                entry = {
                    "dir_name": name,
                    "iteration": row.get("training_iteration", 0),
                    "time_total_s": row.get("time_total_s", 0.0),
                }
                if attr:
                    entry["score"] = metric_value(row, attr)
                if validation_pending(row):
                    entry["validation_pending"] = True
                by_name[name] = entry
        present = set(trial_paths.checkpoint_dirs())
        trial.checkpoints = sorted(
            (c for name, c in by_name.items() if name in present), key=lambda c: c["iteration"]
        )
        recoveries += self._pass_over_damaged_checkpoints(trial, by_name, folder_was_missing)
        trial.latest_checkpoint = dict(trial.checkpoints[-1]) if trial.checkpoints else None
        trial.next_checkpoint_index = highest + 1
        if rows:
            trial.iteration = rows[-1].get("training_iteration", trial.iteration)
            trial.last_result = rows[-1]
        seen_attempts = {r.get("attempt") for r in rows if isinstance(r.get("attempt"), int)}
        for number in sorted(a for a in seen_attempts if a > len(trial.attempts)):
            first = next(r for r in rows if r.get("attempt") == number)
            trial.attempts.append(
                AttemptRecord(number=number, started=first.get("timestamp", 0.0),
                              start_iteration=first.get("training_iteration", 1) - 1)
            )
        if trial.attempts and trial.attempts[-1].outcome == AttemptOutcome.RUNNING:
            attempt = trial.attempts[-1]
            own = [r for r in rows if r.get("attempt") == attempt.number]
            attempt.outcome = AttemptOutcome.INTERRUPTED.value
            attempt.ended = own[-1].get("timestamp") if own else driver_last_saved
            attempt.end_iteration = trial.iteration
        if len(trial.checkpoints) > (self.checkpoint_config.num_to_keep or sys.maxsize):
            self.apply_retention(trial)
        self._remove_half_deleted_checkpoints(trial)
        return recoveries

    def _remove_half_deleted_checkpoints(self, trial: TrialRecord) -> None:
        """Delete the numbered checkpoint folders older than the newest one kept that have no
        marker and are not kept: what a retention cut short by the driver's death left (a
        recursive delete may take the marker first). Nothing lists or restores a folder without
        its marker, so no later retention would ever delete it. Only where retention deletes
        (``num_to_keep``): otherwise such a folder is damage that ftnb did not make, left for a
        look."""
        if not trial.checkpoints or not self.checkpoint_config.num_to_keep:
            return
        newest = checkpoint_index(trial.checkpoints[-1]["dir_name"])
        if newest is None:
            return
        trial_paths = self.paths.trial(trial.dir_name)
        kept = {c["dir_name"] for c in trial.checkpoints}
        for name in self.storage.listdir(trial_paths.dir):
            index = checkpoint_index(name)
            if (index is not None and index < newest and name not in kept
                    and not self.storage.exists(trial_paths.checkpoint_marker(name))):
                self._guard()
                self.storage.remove(trial_paths.checkpoint(name), recursive=True)

    def _results_without_damaged_tail(self, trial: TrialRecord) -> tuple[list[dict], list[dict]]:
        """The trial's result rows, after cutting off lines at the end of ``result.json`` that
        are not rows (garbage or NUL bytes a crash left, a torn line): a resumed attempt would
        append its rows after them, and the file would then be damaged inside, unreadable.
        Damage followed by rows is not guessed at: :class:`CorruptFileError` says where."""
        trial_paths = self.paths.trial(trial.dir_name)
        try:
            data = self.storage.read_bytes(trial_paths.results)
        except FileNotFoundError:
            return [], []
        source = self.storage.uri(trial_paths.results)
        end = damaged_tail(data)
        if end == len(data):
            return read_json_lines(data, source=source), []
        rows = read_json_lines(data[:end], source=source)
        self._guard()
        ResultLog(trial_paths, existing=rows).rewrite(rows)
        cut = data[end:]
        shown = cut[:40].decode("utf-8", "replace")
        return rows, [recovery(
            RESULTS_TAIL_CUT,
            f"trial {trial.trial_id}: cut {len(cut)} bytes that are not result rows off the end "
            f"of {source} ({shown!r}{'...' if len(cut) > 40 else ''}); its {len(rows)} rows "
            "are kept and the trial goes on after the last of them.",
            trial.trial_id)]

    def _pass_over_damaged_checkpoints(self, trial: TrialRecord, acknowledged: dict[str, dict],
                                       folder_was_missing: bool = False) -> list[dict]:
        """Drop the trial's newest checkpoints while their files do not match their markers
        (:func:`~ftnb.storage.checkpoint_files.checkpoint_damage`), so that it resumes from
        the newest intact one; the damaged folders are left as they are, for a look. Say so,
        as for the newer checkpoints that reports acknowledged (``acknowledged``, by name) but
        that are gone or incomplete (retention never deletes the latest one), or that the
        trial's whole folder was missing (``folder_was_missing``: deleted, and laid out again
        empty by the restore)."""
        trial_paths = self.paths.trial(trial.dir_name)
        if folder_was_missing and (acknowledged or trial.iteration or trial.attempts):
            trial.checkpoints = []
            return [recovery(
                STARTED_OVER,
                f"trial {trial.trial_id} starts over from scratch: its folder "
                f"{self.storage.uri(trial_paths.dir)} is missing (deleted?), and its results and "
                "checkpoints with it.", trial.trial_id, reason="its folder was missing")]
        problems = []
        kept = trial.checkpoints[-1]["iteration"] if trial.checkpoints else -1
        for name, entry in sorted(acknowledged.items(), key=lambda item: item[1]["iteration"]):
            if entry["iteration"] > kept:
                problems.append(f"{name} (iteration {entry['iteration']}) is missing or "
                                f"incomplete (no {CHECKPOINT_MARKER})")
        while trial.checkpoints:
            entry = trial.checkpoints[-1]
            damage = checkpoint_damage(self.storage, trial_paths.checkpoint(entry["dir_name"]))
            if damage is None:
                break
            trial.checkpoints.pop()
            problems.append(f"{entry['dir_name']} (iteration {entry['iteration']}) is damaged: "
                            f"{damage}")
        if not problems:
            return []
        said = "; ".join(problems)
        if trial.checkpoints:
            older = trial.checkpoints[-1]
            return [recovery(
                CHECKPOINT_PASSED_OVER,
                f"trial {trial.trial_id} resumes from its checkpoint {older['dir_name']} "
                f"(iteration {older['iteration']}), the newest intact one: {said}.",
                trial.trial_id)]
        return [recovery(
            STARTED_OVER,
            f"trial {trial.trial_id} starts over from scratch, as none of its checkpoints is "
            f"intact: {said}.", trial.trial_id, reason="none of its checkpoints was intact")]

    def reset(self, trial: TrialRecord) -> None:
        """Start a trial over from scratch (restore with ``restart_errored``): its results and
        checkpoints go; its id, folder and history of attempts and failures stay."""
        trial_paths = self.paths.trial(trial.dir_name)
        self._guard()
        ResultLog(trial_paths, existing=[]).rewrite([])
        for name in self.storage.listdir(trial_paths.dir):
            if checkpoint_index(name) is not None or is_temporary_checkpoint(name):
                self.storage.remove(trial_paths.checkpoint(name), recursive=True)
        trial.checkpoints = []
        trial.latest_checkpoint = None
        trial.iteration = 0
        trial.last_result = None
        if trial.attempts and trial.attempts[-1].outcome == AttemptOutcome.RUNNING:
            trial.attempts[-1].outcome = AttemptOutcome.INTERRUPTED.value


def lay_out_trial_folders(paths: ExperimentPaths, state: ExperimentState,
                          only_missing: bool) -> frozenset[str]:
    """Create each trial's folder with its ``params.json`` (only the missing ones if
    ``only_missing``: a driver may have died while laying them out); return the ids of the
    trials whose very folder was missing (with ``only_missing``: deleted since, or never laid
    out)."""
    storage = paths.storage
    missing = set()
    for trial in state.trials:
        trial_paths = paths.trial(trial.dir_name)
        if only_missing and storage.exists(trial_paths.params):
            continue
        if only_missing and not storage.exists(trial_paths.dir):
            missing.add(trial.trial_id)
        storage.makedirs(trial_paths.dir)
        # Made durable all at once below: two fsyncs per file were most of the start of an
        # experiment of 10,000 trials (about 4 ms each on a VM's disk).
        storage.write_atomic(
            trial_paths.params, json.dumps(trial.config, indent=1, default=str) + "\n",
            durable=False,
        )
    storage.sync()
    return frozenset(missing)


def remove_leftover_temps(paths: ExperimentPaths, state: ExperimentState) -> None:
    """Delete the temporary files of atomic writes that a dead driver or trial left (a driver
    killed while it laid out the experiment leaves ``.experiment_state.prev.json.<hex>.tmp``).
    Only as the owner, once the previous owner's processes are gone: only files that the owner
    and its trials write, never ``owner.json`` (a would-be owner writes it before it owns)
    nor ``control/`` (its senders')."""
    paths.remove_leftover_temps()
    for trial in state.trials:
        paths.trial(trial.dir_name).remove_leftover_temps()
