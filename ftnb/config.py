"""Configuration objects, with Ray Tune's names and defaults.

Every class validates its arguments when it is built, so a bad value is reported before any
trial starts and before anything is written to storage.
"""

from __future__ import annotations

import datetime
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from .storage.result_log import metric_value  # noqa: F401  (re-exported: its old home)
from .train.scaling import DEFAULT_COLLECTIVE_TIMEOUT_S, ScalingConfig  # noqa: F401  (tuner reads it here)
from .train.scaling import is_real_number as _is_number

__all__ = [
    "CheckpointConfig",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
    "TuneConfig",
]

StopCriterion = Union[Mapping[str, float], Callable[[str, dict], bool], None]


def signature_mismatch(fn: Any, args: tuple[str, ...]) -> Optional[str]:
    """Why calling ``fn`` with the positional arguments named ``args`` would fail, e.g.
    ``"its signature is () (too many positional arguments)"``; None when the call binds, or when
    ``fn`` has no signature to inspect (some builtins): then only calling it can tell."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*args)
    except TypeError as exc:
        return f"its signature is {sig} ({exc})"
    return None


def callable_name(fn: Any) -> str:
    """A function's ``__name__``, else its type's (a callable object, a functools.partial)."""
    return getattr(fn, "__name__", None) or type(fn).__name__


@dataclass
class FailureConfig:
    """How trial failures are handled.

    Args:
        max_failures: retries per trial. 0 means a trial is ERRORED at its first failure, N means
            up to N retries (N + 1 attempts), -1 means retry forever. Preemptions (SIGTERM) and
            interruptions of the driver never count.
        fail_fast: stop the whole experiment as soon as one trial is ERRORED. Running trials are
            killed at once (no further result, as in Ray) and PAUSED with their checkpoints;
            the experiment can be restored later.
            ``"raise"`` (Ray Tune's): the same, and ``Tuner.fit()`` then raises the trial's error
            (an :class:`ftnb.TrialError` that is also an instance of the trial's exception class
            when that is a built-in one, so ``except ValueError`` works as with Ray).
        stop_on_repeated_error: when two consecutive attempts of a trial fail with the same
            exception type and message at the same ``training_iteration``, the failure is
            deterministic and retrying will not fix it: the trial is ERRORED at once. Set to False
            to keep retrying up to ``max_failures`` anyway.
        preemption_grace_period_s: after a trial process receives SIGTERM it has this long to
            report a checkpoint (``get_context().should_checkpoint`` turns True) before it is
            killed. It is then restarted from its latest checkpoint.
        hang_timeout_s: off by default (None). A number of seconds: an attempt that has not
            reported for that long (counted from its start, then from its latest report) is
            taken for hung: it is killed and fails with kind ``hang``, retried from its latest
            checkpoint like any failure (counted against ``max_failures``). Set it above the
            longest time between two reports, start-up and restoring a checkpoint included.
        storage_wait_s: off by default (None): a write that the storage refuses (a full disk,
            a quota, a read-only filesystem, a permission denied, an I/O error) stops the
            experiment at once, INTERRUPTED and resumable. A number of seconds: writers (a
            trial in ``report()``, the driver saving its state) wait up to that long for the
            storage to take the write again, retrying with backoff (0.5 s doubling to 30 s) and
            saying so on stderr, so that freeing space meanwhile loses nothing and stops
            nothing; past it, the experiment stops as without it.

    Example:
        >>> FailureConfig(max_failures=3)
        FailureConfig(max_failures=3, fail_fast=False, stop_on_repeated_error=True, preemption_grace_period_s=30.0, hang_timeout_s=None, storage_wait_s=None)
    """

    max_failures: int = 0
    fail_fast: Union[bool, str] = False
    stop_on_repeated_error: bool = True
    preemption_grace_period_s: float = 30.0
    hang_timeout_s: Optional[float] = None
    storage_wait_s: Optional[float] = None

    def __post_init__(self) -> None:
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int):
            raise TypeError(
                f"FailureConfig(max_failures=...) must be an int; got "
                f"{type(self.max_failures).__name__}: {self.max_failures!r}. "
                "Fix: use 0 for no retries, N for up to N retries, -1 for unlimited."
            )
        if self.max_failures < -1:
            raise ValueError(
                f"FailureConfig(max_failures={self.max_failures}) is invalid. "
                "Fix: use 0 for no retries, N > 0 for up to N retries, or -1 for unlimited."
            )
        if not isinstance(self.fail_fast, bool) and self.fail_fast != "raise":
            raise TypeError(
                f"FailureConfig(fail_fast=...) must be True, False or \"raise\"; got "
                f"{self.fail_fast!r}."
            )
        if not _is_number(self.preemption_grace_period_s) or self.preemption_grace_period_s < 0:
            raise ValueError(
                "FailureConfig(preemption_grace_period_s=...) must be a number of seconds >= 0; "
                f"got {self.preemption_grace_period_s!r}."
            )
        if self.storage_wait_s is not None and (
                not _is_number(self.storage_wait_s) or not self.storage_wait_s > 0):
            raise ValueError(
                "FailureConfig(storage_wait_s=...) must be None (a storage fault stops the "
                f"experiment at once) or a number of seconds > 0; got {self.storage_wait_s!r}. "
                "Fix: storage_wait_s=600 waits up to 10 minutes for space to be freed.")
        if self.hang_timeout_s is not None and (
                not _is_number(self.hang_timeout_s) or not self.hang_timeout_s > 0
                or self.hang_timeout_s == float("inf")):
            raise ValueError(
                f"FailureConfig(hang_timeout_s={self.hang_timeout_s!r}) is invalid. Fix: a "
                "number of seconds > 0 (longer than the longest time between two reports), or "
                "None to never take a silent trial for hung."
            )

    def allows_retry(self, failures_so_far: int) -> bool:
        """Whether a trial that has failed ``failures_so_far`` times may be started again."""
        return self.max_failures == -1 or failures_so_far <= self.max_failures


@dataclass
class CheckpointConfig:
    """Which checkpoints to keep on storage.

    Args:
        num_to_keep: keep at most this many checkpoints per trial (None keeps all). The others are
            deleted from storage: the worst by ``checkpoint_score_attribute`` when one is set, the
            oldest otherwise. The latest checkpoint is never deleted: resuming needs it.
        checkpoint_score_attribute: a metric reported together with each checkpoint, used to rank
            checkpoints for retention and ``Result.best_checkpoints`` (``"outer/inner"`` names a
            nested metric).
        checkpoint_score_order: "max" (higher is better) or "min".
        checkpoint_frequency, checkpoint_at_end: for a class trainable (:class:`ftnb.Trainable`):
            save a checkpoint every ``checkpoint_frequency`` iterations (0: never by count), and
            at its end (``step()`` returned ``done``, a ``stop={...}`` threshold was reached, or
            it was asked to stop). A function trainable checkpoints itself; for it these are
            errors, as in Ray Tune.

    Example:
        >>> CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc")
        CheckpointConfig(num_to_keep=2, checkpoint_score_attribute='acc', checkpoint_score_order='max', checkpoint_frequency=0, checkpoint_at_end=None)
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (
            isinstance(self.num_to_keep, bool)
            or not isinstance(self.num_to_keep, int)
            or self.num_to_keep < 1
        ):
            raise ValueError(
                f"CheckpointConfig(num_to_keep={self.num_to_keep!r}) is invalid. "
                "Fix: pass a whole number >= 1, or None to keep every checkpoint."
            )
        if self.checkpoint_score_attribute is not None and (
            not isinstance(self.checkpoint_score_attribute, str)
            or not self.checkpoint_score_attribute
        ):
            raise TypeError(
                "CheckpointConfig(checkpoint_score_attribute=...) must be the name of a reported "
                f"metric; got {self.checkpoint_score_attribute!r}."
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                f"CheckpointConfig(checkpoint_score_order={self.checkpoint_score_order!r}) is "
                'invalid. Fix: use "max" (higher is better) or "min".'
            )
        if (isinstance(self.checkpoint_frequency, bool)
                or not isinstance(self.checkpoint_frequency, int) or self.checkpoint_frequency < 0):
            raise ValueError(
                f"CheckpointConfig(checkpoint_frequency={self.checkpoint_frequency!r}) is invalid."
                " Fix: a whole number of iterations >= 0 (0: no periodic checkpoints)."
            )
        if self.checkpoint_at_end not in (None, True, False):
            raise TypeError(f"CheckpointConfig(checkpoint_at_end=...) must be True, False or "
                            f"None; got {self.checkpoint_at_end!r}.")


@dataclass
class TuneConfig:
    """How many trials to run and how to rank them.

    Args:
        num_samples: how many times the whole grid is repeated (each repetition draws new values
            for the random domains); with a ``search_alg``, how many trials it makes. -1: no
            limit, trials are made as they can start until ``time_budget_s``, a stopper's
            ``stop_all`` or a stop request ends the experiment (as in Ray Tune).
        max_concurrent_trials: at most this many trials run at once (None: as many as the
            machine's CPUs and GPUs allow for ``resources_per_trial``).
        metric, mode: the default metric and direction ("max"/"min") for
            ``ResultGrid.get_best_result`` and the status table. ``mode`` without ``metric`` is
            an error; ``metric`` without ``mode`` is accepted, as in Ray Tune, with a warning
            (``get_best_result`` will then need ``mode=``). Every trial must report ``metric``
            from its first report on, as Ray Tune requires: a trial whose first report lacks it
            is ERRORED at once, naming the metrics it does report (set
            ``TUNE_DISABLE_STRICT_METRIC_CHECKING=1``, Ray's switch, for a metric that only
            later reports carry).
        seed: makes the random draws of the search space reproducible.
        trial_name_creator, trial_dirname_creator: functions of a trial (``trial.trial_id``,
            ``trial.config``, ``trial.trainable_name``, ``trial.experiment_tag``) returning its
            name (``get_context().get_trial_name()``, the records) and the name of its folder in
            the experiment directory (a plain folder name, unique in the experiment), as in Ray
            Tune. Called once per trial when the experiment starts (with a ``search_alg``: when
            the trial is made); their names are recorded, so a restore needs neither.
        time_budget_s: stop the whole experiment once it ran this long (seconds or a
            ``datetime.timedelta``), as ``ftnb.stopper.TimeoutStopper`` does: running trials
            stop at their next report, pending ones never start, all TERMINATED with the note
            "stopped by TimeoutStopper". Time spent before a crash and a restore counts.
        search_alg: a search algorithm (an :class:`ftnb.search.Searcher`:
            :class:`~ftnb.search.optuna.OptunaSearch`, :class:`~ftnb.search.ConcurrencyLimiter`,
            :class:`~ftnb.search.BasicVariantGenerator`, your own) that suggests each trial's
            config when the trial can start, knowing the results before. Its state is kept as
            JSON in the experiment's folder, in step with the trials (docs/search.md).
        scheduler: a trial scheduler (:mod:`ftnb.schedulers`: ``ASHAScheduler``,
            ``HyperBandScheduler``, ``MedianStoppingRule``, ``FIFOScheduler``, your own
            ``TrialScheduler``) that stops or pauses trials from their results; None runs every
            trial to its end, in order. It takes ``metric`` and ``mode`` from here when it was
            given none. Its state is JSON in the experiment state; a restore rebuilds ftnb's
            schedulers from it (docs/schedulers.md).
        reuse_actors: accepted for Ray Tune's scripts (a bool) and changes nothing: every trial
            attempt gets a fresh process forked from a warm fork server (imports already paid),
            which costs milliseconds, so no ``Trainable.reset_config`` is ever needed and no state
            leaks from one trial into the next (docs: "Coming from Ray Tune").
    """

    num_samples: int = 1
    max_concurrent_trials: Optional[int] = None
    metric: Optional[str] = None
    mode: Optional[str] = None
    seed: Optional[int] = None
    time_budget_s: Optional[float] = None
    trial_name_creator: Optional[Callable[[Any], str]] = None
    trial_dirname_creator: Optional[Callable[[Any], str]] = None
    search_alg: Any = None
    scheduler: Any = None
    reuse_actors: Optional[bool] = False

    def __post_init__(self) -> None:
        if self.reuse_actors is not None and not isinstance(self.reuse_actors, bool):
            raise TypeError(f"TuneConfig(reuse_actors={self.reuse_actors!r}) must be True or "
                            "False (ftnb starts each trial in a fresh process either way).")
        if (
            isinstance(self.num_samples, bool)
            or not isinstance(self.num_samples, int)
            or (self.num_samples < 1 and self.num_samples != -1)
        ):
            raise ValueError(
                f"TuneConfig(num_samples={self.num_samples!r}) is invalid. "
                "Fix: pass a whole number >= 1 (how many times the search space is sampled), "
                "or -1 to sample until time_budget_s or a stopper ends the experiment."
            )
        if self.search_alg is not None:
            from .search.searcher import Searcher

            if not isinstance(self.search_alg, Searcher):
                raise TypeError(
                    f"TuneConfig(search_alg={self.search_alg!r}) must be an ftnb.search.Searcher "
                    "(OptunaSearch, ConcurrencyLimiter, BasicVariantGenerator, or a subclass of "
                    "your own). Fix: e.g. from ftnb.search.optuna import OptunaSearch; "
                    "TuneConfig(search_alg=OptunaSearch())."
                )
        if self.scheduler is not None:
            from .schedulers import check_scheduler

            check_scheduler(self.scheduler, self.metric, self.mode)
        if self.max_concurrent_trials is not None and (
            isinstance(self.max_concurrent_trials, bool)
            or not isinstance(self.max_concurrent_trials, int)
            or self.max_concurrent_trials < 1
        ):
            raise ValueError(
                f"TuneConfig(max_concurrent_trials={self.max_concurrent_trials!r}) is invalid. "
                "Fix: pass a whole number >= 1, or None to fill the machine."
            )
        if self.mode not in (None, "max", "min"):
            raise ValueError(
                f'TuneConfig(mode={self.mode!r}) is invalid. Fix: use "max", "min" or None.'
            )
        if self.metric is not None and not isinstance(self.metric, str):
            raise TypeError(
                f"TuneConfig(metric=...) must be a metric name (str); got {self.metric!r}."
            )
        if self.mode is not None and not self.metric:
            raise ValueError(
                f"TuneConfig(mode={self.mode!r}) was given without a metric: mode says whether "
                "a higher or lower value of the metric is better. Fix: TuneConfig(metric='loss', "
                f"mode={self.mode!r}), naming a metric your trainable reports, or leave mode out."
            )
        if self.metric is not None and self.mode is None:
            warnings.warn(
                f"TuneConfig(metric={self.metric!r}) has no mode, so nothing can be ranked by "
                f"it (get_best_result() will need mode=...). Fix: TuneConfig(metric="
                f"{self.metric!r}, mode='min') (or 'max').",
                UserWarning,
                stacklevel=3,  # the caller of TuneConfig(...), past the generated __init__
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"TuneConfig(seed=...) must be an int or None; got {self.seed!r}.")
        for argument in ("trial_name_creator", "trial_dirname_creator"):
            creator = getattr(self, argument)
            if creator is not None and (not callable(creator)
                                        or signature_mismatch(creator, ("trial",))):
                shown = callable_name(creator) if callable(creator) else repr(creator)[:60]
                raise TypeError(
                    f"TuneConfig({argument}={shown}) must be a function of a trial "
                    f"returning a str. Fix: {argument}=lambda trial: f\"trial_{{trial.trial_id}}\"."
                )
        if isinstance(self.time_budget_s, datetime.timedelta):
            self.time_budget_s = self.time_budget_s.total_seconds()
        if self.time_budget_s is not None and (
                not _is_number(self.time_budget_s) or not self.time_budget_s > 0):
            raise ValueError(
                f"TuneConfig(time_budget_s={self.time_budget_s!r}) is invalid. Fix: a number of "
                "seconds > 0 (or a datetime.timedelta), or None for no limit."
            )


_VERBOSITY = (0, 1, 2)


@dataclass
class RunConfig:
    """Where an experiment lives and how it runs.

    Args:
        name: the experiment's folder under ``storage_path``. Default: the trainable's name and
            the current time, e.g. ``train_fn_2026-11-22_10-31-07``.
        storage_path: a local path or any fsspec URL (``s3://bucket/prefix``, ``gs://...``).
            Default: ``~/ftnb_results``, or the ``FTNB_STORAGE_PATH`` environment variable.
        storage_filesystem: an fsspec filesystem to use instead of the one ``storage_path``'s
            protocol gives (e.g. ``s3fs.S3FileSystem(endpoint_url=...)``). It must be picklable:
            trial processes write their results and checkpoints through it.
        failure_config: see :class:`FailureConfig`.
        checkpoint_config: see :class:`CheckpointConfig`.
        stop: when a trial is done. A dict of metric thresholds (the trial stops once a reported
            value reaches any of them, e.g. ``{"training_iteration": 10}``; a nested metric is
            named ``"outer/inner"``, as Ray Tune flattens results), a function
            ``(trial_id, result) -> bool``, or a stopper (:mod:`ftnb.stopper`). Thresholds and
            functions are evaluated inside the trial process right after a report is persisted,
            so a trial never runs an iteration past its criterion; a function must therefore be
            picklable and must not rely on state in the caller (a :class:`ftnb.Stopper`
            subclass runs in the driver and may).
        verbose: 0 silent, 1 a live status table and the trials' output prefixed with their id,
            2 also every reported result.
        callbacks: :class:`ftnb.Callback` objects (Ray Tune's hooks: ``on_trial_result``,
            ``on_checkpoint``, ...), run in the driver; one that raises is logged and the
            experiment goes on. Not saved with the experiment: give them again to resume it
            (``ftnb.run`` with the same ``RunConfig`` does).
        executor: where trials run: ``"local"`` (processes on this machine, the default),
            ``"ray"`` (actors on a Ray cluster: ``pip install 'ftnb[ray]'``, the cluster at
            ``RAY_ADDRESS``), or an executor object such as
            ``ftnb.execution.ray.RayExecutor(address, shared_storage=True)``. Default: the
            ``FTNB_EXECUTOR`` environment variable, else ``"local"``.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Any = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    stop: StopCriterion = None
    verbose: int = 1
    executor: Any = None
    callbacks: Optional[list] = None

    def __post_init__(self) -> None:
        if self.callbacks is not None:
            if not isinstance(self.callbacks, (list, tuple)) or not all(
                    hasattr(cb, "on_trial_result") for cb in self.callbacks):
                raise TypeError(
                    f"RunConfig(callbacks={self.callbacks!r}) must be a list of ftnb.Callback "
                    "objects. Fix: RunConfig(callbacks=[MyCallback()]).")
            self.callbacks = list(self.callbacks)
        if self.executor is not None and not isinstance(self.executor, str) and not (
                hasattr(self.executor, "start") and hasattr(self.executor, "poll")):
            raise TypeError(
                f"RunConfig(executor={self.executor!r}) must be an executor's name ('local', "
                "'ray') or an executor object. Fix: RunConfig(executor='ray')."
            )
        if self.name is not None:
            _validate_name(self.name)
        if self.storage_path is not None and not isinstance(self.storage_path, (str,)):
            import os

            if isinstance(self.storage_path, os.PathLike):
                self.storage_path = os.fspath(self.storage_path)
            else:
                raise TypeError(
                    "RunConfig(storage_path=...) must be a local path or an fsspec URL string; "
                    f"got {type(self.storage_path).__name__}: {self.storage_path!r}."
                )
        problem = storage_path_problem(self.storage_path) if self.storage_path else ""
        if problem:
            raise ValueError(f"RunConfig(storage_path=...) {problem}")
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        elif not isinstance(self.failure_config, FailureConfig):
            raise TypeError(
                "RunConfig(failure_config=...) must be an ftnb.FailureConfig; got "
                f"{self.failure_config!r}. Fix: RunConfig(failure_config=FailureConfig(max_failures=3))."
            )
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        elif not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError(
                "RunConfig(checkpoint_config=...) must be an ftnb.CheckpointConfig; got "
                f"{self.checkpoint_config!r}."
            )
        _validate_stop(self.stop)
        if self.verbose not in _VERBOSITY:
            raise ValueError(
                f"RunConfig(verbose={self.verbose!r}) is invalid. Fix: use 0 (silent), "
                "1 (status table and trial output) or 2 (also every result)."
            )


def _validate_name(name: Any) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"RunConfig(name={name!r}) is invalid. Fix: pass a non-empty folder name such as "
            '"sweep1".'
        )
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(
            f"RunConfig(name={name!r}) must be a single folder name, not a path. Fix: put the "
            "parent folders in storage_path and keep name a plain name."
        )
    problem = name_length_problem(name)
    if problem:
        raise ValueError(f"RunConfig(name={name[:20]!r}...) {problem}")


def name_length_problem(name: str) -> str:
    """Why the experiment name ``name`` is too long for the files named after it ("is too long
    (300 characters): ... Fix: a shorter name, such as 'sweep'."), or "" when it fits."""
    from .storage.experiment_index import entry_file_name
    from .storage.file_names import NAME_MAX_BYTES, TEMPORARY_FILE_EXTRA_BYTES

    # The longest file named after the experiment is its listing entry's temporary file,
    # ``.ftnb-index/.<quoted name>.json.<12 hex>.tmp``; an ASCII name of letters, digits, "-",
    # "_" and "." is quoted as itself.
    def longest(name: str) -> int:
        return max(len(entry_file_name(name)) + TEMPORARY_FILE_EXTRA_BYTES, len(name.encode()))

    if longest(name) <= NAME_MAX_BYTES:
        return ""
    limit = NAME_MAX_BYTES - TEMPORARY_FILE_EXTRA_BYTES - len(".json")
    shorter = name[:40]
    while longest(shorter) > NAME_MAX_BYTES:
        shorter = shorter[:-1]
    return (
        f"is too long ({len(name)} characters): ftnb names files after the experiment, the "
        f"longest of them would have a {longest(name)}-byte name, and a file name can have at "
        f"most {NAME_MAX_BYTES} bytes. A name can have up to {limit} letters, digits, '-', '_' "
        f"or '.' (other characters count 3 to 12 each). Fix: a shorter name, such as "
        f"{shorter!r}."
    )


def storage_path_problem(path: str) -> str:
    """Why the local ``path`` cannot hold experiments (a folder name longer than a file name can
    be), or "" (fsspec URLs are left to their store)."""
    if "://" in path:
        return ""
    from .storage.file_names import NAME_MAX_BYTES

    for part in path.split("/"):
        if len(part.encode()) > NAME_MAX_BYTES:
            return (
                f"has a folder name {len(part.encode())} bytes long ({part[:20]!r}...); no file "
                f"or folder name can be longer than {NAME_MAX_BYTES} bytes. Fix: a storage path "
                "with shorter folder names."
            )
    return ""


def _validate_stop(stop: Any) -> None:
    if stop is None:
        return
    if callable(stop):
        problem = signature_mismatch(stop, ("trial_id", "result"))
        if problem:
            name = callable_name(stop)
            raise TypeError(
                f"RunConfig(stop={name}) cannot be called as {name}(trial_id, result): "
                f"{problem}. Fix: define it as `def "
                f"{name if name.isidentifier() else 'stop'}(trial_id, result): ...`, returning "
                "True when the trial should stop."
            )
        return
    if not isinstance(stop, Mapping):
        raise TypeError(
            f"RunConfig(stop=...) must be a dict of metric thresholds or a function "
            f"(trial_id, result) -> bool; got {type(stop).__name__}: {stop!r}. "
            'Fix: stop={"training_iteration": 10}.'
        )
    for key, value in stop.items():
        if not isinstance(key, str):
            raise TypeError(f"RunConfig(stop=...) keys must be metric names; got {key!r}.")
        if not isinstance(value, numbers.Real) or (isinstance(value, float) and math.isnan(value)):
            raise TypeError(
                f"RunConfig(stop={{{key!r}: {value!r}}}): thresholds must be numbers or "
                f'booleans. Fix: stop={{"{key}": 10}} or stop={{"done": True}}.'
            )
