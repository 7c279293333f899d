"""One checkpoint from several ranks of a group (``TorchTrainer``): every rank may report a
checkpoint in the same report, and their files merge into one checkpoint folder, as
``torch.distributed.checkpoint`` (each rank writes its shard, rank 0 the metadata) and FSDP need.

At every report of a group, the ranks exchange what they report (:func:`checkpoint_info`,
through the group's store: ``RankGroup.exchange``) and each computes the same answer from the
same facts (:func:`merged_checkpoint`): no checkpoint, rank 0's alone (the ordinary path), or a
merged one, with its folder name, or the same :class:`ReportOptionError` on every rank (two
ranks writing one file name, two names) before any file is written. For a merged checkpoint,
every rank with files writes them into one folder (:func:`~ftnb.storage.checkpoint_uploads.
shard_folder`; :class:`ShardJob`, at once or on the rank's upload queue for ``ASYNC``) and says
so through the store; rank 0 waits for them, then makes the folder whole (its marker last) and
only then writes the row. Only rank 0's metrics are recorded, as in Ray Train.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ..checkpoint import CheckpointUploadMode
from .checkpoint_files import DIGEST_FILE_LIMIT
from .checkpoint_uploads import write_shard
from .faults import waiting_out_faults
from .file_names import checkpoint_dir_name

if TYPE_CHECKING:
    from .reported_checkpoints import CheckpointPlan

__all__ = ["MergedCheckpoint", "ShardJob", "checkpoint_info", "merged_checkpoint"]


def checkpoint_info(plan: Optional["CheckpointPlan"]) -> Optional[dict]:
    """What this rank tells the others of its report's checkpoint (None: it has none)."""
    from .reported_checkpoints import ReportOptionError

    if plan is None:
        return None
    special = plan.mode is CheckpointUploadMode.NO_UPLOAD or plan.upload_fn is not None
    files: dict[str, list] = {}
    if plan.local:
        source = plan.checkpoint.path
        for root, _, names in os.walk(source):
            for n in names:
                full = os.path.join(root, n)
                size = os.path.getsize(full)
                digest = None
                if size <= DIGEST_FILE_LIMIT:  # so that the same small file from two ranks is fine
                    with open(full, "rb") as f:
                        digest = zlib.crc32(f.read())
                files[os.path.relpath(full, source).replace(os.sep, "/")] = [size, digest]
    elif not special:
        raise ReportOptionError(
            f"report(checkpoint={plan.checkpoint!r}) in a group: a rank's checkpoint must be a "
            "local folder (its files are merged with the other ranks'). Fix: save to a local "
            "folder (tempfile.TemporaryDirectory()) and report that.")
    return {"files": files, "dir_name": plan.dir_name, "special": special}


@dataclass
class MergedCheckpoint:
    """The checkpoint of one report of a group: its folder ``name``, and the ranks that write
    files into it (``ranks``; only rank 0's: ``[0]``, the ordinary path)."""

    name: str
    ranks: list[int]
    #: rank -> the files it leaves out, as a lower rank writes the same bytes under that name.
    duplicates: dict[int, list[str]] = field(default_factory=dict)

    @property
    def merged(self) -> bool:
        return self.ranks != [0]


def merged_checkpoint(infos: list[Optional[dict]], next_index: int,
                      used_names: set[str]) -> Optional[MergedCheckpoint]:
    """The same answer on every rank, from every rank's :func:`checkpoint_info` (by rank):
    None without a checkpoint; else its name (the one a rank gave, or ``checkpoint_NNNNNN``
    numbered ``next_index``) and the ranks with files. Raises :class:`ReportOptionError` when
    the ranks' checkpoints cannot merge."""
    from .reported_checkpoints import ReportOptionError

    ranks = [r for r, info in enumerate(infos) if info is not None]
    if not ranks:
        return None
    names = sorted({infos[r]["dir_name"] for r in ranks if infos[r]["dir_name"]})
    if len(names) > 1:
        raise ReportOptionError(
            f"report(checkpoint_dir_name=...): the ranks of the group named this report's "
            f"checkpoint differently ({', '.join(map(repr, names))}); it is one folder. Fix: "
            "pass the same name on every rank, or on rank 0 only.")
    name = names[0] if names else checkpoint_dir_name(next_index)
    if name in used_names:
        raise ReportOptionError(
            f"report(checkpoint_dir_name={name!r}): an earlier report of this trial already "
            "named its checkpoint so. Fix: a new name for every checkpoint.")
    if ranks == [0]:
        return MergedCheckpoint(name, ranks)
    if any(infos[r]["special"] for r in ranks):
        raise ReportOptionError(
            f"report(...) on ranks {ranks}: a checkpoint_upload_fn or NO_UPLOAD takes one "
            "rank's checkpoint, but several ranks reported one in the same report (their files "
            "are merged by ftnb). Fix: use SYNC or ASYNC on every rank, or report the "
            "checkpoint on rank 0 only.")
    writer: dict[str, int] = {}
    duplicates: dict[int, list[str]] = {}
    for r in ranks:
        for rel, (size, digest) in sorted(infos[r]["files"].items()):
            if rel not in writer:
                writer[rel] = r
                continue
            if digest is not None and infos[writer[rel]]["files"][rel] == [size, digest]:
                duplicates.setdefault(r, []).append(rel)  # the same bytes: written once
                continue
            raise ReportOptionError(
                f"report(checkpoint=...): ranks {writer[rel]} and {r} both have the file "
                f"{rel!r} in their checkpoint, with different contents (or too big to compare); "
                "the ranks' files are merged into one folder, so a file name can come from one "
                "rank only. Fix: name each rank's files by its rank (torch.distributed."
                "checkpoint does), or report the file from rank 0 only.")
    return MergedCheckpoint(name, ranks, duplicates)


class ShardJob:
    """A rank's files of a merged checkpoint, written into its folder, then said through the
    store (with the error, should writing fail, so that rank 0 does not mark it whole)."""

    def __init__(self, session: Any, plan: "CheckpointPlan", iteration: int, folder: str,
                 skip: list[str]) -> None:
        self.session = session
        self.skip = skip
        self.plan = plan
        self.iteration = iteration
        self.folder = folder
        self.snapshot: Any = None

    def __call__(self) -> None:
        s = self.session
        source = self.snapshot.path if self.snapshot is not None else self.plan.checkpoint.path
        error = None
        try:
            s._check_fence(force=True)
            waiting_out_faults(lambda: write_shard(s.storage, source, self.folder, self.skip),
                               s.storage_wait_s, f"report({self.iteration})")
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            s.group.shard_written(self.iteration, error)
            self.discard()
        from .reported_checkpoints import delete_local_folder

        delete_local_folder(self.plan)

    def discard(self) -> None:
        if self.snapshot is not None:
            self.snapshot.remove()
            self.snapshot = None
