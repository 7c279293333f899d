"""The ``ftnb`` command: run, watch, stop, resume and inspect experiments from a terminal.

    ftnb run TRAINABLE [options]   start an experiment, or resume it (same name); --detach;
                                   --num-workers N: each trial a group of N ranks (DDP)
    ftnb resume NAME               resume an interrupted experiment
    ftnb stop NAME [--trial ID]    stop it cleanly (resumable), or one trial
    ftnb watch NAME                its live table until it ends
    ftnb logs NAME [--trial ID] [--follow]   its supervisor's log, or a trial's output
    ftnb status NAME               its summary and a row per trial
    ftnb ls [STORAGE]              the experiments under a storage path
    ftnb rm NAME [--yes]           remove it (not while it runs)
    ftnb --version

``NAME`` is an experiment's name under ``--storage`` (default ``$FTNB_STORAGE_PATH``, else
``~/ftnb_results``) or its folder (a path, or a URL such as ``s3://bucket/runs/sweep1``), as
:func:`ftnb.attach` takes it. ``TRAINABLE`` (and ``--param-space``) name Python objects as
``module:attr`` or ``path/file.py:attr``. ``ftnb run`` takes the options of ``%ftrun`` (one
table, :mod:`ftnb.run_options`). ``--json`` on every command prints strict JSON (no NaN) with
everything the text shows, for scripts.

Exit codes:

    0    done (an experiment that was waited for FINISHED)
    1    the experiment errored (a trial ended ERRORED), or the command could not do what it
         was asked (a stop that timed out, a declined rm, an unexpected failure)
    2    usage error: a bad option, path, name or reference; nothing was started or written
    130  interrupted: Ctrl+C (or SIGTERM), or the experiment stopped before it ended; it can
         be resumed

User errors are one line on stderr, never a traceback (``FTNB_DEBUG=1`` shows the traceback of
an unexpected error). ``ls``, ``status``, ``logs`` and ``watch`` only read, so they are safe
against a running experiment, from any machine that sees its storage. Start-up stays fast:
nothing here imports pandas.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional, Sequence

from .. import __version__
from ..run_options import CommandSpec, InputError, OptionParser
from .exits import (
    EXIT_ERRORED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    describe,
    one_line,
)
from .listing import list_experiments

__all__ = ["CliError", "list_experiments", "main"]

_EPILOG = """\
NAME is an experiment's name under --storage ($FTNB_STORAGE_PATH, else ~/ftnb_results) or its
folder (a path or a URL). TRAINABLE and --param-space name Python objects as module:attr or
path/file.py:attr. --json on every command prints strict JSON for scripts.

exit codes:
  0    done (an experiment that was waited for FINISHED)
  1    the experiment errored, or the command could not do what was asked
  2    usage error (bad option, path, name or reference): nothing was started
  130  interrupted (Ctrl+C or SIGTERM, or it stopped before it ended): resumable
"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``ftnb`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, specs = _build_parser()
        args = _parse(parser, specs, words)
    except SystemExit as exc:  # --help, --version
        return _exit_code(exc.code)
    except InputError as exc:
        print(f"ftnb: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args.argv = words
    try:
        return args.func(args)
    except CliError as exc:
        print(f"ftnb: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.code
    except InputError as exc:
        print(f"ftnb: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()  # `ftnb ls | head`: the reader left; do not complain on exit
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("FTNB_DEBUG"):
            raise
        print(f"ftnb: unexpected error: {describe(exc)} (set FTNB_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return EXIT_ERRORED


def _exit_code(code: Any) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_ERRORED


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _parse(parser: argparse.ArgumentParser, specs: dict[str, tuple[CommandSpec, Any]],
           words: list[str]) -> argparse.Namespace:
    """Parse ``words``; a word a command does not take is one line that says which option was
    likely meant."""
    args, unknown = parser.parse_known_args(words)
    chosen = specs.get(getattr(args, "command", None) or "")
    if chosen is None:
        if unknown:
            raise InputError(f"ftnb: unexpected argument {unknown[0]!r}. `ftnb --help` shows "
                             "the commands")
        return args
    spec, subparser = chosen
    spec.check_parsed(args, unknown, subparser)
    return args


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, tuple[CommandSpec, Any]]]:
    from .actions import RM, STOP, cmd_rm, cmd_stop
    from .following import LOGS, WATCH, cmd_logs, cmd_watch
    from .listing import cmd_ls, cmd_status
    from .running import RESUME, RUN, cmd_resume, cmd_run

    parser = OptionParser(
        prog="ftnb",
        description="Run, watch, stop, resume and inspect ftnb experiments.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.hint = "`ftnb --help` shows the commands"
    parser.add_argument("--version", action="version", version=f"ftnb {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    specs: dict[str, tuple[CommandSpec, Any]] = {}

    def add(spec: CommandSpec, summary: str, func: Any) -> None:
        subparser = sub.add_parser(spec.name, help=summary, description=_dedent(spec.description),
                                   epilog=_EPILOG, allow_abbrev=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
        spec.add_to(subparser)
        subparser.set_defaults(func=func)
        specs[spec.name] = (spec, subparser)

    add(RUN, "start an experiment (or resume it); --detach runs it in the background, "
             "--num-workers N each trial in a group of N ranks", cmd_run)
    add(RESUME, "resume an interrupted experiment", cmd_resume)
    add(STOP, "stop an experiment cleanly (resumable), or one of its trials", cmd_stop)
    add(WATCH, "show an experiment's live table until it ends", cmd_watch)
    add(LOGS, "print an experiment's log or a trial's output (--follow: as it grows)", cmd_logs)
    add(_STATUS, "show one experiment and its trials", cmd_status)
    add(_LS, "list the experiments under a storage path", cmd_ls)
    add(RM, "remove an experiment (asks first; never a running one)", cmd_rm)
    return parser, specs


def _dedent(text: str) -> str:
    import textwrap

    first, _, rest = text.partition("\n")
    return (first + "\n" + textwrap.dedent(rest)).strip()


def _status_and_ls() -> tuple[CommandSpec, CommandSpec]:
    from ..run_options import opt, storage_option, target_option
    from .listing import DEFAULT_MAX_ROWS
    from .running import CLI

    status = CommandSpec(
        "status",
        """Show one experiment: its summary line and a row per trial (only reads).

    ftnb status sweep1
    ftnb status s3://bucket/runs/sweep1 --json
    """,
        (
            target_option(),
            storage_option(CLI),
            opt("--metric", metavar="NAME", help="the metric shown in the first column"),
            opt("--all", action="store_true",
                help=f"show every trial (default: the first {DEFAULT_MAX_ROWS})"),
            opt("--json", action="store_true",
                help="print the experiment as JSON (the view model, its driver, the line that "
                     "resumes it, each trial's last error in full)"),
        ),
    )
    ls = CommandSpec(
        "ls",
        """List the experiments under a storage path, the most recently updated last.""",
        (
            opt("storage", nargs="?", metavar="STORAGE",
                help="a local folder or an fsspec URL (s3://bucket/prefix); default: "
                     "$FTNB_STORAGE_PATH, else ~/ftnb_results"),
            opt("--json", action="store_true", help="print a JSON list, for scripts"),
        ),
    )
    return status, ls


_STATUS, _LS = _status_and_ls()
