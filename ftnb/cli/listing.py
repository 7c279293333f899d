"""``ftnb ls`` and ``ftnb status``, and how every verb finds the experiment it is given.

Both verbs only read (ARCHITECTURE.md, principle 7): they are safe against a running experiment,
from any machine that sees its storage.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from typing import Any, Optional

from ..state import ExperimentState, StateFormatError
from ..storage import (
    STATE_BACKUP_FILE,
    STATE_FILE,
    ExperimentPaths,
    Storage,
    default_storage_path,
)
from .exits import EXIT_OK, CliError, describe, one_line
from .output import columns, experiment_json, local_time, print_json

__all__ = ["DEFAULT_MAX_ROWS", "cmd_ls", "cmd_status", "find_experiment", "list_experiments",
           "open_storage", "resume_hint"]

DEFAULT_MAX_ROWS = 50
_STATUSES = ("PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERRORED")
_STATUS_HEADERS = ("PEND", "RUN", "PAUSE", "TERM", "ERR")


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


def cmd_ls(args: argparse.Namespace) -> int:
    """``ftnb ls [STORAGE] [--json]``."""
    return list_experiments(args.storage, as_json=args.json)


def _storage_shown(given: Optional[str]) -> tuple[str, str]:
    """The storage path to use and how to name it in a message (where it came from)."""
    where = given or default_storage_path()
    if given is not None:
        return where, where
    origin = "$FTNB_STORAGE_PATH" if os.environ.get("FTNB_STORAGE_PATH") else "the default"
    return where, f"{where} ({origin}; pass a STORAGE path to look elsewhere)"


def list_experiments(given: Optional[str] = None, *, as_json: bool = False) -> int:
    """Print the experiments under the storage path ``given`` (default: the default storage)
    as ``ftnb ls`` does (``%ftls`` too); raise :class:`CliError` for a bad path."""
    where, shown = _storage_shown(given)
    storage = open_storage(where)
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
        print_json([dataclasses.asdict(e) for e in listed])
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
        return _Listed(name, paths.uri, "UNREADABLE", error=describe(exc))
    if state.status == "RUNNING":
        from ..lease import live_lease

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
    return one_line(message)


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
            + [str(e.failures), str(e.preemptions), local_time(e.updated)]
        )
    return columns(header, rows, right)


# -- ftnb status -------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    """``ftnb status NAME_OR_PATH [--storage PATH] [--metric M] [--all] [--json]``."""
    from ..lease import read_lease
    from ..view import ExperimentView, render_table

    paths = find_experiment(args.target, args.storage_path)
    try:
        state = ExperimentState.load(paths).merge_trial_records(paths)
    except StateFormatError as exc:
        raise CliError(one_line(str(exc))) from None
    except OSError as exc:
        raise CliError(f"cannot read {paths.uri}: {describe(exc)}") from None
    fallback = _fallback_note(paths, state)
    if fallback:
        print(f"warning: {fallback}", file=sys.stderr)
    lease = read_lease(paths)
    alive, why = lease.liveness() if lease is not None else (False, "")
    if state.status == "RUNNING" and not alive:
        state = state.without_driver()

    view = ExperimentView.from_state(state, path=paths.uri, metric=args.metric)
    owner = _owner_line(paths, state, lease, alive, why)
    resume = resume_hint(paths, state) if state.status == "INTERRUPTED" else None
    if args.json:
        driver = None
        if lease is not None:
            driver = {"pid": lease.pid, "host": lease.host, "alive": alive, "why": why,
                      "line": owner}
        print_json(experiment_json(view, state, driver=driver, resume_line=resume,
                                   supervisor_log=_supervisor_log(paths)))
        return EXIT_OK

    max_rows = len(view.rows) if args.all else DEFAULT_MAX_ROWS
    print(render_table(view, max_rows=max(max_rows, 1)))
    if len(view.rows) > max_rows:
        print("(--all shows every trial)")
    print(f"Updated {local_time(state.updated)}  {paths.uri}")
    if owner:
        print(owner)
    if resume and (not owner or "Resume with" not in owner):
        print(f"Resume it with: {resume}")
    if args.metric and not any(args.metric in (t.last_result or {}) for t in state.trials):
        reported = sorted({k for t in state.trials for k in (t.last_result or {})})
        known = ", ".join(reported) if reported else "none yet"
        print(
            f"note: no trial has reported a metric named {args.metric!r} (reported: {known})",
            file=sys.stderr,
        )
    return EXIT_OK


def resume_hint(paths: ExperimentPaths, state: ExperimentState) -> str:
    """The line that resumes an interrupted experiment, as a terminal user can use it."""
    from ..monitor import default_resume_line

    if state.settings.get("origin"):
        return default_resume_line(paths, state)
    return (f"ftnb.Tuner.restore({paths.uri!r}, <trainable>).fit(), or run the same "
            "ftnb.run(...) again")


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
    return f"Driver: {lease.describe()}, gone ({why}). Resume with {resume_hint(paths, state)}"


def _supervisor_log(paths: ExperimentPaths) -> Optional[str]:
    from ..handle import ExperimentHandle

    return ExperimentHandle(paths).supervisor_log


# -- finding an experiment ---------------------------------------------------------------------
def find_experiment(target: str, storage_path: Optional[str] = None) -> ExperimentPaths:
    """The experiment a command names, as :func:`ftnb.attach` finds it: a folder (a path or a
    URL), or a name under ``storage_path`` (default ``$FTNB_STORAGE_PATH``, else
    ``~/ftnb_results``). A bare name that is not there but is a folder here is that folder (as
    ``ftnb status`` always took it). A :class:`CliError` says what is there instead."""
    from ..handle import names_a_folder

    if names_a_folder(target):
        return _find_at(target)
    where, shown = _storage_shown(storage_path)
    shown = shown.replace("; pass a STORAGE path to look elsewhere", "")
    storage = open_storage(where)
    candidate = ExperimentPaths.of(storage, target)
    if _has_state(storage, candidate.dir):
        return candidate
    if storage_path is None and os.path.exists(target):
        return _find_at(target)
    if not _exists(storage, storage.root):
        raise CliError(f"no experiment named {target!r}: the storage path {shown} does not "
                       "exist. Fix: give the storage (--storage PATH) or the experiment's folder")
    names = [n for n in _visible(storage.listdir(storage.root))
             if _has_state(storage, storage.join(storage.root, n))]
    close = difflib.get_close_matches(target, names, n=1)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    raise CliError(f"no experiment named {target!r} under {shown}.{guess} Fix: `ftnb ls "
                   f"{where}` lists them; give another storage with --storage PATH, or the "
                   "experiment's folder")


def _find_at(where: str) -> ExperimentPaths:
    """The experiment whose folder is ``where``, or a CliError that says what is there."""
    storage = open_storage(where)
    root = storage.root
    if not _exists(storage, root):
        raise CliError(f"{where} does not exist")
    if not _isdir(storage, root):
        base = root.replace(os.sep, "/").rsplit("/", 1)[-1]
        if base in (STATE_FILE, STATE_BACKUP_FILE):  # `ftnb status exp/experiment_state.json`
            return _find_at(where.rstrip("/").rsplit("/", 1)[0] if "/" in where else ".")
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
    parent = storage.parent(root)
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


# -- storage helpers ---------------------------------------------------------------------------
def open_storage(where: str) -> Storage:
    """``Storage(where)``, or a CliError for a URL that cannot be opened."""
    try:
        return Storage(where)
    except ImportError as exc:  # s3:// without s3fs, gs:// without gcsfs, ...
        raise CliError(f"cannot open {where}: {one_line(str(exc))}") from None
    except ValueError as exc:  # an unknown protocol
        raise CliError(f"cannot open {where}: {one_line(str(exc))}") from None


def _exists(storage: Storage, path: str) -> bool:
    # The first touch of the storage: any backend failure here (no credentials, no network,
    # permission denied) is about the user's path or environment, not a bug.
    try:
        return storage.exists(path)
    except Exception as exc:
        raise CliError(f"cannot read {storage.uri(path)}: {describe(exc)}") from None


def _isdir(storage: Storage, path: str) -> bool:
    try:
        return storage.isdir(path)
    except Exception as exc:
        raise CliError(f"cannot read {storage.uri(path)}: {describe(exc)}") from None


def _has_state(storage: Storage, folder: str) -> bool:
    """Whether ``folder`` holds an experiment (its state, or at least the previous generation)."""
    try:
        return ExperimentPaths(storage, folder).has_state()
    except Exception:
        return False


def _visible(names: list[str]) -> list[str]:
    # Hidden entries are ftnb's own temporaries (write probes, half-written files) or the OS's.
    return [n for n in names if not n.startswith(".")]
