"""``ftnb logs`` and ``ftnb watch``: an experiment's output and its live table, in a terminal.

Both read the experiment directory only (any machine that sees its storage), and with
``--follow`` / ``watch`` keep reading until the experiment (or the trial) ends; Ctrl+C stops the
reading, never the experiment. Their exit code then says how it ended (0 FINISHED, 1 ERRORED,
130 interrupted).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any, Optional

from ..core.records import FINISHED_STATUSES, ExperimentStatus, TrialStatus
from ..run_options import CommandSpec, opt, storage_option, target_option
from ..wording import plural
from .exits import EXIT_ERRORED, EXIT_INTERRUPTED, EXIT_OK, CliError
from .output import print_json
from .running import CLI

__all__ = ["LOGS", "WATCH", "cmd_logs", "cmd_watch", "progress_line"]


_TARGET = target_option()
_STORAGE = storage_option(CLI)

LOGS = CommandSpec(
    "logs",
    """Print an experiment's log: its supervisor's (which has every trial's output), or, for
    an experiment run in the foreground, every trial's output; with --trial, one trial's stdout
    (to stdout) and stderr (to stderr).

    ftnb logs sweep1 --follow
    ftnb logs sweep1 --trial 3f2a1_00002 2>/dev/null
    """,
    (
        _TARGET,
        opt("--trial", metavar="ID", help="only this trial's stdout and stderr"),
        opt("-f", "--follow", action="store_true",
            help="keep printing new lines until the experiment (or the trial) ends; Ctrl+C "
                 "stops the printing, not the experiment"),
        _STORAGE,
        opt("--json", action="store_true",
            help='one JSON object per line: {"source", "trial_id", "stream", "line"}'),
    ),
)

WATCH = CommandSpec(
    "watch",
    """Show an experiment's live table until it ends: progress, trial counts, failures, a row
    per trial. On a terminal it is redrawn in place; otherwise (a pipe, a file, a job's log) a
    new table is printed when something changed. Ctrl+C stops watching, not the experiment.

    ftnb watch sweep1
    ftnb watch sweep1 --json | jq .counts
    """,
    (
        _TARGET,
        _STORAGE,
        opt("--metric", metavar="NAME", help="the metric shown first"),
        opt("--interval", type=float, default=1.0, metavar="SECONDS",
            help="how often to read it (default 1; at least 2 on object stores)"),
        opt("--all", action="store_true",
            help="show every trial (default: as many as fit the terminal, errored and running "
                 "first)"),
        opt("--json", action="store_true",
            help="one JSON object per line (as `ftnb status --json`) whenever it changed"),
    ),
)


# -- reading a growing file -----------------------------------------------------------------------
class _Tail:
    """Follows one text file on any storage from the last complete line read; a file that
    shrank (replaced by a new upload) is read again from the start."""

    def __init__(self, storage: Any, path: str) -> None:
        self.storage = storage
        self.path = path
        self.offset = 0
        self.pending = b""

    def read(self) -> list[str]:
        """The complete lines written since the last read."""
        chunk = self._chunk()
        if not chunk:
            return []
        self.pending += chunk
        end = self.pending.rfind(b"\n") + 1
        if not end:
            return []
        done, self.pending = self.pending[:end], self.pending[end:]
        return done.decode("utf-8", "replace").splitlines()

    def rest(self) -> list[str]:
        """The last line when the file does not end with a newline (read once it is done)."""
        lines = self.read()
        if self.pending:
            lines.append(self.pending.decode("utf-8", "replace"))
            self.pending = b""
        return lines

    def _chunk(self) -> bytes:
        try:
            start, data = self.storage.read_from(self.path, self.offset)
        except (FileNotFoundError, IsADirectoryError):
            return b""
        if start != self.offset:  # it shrank: a new file, read from its start
            self.offset, self.pending = start, b""
        self.offset += len(data)
        return data


class _Source:
    """One file whose lines are printed, and how: ``label`` prefixes them (as the supervisor
    log prefixes the trials' output), ``stream`` is where they go."""

    def __init__(self, tail: _Tail, *, source: str, trial_id: Optional[str], stream: str,
                 label: str = "") -> None:
        self.tail, self.source, self.trial_id = tail, source, trial_id
        self.stream, self.label = stream, label

    def emit(self, lines: list[str], as_json: bool) -> None:
        for line in lines:
            if as_json:
                print_json({"source": self.source, "trial_id": self.trial_id,
                            "stream": self.stream, "line": line}, indent=None)
                continue
            # One trial's stderr goes to stderr; a labelled line says its stream itself.
            out = sys.stderr if self.stream == "stderr" and not self.label else sys.stdout
            out.write(self.label + line + "\n")
        if lines and not as_json:
            sys.stdout.flush()
            sys.stderr.flush()


# -- ftnb logs ------------------------------------------------------------------------------------
def cmd_logs(args: argparse.Namespace) -> int:
    """``ftnb logs NAME_OR_PATH [--trial ID] [--follow]``."""
    from ..handle import ExperimentHandle
    from .listing import find_experiment

    handle = ExperimentHandle(find_experiment(args.target, args.storage_path))
    state = handle.state()
    if args.trial is not None:
        trial = next((t for t in state.trials if t.trial_id == args.trial), None)
        if trial is None:
            ids = [t.trial_id for t in state.trials]
            shown = ", ".join(ids[:5]) + (f" ... ({len(ids)} trials)" if len(ids) > 5 else "")
            raise CliError(f"ftnb logs: experiment {handle.name!r} has no trial "
                           f"{args.trial!r}. Its trials: {shown}")
        sources = _trial_sources(handle, trial, labelled=False)
    else:
        sources = _supervisor_source(handle)
    trials_known = {t.trial_id for t in state.trials}
    interval = handle.paths.storage.poll_interval_s
    while True:
        live = handle.is_live() if args.follow else False
        for src in sources:
            src.emit(src.tail.read(), args.json)
        if not live:
            break
        if args.trial is not None and _trial_status(handle, args.trial) in FINISHED_STATUSES:
            break
        if args.trial is None and sources and sources[0].source == "trial":
            # No supervisor: every trial's output; pick up trials that appeared since.
            now = handle.state().trials
            for t in now:
                if t.trial_id not in trials_known:
                    trials_known.add(t.trial_id)
                    sources += _trial_sources(handle, t, labelled=True)
        time.sleep(interval)
    if args.follow and args.trial is None:
        handle.wait_for_supervisor_exit()  # its last lines come after the driver let go
    for src in sources:
        src.emit(src.tail.rest(), args.json)
    if not args.follow:
        return EXIT_OK
    if args.trial is not None:
        status = _trial_status(handle, args.trial)
        if status == TrialStatus.TERMINATED:
            return EXIT_OK
        return EXIT_ERRORED if status == TrialStatus.ERRORED else EXIT_INTERRUPTED
    from .running import exit_code_of

    return exit_code_of(handle.status())


def _supervisor_source(handle: Any) -> list[_Source]:
    """The supervisor's log, or (no supervisor ran it) every trial's output, labelled."""
    from ..system.processes import host_id
    from ..ui.read_model import supervisor_record

    storage = handle.paths.storage
    record = supervisor_record(handle.paths)
    if record or storage.exists(handle.paths.supervisor_log):
        if storage.exists(handle.paths.supervisor_log):
            tail = _Tail(storage, handle.paths.supervisor_log)
        elif record.get("log") and record.get("host_id") == host_id() and \
                os.path.exists(record["log"]):
            from ..storage import Storage

            tail = _Tail(Storage(os.path.dirname(record["log"])), record["log"])
        else:
            raise CliError(
                f"ftnb logs: the supervisor of {handle.name!r} keeps its log on "
                f"{record.get('host', 'its machine')} ({record.get('log')}) until the experiment "
                "ends, when it is uploaded. Fix: run `ftnb logs` there, or read one trial's "
                "output: --trial ID"
            )
        return [_Source(tail, source="supervisor", trial_id=None, stream="log")]
    sources: list[_Source] = []
    for trial in handle.state().trials:
        sources += _trial_sources(handle, trial, labelled=True)
    return sources


def _trial_sources(handle: Any, trial: Any, labelled: bool) -> list[_Source]:
    files = handle.paths.trial(trial.dir_name)
    storage = handle.paths.storage
    out = []
    for stream, path in (("stdout", files.stdout), ("stderr", files.stderr)):
        label = ""
        if labelled:  # the supervisor log's own prefixes (ftnb.ui.terminal.TerminalReporter)
            label = f"({trial.trial_id}) " if stream == "stdout" else f"({trial.trial_id} stderr) "
        out.append(_Source(_Tail(storage, path), source="trial", trial_id=trial.trial_id,
                           stream=stream, label=label))
    return out


def _trial_status(handle: Any, trial_id: str) -> Optional[str]:
    for trial in handle.state().trials:
        if trial.trial_id == trial_id:
            return trial.status
    return None


# -- ftnb watch -----------------------------------------------------------------------------------
def cmd_watch(args: argparse.Namespace) -> int:
    """``ftnb watch NAME_OR_PATH``: the live table until the experiment ends."""
    from ..ui.monitor import ExperimentMonitor
    from ..ui.read_model import ResumeContext
    from .listing import find_experiment
    from .running import exit_code_of

    if not args.interval > 0:
        raise CliError(f"ftnb watch: --interval {args.interval} must be a number of seconds > 0. "
                       "Fix: --interval 1")
    paths = find_experiment(args.target, args.storage_path)
    monitor = ExperimentMonitor(paths, metric=args.metric, resume_context=ResumeContext.TERMINAL)
    interval = max(args.interval, paths.storage.poll_interval_s)
    screen = _Screen() if (sys.stdout.isatty() and not args.json) else None
    shown_generation = shown_silent = None
    last_print = 0.0
    try:
        while True:
            snap = monitor.poll()
            # A driver falling silent changes no file, hence not the generation: a change too.
            silent = snap.takeover is not None
            changed = snap.generation != shown_generation or silent != shown_silent
            shown_silent = silent
            if args.json:
                if changed or snap.finished:
                    print_json(snapshot_json(snap), indent=None)
            elif screen is not None:
                screen.draw(watch_text(snap, screen.size, args.all, live=not snap.finished))
            elif (changed and time.monotonic() - last_print >= max(interval, 2.0)) \
                    or snap.finished:
                print(watch_text(snap, None, args.all, live=False) + "\n", flush=True)
                last_print = time.monotonic()
            shown_generation = snap.generation
            if snap.finished:
                return exit_code_of(snap.status)
            time.sleep(interval)
    except KeyboardInterrupt:
        if screen is not None:
            screen.leave()
        print(f"ftnb: stopped watching; experiment {paths.name!r} goes on (`ftnb stop "
              f"{paths.name}` stops it)", file=sys.stderr)
        raise


def snapshot_json(snap: Any) -> dict:
    """A snapshot as ``ftnb status --json`` writes an experiment, with its progress line."""
    data = snap.experiment_json()
    data["progress"] = progress_line(snap.view, snap.state)
    return data


def progress_line(view: Any, state: Any, width: int = 24) -> str:
    """One line a person reads at a glance: a bar, how many trials ended, run, wait."""
    counts = view.counts
    total = len(view.rows)
    ended = counts.get(TrialStatus.TERMINATED, 0) + counts.get(TrialStatus.ERRORED, 0)
    done = ended / total if total else 0.0
    limit = _iteration_limit(state)
    if limit and total:  # known iterations: a finer bar
        done = sum(min(r.iteration, limit) if r.status not in FINISHED_STATUSES else limit
                   for r in view.rows) / (limit * total)
    filled = int(round(done * width))
    parts = [f"{ended}/{total} trials ended"]
    if counts.get(TrialStatus.ERRORED):
        parts[0] += f" ({counts['ERRORED']} errored)"
    for status, word in ((TrialStatus.RUNNING, "running"), (TrialStatus.PENDING, "pending"),
                         (TrialStatus.PAUSED, "paused"), (ExperimentStatus.INTERRUPTED, "interrupted")):
        if counts.get(status):
            parts.append(f"{counts[status]} {word}")
    if view.total_failures or view.total_preemptions:
        parts.append(f"{plural(view.total_failures, 'failure')}, "
                     f"{plural(view.total_preemptions, 'preemption')}")
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:4.0%}  " + ", ".join(parts)


def _iteration_limit(state: Any) -> Optional[int]:
    stop = state.settings.get("stop")
    if isinstance(stop, dict):
        value = stop.get("training_iteration")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
            return int(value)
    return None


def watch_text(snap: Any, size: Optional[os.terminal_size], show_all: bool,
               live: bool) -> str:
    """One frame: the progress line, the table (cut to the terminal), the latest group failures
    of a few trials (data-parallel trials: first failing rank, the others, the restart), the
    driver, and how to resume it when it is interrupted."""
    from ..ui.failures import group_failures_text
    from ..ui.view import render_table

    failures = group_failures_text(snap.state.trials, traceback_lines=0, max_trials=3)
    lines_after = failures.splitlines()
    lines_after += [snap.driver] if snap.driver else []
    if snap.takeover is not None:
        lines_after.append(f"Take it over now with: {snap.takeover}")
    if snap.storage_fault_line:
        lines_after.append(snap.storage_fault_line)
    if snap.status == ExperimentStatus.INTERRUPTED:
        lines_after.append(f"Resume it with: {snap.resume_line}")
    if live:
        lines_after.append(f"{time.strftime('%H:%M:%S')}  Ctrl+C stops watching, not the "
                           "experiment")
    max_rows = len(snap.view.rows)
    if size is not None and not show_all:
        max_rows = max(1, size.lines - 7 - len(lines_after))
    text = "\n".join([progress_line(snap.view, snap.state),
                      render_table(snap.view, max_rows=max(max_rows, 1)), *lines_after])
    if size is not None:
        text = "\n".join(line[: max(size.columns - 1, 10)] for line in text.splitlines())
    return text


class _Screen:
    """Redraws a frame in place on a terminal: back up over the last frame, clear, write."""

    def __init__(self, out: Any = None) -> None:
        self.out = out or sys.stdout
        self.height = 0

    @property
    def size(self) -> os.terminal_size:
        return shutil.get_terminal_size()

    def draw(self, text: str) -> None:
        prefix = f"\x1b[{self.height}F\x1b[J" if self.height else ""
        self.out.write(prefix + text + "\n")
        self.out.flush()
        self.height = text.count("\n") + 1

    def leave(self) -> None:
        self.out.write("\n")
        self.out.flush()
