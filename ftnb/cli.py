"""The ``ftnb`` command: look at experiments from a terminal.

    ftnb ls [STORAGE]          the experiments under a storage path, oldest update first
    ftnb status EXPERIMENT     one experiment: its summary and a row per trial
    ftnb --version

Every command is a reader (ARCHITECTURE.md, principle 6): it never writes to storage, so it is
safe to run against an experiment that is running, from any machine that can see its storage.
User errors (a wrong path, an unreadable state) are one line on stderr and exit code 2, never a
traceback. Start-up stays fast: nothing here imports pandas.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Optional, Sequence

from . import __version__
from .state import ExperimentState, StateFormatError
from .storage import (
    STATE_BACKUP_FILE,
    STATE_FILE,
    ExperimentPaths,
    Storage,
    default_storage_path,
)

__all__ = ["CliError", "list_experiments", "main"]

EXIT_OK = 0
EXIT_ERROR = 1  # something unexpected (a bug, a backend failure)
EXIT_USAGE = 2  # the user's input: a bad path, no experiment there, an unreadable state

DEFAULT_MAX_ROWS = 50
_STATUSES = ("PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERRORED")
_STATUS_HEADERS = ("PEND", "RUN", "PAUSE", "TERM", "ERR")


class CliError(Exception):
    """A user error: printed as one line on stderr, exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# -- entry point -------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``ftnb`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return _exit_code(exc.code)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.func(args)
    except CliError as exc:
        print(f"ftnb: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()  # `ftnb ls | head`: the reader left; do not complain on exit
        return EXIT_OK
    except Exception as exc:
        if os.environ.get("FTNB_DEBUG"):
            raise
        print(
            f"ftnb: unexpected error: {type(exc).__name__}: {_one_line(str(exc))} "
            "(set FTNB_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


def _exit_code(code: Any) -> int:
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return EXIT_ERROR


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftnb",
        description="Inspect ftnb experiments (read-only: nothing is ever written).",
    )
    parser.add_argument("--version", action="version", version=f"ftnb {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    ls = sub.add_parser(
        "ls",
        help="list the experiments under a storage path",
        description="List the experiments under a storage path, the most recently updated last.",
    )
    ls.add_argument(
        "storage",
        nargs="?",
        metavar="STORAGE",
        help="a local folder or an fsspec URL (s3://bucket/prefix); default: $FTNB_STORAGE_PATH, "
        "else ~/ftnb_results",
    )
    ls.add_argument("--json", action="store_true", help="print a JSON list, for scripts")
    ls.set_defaults(func=_cmd_ls)

    status = sub.add_parser(
        "status",
        help="show one experiment and its trials",
        description="Show one experiment: its summary line and a row per trial.",
    )
    status.add_argument(
        "path", metavar="PATH", help="the experiment's folder (a local path or an fsspec URL)"
    )
    status.add_argument("--metric", metavar="NAME", help="the metric shown in the first column")
    status.add_argument(
        "--all",
        action="store_true",
        help=f"show every trial (default: the first {DEFAULT_MAX_ROWS})",
    )
    status.add_argument(
        "--json", action="store_true", help="print the view model as JSON, for scripts"
    )
    status.set_defaults(func=_cmd_status)
    return parser


# -- ftnb ls -----------------------------------------------------------------------------------
@dataclasses.dataclass
class _Listed:
    name: str
    path: str
    status: str
    trials: Optional[int] = None
    counts: dict = dataclasses.field(default_factory=dict)
    failures: Optional[int] = None
    preemptions: Optional[int] = None
    updated: Optional[float] = None
    error: Optional[str] = None


def _cmd_ls(args: argparse.Namespace) -> int:
    return list_experiments(args.storage, as_json=args.json)


def list_experiments(given: Optional[str] = None, *, as_json: bool = False) -> int:
    """Print the experiments under the storage path ``given`` (default: the default storage)
    as ``ftnb ls`` does (``%ftls`` too); raise :class:`CliError` for a bad path."""
    where = given or default_storage_path()
    if given is None:
        origin = "$FTNB_STORAGE_PATH" if os.environ.get("FTNB_STORAGE_PATH") else "the default"
        shown = f"{where} ({origin}; pass a STORAGE path to look elsewhere)"
    else:
        shown = where
    storage = _open_storage(where)
    root = storage.root
    if not _exists(storage, root):
        raise CliError(f"storage path {shown} does not exist")
    if not _isdir(storage, root):
        raise CliError(f"storage path {where} is a file, not a folder")

    listed: list[_Listed] = []
    if _has_state(storage, root):
        # The path is itself an experiment: show it rather than "nothing here".
        print(
            f"note: {where} is itself an experiment folder; `ftnb status {where}` shows its "
            "trials",
            file=sys.stderr,
        )
        listed.append(_list_one(ExperimentPaths(storage, root)))
    else:
        for name in _visible(storage.listdir(root)):
            exp_dir = storage.join(root, name)
            if _has_state(storage, exp_dir):
                listed.append(_list_one(ExperimentPaths(storage, exp_dir)))

    readable = sorted((e for e in listed if e.error is None), key=lambda e: (e.updated, e.name))
    broken = sorted((e for e in listed if e.error is not None), key=lambda e: e.name)
    listed = readable + broken  # newest last; the ones that need attention at the very end

    if as_json:
        _print_json([dataclasses.asdict(e) for e in listed])
        return EXIT_OK
    if not listed:
        print(f"No experiments under {where}")
        return EXIT_OK
    print(_render_ls(listed))
    if broken:
        print()
        for e in broken:
            print(f"{e.name}: UNREADABLE: {e.error}")
    return EXIT_OK


def _list_one(paths: ExperimentPaths) -> _Listed:
    name = paths.name
    try:
        state = ExperimentState.load(paths)
    except StateFormatError as exc:
        return _Listed(name, paths.uri, "UNREADABLE", error=_short_reason(str(exc), paths))
    except Exception as exc:  # permission denied, a backend error: still list the others
        return _Listed(name, paths.uri, "UNREADABLE", error=_describe(exc))
    if state.status == "RUNNING":
        from .lease import live_lease

        if live_lease(paths) is None:
            state = state.without_driver()
    counts = state.counts()
    return _Listed(
        name=name,
        path=paths.uri,
        status=state.status,
        trials=len(state.trials),
        counts=counts,
        failures=sum(t.num_failures for t in state.trials),
        preemptions=sum(t.num_preemptions for t in state.trials),
        updated=state.updated,
    )


def _short_reason(message: str, paths: ExperimentPaths) -> str:
    """The load error without the experiment's own path repeated in every clause."""
    prefix = f"no readable experiment state at {paths.uri}: "
    if message.startswith(prefix):
        message = message[len(prefix) :]
    for base in (paths.dir, paths.uri):
        for sep in ("/", os.sep):
            message = message.replace(base.rstrip(sep) + sep, "")
    return _one_line(message)


def _render_ls(listed: list[_Listed]) -> str:
    header = ["NAME", "STATUS", "TRIALS", *_STATUS_HEADERS, "FAILURES", "PREEMPT", "UPDATED"]
    right = set(range(2, len(header) - 1))  # numbers are right-aligned
    rows = []
    for e in listed:
        if e.error is not None:
            rows.append([e.name, e.status] + ["-"] * (len(header) - 2))
            continue
        rows.append(
            [e.name, e.status, str(e.trials)]
            + [str(e.counts.get(s, 0)) for s in _STATUSES]
            + [str(e.failures), str(e.preemptions), _local_time(e.updated)]
        )
    return _columns(header, rows, right)


def _columns(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(header)] + [line(r) for r in rows])


# -- ftnb status -------------------------------------------------------------------------------
def _cmd_status(args: argparse.Namespace) -> int:
    from .view import ExperimentView, render_table

    paths = _find_experiment(args.path)
    try:
        state = ExperimentState.load(paths).merge_trial_records(paths)
    except StateFormatError as exc:
        raise CliError(_one_line(str(exc))) from None
    except OSError as exc:
        raise CliError(f"cannot read {paths.uri}: {_describe(exc)}") from None
    fallback = _fallback_note(paths, state)
    if fallback:
        print(f"warning: {fallback}", file=sys.stderr)
    from .lease import read_lease

    lease = read_lease(paths)
    alive, why = lease.liveness() if lease is not None else (False, "")
    if state.status == "RUNNING" and not alive:
        state = state.without_driver()

    view = ExperimentView.from_state(state, path=paths.uri, metric=args.metric)
    if args.json:
        _print_json(dataclasses.asdict(view))
        return EXIT_OK

    max_rows = len(view.rows) if args.all else DEFAULT_MAX_ROWS
    print(render_table(view, max_rows=max(max_rows, 1)))
    if len(view.rows) > max_rows:
        print("(--all shows every trial)")
    print(f"Updated {_local_time(state.updated)}  {paths.uri}")
    owner = _owner_line(paths, state, lease, alive, why)
    if owner:
        print(owner)
    if args.metric and not any(args.metric in (t.last_result or {}) for t in state.trials):
        reported = sorted({k for t in state.trials for k in (t.last_result or {})})
        known = ", ".join(reported) if reported else "none yet"
        print(
            f"note: no trial has reported a metric named {args.metric!r} (reported: {known})",
            file=sys.stderr,
        )
    return EXIT_OK


def _owner_line(paths: ExperimentPaths, state: ExperimentState, lease: Any, alive: bool,
                why: str) -> Optional[str]:
    """Who drives the experiment (``lease``, and its ``liveness()``), and how to resume it if
    that driver is gone."""
    if lease is None or state.status in ("FINISHED", "ERRORED") and lease.released:
        return None
    if alive:
        return f"Driver: {lease.describe()}, alive ({why})"
    if state.status in ("FINISHED", "ERRORED"):
        return None
    return (
        f"Driver: {lease.describe()}, gone ({why}). Resume with "
        f"ftnb.Tuner.restore({paths.uri!r}, <trainable>).fit(), or run the same ftnb.run(...) "
        "again"
    )


def _find_experiment(where: str) -> ExperimentPaths:
    """The experiment at ``where``, or a CliError that says what is there instead."""
    storage = _open_storage(where)
    root = storage.root
    if not _exists(storage, root):
        raise CliError(f"{where} does not exist")
    if not _isdir(storage, root):
        base = root.replace(os.sep, "/").rsplit("/", 1)[-1]
        if base in (STATE_FILE, STATE_BACKUP_FILE):  # `ftnb status exp/experiment_state.json`
            return _find_experiment(where.rstrip("/").rsplit("/", 1)[0] if "/" in where else ".")
        raise CliError(f"{where} is a file, not an experiment folder")
    if _has_state(storage, root):
        return ExperimentPaths(storage, root)

    names = _visible(storage.listdir(root))
    if not names:
        raise CliError(f"{where} is an empty folder, not an experiment (no {STATE_FILE})")
    experiments = [n for n in names if _has_state(storage, storage.join(root, n))]
    if experiments:
        some = ", ".join(experiments[:3]) + (", ..." if len(experiments) > 3 else "")
        plural = "experiment" if len(experiments) == 1 else "experiments"
        raise CliError(
            f"{where} has no {STATE_FILE}: it is a storage folder holding "
            f"{len(experiments)} {plural} ({some}). Fix: `ftnb ls {where}` lists them; "
            f"`ftnb status {storage.join(where, experiments[0])}` shows one"
        )
    parent = os.path.dirname(root) if storage.is_local else root.rstrip("/").rsplit("/", 1)[0]
    if parent and parent != root and _has_state(storage, parent):
        shown = where.rstrip("/").rsplit("/", 1)[0] if "/" in where.rstrip("/") else "."
        raise CliError(
            f"{where} is a trial folder, not an experiment folder. Fix: `ftnb status {shown}` "
            "shows the experiment it belongs to"
        )
    some = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    raise CliError(
        f"{where} is not an experiment folder: it has no {STATE_FILE} "
        f"(it holds {len(names)} other {'entry' if len(names) == 1 else 'entries'}: {some})"
    )


def _fallback_note(paths: ExperimentPaths, state: ExperimentState) -> Optional[str]:
    """Say so when the state came from experiment_state.prev.json (the latest is damaged)."""
    if state.loaded_from != paths.state_backup:
        return None
    return (
        f"{STATE_FILE} is missing or unreadable; showing the previous generation from "
        f"{STATE_BACKUP_FILE}"
    )


# -- helpers -----------------------------------------------------------------------------------
def _open_storage(where: str) -> Storage:
    try:
        return Storage(where)
    except ImportError as exc:  # s3:// without s3fs, gs:// without gcsfs, ...
        raise CliError(f"cannot open {where}: {_one_line(str(exc))}") from None
    except ValueError as exc:  # an unknown protocol
        raise CliError(f"cannot open {where}: {_one_line(str(exc))}") from None


def _exists(storage: Storage, path: str) -> bool:
    # The first touch of the storage: any backend failure here (no credentials, no network,
    # permission denied) is about the user's path or environment, not a bug.
    try:
        return storage.exists(path)
    except Exception as exc:
        raise CliError(f"cannot read {storage.uri(path)}: {_describe(exc)}") from None


def _isdir(storage: Storage, path: str) -> bool:
    try:
        return storage.isdir(path)
    except Exception as exc:
        raise CliError(f"cannot read {storage.uri(path)}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(str(exc))}"


def _has_state(storage: Storage, folder: str) -> bool:
    """Whether ``folder`` holds an experiment (its state, or at least the previous generation)."""
    try:
        return ExperimentPaths(storage, folder).has_state()
    except Exception:
        return False


def _visible(names: list[str]) -> list[str]:
    # Hidden entries are ftnb's own temporaries (write probes, half-written files) or the OS's.
    return [n for n in names if not n.startswith(".")]


def _local_time(t: Optional[float]) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _print_json(obj: Any) -> None:
    # Strict JSON (jq, JavaScript): NaN and infinities become null.
    print(json.dumps(_finite(obj), indent=1, default=str, allow_nan=False))


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
