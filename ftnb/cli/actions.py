"""``ftnb stop`` and ``ftnb rm``: act on an experiment from a terminal.

A stop is a control request to the experiment's driver (:mod:`ftnb.storage.control`),
wherever it runs (a supervisor, a foreground ``ftnb run``, a script's ``fit()``): the
experiment ends INTERRUPTED, resumable. A silent driver (:class:`ftnb.handle.DriverSilentError`)
is said at once, with the takeover line; waited for, that is exit code 1 (it is not stopped
yet). ``rm`` refuses an experiment that a live driver holds, asks first, and
removes through ftnb's storage (local folders and object stores alike).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from ..core.records import ExperimentStatus, TrialStatus
from ..run_options import CommandSpec, amount, opt, storage_option, target_option
from ..wording import ftnb_command, plural
from .exits import EXIT_ERRORED, EXIT_OK, CliError, one_line
from .output import print_json
from .running import CLI

__all__ = ["RM", "STOP", "cmd_rm", "cmd_stop"]

_TARGET = target_option()
_STORAGE = storage_option(CLI)

STOP = CommandSpec(
    "stop",
    """Stop an experiment cleanly (INTERRUPTED: `ftnb resume NAME` resumes it), or one trial
    (it ends TERMINATED; the others go on).

    ftnb stop sweep1
    ftnb stop sweep1 --trial 3f2a1_00002
    """,
    (
        _TARGET,
        opt("--trial", metavar="ID", help="stop only this trial"),
        _STORAGE,
        opt("--no-wait", dest="wait", action="store_false",
            help="return once the request is sent, not once it has stopped"),
        opt("--timeout", type=amount, default=60.0, metavar="SECONDS",
            help="how long to wait for it to stop (default 60)"),
        opt("--json", action="store_true", help="print the outcome as a JSON object"),
    ),
)

RM = CommandSpec(
    "rm",
    """Remove an experiment's folder and everything in it (results, checkpoints, logs).
    Refuses one that is running; asks first unless --yes.

    ftnb rm sweep1
    ftnb rm s3://bucket/runs/old_sweep --yes
    """,
    (
        _TARGET,
        _STORAGE,
        opt("-y", "--yes", action="store_true",
            help="do not ask (needed when stdin is not a terminal)"),
        opt("--json", action="store_true", help="print the outcome as a JSON object"),
    ),
)


def _handle(args: argparse.Namespace) -> Any:
    from ..handle import ExperimentHandle
    from .listing import find_experiment

    return ExperimentHandle(find_experiment(args.target, args.storage_path))


# -- ftnb stop ------------------------------------------------------------------------------------
def cmd_stop(args: argparse.Namespace) -> int:
    """``ftnb stop NAME_OR_PATH [--trial ID]``."""
    from ..ui.read_model import ResumeContext, resume_line

    handle = _handle(args)
    out = sys.stderr if args.json else sys.stdout
    if args.trial:
        return _stop_trial(handle, args, out)
    was_live = handle.is_live()
    if was_live:
        from ..handle import DriverSilentError

        try:
            handle.stop(wait=args.wait, timeout=args.timeout)
            silent = None if args.wait else handle.silent_driver(ResumeContext.TERMINAL)
        except DriverSilentError as exc:  # at once: it may never read the request
            silent = handle.silent_driver(ResumeContext.TERMINAL) or exc
        except TimeoutError as exc:
            raise CliError(one_line(str(exc)).removeprefix("ftnb: "), EXIT_ERRORED) from None
        if silent is not None:
            return _silent_stop(handle, args, silent, out)
    status = handle.status()
    state = handle.state()
    resume = (resume_line(handle.paths, state, ResumeContext.TERMINAL)
              if status == ExperimentStatus.INTERRUPTED else None)
    if args.json:
        print_json({"name": handle.name, "path": handle.path, "trial_id": None,
                    "was_running": was_live, "stopped": was_live and not handle.is_live(),
                    "status": status, "resume_line": resume})
    elif not was_live:
        print(f"ftnb: experiment {handle.name!r} is not running ({status}); nothing to stop.",
              file=out)
    elif args.wait:
        print(f"ftnb: stopped {handle.name} ({status}); resume it with: {resume}", file=out)
    else:
        print(f"ftnb: asked {handle.name} to stop (`{ftnb_command()} watch {handle.name}` shows when it "
              "has)", file=out)
    return EXIT_OK


def _silent_stop(handle: Any, args: argparse.Namespace, silent: Any, out: Any) -> int:
    """The stop request is written, but the driver is silent (:class:`ftnb.handle.DriverSilentError`
    ``silent``): say so, and that the experiment is not stopped; waited for, that is an error."""
    if args.json:
        print_json({"name": handle.name, "path": handle.path, "trial_id": args.trial,
                    "was_running": True, "stopped": False, "status": handle.status(),
                    "resume_line": None, "driver_silent_s": silent.silent_s,
                    "driver_dead_in_s": silent.dead_in_s, "takeover": silent.takeover})
    elif args.wait:
        raise CliError(one_line(str(silent)).removeprefix("ftnb: "), EXIT_ERRORED)
    else:
        print(one_line(str(silent)), file=out)
    return EXIT_ERRORED if args.wait else EXIT_OK


def _stop_trial(handle: Any, args: argparse.Namespace, out: Any) -> int:
    def status_of(trial_id: str) -> Any:
        return {t.trial_id: t.status for t in handle.state().trials}.get(trial_id)

    before = status_of(args.trial)
    from ..handle import DriverSilentError
    from ..ui.read_model import ResumeContext

    try:
        handle.stop_trial(args.trial, wait=args.wait, timeout=args.timeout)
        silent = (None if args.wait or _finished(before)
                  else handle.silent_driver(ResumeContext.TERMINAL, args.trial))
    except DriverSilentError as exc:
        silent = handle.silent_driver(ResumeContext.TERMINAL, args.trial) or exc
    except (ValueError, RuntimeError) as exc:  # no such trial; no driver to stop it
        raise CliError(f"ftnb stop: {one_line(str(exc)).removeprefix('ftnb: ')}") from None
    except TimeoutError as exc:
        raise CliError(one_line(str(exc)).removeprefix("ftnb: "), EXIT_ERRORED) from None
    if silent is not None:
        return _silent_stop(handle, args, silent, out)
    after = status_of(args.trial)
    if args.json:
        print_json({"name": handle.name, "path": handle.path, "trial_id": args.trial,
                    "was_running": not _finished(before),
                    "stopped": _finished(after) and before != after,
                    "status": after, "resume_line": None})
    elif _finished(before):
        pass  # stop_trial said it had already ended
    elif args.wait:
        # (as the tables show it: a trial the user stopped reads STOPPED, not TERMINATED)
        from ..ui.view import shown_status

        shown = next((shown_status(t) for t in handle.state().trials
                      if t.trial_id == args.trial), after)
        print(f"ftnb: stopped trial {args.trial} of {handle.name} ({shown})", file=out)
    else:
        print(f"ftnb: asked trial {args.trial} of {handle.name} to stop", file=out)
    return EXIT_OK


# -- ftnb rm --------------------------------------------------------------------------------------
def cmd_rm(args: argparse.Namespace) -> int:
    """``ftnb rm NAME_OR_PATH [--yes]``."""
    from ..storage.lease import live_lease

    handle = _handle(args)
    paths = handle.paths
    _refuse_live(handle, live_lease(paths))
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"ftnb rm {args.target}: not removed: stdin is not a terminal, so it "
                           "cannot ask. Fix: --yes removes it without asking", EXIT_ERRORED)
        try:
            state = handle.state()
            what = f"{handle.status()}, {plural(len(state.trials), 'trial')}"
        except Exception as exc:  # an unreadable experiment can still be removed
            what = f"unreadable: {type(exc).__name__}"
        sys.stderr.write(f"Remove experiment {handle.name!r} ({what}) at {handle.path}, with all "
                         "its results and checkpoints? [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("ftnb: nothing removed.", file=sys.stderr)
            return EXIT_ERRORED
    # Under the owner lock: a driver that starts now waits for the removal, then finds no
    # experiment, instead of losing its folder while it runs.
    with paths.storage.exclusive_lock(paths.lease_lock):
        _refuse_live(handle, live_lease(paths))
        paths.storage.remove(paths.dir, recursive=True)
    if args.json:
        print_json({"name": handle.name, "path": handle.path, "removed": True})
    else:
        print(f"ftnb: removed experiment {handle.name!r} ({handle.path})")
    return EXIT_OK


def _refuse_live(handle: Any, owner: Any) -> None:
    if owner is not None:
        raise CliError(
            f"ftnb rm: experiment {handle.name!r} is running (pid {owner.pid} on {owner.host}); "
            f"not removed. Fix: stop it first: {ftnb_command()} stop {handle.name}"
        )


def _finished(status: Optional[str]) -> bool:
    """Whether a trial's status (None: no such trial) means it will not run again."""
    return status is not None and TrialStatus(status).is_finished()
