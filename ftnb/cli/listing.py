"""``ftnb ls`` and ``ftnb status``, and how every verb finds the experiment it is given.

Both verbs only read (ARCHITECTURE.md, principle 7): they are safe against a running experiment,
from any machine that sees its storage. What they show comes from :mod:`ftnb.ui.read_model` (what
is at a path, the status as read, the trials, the resume line); this module words it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from typing import TYPE_CHECKING, Optional

from ..core.records import ExperimentState, ExperimentStatus, StateFormatError, TrialStatus
from ..storage import STATE_BACKUP_FILE, STATE_FILE, ExperimentPaths, Storage, default_storage_path
from ..wording import ftnb_command
from .exits import EXIT_OK, CliError, describe, one_line
from .output import columns, local_time, print_json

if TYPE_CHECKING:
    from ..ui.read_model import ExperimentSnapshot, ListedExperiment, Location

__all__ = ["DEFAULT_MAX_ROWS", "cmd_ls", "cmd_status", "find_experiment", "list_experiments",
           "open_storage"]

DEFAULT_MAX_ROWS = 50
#: The trial counts ``ftnb ls`` shows, with their headers: INTERRUPTED counts the trials that
#: were running when their driver died (they continue on a resume).
_STATUSES = (TrialStatus.PENDING, TrialStatus.RUNNING, ExperimentStatus.INTERRUPTED,
             TrialStatus.PAUSED, TrialStatus.TERMINATED, TrialStatus.ERRORED)
_STATUS_HEADERS = ("PEND", "RUN", "INTR", "PAUSE", "TERM", "ERR")


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
    driver_silent_s: Optional[float] = None
    driver_dead_in_s: Optional[float] = None
    #: While it runs under a supervisor: its launcher and where it runs
    #: (:func:`ftnb.ui.status.supervisor_line`, without "Supervisor: "); else None.
    supervisor: Optional[str] = None


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


def list_experiments(given: Optional[str] = None, *, as_json: bool = False,
                     newest_first: bool = False) -> int:
    """Print the experiments under the storage path ``given`` (default: the default storage)
    as ``ftnb ls`` does (``%ftls`` too); raise :class:`CliError` for a bad path. A terminal
    lists the newest last (next to the prompt); ``newest_first`` (``%ftls``: a cell's output
    is read from the top) lists it first. A storage
    folder is listed through its index (:func:`ftnb.ui.read_model.list_folder`): a few
    requests for a folder of ended experiments, wherever it is."""
    from ..ui import read_model

    where, shown = _storage_shown(given)
    storage = open_storage(where)
    found = _ls_target(storage)
    if found == "missing":
        raise CliError(f"storage path {shown} does not exist")
    if found == "file":
        raise CliError(f"storage path {where} is a file, not a folder")

    listed: list[_Listed] = []
    if found == "experiment":
        # The path is itself an experiment: show it rather than "nothing here".
        print(
            f"note: {where} is itself an experiment folder; `{ftnb_command()} status {where}` shows its "
            "trials",
            file=sys.stderr,
        )
        one = read_model.read_experiment(ExperimentPaths(storage, storage.root))
        listed = [_listed(one)] if one is not None else []
    else:
        try:
            listed = [_listed(e) for e in read_model.list_folder(storage, storage.root)]
        except Exception as exc:
            raise CliError(f"cannot read {storage.uri(storage.root)}: {describe(exc)}") from None

    for e in listed:
        _add_supervisor(storage, e)
    readable = sorted((e for e in listed if e.error is None), key=lambda e: (e.updated, e.name),
                      reverse=newest_first)
    broken = sorted((e for e in listed if e.error is not None), key=lambda e: e.name)
    listed = readable + broken  # the ones that need attention at the very end

    if as_json:
        print_json([dataclasses.asdict(e) for e in listed])
        return EXIT_OK
    if not listed:
        print(f"No experiments under {where}")
        return EXIT_OK
    print(_render_ls(listed))
    silent = [e for e in listed if e.driver_silent_s is not None]
    supervised = [e for e in listed if e.supervisor is not None and e.driver_silent_s is None]
    if silent or supervised:
        print()
        for e in supervised:  # where each running one runs
            print(f"{e.name}: {e.supervisor}")
        for e in silent:
            print(f"{e.name}: {_silence(e.driver_silent_s, e.driver_dead_in_s)}; `{ftnb_command()} status "
                  f"{e.name}` says how to take it over now")
    if broken:
        print()
        for e in broken:
            print(f"{e.name}: UNREADABLE: {e.error}")
    return EXIT_OK


def _add_supervisor(storage: Storage, entry: _Listed) -> None:
    """For a RUNNING experiment only (one read each: the listing reads no other experiment's
    files), the supervisor that runs it, if one does: its launcher and where it runs."""
    from ..ui.read_model import supervisor_record
    from ..ui.status import supervisor_line

    if entry.status != ExperimentStatus.RUNNING or entry.error is not None:
        return
    record = supervisor_record(ExperimentPaths.at(entry.path, storage.user_filesystem))
    if record.get("ended") is None:  # a supervisor that ended runs it no more
        entry.supervisor = supervisor_line(record).removeprefix("Supervisor: ") or None


def _ls_target(storage: Storage) -> str:
    """What ``ftnb ls`` was given: "missing", "file", "experiment" or "folder" (three requests
    at most, never one per experiment). Any backend failure (no credentials, no network,
    permission denied) is about the user's path or environment, not a bug: a CliError."""
    from ..ui import read_model

    root = storage.root
    try:
        if not storage.exists(root):
            return "missing"
        if not storage.isdir(root):
            return "file"
        return "experiment" if read_model.is_experiment(storage, root) else "folder"
    except Exception as exc:
        raise CliError(f"cannot read {storage.uri(root)}: {describe(exc)}") from None


def _listed(listed: "ListedExperiment") -> _Listed:
    """One row of ``ftnb ls``."""
    paths, summary = listed.paths, listed.summary
    if summary is not None:
        return _Listed(**dataclasses.asdict(summary))
    exc = listed.error
    if isinstance(exc, StateFormatError):
        return _Listed(paths.name, paths.uri, "UNREADABLE", error=_short_reason(str(exc), paths))
    return _Listed(paths.name, paths.uri, "UNREADABLE", error=describe(exc))


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
        status = e.status if e.driver_silent_s is None else f"{e.status} (silent)"
        rows.append(
            [e.name, status, str(e.trials)]
            + [str(e.counts.get(s, 0)) for s in _STATUSES]
            + [str(e.failures), str(e.preemptions), local_time(e.updated)]
        )
    return columns(header, rows, right)


# -- ftnb status -------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    """``ftnb status NAME_OR_PATH [--storage PATH] [--metric M] [--all] [--json]``: the
    table, then (data-parallel trials) each trial's latest group failure: which rank failed
    first with the end of its traceback, how the other ranks ended, how long the restart
    took."""
    from ..ui import read_model
    from ..ui.failures import group_failures_text
    from ..ui.read_model import ResumeContext
    from ..ui.view import render_table

    paths = find_experiment(args.target, args.storage_path)
    try:
        snap = read_model.read_snapshot(paths, metric=args.metric,
                                        resume_context=ResumeContext.TERMINAL)
    except StateFormatError as exc:
        raise CliError(one_line(str(exc))) from None
    except OSError as exc:
        raise CliError(f"cannot read {paths.uri}: {describe(exc)}") from None
    state, view = snap.state, snap.view
    fallback = _fallback_note(paths, state)
    if fallback:
        print(f"warning: {fallback}", file=sys.stderr)
    if args.json:
        print_json(snap.experiment_json())
        return EXIT_OK

    max_rows = len(view.rows) if args.all else DEFAULT_MAX_ROWS
    print(render_table(view, max_rows=max(max_rows, 1)))
    if len(view.rows) > max_rows:
        print("(--all shows every trial)")
    failures = group_failures_text(state.trials)  # "" unless trials are groups of ranks
    if failures:
        print(failures)
    print(f"Updated {local_time(state.updated)}  {paths.uri}")
    if snap.supervisor_line:  # the launcher it was started with, and where it runs
        print(snap.supervisor_line)
    owner = _owner_line(snap)
    if owner:
        print(owner)
    if snap.storage_fault_line:
        print(snap.storage_fault_line)
    if snap.status == ExperimentStatus.INTERRUPTED and (not owner or "Resume with" not in owner):
        print(f"Resume it with: {snap.resume_line}")
    if args.metric and not any(args.metric in (t.last_result or {}) for t in state.trials):
        reported = sorted({k for t in state.trials for k in (t.last_result or {})})
        known = ", ".join(reported) if reported else "none yet"
        print(
            f"note: no trial has reported a metric named {args.metric!r} (reported: {known})",
            file=sys.stderr,
        )
    return EXIT_OK


def _owner_line(snap: "ExperimentSnapshot") -> Optional[str]:
    """Who drives the experiment, and how to resume it if that driver is gone; None for a
    stopped experiment whose driver let go (or died after saving it)."""
    driver, status = snap.driver_status, snap.status
    lease = driver.lease
    if lease is None or ExperimentStatus(status).is_finished() and lease.released:
        return None
    if snap.takeover is not None:
        return (f"Driver: {lease.describe()}, silent ({driver.why}). Take it over now "
                f"with: {snap.takeover}")
    if driver.alive:
        return f"Driver: {lease.describe()}, alive ({driver.why})"
    if ExperimentStatus(status).is_finished():
        return None
    return f"Driver: {lease.describe()}, gone ({driver.why}). Resume with {snap.resume_line}"


def _silence(silent_s: float, dead_in_s: Optional[float]) -> str:
    """``its driver has been silent for 25 s (it counts as dead in 35 s)``."""
    when = (f"it counts as dead in {dead_in_s:.0f} s" if dead_in_s is not None
            else "stopped on this machine, it never counts as dead on its own")
    return f"its driver has been silent for {silent_s:.0f} s ({when})"


# -- finding an experiment ---------------------------------------------------------------------
def find_experiment(target: str, storage_path: Optional[str] = None) -> ExperimentPaths:
    """The experiment a command names, as :func:`ftnb.attach` finds it: a folder (a path or a
    URL), or a name under ``storage_path`` (default ``$FTNB_STORAGE_PATH``, else
    ``~/ftnb_results``). A bare name that is not there but is a folder here is that folder (as
    ``ftnb status`` always took it). A :class:`CliError` says what is there instead."""
    from ..ui import read_model
    from ..ui.read_model import Found

    if read_model.names_a_folder(target):
        return _find_at(target)
    where, shown = _storage_shown(storage_path)
    shown = shown.replace("; pass a STORAGE path to look elsewhere", "")
    storage = open_storage(where)
    candidate = ExperimentPaths.of(storage, target)
    if read_model.is_experiment(storage, candidate.dir):
        return candidate
    if storage_path is None and os.path.exists(target):
        return _find_at(target)
    location = _locate(storage)
    if location.found is Found.MISSING:
        raise CliError(f"no experiment named {target!r}: the storage path {shown} does not "
                       "exist. Fix: give the storage (--storage PATH) or the experiment's folder")
    close = difflib.get_close_matches(target, location.names if location.found is Found.STORAGE
                                      else [], n=1)
    guess = f" Did you mean {close[0]!r}?" if close else ""
    raise CliError(f"no experiment named {target!r} under {shown}.{guess} Fix: `{ftnb_command()} ls "
                   f"{where}` lists them; give another storage with --storage PATH, or the "
                   "experiment's folder")


def _find_at(where: str) -> ExperimentPaths:
    """The experiment whose folder is ``where``, or a CliError that says what is there."""
    from ..ui.read_model import Found

    location = _locate(open_storage(where))
    found = location.found
    if location.experiment is not None:
        return location.experiment
    if found is Found.MISSING:
        raise CliError(f"{where} does not exist")
    if found is Found.STATE_FILE:  # `ftnb status exp/experiment_state.json`: its folder
        return _find_at(where.rstrip("/").rsplit("/", 1)[0] if "/" in where else ".")
    if found is Found.FILE:
        raise CliError(f"{where} is a file, not an experiment folder")
    if found is Found.EMPTY:
        raise CliError(f"{where} is an empty folder, not an experiment (no {STATE_FILE})")
    if found is Found.STORAGE:
        experiments = location.names
        some = ", ".join(experiments[:3]) + (", ..." if len(experiments) > 3 else "")
        plural = "experiment" if len(experiments) == 1 else "experiments"
        first = ExperimentPaths.of(location.storage, experiments[0], where)  # as written
        raise CliError(
            f"{where} has no {STATE_FILE}: it is a storage folder holding "
            f"{len(experiments)} {plural} ({some}). Fix: `{ftnb_command()} ls {where}` lists them; "
            f"`{ftnb_command()} status {first.dir}` shows one"
        )
    if found is Found.TRIAL:
        shown = where.rstrip("/").rsplit("/", 1)[0] if "/" in where.rstrip("/") else "."
        raise CliError(
            f"{where} is a trial folder, not an experiment folder. Fix: `{ftnb_command()} status {shown}` "
            "shows the experiment it belongs to"
        )
    names = location.names
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


def _locate(storage: Storage) -> "Location":
    """What is at the storage's root. Any backend failure (no credentials, no network,
    permission denied) is about the user's path or environment, not a bug: a CliError."""
    from ..ui import read_model

    try:
        return read_model.locate(storage)
    except Exception as exc:
        raise CliError(f"cannot read {storage.uri(storage.root)}: {describe(exc)}") from None
