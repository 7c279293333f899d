"""Every file and folder of an experiment, by name: :class:`ExperimentPaths` and
:class:`TrialPaths` (the model: submitit's ``JobPaths``). Nobody joins experiment paths by hand
elsewhere; the names themselves are in :mod:`~ftnb.storage.file_names`.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any, Optional

from .backend import Storage
from .file_names import (
    CHECKPOINT_MARKER,
    CONTROL_DIR,
    CONTROL_REQUEST_SUFFIX,
    ERROR_FILE,
    LEASE_FILE,
    LEASE_LOCK_FILE,
    SPACE_RESERVE_FILE,
    SPACE_RESERVE_FILES,
    OPTUNA_JOURNAL_FILE,
    PARAMS_FILE,
    PROGRESS_FILE,
    RESULTS_FILE,
    STAGED_EXPLOIT_PREFIX,
    SEARCHER_STATE_FILE,
    STATE_BACKUP_FILE,
    STATE_FILE,
    STDERR_FILE,
    STDOUT_FILE,
    SUPERVISOR_FILE,
    SUPERVISOR_LOG,
    TRAINER_FILE,
    TRIAL_RECORD_FILE,
    checkpoint_index,
    rank_output_name,
)
from .json_lines import read_json_lines


def read_last_lines(path: str, count: int, max_bytes: int = 16384,
                    storage: Optional[Storage] = None) -> list[str]:
    """The last ``count`` lines of the file ``path`` on ``storage`` (default: a file of this
    machine), read from at most its last ``max_bytes``, a line cut there left out. Raises what
    reading it raises (OSError when it is missing)."""
    if storage is None or storage.is_local:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - max_bytes))
            data = f.read()
    else:
        size = storage.fs.info(path)["size"]
        _, data = storage.read_from(path, max(0, size - max_bytes), size)
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first may be cut
    return lines[-count:]


def default_storage_path() -> str:
    """``$FTNB_STORAGE_PATH`` if set, else ``~/ftnb_results``."""
    return os.environ.get("FTNB_STORAGE_PATH") or os.path.join(
        os.path.expanduser("~"), "ftnb_results"
    )



@dataclass(frozen=True)
class TrialPaths:
    """Every file of one trial, by name. Nobody joins trial paths by hand elsewhere.

    ``<trial dir>/``: ``trial.json`` (:attr:`record`), ``params.json``, ``result.json``
    (:attr:`results`), ``progress.csv``, ``error.txt``, ``stdout``, ``stderr`` (rank 0's in a
    group; ``stdout.rank1``, ``stderr.rank1`` ... the other ranks', :meth:`rank_stdout`), and
    ``checkpoint_000000/`` ... (:meth:`checkpoint`, each complete once it holds its
    :meth:`checkpoint_marker`).
    """

    storage: Storage
    dir: str

    def _file(self, name: str) -> str:
        return self.storage.join(self.dir, name)

    @property
    def uri(self) -> str:
        """The trial's folder as a path (local) or URL (elsewhere) a user can paste."""
        return self.storage.uri(self.dir)

    @property
    def params(self) -> str:
        """``params.json``: the trial's config (refs as placeholders)."""
        return self._file(PARAMS_FILE)

    @property
    def results(self) -> str:
        """``result.json``: one JSON line per acknowledged report."""
        return self._file(RESULTS_FILE)

    @property
    def progress(self) -> str:
        """``progress.csv``: the rows of ``result.json``, flattened."""
        return self._file(PROGRESS_FILE)

    @property
    def error(self) -> str:
        """``error.txt``: the trial's failures, written by the controller."""
        return self._file(ERROR_FILE)

    @property
    def record(self) -> str:
        """The controller's record of the trial (attempts, failures, status), written at every
        transition; newer than ``experiment_state.json`` when the driver died in between."""
        return self._file(TRIAL_RECORD_FILE)

    @property
    def stdout(self) -> str:
        """``stdout``: what the trial's processes printed, over all attempts."""
        return self._file(STDOUT_FILE)

    @property
    def stderr(self) -> str:
        """``stderr``: the same for the error stream."""
        return self._file(STDERR_FILE)

    def rank_stdout(self, rank: int) -> str:
        """What rank ``rank`` of a group printed, over all attempts: :attr:`stdout` for rank 0,
        ``stdout.rank1`` for rank 1 ..."""
        return self._file(rank_output_name(STDOUT_FILE, rank))

    def rank_stderr(self, rank: int) -> str:
        """The same for the error stream: :attr:`stderr`, ``stderr.rank1`` ..."""
        return self._file(rank_output_name(STDERR_FILE, rank))

    def last_lines(self, path: str, count: int, max_bytes: int = 16384) -> list[str]:
        """The last ``count`` lines of the output file ``path`` (:meth:`rank_stdout`...),
        read from at most its last ``max_bytes``; [] when it is missing or unreadable."""
        try:
            return read_last_lines(path, count, max_bytes, self.storage)
        except Exception:  # output is a convenience; never fail a reader for it
            return []

    def checkpoint(self, dir_name: str) -> str:
        """The checkpoint folder ``dir_name`` (see :func:`checkpoint_dir_name`)."""
        return self._file(dir_name)

    def checkpoint_marker(self, dir_name: str) -> str:
        """The file whose presence says the checkpoint folder ``dir_name`` is complete."""
        return self.storage.join(self.checkpoint(dir_name), CHECKPOINT_MARKER)

    def logger_record(self, name: str) -> str:
        """A logger callback's own record in the trial's folder (``mlflow_run.json``: the MLflow
        run it logs to; ``wandb_run.json``: the W&B run's id), so a restored experiment goes on
        logging to the same run (see ftnb.logger)."""
        return self._file(name)

    def owner_files(self) -> frozenset[str]:
        """Names of the files that the trial's owner (its driver and its current attempt)
        replaces atomically, whose temporary files a dead owner may leave behind."""
        return frozenset((PARAMS_FILE, TRIAL_RECORD_FILE, ERROR_FILE, RESULTS_FILE,
                          PROGRESS_FILE))

    def remove_leftover_temps(self) -> list[str]:
        """See :meth:`Storage.remove_leftover_temps` (the same rules: as the owner only)."""
        return self.storage.remove_leftover_temps(self.dir, self.owner_files())

    def read_results(self) -> list[dict]:
        """The rows of ``result.json`` ([] when there is none); a torn last line is skipped,
        a damaged line elsewhere raises :class:`CorruptFileError`."""
        try:
            data = self.storage.read_bytes(self.results)
        except FileNotFoundError:
            return []
        return read_json_lines(data, source=self.storage.uri(self.results))

    def checkpoint_dirs(self) -> list[str]:
        """Names of the complete checkpoint folders (with a marker): the numbered ones oldest
        first, then those the trainable named (``report(checkpoint_dir_name=...)``)."""
        own = self.owner_files()
        names = [n for n in self.storage.listdir(self.dir)
                 if checkpoint_index(n) is not None
                 or not (n.startswith((".", "stdout", "stderr", STAGED_EXPLOIT_PREFIX))
                         or n in own)]
        return [
            n
            for n in sorted(names, key=lambda n: (checkpoint_index(n) is None,
                                                  checkpoint_index(n) or 0, n))
            if self.storage.exists(self.checkpoint_marker(n))
        ]


@dataclass(frozen=True)
class ExperimentPaths:
    """Every file of one experiment, by name (the model: submitit's ``JobPaths``).

    ``<storage_path>/<name>/``: ``experiment_state.json`` (:attr:`state`) and its previous
    generation (:attr:`state_backup`), the segments of its journal of trial records
    (:meth:`state_segment`), ``owner.json`` and ``.owner.lock`` (:attr:`lease`,
    :attr:`lease_lock`), ``control/`` (:attr:`control`, :meth:`control_request`),
    ``supervisor.json`` and ``supervisor.log``, and one folder per trial (:meth:`trial`).
    """

    storage: Storage
    dir: str

    @classmethod
    def of(cls, storage: Storage, name: str, folder: Optional[str] = None) -> "ExperimentPaths":
        """The experiment ``name`` in ``folder`` of ``storage`` (default: its root, the
        ``storage_path``)."""
        return cls(storage, storage.join(storage.root if folder is None else folder, name))

    @classmethod
    def at(cls, path: str, filesystem: Any = None) -> "ExperimentPaths":
        """The experiment whose folder is ``path`` (a local path or an fsspec URL)."""
        storage = Storage(path, filesystem)
        return cls(storage, storage.root)

    def _file(self, name: str) -> str:
        return self.storage.join(self.dir, name)

    @property
    def trainer(self) -> str:
        """``trainer.pkl``: a TorchTrainer's code, kept so that ``TorchTrainer.restore(path)``
        needs only the datasets (a convenience: the state itself holds no code)."""
        return self._file(TRAINER_FILE)

    @property
    def name(self) -> str:
        """The experiment's name: the last part of its folder's path."""
        return posixpath.basename(self.dir.rstrip("/").replace(os.sep, "/"))

    @property
    def uri(self) -> str:
        """The experiment's folder as a path (local) or URL (elsewhere) a user can paste."""
        return self.storage.uri(self.dir)

    @property
    def parent_uri(self) -> str:
        """The storage path this experiment's folder is in (its ``RunConfig.storage_path``)."""
        return self.storage.uri(self.storage.parent(self.dir))

    @property
    def state(self) -> str:
        """``experiment_state.json``: the versioned state, written by the driver."""
        return self._file(STATE_FILE)

    @property
    def state_backup(self) -> str:
        """``experiment_state.prev.json``: the previous generation of :attr:`state`."""
        return self._file(STATE_BACKUP_FILE)

    def state_segment(self, name: str) -> str:
        """``experiment_state.<generation>.jsonl``: a segment of the journal of the trial records
        that left :attr:`state` (finished trials, trials waiting to start), as the state lists
        it (:mod:`~ftnb.storage.record_journal`)."""
        return self._file(name)

    def has_state(self) -> bool:
        """Whether the folder holds an experiment (its state, or the previous generation)."""
        return self.storage.exists(self.state) or self.storage.exists(self.state_backup)

    def trial(self, dir_name: str) -> TrialPaths:
        """The files of the trial whose folder is named ``dir_name``."""
        return TrialPaths(self.storage, self._file(dir_name))

    @property
    def lease(self) -> str:
        """``owner.json``: the owner lease (token, epoch, host, pid, heartbeat)."""
        return self._file(LEASE_FILE)

    @property
    def space_reserve(self) -> tuple[str, ...]:
        """``.ftnb-reserve.0`` to ``.7``: space and inodes the driver holds for its last words
        on a full disk (:meth:`Storage.reserve_space
        <ftnb.storage.backend.Storage.reserve_space>`)."""
        return tuple(self._file(f"{SPACE_RESERVE_FILE}.{i}") for i in range(SPACE_RESERVE_FILES))

    @property
    def lease_lock(self) -> str:
        """``.owner.lock``: serializes acquisitions of the lease on a local disk."""
        return self._file(LEASE_LOCK_FILE)

    @property
    def control(self) -> str:
        """Folder of control requests (stop a trial, stop the experiment) to its driver."""
        return self._file(CONTROL_DIR)

    def control_request(self, request_id: str) -> str:
        """The file of the control request ``request_id``."""
        return self.storage.join(self.control, request_id + CONTROL_REQUEST_SUFFIX)

    def control_request_ids(self) -> list[str]:
        """The ids of the requests in :attr:`control`, oldest first (ids sort by time)."""
        return [name[: -len(CONTROL_REQUEST_SUFFIX)]
                for name in self.storage.listdir(self.control)
                if name.endswith(CONTROL_REQUEST_SUFFIX)]

    @property
    def searcher_state(self) -> str:
        """``searcher_state.json``: the search algorithm's state, its suggestions not yet
        recorded as trials and its trials not yet told complete (:mod:`ftnb.core.searching`)."""
        return self._file(SEARCHER_STATE_FILE)

    @property
    def optuna_journal(self) -> str:
        """``optuna_journal.jsonl``: OptunaSearch's study, in Optuna's journal format (one line
        of logs per commit, see :mod:`ftnb.search.optuna`)."""
        return self._file(OPTUNA_JOURNAL_FILE)

    @property
    def supervisor(self) -> str:
        """``supervisor.json``: the detached process hosting the controller, and its log."""
        return self._file(SUPERVISOR_FILE)

    @property
    def supervisor_log(self) -> str:
        """``supervisor.log``: the detached supervisor's output."""
        return self._file(SUPERVISOR_LOG)

    def owner_files(self) -> frozenset[str]:
        """Names of the files of the experiment's folder that its owner (the driver) replaces
        atomically, whose temporary files a dead owner may leave behind. Not ``owner.json``
        (a would-be owner writes it before it owns) nor ``control/`` (its senders')."""
        return frozenset((STATE_FILE, STATE_BACKUP_FILE, SUPERVISOR_FILE, SEARCHER_STATE_FILE,
                          OPTUNA_JOURNAL_FILE, TRAINER_FILE))

    def remove_leftover_temps(self) -> list[str]:
        """See :meth:`Storage.remove_leftover_temps` (the same rules: as the owner only)."""
        return self.storage.remove_leftover_temps(self.dir, self.owner_files())
