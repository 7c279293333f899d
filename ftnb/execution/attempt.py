"""The body of an attempt: what runs in a rank, whichever executor runs it.

:func:`run_attempt` builds the attempt's :class:`~ftnb.session.TrialSession` from its
:class:`~ftnb.execution.contract.AttemptSpec`, runs the trainable, and tells the executor what
happens through an :class:`AttemptChannel`:

* a :class:`~ftnb.execution.contract.ResultEvent` after every persisted report,
* an :class:`~ftnb.execution.contract.ErrorEvent` when the trainable raised, exited non-zero, or
  misused the API,
* a :class:`~ftnb.execution.contract.DoneEvent` when it ended on its own terms (finished, stopped,
  preempted, fenced).

The started and exit events are the executor's: it sees the processes from outside.
:func:`install_preemption_handler` is for executors whose ranks are processes of their own.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from .contract import (
    EXIT_PREEMPTED,
    AttemptEvent,
    AttemptSpec,
    DoneEvent,
    ErrorEvent,
    PreemptedEvent,
    ResultEvent,
)
from .oom import is_out_of_memory

if TYPE_CHECKING:
    from ..session import TrialSession
    from .rank_group import RankPlace

EXIT_OK = 0
EXIT_ERROR = 1


class AttemptChannel(Protocol):
    """How an attempt talks to its executor."""

    def send(self, event: AttemptEvent) -> None:
        """Hand ``event`` to the executor (in order)."""

    def stop_requested(self) -> bool:
        """Whether the executor asked the attempt to stop; called at every report, so cheap."""

    def decision(self, iteration: int) -> str:
        """Wait for the controller's answer to the report of ``iteration`` (sent with
        ``awaits_decision``): ``continue``, ``stop`` or ``pause``; ``stop`` when the executor
        went away meanwhile."""

    def rendezvous(self, port: Optional[int]) -> tuple[str, int]:
        """A group's rank 0: hand the executor its store's ``port``; any other rank (``None``):
        wait for rank 0's ``(address, port)``. Only channels of group ranks need it."""


class WriteGuard(Protocol):
    """A fence check: ``check(force)`` raises :class:`ftnb.storage.lease.FencedError` when the attempt
    must write nothing more."""

    def check(self, force: bool = False) -> None: ...


def _returned_not_reported(trainable: Any, returned: Any) -> str:
    """The error of a trainable that returned a value (not a dict) and reported nothing: the
    trial would end with no metrics, its value lost."""
    name = getattr(trainable, "__name__", "the trainable")
    shown = repr(returned)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (f"{name} returned {type(returned).__name__} {shown} and reported nothing, so the "
            "trial has no metrics (only what is reported is kept, as in Ray Tune). Fix: "
            "ftnb.report({'score': value}) in the loop, or return a dict of metrics "
            "(return {'score': value}).")


def _report_returned(trainable: Any, returned: Any, session: "TrialSession") -> None:
    """What Ray's function API does with what a trainable returned or yielded: a dict is
    reported (a returned one is the final result); a generator's yields are reports, one by one.
    A value that is no dict is an error when nothing was reported (the trial would have no
    metrics) and a warning after reports (the value is not kept)."""
    import inspect

    from .. import session as session_mod

    if inspect.isgenerator(returned):
        for value in returned:  # Ray's `yield {...}` trainables
            if isinstance(value, dict):
                if value:
                    session.report(value)
            elif value is not None:
                raise session_mod.UsageError(_not_a_dict(trainable, value, "yielded"))
        return
    if isinstance(returned, dict):
        if returned:
            session.report(returned)  # Ray's function API: a returned dict is the final result
        return
    if returned is None or session.group is not None:
        return
    if session.iteration == 0:
        raise session_mod.UsageError(_returned_not_reported(trainable, returned))
    print(f"ftnb: warning: {_not_a_dict(trainable, returned, 'returned')}", file=sys.stderr,
          flush=True)


def _not_a_dict(trainable: Any, value: Any, verb: str) -> str:
    """The message of a trainable that ``verb`` ("returned" or "yielded") a value that is not
    a dict of metrics (Ray reports a number as ``_metric``; ftnb asks for a name)."""
    name = getattr(trainable, "__name__", "the trainable")
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    word = {"returned": "return", "yielded": "yield"}[verb]
    return (f"{name} {verb} {type(value).__name__} {shown}, not a dict of metrics, so it is not "
            f"kept. Fix: {word} a dict ({word} {{'score': value}}), or ftnb.report({{'score': "
            "value}).")


def run_attempt(spec: AttemptSpec, channel: AttemptChannel, *, rank: int = 0,
                this_thread_only: bool = False, guard: Optional[WriteGuard] = None,
                on_session: Optional[Callable[["TrialSession"], None]] = None,
                passthrough: tuple[type[BaseException], ...] = (),
                place: Optional["RankPlace"] = None) -> int:
    """Run the attempt ``spec`` as rank ``rank``; returns the exit code the rank should end with.

    ``place``: where this rank is in its group, for a group attempt (``spec.num_workers > 1``):
    it joins the group's rendezvous (:mod:`ftnb.execution.rank_group`) before the trainable
    runs, and only rank 0 persists reports.

    ``this_thread_only``: the trainable's ``ftnb.report`` & co. find the session in this thread
    only (an executor running several attempts in threads of one process). ``guard``: a check
    made before every write besides the lease's (an executor's own fence). ``on_session`` is
    called with the session before the trainable runs. ``passthrough``: exceptions that are
    the executor's own business (its kill), raised on instead of reported.
    """
    from .. import session as session_mod
    from ..objects import ObjectUnavailableError, resolve_refs

    ids = (spec.trial_id, spec.attempt)
    group = None
    if place is not None and place.world_size > 1:
        from .rank_group import RankGroup

        rank = place.rank
        try:
            group = RankGroup.join(place, channel.rendezvous, spec.collective_timeout_s)
        except passthrough:
            raise
        except BaseException as exc:  # a peer died during the rendezvous, or torch is missing
            report_exception(channel, ids, exc, "exception", rank=rank)
            return EXIT_ERROR
    session, log = _attempt_session(spec, channel, rank, guard, group, place)
    session_mod.set_session(session, this_thread_only=this_thread_only)
    if on_session is not None:
        on_session(session)

    try:
        config = resolve_refs(spec.config)
    except ObjectUnavailableError as exc:  # the driver that put it is gone: retrying cannot help
        report_exception(channel, ids, exc, "usage", rank=rank)
        return EXIT_ERROR
    try:
        outcome, code = _run_trainable(spec, channel, session, config, rank=rank,
                                       passthrough=passthrough)
        session.run_end_hooks(outcome)
    finally:
        log.close()
        if this_thread_only:
            session_mod.set_session(None, this_thread_only=True)
    if outcome is None:
        return code
    if group is not None:
        group.finish()
    channel.send(DoneEvent(*ids, outcome=outcome, iteration=session.iteration))
    return EXIT_OK


def _attempt_session(spec: AttemptSpec, channel: AttemptChannel, rank: int,
                     guard: Optional[WriteGuard], group: Any,
                     place: Optional["RankPlace"]) -> tuple["TrialSession", Any]:
    """The attempt's session (what ``ftnb.report`` & co. talk to) as rank ``rank``, and the
    result log it persists reports to: writes fenced by the lease and ``guard``, reports sent
    to ``channel`` once persisted."""
    from .. import session as session_mod
    from ..storage import ExperimentPaths
    from ..storage.result_log import ResultLog

    def send_result(kind: str, row: Any) -> None:
        # The session's one message: a persisted report ("decision_point": it waits for the
        # controller's answer, see ftnb.execution.contract's Decisions).
        channel.send(ResultEvent(spec.trial_id, spec.attempt, row, rank,
                                 awaits_decision=kind == "decision_point"))

    storage = spec.storage
    experiment = ExperimentPaths(storage, spec.experiment_dir)
    paths = experiment.trial(spec.trial_dir_name)
    log = ResultLog(paths, existing=list(spec.rows))
    fences: list[Any] = []
    if spec.fence is not None:
        from ..storage.lease import Fence

        fences.append(Fence(experiment, spec.fence.as_lease_spec()))
    if guard is not None:
        fences.append(guard)
    context = session_mod.TrialContext(
        trial_id=spec.trial_id,
        trial_name=spec.trial_name or spec.trial_id,
        experiment_name=spec.experiment_name,
        experiment_path=experiment.uri,
        trial_dir=storage.uri(paths.dir),
        attempt=spec.attempt,
        resources=spec.resources.as_dict() if spec.resources is not None else None,
    )
    if place is not None:
        context.world_rank, context.world_size = place.rank, place.world_size
        context.local_rank, context.local_world_size = place.local_rank, place.local_world_size
        context.node_rank = place.node_rank
    session = session_mod.TrialSession(
        context=context,
        storage=storage,
        paths=paths,
        log=log,
        send=send_result,
        poll_stop=channel.stop_requested,
        start_iteration=spec.start_iteration,
        time_offset=spec.time_offset_s,
        next_checkpoint_index=spec.next_checkpoint_index,
        restore_checkpoint=spec.restore_checkpoint,
        stop=spec.stop,
        checkpoint_score_attribute=spec.checkpoint_score_attribute,
        metric=spec.metric,
        ranked_metrics=spec.ranked_metrics,
        fence=fences[0] if len(fences) == 1 else (_AllFences(fences) if fences else None),
        group=group,
        decision_points=spec.decision_points,
        # (asked only at a scheduler's decision points and by a class trainable's checkpoint
        # query: a channel written before the decisions, an executor's own, need not have it)
        wait_decision=getattr(channel, "decision", None),
        storage_wait_s=spec.storage_wait_s,
    )
    return session, log


def _run_trainable(spec: AttemptSpec, channel: AttemptChannel, session: "TrialSession",
                   config: Any, *, rank: int,
                   passthrough: tuple[type[BaseException], ...]) -> tuple[Optional[str], int]:
    """Run the trainable on ``config`` in ``session``: ``(outcome, EXIT_OK)`` when it ended on
    its own terms (finished, stopped, preempted, fenced), else ``(None, the rank's exit
    code)`` with its error sent. Its traceback starts here: :func:`report_exception` leaves
    this frame out, so the user sees their own code first."""
    from .. import session as session_mod

    ids = (spec.trial_id, spec.attempt)
    group = session.group
    try:
        _report_returned(spec.trainable, spec.trainable(config), session)
        session.finish_uploads()  # the attempt ends once its asynchronous checkpoints are whole
        return "finished", EXIT_OK
    except session_mod.AttemptEnd as end:
        if isinstance(end, session_mod.Fenced):
            print(f"ftnb: {end}", file=sys.stderr, flush=True)
            if group is not None and rank == 0:  # the others wait on this report: tell them
                try:
                    group.publish(session.iteration, "fenced")
                except Exception:
                    pass
        return end.outcome, EXIT_OK
    except session_mod.UsageError as exc:
        session.finish_uploads(quiet=True)  # the reports before the error are still persisted
        report_exception(channel, ids, exc, "usage", rank=rank)
        return None, EXIT_ERROR
    except SystemExit as exc:
        session.finish_uploads(quiet=True)
        code = exc.code
        if code in (None, 0):
            return "finished", EXIT_OK
        numeric = code if isinstance(code, int) else 1
        channel.send(ErrorEvent(*ids, failure_kind="exit", exit_code=numeric,
                                message=f"sys.exit({code!r})", iteration=session.iteration,
                                rank=rank))
        return None, numeric
    except passthrough:
        raise
    except BaseException as exc:
        session.finish_uploads(quiet=True)
        report_exception(channel, ids, exc, "oom" if is_out_of_memory(exc) else "exception",
                         session.iteration, rank=rank)
        return None, EXIT_ERROR


class AttemptGuard:
    """A write guard for executors whose attempts can outlive their loss (a node cut off from
    the cluster goes on running): the trial's record (``trial.json``, written by the controller
    before it starts an attempt) names a later attempt, so this one is a ghost and writes
    nothing more. Checked before every write: a ``stat`` on a local or shared disk (the record
    is read only when it changed), a read elsewhere."""

    def __init__(self, paths: Any, attempt: int) -> None:
        self.paths = paths
        self.attempt = attempt
        self._version: Any = object()

    def check(self, force: bool = False) -> None:
        import json

        from ..storage.lease import FencedError

        storage = self.paths.storage
        try:
            version = storage.cheap_version(self.paths.record)
        except FileNotFoundError:
            return
        if version is not None and version == self._version:
            return
        self._version = version
        try:
            latest = len(json.loads(storage.read_bytes(self.paths.record)).get("attempts") or [])
        except (FileNotFoundError, ValueError):
            return
        if latest > self.attempt:
            raise FencedError(
                f"attempt {self.attempt} was replaced by attempt {latest} of this trial (its "
                "node was taken for lost): it writes nothing more"
            )


class _AllFences:
    """Several write guards as one: each must pass."""

    def __init__(self, fences: list[Any]) -> None:
        self.fences = fences

    def check(self, force: bool = False) -> None:
        for fence in self.fences:
            fence.check(force)


def report_exception(channel: AttemptChannel, ids: tuple[str, int], exc: BaseException,
                     failure_kind: str, iteration: int = 0, *, rank: int = 0) -> None:
    """Print ``exc``'s traceback to stderr (where users look first) and send it as an
    :class:`~ftnb.execution.contract.ErrorEvent` of attempt ``ids`` (trial id, attempt number)."""
    frames = exc.__traceback__
    # The first frame is ftnb calling the trainable: start the traceback at the user's code.
    if (
        frames is not None
        and frames.tb_next is not None
        and frames.tb_frame.f_code.co_filename == __file__
    ):
        frames = frames.tb_next
    tb = "".join(traceback.format_exception(type(exc), exc, frames))
    try:
        print(tb, file=sys.stderr, flush=True)
    except OSError:
        pass  # stderr's file is on a full (or read-only) disk: the event below still goes
    from ..storage.faults import is_storage_fault, storage_fault

    if failure_kind == "exception" and is_storage_fault(exc):
        failure_kind = "storage"  # a report into a full disk, or its output file before it ran
    fault = None
    if failure_kind == "storage":
        exc = storage_fault(exc)  # its message names the path, the error in words and the fix
        fault = exc.as_dict() if hasattr(exc, "as_dict") else None
    channel.send(ErrorEvent(*ids, failure_kind=failure_kind, type=type(exc).__name__,
                            message=str(exc), traceback=tb, iteration=iteration, rank=rank,
                            storage_fault=fault))


def install_preemption_handler(session: Any, grace_s: float, channel: AttemptChannel,
                               rank: int = 0) -> None:
    """SIGTERM means the slot is going away: ask for a checkpoint, then leave in time (this
    process exits with :data:`~ftnb.execution.contract.EXIT_PREEMPTED` after ``grace_s``)."""

    def on_sigterm(signum: int, frame: Any) -> None:
        if session.preempted:
            return
        session.preempted = True
        context = session.context
        try:
            channel.send(PreemptedEvent(context.trial_id, context.attempt,
                                        iteration=session.iteration, rank=rank))
        except OSError:
            pass

        def leave() -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_PREEMPTED)

        timer = threading.Timer(grace_s, leave)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_sigterm)
