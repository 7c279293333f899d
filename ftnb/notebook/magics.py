"""IPython magics: launch, watch, stop and resume experiments without leaving the notebook.

    %load_ext ftnb
    %ftrun train --param-space space --name sweep1 --max-failures 3 -o h   (also as %%ftrun)
    %ftrun train --num-workers 2 --gpus-per-worker 1   each trial a group of ranks (DDP)
    %ftattach sweep1              the live widget of any experiment, from any kernel
    %ftls                         the experiments under the storage path (as ``ftnb ls``) and
                                  under the storages this kernel used
    %ftstop sweep1 [--trial ID]   stop an experiment (resumable) or one trial
    %ftresume sweep1              resume an interrupted experiment with the notebook's objects

Each magic is a thin layer over the plain Python API (:func:`ftnb.launch`, :func:`ftnb.attach`,
:class:`ftnb.handle.ExperimentHandle`). Parsing and name resolution live in plain classes
that need no shell, so they are tested without one: the option tables in
:mod:`ftnb.notebook.magic_options`, :class:`RunCommand` and :class:`ResumeCommand` in
:mod:`ftnb.notebook.magic_commands`, the storages a kernel used in
:mod:`ftnb.notebook.used_storages`. :class:`FtnbMagics` only runs cells, calls the API and shows
the result. The names tests and :func:`ftnb.load_ipython_extension` use are importable from here.

Defaults (``%config FtnbMagics.<name> = ...``, or the environment):

    storage_path   $FTNB_STORAGE_PATH   where experiments live (default ~/ftnb_results)
    max_failures   $FTNB_MAX_FAILURES   retries per trial when --max-failures is not given (0)
    concurrency    $FTNB_CONCURRENCY    trials at once when --concurrency is not given (fill)
    widget         $FTNB_WIDGET         show the live widget (True; 0/false turns it off)
    verbose        $FTNB_VERBOSE        RunConfig.verbose of launched experiments (1)
    launcher       $FTNB_LAUNCHER       where the supervisor runs: local, ray or command (local)
    launcher_command $FTNB_LAUNCHER_COMMAND  the command launcher's template

A user's mistake (a name not defined, not a function, an unknown option, no experiment at a
path) is one line (IPython's ``UsageError``), never a traceback; ``FTNB_DEBUG=1`` shows the
traceback of errors raised by ftnb itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any, Iterator, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from traitlets import Bool, Int, TraitError, Unicode, default, validate

from ..cli.exits import one_line
from ..core.records import TrialStatus
from ..run_options import env_int, launcher_of, resumed_space
from ..ui.view import plural, shown_status
from .magic_commands import (
    CellDefinitions,
    LaunchPlan,
    ResumeCommand,
    RunCommand,
    check_space_not_needed,
    lookup,
    recorded_origin,
)
from .magic_options import (
    FTATTACH,
    FTLS,
    FTRESUME,
    FTRUN,
    FTSTOP,
    MagicDefaults,
    MagicInputError,
)
from .used_storages import UsedStorages

__all__ = [
    "FTATTACH",
    "FTLS",
    "FTRESUME",
    "FTRUN",
    "FTSTOP",
    "CellDefinitions",
    "FtnbMagics",
    "LaunchPlan",
    "MagicDefaults",
    "MagicInputError",
    "ResumeCommand",
    "RunCommand",
    "load_ipython_extension",
]


# -- the user's mistakes: one line --------------------------------------------------------------
def _user_error_types() -> tuple[type, ...]:
    # launch/attach/resume report bad input with these (ExperimentNotFoundError and
    # RestoreError are ValueErrors), each as one line that says what to do.
    from ..storage.lease import ExperimentLockedError

    return (ValueError, TypeError, ExperimentLockedError)


@contextlib.contextmanager
def _as_usage_errors() -> Iterator[None]:
    """The user's mistakes (and ftnb's one-line user errors) become IPython's UsageError: one
    line, no traceback. ``FTNB_DEBUG=1`` keeps the traceback of those ftnb raised."""
    try:
        yield
    except MagicInputError as exc:
        raise UsageError(_usage_line(exc)) from None
    except _user_error_types() as exc:
        if os.environ.get("FTNB_DEBUG"):
            raise
        raise UsageError(_usage_line(exc)) from None


def _usage_line(exc: BaseException) -> str:
    # IPython prefixes "UsageError: "; ftnb's own "ftnb: " would only repeat it.
    return one_line(str(exc)).removeprefix("ftnb: ")


# -- the magics ---------------------------------------------------------------------------------
_FALSE = ("0", "false", "no", "off")


@magics_class
class FtnbMagics(Magics):
    """``%ftrun``, ``%ftattach``, ``%ftls``, ``%ftstop``, ``%ftresume``; configurable with
    ``%config FtnbMagics.<name> = value`` (defaults from the environment)."""

    storage_path = Unicode(
        None, allow_none=True,
        help="Where experiments live when --storage is not given: a folder or an fsspec URL. "
             "Default: $FTNB_STORAGE_PATH, else ~/ftnb_results.",
    ).tag(config=True)
    max_failures = Int(
        0, help="Retries per trial when --max-failures is not given (-1: forever). "
                "Default: $FTNB_MAX_FAILURES, else 0.",
    ).tag(config=True)
    concurrency = Int(
        None, allow_none=True,
        help="Trials at once when --concurrency is not given (None: as many as fit). "
             "Default: $FTNB_CONCURRENCY.",
    ).tag(config=True)
    widget = Bool(
        True, help="Show the live widget after %ftrun, %ftattach, %ftresume. "
                   "Default: $FTNB_WIDGET (0/false turns it off), else True.",
    ).tag(config=True)
    verbose = Int(
        1, help="RunConfig.verbose of launched experiments (their log): 0, 1 or 2. "
                "Default: $FTNB_VERBOSE, else 1.",
    ).tag(config=True)

    launcher = Unicode(
        None, allow_none=True,
        help="Where the supervisor of %ftrun/%ftresume runs when --launcher is not given: "
             "'local' (a process on this machine), 'command' (started by launcher_command, "
             "outside the server's unit, container or pod), 'ray' (a detached Ray actor). "
             "Default: $FTNB_LAUNCHER, else local.",
    ).tag(config=True)
    launcher_command = Unicode(
        None, allow_none=True,
        help="The 'command' launcher's template when --launcher-command is not given, e.g. "
             "'systemd-run --user --collect {command}'. Default: $FTNB_LAUNCHER_COMMAND.",
    ).tag(config=True)

    @default("launcher")
    def _launcher_default(self) -> Optional[str]:
        return os.environ.get("FTNB_LAUNCHER") or None

    @default("launcher_command")
    def _launcher_command_default(self) -> Optional[str]:
        return os.environ.get("FTNB_LAUNCHER_COMMAND") or None

    @validate("launcher")
    def _check_launcher(self, proposal: Any) -> Optional[str]:
        from ..launchers import LAUNCHERS

        value = proposal["value"]
        if value is not None and value.strip().lower() not in LAUNCHERS:
            raise TraitError(f"FtnbMagics.launcher={value!r}: use one of "
                             f"{', '.join(repr(n) for n in LAUNCHERS)}")
        return value

    @default("storage_path")
    def _storage_path_default(self) -> Optional[str]:
        return os.environ.get("FTNB_STORAGE_PATH") or None

    @default("max_failures")
    def _max_failures_default(self) -> int:
        value = env_int("FTNB_MAX_FAILURES", 0, -1)
        return 0 if value is None else value

    @default("concurrency")
    def _concurrency_default(self) -> Optional[int]:
        return env_int("FTNB_CONCURRENCY", None, 1)

    @default("widget")
    def _widget_default(self) -> bool:
        return os.environ.get("FTNB_WIDGET", "").strip().lower() not in _FALSE

    @default("verbose")
    def _verbose_default(self) -> int:
        value = env_int("FTNB_VERBOSE", 1, 0)
        return value if value in (0, 1, 2) else 1

    @validate("max_failures")
    def _check_max_failures(self, proposal: Any) -> int:
        if proposal["value"] < -1:
            raise TraitError(f"FtnbMagics.max_failures={proposal['value']}: use 0 (no retries), "
                             "N > 0 (up to N) or -1 (forever)")
        return proposal["value"]

    @validate("concurrency")
    def _check_concurrency(self, proposal: Any) -> Optional[int]:
        if proposal["value"] is not None and proposal["value"] < 1:
            raise TraitError(f"FtnbMagics.concurrency={proposal['value']}: use a whole number "
                             ">= 1, or None to fill the machine")
        return proposal["value"]

    @validate("verbose")
    def _check_verbose(self, proposal: Any) -> int:
        if proposal["value"] not in (0, 1, 2):
            raise TraitError(f"FtnbMagics.verbose={proposal['value']}: use 0, 1 or 2")
        return proposal["value"]

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        #: The storages other than the default that this kernel used: ``%ftls``,
        #: ``%ftattach NAME`` and the others look there too.
        self.storages = UsedStorages()

    @property
    def used_storages(self) -> list[tuple[str, Any]]:
        """The storage paths other than the default that experiments were launched in or
        attached from in this kernel, the last one first, each with the filesystem it was
        reached with (:attr:`ftnb.notebook.used_storages.UsedStorages.entries`)."""
        return self.storages.entries

    def defaults(self) -> MagicDefaults:
        """The configuration as the command builders take it."""
        return MagicDefaults(self.storage_path or None, self.max_failures, self.concurrency,
                             self.widget, self.verbose, launcher=self.launcher or None,
                             launcher_command=self.launcher_command or None)

    # -- %ftrun ---------------------------------------------------------------------------------
    @FTRUN.help_for
    @line_cell_magic
    def ftrun(self, line: str, cell: Optional[str] = None) -> Any:
        import ftnb

        with _as_usage_errors():
            source = self.shell.transform_cell(cell) if cell is not None else None
            command = RunCommand.parse(line, self.defaults(), cell=source)
        if cell is not None:
            # The body runs as a cell of its own, so that its error shows as usual; the magic's
            # cell must fail too, or "Run All" would go on as if the experiment had started.
            if not self.shell.run_cell(cell).success:
                raise UsageError("%%ftrun: the cell failed (above), so nothing was launched")
        with _as_usage_errors():
            plan = command.resolve(self.shell.user_ns)
            if plan.kwargs["param_space"] is None and plan.kwargs["name"]:
                check_space_not_needed(plan)
            with _in_magic_words("%ftrun"):
                handle = ftnb.launch(plan.trainable, **plan.kwargs)
        self.storages.remember(handle, self.storage_path)
        return self._show(handle, plan.output, plan.widget, plan.metric, plan.wait)

    # -- %ftattach ------------------------------------------------------------------------------
    @FTATTACH.help_for
    @line_magic
    def ftattach(self, line: str) -> Any:
        with _as_usage_errors():
            args = FTATTACH.parse(line)
            FTATTACH.check_output_name(args.output)
            handle = self._attach(args)
        widget = self.defaults().show_widget(args.widget)
        return self._show(handle, args.output, widget, args.metric)

    # -- %ftls ----------------------------------------------------------------------------------
    @FTLS.help_for
    @line_magic
    def ftls(self, line: str) -> None:
        from .. import cli
        from ..storage import default_storage_path

        with _as_usage_errors():
            args = FTLS.parse(line)
        if args.storage_path or not self.used_storages:
            # The very listing of `ftnb ls`, errors included (one line each).
            try:
                cli.list_experiments(args.storage_path or self.storage_path, newest_first=True)
            except cli.CliError as exc:
                raise UsageError(_usage_line(exc)) from None
            return
        # The default storage, then those this kernel used: one listing each, under its path.
        default = self.storage_path or default_storage_path()
        places = [(default, "the default storage")]
        places += [(path, "used in this kernel") for path, _ in self.used_storages]
        for index, (where, why) in enumerate(places):
            print(("\n" if index else "") + f"Under {where} ({why}):", flush=True)
            try:
                cli.list_experiments(where, newest_first=True)
            except cli.CliError as exc:
                print(_usage_line(exc))

    # -- %ftstop --------------------------------------------------------------------------------
    @FTSTOP.help_for
    @line_magic
    def ftstop(self, line: str) -> None:
        with _as_usage_errors():
            args = FTSTOP.parse(line)
            handle = self._attach(args)
            if args.trial:
                _stop_trial(handle, args.trial, args.wait, args.timeout)
            else:
                _stop_experiment(handle, args.wait, args.timeout)

    # -- %ftresume ------------------------------------------------------------------------------
    @FTRESUME.help_for
    @line_magic
    def ftresume(self, line: str) -> Any:
        with _as_usage_errors():
            command = ResumeCommand.parse(line, self.defaults())
            handle = self._attach(command.args)
            origin, stored, needed = recorded_origin(handle)
            trainable, space = command.resolve(self.shell.user_ns, origin, stored, needed)
            space = resumed_space(space, handle.state().settings)
            with _in_magic_words("%ftresume"):
                handle = handle.resume(
                    trainable, param_space=space, restart_errored=command.args.restart_errored,
                    allow_different_trainable=command.args.allow_different_trainable,
                    takeover=command.args.takeover, wait=False,
                    launcher=launcher_of(command.args, self.defaults()))
        a = command.args
        return self._show(handle, a.output, command.widget, a.metric, a.wait)

    # -- shared ---------------------------------------------------------------------------------
    def _attach(self, args: argparse.Namespace) -> Any:
        """The experiment ``args.target`` names: a folder, a name under ``--storage``, or a
        name under the default storage, else under the storages this kernel used (the last
        one first)."""
        filesystem = None
        if args.filesystem:
            filesystem = lookup(self.shell.user_ns, args.filesystem, "--filesystem")
        return self.storages.attach(args.target, args.storage_path, filesystem,
                                    self.storage_path)

    def _show(self, handle: Any, output: Optional[str], widget: bool, metric: Optional[str],
              wait: bool = False) -> Any:
        """Show one thing: the widget (or its text, outside a notebook), else the handle as
        the cell's result; ``-o`` stores the handle instead of showing it. The handle is
        returned either way (``h = %ftrun ...``)."""
        if output:
            self.shell.user_ns[output] = handle
        update_text = handle.display_with_text_update(metric=metric) if widget else None
        if wait:
            try:
                results = handle.wait()
            except KeyboardInterrupt:
                pass  # wait() said that the experiment goes on, and how to stop it
            else:
                if update_text is not None:
                    update_text()  # the widget's plain-text copy was the experiment at launch
                print(f"ftnb: {handle.name} {results.status}: {plural(len(results), 'trial')}, "
                      f"{results.num_terminated} terminated, {results.num_errors} errored")
                if results.num_errors:  # what ended them, as `ftnb run` says it
                    from ..ui.failures import errored_trial_lines

                    print("\n".join(errored_trial_lines(handle.state().trials)))
        if widget or output:
            self._shown_already(handle)
        return handle

    def _shown_already(self, handle: Any) -> None:
        """The widget (or ``-o``) is the one thing this cell shows: the handle is still the
        magic's value (``h = %ftrun ...`` works) but is not displayed again as the cell's
        result. Only this cell's display hook is wrapped: IPython puts its own back when the
        cell ends."""
        if not self.shell.display_trap.is_active:
            return  # not inside a cell: nothing displays the value
        previous = sys.displayhook

        def displayhook(value: Any) -> None:
            if value is not handle:
                previous(value)

        sys.displayhook = displayhook



@contextlib.contextmanager
def _in_magic_words(prog: str) -> Iterator[None]:
    """Errors whose fix the Python API words as an argument, with the magic's option instead."""
    from ..lifecycle.stored import DifferentTrainableError

    try:
        yield
    except DifferentTrainableError as exc:
        recorded = exc.recorded.rsplit(".", 1)[-1]
        same = f"%ftrun {recorded}" if prog == "%ftrun" else f"--trainable {recorded}"
        raise MagicInputError(
            f"{prog}: {exc.path} was run by {exc.recorded!r}, not {exc.given!r}: resuming its "
            f"trials with other code would mix two programs in one experiment. Fix: {same} "
            f"(define it first), or --allow-different-trainable if {exc.given} is the same "
            "training under another name (a fixed version, say)"
        ) from None


def _stop_experiment(handle: Any, wait: bool, timeout: float) -> None:
    if not handle.is_live():
        handle.stop(wait=False)  # says that there is nothing to stop: stopping is idempotent
        return
    deadline = time.monotonic() + timeout
    try:
        handle.stop(wait=wait, timeout=timeout)
        # stop() returns once the state says so; the driver lets go of the experiment just
        # after. "Stopped" must mean that %ftresume can take it at once.
        while wait and handle.is_live():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"%ftstop: {handle.name} is stopped but its driver still "
                                   f"holds it after {timeout:g} s")
            time.sleep(0.05)
    except TimeoutError as exc:
        raise MagicInputError(str(exc)) from None
    if wait:
        print(f"ftnb: stopped {handle.name} ({handle.status()}); {handle.resume_line} "
              "resumes it")
    elif not _said_silent(handle):
        print(f"ftnb: asked {handle.name} to stop; {handle.resume_line} resumes it")


def _said_silent(handle: Any, trial_id: Optional[str] = None) -> bool:
    """After a stop request not waited for: say so when the driver is silent (it may never
    read it: not stopped yet, and how to take it over), as a waited stop raises."""
    silent = handle.silent_driver(trial_id=trial_id)
    if silent is not None:
        print(one_line(str(silent)))
    return silent is not None


def _stop_trial(handle: Any, trial_id: str, wait: bool, timeout: float) -> None:
    before = {t.trial_id: t.status for t in handle.state().trials}.get(trial_id)
    try:
        handle.stop_trial(trial_id, wait=wait, timeout=timeout)
    except (RuntimeError, TimeoutError) as exc:  # not running / not stopped in time
        raise MagicInputError(str(exc)) from None
    if before is not None and TrialStatus(before).is_finished():
        return  # stop_trial said it had already ended
    if wait:
        # (as the tables show it: a trial the user stopped reads STOPPED, not TERMINATED)
        status = next((shown_status(t) for t in handle.state().trials if t.trial_id == trial_id),
                      None)
        print(f"ftnb: stopped trial {trial_id} of {handle.name} ({status})")
    elif not _said_silent(handle, trial_id):
        print(f"ftnb: asked trial {trial_id} of {handle.name} to stop")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext ftnb``: register :class:`FtnbMagics` (and its ``%config`` section)."""
    ipython.register_magics(FtnbMagics(ipython))

