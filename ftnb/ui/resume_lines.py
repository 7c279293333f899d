"""The line that resumes an interrupted experiment, worded for where it is read
(:class:`ResumeContext`: a Python prompt, an IPython shell with the ``%ft`` magics, a terminal).
One wording for every reader. Part of the read model (:mod:`ftnb.ui.read_model`).
"""

from __future__ import annotations

import copy
import enum
import shlex
import sys
from typing import Optional

from ..core.records import ExperimentState
from ..storage import ExperimentPaths, default_storage_path
from ..wording import ftnb_command
from .location import same_storage_path

__all__ = ["ResumeContext", "ftnb_magics_loaded", "resume_line", "resuming_line",
           "tuner_restore_line"]


class ResumeContext(str, enum.Enum):
    """Where a resume line is read: it must be one that works there."""

    PYTHON = "python"  # a script, or a notebook without the %ft magics
    MAGICS = "magics"  # an IPython shell with %load_ext ftnb done
    TERMINAL = "terminal"  # a shell (the ftnb command)


def resume_line(paths: ExperimentPaths, state: ExperimentState,
                context: Optional[ResumeContext] = None, takeover: bool = False) -> str:
    """The one line that resumes the experiment (once it is interrupted), for ``context``
    (default: MAGICS in an IPython shell with the ``%ft`` magics loaded, else PYTHON).

    * Started by ``ftnb run`` (its origin says ``"via": "cli"``): ``ftnb resume NAME``, which
      imports the recorded trainable and space again, from any shell.
    * Launched with ``%ftrun`` or :func:`ftnb.launch` (the state records the names it was
      launched with): ``%ftresume NAME`` with the magics; elsewhere the Python line
      ``ftnb.attach(PATH).resume(TRAINABLE, param_space=SPACE)`` with the recorded names.
    * Run by ``Tuner.fit()``: ``ftnb.Tuner.restore(PATH, TRAINABLE).fit()`` (with
      ``param_space=param_space`` when its trials hold objects given again); in a terminal,
      where no function can be passed, a hint to do that or run the same ``ftnb.run`` again.

    NAME is the folder instead when it is not under the default storage path. ``takeover``:
    the line that takes it over from a silent driver and resumes it (``--takeover``,
    ``takeover=True``).
    """
    flag = " --takeover" if takeover else ""
    keyword = ", takeover=True" if takeover else ""
    origin = state.settings.get("origin")
    if isinstance(origin, dict) and origin.get("via") == "cli":
        return f"{ftnb_command()} resume {shlex.quote(_reference(paths, state))}{flag}"
    if context is None:
        context = ResumeContext.MAGICS if ftnb_magics_loaded() else ResumeContext.PYTHON
    if origin and context is ResumeContext.MAGICS:
        return f"%ftresume {_reference(paths, state)}{flag}"
    trainer = _trainer_restore(paths, state)
    if trainer is not None:  # a TorchTrainer's run whose datasets must be given again
        if origin or takeover:  # (TorchTrainer.restore has no takeover: the handle's does)
            return f"ftnb.attach({paths.uri!r}).resume({trainer}{keyword})"
        return f"{trainer}.fit()"
    if origin:
        trainable = origin.get("trainable") if isinstance(origin, dict) else None
        trainable = trainable or state.trainable.rsplit(".", 1)[-1]
        space = origin.get("param_space") if isinstance(origin, dict) else None
        with_space = f", param_space={space}" if space else ""
        return f"ftnb.attach({paths.uri!r}).resume({trainable}{with_space}{keyword})"
    if context is ResumeContext.TERMINAL:
        return (f"{tuner_restore_line(paths.uri, '<trainable>', takeover=takeover)}, or run "
                f"the same ftnb.run(...{keyword}) again")
    return tuner_restore_line(paths.uri, state.trainable, _holds_objects(state), takeover)


def resuming_line(paths: ExperimentPaths, state: ExperimentState) -> str:
    """The line that says an experiment is being resumed, with its trials' counts as its files
    tell them: each trial's own ``trial.json`` where it is newer than the state (a driver killed
    before it saved the state that records a trial's end; the restore merges them the same
    way). ``state`` is not changed."""
    from ..core.records import merge_trial_records

    merged = copy.copy(state)
    merged.trials = list(state.trials)  # (merging replaces records in the list)
    counts = merge_trial_records(merged, paths).counts()
    return (f"ftnb: resuming experiment {paths.name!r} at {paths.uri} "
            f"({counts.get('TERMINATED', 0)} of {len(merged.trials)} trials finished, "
            f"{counts.get('ERRORED', 0)} errored)")


def _trainer_restore(paths: ExperimentPaths, state: ExperimentState) -> Optional[str]:
    """``ftnb.TorchTrainer.restore(URI, datasets={...})`` for a TorchTrainer's run given
    datasets (they are never stored, and the trainer brings them back); None otherwise."""
    space = state.param_space if isinstance(state.param_space, dict) else {}
    names = sorted(space.get("datasets") or {}) if state.settings.get("trainer") else []
    if not names:
        return None
    given = ", ".join(f"{name!r}: {name if name.isidentifier() else 'data'}" for name in names)
    return f"ftnb.TorchTrainer.restore({paths.uri!r}, datasets={{{given}}})"


def tuner_restore_line(uri: str, trainable: str, with_space: bool = False,
                       takeover: bool = False) -> str:
    """``ftnb.Tuner.restore(URI, TRAINABLE).fit()``, with ``param_space=param_space`` when the
    space must be given again (its objects are not saved with the experiment), and
    ``takeover=True`` with ``takeover``."""
    space = ", param_space=param_space" if with_space else ""
    keyword = ", takeover=True" if takeover else ""
    return f"ftnb.Tuner.restore({uri!r}, {trainable}{space}{keyword}).fit()"


def run_again_line(caller: str) -> Optional[str]:
    """In a script (not a notebook or a shell): its own command line, to run again, with a
    comment that ``caller`` (``ftnb.run``) resumes the experiment by name; None elsewhere."""
    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) is None or "IPython" in sys.modules \
            or not getattr(sys, "orig_argv", None):
        return None
    return f"{shlex.join(sys.orig_argv)}   # the same command again: {caller} resumes it by name"


def _holds_objects(state: ExperimentState) -> bool:
    from ..objects import walk_placeholders

    return bool(walk_placeholders(state.param_space))


def _reference(paths: ExperimentPaths, state: ExperimentState) -> str:
    """The experiment's name where that finds it (under the default storage path), else its
    folder."""
    if same_storage_path(paths.parent_uri, default_storage_path()):
        return state.name
    return paths.uri


def ftnb_magics_loaded() -> bool:
    """Whether this process is an IPython shell where ``%ftresume`` works (``%load_ext ftnb``
    done). Never imports IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
        return shell is not None and "ftresume" in shell.magics_manager.magics["line"]
    except Exception:
        return False
