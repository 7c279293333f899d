"""The executor contract: what the controller hands an executor, and what it gets back.

The controller decides (which trial runs next, what a failure means, what the trial's status
is); an executor runs. It is handed an :class:`AttemptSpec`, runs that attempt somewhere (local
processes, threads of this process, later a cluster) and reports what happens as typed events
(:class:`EventKind`, one frozen dataclass per kind). Everything that touches a machine is the
executor's: processes, signals, GPUs and CPUs, environment variables, output files, ``sys.path``
and the working directory. The controller never imports any of it.

Rules every executor follows (the suite :class:`ftnb.testing.executor_contract.ExecutorContract`
checks them; ``tests/test_executor_contract.py`` runs it on each of ftnb's executors):

Threading
    An executor is driven from one thread, the controller's: ``has_room``, ``start``, ``poll``,
    ``request_stop``, ``kill``, ``running`` and ``shutdown`` are never called concurrently. An
    executor may use threads of its own inside; events reach the controller only through
    :meth:`Executor.poll`, in the controller's thread.

Resources
    The executor owns the resources of its machines: it says what it has (``capacity``), whether
    an attempt of some size fits now (``has_room``) or ever (``check_fits``), allocates them in
    ``start`` and releases them before it hands over the attempt's exit event. The controller
    keeps only ``max_concurrent_trials`` and the order in which trials start.

Ordering
    For one attempt (``trial_id``, ``attempt``), events arrive in the order the attempt produced
    them. :class:`StartedEvent` comes first (when the attempt got as far as running);
    :class:`ExitEvent` comes last, exactly once, for every attempt that ``start`` accepted,
    however it ended (even one killed before it ran a line). Nothing of that attempt arrives
    after its exit event. Events of different attempts may interleave in any order.

Groups
    An attempt of ``num_workers > 1`` ranks (an executor with ``runs_groups``) is still one
    attempt: one :class:`StartedEvent` once every rank runs (``pids`` in rank order), result
    events from rank 0 only (it alone persists), error and preempted events from any rank
    (``rank`` says which), one :class:`DoneEvent` (rank 0's), and one :class:`ExitEvent` with a
    :class:`RankExit` per rank. It fails as one: at the first rank's failure the executor ends
    every other rank (``collateral``) and names the cause in ``first_failing_rank``; a rank that
    makes no progress for ``AttemptSpec.collective_timeout_s`` is ``hung``. An error that is only
    a peer's reaction (:func:`is_peer_error`) is never preferred as the cause over a rank's own.

Decisions
    A report may wait for the controller's decision (a scheduler's decision point:
    :attr:`AttemptSpec.decision_points`): its :class:`ResultEvent` says so
    (``awaits_decision``), and the attempt blocks in ``report()`` until the controller answers
    through :meth:`Executor.decide` with ``continue``, ``stop`` or ``pause`` (the last two end
    the attempt at that report, with a ``stopped`` :class:`DoneEvent`). Only such reports wait:
    every other report returns once it is persisted. The executor hands the answer to the
    running attempt (rank 0 of a group, which publishes the end to the other ranks, so every
    rank ends at that report); an answer for an attempt that is gone, or for a report that
    awaits none, is dropped. An attempt whose executor went away while it waited ends as if
    stopped, writing nothing more.

Ownership
    The spec belongs to the caller and is not changed by the executor; how it travels (pickled
    to a process, copied into a thread) is the executor's business, but the trainable always
    travels by value, so functions defined in a notebook or ``__main__`` work. Processes,
    threads, allocations and staged output files belong to the executor until the attempt's exit
    event is handed over, and are released by then. ``shutdown`` ends every attempt and releases
    everything; the controller calls it when it ends, normally or not.

Persistence
    An attempt persists its own results and checkpoints (from wherever it runs) before it sends
    the result event: a result event is news of something already on storage. Every write is
    fenced (:attr:`AttemptSpec.fence`): an attempt of a driver that lost the experiment writes
    nothing more.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ClassVar,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Union,
    runtime_checkable,
)

from ..schedulers.decision_points import DecisionPoints
from .resources import TrialResources

if TYPE_CHECKING:
    from ..storage import Storage

__all__ = [
    "EXIT_PREEMPTED",
    "AttemptEvent",
    "AttemptFence",
    "AttemptSpec",
    "Capacity",
    "DECISIONS",
    "DecisionPoints",
    "DoneEvent",
    "ErrorEvent",
    "EventKind",
    "Executor",
    "ExitEvent",
    "GroupNotSupportedError",
    "NoRoomError",
    "OutputEvent",
    "PreemptedEvent",
    "RankExit",
    "ResultEvent",
    "StartedEvent",
    "is_peer_error",
]

#: The exit code of an attempt that was preempted (SIGTERM, 128 + 15) and ended itself, whether
#: or not it checkpointed in its grace period: still a preemption, not a failure.
EXIT_PREEMPTED = 143


# ---- what the controller hands over ------------------------------------------------------------


@dataclass(frozen=True)
class AttemptFence:
    """What an attempt checks before every write: that the driver whose lease ``token`` (of
    ``epoch``) started it still owns the experiment (see :class:`ftnb.storage.lease.Fence`).
    ``host_id`` is the driver's machine; ``ttl_s`` its lease's time to live."""

    token: str
    host_id: str
    ttl_s: float
    epoch: Optional[int] = None

    def as_lease_spec(self) -> dict:
        """The dict :class:`ftnb.storage.lease.Fence` reads."""
        return {"token": self.token, "host_id": self.host_id, "ttl_s": self.ttl_s}


#: What the controller answers a report that waits for its decision (:meth:`Executor.decide`).
DECISIONS = ("continue", "stop", "pause", "checkpoint")  # (checkpoint: ftnb.core.checkpoint_queries)


def _one_cpu() -> TrialResources:
    return TrialResources()


@dataclass(frozen=True)
class AttemptSpec:
    """Everything one attempt of one trial needs, whoever runs it.

    Identity: ``trial_id`` and ``attempt`` (1 for the trial's first). What to run: ``trainable``
    called with ``config`` (which may hold ``ftnb.put`` refs, resolved where the attempt runs).
    Where it writes: ``storage``, the experiment folder ``experiment_dir`` (named
    ``experiment_name``) and the trial's folder ``trial_dir_name`` in it. What it needs:
    ``resources`` for each of its ``num_workers`` ranks (a group that starts, fails and stops as
    one unit; 1 for an ordinary trial; a group's ranks learn their rank from the executor, and
    only rank 0 persists reports). Where it resumes: ``restore_checkpoint`` (a checkpoint
    folder name in the trial's folder, or None for a fresh start), ``start_iteration`` and
    ``time_offset_s`` (what that checkpoint's report said), ``next_checkpoint_index`` (the number
    of its next checkpoint folder) and ``rows`` (the trial's result rows up to that checkpoint,
    already trimmed on storage). How it behaves: ``stop`` (RunConfig.stop: a dict of thresholds
    or a callable), ``checkpoint_score_attribute``, ``metric`` (TuneConfig.metric, checked
    against the first report), ``preemption_grace_period_s`` (how long it may take to checkpoint
    after a SIGTERM). ``fence``: the lease it belongs to (None: unfenced, for tests).
    """

    trial_id: str
    attempt: int
    trainable: Callable[[dict], Any]
    config: Mapping[str, Any]
    storage: "Storage"
    experiment_dir: str
    experiment_name: str
    trial_dir_name: str
    resources: TrialResources = field(default_factory=_one_cpu)
    num_workers: int = 1
    restore_checkpoint: Optional[str] = None
    start_iteration: int = 0
    time_offset_s: float = 0.0
    next_checkpoint_index: int = 0
    rows: Sequence[dict] = ()
    stop: Union[Mapping[str, float], Callable[[str, dict], bool], None] = None
    checkpoint_score_attribute: Optional[str] = None
    metric: Optional[str] = None
    preemption_grace_period_s: float = 30.0
    fence: Optional[AttemptFence] = None
    #: A group's hang limit: a rank that makes no progress for this long (stopped by SIGSTOP,
    #: waiting on a dead peer) ends the group (:class:`ftnb.ScalingConfig`'s
    #: ``collective_timeout_s``). Unused by single-worker attempts.
    collective_timeout_s: float = 30.0
    #: The trial's name (TuneConfig(trial_name_creator=...)); None: its id.
    trial_name: Optional[str] = None
    #: The reports that wait for the controller's decision (its scheduler's), None: none.
    decision_points: Optional[DecisionPoints] = None
    #: How long a report waits for storage that refused its write (full, read-only, denied)
    #: to take it (FailureConfig(storage_wait_s)); None: it raises at once.
    storage_wait_s: Optional[float] = None
    #: The metrics that rank the trials, each with who ranks by it (``("loss",
    #: "ASHAScheduler(metric='loss')")``): TuneConfig's, the scheduler's, the searcher's. A
    #: report that gives one of them as text is a usage error (only numbers can rank).
    ranked_metrics: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Capacity:
    """The resources an executor has: ``cpus`` (may be fractional) and the ids of its GPUs."""

    cpus: float
    gpu_ids: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        """How many GPUs."""
        return len(self.gpu_ids)


class NoRoomError(RuntimeError):
    """:meth:`Executor.start` was called while the executor had no room for the attempt (ask
    :meth:`Executor.has_room` first)."""


class GroupNotSupportedError(ValueError):
    """The executor cannot run an attempt of that many workers."""


def group_refused(executor: str, num_workers: Any) -> GroupNotSupportedError:
    """The one-line error of an executor that runs single-worker attempts only."""
    return GroupNotSupportedError(
        f"num_workers={num_workers!r}: the {executor!r} executor runs an attempt as one worker "
        "(num_workers=1); groups of ranks (ScalingConfig(num_workers=N)) run on the 'local' "
        "executor. Fix: use num_workers=1, or the 'local' executor."
    )


# ---- what comes back ---------------------------------------------------------------------------


class EventKind(str, enum.Enum):
    """The kinds of event an attempt produces, in the order they may come (see the module
    docstring for the ordering rules)."""

    #: The attempt runs (its processes are up): always first, at most once.
    STARTED = "started"
    #: A report was persisted (its row is on storage): one per acknowledged report.
    RESULT = "result"
    #: The trainable raised, called ``sys.exit`` with a non-zero code, or misused ftnb's API.
    ERROR = "error"
    #: The attempt was told its slot is going away (SIGTERM) and is checkpointing to leave.
    PREEMPTED = "preempted"
    #: The attempt ended on its own terms (finished, stopped at a request, preempted, fenced).
    DONE = "done"
    #: Lines the attempt wrote to its stdout or stderr (only whole lines are handed over).
    OUTPUT = "output"
    #: How the attempt's workers ended: always the attempt's last event, exactly once.
    EXIT = "exit"


@dataclass(frozen=True)
class AttemptEvent:
    """What every event carries: the trial and the attempt it belongs to."""

    kind: ClassVar[EventKind]
    trial_id: str
    attempt: int


@dataclass(frozen=True)
class StartedEvent(AttemptEvent):
    """The attempt runs. ``pids``: the OS processes of its ranks, in rank order (empty when it
    runs in no process of its own, as with the in-process executor)."""

    kind: ClassVar[EventKind] = EventKind.STARTED
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResultEvent(AttemptEvent):
    """One acknowledged report: ``row`` (with ftnb's keys: training_iteration, attempt, ...) is
    already persisted, by ``rank``. ``awaits_decision``: the attempt waits in ``report()`` for
    the controller's answer (:meth:`Executor.decide`), a decision point."""

    kind: ClassVar[EventKind] = EventKind.RESULT
    row: dict = field(default_factory=dict)
    rank: int = 0
    awaits_decision: bool = False


@dataclass(frozen=True)
class ErrorEvent(AttemptEvent):
    """Rank ``rank`` failed in a way it could tell: ``failure_kind`` is ``exception``, ``oom``
    (MemoryError or a framework's OutOfMemoryError), ``usage`` (ftnb's API misused: never
    retried), ``storage`` (the storage refused a write: ``storage_fault`` is
    :meth:`ftnb.storage.faults.StorageFault.as_dict`) or ``exit`` (``sys.exit`` with a non-zero
    code, in ``exit_code``); ``type``, ``message`` and ``traceback`` describe it, ``iteration``
    is where it happened."""

    kind: ClassVar[EventKind] = EventKind.ERROR
    failure_kind: str = "exception"
    type: Optional[str] = None
    message: str = ""
    traceback: Optional[str] = None
    iteration: int = 0
    exit_code: Optional[int] = None
    rank: int = 0
    storage_fault: Optional[dict] = None

    def as_failure(self) -> dict:
        """The error as the failure policy reads it (``ftnb.core.policy.AttemptEnd.error``)."""
        data: dict = {"kind": self.failure_kind, "type": self.type, "message": self.message,
                      "traceback": self.traceback, "iteration": self.iteration}
        if self.exit_code is not None:
            data["exit_code"] = self.exit_code
        return data


@dataclass(frozen=True)
class PreemptedEvent(AttemptEvent):
    """Rank ``rank`` got SIGTERM at ``iteration``: it checkpoints at its next report and leaves
    (or is ended after its grace period). Not a failure of the trial's."""

    kind: ClassVar[EventKind] = EventKind.PREEMPTED
    iteration: int = 0
    rank: int = 0


@dataclass(frozen=True)
class DoneEvent(AttemptEvent):
    """The attempt ended on its own terms: ``outcome`` is ``finished`` (returned, or met its
    stop criterion), ``stopped`` (at a stop request), ``preempted`` (checkpointed after a
    SIGTERM) or ``fenced`` (its driver lost the experiment); ``iteration`` is its last."""

    kind: ClassVar[EventKind] = EventKind.DONE
    outcome: str = "finished"
    iteration: int = 0


@dataclass(frozen=True)
class OutputEvent(AttemptEvent):
    """``text`` (one or more whole lines) that rank ``rank`` wrote to ``stream`` (``stdout`` or
    ``stderr``). An executor hands output over only when asked to (``output_events``); a last
    line without its newline is kept in the trial's output file but not handed over."""

    kind: ClassVar[EventKind] = EventKind.OUTPUT
    stream: str = "stdout"
    text: str = ""
    rank: int = 0


@dataclass(frozen=True)
class RankExit:
    """How one rank's process ended: ``exit_code`` (negative: killed by that signal; None:
    unknown, as when its node was lost) and whether the kernel's OOM killer did it. In a group:
    ``hung``, the rank stopped making progress (the executor's liveness check) and was killed
    for it; ``collateral``, the executor ended it because another rank failed first."""

    rank: int
    exit_code: Optional[int]
    oom_killed: bool = False
    hung: bool = False
    collateral: bool = False

    @property
    def signal_number(self) -> Optional[int]:
        """The signal that killed it, if one did."""
        if self.exit_code is not None and self.exit_code < 0:
            return -self.exit_code
        return None

    @property
    def failed(self) -> bool:
        """Anything but a clean exit (code 0)."""
        return self.exit_code != 0


@dataclass(frozen=True)
class ExitEvent(AttemptEvent):
    """How the attempt ended, from outside: one :class:`RankExit` per rank in ``ranks``;
    ``first_failing_rank`` is the rank whose failure came first (the cause; the others were
    ended with it), None when every rank exited cleanly. ``node_lost``: the machine running it
    is gone (``node`` names it), whatever its exit looked like. Always the attempt's last event.
    """

    kind: ClassVar[EventKind] = EventKind.EXIT
    ranks: tuple[RankExit, ...] = ()
    first_failing_rank: Optional[int] = None
    node_lost: bool = False
    node: Optional[str] = None

    @property
    def cause(self) -> Optional[RankExit]:
        """The first failing rank's exit, else rank 0's (None when no rank is known)."""
        for rank_exit in self.ranks:
            if rank_exit.rank == self.first_failing_rank:
                return rank_exit
        return self.ranks[0] if self.ranks else None

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code of :attr:`cause`."""
        cause = self.cause
        return cause.exit_code if cause is not None else None

    @property
    def oom_killed(self) -> bool:
        """Whether :attr:`cause` was killed by the kernel's OOM killer."""
        cause = self.cause
        return bool(cause and cause.oom_killed)

    @property
    def signal_number(self) -> Optional[int]:
        """The signal that killed :attr:`cause`, if one did."""
        cause = self.cause
        return cause.signal_number if cause is not None else None

    @classmethod
    def of_one(cls, trial_id: str, attempt: int, exit_code: Optional[int],
               oom_killed: bool = False) -> "ExitEvent":
        """The exit of a single-worker attempt."""
        rank = RankExit(0, exit_code, oom_killed)
        return cls(trial_id, attempt, (rank,), 0 if rank.failed else None)


#: What the collectives (gloo, NCCL) and the rendezvous store say when the failure is a peer's:
#: a rank that reports one of these failed because another rank died, hung or left.
_PEER_ERROR_TYPES = frozenset({"DistNetworkError", "DistStoreError", "DistBackendError"})
_PEER_ERROR_WORDS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "timed out",
    "timeout", "connection refused", "socket closed", "communicator was aborted",
    "nccl communicator", "peer", "watchdog", "process group", "processgroup",
)


def is_peer_error(type_name: Optional[str], message: str) -> bool:
    """Whether a rank's error (its type's name and message) is the collectives' reaction to
    another rank's failure, not a failure of its own (see :attr:`RankExit.collateral`).

    >>> is_peer_error("RuntimeError", "[pair.cc:553] Connection closed by peer [127.0.0.1]:5")
    True
    >>> is_peer_error("ValueError", "bad learning rate")
    False
    """
    if type_name in _PEER_ERROR_TYPES:
        return True
    if type_name not in ("RuntimeError", "DistError", "TimeoutError", "ConnectionError",
                         "ConnectionResetError", "BrokenPipeError", "OSError"):
        return False
    text = message.lower()
    return any(word in text for word in _PEER_ERROR_WORDS)


# ---- the executor ------------------------------------------------------------------------------


@runtime_checkable
class Executor(Protocol):
    """Runs attempts and reports their events (see the module docstring for the rules).

    Executors are chosen by name (:func:`ftnb.execution.create_executor`). A lifecycle::

        if executor.has_room(spec.resources, spec.num_workers):
            executor.start(spec)
        for event in executor.poll(0.1):  # until the attempt's ExitEvent
            ...
        executor.shutdown()
    """

    #: The name it is registered under ("local", "inprocess", ...).
    name: str
    #: Whether it runs attempts of ``num_workers > 1`` ranks (see Groups in the module
    #: docstring). One that does not refuses them in :meth:`check_fits` and :meth:`start` with
    #: :class:`GroupNotSupportedError` (:func:`group_refused`); the contract suite's group
    #: tests run only where it is true.
    runs_groups: bool

    def capacity(self) -> Capacity:
        """The resources this executor has, all of them (used or not)."""
        ...

    def check_fits(self, resources: TrialResources, num_workers: int = 1) -> None:
        """Raise ``ValueError`` (with the fix) if an attempt of ``num_workers`` ranks, each
        asking for ``resources``, can never run here, even with nothing else running."""
        ...

    def has_room(self, resources: TrialResources, num_workers: int = 1) -> bool:
        """Whether such an attempt could start now. Raises like :meth:`check_fits`."""
        ...

    def check_storage(self, storage: "Storage") -> None:
        """Raise ``ValueError`` (with the fix) if the attempts it runs could not write to
        ``storage``, the experiment's (a local path that a cluster's other nodes do not see).
        Called once before an experiment starts or resumes, before anything is written; an
        executor of this machine accepts any storage this process can write to."""
        ...

    def start(self, spec: AttemptSpec) -> None:
        """Allocate the attempt's resources and start it; its events arrive through
        :meth:`poll`. Raises :class:`NoRoomError` when it has no room now,
        ``ValueError`` (:class:`GroupNotSupportedError` for a group it cannot run) when it never
        could, and ``ValueError`` when the trial already has a running attempt here."""
        ...

    def poll(self, timeout: float) -> list[AttemptEvent]:
        """The events that arrived, waiting up to ``timeout`` seconds for the first one."""
        ...

    def request_stop(self, trial_id: str) -> None:
        """Ask the trial's attempt to end at its next report (it keeps its checkpoints and ends
        with a ``stopped`` :class:`DoneEvent`). Nothing happens if it is not running."""
        ...

    def decide(self, trial_id: str, iteration: int, decision: str) -> None:
        """Answer the running attempt's report of ``iteration`` that waits for a decision (its
        :class:`ResultEvent` had ``awaits_decision``): ``decision`` is one of
        :data:`DECISIONS`. Dropped when the trial runs no attempt here."""
        ...

    def kill(self, trial_id: str) -> None:
        """End the trial's attempt now, every rank and whatever they started; its exit event
        (a SIGKILL) follows through :meth:`poll`, and it writes nothing more."""
        ...

    def running(self) -> list[str]:
        """The trial ids with an attempt whose exit event has not been handed over yet."""
        ...

    def shutdown(self) -> None:
        """Kill every attempt, wait for them to end, release every resource; events not yet
        polled are dropped. The executor starts nothing afterwards. Safe to call twice."""
        ...
