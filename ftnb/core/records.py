"""Trial and experiment records: the versioned JSON in ``experiment_state.json``.

Since format 2 a running experiment's state file holds the records of its running trials only:
the others (finished, waiting to start) are lines of its journal of trial records
(``experiment_state.<generation>.jsonl``, :mod:`ftnb.storage.record_journal`), written once when they come to rest,
so a save costs what changed, not the number of trials (:meth:`ExperimentState.save_changes`).
A state saved as a whole (:meth:`ExperimentState.save`: a new experiment, the driver's last
save) holds every record itself, as format 1 did. :meth:`ExperimentState.load` reads both, and
format 1.

No user code and no pickles live here: only plain JSON that any later version of ftnb (and a
human with ``jq``) can read. Configs are stored with placeholders for values that are not JSON
(live objects are re-specified by the caller on restore).

(Over 500 lines because this is the whole schema of ``experiment_state.json`` and ``trial.json``:
every record, its enums and its JSON codec in one place, so that a format change is one diff.)
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Optional

from ..storage import ExperimentPaths
from ..storage.json_lines import reported_object
from ..storage.record_journal import (
    JournalCache,
    RecordJournal,
    Segment,
    SegmentGoneError,
    read_segments,
)

__all__ = [
    "FINISHED_STATUSES",
    "FORMAT",
    "FORMAT_VERSION",
    "AttemptOutcome",
    "AttemptRecord",
    "ExperimentState",
    "ExperimentStatus",
    "FailureRecord",
    "StateFormatError",
    "StateVersionError",
    "TrialRecord",
    "TrialStatus",
    "encode_value",
    "merge_trial_records",
    "newer_record",
    "parse_trial_record",
    "with_journal",
    "without_driver",
]

FORMAT = "ftnb.experiment"
FORMAT_VERSION = 2


class StateFormatError(Exception):
    """An experiment state file that cannot be read (missing, corrupt, or from a newer ftnb)."""


class StateVersionError(StateFormatError):
    """An experiment state written by a newer ftnb than this one."""


class ExperimentStatus(str, enum.Enum):
    """An experiment's status. Compares equal to its string value, which is what the state
    stores. A RUNNING experiment whose driver is gone reads as INTERRUPTED in every view (see
    :func:`ftnb.ui.read_model.without_driver`); INTERRUPTED is also stored when a driver stopped
    it cleanly (Ctrl+C, a stop request)."""

    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    ERRORED = "ERRORED"
    INTERRUPTED = "INTERRUPTED"

    def is_finished(self) -> bool:
        """FINISHED and ERRORED experiments ran to their end (an ERRORED one can still be
        resumed with its errored trials: ``resume_errored``/``restart_errored``)."""
        return self in (ExperimentStatus.FINISHED, ExperimentStatus.ERRORED)

    def __str__(self) -> str:
        return self.value


#: The status views show for a RUNNING experiment whose driver is gone.
INTERRUPTED = ExperimentStatus.INTERRUPTED


class TrialStatus(str, enum.Enum):
    """A trial's status, with Ray Tune's names. Compares equal to its string value."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERRORED = "ERRORED"

    def is_finished(self) -> bool:
        """TERMINATED and ERRORED trials never run again on their own."""
        return self in (TrialStatus.TERMINATED, TrialStatus.ERRORED)

    def __str__(self) -> str:
        return self.value


#: The statuses of trials that never run again on their own (TERMINATED, ERRORED), as the
#: records hold them: ``trial.status in FINISHED_STATUSES`` holds for a string or a member.
FINISHED_STATUSES = (TrialStatus.TERMINATED.value, TrialStatus.ERRORED.value)


class AttemptOutcome(str, enum.Enum):
    """How one attempt of a trial ended, as its record stores it."""

    RUNNING = "running"  # not ended (or its driver died before it could say)
    FINISHED = "finished"  # the trainable returned
    STOPPED = "stopped"  # it stopped at a report, as asked (a stop request, a stop criterion)
    INTERRUPTED = "interrupted"  # killed by the driver after its grace period, or the driver died
    PREEMPTED = "preempted"  # SIGTERM
    NODE_LOST = "node_lost"  # the machine running it is gone
    FAILED = "failed"  # raised, exited non-zero, or was killed

    def __str__(self) -> str:
        return self.value


class FailureKind(str, enum.Enum):
    """Why an attempt ended badly. Only some kinds count against ``max_failures``."""

    EXCEPTION = "exception"  # the trainable raised
    EXIT = "exit"  # the process exited with a non-zero code (sys.exit(3), os._exit)
    SIGNAL = "signal"  # killed by a signal (SIGKILL, SIGSEGV, ...)
    OOM = "oom"  # the OOM killer, MemoryError, or torch's OutOfMemoryError (CUDA, MPS)
    PREEMPTION = "preemption"  # SIGTERM: the machine or scheduler took the process away
    NODE_LOST = "node_lost"  # the machine running the attempt is gone (a cluster's executor)
    HANG = "hang"  # a rank of a group stopped responding (SIGSTOP, a deadlock, a partition)
    USAGE = "usage"  # ftnb's API was misused (bad report() arguments): retrying cannot help
    #: Storage refused a write (disk full, quota, read-only, permission, I/O error): not the
    #: trial's fault, and retrying into the same full disk helps nobody (ftnb.storage.faults).
    STORAGE = "storage"

    def counts_as_failure(self) -> bool:
        """Preemptions are not the trial's fault: they never use up ``max_failures``, nor do
        storage faults. A lost node does, as in Ray Tune (a trial that keeps losing its node is
        not retried for ever); a node drained for preemption is a preemption."""
        return self not in (FailureKind.PREEMPTION, FailureKind.STORAGE)

    def __str__(self) -> str:
        return self.value


@dataclass
class FailureRecord:
    """One failed (or preempted) attempt."""

    attempt: int
    time: float
    iteration: int
    kind: str
    type: Optional[str] = None
    message: str = ""
    traceback: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    counted: bool = True
    lost_iterations: int = 0
    #: In a group attempt (several ranks): the rank whose failure came first (the cause; the
    #: error fields above are its), None for a single-worker attempt.
    rank: Optional[int] = None
    #: In a group attempt: how every rank ended, in rank order, each ``{"rank", "ended",
    #: "detail"}`` where ``ended`` is ``error``, ``signal``, ``exit``, ``hung``, ``peer`` (it
    #: failed because a peer did: a reset connection, a collective's timeout), ``stopped`` (ended
    #: by ftnb with the group) or ``clean``.
    ranks: list = field(default_factory=list)
    #: Seconds from this failure until the next attempt's first report (every rank past its first
    #: step from the checkpoint): how long the restart took. None until then.
    recovered_s: Optional[float] = None

    def summary(self) -> str:
        """One line for tables: 'exception ValueError: boom (attempt 2, iter 4)'."""
        if self.type:  # raised in the trainable: exception, usage, or an out-of-memory error
            what = f"{self.type}: {self.message}" if self.message else self.type
        elif self.kind == "exit":
            what = f"code {self.exit_code}"
        elif self.kind == "oom":
            what = f"out of memory ({self.signal})"
        elif self.kind in ("signal", "preemption", "node_lost"):
            what = self.signal or self.message
        else:
            what = self.message
        line = f"{self.kind} {what}".strip().replace("\n", " ")
        where = f" in rank {self.rank}" if self.rank is not None else ""
        return f"{line}{where} (attempt {self.attempt}, iter {self.iteration})"

    def describe(self) -> str:
        """Several lines for error.txt."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        lines = [
            f"Attempt {self.attempt} failed at {when}, at training_iteration {self.iteration}.",
            f"Kind: {self.kind}" + ("" if self.counted else " (not counted against max_failures)"),
        ]
        if self.type:
            lines.append(f"Error: {self.type}: {self.message}")
        elif self.message:
            lines.append(f"Error: {self.message}")
        if self.exit_code is not None:
            lines.append(f"Exit code: {self.exit_code}")
        if self.signal:
            lines.append(f"Signal: {self.signal}")
        if self.lost_iterations:
            lines.append(
                f"Iterations reported after the last checkpoint, to be redone: {self.lost_iterations}"
            )
        if self.rank is not None:
            lines.append(f"First failing rank: {self.rank} (the cause; the others ended with it)")
            for entry in self.ranks:
                detail = f": {entry.get('detail')}" if entry.get("detail") else ""
                lines.append(f"  rank {entry.get('rank')}: {entry.get('ended')}{detail}")
        if self.recovered_s is not None:
            lines.append(f"Restarted and past its first step again after {self.recovered_s:.1f} s")
        if self.traceback:
            lines += ["", self.traceback.rstrip()]
        return "\n".join(lines) + "\n"


@dataclass
class AttemptRecord:
    """One run of a trial: one process, or a group of ``num_workers`` ranks (``pids`` in rank
    order; ``pid`` is rank 0's)."""

    number: int
    started: float
    start_iteration: int = 0
    restored_from: Optional[str] = None
    ended: Optional[float] = None
    end_iteration: Optional[int] = None
    outcome: str = AttemptOutcome.RUNNING.value  # an AttemptOutcome
    pid: Optional[int] = None
    num_workers: int = 1
    pids: list = field(default_factory=list)
    # Rows this attempt reported after its last checkpoint, dropped when the next attempt
    # restarted from that checkpoint (they were redone).
    lost_iterations: int = 0


@dataclass
class TrialRecord:
    """Everything ftnb knows about one trial, enough to resume it from storage alone."""

    trial_id: str
    dir_name: str
    config: Any
    status: str = TrialStatus.PENDING.value
    attempts: list[AttemptRecord] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    iteration: int = 0
    latest_checkpoint: Optional[dict] = None  # {"dir_name", "iteration", "time_total_s"}
    checkpoints: list[dict] = field(default_factory=list)  # kept ones: dir_name, iteration, score
    next_checkpoint_index: int = 0
    last_result: Optional[dict] = None
    error: Optional[dict] = None  # {"reason": ..., "failure": FailureRecord as dict}
    # Failures before this index were forgiven by a restore with resume/restart_errored: the
    # trial gets a fresh max_failures budget but keeps its history.
    failures_forgiven: int = 0
    # Bumped on every change the controller persists to the trial's own trial.json, so restore
    # can tell which of trial.json and experiment_state.json is newer.
    seq: int = 0
    note: Optional[str] = None
    #: TuneConfig(trial_name_creator=...)'s name for it (None: its id).
    name: Optional[str] = None
    #: An elastic group's re-forms: {"reason", "old_size", "new_size", "time", "attempt",
    #: "mode"} (see ftnb.core.resizing).
    resizes: list = field(default_factory=list)
    #: Its resources changed by a scheduler (ResourceChangingScheduler): {"iteration", "old",
    #: "new" ({"cpu", "gpu"}), "bundles", "strategy", "by", "time"}; the last's "new" is what
    #: its attempts ask for from then on (a restore too).
    resource_changes: list = field(default_factory=list)

    @property
    def num_failures(self) -> int:
        """Failures that count against ``max_failures`` (preemptions and failures forgiven by a
        restore do not)."""
        return sum(1 for f in self.failures[self.failures_forgiven :] if f.counted)

    @property
    def num_preemptions(self) -> int:
        return sum(1 for f in self.failures if f.kind == FailureKind.PREEMPTION.value)

    @property
    def trial_status(self) -> TrialStatus:
        return TrialStatus(self.status)

    def to_json(self) -> dict:
        """The record as JSON-able values (sharing its dicts and lists: encode it, do not keep
        it)."""
        data = dict(self.__dict__)
        data["config"] = _tuples_to_json(self.config)
        data["attempts"] = [dict(a.__dict__) for a in self.attempts]
        data["failures"] = [dict(f.__dict__) for f in self.failures]
        return data

    @classmethod
    def from_json(cls, data: dict, tuples: bool = True) -> "TrialRecord":
        """The record in ``data``; ``tuples=False`` when the text it was read from has no tuple
        (:data:`TUPLE_KEY`) in it: its config is then taken as it is."""
        data = dict(data)
        data.pop("position", None)  # where a journaled record goes (see ExperimentState)
        data["config"] = _tuples_from_json(data.get("config")) if tuples else data.get("config")
        data["attempts"] = [_from_dict(AttemptRecord, a) for a in data.get("attempts", [])]
        data["failures"] = [_from_dict(FailureRecord, f) for f in data.get("failures", [])]
        return _from_dict(cls, data)


_FIELD_NAMES: dict[type, frozenset] = {}


def _from_dict(cls: type, data: dict) -> Any:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    if names.issuperset(data):
        return cls(**data)
    # Unknown keys come from a newer minor version; they are dropped rather than fatal.
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class _StateFiles:
    """What one process knows of an experiment's state files (not part of the record)."""

    #: The state file as this process last wrote or read it: the next save's fallback.
    last_bytes: Optional[bytes] = None
    #: The journal segments that file lists.
    segments: list = field(default_factory=list)
    #: The journal's writer, from this process's first journaled save.
    journal: Optional[RecordJournal] = None
    #: Ids of the trials whose record the state file itself holds since the last journaled save
    #: (the others' latest record is in the journal); None until one: every trial, as far as a
    #: journaled save can tell (a state read back may have been changed anywhere since).
    inline: Optional[set] = None


@dataclass
class ExperimentState:
    """The whole experiment: settings, the search space and every trial."""

    name: str
    trainable: str
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    status: str = ExperimentStatus.RUNNING.value  # an ExperimentStatus
    settings: dict = field(default_factory=dict)
    param_space: Any = None
    trials: list[TrialRecord] = field(default_factory=list)
    generation: int = 0
    #: ``[started, last_seen]`` of each driver that ran the experiment, oldest first (its run
    #: time leaves out the gaps between them). Absent from states written before ftnb recorded it.
    driver_sessions: list = field(default_factory=list)
    #: What restores fell back to because a file was damaged or missing, oldest first: each
    #: ``{"time", "trial_id" (None: the experiment's own files), "what", "message"}``, made by
    #: :mod:`ftnb.core.recoveries` (the previous state generation read, a checkpoint passed
    #: over, the damaged end of a result.json cut off, a trial started over). Each is also said
    #: when it happens.
    recoveries: list = field(default_factory=list)
    #: The trial scheduler's description and JSON state (``TuneConfig(scheduler=...)``, see
    #: :mod:`ftnb.schedulers`), saved with the state before each of its decisions is carried
    #: out; None for the default (FIFO).
    scheduler: Optional[dict] = None
    #: Why the last driver stopped the experiment when its storage refused a write: ``message``
    #: (the path, the error in words, the free space and the fix), ``path``, ``errno``,
    #: ``free_bytes``, ``trial_id`` (None: the driver's own write), ``time``. None otherwise;
    #: a driver that runs the experiment again clears it.
    storage_fault: Optional[dict] = None
    # Which file load() read: the state file, or the previous generation when it fell back.
    loaded_from: Optional[str] = field(default=None, repr=False, compare=False)
    _files: _StateFiles = field(default_factory=_StateFiles, init=False, repr=False,
                                compare=False)
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def trial(self, trial_id: str) -> TrialRecord:
        """The trial ``trial_id`` (KeyError if there is none); a dict lookup, not a search."""
        return self.trials[self.position(trial_id)]

    def position(self, trial_id: str) -> int:
        """Where the trial ``trial_id`` is in :attr:`trials` (KeyError if it is not)."""
        index = self._index.get(trial_id)
        trials = self.trials
        if index is None or index >= len(trials) or trials[index].trial_id != trial_id:
            # ``trials`` is a plain list that anyone may change: index it again when it moved.
            self._index = {t.trial_id: i for i, t in enumerate(trials)}
            index = self._index[trial_id]
        return index

    def without_driver(self) -> "ExperimentState":
        """A copy as a RUNNING experiment whose driver is gone reads: see
        :func:`without_driver`."""
        return without_driver(self)

    def begin_driver_session(self) -> None:
        """Record that a driver starts running the experiment now (see ``driver_sessions``);
        each :meth:`save` of this object then moves the session's ``last_seen`` on. A save of a
        state no driver runs (a restore preparing it, a stop written from elsewhere) leaves the
        last session where it ended: the time it sat stopped is not run time."""
        now = time.time()
        self._driving = True
        if self.driver_sessions:
            # A driver that died was last seen at its last save, or later in its trials' records.
            previous = self.driver_sessions[-1]
            ends = [a.ended or a.started for t in self.trials for a in t.attempts]
            previous[1] = max([previous[1], *[e for e in ends if e and e <= now]])
            self.driver_sessions.append([now, now])
        elif any(t.attempts for t in self.trials):
            # Run before sessions were recorded: count that as one session.
            self.driver_sessions += [[self.created, self.updated], [now, now]]
        else:
            self.driver_sessions.append([self.created, now])

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in TrialStatus}
        for t in self.trials:
            out[t.status] = out.get(t.status, 0) + 1
        return out

    def _header_json(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "trainable": self.trainable,
            "created": self.created,
            "updated": self.updated,
            "status": self.status,
            "generation": self.generation,
            "driver_sessions": self.driver_sessions,
            **({"recoveries": self.recoveries} if self.recoveries else {}),
            "settings": self.settings,
            "param_space": self.param_space,
            **({"scheduler": self.scheduler} if self.scheduler is not None else {}),
            **({"storage_fault": self.storage_fault} if self.storage_fault is not None else {}),
        }

    def to_json(self) -> dict:
        """The whole state, every trial's record in it (what :meth:`save` writes)."""
        return {**self._header_json(), "trials": [t.to_json() for t in self.trials]}

    @classmethod
    def from_json(cls, data: Any, where: str = "experiment_state.json",
                  tuples: bool = True) -> "ExperimentState":
        """The state in ``data``: a state file's JSON, its journal's records already in
        ``trials`` (see :func:`with_journal`); ``tuples``: see :meth:`TrialRecord.from_json`."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise StateFormatError(f"{where} is not an ftnb experiment state")
        version = data.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise StateVersionError(
                f"{where} has format_version {version!r}, newer than this ftnb understands "
                f"({FORMAT_VERSION}). Fix: upgrade ftnb (pip install -U ftnb)."
            )
        return cls(
            name=data["name"],
            trainable=data.get("trainable", "?"),
            created=data.get("created", 0.0),
            updated=data.get("updated", 0.0),
            status=data.get("status", ExperimentStatus.RUNNING.value),
            settings=data.get("settings", {}),
            param_space=data.get("param_space"),
            trials=[TrialRecord.from_json(t, tuples) for t in data.get("trials", [])],
            generation=data.get("generation", 0),
            driver_sessions=_sessions(data.get("driver_sessions")),
            recoveries=[r for r in data.get("recoveries") or [] if isinstance(r, dict)]
            if isinstance(data.get("recoveries"), list) else [],
            scheduler=data.get("scheduler") if isinstance(data.get("scheduler"), dict) else None,
            storage_fault=(data.get("storage_fault")
                           if isinstance(data.get("storage_fault"), dict) else None),
        )

    # -- persistence ---------------------------------------------------------------------------
    def save(self, paths: ExperimentPaths, final: bool = False) -> None:
        """Write the whole state (every trial's record in the state file itself) atomically,
        keeping the previous generation as a fallback.

        The previous generation is copied to ``experiment_state.prev.json`` first, so even a
        state file damaged after its rename (a broken disk, a hand edit) leaves a readable one.
        ``final`` (the experiment stopped) writes the new state to both files: a finished
        experiment's fallback loses nothing. Its cost grows with the number of trials: a driver
        saves with :meth:`save_changes` while it runs, and with this once at its end.
        """
        self._stamp()
        # No indent: it forces json's pure-Python encoder, several times slower on big states.
        data = json.dumps(self.to_json(), default=str, allow_nan=True).encode("utf-8")
        files = self._files
        journal = files.journal
        if journal is None and files.segments:
            journal = files.journal = RecordJournal(paths.storage, paths.dir,
                                                    files.segments)
        if journal is not None:
            journal.clear()
        self._write(paths, data, final)
        files.inline = None
        files.segments = []
        if journal is not None:
            journal.committed(final)

    def save_changes(self, paths: ExperimentPaths, changed: Iterable[str],
                     durable: bool = True) -> None:
        """Save the state as a running driver does, every second, at a cost that does not grow
        with the number of trials: the record of each trial that is not running goes to the
        journal once (``experiment_state.<generation>.jsonl``), and the state file holds the running trials' records.

        ``changed``: the ids of the trials whose records changed since the last save, other than
        running ones (a trial that started, ended, or was stopped); a trial whose record is in
        the journal is written again only when named here. The first call after the state was
        read or saved whole writes every trial that is not running to a new journal segment.

        ``durable=False`` (a trial scheduler's decision, saved before it is carried out, maybe
        many times a second): the state file is not fsynced. It survives the death of any
        process; a machine crash may lose it, and leaves its fallback (the previous generation,
        always written durably) to read.
        """
        self._stamp()
        files = self._files
        if files.journal is None:
            files.journal = RecordJournal(paths.storage, paths.dir, files.segments)
        journal = files.journal
        if files.inline is None:
            journal.rewrite(self._journal_lines([t for t in self.trials if _at_rest(t)]),
                            self.generation)
            files.inline = {t.trial_id for t in self.trials if not _at_rest(t)}
        else:
            files.inline.update(changed)
            leaving = [t for t in map(self.trial, files.inline) if _at_rest(t)]
            journal.add(self._journal_lines(leaving), self.generation)
            files.inline.difference_update(t.trial_id for t in leaving)
        inline = sorted(files.inline, key=self.position)
        state = {
            **self._header_json(),
            "trial_count": len(self.trials),
            "journal": journal.listing(),
            "trials": [self._positioned(self.trial(trial_id)) for trial_id in inline],
        }
        self._write(paths, json.dumps(state, default=str, allow_nan=True).encode("utf-8"),
                    final=False, durable=durable)
        files.segments = list(journal.segments)
        journal.committed()

    def _stamp(self) -> None:
        self.updated = time.time()
        self.generation += 1
        if self.driver_sessions and getattr(self, "_driving", False):
            self.driver_sessions[-1][1] = self.updated

    def _positioned(self, trial: TrialRecord) -> dict:
        return {"position": self.position(trial.trial_id), **trial.to_json()}

    def _journal_lines(self, trials: list[TrialRecord]) -> list[tuple[str, bytes]]:
        return [(t.trial_id, json.dumps(self._positioned(t), default=str,
                                        allow_nan=True).encode("utf-8") + b"\n")
                for t in trials]

    def _write(self, paths: ExperimentPaths, data: bytes, final: bool,
               durable: bool = True) -> None:
        storage = paths.storage
        if final:
            storage.write_atomic(paths.state, data)
            storage.write_atomic(paths.state_backup, data)
        else:
            if self._files.last_bytes is not None:
                storage.write_atomic(paths.state_backup, self._files.last_bytes)
            storage.write_atomic(paths.state, data, durable=durable)
        self._files.last_bytes = data

    def merge_trial_records(self, paths: ExperimentPaths) -> "ExperimentState":
        """Each trial's record replaced by its own ``trial.json`` where that is newer: see
        :func:`merge_trial_records`. Returns self."""
        return merge_trial_records(self, paths)

    @classmethod
    def load(cls, paths: ExperimentPaths) -> "ExperimentState":
        """Read the state (with its journal's records), falling back to the previous
        generation if the latest is unreadable."""
        errors = []
        for path in (paths.state, paths.state_backup):
            for _ in range(_READS_WHILE_MERGED):
                try:
                    state = cls._load_file(paths, path)
                except SegmentGoneError as exc:  # merged by a save meanwhile: read it again
                    error = f"{path}: {exc}"
                    continue
                except StateVersionError:
                    raise
                except StateFormatError as exc:
                    error = str(exc)
                    break
                return state
            errors.append(error)
        raise StateFormatError(
            f"no readable experiment state at {paths.uri}: " + "; ".join(errors)
        )

    @classmethod
    def _load_file(cls, paths: ExperimentPaths, path: str) -> "ExperimentState":
        try:
            raw = paths.storage.read_bytes(path)
        except FileNotFoundError:
            raise StateFormatError(f"{path}: missing") from None
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise StateFormatError(f"{path}: not valid JSON ({exc})") from None
        try:
            segments = _listed_segments(data)
            # (A whole state without a tuple in it, a finished experiment's mostly: its configs
            # need no walk to turn lists back into tuples.)
            tuples = bool(segments) or TUPLE_KEY.encode() in raw
            state = cls.from_json(with_journal(paths, data), where=paths.storage.uri(path),
                                  tuples=tuples)
        except (StateFormatError, SegmentGoneError):
            raise
        except (KeyError, TypeError) as exc:
            raise StateFormatError(f"{path}: missing field {exc}") from None
        except ValueError as exc:  # a damaged journal
            raise StateFormatError(f"{path}: {exc}") from None
        state._files = _StateFiles(last_bytes=raw, segments=segments)
        state.loaded_from = path
        return state


#: How many times a reader reads the state again when a save merged the journal segments it
#: listed before they could be read.
_READS_WHILE_MERGED = 5


def _at_rest(trial: TrialRecord) -> bool:
    """Whether a trial's record goes to the journal: any trial that is not running."""
    return trial.status != TrialStatus.RUNNING


def _listed_segments(data: Any) -> list[Segment]:
    listing = data.get("journal") if isinstance(data, dict) else None
    if not listing:
        return []
    if not isinstance(listing, list):
        raise ValueError(f"its journal is not a list of segments: {listing!r}")
    return [Segment.from_json(entry) for entry in listing]


def with_journal(paths: ExperimentPaths, data: Any,
                 cache: Optional[JournalCache] = None) -> Any:
    """``data`` (a state file's JSON) with every trial's record in ``trials``, in order: the
    records of its journal (format 2, while a driver runs) merged in. A state that holds them
    all (format 1, a finished experiment) is returned as it is.

    ``cache``: for a reader that polls, what it read of the journal before (read again only
    where it grew). Raises :class:`~ftnb.storage.record_journal.SegmentGoneError` when a save
    merged the segments listed meanwhile (read the state again), ValueError for a damaged
    journal.
    """
    segments = _listed_segments(data)
    if not segments:
        return data
    by_id: dict = {}
    for record in read_segments(paths.storage, paths.dir, segments, cache):
        by_id[record["trial_id"]] = record
    for record in data.get("trials") or []:  # the state file's own records are the newest
        by_id[record["trial_id"]] = record
    trials = sorted(by_id.values(), key=lambda r: r.get("position", 0))
    if len(trials) != data.get("trial_count"):
        raise ValueError(f"its journal holds {len(trials)} trials where it lists "
                         f"{data.get('trial_count')!r}")
    return {**data, "trials": trials}


def _sessions(data: Any) -> list:
    """``driver_sessions`` as read: pairs of numbers (anything else is left out)."""
    if not isinstance(data, list):
        return []
    return [[float(s[0]), float(s[1])] for s in data
            if isinstance(s, list) and len(s) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in s)]


#: How a tuple in a trial's config is written (JSON has none), so that a restored trial gets
#: the tuple back, not a list.
TUPLE_KEY = "__ftnb_tuple__"


def _tuples_to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return {TUPLE_KEY: [_tuples_to_json(v) for v in value]}
    if isinstance(value, list):
        return [_tuples_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _tuples_to_json(v) for k, v in value.items()}
    return value


def _tuples_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(TUPLE_KEY), list):
            return tuple(_tuples_from_json(v) for v in value[TUPLE_KEY])
        return {k: _tuples_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tuples_from_json(v) for v in value]
    return value


def encode_value(value: Any) -> Any:
    """A JSON-able stand-in for a config value.

    JSON types pass through (tuples stay tuples: a trial's record writes them so that they come
    back as tuples), numpy/torch scalars become numbers, and any other object becomes a
    placeholder ``{"__ftnb_object__": type, "repr": ...}``: the state records what was there
    without pickling it.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {str(k): encode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(encode_value(v) for v in value)
    scalar = _as_scalar(value)
    if scalar is not _NOT_SCALAR:
        return scalar
    from ..objects import ObjectRef

    if isinstance(value, ObjectRef):
        return value.placeholder()  # the object was put: restore re-binds it by its place
    text = repr(value)
    if len(text) > 200:
        text = text[:197] + "..."
    return {"__ftnb_object__": f"{type(value).__module__}.{type(value).__qualname__}", "repr": text}


_NOT_SCALAR = object()


def _as_scalar(value: Any) -> Any:
    """numpy scalars, 0-d arrays and 0-d tensors as plain Python numbers."""
    item = getattr(value, "item", None)
    shape = getattr(value, "shape", None)
    if callable(item) and shape is not None and tuple(shape) == ():
        try:
            out = item()
        except Exception:
            return _NOT_SCALAR
        if isinstance(out, (bool, int, float, str)):
            return out
    return _NOT_SCALAR


def encode_metrics(metrics: dict) -> dict:
    """Reported metrics as plain Python values (numpy and torch scalars as numbers). A value
    that is not JSON (a string is) stays itself when it pickles, else becomes its text, as Ray
    Tune hands its callbacks any value: the JSON record keeps its text form (``json_line``)."""
    return {str(k): _metric_value(v, str(k)) for k, v in metrics.items()}


def _metric_value(value: Any, key: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {str(k): _metric_value(v, f"{key}/{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_metric_value(v, key) for v in value]
    scalar = _as_scalar(value)
    if scalar is not _NOT_SCALAR:
        return scalar
    return reported_object(value)


# -- how a record reads after its driver died (the rules every reader and restore share) -------
def without_driver(state: ExperimentState) -> ExperimentState:
    """A copy of ``state`` as it reads once its driver is gone: INTERRUPTED, and so are the
    trials it was running (their attempts died with it; a resume continues them from their
    checkpoints). ``state`` itself is not changed."""
    trials = [replace(t, status=INTERRUPTED) if t.status == TrialStatus.RUNNING else t
              for t in state.trials]
    return replace(state, status=INTERRUPTED, trials=trials)




def parse_trial_record(data: bytes, trial_id: str) -> Optional[TrialRecord]:
    """The trial record in ``data`` (a ``trial.json``), or None if it is unreadable or another
    trial's."""
    try:
        record = TrialRecord.from_json(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return record if record.trial_id == trial_id else None


def newer_record(current: Optional[TrialRecord],
                 candidate: Optional[TrialRecord]) -> Optional[TrialRecord]:
    """The record to believe: ``candidate`` (a trial's own ``trial.json``) when its ``seq`` is
    higher than ``current``'s (the one in the state), else ``current``."""
    if candidate is not None and (current is None or candidate.seq > current.seq):
        return candidate
    return current


def merge_trial_records(state: ExperimentState, paths: ExperimentPaths) -> ExperimentState:
    """Replace each trial's record in ``state`` by its own ``trial.json`` where that is newer
    (after a driver died, the trial records are its latest word). Returns ``state``.

    A finished trial's record in the state is its last word: the controller never changes a
    TERMINATED or ERRORED trial (a restore that runs an errored trial again saves the state
    before it starts), so only the others' files are read."""
    storage = paths.storage
    for i, trial in enumerate(state.trials):
        if trial.status in FINISHED_STATUSES:
            continue
        try:
            data = storage.read_bytes(paths.trial(trial.dir_name).record)
        except FileNotFoundError:
            continue
        state.trials[i] = newer_record(trial, parse_trial_record(data, trial.trial_id)) or trial
    return state
