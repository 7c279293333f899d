"""``ftnb run`` and ``ftnb resume``: start or resume an experiment from a terminal.

Both take the options of ``%ftrun`` / ``%ftresume`` (one table, :mod:`ftnb.run_options`), with
the trainable and the space named as ``module:attr`` or ``path/file.py:attr``
(:mod:`ftnb.cli.references`). An experiment of the same name that exists is resumed, as
:func:`ftnb.run` and :func:`ftnb.launch` do.

By default the experiment runs in this process (the foreground), printing its progress; the
command ends with the experiment: exit 0 when it FINISHED, 1 when it ERRORED. Ctrl+C (or
SIGTERM) stops it cleanly as ``ftnb stop`` would (trials end at their next report, the state is
saved INTERRUPTED), prints the line that resumes it and exits 130; a second Ctrl+C stops at
once (the state is still saved). ``--detach`` leaves it to a detached supervisor
(:func:`ftnb.launch`) and returns at once; ``--launcher`` (or ``--launcher-command``) chooses
where that supervisor runs (:mod:`ftnb.launchers`) and implies ``--detach``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
from typing import Any, Iterator, Optional

from ..config import name_length_problem, storage_path_problem
from ..core.records import ExperimentStatus
from ..ui.failures import errored_trial_lines
from ..run_options import (
    CommandSpec,
    FrontEnd,
    Group,
    InputError,
    RunDefaults,
    is_trainer,
    launch_arguments,
    launcher_of,
    opt,
    resume_options,
    resumed_space,
    run_options,
    space_from,
)
from ..recorded_code import (
    CODE,
    TRUSTED_CODE_VARIABLE,
    RecordedFile,
    file_sha256,
    import_root,
    local_imports,
    record_of,
    recorded_file,
    recorded_imports,
    trusted_by_caller,
)
from ..wording import plural
from .exits import EXIT_ERRORED, EXIT_INTERRUPTED, EXIT_OK, CliError, one_line
from .references import (
    SPACE_FORMS,
    ReferenceNames,
    absolute_reference,
    is_code_reference,
    load_reference,
    reference_file,
)

__all__ = ["CLI", "RESUME", "RUN", "cmd_resume", "cmd_run", "exit_code_of"]

#: How the command line names things in the shared option tables.
CLI = FrontEnd(
    names="named as MODULE:NAME or FILE.py:NAME",
    space_forms=SPACE_FORMS,
    defaults={"storage_path": "$FTNB_STORAGE_PATH", "max_failures": "$FTNB_MAX_FAILURES",
              "concurrency": "$FTNB_CONCURRENCY", "verbose": "$FTNB_VERBOSE"},
    resume_default="the one `ftnb run` started it with",
)

_DETACH = opt("--detach", action="store_true",
              help="leave the experiment to a detached supervisor process and return at once "
                   "(`ftnb watch NAME`, `ftnb logs NAME`, `ftnb stop NAME` reach it later)")
_JSON = opt("--json", action="store_true",
            help="print one JSON object at the end (as `ftnb status --json`); the progress "
                 "goes to stderr")

RUN = CommandSpec(
    "run",
    """Start an experiment, or resume it when one of that name exists.

    ftnb run train.py:train --param-space space.py:space --name sweep1 --max-failures 3
    ftnb run mypkg.jobs:train -p '{"lr": {"grid_search": [0.1, 0.01]}}' -n sweep2 --detach
    ftnb run train.py:train -p space.py:space -n ddp --num-workers 2 --gpus-per-worker 1

    It runs here, printing its progress, until it ends; Ctrl+C stops it cleanly (resumable:
    `ftnb resume NAME`, or the same command again). With --detach it runs in a supervisor
    process of its own and the command returns at once. With --num-workers each trial is a
    group of ranks, each running train(config) in one torch.distributed process group.
    """,
    run_options(CLI, opt("trainable", metavar="TRAINABLE",
                         help="the function to run, train(config), or an ftnb.TorchTrainer: "
                              "MODULE:NAME or FILE.py:NAME")) + (
        Group("command line"),
        _DETACH,
        _JSON,
    ),
)

RESUME = CommandSpec(
    "resume",
    """Resume an interrupted experiment (errored trials too, from their latest checkpoint).

    ftnb resume sweep1
    ftnb resume sweep1 --trainable train.py:train_v2 --allow-different-trainable
    ftnb resume sweep1 --takeover

    The trainable and the space default to the references `ftnb run` started it with. It runs
    here until it ends (Ctrl+C stops it cleanly), or in a supervisor with --detach. While its
    driver is silent (`ftnb status` says so), --takeover resumes it at once.
    """,
    resume_options(CLI) + (
        Group("command line"),
        opt("--verbose", type=int, choices=(0, 1, 2),
            help="how much of its progress to print (default: $FTNB_VERBOSE, else 1)"),
        _DETACH,
        _JSON,
    ),
)


def exit_code_of(status: str) -> int:
    """The exit code of a command that waited for an experiment that ended ``status``."""
    if status == ExperimentStatus.FINISHED:
        return EXIT_OK
    if status == ExperimentStatus.ERRORED:
        return EXIT_ERRORED
    return EXIT_INTERRUPTED


# -- ftnb run -------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    """``ftnb run TRAINABLE [options]``."""
    if args.name is not None and ("/" in args.name or os.sep in args.name or not args.name
                                  or args.name in (".", "..")):
        raise CliError(f"ftnb run: --name {args.name!r} must be a folder name without '/'. "
                       "Fix: --name sweep1 (the experiment lives in STORAGE/NAME)")
    problem = args.name and name_length_problem(args.name)
    if problem:
        raise CliError(f"ftnb run: --name {args.name[:20]!r}... {problem}")
    problem = args.storage_path and storage_path_problem(args.storage_path)
    if problem:
        raise CliError(f"ftnb run: --storage {problem}")
    origin = {"via": "cli", "trainable": absolute_reference(args.trainable),
              "source": _source(args), "cwd": os.getcwd()}
    if args.param_space:
        origin["param_space"] = _recorded_space(args.param_space)
    origin[CODE] = _code_files(args.trainable, args.param_space)
    built = launch_arguments(args, _Names(), trainable=args.trainable,
                             param_space=args.param_space, space_forms=SPACE_FORMS,
                             defaults=RunDefaults.from_environment(), origin=origin)
    if args.detach or built.kwargs["launcher"] is not None:
        return _detached(built.trainable, built.kwargs, args.json, "ftnb run")
    return _foreground(built.trainable, built.kwargs, args.json)


def _source(args: argparse.Namespace) -> str:
    return "ftnb " + shlex.join(getattr(args, "argv", None) or sys.argv[1:])


def _code_files(trainable_ref: Optional[str], space_text: Optional[str]) -> dict:
    """What the experiment records of the files its references import: each one's path and
    sha256 (:mod:`ftnb.recorded_code`), taken before they are imported."""
    files = {}
    for role, ref in (("trainable", trainable_ref), ("param_space", space_text)):
        file = reference_file(ref) if ref and is_code_reference(ref) else None
        if file and os.path.isfile(file):
            files[role] = record_of(file, import_root(ref, file, None))
    return files


def _say_imported(role: str, ref: str, recorded_ref: Optional[str], origin: dict,
                  as_json: bool) -> None:
    """Before ``ftnb resume`` imports the reference ``ref``: say which file that runs (on
    stdout, stderr with ``--json``), and warn (stderr) when it is not the file, or not the
    content, the experiment recorded (``recorded_ref``: the reference its state names, when the
    command resumes with it)."""
    what = "trainable" if role == "trainable" else "search space"
    out = sys.stderr if as_json else sys.stdout
    file = reference_file(ref)
    trusted = trusted_by_caller()
    if trusted is not None:
        unchecked = [file] if not _is_trusted(file, trusted) else [
            path for path in local_imports(file, import_root(ref, file, None))  # type: ignore[arg-type]
            if not _is_trusted(path, trusted)]
        if unchecked:
            raise CliError(
                f"ftnb resume: its {what} {ref} imports {unchecked[0] or 'a file not found'}, "
                f"which is not one of the files checked before this command ran "
                f"(${TRUSTED_CODE_VARIABLE}), or not with the content checked: nothing "
                "imported. Fix: look at the experiment's state and its code, which may have "
                "changed meanwhile, then run ftnb resume by hand")
    if file is None:
        print(f"ftnb: resuming with the {what} {ref} (its file is found when it is imported)",
              file=out, flush=True)
        return
    print(f"ftnb: resuming with the {what} {ref}: importing {file}", file=out, flush=True)
    recorded = recorded_file(origin, role)
    if recorded is None:
        if recorded_ref is not None:
            print(f"ftnb: warning: the experiment recorded no hash of its {what}'s file (an "
                  f"older ftnb started it), so whether {file} changed since cannot be checked",
                  file=sys.stderr, flush=True)
        return
    if os.path.realpath(recorded.file) != os.path.realpath(file):
        if recorded_ref is not None:
            print(f"ftnb: warning: the experiment recorded its {what}'s file as "
                  f"{recorded.file}, but {ref} imports {file}. Fix: if you did not make that "
                  f"change, stop it (Ctrl+C, or ftnb stop) and check {file}", file=sys.stderr,
                  flush=True)
        return
    _warn_changed(recorded, what)
    known = {os.path.realpath(item.file): item for item in recorded_imports(origin, role)}
    for path in local_imports(file, import_root(ref, file, None)):
        item = known.get(os.path.realpath(path))
        if item is None:
            print(f"ftnb: warning: {file} imports {path}, of which the experiment recorded no "
                  f"hash, so whether it changed since cannot be checked", file=sys.stderr,
                  flush=True)
        else:
            _warn_changed(item, what)


def _warn_changed(recorded: RecordedFile, what: str) -> None:
    """Warn (stderr) when the recorded file's content is not the recorded one."""
    file = recorded.file
    try:
        now = file_sha256(file)
    except OSError:
        return  # importing it says why it cannot be read
    if now != recorded.sha256:
        print(f"ftnb: warning: {file} changed since the experiment recorded it (sha256 "
              f"{recorded.sha256[:12]}... then, {now[:12]}... now): it resumes with the "
              f"{what} as the file is now. Fix: if you did not make that change, stop it "
              f"(Ctrl+C, or ftnb stop) and check {file}", file=sys.stderr, flush=True)


def _is_trusted(file: Optional[str], trusted: list) -> bool:
    if file is None:
        return False
    try:
        now = file_sha256(file)
    except OSError:
        return False
    return any(os.path.realpath(t.file) == os.path.realpath(file) and t.sha256 == now
               for t in trusted)


def _recorded_space(text: str) -> str:
    """``--param-space`` as the experiment records it: files with absolute paths."""
    stripped = text.strip()
    if stripped.startswith("{"):
        return stripped
    if stripped.endswith(".json") and ":" not in stripped:
        return os.path.abspath(os.path.expanduser(stripped))
    return absolute_reference(stripped)


class _Names(ReferenceNames):
    """The command line's names, with an :class:`ftnb.TorchTrainer` taken as a trainable too
    (it is no function: ``ReferenceNames.trainable`` refuses it)."""

    def trainable(self, ref: str) -> Any:
        value = load_reference(ref, "TRAINABLE", "function")
        return value if is_trainer(value) else super().trainable(ref)


# -- ftnb resume ----------------------------------------------------------------------------------
def cmd_resume(args: argparse.Namespace) -> int:
    """``ftnb resume NAME_OR_PATH [options]``."""
    from ..config import RunConfig
    from ..core.records import ExperimentState, StateFormatError
    from .listing import find_experiment

    paths = find_experiment(args.target, args.storage_path)
    try:
        state = ExperimentState.load(paths)
    except StateFormatError as exc:
        raise CliError(one_line(str(exc))) from None
    recorded = state.settings.get("origin")
    recorded = dict(recorded) if isinstance(recorded, dict) else {}
    from_cli = recorded.get("via") == "cli"
    names = _Names()
    if from_cli and recorded.get("cwd") and recorded["cwd"] not in sys.path:
        sys.path.append(recorded["cwd"])  # its modules, when they are not found from here

    trainable_ref = args.trainable or (recorded.get("trainable") if from_cli else None)
    if not trainable_ref:
        how = ("%ftrun or ftnb.launch" if recorded else "a Python script (Tuner or ftnb.run)")
        raise CliError(
            f"ftnb resume {args.target}: it was started by {how}, so the command does not know "
            f"where its trainable ({state.trainable}) is. Fix: --trainable FILE.py:"
            f"{state.trainable} (or MODULE:{state.trainable})"
        )
    if not isinstance(trainable_ref, str):
        raise CliError(f"ftnb resume {args.target}: its state records the trainable as "
                       f"{trainable_ref!r}, which names no Python code. Fix: --trainable "
                       f"FILE.py:{state.trainable} (or MODULE:{state.trainable})")
    _say_imported("trainable", trainable_ref, None if args.trainable else trainable_ref,
                  recorded, args.json)
    trainable = names.trainable(trainable_ref)
    space_text = args.param_space or (recorded.get("param_space") if from_cli else None)
    if isinstance(space_text, str) and is_code_reference(space_text):
        _say_imported("param_space", space_text, None if args.param_space else space_text,
                      recorded, args.json)
    space = None
    if args.param_space:
        space = space_from(args.param_space, names, SPACE_FORMS)
    elif space_text:
        try:
            space = space_from(space_text, names, SPACE_FORMS)
        except InputError as exc:
            # The stored values resume it unless its trials hold objects; then restore says so.
            print(f"ftnb: note: the search space it was started with ({space_text}) cannot be "
                  f"loaded ({exc}); resuming with the values stored with it", file=sys.stderr)
    space = resumed_space(space, state.settings)
    filesystem = names.value(args.filesystem, "--filesystem") if args.filesystem else None
    # Its origin from now on: what this command resumed it with.
    origin = {"via": "cli", "trainable": absolute_reference(trainable_ref),
              "source": _source(args), "cwd": os.getcwd()}
    if space_text and space is not None:
        origin["param_space"] = _recorded_space(space_text)
    origin[CODE] = _code_files(trainable_ref, origin.get("param_space"))
    verbose = args.verbose if args.verbose is not None else RunDefaults.from_environment().verbose
    kwargs = dict(
        param_space=space, name=paths.name, storage_path=paths.parent_uri, tune_config=None,
        run_config=RunConfig(storage_filesystem=filesystem, verbose=verbose),
        resources_per_trial=None, origin=origin, restart_errored=args.restart_errored,
        allow_different_trainable=args.allow_different_trainable,
        launcher=launcher_of(args, None),
    )
    if args.takeover:
        _take_over(paths, args.json)
    if args.detach or kwargs["launcher"] is not None:
        return _detached(trainable, kwargs, args.json, "ftnb resume")
    return _foreground(trainable, kwargs, args.json, resume_only=True)


def _take_over(paths: Any, as_json: bool) -> None:
    """``--takeover``: take the experiment from its (silent) driver at once, before resuming."""
    from ..lifecycle.own import take_over_driver

    with _user_errors("ftnb resume --takeover"):
        said = take_over_driver(paths)
    if said:
        print(said, file=sys.stderr if as_json else sys.stdout, flush=True)


# -- running it -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _user_errors(what: str) -> Iterator[None]:
    """ftnb's one-line errors about the input (ValueError, TypeError, a live owner) as the
    command's usage errors; ``FTNB_DEBUG=1`` keeps their traceback."""
    from ..storage.lease import ExperimentLockedError

    try:
        yield
    except (ValueError, TypeError, ExperimentLockedError) as exc:
        if os.environ.get("FTNB_DEBUG"):
            raise
        message = one_line(str(exc)).removeprefix("ftnb: ")
        # The Python API's fix, in the words of this command.
        message = message.replace("allow_different_trainable=True", "--allow-different-trainable")
        raise CliError(f"{what}: {message}") from None


def _paths_of(kwargs: dict) -> Any:
    from ..storage import ExperimentPaths, Storage, default_storage_path

    storage = Storage(kwargs["storage_path"] or default_storage_path(),
                      kwargs["run_config"].storage_filesystem)
    return ExperimentPaths.of(storage, kwargs["name"])


def _foreground(trainable: Any, kwargs: dict, as_json: bool, resume_only: bool = False) -> int:
    from ..handle import ExperimentHandle, finished_experiment
    from ..storage.lease import live_lease
    from ..tuner import check_new_experiment, start_or_resume

    verb = "ftnb resume" if resume_only else "ftnb run"
    out = sys.stderr if as_json else sys.stdout
    rc = kwargs["run_config"]
    if kwargs["name"]:
        paths = _paths_of(kwargs)
        owner = live_lease(paths) if paths.has_state() else None
        if owner is not None:
            verdict = owner.verdict()
            if verdict.silent:
                raise CliError(
                    f"{verb}: experiment {paths.name!r} still has a driver (pid {owner.pid} on "
                    f"{owner.host}), silent: {verdict.why}. Fix: `ftnb resume {paths.name} "
                    "--takeover` takes it over now (or wait until it counts as dead)")
            raise CliError(
                f"{verb}: experiment {paths.name!r} is already running (pid {owner.pid} on "
                f"{owner.host}). Fix: `ftnb watch {paths.name}` follows it, `ftnb stop "
                f"{paths.name}` stops it; --detach attaches to it"
            )
        finished = finished_experiment(dataclasses.replace(
            rc, name=kwargs["name"], storage_path=kwargs["storage_path"]))
        if finished is not None:
            print(f"ftnb: experiment {paths.name!r} already finished; nothing to resume "
                  f"(`ftnb status {paths.name}` shows it).", file=out, flush=True)
            return _report_end(ExperimentHandle(paths), as_json, interrupted=False)
    with _user_errors(verb):
        tuner, resuming = start_or_resume(
            trainable, name=kwargs["name"], param_space=kwargs["param_space"],
            storage_path=kwargs["storage_path"], tune_config=kwargs["tune_config"],
            run_config=rc, resources_per_trial=kwargs["resources_per_trial"],
            restart_errored=kwargs["restart_errored"],
            allow_different_trainable=kwargs["allow_different_trainable"], caller=verb)
        if not resuming:
            # Checked here, where the error belongs, before the experiment's folder exists;
            # also names an experiment started without --name.
            name = check_new_experiment(tuner).name
            tuner.run_config = dataclasses.replace(tuner.run_config, name=name)
            kwargs = dict(kwargs, name=name)
    paths = tuner.restore_plan.paths if tuner.restore_plan is not None else _paths_of(kwargs)
    tuner.origin = kwargs["origin"]
    if resuming:
        print(resuming, file=out, flush=True)
    interrupted = said = False
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        with _StopOnSignal(paths) as stopper:
            try:
                tuner.fit()
            except KeyboardInterrupt as exc:
                # A second Ctrl+C: the controller saved the state, and said how to resume.
                from ..core.controller import RESUME_LINE_PRINTED

                interrupted, said = True, getattr(exc, RESUME_LINE_PRINTED, False)
        interrupted = interrupted or stopper.signalled is not None
    return _report_end(ExperimentHandle(paths), as_json, interrupted, resume_said=said)


def _report_end(handle: Any, as_json: bool, interrupted: bool, resume_said: bool = False) -> int:
    """Print how the experiment ended (or its JSON) and return the exit code."""
    from ..ui.read_model import ResumeContext, read_snapshot

    snap = read_snapshot(handle.paths, resume_context=ResumeContext.TERMINAL)
    state, status = snap.state, snap.status
    if as_json:
        from .output import print_json

        print_json(snap.experiment_json())
    else:
        counts = state.counts()
        print(f"ftnb: experiment {handle.name!r} {status}: {plural(len(state.trials), 'trial')}, "
              f"{counts.get('TERMINATED', 0)} terminated, {counts.get('ERRORED', 0)} errored "
              f"({handle.path})", flush=True)
        for line in errored_trial_lines(state.trials):
            print(line)
        if status == ExperimentStatus.INTERRUPTED and not resume_said:
            print(f"Resume it with: {snap.resume_line}", flush=True)
    return EXIT_INTERRUPTED if interrupted else exit_code_of(status)


def _detached(trainable: Any, kwargs: dict, as_json: bool, verb: str) -> int:
    import ftnb

    with _user_errors(f"{verb} --detach"):
        handle = ftnb.launch(trainable, quiet=as_json, **kwargs)
    if as_json:
        from ..ui.read_model import ResumeContext, read_snapshot, supervisor_record
        from .output import print_json

        snap = read_snapshot(handle.paths, resume_context=ResumeContext.TERMINAL)
        data = snap.experiment_json()
        data["supervisor"] = supervisor_record(handle.paths) or None
        print_json(data)
    else:
        print(f"ftnb: `ftnb watch {handle.name}` follows it, `ftnb logs {handle.name} "
              f"--follow` its log, `ftnb stop {handle.name}` stops it.")
    return EXIT_OK


class _StopOnSignal:
    """While the experiment runs here: the first Ctrl+C (or SIGTERM) asks its driver (this
    process) to stop cleanly through a control request, as ``ftnb stop`` would: the trials end
    at their next report, the state is saved INTERRUPTED, and ``fit()`` returns. A second one
    raises KeyboardInterrupt at once (the controller still saves the state)."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, paths: Any) -> None:
        self.paths = paths
        self.signalled: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopOnSignal":
        for signum in self._SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        from ..storage.control import STOP_EXPERIMENT, send_request
        from ..storage.lease import live_lease

        if self.signalled is not None:
            raise KeyboardInterrupt
        self.signalled = signum
        owner = live_lease(self.paths)
        if owner is None:  # not running yet (still laying it out): stop at once
            raise KeyboardInterrupt
        send_request(self.paths, STOP_EXPERIMENT, epoch=owner.epoch)
        # os.write: the main thread may be inside a print to the same stream.
        os.write(2, (f"\nftnb: stopping experiment {self.paths.name!r}: its trials end at their "
                     "next report and its state is saved (Ctrl+C again to stop at once)\n"
                     ).encode())
