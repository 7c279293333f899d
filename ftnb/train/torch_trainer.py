"""``TorchTrainer``: data-parallel training in a group of ranks that survives any rank's failure.

``train_loop_per_worker`` runs in ``ScalingConfig(num_workers=N)`` processes (ranks) joined in
one ``torch.distributed`` process group (gloo on CPUs, NCCL with ``use_gpu``), which ftnb
initialises before the loop runs. Any rank's failure (an exception, a CUDA OOM, SIGKILL, a hung
peer) ends the whole group; ftnb starts a new one from the latest checkpoint, up to
``FailureConfig(max_failures)``, counting one failure per group attempt. Every rank calls
``ftnb.report``; rank 0's metrics and checkpoint are persisted (the other ranks' checkpoints are
not), and a report returns on every rank once it is persisted.

A run is an experiment of one trial: it lives at ``<storage_path>/<name>``, and running the
same script again with the same ``RunConfig(storage_path, name)`` resumes it from its latest
checkpoint (Ray Train V2's job-driver fault tolerance): a driver that crashed or was interrupted
counts nothing against ``max_failures``. A ``TorchTrainer`` is also a trainable for
:class:`ftnb.Tuner`: each trial is a group (``param_space={"train_loop_config": {...}}``).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ..config import RunConfig, ScalingConfig, callable_name, signature_mismatch
from ..input_checks import keywords_after
from .searched_scaling import SCALING_KEY, experiment_scaling, space_entry, trial_scaling

if TYPE_CHECKING:
    from ..result import Result

__all__ = ["TorchConfig", "TorchTrainer", "TrainingFailedError"]

#: The file (``ExperimentPaths.trainer``, beside the experiment's state) that keeps the
#: trainer's code for ``TorchTrainer.restore(path)`` without ``train_loop_per_worker``: a
#: convenience, never needed to resume (the state itself holds no code).
TRAINER_FILE = "trainer.pkl"
_DATASETS = "datasets"
_LOOP_CONFIG = "train_loop_config"


class TrainingFailedError(RuntimeError):
    """The run ended ERRORED: a rank failed more often than ``FailureConfig(max_failures)``
    allows, or with an error retrying cannot fix. ``result`` is the run's
    :class:`~ftnb.Result` (metrics, checkpoints and ``error`` as they stand)."""

    def __init__(self, message: str, result: "Result") -> None:
        super().__init__(message)
        self.result = result


@dataclass
class TorchConfig:
    """The process group's settings (Ray Train's ``TorchConfig``): ``backend`` ("gloo" or
    "nccl"; default NCCL with GPUs, else gloo) and ``timeout_s`` (the collectives' timeout;
    default ``ScalingConfig.collective_timeout_s``)."""

    backend: Optional[str] = None
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(
                f"TorchConfig(backend={self.backend!r}) is not 'gloo' or 'nccl'. Fix: leave it "
                "out (NCCL with GPUs, gloo on CPUs) or name one of them."
            )
        if self.timeout_s is not None and not (isinstance(self.timeout_s, (int, float))
                                               and self.timeout_s > 0):
            raise ValueError(
                f"TorchConfig(timeout_s={self.timeout_s!r}) must be a number of seconds > 0."
            )


class WorkerLoop:
    """What every rank of a trial runs: the process group set up, the datasets handed to
    :func:`ftnb.get_dataset_shard`, then ``train_loop_per_worker(train_loop_config)``. Named
    after the loop, so an experiment records the user's function as its trainable."""

    def __init__(self, loop: Callable[..., Any], takes_config: bool, use_gpu: bool,
                 backend: Optional[str], timeout_s: float, local_mode: bool = False,
                 resume_from: Any = None, scaling: Optional[ScalingConfig] = None,
                 validation_config: Any = None) -> None:
        self.loop = loop
        #: The experiment's ScalingConfig; a trial's config may change its searchable fields.
        self.scaling = scaling or ScalingConfig()
        #: ``TorchTrainer(resume_from_checkpoint=...)``: get_checkpoint()'s answer while the
        #: trial has no checkpoint of its own.
        self.resume_from = resume_from
        #: ``TorchTrainer(validation_config=...)``: rank 0 validates the checkpoints reported
        #: with ``validation=True`` (:mod:`ftnb.train.validation`).
        self.validation_config = validation_config
        #: ``ScalingConfig(num_workers=0)``: the loop runs in the caller, with no process group.
        self.local_mode = local_mode
        self.takes_config = takes_config
        self.use_gpu = use_gpu
        self.backend = backend
        self.timeout_s = timeout_s
        self.__name__ = callable_name(loop)
        self.__qualname__ = getattr(loop, "__qualname__", self.__name__)
        self.__module__ = getattr(loop, "__module__", __name__)
        self.__doc__ = getattr(loop, "__doc__", None)

    def __call__(self, config: dict) -> None:
        from .. import session as session_mod

        session = session_mod.current_session("report")
        session.datasets = dict(config.get(_DATASETS) or {})
        session.given_checkpoint = self.resume_from
        if config.get(SCALING_KEY) is not None:
            try:
                trial_scaling(self.scaling, config[SCALING_KEY])
            except (TypeError, ValueError) as exc:  # a sampled value: this trial cannot run
                raise session_mod.UsageError(str(exc)) from None
        session.validation_config = self.validation_config
        if self.validation_config is not None and (session.group is None
                                                   or session.group.rank == 0):
            session.start_validations()  # those an earlier attempt left pending run again
        loop_config = config.get(_LOOP_CONFIG)
        loop_config = dict(loop_config) if loop_config is not None else {}
        group = False if self.local_mode else self._init_process_group(session)
        try:
            if self.takes_config:
                self.loop(loop_config)
            else:
                self.loop()
        finally:
            if group:
                import torch.distributed as dist

                try:
                    dist.destroy_process_group()
                except Exception:  # a peer is gone: the process ends anyway
                    pass

    # -- a Tuner searching the ScalingConfig: what the controller asks of each trial's config --
    def _trial_scaling(self, config: Any) -> Optional[ScalingConfig]:
        values = config.get(SCALING_KEY) if isinstance(config, Mapping) else None
        if not isinstance(values, Mapping):
            return None
        try:
            return trial_scaling(self.scaling, values)
        except (TypeError, ValueError):
            return None  # the trial's ranks refuse it, so that it ends ERRORED saying why

    def _ftnb_ranks_of(self, config: Any) -> Optional[int]:
        """The ranks of the trial with ``config``; None: the experiment's."""
        scaling = self._trial_scaling(config)
        return scaling.max_workers if scaling is not None else None

    def _ftnb_resources(self, config: Any) -> dict:
        """What each rank of the trial with ``config`` asks for (``ftnb.with_resources``'s
        function of the config)."""
        scaling = self._trial_scaling(config) or self.scaling
        return scaling.worker_resources().as_dict()

    def _init_process_group(self, session: Any) -> bool:
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return False
        ctx = session.context
        gpu = self.use_gpu and torch.cuda.is_available()
        backend = self.backend or ("nccl" if gpu else "gloo")
        if gpu:
            torch.cuda.set_device(0)  # each rank sees only its own GPU
        if session.group is not None:
            # a client of its own: ftnb's waits on the group's client would hold up torch's
            store = dist.PrefixStore("torch/", session.group.new_client())
        else:
            store = dist.HashStore()
        dist.init_process_group(
            backend, store=store, rank=ctx.world_rank, world_size=ctx.world_size,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )
        return True


def _check_loop(loop: Any) -> bool:
    """Whether ``train_loop_per_worker`` takes the config (else it takes nothing)."""
    if not callable(loop):
        raise TypeError(
            f"TorchTrainer(train_loop_per_worker=...) must be a function; got "
            f"{type(loop).__name__}: {loop!r}. Fix: define `def train_loop(config): ...` and "
            "pass `train_loop` (not `train_loop()`)."
        )
    if signature_mismatch(loop, ("config",)) is None:
        return True
    if signature_mismatch(loop, ()) is None:
        return False
    name = callable_name(loop)
    raise TypeError(
        f"TorchTrainer(train_loop_per_worker={name}) must take one argument (the "
        f"train_loop_config dict) or none: {signature_mismatch(loop, ('config',))}. Fix: define "
        f"it as `def {name if name.isidentifier() else 'train_loop'}(config): ...`."
    )


class TorchTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` ranks with
    ``torch.distributed`` set up, surviving any rank's failure (see the module docstring).

    Args:
        train_loop_per_worker: ``def train_loop(config)`` (or no argument), run by every rank.
            It calls :func:`ftnb.report` (every rank), :func:`ftnb.get_checkpoint` (the same
            latest checkpoint on every rank), :func:`ftnb.get_context` (ranks),
            :func:`ftnb.get_dataset_shard` and ``ftnb.torch.prepare_model`` /
            ``prepare_data_loader``. It travels to the ranks by value, so it may be defined in a
            notebook.
        train_loop_config: the dict passed to it.
        scaling_config: :class:`ftnb.ScalingConfig` (ranks, GPUs, resources, hang timeout).
        run_config: :class:`ftnb.RunConfig` (name, storage_path, failure and checkpoint config).
            Give it a ``name`` to resume the run by running the same code again.
        datasets: ``{name: data}``, each rank reading its shard with
            :func:`ftnb.get_dataset_shard`: torch map-style Datasets, numpy arrays, pandas
            DataFrames, lists, ``ftnb.put`` refs. They are shared with the ranks in memory
            (``ftnb.put``), never stored: a restore needs them again.
        torch_config: :class:`TorchConfig` (backend, collective timeout).
        resume_from_checkpoint: an :class:`ftnb.Checkpoint` (an earlier run's
            ``result.checkpoint``, or ``Checkpoint.from_directory(path)``) that
            :func:`ftnb.get_checkpoint` returns on every rank until the run has a checkpoint of
            its own (as in Ray Train): after a failure or a driver restart, the run's latest
            checkpoint wins. Its folder must exist; its location (never its files) is stored
            with the run, so a restore does not need it again.
        validation_config: :class:`~ftnb.ValidationConfig`: validates, in a process of its
            own, each checkpoint reported with ``report(..., validation=True)`` while training
            goes on (docs/checkpoint-uploads.md).

    Example:
        >>> def train_loop(config):  # doctest: +SKIP
        ...     model = ftnb.torch.prepare_model(torch.nn.Linear(4, 1))
        ...     for epoch in range(config["epochs"]):
        ...         ...
        ...         ftnb.report({"loss": loss}, checkpoint=checkpoint)
        >>> result = ftnb.TorchTrainer(  # doctest: +SKIP
        ...     train_loop, train_loop_config={"epochs": 10},
        ...     scaling_config=ftnb.ScalingConfig(num_workers=2),
        ...     run_config=ftnb.RunConfig(name="ddp", failure_config=ftnb.FailureConfig(3)),
        ... ).fit()
    """

    #: How :class:`ftnb.Tuner` knows a trainer from a function.
    _ftnb_trainer = True

    @keywords_after("TorchTrainer", "train_loop_config")
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[Mapping[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Mapping[str, Any]] = None,
        torch_config: Optional[TorchConfig] = None,
        resume_from_checkpoint: Any = None,
        validation_config: Any = None,
    ) -> None:
        self._takes_config = _check_loop(train_loop_per_worker)
        if train_loop_config is not None and not isinstance(train_loop_config, Mapping):
            raise TypeError(
                f"TorchTrainer(train_loop_config=...) must be a dict; got "
                f"{type(train_loop_config).__name__}: {train_loop_config!r}. Fix: "
                "train_loop_config={'lr': 0.01}."
            )
        from ..input_checks import check_instance

        check_instance(scaling_config, ScalingConfig, "TorchTrainer(scaling_config=...)",
                       "scaling_config=ftnb.ScalingConfig(num_workers=2)")
        if scaling_config is not None and scaling_config.searched_fields():
            raise ValueError(
                f"TorchTrainer(scaling_config={scaling_config!r}) holds search domains, which "
                "only a Tuner samples. Fix: give the trainer plain values and search them in the"
                f" Tuner: Tuner(trainer, param_space={{'{SCALING_KEY}': ScalingConfig("
                "num_workers=ftnb.grid_search([1, 2]))}).")
        check_instance(run_config, RunConfig, "TorchTrainer(run_config=...)",
                       "run_config=ftnb.RunConfig(name='my_run')")
        check_instance(torch_config, TorchConfig, "TorchTrainer(torch_config=...)",
                       "torch_config=ftnb.TorchConfig(backend='gloo')")
        if validation_config is not None:
            from .validation import ValidationConfig

            check_instance(validation_config, ValidationConfig,
                           "TorchTrainer(validation_config=...)",
                           "validation_config=ftnb.ValidationConfig(fn=validate)")
        if datasets is not None:
            if not isinstance(datasets, Mapping) or not all(isinstance(k, str) and k
                                                            for k in datasets):
                raise TypeError(
                    f"TorchTrainer(datasets=...) must be a dict of names to datasets; got "
                    f"{type(datasets).__name__}. Fix: datasets={{'train': train_data}}."
                )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = dict(train_loop_config) if train_loop_config else {}
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.datasets = dict(datasets) if datasets else {}
        self.torch_config = torch_config or TorchConfig()
        check_resume_checkpoint(resume_from_checkpoint)
        self.resume_from_checkpoint = resume_from_checkpoint
        self.validation_config = validation_config

    @property
    def __name__(self) -> str:  # the experiment records the loop's name as its trainable
        return callable_name(self.train_loop_per_worker)

    # -- what a Tuner runs -----------------------------------------------------------------------
    def worker_loop(self) -> WorkerLoop:
        """The trainable each rank runs."""
        timeout = self.torch_config.timeout_s or self.scaling_config.collective_timeout_s
        return WorkerLoop(self.train_loop_per_worker, self._takes_config,
                          self.scaling_config.use_gpu, self.torch_config.backend, timeout,
                          local_mode=self.scaling_config.local_mode,
                          resume_from=self.resume_from_checkpoint, scaling=self.scaling_config,
                          validation_config=self.validation_config)

    def param_space(self, given: Optional[Mapping[str, Any]] = None) -> dict:
        """The search space of a Tuner over this trainer: ``given`` (its ``train_loop_config``
        keys win over the trainer's own, as in Ray), with the datasets under ``datasets``."""
        given = dict(given or {})
        unknown = [k for k in given if k not in (_LOOP_CONFIG, _DATASETS, SCALING_KEY)]
        if unknown:
            raise ValueError(
                f"Tuner(TorchTrainer, param_space=...) has the key {unknown[0]!r}: a trainer's "
                f"space holds only {_LOOP_CONFIG!r}, {SCALING_KEY!r} and {_DATASETS!r}. Fix: "
                f"param_space={{'{_LOOP_CONFIG}': {{'{unknown[0]}': ...}}}}."
            )
        loop_config = dict(self.train_loop_config)
        extra = given.get(_LOOP_CONFIG) or {}
        if not isinstance(extra, Mapping):
            raise TypeError(
                f"param_space['{_LOOP_CONFIG}'] must be a dict; got {extra!r}."
            )
        loop_config.update(extra)
        space: dict = {_LOOP_CONFIG: loop_config}
        datasets = dict(self.datasets)
        datasets.update(given.get(_DATASETS) or {})
        if datasets:
            space[_DATASETS] = datasets
        if given.get(SCALING_KEY) is not None:
            space[SCALING_KEY] = space_entry(given[SCALING_KEY])
        return space

    def for_space(self, given: Optional[Mapping[str, Any]]) -> "TorchTrainer":
        """This trainer as a Tuner with the space ``given`` runs it: a
        ``given["scaling_config"]`` takes the place of its own ScalingConfig (its searched
        fields at what must fit: :func:`~ftnb.train.searched_scaling.experiment_scaling`)."""
        if not isinstance(given, Mapping) or given.get(SCALING_KEY) is None:
            return self
        import copy

        trainer = copy.copy(self)
        trainer.scaling_config = experiment_scaling(given[SCALING_KEY])
        return trainer

    # -- running ---------------------------------------------------------------------------------
    def fit(self) -> "Result":
        """Run (or, when ``RunConfig(name)`` names a stored run, resume) the training to its
        end and return its :class:`~ftnb.Result`. Raises :class:`TrainingFailedError` when it
        ended ERRORED, KeyboardInterrupt (after printing the line that resumes it) on Ctrl+C."""
        from ..tuner import start_or_resume

        rc = self.run_config
        tuner, resuming = start_or_resume(
            self, name=rc.name, param_space=None, storage_path=rc.storage_path,
            tune_config=None, run_config=rc, resources_per_trial=None,
            caller="TorchTrainer.fit")
        if resuming and rc.verbose:
            print(resuming, flush=True)
        return _single_result(tuner.fit())

    @classmethod
    def can_restore(cls, path: Any, storage_filesystem: Any = None) -> bool:
        """Whether ``path`` holds a run that :meth:`restore` can resume."""
        from ..lifecycle.stored import can_restore

        return can_restore(path, storage_filesystem)

    @classmethod
    def restore(
        cls,
        path: Any,
        train_loop_per_worker: Optional[Callable[..., Any]] = None,
        train_loop_config: Optional[Mapping[str, Any]] = None,
        *,
        datasets: Optional[Mapping[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        storage_filesystem: Any = None,
    ) -> "TorchTrainer":
        """The trainer of the run stored at ``path``, to resume with ``.fit()`` from its latest
        checkpoint. ``datasets`` must be given again when the run had any (they are never
        stored); ``train_loop_per_worker`` and ``train_loop_config`` default to the run's own
        (kept in ``trainer.pkl`` beside its state; pass them if that file is gone or its code
        moved). The run keeps its name, storage, failure and checkpoint settings."""
        from ..lifecycle.stored import RestoreError, load_state
        from ..storage import ExperimentPaths

        paths = ExperimentPaths.at(os.fspath(path) if hasattr(path, "__fspath__") else str(path),
                                   storage_filesystem)
        state = load_state(paths)
        saved = _load_trainer(paths, needed=train_loop_per_worker is None)
        loop = train_loop_per_worker or saved["loop"]
        stored_space = state.param_space if isinstance(state.param_space, dict) else {}
        names = sorted((stored_space.get(_DATASETS) or {}))
        given = dict(datasets or {})
        missing = [n for n in names if n not in given]
        if missing:
            shown = ", ".join(f"{n!r}: ..." for n in names)
            raise RestoreError(
                f"TorchTrainer.restore({paths.uri!r}) needs the datasets "
                f"{', '.join(repr(n) for n in missing)} again: the run was given datasets "
                f"{', '.join(repr(n) for n in names)}, which are never stored with it. Fix: "
                f"TorchTrainer.restore(path, datasets={{{shown}}})."
            )
        unknown = [n for n in given if n not in names]
        if unknown:
            raise RestoreError(
                f"TorchTrainer.restore(datasets=...) has {unknown[0]!r}, which the run at "
                f"{paths.uri} was not given (it had: {', '.join(map(repr, names)) or 'none'}). "
                "Fix: give the same datasets as the original run."
            )
        if train_loop_config is None:  # the run's own, as its state has it
            train_loop_config = stored_space.get(_LOOP_CONFIG) or saved.get(_LOOP_CONFIG) or {}
        stored = trainer_from_settings(loop, state.settings)
        scaling = scaling_config or saved.get("scaling_config") or stored.scaling_config
        run_config = RunConfig(name=paths.name, storage_path=paths.parent_uri,
                               storage_filesystem=storage_filesystem)
        trainer = cls(loop, train_loop_config=train_loop_config, scaling_config=scaling,
                      run_config=run_config, datasets=given or None,
                      torch_config=saved.get("torch_config") or stored.torch_config)
        # (as stored, not checked again: the run's own checkpoint wins once it has one)
        trainer.resume_from_checkpoint = stored.resume_from_checkpoint
        return trainer


def group_space(space: Optional[Mapping[str, Any]],
                plain: bool = False) -> Optional[Mapping[str, Any]]:
    """A search space as a TorchTrainer's: ``{"train_loop_config": space}``, unless it is one
    already (it has the key ``train_loop_config`` or ``datasets``; ``plain=True``: the space of
    a plain function, always wrapped). None stays None."""
    if space is None:
        return None
    if not plain and any(key in space for key in (_LOOP_CONFIG, _DATASETS)):
        return space
    return {_LOOP_CONFIG: dict(space)}


def trainer_from_settings(loop: Callable[..., Any], settings: Mapping[str, Any]) -> TorchTrainer:
    """The trainer a run was started with (its ``settings``, as stored), around ``loop``."""
    stored = settings.get("trainer") or {}
    resources = dict(settings.get("resources_per_trial") or {})
    use_gpu = bool(stored.get("use_gpu"))
    if not use_gpu:
        resources.pop("gpu", None)
    elastic = settings.get("elastic") or {}
    ranks: Any = int(settings.get("num_workers") or 1)
    if elastic:
        ranks = (ranks, int(elastic["max_workers"]))
    scaling = ScalingConfig(
        num_workers=0 if stored.get("local_mode") else ranks,
        elastic_resize_monitor_interval_s=float(elastic.get("resize_interval_s") or 60.0),
        use_gpu=use_gpu,
        resources_per_worker=resources or None,
        collective_timeout_s=float(settings.get("collective_timeout_s")
                                   or ScalingConfig.collective_timeout_s),
    )
    trainer = TorchTrainer(loop, scaling_config=scaling,
                           torch_config=TorchConfig(backend=stored.get("backend")))
    given = stored.get(RESUME_KEY)
    if isinstance(given, str):  # a location, never code
        from ..checkpoint import Checkpoint

        trainer.resume_from_checkpoint = Checkpoint(given)
    return trainer


#: The key of ``settings["trainer"]`` that keeps ``resume_from_checkpoint``'s location.
RESUME_KEY = "resume_from_checkpoint"


def check_resume_checkpoint(checkpoint: Any) -> None:
    """Raise a clear error, before any work starts, unless ``checkpoint`` (the argument
    ``resume_from_checkpoint``) is None or an :class:`ftnb.Checkpoint` whose folder exists."""
    from ..checkpoint import Checkpoint
    from ..input_checks import short_repr

    if checkpoint is None:
        return
    fix = ("Fix: resume_from_checkpoint=ftnb.Checkpoint.from_directory('/path/to/folder'), "
           "or an earlier run's result.checkpoint.")
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            f"TorchTrainer(resume_from_checkpoint=...) must be an ftnb.Checkpoint; got "
            f"{type(checkpoint).__name__}: {short_repr(checkpoint)}. {fix}")
    from ..storage import Storage

    try:
        there = Storage(checkpoint.path, checkpoint.filesystem).isdir(checkpoint.path)
    except Exception as exc:  # unreachable remote storage: say so now, not in every rank
        raise ValueError(
            f"TorchTrainer(resume_from_checkpoint={checkpoint!r}): its folder could not be "
            f"read ({type(exc).__name__}: {exc}). {fix}") from None
    if not there:
        raise ValueError(
            f"TorchTrainer(resume_from_checkpoint={checkpoint!r}): no such folder. {fix}")


def trainer_pickle(trainer: TorchTrainer) -> Optional[bytes]:
    """The trainer's code and settings, cloudpickled, for ``trainer.pkl`` (None when they do not
    pickle: then only a restore that passes ``train_loop_per_worker`` works)."""
    from ..objects.cell_source import dumps

    try:
        return dumps({
            "loop": trainer.train_loop_per_worker,
            "train_loop_config": trainer.train_loop_config,
            "scaling_config": trainer.scaling_config,
            "torch_config": trainer.torch_config,
        })
    except Exception:
        return None


def _load_trainer(paths: Any, needed: bool) -> dict:
    from ..lifecycle.stored import RestoreError

    try:
        import cloudpickle

        return cloudpickle.loads(paths.storage.read_bytes(paths.trainer))
    except Exception as exc:
        if not needed:
            return {}
        raise RestoreError(
            f"TorchTrainer.restore({paths.uri!r}) could not load the run's training loop from "
            f"{TRAINER_FILE} ({type(exc).__name__}: {exc}). Fix: pass it again: "
            "TorchTrainer.restore(path, train_loop_per_worker=train_loop, datasets=...)."
        ) from None


def _single_result(grid: Any) -> "Result":
    result = grid[0]
    if result.error is not None:
        raise TrainingFailedError(
            f"Training failed: {result.error}. Its results and checkpoints are kept at "
            f"{result.path}; fix the cause and run it again with the same name to resume from "
            "its latest checkpoint.", result)
    return result
