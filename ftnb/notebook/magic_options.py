"""The magics' option tables (``%ftrun``, ``%ftattach``, ``%ftls``, ``%ftstop``, ``%ftresume``)
and what an option that is not given falls back to (:class:`MagicDefaults`).

No IPython here: the tables parse lines without a shell (:mod:`ftnb.notebook.magic_commands`);
:meth:`MagicSpec.help_for` imports IPython only when :class:`ftnb.notebook.magics.FtnbMagics`
is defined.
"""

from __future__ import annotations

import functools
import keyword
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..run_options import (
    CommandSpec,
    FrontEnd,
    Group,
    InputError,
    amount,
    filesystem_option,
    opt,
    resume_options,
    run_options,
    storage_option,
    target_option,
)

__all__ = [
    "FTATTACH",
    "FTLS",
    "FTRESUME",
    "FTRUN",
    "FTSTOP",
    "NOTEBOOK",
    "MagicDefaults",
    "MagicInputError",
    "MagicSpec",
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
        """Decorate a magic method with IPython's argument help (``%ftrun?``); the magic given
        ``-h`` or ``--help`` prints that help and does nothing else (its cell does not run)."""
        from IPython.core.magic_arguments import argument, argument_group, magic_arguments

        func.__doc__ = self.description
        for item in reversed(self.items):  # decorators apply bottom-up
            if isinstance(item, Group):
                func = argument_group(item.title, item.description)(func)
            else:
                func = argument(*item.flags, **item.kwargs)(func)
        documented = magic_arguments(self.name)(func)

        @functools.wraps(documented)
        def magic(magics: Any, line: str, *cell: Any) -> Any:
            if asks_for_help(line):
                print(self.help_text(documented.__doc__ or ""))
                return None
            return documented(magics, line, *cell)

        return magic

    @staticmethod
    def help_text(doc: str) -> str:
        """``%ftrun?``'s text (IPython's help of the options) as printed by ``%ftrun --help``:
        without the reST ``::`` that opens it."""
        return doc.removeprefix("::").strip()

    def check_output_name(self, name: Optional[str]) -> None:
        """Raise :class:`MagicInputError` unless ``-o NAME`` (when given) is a variable name."""
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            raise MagicInputError(
                f"{self.prog}: -o {name!r} is not a valid variable name. Fix: -o handle"
            )


def asks_for_help(line: str) -> bool:
    """Whether a magic's ``line`` has the word ``-h`` or ``--help`` (before any ``--``)."""
    try:
        words = shlex.split(line)
    except ValueError:  # an unclosed quote: the parser says so
        return False
    words = words[: words.index("--")] if "--" in words else words
    return "-h" in words or "--help" in words


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
              "verbose": "FtnbMagics.verbose",
              "launcher": "FtnbMagics.launcher, $FTNB_LAUNCHER",
              "launcher_command": "FtnbMagics.launcher_command, $FTNB_LAUNCHER_COMMAND"},
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

    Data-parallel:  %ftrun train --param-space space --num-workers 2 --gpus-per-worker 1
    runs each trial as a group of ranks, each calling train(config) with the trial's config in
    one torch.distributed process group (a TorchTrainer's group; restarted as one).
    """,
    run_options(NOTEBOOK, opt(
        "trainable", nargs="?", metavar="TRAINABLE",
        help="the function to run, train(config), or an ftnb.TorchTrainer; " + _NAME_HELP
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
        target_option(),
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
        target_option(),
        opt("--trial", metavar="ID", help="stop only this trial (shown STOPPED; the others go on)"),
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
    %ftresume sweep1 --takeover

    By default the trainable and the search space are the notebook's variables of the names
    %ftrun used (run the cells that define them first). Objects in the space (models,
    datasets, ftnb.put refs) are taken from the space as it is now. While its driver is
    silent (its server's container was killed, say), --takeover resumes it at once.
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
    launcher: Optional[str] = None
    launcher_command: Optional[str] = None

    def show_widget(self, widget_option: Optional[bool]) -> bool:
        """Whether to show the live widget: False when ``--no-widget`` was given (the parsed
        ``args.widget``; None when it was not), else this default."""
        return self.widget if widget_option is None else widget_option
