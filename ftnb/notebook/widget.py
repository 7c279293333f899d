"""The live experiment widget: ipywidgets and an anywidget chart over an :class:`ExperimentMonitor`.

:class:`ExperimentWidget` is displayed once; from then on only its values change. One
background updater thread polls the experiment's monitor at most twice a second (on object
stores, as often as their :attr:`~ftnb.storage.Storage.poll_interval_s` says: every 2 s), and
sends only what changed, batched (``hold_sync()``; the chart's new points as appends). It
never writes to an ``Output`` widget (``with output:`` from a thread lands in whatever cell runs
then). It stops by itself once a finished experiment's last state is shown, and on
:meth:`ExperimentWidget.close`.

What it shows: a header (status, trials by status, ranks per trial for data-parallel trials,
failures and retries: a resume after a pause is no retry, run time), a table with a row per
trial (a trial a user stopped reads ``STOPPED``), the chosen metric against
``training_iteration`` (:class:`ftnb.notebook.chart.TrialChart`: legend and hover name each
trial's varying hyperparameters, log scale, retries and resumes marked apart), the failures (a
group's: which rank failed first, how the other ranks ended, how long the restart took;
traceback on demand), and controls: stop a trial (by its id), stop the experiment, resume an
interrupted one (with the exact line that does it), take over from a silent driver (a stop it
may never read says so), choose the metric.

**Cullable.** While no front end views it (views report themselves, see
:mod:`ftnb.notebook.chart`) and no cell runs, it sends nothing: the updater only polls, and a
view that opens is caught up at once. So JupyterHub's idle culler can cull a server whose
widget nobody looks at; the experiment goes on (its supervisor is not the kernel's).

**Controls while the kernel is busy.** With ftnb's Jupyter server extension, the front end
sends stops to the server, not the kernel; without it, the widget says that controls wait for
the kernel, and a stop that reaches the kernel after its trial ended is refused, never applied
to another trial.

Outside a notebook the same view is :func:`text_view`. Needs ``ftnb[notebook]``.

(Over 500 lines because its parts, the header, table, chart, failure view and controls, share one
lock and one update path; split, they would each need the other's state.)
"""

from __future__ import annotations

import contextlib
import html
import io
import threading
import time
from typing import Any, Optional

import ipywidgets as widgets
from ipywidgets.widgets.widget_string import HTMLStyle

from ..core.records import ExperimentStatus, StateFormatError, StateVersionError, TrialStatus
from ..storage import is_transient
from ..ui.failures import failure_what, group_lines, is_group_failure
from ..ui.monitor import ExperimentMonitor, ExperimentSnapshot, text_view
from ..ui.view import URGENCY, format_value, params_label, plural, ranks_cell, shown_status
from .chart import StaleHint, TrialChart, at_cell_end
from .table import TrialTable, table_markup

__all__ = ["ExperimentWidget", "text_view"]

LOCAL_INTERVAL_S = 0.5  # at most 2 updates a second (slower where the storage says so)
INTERRUPTED_INTERVAL_S = 5.0  # watch for a resume from elsewhere, cheaply
FIRST_POINTS_INTERVAL_S = 0.1  # until the first points show: on screen soon after %ftrun
DEFAULT_TABLE_ROWS = 50
MAX_FAILURES_SHOWN = 50

_MUTED = "color:var(--jp-ui-font-color2, #666)"


# -- the HTML parts (pure functions of a snapshot) ------------------------------------------------
# Short: the header is sent again each second its run time changes.
_TIMES_TIP = "run time: while a driver ran it; wall: since created, stops included"


def header_html(snap: ExperimentSnapshot) -> str:
    """Status, trials by status, failures and retries, run time (and wall time)."""
    view = snap.view
    counts = ", ".join(
        f"{n} {s}" for s, n in view.counts.items() if n
    ) or "no trials"
    parts = [
        f"<b>{html.escape(view.name)}</b>",
        f"<b class='ftnb-w-s-{html.escape(view.status)}'>{view.status}</b>",
        html.escape(counts),
        *([html.escape(view.ranks_text())] if view.is_group else []),
        f"{plural(view.total_failures, 'failure')}, "
        f"{plural(view.total_retries, 'retry', 'retries')}"
        + (f", {plural(view.total_preemptions, 'preemption')}"
           if view.total_preemptions else ""),
        f"<span title='{_TIMES_TIP}'>{view.times_text()}</span>",
    ]
    line = " &middot; ".join(parts)
    sub = html.escape(snap.path)
    if snap.driver_gone:
        sub += f" &middot; <span class='ftnb-w-s-ERRORED'>{html.escape(snap.driver)}</span>"
    # ftnb-w: the widget's own status colours (static/status.css), AA in light and dark themes.
    return f"<div class='ftnb-w'><div>{line}</div><div class='ftnb-w-sub'>{sub}</div></div>"


def table_columns(snap: ExperimentSnapshot, metric: Optional[str]) -> list[str]:
    """The metric columns of the table: the chosen metric first, then the view's."""
    columns = list(snap.view.metric_columns)
    if metric and metric not in columns:
        columns.insert(0, metric)
    return columns


def table_rows(snap: ExperimentSnapshot, metric: Optional[str],
               max_rows: Optional[int]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the trial table as text cells, the most urgent trials first when cut
    to ``max_rows``."""
    view = snap.view
    metrics = table_columns(snap, metric)
    group = view.is_group  # a column of ranks only where trials are groups
    header = ["trial", "status", *(["ranks"] if group else []), "iter", "attempts", "failures"]
    header += view.param_columns + metrics + ["last error"]
    last_results = {t.trial_id: (t.last_result or {}) for t in snap.state.trials}
    rows = view.rows
    if max_rows is not None and len(rows) > max_rows:
        rows = sorted(rows, key=lambda r: URGENCY.get(r.status, 5))[:max_rows]
    out = []
    for row in rows:
        last = last_results.get(row.trial_id, {})
        failures = str(row.failures) + (f" (+{row.preemptions}p)" if row.preemptions else "")
        cells = [row.trial_id, row.shown_status or row.status,
                 *([ranks_cell(row)] if group else []),
                 str(row.iteration), str(row.attempts), failures]
        cells += [format_value(row.params.get(k)) for k in view.param_columns]
        cells += [format_value(last.get(k)) for k in metrics]
        cells.append(row.last_error)
        out.append(cells)
    return header, out


def table_more(snap: ExperimentSnapshot, max_rows: Optional[int]) -> str:
    """The note under a table cut to ``max_rows`` ("" when every trial is in it)."""
    if max_rows is None or len(snap.view.rows) <= max_rows:
        return ""
    return f"{plural(len(snap.view.rows) - max_rows, 'more trial')} (errored and running first)"


def table_html(snap: ExperimentSnapshot, metric: Optional[str],
               max_rows: Optional[int]) -> str:
    """The trial table as HTML (the widget sends its rows, not this: see
    :mod:`ftnb.notebook.table`)."""
    header, rows = table_rows(snap, metric, max_rows)
    return table_markup(header, rows, table_more(snap, max_rows))


def failure_list(snap: ExperimentSnapshot) -> list[tuple[str, int, Any]]:
    """Every failure as ``(trial_id, index in its trial's list, FailureRecord)``, newest
    first."""
    items = [
        (trial_id, i, f) for trial_id, fs in snap.failures.items() for i, f in enumerate(fs)
    ]
    items.sort(key=lambda item: item[2].time, reverse=True)
    return items


def _when(stamp: float) -> str:
    today = time.strftime("%Y-%m-%d")
    day = time.strftime("%Y-%m-%d", time.localtime(stamp))
    clock = time.strftime("%H:%M:%S", time.localtime(stamp))
    return clock if day == today else f"{day} {clock}"


def failure_label(trial_id: str, failure: Any) -> str:
    """One line per failure: when, trial, attempt, kind, (a group's first failing rank,)
    message."""
    what = failure_what(failure)
    if is_group_failure(failure) and not what.startswith(f"rank {failure.rank} "):
        what = f"rank {failure.rank}: {what}"
    if len(what) > 100:
        what = what[:97] + "..."
    return (f"{_when(failure.time)}  {trial_id}  attempt {failure.attempt} "
            f"(iter {failure.iteration})  {failure.kind}  {what}")


def failures_html(snap: ExperimentSnapshot) -> str:
    """Every failure on a line, newest first; a group's with its ranks and restart below it."""
    items = failure_list(snap)
    if not items:
        return f"<div style='{_MUTED}'>No failures.</div>"
    trials = {t.trial_id: t for t in snap.state.trials}
    lines = []
    for t, _, f in items[:MAX_FAILURES_SHOWN]:
        lines.append(html.escape(failure_label(t, f)))
        lines += [f"<span style='{_MUTED}'>    {html.escape(line)}</span>"
                  for line in group_lines(f, trials.get(t))]
    more = len(items) - MAX_FAILURES_SHOWN
    if more > 0:
        lines.append(f"... and {plural(more, 'earlier failure')}")
    return ("<div style='max-height:200px;overflow:auto;font-family:monospace;font-size:85%;"
            "white-space:pre'>" + "<br>".join(lines) + "</div>")


def _traceback_html(failure: Any, trial: Any = None) -> str:
    text = failure.traceback or failure.describe()
    lines = group_lines(failure, trial)
    if lines:  # a group's: the cause, the other ranks and the restart, then the cause's traceback
        text = "\n".join(lines) + (f"\n\n{failure.traceback}" if failure.traceback else "")
    return ("<pre style='max-height:300px;overflow:auto;font-size:85%;"
            "background:var(--jp-layout-color2, #f7f7f7);color:var(--jp-ui-font-color1, inherit);"
            f"padding:4px'>{html.escape(text)}</pre>")


# -- the widget ----------------------------------------------------------------------------------
_STOPPABLE = (TrialStatus.RUNNING, TrialStatus.PENDING, TrialStatus.PAUSED)


def takeover_offer(snap: ExperimentSnapshot) -> Optional[dict]:
    """The Take over control while the experiment's driver is silent (its death unproven: the
    read model's ``takeover`` line, ``driver_silent_s`` and ``driver_dead_in_s``): ``{"text",
    "available", "line"}``; None when there is nothing to take over (or this ftnb's read model
    does not say: the hook for a read model without the takeover)."""
    line = getattr(snap, "takeover", None)
    if not line:
        return None
    driver = snap.driver_status
    silent = getattr(driver, "silent_s", None)
    dead_in = getattr(driver, "dead_in_s", None)
    text = f"Its driver has been silent for {silent:.0f} s" if silent is not None else (
        "Its driver is silent")
    text += (f"; it counts as dead in {max(0.0, dead_in):.0f} s." if dead_in is not None
             else "; it never counts as dead on its own.")
    here = bool(getattr(driver, "alive_here", False))
    if here:
        text += " It is alive on this machine: no takeover."
    else:
        text += f" Take it over now ({line}):"
    return {"text": text, "available": not here, "line": line}


class ExperimentWidget(widgets.VBox):
    """The live view of an experiment, with its controls.

    Args:
        handle: an :class:`ftnb.handle.ExperimentHandle` (anything with its ``monitor()``,
            ``stop``, ``stop_trial``, ``silent_driver``, ``resume``, ``name`` and ``path``).
        metric: the metric plotted first (default: the experiment's ``metric``, else the first
            one reported).
        interval_s: seconds between polls (default: the storage's ``poll_interval_s``, 2 on
            object stores where a listing per poll costs requests; never less than 0.5).
        start: start the background updater (tests drive :meth:`refresh` themselves).

    The first state is read before the constructor returns, so a finished experiment's widget
    is complete when displayed. The controls are methods too (:meth:`stop_trial`,
    :meth:`stop`, :meth:`resume`, :meth:`take_over`), each returning ``(ok, what happened)``.
    """

    def __init__(self, handle: Any, metric: Optional[str] = None,
                 interval_s: Optional[float] = None, start: bool = True) -> None:
        self.handle = handle
        self.monitor: ExperimentMonitor = handle.monitor()
        default = self.monitor.storage.poll_interval_s
        self.interval_s = max(LOCAL_INTERVAL_S, interval_s if interval_s is not None else default)
        self.snapshot: Optional[ExperimentSnapshot] = None
        self._metric_choice = metric
        self._lock = threading.RLock()  # one apply() at a time: updater thread or a callback
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._failures: list = []
        self._failures_shown: Any = None
        self._poll_error: Optional[str] = None
        self._unreadable = False  # written by a newer ftnb: polling again cannot help
        self._view_dirty = False  # a choice of the user (metric, rows, failure) to show
        self._behind = False  # polled while no view looked: the next apply shows all of it
        self._applying = False
        self._fast_until = 0.0  # after a resume: poll at full speed until it shows RUNNING
        #: polls done, updates (polls that found something new) shown, and polls kept
        #: unsent because no view looked.
        self.stats = {"polls": 0, "updates": 0, "unviewed": 0}
        self._polled_at = time.monotonic()  # the last poll's start, whoever asked for it

        # One layout and one style for every part that never changes its own: each is a model
        # of its own in the front end, 1 KB per display apiece.
        plain, text = widgets.Layout(), HTMLStyle()
        self.header = widgets.HTML(layout=plain, style=text)
        self.status_line = widgets.HTML(layout=plain, style=text)
        self.metric_picker = widgets.Dropdown(description="Metric", options=[],
                                              layout=widgets.Layout(width="260px"))
        self.show_all_rows = widgets.ToggleButton(description="Show all trials", value=False,
                                                  layout=plain)
        self.table = TrialTable(layout=plain)  # sent row by row (keyed by trial id)
        self.chart = TrialChart(metric, on_control=self._on_control, on_view=self._catch_up,
                                layout=plain)
        self.failures = widgets.HTML(layout=plain, style=text)
        self.failure_picker = widgets.Dropdown(description="Failure", options=[],
                                               layout=widgets.Layout(width="520px"))
        self.traceback_toggle = widgets.ToggleButton(description="Show traceback", value=False,
                                                     layout=plain)
        self.traceback = widgets.HTML(layout=plain, style=text)

        self.metric_picker.observe(self._on_metric, names="value")
        self.show_all_rows.observe(self._on_view_option, names="value")
        self.failure_picker.observe(self._on_view_option, names="value")
        self.traceback_toggle.observe(self._on_view_option, names="value")

        self.failure_box = widgets.VBox([
            self.failures, widgets.HBox([self.failure_picker, self.traceback_toggle]),
            self.traceback], layout=plain)
        super().__init__([
            self.header,
            self.status_line,
            widgets.HBox([self.metric_picker, self.show_all_rows], layout=plain),
            self.chart,
            self.table,
            widgets.HTML("<b>Failures</b>", layout=plain, style=text),
            self.failure_box,
        ])
        self.refresh()
        at_cell_end(self)
        if start:
            self.start()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The live widget for a front end that shows widgets; for one that cannot (a terminal
        IPython, a notebook saved without widget state as GitHub or nbviewer render it) the view
        as text at the moment it was displayed, instead of the widget's repr."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict) and self.snapshot is not None:
            bundle["text/plain"] = text_view(self.snapshot)
        return bundle

    def stale_hint(self) -> StaleHint:
        """The output to display under this widget: after a kernel or server restart, where the
        widget reads "model not found", it says to run ``%ftattach NAME``."""
        return StaleHint(self.handle.name)

    # -- the updater ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background updater (if it is not running and there is more to show)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            if self.snapshot is not None and ExperimentStatus(self.snapshot.status).is_finished():
                return
            if self._unreadable:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"ftnb-widget-{self.handle.name}", daemon=True)
            self._thread.start()

    @property
    def updating(self) -> bool:
        """Whether the background updater is running."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        snap = self.snapshot  # the constructor (or the last run) showed this one
        while True:
            wait = self.interval_s
            if (snap is not None and snap.status == ExperimentStatus.INTERRUPTED
                    and time.monotonic() > self._fast_until):
                wait = max(wait, INTERRUPTED_INTERVAL_S)
            elif not self.chart.series and (snap is None or not snap.finished):
                wait = min(wait, FIRST_POINTS_INTERVAL_S)  # a new experiment's first points
            # The interval counts from the last poll, also one a cell's end asked for: never
            # two polls closer than it, unless woken (a control, a view that opens).
            while (left := self._polled_at + wait - time.monotonic()) > 0:
                if self._wake.wait(left):
                    break
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                snap = self.refresh()
            except Exception as exc:  # never let the thread die silently
                self._say(f"ftnb widget: update failed: {type(exc).__name__}: {exc}", error=True)
                snap = None
            if (snap is not None and ExperimentStatus(snap.status).is_finished()
                    and not self._behind):
                return  # its last state is shown: nothing will change any more

    def close(self) -> None:
        """Stop the updater and close every part of the widget."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        for child in self._all_children(self):
            for part in (getattr(child, "layout", None), getattr(child, "style", None), child):
                if isinstance(part, widgets.Widget):
                    part.close()
        super().close()

    def _all_children(self, box: Any) -> list:
        out = []
        for child in getattr(box, "children", ()):
            out.append(child)
            out.extend(self._all_children(child))
        return out

    # -- polling and applying ------------------------------------------------------------------
    def refresh(self) -> Optional[ExperimentSnapshot]:
        """Poll the experiment once and show what changed (while a view looks: see the module
        docstring); returns the snapshot read."""
        with self._lock:
            self.stats["polls"] += 1
            self._polled_at = time.monotonic()
            try:
                snap = self.monitor.poll()
            except StateVersionError as exc:
                self._say(str(exc), error=True)
                self._unreadable = True
                self._stop.set()
                return None
            except StateFormatError:
                _set(self.header, "value",
                     f"<b>{html.escape(self.handle.name)}</b>: waiting for the experiment to "
                     "start...")
                return None
            except Exception as exc:  # storage unreachable for a moment: keep the last view
                if not is_transient(exc):
                    raise
                self._poll_error = f"cannot read the experiment: {type(exc).__name__}: {exc}"
                self._say(self._poll_error, error=True)
                return self.snapshot
            if self._poll_error is not None:
                self._poll_error = None
                self._say("")
            if self.snapshot is not None and not self.chart.viewed:
                # Nobody looks: keep it, send nothing (an idle server stays idle).
                self._latest, self._behind = snap, True
                self.stats["unviewed"] += 1
                return snap
            self._apply(snap)
            return snap

    def at_cell_end(self) -> None:
        """The cell that ran ends (the kernel is still busy): show the experiment as it is now,
        before going quiet if no view looks."""
        if self._stop.is_set() or self._unreadable:
            return
        with self._lock:
            if self.snapshot is None or self._applying:
                return
            if self.updating or self._behind:
                self.refresh()

    def _catch_up(self) -> None:
        """A view opened after a time without any: show it everything as it is now."""
        self._wake.set()  # and poll at once
        with self._lock:
            snap = getattr(self, "_latest", None) if self._behind else None
            if snap is None or self._applying:
                return
            self._view_dirty = True
            self._apply(snap)

    def _apply(self, snap: ExperimentSnapshot) -> None:
        self._applying = True
        try:
            self._apply_all(snap)
        finally:
            self._applying = False
            self._behind = False

    def _apply_all(self, snap: ExperimentSnapshot) -> None:
        previous = self.snapshot
        self.snapshot = snap
        structural = previous is None or previous.generation != snap.generation or self._behind
        if structural:
            self.stats["updates"] += 1
        _set(self.header, "value", header_html(snap))
        self._apply_controls(snap, structural)
        if structural:
            self._apply_metric_options(snap)
        metric = self.metric_picker.value or None
        if structural or self._view_dirty:
            max_rows = None if self.show_all_rows.value else DEFAULT_TABLE_ROWS
            self.table.show(*table_rows(snap, metric, max_rows), more=table_more(snap, max_rows))
            self._apply_failures(snap)
        if structural or self._view_dirty or (metric or "") != self.chart.metric:
            self.chart.update(snap, metric)
        self._view_dirty = False

    def _apply_controls(self, snap: ExperimentSnapshot, structural: bool) -> None:
        takeover = takeover_offer(snap)
        if not structural and takeover is None and self.chart.controls.get("takeover") is None:
            return
        labels = {r.trial_id: params_label(r.params) for r in snap.view.rows}
        stoppable = [[r.trial_id, labels.get(r.trial_id, "")]
                     for r in snap.view.rows if r.status in _STOPPABLE]
        self.chart.set_controls({
            "running": snap.status == ExperimentStatus.RUNNING,
            "interrupted": snap.status == ExperimentStatus.INTERRUPTED,
            "stoppable": stoppable,
            "resume_line": snap.resume_line if snap.status == ExperimentStatus.INTERRUPTED
            else "",
            "storage_fault": snap.storage_fault_line or "",
            "path": snap.path,
            "takeover": takeover,
        })

    def _apply_metric_options(self, snap: ExperimentSnapshot) -> None:
        options = list(snap.metrics)
        if list(self.metric_picker.options) == options:
            return
        current = self.metric_picker.value or self._metric_choice
        if current is None:
            preferred = snap.state.settings.get("metric")
            current = preferred if preferred in options else (options[0] if options else None)
        with self.metric_picker.hold_sync():
            self.metric_picker.options = options
            self.metric_picker.value = current if current in options else (
                options[0] if options else None)

    def _apply_failures(self, snap: ExperimentSnapshot) -> None:
        # Failures only ever get added: their count per trial tells whether anything changed;
        # but a group's latest failure says when its restart is under way and how long it took.
        status = {t.trial_id: t.status for t in snap.state.trials}
        signature = tuple(
            (t, len(fs)) + ((fs[-1].recovered_s, status.get(t)) if is_group_failure(fs[-1])
                            else ())
            for t, fs in snap.failures.items())
        if signature == self._failures_shown and not self._view_dirty:
            return
        self._failures_shown = signature
        _set(self.failures, "value", failures_html(snap))
        items = failure_list(snap)
        self._failures = items
        options = [(failure_label(t, f), (t, i)) for t, i, f in items]
        _show(self.failure_box.children[1], bool(options))
        with self.failure_picker.hold_sync():
            if list(self.failure_picker.options) != options:
                current = self.failure_picker.value
                self.failure_picker.options = options
                values = [v for _, v in options]
                self.failure_picker.value = current if current in values else (
                    values[0] if values else None)
        failure = self._picked_failure()
        if self.traceback_toggle.value and failure is not None:
            trial = next((t for t in snap.state.trials
                          if t.trial_id == self.failure_picker.value[0]), None)
            _set(self.traceback, "value", _traceback_html(failure, trial))
        else:
            _set(self.traceback, "value", "")

    def _picked_failure(self) -> Any:
        picked = self.failure_picker.value
        for trial_id, index, failure in self._failures:
            if (trial_id, index) == picked:
                return failure
        return None

    # -- callbacks (the kernel's thread) -----------------------------------------------------------
    def _on_metric(self, change: dict) -> None:
        if change["new"] is not None:
            self._metric_choice = change["new"]
        self._rerender()

    def _on_view_option(self, change: dict) -> None:
        self._rerender()

    def _rerender(self) -> None:
        """Show the current snapshot again after a choice of the user (no new poll)."""
        with self._lock:
            self._view_dirty = True
            if self.snapshot is not None and not self._applying:
                self._apply(getattr(self, "_latest", None) if self._behind else self.snapshot)

    # -- controls ------------------------------------------------------------------------------
    def _on_control(self, request: dict) -> tuple[bool, str]:
        """A control request from a view (a message: it reached the kernel once the kernel was
        free, maybe long after the click)."""
        action = request.get("type")
        if action == "stop_trial":
            return self.stop_trial(str(request.get("trial_id") or ""))
        if action == "stop":
            return self.stop()
        if action == "resume":
            return self.resume()
        if action == "takeover":
            return self.take_over()
        return False, f"unknown control {action!r}"

    def stop_trial(self, trial_id: str) -> tuple[bool, str]:
        """Stop the trial ``trial_id`` (TERMINATED; the others go on). Refused, never applied
        to another trial, when it has ended or is not in the experiment: a click queued behind
        a busy kernel may arrive after the trial finished."""
        if not trial_id:
            return self._said("Choose a trial to stop first.", False)
        with self._lock:
            snap = self._poll_quietly()
        trial = None if snap is None else next(
            (t for t in snap.state.trials if t.trial_id == trial_id), None)
        if snap is not None and trial is None:
            return self._said(f"No trial {trial_id} in experiment {self.handle.name}: nothing "
                              "stopped.", False)
        if trial is not None and trial.status not in _STOPPABLE:
            return self._said(f"Trial {trial_id} already ended ({shown_status(trial)}): "
                              "nothing stopped.", False)
        return self._request_stop(f"Stopping trial {trial_id}",
                                  lambda: self.handle.stop_trial(trial_id, wait=False), trial_id)

    def stop(self) -> tuple[bool, str]:
        """Stop the experiment (INTERRUPTED, resumable)."""
        return self._request_stop(f"Stopping experiment {self.handle.name}",
                                  lambda: self.handle.stop(wait=False))

    def _request_stop(self, what: str, fn: Any,
                      trial_id: Optional[str] = None) -> tuple[bool, str]:
        """Write a stop request; while the experiment's driver is silent it may never read it,
        and the status line says so in the handle's words (``handle.silent_driver``: for how
        long, when it counts as dead, the line that takes it over) and names the Take over
        button."""
        ok, text = self._action(what, fn)
        silent = self.handle.silent_driver(trial_id=trial_id) if ok else None
        if silent is None:
            return ok, text
        said = str(silent).removeprefix("ftnb: ")
        return self._said(f"{what}: requested, but {said}, or with the Take over button.", True)

    def resume(self, takeover: bool = False) -> tuple[bool, str]:
        """Resume the interrupted experiment in a new supervisor, with the trainable this kernel
        launched it with (or its recorded name in the notebook); ``takeover``: from a silent
        driver (``handle.resume(takeover=True)``)."""
        def resume() -> None:
            self._fast_until = time.monotonic() + 60.0
            kwargs = {"takeover": True} if takeover else {}
            new = self.handle.resume(wait=False, **kwargs)
            if new is not None and new is not self.handle:
                self.handle = new
            self.start()

        what = "Taking over" if takeover else "Resuming"
        return self._action(f"{what} experiment {self.handle.name}", resume)

    def take_over(self) -> tuple[bool, str]:
        """Take the experiment over from its silent driver and resume it here."""
        return self.resume(takeover=True)

    def _poll_quietly(self) -> Optional[ExperimentSnapshot]:
        try:
            return self.monitor.poll()
        except Exception:  # unreadable now: the handle's own checks decide
            return None

    def _action(self, what: str, fn: Any) -> tuple[bool, str]:
        """Run a control action; its errors (and what it printed) go to the status line."""
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                fn()
        except Exception as exc:
            return self._said(f"{what} failed: {exc}", False)
        printed = " ".join(out.getvalue().split())
        self._wake.set()  # show its effect as soon as the next poll can
        return self._said(f"{what}: requested." + (f" {printed}" if printed else ""), True)

    def _said(self, text: str, ok: bool) -> tuple[bool, str]:
        self._say(text, error=not ok)
        return ok, text

    def _say(self, text: str, error: bool = False) -> None:
        style = "class='ftnb-w ftnb-w-s-ERRORED'" if error else ""
        value = f"<span {style}>{html.escape(text)}</span>" if text else ""
        _set(self.status_line, "value", value)


def _set(widget: Any, name: str, value: Any) -> None:
    """Set a trait only when it changes: nothing is sent to the browser otherwise."""
    if getattr(widget, name) != value:
        setattr(widget, name, value)


def _show(widget: Any, visible: bool) -> None:
    _set(widget.layout, "display", None if visible else "none")
