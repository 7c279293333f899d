"""IPython magics: launch, watch, stop and resume experiments without leaving the notebook.

    %load_ext ftnb
    %ftrun train --param-space space --name sweep1 --max-failures 3 -o h   (also as %%ftrun)
    %ftattach sweep1              the live widget of any experiment, from any kernel
    %ftls                         the experiments under the storage path (as ``ftnb ls``) and
                                  under the storages this kernel used
    %ftstop sweep1 [--trial ID]   stop an experiment (resumable) or one trial
    %ftresume sweep1              resume an interrupted experiment with the notebook's objects

Each magic is a thin layer over the plain Python API (:func:`ftnb.launch`, :func:`ftnb.attach`,
:class:`ftnb.handle.ExperimentHandle`). Parsing and name resolution live in plain classes
(:class:`RunCommand`, :class:`ResumeCommand`) that need no shell, so they are tested without
one; :class:`FtnbMagics` only runs cells, calls the API and shows the result.

Defaults (``%config FtnbMagics.<name> = ...``, or the environment):

    storage_path   $FTNB_STORAGE_PATH   where experiments live (default ~/ftnb_results)
    max_failures   $FTNB_MAX_FAILURES   retries per trial when --max-failures is not given (0)
    concurrency    $FTNB_CONCURRENCY    trials at once when --concurrency is not given (fill)
    widget         $FTNB_WIDGET         show the live widget (True; 0/false turns it off)
    verbose        $FTNB_VERBOSE        RunConfig.verbose of launched experiments (1)

A user's mistake (a name not defined, not a function, an unknown option, no experiment at a
path) is one line (IPython's ``UsageError``), never a traceback; ``FTNB_DEBUG=1`` shows the
traceback of errors raised by ftnb itself.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import keyword
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments
from traitlets import Bool, Int, TraitError, Unicode, default, validate

from ..cli import _one_line
from ..run_options import (
    CommandSpec,
    FrontEnd,
    Group,
    InputError,
    amount,
    env_int,
    filesystem_option,
    launch_arguments,
    opt,
    resume_options,
    run_options,
    space_from,
    storage_option,
)
from ..ui.view import plural
from ..core.records import TrialStatus

__all__ = [
    "FtnbMagics",
    "LaunchPlan",
    "MagicDefaults",
    "MagicInputError",
    "ResumeCommand",
    "RunCommand",
    "load_ipython_extension",
]


#: A mistake in a magic's input (its line, or a name it refers to): shown as one line. The same
#: class as the CLI's (``ftnb.run_options.InputError``): the option tables are shared.
MagicInputError = InputError


# -- option tables ------------------------------------------------------------------------------
# The tables are ftnb.run_options' (`ftnb run` and `ftnb resume` take the same options). Each
# feeds both the plain parser (used for parsing, testable without IPython) and IPython's
# @magic_arguments (which writes the complete `%ftrun?` help), so the help can never disagree
# with what is parsed.


@dataclass(frozen=True)
class MagicSpec(CommandSpec):
    """A magic's name, description and options (see :data:`FTRUN`)."""

    @property
    def prog(self) -> str:
        return f"%{self.name}"

    @property
    def help_hint(self) -> str:
        return f"`{self.prog}?` shows the options"

    def help_for(self, func: Callable) -> Callable:
        """Decorate a magic method with IPython's argument help (``%ftrun?``)."""
        func.__doc__ = self.description
        for item in reversed(self.items):  # decorators apply bottom-up
            if isinstance(item, Group):
                func = argument_group(item.title, item.description)(func)
            else:
                func = argument(*item.flags, **item.kwargs)(func)
        return magic_arguments(self.name)(func)


_NAME_HELP = "a name in the notebook's namespace (a.b for an attribute)"
_SPACE_FORMS = ("the name of a dict in the notebook's namespace (a.b for an attribute), or a "
                "dict literal of plain values, quoted: '{\"lr\": 0.1, \"x\": {\"grid_search\": "
                "[1, 2]}}'")

#: How the notebook's magics name things in the shared option tables.
NOTEBOOK = FrontEnd(
    names=_NAME_HELP,
    space_forms=_SPACE_FORMS,
    defaults={"storage_path": "FtnbMagics.storage_path, $FTNB_STORAGE_PATH",
              "max_failures": "FtnbMagics.max_failures",
              "concurrency": "FtnbMagics.concurrency",
              "verbose": "FtnbMagics.verbose"},
    resume_default="the name %ftrun used",
)

_OUTPUT = opt("-o", "--output", metavar="NAME",
              help="also store the ExperimentHandle in the variable NAME")
_NO_WIDGET = opt("--no-widget", dest="widget", action="store_false", default=None,
                 help="do not show the live widget (default: FtnbMagics.widget)")
_STORAGE = storage_option(NOTEBOOK)
_FILESYSTEM = filesystem_option(NOTEBOOK)
_WAIT = opt("--wait", action="store_true",
            help="block until the experiment is done (Ctrl+C stops waiting, not the experiment)")

FTRUN = MagicSpec(
    "ftrun",
    """Run an experiment in the background and show its live widget; returns its handle.

    Line magic:  %ftrun train --param-space space --name sweep1 --max-failures 3 -o h
    Cell magic:  %%ftrun --name sweep1
                 def train(config): ...
                 space = {"lr": ftnb.grid_search([0.1, 0.01])}

    The cell runs first; then its one function is the trainable (unless TRAINABLE is given)
    and a variable named `param_space` or `space` it assigns is the search space (unless
    --param-space is given). The experiment runs in its own process: restarting the kernel
    does not stop it (%ftattach NAME shows it again). An experiment of the same name that
    exists is resumed instead of started (errored trials from their latest checkpoint), with
    the objects now in the notebook; a running one is attached to. The same options start an
    experiment from a terminal: `ftnb run module:train ...`.
    """,
    run_options(NOTEBOOK, opt(
        "trainable", nargs="?", metavar="TRAINABLE",
        help="the function to run, train(config); " + _NAME_HELP
             + " (default in %%ftrun: the one function the cell defines)")) + (
        Group("notebook"),
        _OUTPUT,
        _WAIT,
        _NO_WIDGET,
        opt("-q", "--quiet", action="store_true",
            help="do not print the line saying the experiment started, resumed or attached"),
    ),
)

FTATTACH = MagicSpec(
    "ftattach",
    """Show the live widget of an experiment, running or finished; returns its handle.

    %ftattach sweep1               by name, under the storage path
    %ftattach s3://bucket/runs/sweep1 -o h
    """,
    (
        opt("target", metavar="NAME_OR_PATH",
            help="an experiment's name under the storage path, or its folder (path or URL)"),
        _STORAGE,
        _FILESYSTEM,
        opt("--metric", metavar="NAME", help="the metric the widget plots first"),
        _OUTPUT,
        _NO_WIDGET,
    ),
)

FTLS = MagicSpec(
    "ftls",
    """List the experiments under a storage path (the same listing as `ftnb ls`).""",
    (
        opt("storage_path", nargs="?", metavar="STORAGE",
            help="a folder or an fsspec URL (default: FtnbMagics.storage_path, "
                 "$FTNB_STORAGE_PATH, ~/ftnb_results)"),
    ),
)

FTSTOP = MagicSpec(
    "ftstop",
    """Stop an experiment cleanly (it can be resumed: %ftresume NAME), or one of its trials.

    %ftstop sweep1
    %ftstop sweep1 --trial 3f2a1_00002
    """,
    (
        opt("target", metavar="NAME_OR_PATH",
            help="the experiment's name under the storage path, or its folder"),
        opt("--trial", metavar="ID", help="stop only this trial (it ends TERMINATED)"),
        _STORAGE,
        _FILESYSTEM,
        opt("--no-wait", dest="wait", action="store_false",
            help="return at once instead of waiting until it has stopped"),
        opt("--timeout", type=amount, default=60.0, metavar="SECONDS",
            help="how long to wait for it to stop (default 60)"),
    ),
)

FTRESUME = MagicSpec(
    "ftresume",
    """Resume an interrupted experiment with the trainable and objects in this notebook.

    %ftresume sweep1
    %ftresume sweep1 --trainable train_v2 --param-space space -o h

    By default the trainable and the search space are the notebook's variables of the names
    %ftrun used (run the cells that define them first). Objects in the space (models,
    datasets, ftnb.put refs) are taken from the space as it is now.
    """,
    resume_options(NOTEBOOK) + (
        opt("--metric", metavar="NAME", help="the metric the widget plots first"),
        _OUTPUT,
        _WAIT,
        _NO_WIDGET,
    ),
)


# -- defaults -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MagicDefaults:
    """What an option that is not given falls back to (``FtnbMagics``' configuration)."""

    storage_path: Optional[str] = None
    max_failures: int = 0
    concurrency: Optional[int] = None
    widget: bool = True
    verbose: int = 1


# -- names in the user's namespace --------------------------------------------------------------
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

# A `%%ftrun` cell that assigns one of these names defines the search space.
SPACE_NAMES = ("param_space", "space")


def lookup(namespace: Mapping[str, Any], name: str, what: str) -> Any:
    """The value of ``name`` (``a`` or ``a.b.c``) in ``namespace``, or a one-line error that
    names ``what`` it was meant to be and the closest name that exists."""
    if not _DOTTED.match(name) or keyword.iskeyword(name.split(".")[0]):
        fix = ""
        if "(" in name:
            fix = " Fix: give the name alone, without parentheses or arguments"
        raise MagicInputError(f"{what} {name!r} is not a Python name.{fix}".rstrip("."))
    first, *rest = name.split(".")
    if first not in namespace:
        visible = [k for k in namespace if not k.startswith("_")]
        close = difflib.get_close_matches(first, visible, n=1)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        raise MagicInputError(
            f"{what} {first!r} is not defined in this notebook.{guess} Fix: run the cell that "
            "defines it first, or check the spelling"
        )
    value = namespace[first]
    for index, attr in enumerate(rest):
        try:
            value = getattr(value, attr)
        except AttributeError:
            owner = ".".join([first, *rest[:index]])
            raise MagicInputError(f"{what} {name!r}: {owner} has no attribute {attr!r}") from None
    return value


def _trainable_from(namespace: Mapping[str, Any], name: str, what: str = "trainable") -> Any:
    value = lookup(namespace, name, what)
    if not callable(value):
        raise MagicInputError(
            f"{what} {name!r} is a {type(value).__name__}, not a function. Fix: name the "
            "function that trains, def train(config): ... ftnb.report(...)"
        )
    return value


def _space_from(namespace: Mapping[str, Any], text: str) -> Mapping[str, Any]:
    """The search space ``--param-space`` gives: a dict literal, or the dict of that name."""
    return space_from(text, NamespaceNames(namespace), _SPACE_FORMS)


def _space_named(namespace: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    if not _DOTTED.match(name.strip()):
        raise MagicInputError(
            f"--param-space {name!r} is neither a name nor a dict literal. Accepted: "
            f"{_SPACE_FORMS}"
        )
    value = lookup(namespace, name.strip(), "param space")
    if not isinstance(value, Mapping):
        raise MagicInputError(
            f"param space {name!r} is a {type(value).__name__}, not a dict. Fix: name a dict "
            'such as {"lr": ftnb.grid_search([0.1, 0.01])}'
        )
    return value


@dataclass(frozen=True)
class NamespaceNames:
    """How the magics find what a line names: in the notebook's namespace (the
    :class:`ftnb.run_options.Names` of the notebook)."""

    namespace: Mapping[str, Any]

    def trainable(self, ref: str) -> Callable[..., Any]:
        return _trainable_from(self.namespace, ref)

    def space(self, ref: str) -> Mapping[str, Any]:
        return _space_named(self.namespace, ref)

    def value(self, ref: str, what: str) -> Any:
        return lookup(self.namespace, ref, what)


@dataclass(frozen=True)
class CellDefinitions:
    """What a cell defines at its top level: functions and search-space variables."""

    functions: tuple[str, ...] = ()
    spaces: tuple[str, ...] = ()

    @classmethod
    def of(cls, source: str) -> "CellDefinitions":
        """Read ``source`` (plain Python, after IPython's transformations) without running it.
        A syntax error gives nothing: running the cell then shows the error itself."""
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return cls()
        functions: list[str] = []
        spaces: list[str] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append(node.name)
                continue
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            spaces += [t.id for t in targets if isinstance(t, ast.Name) and t.id in SPACE_NAMES]
        return cls(tuple(dict.fromkeys(functions)), tuple(dict.fromkeys(spaces)))


# -- %ftrun -------------------------------------------------------------------------------------
@dataclass
class LaunchPlan:
    """What ``%ftrun`` does: ``ftnb.launch(trainable, **kwargs)``, then shows the result."""

    trainable: Callable[..., Any]
    kwargs: dict
    output: Optional[str] = None
    widget: bool = True
    wait: bool = False
    metric: Optional[str] = None


@dataclass
class RunCommand:
    """``%ftrun``'s line (and cell), parsed; :meth:`resolve` finds its names in a namespace.

    Example:
        >>> cmd = RunCommand.parse("train -p space --max-failures 3 --concurrency 4")
        >>> plan = cmd.resolve({"train": lambda config: None, "space": {"x": 1}})
        >>> plan.kwargs["run_config"].failure_config.max_failures
        3
    """

    args: argparse.Namespace
    trainable_name: str
    param_space_name: Optional[str]
    source: str
    defaults: MagicDefaults = field(default_factory=MagicDefaults)

    @classmethod
    def parse(cls, line: str, defaults: Optional[MagicDefaults] = None,
              cell: Optional[str] = None) -> "RunCommand":
        """Parse ``line``; ``cell`` is the body of a ``%%ftrun`` cell (plain Python), which
        may supply the trainable and the space. Raises :class:`MagicInputError`."""
        args = FTRUN.parse(line)
        _check_output_name(args.output, FTRUN)
        trainable, space = args.trainable, args.param_space
        if cell is not None:
            found = CellDefinitions.of(cell)
            if trainable is None:
                trainable = _the_one_function(found.functions)
            if space is None and found.spaces:
                if len(found.spaces) > 1:
                    raise MagicInputError(
                        f"%%ftrun: the cell assigns both {' and '.join(found.spaces)}. Fix: "
                        f"say which is the search space: --param-space {found.spaces[0]}"
                    )
                space = found.spaces[0]
        if trainable is None:
            raise MagicInputError(
                "%ftrun needs the trainable: %ftrun train [--param-space space] [--name NAME] "
                "... (`%ftrun?` shows the options)"
            )
        prefix = "%%ftrun" if cell is not None else "%ftrun"
        return cls(args, trainable, space, f"{prefix} {line.strip()}".strip(),
                   defaults or MagicDefaults())

    def resolve(self, namespace: Mapping[str, Any]) -> LaunchPlan:
        """Find the named objects in ``namespace`` and build the arguments of ``ftnb.launch``.
        Raises :class:`MagicInputError` for a missing or wrong name or an invalid value."""
        a = self.args
        origin = {"trainable": self.trainable_name, "source": self.source}
        if self.param_space_name:
            origin["param_space"] = self.param_space_name
        built = launch_arguments(a, NamespaceNames(namespace), trainable=self.trainable_name,
                                 param_space=self.param_space_name, space_forms=_SPACE_FORMS,
                                 defaults=self.defaults, origin=origin)
        kwargs = dict(built.kwargs, quiet=a.quiet)
        return LaunchPlan(built.trainable, kwargs, a.output, _given(a.widget, self.defaults.widget),
                          a.wait, a.metric)


def _the_one_function(functions: Sequence[str]) -> str:
    if len(functions) == 1:
        return functions[0]
    if not functions:
        raise MagicInputError(
            "%%ftrun: the cell defines no function to run. Fix: define it in the cell "
            "(def train(config): ...) or name it: %%ftrun train"
        )
    raise MagicInputError(
        f"%%ftrun: the cell defines {len(functions)} functions ({', '.join(functions)}). "
        f"Fix: name the one to run: %%ftrun {functions[0]}"
    )


# -- %ftresume ----------------------------------------------------------------------------------
@dataclass
class ResumeCommand:
    """``%ftresume``'s line, parsed; :meth:`resolve` finds the trainable and the space.

    The names default to those ``%ftrun`` stored in the experiment (``origin``), then to the
    name of the trainable the state records.
    """

    args: argparse.Namespace
    defaults: MagicDefaults = field(default_factory=MagicDefaults)

    @classmethod
    def parse(cls, line: str, defaults: Optional[MagicDefaults] = None) -> "ResumeCommand":
        """Parse ``line``. Raises :class:`MagicInputError`."""
        args = FTRESUME.parse(line)
        _check_output_name(args.output, FTRESUME)
        return cls(args, defaults or MagicDefaults())

    @property
    def widget(self) -> bool:
        return _given(self.args.widget, self.defaults.widget)

    def resolve(self, namespace: Mapping[str, Any], origin: Optional[Mapping[str, Any]] = None,
                stored_trainable: Optional[str] = None,
                needed: Sequence[tuple[str, str]] = ()) -> tuple[Callable, Optional[Mapping]]:
        """``(trainable, param_space)`` for ``handle.resume``; the space is None when neither
        ``--param-space`` nor a defined variable of the original name gives one. ``needed``:
        the objects (key, type) that the trials to resume need from the space, which is then
        required (the error names the variable to define)."""
        origin = origin or {}
        target = self.args.target
        name = self.args.trainable
        if name is None:
            name = origin.get("trainable") or stored_trainable
            if not isinstance(name, str) or not _DOTTED.match(name):
                raise MagicInputError(
                    f"%ftresume {target}: the experiment does not say which notebook name its "
                    "trainable had. Fix: pass it: --trainable NAME"
                )
            if name.split(".")[0] not in namespace:
                raise MagicInputError(
                    f"%ftresume {target} needs the trainable {name!r} (the name it was started "
                    "with), which is not defined in this notebook. Fix: run the cell that "
                    "defines it first, or pass --trainable NAME"
                )
        trainable = _trainable_from(namespace, name)
        space = None
        if self.args.param_space:
            space = _space_from(namespace, self.args.param_space)
        else:
            original = origin.get("param_space")
            # Only if defined: a space of plain values is stored with the experiment, and a
            # space with objects that is missing gets restore's own message naming them.
            if isinstance(original, str) and original.split(".")[0] in namespace:
                space = _space_from(namespace, original)
            elif needed:
                raise MagicInputError(_space_needed(f"%ftresume {target}", original, needed))
        return trainable, space


# -- small helpers ------------------------------------------------------------------------------
def _given(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def _check_output_name(name: Optional[str], spec: MagicSpec) -> None:
    if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
        raise MagicInputError(
            f"{spec.prog}: -o {name!r} is not a valid variable name. Fix: -o handle"
        )


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
    return _one_line(str(exc)).removeprefix("ftnb: ")


# -- the magics ---------------------------------------------------------------------------------
_env_int = env_int


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

    @default("storage_path")
    def _storage_path_default(self) -> Optional[str]:
        return os.environ.get("FTNB_STORAGE_PATH") or None

    @default("max_failures")
    def _max_failures_default(self) -> int:
        value = _env_int("FTNB_MAX_FAILURES", 0, -1)
        return 0 if value is None else value

    @default("concurrency")
    def _concurrency_default(self) -> Optional[int]:
        return _env_int("FTNB_CONCURRENCY", None, 1)

    @default("widget")
    def _widget_default(self) -> bool:
        return os.environ.get("FTNB_WIDGET", "").strip().lower() not in _FALSE

    @default("verbose")
    def _verbose_default(self) -> int:
        value = _env_int("FTNB_VERBOSE", 1, 0)
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
        #: The storage paths other than the default that experiments were launched in or
        #: attached from in this kernel, the last one first, each with the filesystem it was
        #: reached with: ``%ftls``, ``%ftattach NAME`` and the others look there too.
        self.used_storages: list[tuple[str, Any]] = []

    def defaults(self) -> MagicDefaults:
        """The configuration as the command builders take it."""
        return MagicDefaults(self.storage_path or None, self.max_failures, self.concurrency,
                             self.widget, self.verbose)

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
                _check_space_not_needed(plan)
            with _in_magic_words("%ftrun"):
                handle = ftnb.launch(plan.trainable, **plan.kwargs)
        self._remember(handle)
        return self._show(handle, plan.output, plan.widget, plan.metric, plan.wait)

    # -- %ftattach ------------------------------------------------------------------------------
    @FTATTACH.help_for
    @line_magic
    def ftattach(self, line: str) -> Any:
        with _as_usage_errors():
            args = FTATTACH.parse(line)
            _check_output_name(args.output, FTATTACH)
            handle = self._attach(args)
        return self._show(handle, args.output, _given(args.widget, self.widget), args.metric)

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
                cli.list_experiments(args.storage_path or self.storage_path)
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
                cli.list_experiments(where)
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
            origin, stored, needed = _origin_of(handle)
            trainable, space = command.resolve(self.shell.user_ns, origin, stored, needed)
            with _in_magic_words("%ftresume"):
                handle = handle.resume(
                    trainable, param_space=space, restart_errored=command.args.restart_errored,
                    allow_different_trainable=command.args.allow_different_trainable,
                    wait=False)
        a = command.args
        return self._show(handle, a.output, command.widget, a.metric, a.wait)

    # -- shared ---------------------------------------------------------------------------------
    def _attach(self, args: argparse.Namespace) -> Any:
        """The experiment ``args.target`` names: a folder, a name under ``--storage``, or a
        name under the default storage, else under the storages this kernel used (the last
        one first)."""
        import ftnb
        from ..handle import ExperimentNotFoundError
        from ..ui.read_model import names_a_folder

        filesystem = None
        if args.filesystem:
            filesystem = lookup(self.shell.user_ns, args.filesystem, "--filesystem")
        if args.storage_path or not self.used_storages or names_a_folder(args.target):
            handle = ftnb.attach(args.target, storage_path=args.storage_path or self.storage_path,
                                 storage_filesystem=filesystem)
            self._remember(handle)
            return handle
        try:
            handle = ftnb.attach(args.target, storage_path=self.storage_path,
                                 storage_filesystem=filesystem)
        except ExperimentNotFoundError:
            return self._attach_used(args.target)
        self._say_if_also_elsewhere(handle)
        return handle

    def _attach_used(self, name: str) -> Any:
        """Experiment ``name`` under the storages this kernel used, or an error that says where
        it was looked for."""
        import ftnb
        from ..handle import ExperimentNotFoundError
        from ..storage import default_storage_path

        for path, filesystem in self.used_storages:
            try:
                handle = ftnb.attach(name, storage_path=path, storage_filesystem=filesystem)
            except ExperimentNotFoundError:
                continue
            self._remember(handle)
            return handle
        default = self.storage_path or default_storage_path()
        used = ", ".join(path for path, _ in self.used_storages)
        raise ExperimentNotFoundError(
            f"No ftnb experiment named {name!r} under {default} (the default storage) nor under "
            f"{used} (used in this kernel). Fix: check the name (`%ftls` lists them all), or "
            "give its storage: --storage PATH"
        )

    def _say_if_also_elsewhere(self, handle: Any) -> None:
        """A name found under the default storage may also be under a storage this kernel used:
        say which one the magic acts on, and how to reach the other."""
        from ..storage import ExperimentPaths, Storage

        for path, filesystem in self.used_storages:
            with contextlib.suppress(Exception):  # unreachable: it cannot be confused either
                if ExperimentPaths.of(Storage(path, filesystem), handle.name).has_state():
                    print(f"ftnb: note: {handle.name!r} is the one under {handle.paths.parent_uri}"
                          f" (the default storage); another is under {path} (--storage {path}).",
                          flush=True)
                    return

    def _remember(self, handle: Any) -> None:
        from ..ui.read_model import same_storage_path
        from ..storage import default_storage_path

        path = handle.paths.parent_uri
        if same_storage_path(path, self.storage_path or default_storage_path()):
            return
        used = [(p, fs) for p, fs in self.used_storages if not same_storage_path(p, path)]
        self.used_storages[:] = [(path, handle._filesystem()), *used]

    def _show(self, handle: Any, output: Optional[str], widget: bool, metric: Optional[str],
              wait: bool = False) -> Any:
        """Show one thing: the widget (or its text, outside a notebook), else the handle as
        the cell's result; ``-o`` stores the handle instead of showing it. The handle is
        returned either way (``h = %ftrun ...``)."""
        if output:
            self.shell.user_ns[output] = handle
        update_text = handle._display(metric=metric) if widget else None
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
    from ..restore import DifferentTrainableError

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
    else:
        print(f"ftnb: asked {handle.name} to stop; {handle.resume_line} resumes it")


def _stop_trial(handle: Any, trial_id: str, wait: bool, timeout: float) -> None:
    before = {t.trial_id: t.status for t in handle.state().trials}.get(trial_id)
    try:
        handle.stop_trial(trial_id, wait=wait, timeout=timeout)
    except (RuntimeError, TimeoutError) as exc:  # not running / not stopped in time
        raise MagicInputError(str(exc)) from None
    if before is not None and TrialStatus(before).is_finished():
        return  # stop_trial said it had already ended
    if wait:
        status = {t.trial_id: t.status for t in handle.state().trials}.get(trial_id)
        print(f"ftnb: stopped trial {trial_id} of {handle.name} ({status})")
    else:
        print(f"ftnb: asked trial {trial_id} of {handle.name} to stop")


def _origin_of(handle: Any) -> tuple[dict, Optional[str], list[tuple[str, str]]]:
    """The names ``%ftrun`` recorded (``settings["origin"]``), the trainable's own name, and
    the objects (key, type) that the trials to resume need from the search space."""
    from ..core.records import ExperimentState

    state = ExperimentState.load(handle.paths)
    origin = state.settings.get("origin")
    origin = dict(origin) if isinstance(origin, Mapping) else {}
    return origin, state.trainable, handle._objects_needed()


def _check_space_not_needed(plan: LaunchPlan) -> None:
    """``%ftrun`` of an existing experiment without ``--param-space``: if resuming it needs
    objects of its space, say so in the magic's words (not ``Tuner.restore``'s)."""
    from ..handle import ExperimentHandle
    from ..storage import ExperimentPaths, Storage, default_storage_path

    kw = plan.kwargs
    storage = Storage(kw["storage_path"] or default_storage_path(),
                      kw["run_config"].storage_filesystem)
    handle = ExperimentHandle(ExperimentPaths.of(storage, kw["name"]))
    try:
        if not handle.paths.has_state() or handle.is_live():
            return  # a new experiment, or a running one (attached to)
        origin, _, needed = _origin_of(handle)
    except Exception:
        return  # launch says what is wrong with it
    if needed:
        raise MagicInputError(_space_needed(f"%ftrun: resuming experiment {kw['name']!r}",
                                            origin.get("param_space"), needed))


def _space_needed(what: str, name: Any, needed: Sequence[tuple[str, str]]) -> str:
    """The line that says a resume needs the search space, and which name to define."""
    keys = ", ".join(f"{key} ({kind})" for key, kind in needed)
    if isinstance(name, str) and _DOTTED.match(name):
        fix = (f"run the cell that defines {name.split('.')[0]!r} (the search space it was "
               f"started with, {name}), or pass another: --param-space NAME")
    else:
        fix = ("define the search space it was started with, those objects re-created, and "
               "pass it: --param-space NAME")
    return (f"{what} needs its search space again: its trials hold objects that are not saved "
            f"with the experiment ({keys}). Fix: {fix}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext ftnb``: register :class:`FtnbMagics` (and its ``%config`` section)."""
    ipython.register_magics(FtnbMagics(ipython))

