"""What a trainable calls: ``report``, ``get_checkpoint``, ``get_context``.

These functions work inside a trial process only. ``report`` persists the result line (and the
checkpoint) itself, from the trial's own process, before it returns: an acknowledged report is
on storage whatever dies afterwards, and the controller is only told about it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union

from .checkpoint import Checkpoint, CheckpointUploadMode
from .config import metric_value
from .core.records import encode_metrics
from .schedulers.stop_criterion import is_done, stop_met
from .storage import AUTO_KEYS, NONFINITE_KEY
from .storage.reported_checkpoints import ReportJob
from .storage.result_log import flatten_row
from .train.context import TrialContext
from .train.metric_checks import metric_missing_problem, metric_text_problem, stop_keys_problem

#: A metric that is not in a report (None is a value a trainable may report).
_MISSING = object()

if TYPE_CHECKING:
    from .storage import Storage, TrialPaths
    from .storage.result_log import ResultLog

__all__ = ["TrialContext", "get_checkpoint", "get_context", "get_dataset_shard", "report"]


class UsageError(Exception):
    """ftnb's API was called wrongly inside a trial. Such a failure is never retried."""


class AttemptEnd(BaseException):
    """Unwinds the trainable when the attempt must end (a BaseException, so that a trainable's
    ``except Exception`` does not swallow it)."""

    outcome = "finished"


class _StopCriterionMet(AttemptEnd):
    outcome = "finished"


class _StopRequested(AttemptEnd):
    outcome = "stopped"


class _Preempted(AttemptEnd):
    outcome = "preempted"


class Fenced(AttemptEnd):
    """Another driver owns the experiment: end at once, writing nothing more."""

    outcome = "fenced"


#: How rank 0 tells the other ranks of a group that the attempt ends at a report.
_ENDS: dict[str, type[AttemptEnd]] = {
    "stop_criterion": _StopCriterionMet,
    "stopped": _StopRequested,
    "preempted": _Preempted,
    "fenced": Fenced,
}


def _end_name(end: AttemptEnd) -> str:
    return next(name for name, cls in _ENDS.items() if type(end) is cls)


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
        ranked_metrics: tuple = (),
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
        #: ``(metric, who ranks by it)`` pairs: text values of these fail at any report.
        self.ranked_metrics = tuple(ranked_metrics)
        self.fence = fence
        #: The attempt's :class:`~ftnb.execution.rank_group.RankGroup` when it is a group.
        self.group = group
        #: ``TorchTrainer(datasets=...)``, resolved: :func:`get_dataset_shard` shards them.
        self.datasets: dict = {}
        self._shards: dict = {}
        #: ``TorchTrainer(resume_from_checkpoint=...)``: what :func:`get_checkpoint` returns
        #: while the trial has no checkpoint of its own (Ray Train's rule).
        self.given_checkpoint: Optional[Checkpoint] = None
        self.started = time.time()
        self.last_report = self.started
        self.preempted = False
        self.stop_requested = False
        self._stop_keys_checked = False
        #: The asynchronous reports' queue (:class:`~ftnb.storage.checkpoint_uploads.
        #: UploadQueue`), made by the first one.
        self._uploads: Any = None
        #: ``TorchTrainer(validation_config=...)`` (set by the rank's loop), and rank 0's
        #: :class:`~ftnb.train.validation.AttemptValidations`, made by :meth:`start_validations`.
        self.validation_config: Any = None
        self._validations: Any = None
        #: The checkpoint names the trial's rows use (set by the first report).
        self._checkpoint_names: Optional[set[str]] = None
        #: The scheduler's decision points (:class:`~ftnb.execution.contract.DecisionPoints`):
        #: the reports that wait for the controller's answer (``wait_decision``).
        self.decision_points = decision_points
        self.wait_decision = wait_decision
        self._decision_value: Optional[float] = None
        if decision_points is not None and log.rows:
            self._decision_value = decision_points.value(log.rows[-1])
        #: Called once as the attempt ends, with its outcome (``"finished"``, ``"stopped"``,
        #: ``"preempted"``..., None: it failed): what :func:`ftnb.air.integrations.mlflow.
        #: setup_mlflow` ends its run with. A hook that raises is said, never the attempt's end.
        self.end_hooks: list[Callable[[Optional[str]], None]] = []
        replay = getattr(stop, "_ftnb_replay", None)
        if replay is not None:  # a stopper (ftnb.stopper) learns the trial's earlier results
            replay(context.trial_id, list(log.rows))

    def run_end_hooks(self, outcome: Optional[str]) -> None:
        """Call each of :attr:`end_hooks` once with the attempt's ``outcome``."""
        hooks, self.end_hooks = self.end_hooks, []
        for hook in hooks:
            try:
                hook(outcome)
            except Exception as exc:
                print(f"ftnb: an end-of-attempt hook ({getattr(hook, '__qualname__', hook)}) "
                      f"failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    # -- report --------------------------------------------------------------------------------
    def report(self, metrics: Any, checkpoint: Optional[Checkpoint] = None,
               **options: Any) -> None:
        """See :func:`report`; ``options``: its checkpoint keywords (Ray Train's names)."""
        validation = options.get("validation")
        values = self._checked_metrics(metrics, checkpoint, validation)
        plan = self._checkpoint_plan(checkpoint, options)
        kwargs = self._validation_request(validation, values, checkpoint, self.group is None)
        self._catch_up()

        self.iteration += 1
        merged = self._group_checkpoint(plan) if self.group is not None else None
        if self.group is not None and self.group.rank != 0:
            if merged is not None and merged.merged and plan is not None:
                self._write_shard(plan, merged)  # its files, into the merged checkpoint
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
        job = ReportJob(self, row, plan, UsageError)
        if kwargs is not None:
            self._ask_validation(job, validation, values, merged or checkpoint, kwargs)
        if plan is not None or merged is not None:
            self._check_fence(force=True)
            name = merged.name if merged is not None else self._checkpoint_name(plan)
            row["checkpoint_dir_name"] = job.name = name
            if merged is not None and merged.merged:
                from .storage.checkpoint_uploads import shard_folder

                job.other_ranks = [r for r in merged.ranks if r != 0]
                job.shards = shard_folder(self.storage, self.paths.dir, name,
                                          self.paths.checkpoint(name))
        background = (plan is not None and plan.mode is CheckpointUploadMode.ASYNC) or (
            self._uploads is not None and not self._uploads.idle())
        if background and plan is not None and plan.mode is CheckpointUploadMode.ASYNC \
                and plan.local:
            from .storage.checkpoint_uploads import snapshot_folder

            job.snapshot = snapshot_folder(plan.checkpoint.path)
        # Whether the trial ends here anyway (its stop criterion): then it does not wait for a
        # decision (Ray asks no scheduler then), so a driver killed meanwhile never leaves it
        # waiting at its last report, to be resumed past its stop criterion.
        end: Optional[AttemptEnd] = None
        error: Optional[BaseException] = None
        try:
            end = self._decide_end(row, job.name is not None)
        except BaseException as exc:  # raised once the row is persisted (and sent)
            error = exc
        points = self.decision_points
        if error is None and points is not None and self.wait_decision is not None:
            previous, self._decision_value = self._decision_value, points.value(row)
            if end is None and points.reached(previous, row):
                # A scheduler's decision point: the trial ends exactly here if it says so.
                job.kind = "decision_point"
        if background:
            self._upload_queue().put(job, job.name is not None)  # waits while too many queued
            if error is not None or end is not None or job.kind == "decision_point":
                self._uploads.drain()  # the row must be persisted (and the answer known)
        else:
            job()
        if error is not None:
            raise error
        decision = self.wait_decision(self.iteration) if job.kind == "decision_point" else None
        if end is None and decision in ("stop", "pause"):
            end = _StopRequested()
        if self.group is not None:
            self.group.publish(self.iteration, _end_name(end) if end is not None else None)
        if end is not None:
            raise end

    def _validation_request(self, validation: Any, values: dict, checkpoint: Any,
                            known: bool) -> Optional[dict]:
        """``report(validation=...)`` checked (a UsageError before any work): the validation's
        keywords, or None. ``known``: whether the report's checkpoint is known (in a group,
        once merged from the ranks')."""
        if validation is None or validation is False:
            return None
        from .train.validation import validation_request

        try:
            return validation_request(validation, self.validation_config,
                                       checkpoint is not None if known else None, values)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def _catch_up(self) -> None:
        """Before a report: raise the error of an earlier asynchronous report's upload that
        failed; record the validations that ended meanwhile."""
        if self._uploads is not None:
            self._uploads.raise_error()
        if self._validations is not None:
            self._validations.record_finished()

    def _ask_validation(self, job: Any, validation: Any, values: dict, checkpoint: Any,
                        kwargs: dict) -> None:
        """Rank 0: the report's row records its validation as pending; the validation starts
        once the row is persisted (its checkpoint whole)."""
        self._validation_request(validation, values, checkpoint, True)
        job.row["validation"] = {"status": "pending", "fn_kwargs": kwargs}

        def submit(name: str) -> None:
            self.start_validations().runner.submit(name, kwargs)
        job.on_recorded = submit

    def start_validations(self) -> Any:
        """Rank 0's validations (made at the first use; ``TorchTrainer`` makes them when its
        loop starts, running again those an earlier attempt left pending)."""
        if self._validations is None:
            from .storage import AUTO_KEYS
            from .train.validation import AttemptValidations

            self._validations = AttemptValidations(self, self.validation_config, AUTO_KEYS)
            self._validations.resume()
        return self._validations

    def _checked_metrics(self, metrics: Any, checkpoint: Optional[Checkpoint],
                         validation: Any = None) -> dict:
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
        if checkpoint is not None and attr and metric_value(values, attr, _MISSING) is _MISSING \
                and not validation:  # a validated checkpoint may get it from its validation
            reported = ", ".join(sorted(flatten_row(values))) or "none"
            raise UsageError(
                f"CheckpointConfig(checkpoint_score_attribute={attr!r}) but this report with a "
                f"checkpoint has no {attr!r} metric (it has: {reported})."
                f" Fix: report {attr!r} together with every checkpoint, or change "
                "checkpoint_score_attribute."
            )
        return values

    def _checkpoint_plan(self, checkpoint: Optional[Checkpoint], options: dict) -> Any:
        """The report's checkpoint options, checked (a UsageError before any work)."""
        from .storage.reported_checkpoints import ReportOptionError, plan_checkpoint

        if self._checkpoint_names is None:
            self._checkpoint_names = {r["checkpoint_dir_name"] for r in self.log.rows
                                      if r.get("checkpoint_dir_name")}
        try:
            return plan_checkpoint(
                checkpoint, dir_name=options.get("checkpoint_dir_name"),
                mode=options.get("checkpoint_upload_mode"),
                delete_local=options.get("delete_local_checkpoint_after_upload"),
                upload_fn=options.get("checkpoint_upload_fn"), paths=self.paths,
                used_names=self._checkpoint_names)
        except ReportOptionError as exc:
            raise UsageError(str(exc)) from None

    def _group_checkpoint(self, plan: Any) -> Any:
        """In a group: this report's checkpoint, from every rank's (the same answer on every
        rank, see :mod:`~ftnb.storage.rank_checkpoints`), its name counted on every rank."""
        from .storage.rank_checkpoints import checkpoint_info, merged_checkpoint
        from .storage.reported_checkpoints import ReportOptionError

        assert self._checkpoint_names is not None
        try:
            infos = self.group.exchange(self.iteration, checkpoint_info(plan))
            merged = merged_checkpoint(infos, self.next_checkpoint_index, self._checkpoint_names)
        except ReportOptionError as exc:
            raise UsageError(str(exc)) from None
        if merged is not None:
            self.next_checkpoint_index += not any(infos[r]["dir_name"] for r in merged.ranks)
            self._checkpoint_names.add(merged.name)
        return merged

    def _write_shard(self, plan: Any, merged: Any) -> None:
        """A rank other than 0: write its files of the merged checkpoint."""
        from .storage.checkpoint_uploads import shard_folder, snapshot_folder
        from .storage.rank_checkpoints import ShardJob

        name = merged.name
        folder = shard_folder(self.storage, self.paths.dir, name, self.paths.checkpoint(name))
        job = ShardJob(self, plan, self.iteration, folder,
                       merged.duplicates.get(self.group.rank, []))
        if plan.mode is CheckpointUploadMode.ASYNC or not self._upload_queue().idle():
            if plan.mode is CheckpointUploadMode.ASYNC:
                job.snapshot = snapshot_folder(plan.checkpoint.path)
            self._upload_queue().put(job, True)
        else:
            job()

    def _checkpoint_name(self, plan: Any) -> str:
        from .storage import checkpoint_dir_name

        name = plan.dir_name
        if name is None:
            name = checkpoint_dir_name(self.next_checkpoint_index)
            self.next_checkpoint_index += 1
        assert self._checkpoint_names is not None
        self._checkpoint_names.add(name)
        return name

    def _upload_queue(self) -> Any:
        if self._uploads is None:
            from .storage.checkpoint_uploads import UploadQueue, max_checkpoints_in_flight

            self._uploads = UploadQueue(max_checkpoints_in_flight())
        return self._uploads

    def finish_uploads(self, quiet: bool = False) -> None:
        """Wait for the attempt's asynchronous checkpoints and their rows (the attempt's end);
        ``quiet``: an upload's error is not raised (the attempt fails for another reason)."""
        try:
            if self._uploads is not None:
                self._uploads.drain()
            if self._validations is not None:  # their rows are persisted: record them too
                self._validations.finish()
                if self._uploads is not None:
                    self._uploads.drain()
        except BaseException:
            if not quiet:
                raise

    def ask_checkpoint(self, metrics: dict, at_end: bool = False) -> bool:
        """Whether the driver's callbacks ask for a checkpoint with the report of ``metrics``
        about to be made, or (``at_end``) a driver-side stopper ends the trial with it (a class
        trainable asks: :mod:`ftnb.core.checkpoint_queries`)."""
        from .core.checkpoint_queries import AT_END, CHECKPOINT, CHECKPOINT_QUERY

        if self.wait_decision is None or self.group is not None:
            return False
        now, iteration = time.time(), self.iteration + 1
        self.send("decision_point", {
            **metrics, "training_iteration": iteration, "trial_id": self.context.trial_id,
            "time_this_iter_s": now - self.last_report,
            "time_total_s": self.time_offset + (now - self.started), "timestamp": now,
            "attempt": self.context.attempt, CHECKPOINT_QUERY: AT_END if at_end else True})
        return self.wait_decision(iteration) == CHECKPOINT

    def _check_fence(self, force: bool) -> None:
        """Nothing is written once another driver owns the experiment (see ftnb.storage.lease)."""
        if self.fence is None:
            return
        from .storage.lease import FencedError

        try:
            self.fence.check(force)
        except FencedError as exc:
            raise Fenced(str(exc)) from None

    def _decide_end(self, row: dict, with_checkpoint: bool) -> Optional[AttemptEnd]:
        """Whether the attempt ends at this report, and how (None: it goes on). Raises
        :class:`UsageError` for a metric or stop criterion the trainable does not report."""
        problems = [metric_text_problem(metric, ranker, row)
                    for metric, ranker in self.ranked_metrics]
        if self.metric_to_check is not None and "validation" not in row:
            # (a row that asks for a validation may get the metric from it: not checked)
            metric, self.metric_to_check = self.metric_to_check, None
            problems.append(metric_missing_problem(metric, row))
        stopped = False
        if self.stop is not None:
            if not self._stop_keys_checked:
                problems.append(stop_keys_problem(self.stop, row))
                self._stop_keys_checked = True
            stopped = stop_met(row, self.stop, self.context.trial_id)
        problem = next((p for p in problems if p), None)
        if problem:
            raise UsageError(problem)
        if is_done(row):  # Ray's reserved key: the trainable says it is finished
            return _StopCriterionMet()
        if stopped:
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
            return self.given_checkpoint
        path = self.paths.checkpoint(self.restore_checkpoint)
        return Checkpoint(path, self.storage.fs)


_session: Optional[TrialSession] = None
# The session of an attempt run in a thread of a process that runs several (the in-process
# executor): it wins over the process-wide one in that thread.
_thread = threading.local()


def current_session(fn: str) -> TrialSession:
    """The session of the attempt running here (this thread's, else the process's); raises a
    RuntimeError naming ``ftnb.<fn>()`` outside a trial."""
    session = getattr(_thread, "session", None) or _session
    if session is None:
        raise RuntimeError(
            f"ftnb.{fn}() was called outside a trial. It only works inside a trainable run by "
            "ftnb.Tuner(...).fit(), ftnb.run(...) or %ftrun. Fix: call your function through "
            "Tuner(train_fn, param_space=...).fit() instead of calling it directly."
        )
    return session


def report(metrics: dict, *, checkpoint: Optional[Checkpoint] = None,
           checkpoint_dir_name: Optional[str] = None,
           checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
           delete_local_checkpoint_after_upload: Optional[bool] = None,
           checkpoint_upload_fn: Optional[Callable[[Checkpoint, str], Checkpoint]] = None,
           validation: Any = False) -> None:
    """Record one result of the running trial, and optionally a checkpoint.

    Returns only once the result line (and the checkpoint, copied into the trial's
    ``checkpoint_NNNNNN/`` folder) is persisted: whatever dies afterwards, this report is kept.
    ftnb adds ``training_iteration``, ``trial_id``, ``time_total_s``, ``time_this_iter_s``,
    ``timestamp`` and ``attempt`` to every row.

    The checkpoint keywords are Ray Train's (README, "Checkpoints that never stall training"):
    ``checkpoint_dir_name`` (the folder's name in the trial's folder; default
    ``checkpoint_NNNNNN``), ``checkpoint_upload_mode`` (``SYNC``; ``ASYNC``: return once the
    folder is snapshotted, upload in the background, the row visible once the checkpoint is
    whole; ``NO_UPLOAD``: the folder already is in the trial's folder),
    ``delete_local_checkpoint_after_upload`` (default: True for ``ASYNC``) and
    ``checkpoint_upload_fn(checkpoint, dir_name) -> Checkpoint`` (writes the files itself).
    ``validation=True`` (or a ``ValidationTaskConfig``) validates the checkpoint with the
    trainer's ``ValidationConfig`` in a process of its own while training goes on; its
    metrics are merged into this report's row once known (docs/checkpoint-uploads.md).

    Example:
        >>> def train(config):  # doctest: +SKIP
        ...     for step in range(10):
        ...         ftnb.report({"loss": 1 / (step + 1)})
    """
    current_session("report").report(
        metrics, checkpoint, checkpoint_dir_name=checkpoint_dir_name,
        checkpoint_upload_mode=checkpoint_upload_mode,
        delete_local_checkpoint_after_upload=delete_local_checkpoint_after_upload,
        checkpoint_upload_fn=checkpoint_upload_fn, validation=validation)


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint this attempt should resume from (the trial's latest persisted one), or
    None on a fresh start (a TorchTrainer's ``resume_from_checkpoint`` when it was given one).
    """
    return current_session("get_checkpoint").get_checkpoint()


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
    return current_session("get_dataset_shard").get_dataset_shard(name)


def get_context() -> TrialContext:
    """Facts about the running trial: ids, names, paths, attempt, and ``should_checkpoint``."""
    return current_session("get_context").context


def set_session(session: Optional[TrialSession], this_thread_only: bool = False) -> None:
    """Make ``session`` the attempt's (None: no attempt runs), for the whole process or
    (``this_thread_only``: an attempt run in a thread) for this thread."""
    global _session
    if this_thread_only:
        _thread.session = session
    else:
        _session = session
