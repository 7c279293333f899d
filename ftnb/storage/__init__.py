"""Experiment storage: named paths and atomic, durable writes through fsspec.

Contract (every writer follows it, every reader relies on it):

* A reader never sees half a file. Whole files are replaced atomically: on a local disk through
  a temporary file that is fsynced and renamed over the target (then the folder is fsynced); on
  object stores with one PUT of the complete object.
* ``result.json`` (and its mirror ``progress.csv``) grow by whole lines (:class:`LineLog`).
  Each line is written with a single ``write()`` so a process death leaves at most a torn *last*
  line, which readers skip and the next writer repairs; a bad line anywhere else is corruption,
  which readers report (:class:`CorruptFileError`) rather than skip.
* A checkpoint folder is complete once its ``.ftnb_checkpoint.json`` marker exists and the
  result line naming it is written. Folders without both are debris from a crash and are ignored.
* Every file and folder of an experiment is a named path of :class:`ExperimentPaths` and
  :class:`TrialPaths` (temporary names included); nobody joins experiment paths by hand.
* Only the process that runs the current attempt of a trial writes into that trial's folder
  (results, checkpoints, output); only the controller writes ``experiment_state.json``, the
  segments of its journal (``experiment_state.<generation>.jsonl``), ``params.json`` and
  ``error.txt``.
* A journal segment is read up to the length the state lists, never further: lines a dead
  writer left past it are never read (:mod:`.record_journal`).
* A write to remote storage waits out an outage instead of failing (:mod:`.outage`).

The package, by concept (their public names are importable from ``ftnb.storage`` itself):

* :mod:`.backend`: :class:`Storage`, the filesystem and its atomic operations, the only place
  that tells this machine's disk from remote storage; :mod:`.local_disk` does its local writes,
  :mod:`.filesystem_kinds` tells which kind a filesystem is (local disk, object store, other).
* :mod:`.paths`: :class:`ExperimentPaths` and :class:`TrialPaths`, every file by name;
  :mod:`.file_names`: the names themselves (the on-disk format).
* :mod:`.growing_files`: :class:`StagedFile` and :class:`LineLog`, files that grow while a
  process runs; :mod:`.json_lines`: ``result.json``'s rows and their readers.
* :mod:`.file_versions`: which files changed, for readers that poll.
* :mod:`.record_journal`: the segments of records that left a state file rewritten every second.
* :mod:`.outage`: how long writers wait for remote storage, and one call's deadline.

Built on them, imported from their own modules: :mod:`.lease` (the owner lease),
:mod:`.control` (requests to a driver) and :mod:`.result_log` (a trial's acknowledged results).
"""

from __future__ import annotations

from .backend import LOCAL_POLL_S, REMOTE_POLL_S, Storage
from .file_names import (
    CHECKPOINT_MARKER,
    CONTROL_DIR,
    CONTROL_REQUEST_SUFFIX,
    ERROR_FILE,
    LEASE_FILE,
    LEASE_LOCK_FILE,
    PARAMS_FILE,
    PROGRESS_FILE,
    RESULTS_FILE,
    STATE_BACKUP_FILE,
    STATE_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    SUPERVISOR_FILE,
    SUPERVISOR_LOG,
    TRIAL_RECORD_FILE,
    checkpoint_dir_name,
    checkpoint_index,
    is_temporary_checkpoint,
)
from .file_versions import FileVersion, FileVersions
from .filesystem_kinds import is_local_fs
from .growing_files import LineLog, StagedFile
from .json_lines import (
    AUTO_KEYS,
    NONFINITE_KEY,
    CorruptFileError,
    json_line,
    parse_json_line,
    read_json_lines,
)
from .outage import (
    CALL_TIMEOUT_ENV,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_OUTAGE_S,
    OUTAGE_ENV,
    StorageUnavailableError,
    call_deadline,
    call_timeout_s,
    check_outage_settings,
    is_transient,
    outage_limit_s,
)
from .paths import ExperimentPaths, TrialPaths, default_storage_path

__all__ = [
    "CALL_TIMEOUT_ENV",
    "CHECKPOINT_MARKER",
    "CONTROL_DIR",
    "CONTROL_REQUEST_SUFFIX",
    "DEFAULT_CALL_TIMEOUT_S",
    "DEFAULT_OUTAGE_S",
    "ERROR_FILE",
    "LEASE_FILE",
    "LEASE_LOCK_FILE",
    "LOCAL_POLL_S",
    "AUTO_KEYS",
    "NONFINITE_KEY",
    "OUTAGE_ENV",
    "PARAMS_FILE",
    "PROGRESS_FILE",
    "REMOTE_POLL_S",
    "RESULTS_FILE",
    "STATE_BACKUP_FILE",
    "STATE_FILE",
    "STDERR_FILE",
    "STDOUT_FILE",
    "SUPERVISOR_FILE",
    "SUPERVISOR_LOG",
    "TRIAL_RECORD_FILE",
    "CorruptFileError",
    "ExperimentPaths",
    "FileVersion",
    "FileVersions",
    "LineLog",
    "StagedFile",
    "Storage",
    "StorageUnavailableError",
    "TrialPaths",
    "call_deadline",
    "call_timeout_s",
    "check_outage_settings",
    "checkpoint_dir_name",
    "checkpoint_index",
    "default_storage_path",
    "is_local_fs",
    "is_temporary_checkpoint",
    "is_transient",
    "json_line",
    "outage_limit_s",
    "parse_json_line",
    "read_json_lines",
]
