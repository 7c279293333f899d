"""The checkpoint options of ``report(...)`` (Ray Train's keyword names), checked before any work:
:func:`plan_checkpoint` turns them into a :class:`CheckpointPlan` or raises
:class:`ReportOptionError` naming the argument, the value and the fix; :func:`write_checkpoint`
carries a plan out (copy, ``checkpoint_upload_fn``, or registration in place).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..checkpoint import Checkpoint, CheckpointUploadMode
from .checkpoint_uploads import finish_shards, register_folder, write_shard
from .faults import waiting_out_faults
from .file_names import (
    ERROR_FILE,
    PARAMS_FILE,
    PROGRESS_FILE,
    RESULTS_FILE,
    STAGED_EXPLOIT_PREFIX,
    STDERR_FILE,
    STDOUT_FILE,
    TRIAL_RECORD_FILE,
    checkpoint_index,
)

if TYPE_CHECKING:
    from .backend import Storage
    from .paths import TrialPaths

__all__ = ["CheckpointPlan", "ReportJob", "ReportOptionError", "plan_checkpoint",
           "write_checkpoint"]

_TRIAL_FILES = (PARAMS_FILE, TRIAL_RECORD_FILE, RESULTS_FILE, PROGRESS_FILE, ERROR_FILE)


class ReportOptionError(ValueError):
    """An option of ``report(...)`` that cannot work (the session raises it as a UsageError)."""


@dataclass
class CheckpointPlan:
    """Where and how one reported checkpoint goes (see :func:`plan_checkpoint`)."""

    checkpoint: Checkpoint
    mode: CheckpointUploadMode
    #: The name the trainable chose (``checkpoint_dir_name``), else None: numbered by ftnb.
    dir_name: Optional[str]
    delete_local: bool
    upload_fn: Optional[Callable[[Checkpoint, str], Any]]

    @property
    def local(self) -> bool:
        return self.checkpoint._storage.is_local


def check_upload_mode(mode: Any) -> CheckpointUploadMode:
    """``mode`` as a :class:`CheckpointUploadMode` (its name as a string is taken too)."""
    if mode is None:
        return CheckpointUploadMode.SYNC
    if isinstance(mode, CheckpointUploadMode):
        return mode
    if isinstance(mode, str) and mode.upper() in CheckpointUploadMode.__members__:
        return CheckpointUploadMode[mode.upper()]
    raise ReportOptionError(
        f"report(checkpoint_upload_mode={mode!r}): not an upload mode. Fix: one of "
        "ftnb.CheckpointUploadMode.SYNC (the default), .ASYNC or .NO_UPLOAD.")


def check_dir_name(name: Any) -> Optional[str]:
    """``checkpoint_dir_name``: None, or one plain folder name inside the trial's folder."""
    if name is None:
        return None
    fix = "Fix: a plain folder name such as 'epoch_0005', or None to let ftnb number it."
    if not isinstance(name, str):
        raise ReportOptionError(f"report(checkpoint_dir_name={name!r}) needs a str; got "
                                f"{type(name).__name__}. {fix}")
    escapes = (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
               or os.path.isabs(name))
    if escapes:
        raise ReportOptionError(
            f"report(checkpoint_dir_name={name!r}): a checkpoint's folder is one folder inside "
            f"the trial's folder; this name is empty or leaves it. {fix}")
    if name.startswith(".") or len(name.encode()) > 200:
        raise ReportOptionError(
            f"report(checkpoint_dir_name={name!r}): names starting with '.' are ftnb's "
            f"temporary folders, and a name is at most 200 bytes. {fix}")
    if (name in _TRIAL_FILES or name.startswith((STDOUT_FILE, STDERR_FILE, STAGED_EXPLOIT_PREFIX))
            or checkpoint_index(name) is not None):
        raise ReportOptionError(
            f"report(checkpoint_dir_name={name!r}) is a name ftnb gives the trial's own files "
            f"(its results, output, or numbered checkpoints checkpoint_NNNNNN). {fix}")
    return name


def plan_checkpoint(checkpoint: Optional[Checkpoint], *, dir_name: Any, mode: Any,
                    delete_local: Any, upload_fn: Any, paths: "TrialPaths",
                    used_names: set[str]) -> Optional[CheckpointPlan]:
    """Check the checkpoint options of one report; None when there is no checkpoint.
    ``used_names``: the checkpoint names the trial's rows (and pending uploads) already use."""
    mode = check_upload_mode(mode)
    dir_name = check_dir_name(dir_name)
    if delete_local is not None and not isinstance(delete_local, bool):
        raise ReportOptionError(
            f"report(delete_local_checkpoint_after_upload={delete_local!r}) needs True, False "
            "or None (None: True for ASYNC, False otherwise).")
    if upload_fn is not None and not callable(upload_fn):
        raise ReportOptionError(
            f"report(checkpoint_upload_fn={upload_fn!r}) is not callable. Fix: a function "
            "fn(checkpoint, dir_name) that writes the files to the trial's folder under "
            "dir_name and returns ftnb.Checkpoint(that folder).")
    if checkpoint is None:
        return None
    if dir_name is not None and dir_name in used_names:
        raise ReportOptionError(
            f"report(checkpoint_dir_name={dir_name!r}): an earlier report of this trial "
            "already named its checkpoint so. Fix: a new name for every checkpoint (e.g. with "
            "the epoch in it), or None to let ftnb number them.")
    if mode is CheckpointUploadMode.NO_UPLOAD:
        dir_name = _check_in_place(checkpoint, dir_name, delete_local, upload_fn, paths)
    delete = mode.default_delete_local_checkpoint_after_upload() if delete_local is None \
        else delete_local
    if delete and not checkpoint._storage.is_local:
        if delete_local:
            raise ReportOptionError(
                "report(delete_local_checkpoint_after_upload=True) deletes a local folder, but "
                f"the checkpoint is at {checkpoint.uri}. Fix: leave it None or False.")
        delete = False
    return CheckpointPlan(checkpoint, mode, dir_name, delete, upload_fn)


def _check_in_place(checkpoint: Checkpoint, dir_name: Optional[str], delete_local: Any,
                    upload_fn: Any, paths: "TrialPaths") -> str:
    """NO_UPLOAD: the checkpoint's folder must already be a folder of the trial's; its name."""
    mode = "checkpoint_upload_mode=NO_UPLOAD"
    if upload_fn is not None or delete_local:
        raise ReportOptionError(
            f"report({mode}) registers the reported folder where it is: it takes no "
            "checkpoint_upload_fn and deletes nothing. Fix: drop those arguments, or use SYNC "
            "or ASYNC.")
    storage = paths.storage
    trial_dir = storage.uri(paths.dir).rstrip("/")
    parent, _, name = checkpoint.uri.rstrip("/").rpartition("/")
    if parent != trial_dir:
        raise ReportOptionError(
            f"report({mode}): the checkpoint {checkpoint.uri} is not a folder directly in the "
            f"trial's folder {trial_dir}. Fix: write it to os.path.join(ftnb.get_context()."
            "get_trial_dir(), name) first, or use SYNC or ASYNC to have ftnb copy it there.")
    if dir_name is not None and dir_name != name:
        raise ReportOptionError(
            f"report({mode}, checkpoint_dir_name={dir_name!r}): the reported folder is named "
            f"{name!r}, and it is registered where it is. Fix: leave checkpoint_dir_name out.")
    if checkpoint_index(name) is None:
        check_dir_name(name)
    return name


def write_checkpoint(plan: CheckpointPlan, source: Optional[str], storage: "Storage",
                     paths: "TrialPaths", name: str, marker: dict) -> None:
    """Carry out ``plan``: the checkpoint is whole at ``paths.checkpoint(name)`` when this
    returns. ``source``: the local folder to copy (the snapshot of an ASYNC report), else the
    checkpoint's own folder."""
    dest = paths.checkpoint(name)
    if plan.mode is CheckpointUploadMode.NO_UPLOAD:
        register_folder(storage, dest, marker)
        return
    if plan.upload_fn is not None:
        given = Checkpoint(source) if source is not None else plan.checkpoint
        returned = plan.upload_fn(given, name)
        if not isinstance(returned, Checkpoint):
            raise ReportOptionError(
                f"report(checkpoint_upload_fn={plan.upload_fn!r}) returned "
                f"{type(returned).__name__}: {returned!r}, not an ftnb.Checkpoint. Fix: return "
                "ftnb.Checkpoint(folder) for the folder it wrote.")
        where = storage.uri(dest).rstrip("/")
        if returned.uri.rstrip("/") != where:
            raise ReportOptionError(
                f"report(checkpoint_upload_fn=...) returned {returned!r}, but the checkpoint "
                f"must be written to the trial's folder under dir_name: {where}. Fix: write "
                "the files there and return ftnb.Checkpoint of that folder.")
        register_folder(storage, dest, marker)
        return
    if plan.dir_name is not None and not storage.is_local and storage.exists(dest):
        storage.remove(dest, recursive=True)  # debris of a killed upload: no file of it stays
    if source is not None:
        storage.persist_directory(source, dest, marker)
    else:
        with plan.checkpoint.as_directory() as local:
            storage.persist_directory(local, dest, marker)


def delete_local_folder(plan: CheckpointPlan) -> None:
    """``delete_local_checkpoint_after_upload``: the reported local folder goes (gone is fine:
    a TemporaryDirectory the trainable left already)."""
    if plan.delete_local and plan.local and plan.mode is not CheckpointUploadMode.NO_UPLOAD:
        shutil.rmtree(plan.checkpoint.path, ignore_errors=True)


class ReportJob:
    """One report's writes, in order: its checkpoint (whole, see
    :func:`~ftnb.storage.reported_checkpoints.write_checkpoint`), its row (durable with a
    checkpoint), then the message to the controller. Run at once (``SYNC``) or by the attempt's
    :class:`~ftnb.storage.checkpoint_uploads.UploadQueue` (``ASYNC``, and every report queued
    behind one): a row is never visible before its checkpoint is whole."""

    def __init__(self, session: Any, row: dict, plan: Optional[CheckpointPlan],
                 usage_error: type[Exception]) -> None:
        #: The attempt's :class:`~ftnb.session.TrialSession` (its storage, paths, log, send,
        #: fence); ``usage_error``: what a mistake of the trainable's is raised as.
        self.session = session
        self.usage_error = usage_error
        self.row = row
        self.plan = plan
        self.name: Optional[str] = None
        self.snapshot: Any = None
        self.kind = "result"
        #: A checkpoint merged from several ranks' files (rank 0's job): the other ranks that
        #: write files into ``shards`` (see :mod:`~ftnb.storage.rank_checkpoints`).
        self.other_ranks: Optional[list[int]] = None
        self.shards: Optional[str] = None
        #: Called with the checkpoint's name once the row is persisted and sent (what starts
        #: its asynchronous validation, see :mod:`ftnb.train.validation`).
        self.on_recorded: Optional[Callable[[str], None]] = None

    def __call__(self) -> None:
        s, row, plan = self.session, self.row, self.plan
        what = f"report({row['training_iteration']})"
        checkpointed = self.name is not None
        try:
            if checkpointed:
                self._write_checkpoint(what)
            s._check_fence(force=checkpointed)
            try:
                # Whole, or a StorageFault raised here in the trial with nothing of the row left.
                waiting_out_faults(lambda: s.log.append(row, durable=checkpointed),
                                   s.storage_wait_s, what)
            except OSError:
                self._remove_checkpoint()  # a checkpoint no row names is debris: free its space
                raise
            s.send(self.kind, row)
            if self.on_recorded is not None and self.name is not None:
                self.on_recorded(self.name)
            if plan is not None:
                delete_local_folder(plan)
        finally:
            self.discard()

    def _write_checkpoint(self, what: str) -> None:
        s, row, plan = self.session, self.row, self.plan
        s._check_fence(force=True)
        marker = {
            "trial_id": s.context.trial_id,
            "training_iteration": row["training_iteration"],
            "time_total_s": row["time_total_s"],
            "attempt": s.context.attempt,
        }
        source = self.snapshot.path if self.snapshot is not None else None
        assert self.name is not None
        if self.shards is not None:
            self._merge_shards(what, source, marker)
            return
        assert plan is not None
        try:
            waiting_out_faults(lambda: write_checkpoint(plan, source, s.storage, s.paths,
                                                        self.name, marker),
                               s.storage_wait_s, what)
        except ReportOptionError as exc:
            raise self.usage_error(str(exc)) from None
        self._check_snapshot(what)

    def _merge_shards(self, what: str, source: Optional[str], marker: dict) -> None:
        """Rank 0 of a group: its files (if any) into the shared folder, then, once every other
        rank wrote its own, the merged checkpoint made whole."""
        s, plan, folder = self.session, self.plan, self.shards
        assert folder is not None and self.other_ranks is not None and self.name is not None
        if plan is not None:
            own = source if source is not None else plan.checkpoint.path
            # (rank 0, the lowest rank, writes every file it has; see rank_checkpoints)
            waiting_out_faults(lambda: write_shard(s.storage, own, folder), s.storage_wait_s,
                               what)
        errors = s.group.shards_written(self.row["training_iteration"], self.other_ranks)
        if errors:
            self._remove_checkpoint()
            raise RuntimeError(f"{what}: the checkpoint {self.name} merged from the group's "
                               f"ranks is not whole, as ranks failed to write their files: "
                               f"{'; '.join(errors)}")
        dest = s.paths.checkpoint(self.name)
        waiting_out_faults(lambda: finish_shards(s.storage, folder, dest, marker),
                           s.storage_wait_s, what)
        self._check_snapshot(what)

    def _check_snapshot(self, what: str) -> None:
        plan = self.plan
        changed = self.snapshot.changed_files() if self.snapshot is not None else []
        if changed:
            self._remove_checkpoint()
            raise self.usage_error(
                f"{what} with checkpoint_upload_mode=ASYNC: the file {changed[0]!r} of the "
                f"reported folder {plan.checkpoint.path} was rewritten while it was being "
                "uploaded, so the upload is not kept. Fix: write every checkpoint to a new "
                "folder (tempfile.TemporaryDirectory()), or delete files instead of "
                "overwriting them, or use SYNC.")

    def _remove_checkpoint(self) -> None:
        if self.name is None or (self.plan is not None and self.shards is None
                                 and self.plan.mode is CheckpointUploadMode.NO_UPLOAD):
            return
        s = self.session
        for folder in (s.paths.checkpoint(self.name), self.shards):
            try:
                if folder is not None and s.storage.exists(folder):
                    s.storage.remove(folder, recursive=True)
            except OSError:
                pass

    def discard(self) -> None:
        """Free the snapshot (after the job, or when it is dropped)."""
        if self.snapshot is not None:
            self.snapshot.remove()
            self.snapshot = None
