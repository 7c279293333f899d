"""The names of an experiment's files and folders: the on-disk format, read by every ftnb
version since. :class:`~ftnb.storage.paths.ExperimentPaths` and
:class:`~ftnb.storage.paths.TrialPaths` turn them into paths; everyone else asks those for paths.

Temporary names (a file or folder being written into place on a local disk) are made here too,
so that a sweep of a dead writer's leftovers recognizes exactly what a writer makes.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Optional

STATE_FILE = "experiment_state.json"
STATE_BACKUP_FILE = "experiment_state.prev.json"
CHECKPOINT_MARKER = ".ftnb_checkpoint.json"
LEASE_FILE = "owner.json"
LEASE_LOCK_FILE = ".owner.lock"
CONTROL_DIR = "control"
CONTROL_REQUEST_SUFFIX = ".json"
SUPERVISOR_FILE = "supervisor.json"
SUPERVISOR_LOG = "supervisor.log"
#: Space a driver holds on a local disk so that, when the disk fills, it can still record why
#: it stopped (its state, the trials' records): released at the first storage fault. Files
#: ``.ftnb-reserve.0`` to ``.7`` (files, not a folder: every folder of an experiment is a trial's).
SPACE_RESERVE_FILE = ".ftnb-reserve"
SPACE_RESERVE_FILES = 8
#: A search algorithm's state (ftnb.core.searching) and OptunaSearch's study (its journal).
SEARCHER_STATE_FILE = "searcher_state.json"
OPTUNA_JOURNAL_FILE = "optuna_journal.jsonl"
#: A TorchTrainer's code, for ``TorchTrainer.restore(path)``.
TRAINER_FILE = "trainer.pkl"
TRIAL_RECORD_FILE = "trial.json"
PARAMS_FILE = "params.json"
RESULTS_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
ERROR_FILE = "error.txt"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
#: Ranks 1, 2, ... of a group write ``stdout.rank1``, ``stderr.rank1``, ...: rank 0 (and a
#: single-worker trial) keeps the plain names, which the widget, ``ftnb logs`` and the live output
#: read.
_RANK_SUFFIX = ".rank"
_CHECKPOINT_PREFIX = "checkpoint_"
#: A PBT exploit's staged copy of its donor's checkpoint (see ftnb.core.exploits): not one of
#: the trial's checkpoints, and no checkpoint debris.
STAGED_EXPLOIT_PREFIX = "pbt_exploit_"
# A folder being copied into place on a local disk (see Storage.persist_directory).
_TEMP_FOLDER_PREFIX = ".tmp-"


#: ``experiment_state.00000012.jsonl``: a segment of the state's journal of trial records
#: (:mod:`ftnb.storage.record_journal`), named by the save that first wrote it. Files beside the
#: state, not a folder: every folder of an experiment is a trial's.
STATE_SEGMENT = re.compile(r"^experiment_state\.(?P<generation>\d{8})\.jsonl$")


def state_segment_name(generation: int) -> str:
    """The name of the state's journal segment first written by its save number
    ``generation`` (see :data:`STATE_SEGMENT`)."""
    return f"experiment_state.{generation:08d}.jsonl"


def rank_output_name(stream_file: str, rank: int) -> str:
    """The output file ``stream_file`` (:data:`STDOUT_FILE` or :data:`STDERR_FILE`) of rank
    ``rank``: the name itself for rank 0, ``stdout.rank3`` for rank 3."""
    return stream_file if rank == 0 else f"{stream_file}{_RANK_SUFFIX}{rank}"


def checkpoint_dir_name(index: int) -> str:
    """The name of a trial's checkpoint folder number ``index`` (``checkpoint_000003``)."""
    return f"{_CHECKPOINT_PREFIX}{index:06d}"


def checkpoint_index(dir_name: str) -> Optional[int]:
    """The number of the checkpoint folder ``dir_name``, or None for any other name."""
    prefix = _CHECKPOINT_PREFIX
    if dir_name.startswith(prefix) and dir_name[len(prefix) :].isdigit():
        return int(dir_name[len(prefix) :])
    return None


def is_temporary_checkpoint(dir_name: str) -> bool:
    """Whether ``dir_name`` is a checkpoint folder still being copied into place (debris once
    its writer is dead): numbered, or named by the trainable (``report(checkpoint_dir_name=
    ...)``), or the ranks' merged files (``.tmp-<name>-shards``); a staged PBT copy is not."""
    return (dir_name.startswith(_TEMP_FOLDER_PREFIX)
            and not dir_name.startswith(_TEMP_FOLDER_PREFIX + STAGED_EXPLOIT_PREFIX))


def temporary_folder_name(name: str) -> str:
    """``.tmp-<name>-<8 hex digits>``: the folder a local copy of ``name`` is built in."""
    return f"{_TEMP_FOLDER_PREFIX}{name}-{uuid.uuid4().hex[:8]}"


#: The longest name of one file or folder, in bytes (UTF-8), that Linux and macOS filesystems
#: take (NAME_MAX): a longer one fails with "File name too long".
NAME_MAX_BYTES = 255
#: What the temporary file of an atomic local write adds to its target's name (see below).
TEMPORARY_FILE_EXTRA_BYTES = len(".") + len(".0123456789ab.tmp")

#: ``.<target name>.<12 hex digits>.tmp``: the temporary file of an atomic local write.
TEMPORARY_FILE_NAME = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{12}\.tmp$")


def temporary_file_path(path: str) -> str:
    """Where a new version of the local file ``path`` is written before it is renamed over it:
    ``.<name>.<12 hex digits>.tmp`` next to it (see :data:`TEMPORARY_FILE_NAME`)."""
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
