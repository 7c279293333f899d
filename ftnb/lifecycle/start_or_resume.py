"""Running an experiment by its name: start it, or resume it when it is stored. The one place
that decides, for every way an experiment is run by name: :func:`ftnb.run`, :func:`ftnb.launch`
(in the caller, to check, then in its detached supervisor), ``ftnb run``, ``ftnb resume`` and
``TorchTrainer.fit``.

The front door that builds the run (``ftnb.Tuner``) is given as an argument
(:class:`FrontDoor`): this package never imports it. :func:`ftnb.tuner.start_or_resume`
gives it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Protocol, TypeVar

from ..config import RunConfig, TuneConfig
from ..storage import ExperimentPaths, Storage, default_storage_path
from ..ui.resume_lines import resuming_line
from .stored import load_state

__all__ = ["FrontDoor", "NewRun", "start_or_resume"]

Run = TypeVar("Run")


class FrontDoor(Protocol[Run]):
    """What starting or resuming by name needs of the class that builds a run (``ftnb.Tuner``):
    it builds a new one, says whether a folder can be restored, and builds a restored one. The
    run it builds has a ``run_config`` (a :class:`~ftnb.RunConfig`)."""

    def __call__(self, trainable: Any, *, param_space: Any, tune_config: Any, run_config: Any,
                 resources_per_trial: Any) -> Run:
        """A run of a new experiment."""

    def can_restore(self, path: Any, storage_filesystem: Any = None) -> bool:
        """Whether ``path`` holds an experiment that can be restored."""

    def restore(self, path: Any, trainable: Any, **options: Any) -> Run:
        """A run that resumes the experiment at ``path``."""


class NewRun(Protocol):
    """What :func:`start_or_resume` sets on a new run: ``when_stored``, the run that resumes
    the experiment, for its ``fit()`` to carry out instead when it finds the experiment
    stored after all (:class:`~ftnb.lifecycle.plan_new.ExperimentExistsError`)."""

    when_stored: Optional[Callable[[], Any]]


def start_or_resume(
    front_door: FrontDoor[Run],
    trainable: Callable[[dict], Any],
    *,
    name: Optional[str],
    param_space: Optional[Mapping[str, Any]],
    storage_path: Optional[str],
    tune_config: Optional[TuneConfig],
    run_config: Optional[RunConfig],
    resources_per_trial: Any,
    takeover: bool = False,
    restart_errored: bool = False,
    allow_different_trainable: bool = False,
    caller: str,
    _again: bool = False,
) -> tuple[Run, Optional[str]]:
    """The run (built by ``front_door``) that starts experiment ``name`` or resumes it (then
    also the line that says so); ``ftnb.run`` fits it here, ``ftnb.launch`` in a detached
    supervisor. ``caller`` names the call in error messages.

    A new run resumes the experiment instead when, by the time it is fitted, the experiment
    is stored (:class:`NewRun`): two ``ftnb.run`` of one name started together, the first
    one done before the second one's ``fit()`` looked again, end as the second run of a
    finished experiment does. (While the first one runs, the second gets the lock error.)"""
    options = dict(name=name, param_space=param_space, storage_path=storage_path,
                   tune_config=tune_config, run_config=run_config,
                   resources_per_trial=resources_per_trial, takeover=takeover,
                   restart_errored=restart_errored,
                   allow_different_trainable=allow_different_trainable, caller=caller)
    rc = _run_config(name, storage_path, run_config, caller)
    if rc.name:
        storage = Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)
        paths = ExperimentPaths.of(storage, rc.name)
        if front_door.can_restore(paths.uri, rc.storage_filesystem):
            line = resuming_line(paths, load_state(paths))
            # A stop criterion given here replaces the stored one; none given keeps it.
            stop = {"stop": rc.stop} if rc.stop is not None else {}
            run = front_door.restore(
                paths.uri,
                trainable,
                resume_errored=not restart_errored,
                restart_errored=restart_errored,
                param_space=param_space,
                storage_filesystem=rc.storage_filesystem,
                takeover=takeover,
                verbose=rc.verbose,
                allow_different_trainable=allow_different_trainable,
                # A searcher given again (one holding code) goes on with the stored search.
                search_alg=tune_config.search_alg if tune_config is not None else None,
                # A scheduler given again must be the one it ran with (one of the user's class
                # is not stored); none given: the stored one, rebuilt.
                scheduler=tune_config.scheduler if tune_config is not None else None,
                **stop,
            )
            if rc.executor is not None:  # the executor asked for now wins over the stored one
                run.run_config = dataclasses.replace(run.run_config, executor=rc.executor)
            if rc.callbacks:  # never stored: given again with the same RunConfig
                run.run_config = dataclasses.replace(run.run_config, callbacks=rc.callbacks)
            run.resumes_by_name = caller  # type: ignore[attr-defined]
            # Its caller prints ``line``: the terminal table's own resume line would repeat it.
            run.resume_announced = True  # type: ignore[attr-defined]
            return run, line
    run = front_door(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=rc,
        resources_per_trial=resources_per_trial,
    )
    if rc.name and not _again:
        def resumed() -> Run:
            again, line = start_or_resume(front_door, trainable, _again=True,
                                          **options)  # type: ignore[arg-type]
            if line and again.run_config.verbose:  # type: ignore[attr-defined]
                print(line, flush=True)
            return again

        run.when_stored = resumed  # type: ignore[attr-defined]
    run.resumes_by_name = caller  # type: ignore[attr-defined]
    return run, None


def _run_config(name: Optional[str], storage_path: Optional[str],
                run_config: Optional[RunConfig], caller: str) -> RunConfig:
    """``run_config`` (checked) with ``name`` and ``storage_path``, when given, in it."""
    if name is not None and (not isinstance(name, str) or not name or "/" in name
                             or name in (".", "..")):
        raise ValueError(
            f"{caller}(name={name!r}) must be a non-empty folder name without '/'. Fix: pass "
            "name='my_sweep'; the experiment lives in <storage_path>/<name>."
        )
    if run_config is not None and not isinstance(run_config, RunConfig):
        raise TypeError(f"{caller}(run_config=...) must be an ftnb.RunConfig; got {run_config!r}.")
    rc = run_config or RunConfig()
    return dataclasses.replace(rc, name=name or rc.name,
                               storage_path=storage_path or rc.storage_path)
