"""What a trainable calls: ``report``, ``get_checkpoint``, ``get_context``.

These functions work inside a trial process only. ``report`` persists the result line (and the
checkpoint) itself, from the trial's own process, before it returns: an acknowledged report is
on storage whatever dies afterwards, and the controller is only told about it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union

from .checkpoint import Checkpoint
from .config import metric_value
from .core.records import encode_metrics
from .storage import AUTO_KEYS, NONFINITE_KEY
from .storage.faults import waiting_out_faults
from .storage.result_log import flatten_row

#: A metric that is not in a report (None is a value a trainable may report).
_MISSING = object()

if TYPE_CHECKING:
    from .storage import Storage, TrialPaths
    from .storage.result_log import ResultLog

__all__ = ["TrialContext", "get_checkpoint", "get_context", "get_dataset_shard", "report"]



class UsageError(Exception):
    """ftnb's API was called wrongly inside a trial. Such a failure is never retried."""


class _AttemptEnd(BaseException):
    """Unwinds the trainable when the attempt must end (a BaseException, so that a trainable's
    ``except Exception`` does not swallow it)."""

    outcome = "finished"


class _StopCriterionMet(_AttemptEnd):
    outcome = "finished"


class _StopRequested(_AttemptEnd):
    outcome = "stopped"


class _Preempted(_AttemptEnd):
    outcome = "preempted"


class _Fenced(_AttemptEnd):
    """Another driver owns the experiment: end at once, writing nothing more."""

    outcome = "fenced"


#: How rank 0 tells the other ranks of a group that the attempt ends at a report.
_ENDS: dict[str, type[_AttemptEnd]] = {
    "stop_criterion": _StopCriterionMet,
    "stopped": _StopRequested,
    "preempted": _Preempted,
    "fenced": _Fenced,
}


def _end_name(end: _AttemptEnd) -> str:
    return next(name for name, cls in _ENDS.items() if type(end) is cls)


@dataclass
class TrialContext:
    """Facts about the running trial, as returned by :func:`get_context`.

    Attributes and Ray-style getters (``get_trial_id()`` etc.) are both provided.
    """

    trial_id: str
    trial_name: str
    experiment_name: str
    experiment_path: str
    trial_dir: str
    attempt: int
    world_rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    #: What the trial asked for (``{"cpu": 1.0, "gpu": 0.0}``): resources_per_trial or
    #: ftnb.with_resources, per rank for a group.
    resources: Optional[dict] = None
    _session: Any = None

    @property
    def should_checkpoint(self) -> bool:
        """True once the process has been asked to stop (SIGTERM: preemption, or a stop
        request): report a checkpoint now and it will be resumed from there."""
        s = self._session
        return bool(s and (s.preempted or s.stop_requested))

    @property
    def preempted(self) -> bool:
        """True once the trial process received SIGTERM (its machine or slot is going away)."""
        return bool(self._session and self._session.preempted)

    def get_trial_id(self) -> str:
        return self.trial_id

    def get_trial_name(self) -> str:
        return self.trial_name

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_trial_dir(self) -> str:
        return self.trial_dir

    def get_world_rank(self) -> int:
        """This rank's place in its group (0 for an ordinary trial)."""
        return self.world_rank

    def get_world_size(self) -> int:
        """How many ranks the group has (1 for an ordinary trial)."""
        return self.world_size

    def get_local_rank(self) -> int:
        """This rank's place among the group's ranks on its node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """How many of the group's ranks run on this node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """The index of this rank's node among the group's nodes."""
        return self.node_rank

    def get_experiment_path(self) -> str:
        return self.experiment_path

    def get_trial_resources(self) -> dict:
        """The resources this trial (each rank of a group) was given, ``{"cpu": 2.0, "gpu":
        0.0}``: Ray Tune's ``get_trial_resources()``, as a dict."""
        return dict(self.resources) if self.resources is not None else {"cpu": 1.0, "gpu": 0.0}


class TrialSession:
    """The state of one attempt inside its process."""

    def __init__(
        self,
        *,
        context: TrialContext,
        storage: "Storage",
        paths: "TrialPaths",
        log: "ResultLog",
        send: Callable[[str, Any], None],
        poll_stop: Callable[[], bool],
        start_iteration: int,
        time_offset: float,
        next_checkpoint_index: int,
        restore_checkpoint: Optional[str],
        stop: Union[Mapping[str, float], Callable[[str, dict], bool], None],
        checkpoint_score_attribute: Optional[str],
        metric: Optional[str] = None,
        fence: Any = None,
        group: Any = None,
        decision_points: Any = None,
        wait_decision: Optional[Callable[[int], str]] = None,
        storage_wait_s: Optional[float] = None,
    ) -> None:
        self.context = context
        self.context._session = self
        #: How long a report waits for storage that refused it (FailureConfig(storage_wait_s)).
        self.storage_wait_s = storage_wait_s
        self.storage = storage
        self.paths = paths
        self.log = log
        self.send = send
        self.poll_stop = poll_stop
        self.iteration = start_iteration
        self.time_offset = time_offset
        self.next_checkpoint_index = next_checkpoint_index
        self.restore_checkpoint = restore_checkpoint
        self.stop = stop
        self.checkpoint_score_attribute = checkpoint_score_attribute
        # TuneConfig.metric, checked against the first report; None once checked (or unset).
        self.metric_to_check = metric
        self.fence = fence
        #: The attempt's :class:`~ftnb.execution.rank_group.RankGroup` when it is a group.
        self.group = group
        #: ``TorchTrainer(datasets=...)``, resolved: :func:`get_dataset_shard` shards them.
        self.datasets: dict = {}
        self._shards: dict = {}
        self.started = time.time()
        self.last_report = self.started
        self.preempted = False
        self.stop_requested = False
        self._stop_keys_checked = False
        #: The scheduler's decision points (:class:`~ftnb.execution.contract.DecisionPoints`):
        #: the reports that wait for the controller's answer (``wait_decision``).
        self.decision_points = decision_points
        self.wait_decision = wait_decision
        self._decision_value: Optional[float] = None
        if decision_points is not None and log.rows:
            self._decision_value = decision_points.value(log.rows[-1])
        replay = getattr(stop, "_ftnb_replay", None)
        if replay is not None:  # a stopper (ftnb.stopper) learns the trial's earlier results
            replay(context.trial_id, list(log.rows))

    # -- report --------------------------------------------------------------------------------
    def report(self, metrics: Any, checkpoint: Optional[Checkpoint] = None) -> None:
        if not isinstance(metrics, Mapping):
            raise UsageError(
                f"report(metrics=...) needs a dict of metric names to values; got "
                f"{type(metrics).__name__}: {metrics!r}. Fix: report({{'loss': loss}})."
            )
        try:
            values = encode_metrics(dict(metrics))
        except TypeError as exc:
            raise UsageError(str(exc)) from None
        clash = [k for k in values if k in AUTO_KEYS or k == NONFINITE_KEY]
        if clash:
            raise UsageError(
                f"report() got the metric {clash[0]!r}, which ftnb fills in itself. "
                f"Fix: rename it (e.g. 'my_{clash[0]}'). Reserved names: {', '.join(AUTO_KEYS)}."
            )
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise UsageError(
                f"report(checkpoint=...) needs an ftnb.Checkpoint; got {type(checkpoint).__name__}."
                " Fix: checkpoint=ftnb.Checkpoint.from_directory(folder)."
            )
        attr = self.checkpoint_score_attribute
        if checkpoint is not None and attr and metric_value(values, attr, _MISSING) is _MISSING:
            reported = ", ".join(sorted(flatten_row(values))) or "none"
            raise UsageError(
                f"CheckpointConfig(checkpoint_score_attribute={attr!r}) but this report with a "
                f"checkpoint has no {attr!r} metric (it has: {reported})."
                f" Fix: report {attr!r} together with every checkpoint, or change "
                "checkpoint_score_attribute."
            )

        self.iteration += 1
        if self.group is not None and self.group.rank != 0:
            # Only rank 0 persists; the others go on once it has, and end where it ends.
            end = self.group.decision(self.iteration)
            if end is not None:
                raise _ENDS[end]()
            return
        now = time.time()
        row = dict(values)
        row.update(
            training_iteration=self.iteration,
            trial_id=self.context.trial_id,
            time_this_iter_s=now - self.last_report,
            time_total_s=self.time_offset + (now - self.started),
            timestamp=now,
            attempt=self.context.attempt,
        )
        self.last_report = now
        if checkpoint is not None:
            self._check_fence(force=True)
            row["checkpoint_dir_name"] = self._persist_checkpoint(checkpoint, row)
        self._check_fence(force=checkpoint is not None)
        try:
            # Whole, or a StorageFault raised here in the trial with nothing of the row left.
            waiting_out_faults(lambda: self.log.append(row, durable=checkpoint is not None),
                               self.storage_wait_s, f"report({self.iteration})")
        except OSError:
            if checkpoint is not None:  # a checkpoint no row names is debris: free its space
                try:
                    self.storage.remove(self.paths.checkpoint(row["checkpoint_dir_name"]),
                                        recursive=True)
                except OSError:
                    pass
            raise
        decision = None
        # Whether the trial ends here anyway (its stop criterion): then it does not wait for a
        # decision (Ray asks no scheduler then), so a driver killed meanwhile never leaves it
        # waiting at its last report, to be resumed past its stop criterion.
        try:
            end = self._decide_end(row, checkpoint is not None)
        except BaseException:
            self.send("result", row)  # (persisted: the controller hears of it before the error)
            raise
        points = self.decision_points
        if points is not None and self.wait_decision is not None:
            previous, self._decision_value = self._decision_value, points.value(row)
            if end is None and points.reached(previous, row):
                # A scheduler's decision point: the trial ends exactly here if it says so.
                self.send("decision_point", row)
                decision = self.wait_decision(self.iteration)
            else:
                self.send("result", row)
        else:
            self.send("result", row)
        if end is None and decision in ("stop", "pause"):
            end = _StopRequested()
        if self.group is not None:
            self.group.publish(self.iteration, _end_name(end) if end is not None else None)
        if end is not None:
            raise end

    def _check_fence(self, force: bool) -> None:
        """Nothing is written once another driver owns the experiment (see ftnb.storage.lease)."""
        if self.fence is None:
            return
        from .storage.lease import FencedError

        try:
            self.fence.check(force)
        except FencedError as exc:
            raise _Fenced(str(exc)) from None

    def _persist_checkpoint(self, checkpoint: Checkpoint, row: dict) -> str:
        from .storage import checkpoint_dir_name

        name = checkpoint_dir_name(self.next_checkpoint_index)
        self.next_checkpoint_index += 1
        dest = self.paths.checkpoint(name)
        marker = {
            "trial_id": self.context.trial_id,
            "training_iteration": row["training_iteration"],
            "time_total_s": row["time_total_s"],
            "attempt": self.context.attempt,
        }
        with checkpoint.as_directory() as local:
            waiting_out_faults(lambda: self.storage.persist_directory(local, dest, marker),
                               self.storage_wait_s, f"report({row['training_iteration']})")
        return name

    def _decide_end(self, row: dict, with_checkpoint: bool) -> Optional[_AttemptEnd]:
        """Whether the attempt ends at this report, and how (None: it goes on). Raises
        :class:`UsageError` for a metric or stop criterion the trainable does not report."""
        if self.metric_to_check is not None:
            metric, self.metric_to_check = self.metric_to_check, None
            _check_metric_reported(metric, row)
        if self.stop is not None:
            if not self._stop_keys_checked and isinstance(self.stop, Mapping):
                missing = [k for k in self.stop if metric_value(row, k, _MISSING) is _MISSING]
                if missing:
                    reported = ", ".join(sorted(flatten_row(row)))
                    raise UsageError(
                        f"RunConfig(stop=...) names {missing[0]!r}, which this trainable does not "
                        f"report (it reports: {reported}; nested metrics are named "
                        "'outer/inner', as in Ray Tune). Fix: use one of the "
                        "reported metrics in stop, or report it."
                    )
                self._stop_keys_checked = True
            if _stop_met(self.stop, self.context.trial_id, row):
                # A trial a Stopper ends is stopped, not finished (a threshold is its goal).
                return _StopRequested() if hasattr(self.stop, "stop_all") else _StopCriterionMet()
        if not self.stop_requested and self.poll_stop():
            self.stop_requested = True
        if self.stop_requested:
            return _StopRequested()
        if self.preempted and with_checkpoint:
            return _Preempted()
        return None

    def get_dataset_shard(self, name: str) -> Any:
        if name not in self.datasets:
            given = ", ".join(repr(k) for k in self.datasets) or "none"
            raise UsageError(
                f"get_dataset_shard({name!r}): no dataset of that name was given to the "
                f"trainer (given: {given}). Fix: TorchTrainer(..., datasets={{{name!r}: data}})."
            )
        if name not in self._shards:
            from .train.shards import shard_of

            ctx = self.context
            self._shards[name] = shard_of(self.datasets[name], ctx.world_rank, ctx.world_size,
                                          name=name)
        return self._shards[name]

    def get_checkpoint(self) -> Optional[Checkpoint]:
        if self.restore_checkpoint is None:
            return None
        path = self.paths.checkpoint(self.restore_checkpoint)
        return Checkpoint(path, self.storage.fs)


#: Ray Tune's switch, honoured the same way: set to 1, a trial may leave TuneConfig.metric out of
#: its first reports (a validation metric that only every N-th report carries).
LENIENT_METRIC_ENV = "TUNE_DISABLE_STRICT_METRIC_CHECKING"


def _check_metric_reported(metric: str, row: dict) -> None:
    """Raise a UsageError when ``metric`` (TuneConfig.metric) is not in the first report."""
    flat = flatten_row(row)
    if metric in row or metric in flat or os.environ.get(LENIENT_METRIC_ENV) == "1":
        return
    import difflib

    reported = sorted(k for k in flat if k not in AUTO_KEYS)
    close = difflib.get_close_matches(metric, reported, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UsageError(
        f"TuneConfig(metric={metric!r}) is not a metric this trainable reports; its first "
        f"report has: {', '.join(reported) or 'no metrics'}{hint}. Fix: run the experiment "
        "again (under a new name) with TuneConfig(metric=...) naming one of them, or report "
        f"{metric!r} in every result ({LENIENT_METRIC_ENV}=1 accepts one that only later "
        "reports carry, as in Ray Tune)."
    )


def _stop_met(stop: Any, trial_id: str, row: dict) -> bool:
    if callable(stop):
        return bool(stop(trial_id, row))
    for key, threshold in stop.items():
        value = metric_value(row, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= threshold:
            return True
    return False


_session: Optional[TrialSession] = None
# The session of an attempt run in a thread of a process that runs several (the in-process
# executor): it wins over the process-wide one in that thread.
_thread = threading.local()


def _current(fn: str) -> TrialSession:
    session = getattr(_thread, "session", None) or _session
    if session is None:
        raise RuntimeError(
            f"ftnb.{fn}() was called outside a trial. It only works inside a trainable run by "
            "ftnb.Tuner(...).fit(), ftnb.run(...) or %ftrun. Fix: call your function through "
            "Tuner(train_fn, param_space=...).fit() instead of calling it directly."
        )
    return session


def report(metrics: dict, *, checkpoint: Optional[Checkpoint] = None) -> None:
    """Record one result of the running trial, and optionally a checkpoint.

    Returns only once the result line (and the checkpoint, copied into the trial's
    ``checkpoint_NNNNNN/`` folder) is persisted: whatever dies afterwards, this report is kept.
    ftnb adds ``training_iteration``, ``trial_id``, ``time_total_s``, ``time_this_iter_s``,
    ``timestamp`` and ``attempt`` to every row.

    Example:
        >>> def train(config):  # doctest: +SKIP
        ...     for step in range(10):
        ...         ftnb.report({"loss": 1 / (step + 1)})
    """
    _current("report").report(metrics, checkpoint)


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint this attempt should resume from (the trial's latest persisted one), or
    None on a fresh start."""
    return _current("get_checkpoint").get_checkpoint()


def get_dataset_shard(name: str) -> Any:
    """This rank's share of the dataset ``name`` given to ``TorchTrainer(datasets=...)``: the
    shards of the group's ranks are disjoint, contiguous and together cover the dataset once
    (their sizes differ by at most one). A numpy array gives a view, a DataFrame an ``iloc``
    slice, a torch ``Dataset`` a ``Subset``, a list a list (see :mod:`ftnb.train.shards`).

    Example:
        >>> def train_loop(config):  # doctest: +SKIP
        ...     shard = ftnb.get_dataset_shard("train")
        ...     loader = torch.utils.data.DataLoader(shard, batch_size=32, drop_last=True)
    """
    return _current("get_dataset_shard").get_dataset_shard(name)


def get_context() -> TrialContext:
    """Facts about the running trial: ids, names, paths, attempt, and ``should_checkpoint``."""
    return _current("get_context").context


def _set_session(session: Optional[TrialSession], this_thread_only: bool = False) -> None:
    global _session
    if this_thread_only:
        _thread.session = session
    else:
        _session = session
