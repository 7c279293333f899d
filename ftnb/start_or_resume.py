"""Running an experiment by its name: start it, or resume it when it is stored. The one place
that decides, for every way an experiment is run by name: :func:`ftnb.run`, :func:`ftnb.launch`
(in the caller, to check, then in its detached supervisor), ``ftnb run`` and ``ftnb resume``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

from .config import RunConfig, TuneConfig
from .restore import load_state
from .storage import ExperimentPaths, Storage, default_storage_path
from .tuner import Tuner
from .ui.resume_lines import resuming_line

__all__ = ["start_or_resume"]


def start_or_resume(
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
) -> tuple[Tuner, Optional[str]]:
    """The Tuner that starts experiment ``name`` or resumes it (then also the line that says
    so); ``ftnb.run`` fits it here, ``ftnb.launch`` in a detached supervisor. ``caller`` names
    the call in error messages."""
    if name is not None and (not isinstance(name, str) or not name or "/" in name
                             or name in (".", "..")):
        raise ValueError(
            f"{caller}(name={name!r}) must be a non-empty folder name without '/'. Fix: pass "
            "name='my_sweep'; the experiment lives in <storage_path>/<name>."
        )
    if run_config is not None and not isinstance(run_config, RunConfig):
        raise TypeError(f"{caller}(run_config=...) must be an ftnb.RunConfig; got {run_config!r}.")
    rc = run_config or RunConfig()
    rc = dataclasses.replace(rc, name=name or rc.name,
                             storage_path=storage_path or rc.storage_path)
    if rc.name:
        storage = Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)
        paths = ExperimentPaths.of(storage, rc.name)
        if Tuner.can_restore(paths.uri, rc.storage_filesystem):
            line = resuming_line(paths, load_state(paths))
            # A stop criterion given here replaces the stored one; none given keeps it.
            stop = {"stop": rc.stop} if rc.stop is not None else {}
            tuner = Tuner.restore(
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
                tuner.run_config = dataclasses.replace(tuner.run_config, executor=rc.executor)
            if rc.callbacks:  # never stored: given again with the same RunConfig
                tuner.run_config = dataclasses.replace(tuner.run_config, callbacks=rc.callbacks)
            return tuner, line
    tuner = Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=rc,
        resources_per_trial=resources_per_trial,
    )
    return tuner, None
