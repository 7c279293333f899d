"""The live chart and controls of the experiment widget: an anywidget with a small hand-written
ES module (``static/chart.js``, about 20 KB; no plotly, no bundle), themed with JupyterLab's CSS
variables.

What a view draws lives in the widget's model state, so a page reload or a reopened notebook
shows the whole current chart: ``series`` (every trial's points, binary: float32 values, int32
iterations only where they are not consecutive; :func:`encode_series`), ``trials`` (each
trial's label from its varying hyperparameters and its status as views show it: a stopped trial
is ``STOPPED``, not ``TERMINATED``), ``restarts`` (a retry after a failure and a resume after a
pause marked differently), ``controls`` and ``metric``. ``series`` and ``trials`` are not
traits: they are added to the state the front end gets when the widget opens or asks for its
state (a reload); later points go as appends (custom messages), so a poll that found two new
rows sends two rows, and a trial whose status changed is sent that trial's entry.

**Views report themselves** (``{"type": "view", "event": "open" | "beat" | "close"}``, a beat
every 30 s while the page is visible; a tab hidden in the background reports ``close``): :attr:`TrialChart.viewed` is False once none has been heard from for
:data:`VIEW_TTL_S` (a browser killed without a goodbye) and no cell is running, and then the
experiment widget sends nothing at all, so JupyterHub's idle culler can cull an unattended
server. A view that opens is caught up (:meth:`TrialChart.send_all`). While a cell runs the
kernel is busy anyway (and a view's messages wait for the cell's end), so updates go out.

**Controls** (a trial selector, Stop trial, Stop experiment, Resume, Take over) name trials by
id. Where ftnb's Jupyter server extension answers, the front end POSTs stops to it and they act
while the kernel is busy; otherwise they come here as messages, handled by the widget's
``on_control`` when the kernel is free.

DOM hooks for browser tests (``data-testid``): ``ftnb-widget`` (the whole view), ``ftnb-chart``
(the SVG; each trial's ``path`` carries ``data-trial-id`` and ``data-status``; restart marks
``data-kind`` = ``retry`` | ``resume``), ``ftnb-chart-legend``, ``ftnb-chart-tooltip``,
``ftnb-trial-select`` (option values are trial ids), ``ftnb-stop-trial``,
``ftnb-stop-experiment``, ``ftnb-resume``, ``ftnb-resume-line``, ``ftnb-takeover``,
``ftnb-takeover-countdown``, ``ftnb-log-scale``, ``ftnb-control-mode`` (whether controls go
through the server or wait for the kernel) and ``ftnb-control-status`` (what became of the last
click).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Optional

import anywidget
import traitlets

from ..ui.failures import is_group_failure, restart_text
from ..ui.snapshot import finite
from ..ui.view import RETRIED_AFTER, params_label, shown_status
from .table import compact, rows_diff

if TYPE_CHECKING:
    from ..ui.monitor import ExperimentSnapshot

__all__ = ["VIEW_TTL_S", "TrialChart", "at_cell_end", "cells_running", "encode_series", "in_kernel"]

_STATIC = Path(__file__).parent / "static"
#: A view that sent nothing (no beat: every 30 s) for this long is gone (its browser was killed).
VIEW_TTL_S = 75.0

_cells = {"running": 0, "watching": False}
_cells_lock = threading.Lock()
_at_cell_end: "weakref.WeakSet[Any]" = weakref.WeakSet()


def at_cell_end(obj: Any) -> None:
    """Call ``obj.at_cell_end()`` when each cell ends, while the kernel is still busy with it:
    the last word before a kernel without views goes quiet (an ``h.wait()`` returned: the
    experiment's end is shown). Held weakly."""
    _at_cell_end.add(obj)


def _watch_cells() -> None:
    """Count the cells running in this IPython kernel (its ``pre/post_run_cell`` events)."""
    with _cells_lock:
        if _cells["watching"]:
            return
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return
        _cells["watching"] = True
        # The cell that creates the first widget is running now.
        _cells["running"] = 1 if getattr(shell, "execution_count", 0) else 0

        def started(*_: Any) -> None:
            _cells["running"] = 1

        def ended(*_: Any) -> None:
            try:
                for obj in list(_at_cell_end):
                    try:
                        obj.at_cell_end()
                    except Exception:  # a view's update must never fail the user's cell
                        pass
            finally:
                _cells["running"] = 0

        shell.events.register("pre_run_cell", started)
        shell.events.register("post_run_cell", ended)


def cells_running() -> bool:
    """Whether this kernel is running a cell now (False outside a kernel or before a widget)."""
    return bool(_cells["running"])


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (its widgets have a front end to talk to)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def encode_series(series: dict[str, tuple[list, list]]) -> tuple[dict, bytes, bytes]:
    """``({"ids", "n", "x0"}, x, y)``: every trial's points for the front end. ``y`` is the
    values as float32 (NaN: a gap), ``x`` the iterations as int32 of the trials whose iterations
    are not consecutive (``x0`` None; else ``x0`` is their first), so 500 trials of 100 points
    are 200 KB, not the 1.3 MB of their JSON."""
    ids, lengths, starts = [], [], []
    xs_all, ys_all = array("i"), array("f")
    for trial_id, (xs, ys) in series.items():
        ids.append(trial_id)
        lengths.append(len(xs))
        if xs and xs[-1] - xs[0] == len(xs) - 1 and xs == list(range(xs[0], xs[-1] + 1)):
            starts.append(xs[0])
        else:
            starts.append(None)
            xs_all.extend(xs)
        ys_all.extend(math.nan if y is None else y for y in ys)
    return {"ids": ids, "n": lengths, "x0": starts}, xs_all.tobytes(), ys_all.tobytes()


#: Statuses as the chart's ``trials`` state numbers them (other strings are sent as they are).
STATUSES = ("PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERRORED", "STOPPED", "INTERRUPTED")


class TrialChart(anywidget.AnyWidget):
    """A chosen metric against ``training_iteration`` for every trial, with the experiment's
    controls. :meth:`update` brings it up to date from an :class:`ExperimentSnapshot`.

    Args:
        metric: the metric plotted (None until one is chosen or reported).
        height: the plot's height in pixels.
        on_control: called with each control request a view sends (``{"type": "stop_trial",
            "trial_id": ..., "request": n, "view": id}``, ``stop``, ``resume``, ``takeover``);
            returns ``(ok, text)`` for the view's status line.
        on_view: called when a view opens and nothing was viewed before (a catch-up is due).
    """

    _esm = compact((_STATIC / "chart.js").read_text(encoding="utf-8"))
    # (status.css, the status colours it uses too, comes with the widget's TrialTable.)
    _css = compact((_STATIC / "chart.css").read_text(encoding="utf-8"))

    metric = traitlets.Unicode("").tag(sync=True)
    log_y = traitlets.Bool(False).tag(sync=True)
    height = traitlets.Int(360).tag(sync=True)
    # ``trials`` (a property below) is not a trait: it is in the whole state (a display, a
    # reload) and in a catch-up; its changes go as ``{"type": "trials"}`` messages with the
    # changed entries only (:func:`rows_diff`).
    #: ``[{"trial", "x", "y", "kind": "retry" | "resume", "text"}]``.
    restarts = traitlets.List().tag(sync=True)
    #: ``{"running", "interrupted", "stoppable": [[id, label]], "resume_line", "path",
    #: "takeover": {"text", "available"} | None}``.
    controls = traitlets.Dict().tag(sync=True)

    def __init__(self, metric: Optional[str] = None, height: int = 360,
                 on_control: Optional[Callable[[dict], tuple[bool, str]]] = None,
                 on_view: Optional[Callable[[], None]] = None, **kwargs: Any) -> None:
        self._series: dict[str, tuple[list, list]] = {}  # what a view shows: trial -> (xs, ys)
        self._trials: list[list] = []
        self._columns: dict[str, Any] = {}  # trial -> the ResultColumns its points came from
        self._versions: dict[str, Any] = {}
        self._data_lock = threading.RLock()
        self._views: dict[str, float] = {}
        self._on_control = on_control
        self._on_view = on_view
        self._kernel = in_kernel()
        if self._kernel:
            _watch_cells()
        #: Messages sent to the front end, by kind (tests, the benchmark).
        self.stats = {"deltas": 0, "full": 0, "points_sent": 0}
        super().__init__(metric=metric or "", height=height, **kwargs)
        self.on_msg(self._on_front_end_msg)

    # -- the state a front end gets ------------------------------------------------------------
    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict:
        """The synced traits, and (for the whole state: when the widget opens, or a reloaded
        page asks) ``series``, every trial's points."""
        state = super().get_state(key, drop_defaults)
        if key is None:
            with self._data_lock:
                meta, xs, ys = encode_series(getattr(self, "_series", {}))
            state["series"] = {**meta, "x": xs, "y": ys}
            state["trials"] = list(getattr(self, "_trials", []))
        return state

    @property
    def trials(self) -> list[list]:
        """``[[id, label, status as shown]]`` of the trials with points, the label "" when no
        hyperparameter varies, the status a :data:`STATUSES` index where it is one (500 trials'
        dicts with names would weigh 40 KB more per display)."""
        return list(self._trials)

    def points(self, trial_id: str) -> Optional[tuple[list, list]]:
        """``(iterations, values)`` of ``trial_id`` as the views show them (None: no points)."""
        return self._series.get(trial_id)

    @property
    def series(self) -> dict[str, tuple[list, list]]:
        """Every trial's points as the views show them."""
        return dict(self._series)

    # -- reading back (tests, callers) -----------------------------------------------------
    @property
    def trial_statuses(self) -> dict[str, str]:
        """``{trial_id: status as shown}`` of the trials with points (``STOPPED``: a user
        stopped it)."""
        return {t: STATUSES[s] if isinstance(s, int) else s for t, _, s in self.trials}

    @property
    def labels(self) -> dict[str, str]:
        """``{trial_id: its varying hyperparameters}`` as legend and hover show them."""
        return {t: label or t for t, label, _ in self.trials}

    def trace(self, trial_id: str) -> Optional[SimpleNamespace]:
        """``trial_id``'s line as ``.x``, ``.y`` (None: no points)."""
        points = self._series.get(trial_id)
        return None if points is None else SimpleNamespace(x=points[0], y=points[1])

    @property
    def trial_traces(self) -> dict[str, SimpleNamespace]:
        """Every trial's line (:meth:`trace`)."""
        return {t: SimpleNamespace(x=xs, y=ys) for t, (xs, ys) in self._series.items()}

    @property
    def restarts_trace(self) -> SimpleNamespace:
        """The restart marks as ``.x``, ``.y``, ``.hovertext`` and ``.kind`` lists."""
        marks = self.restarts
        return SimpleNamespace(x=[m["x"] for m in marks], y=[m["y"] for m in marks],
                               hovertext=[m["text"] for m in marks],
                               kind=[m["kind"] for m in marks])

    # -- views -------------------------------------------------------------------------------
    @property
    def viewed(self) -> bool:
        """Whether anything should be sent: outside a kernel (nothing goes anywhere) always; in
        one, while a view reported itself within :data:`VIEW_TTL_S` or a cell runs."""
        if not self._kernel:
            return True
        if cells_running():
            return True
        now = time.monotonic()
        return any(now - seen < VIEW_TTL_S for seen in self._views.values())

    @property
    def views(self) -> int:
        """How many views reported themselves within :data:`VIEW_TTL_S`."""
        now = time.monotonic()
        return sum(1 for seen in self._views.values() if now - seen < VIEW_TTL_S)

    def _on_front_end_msg(self, _widget: Any, content: dict, buffers: list) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "view":
            view, event = str(content.get("view")), content.get("event")
            if event == "close":
                self._views.pop(view, None)
                return
            fresh = self.views == 0
            self._views[view] = time.monotonic()
            if (event == "open" or fresh) and not self._has_all(content):
                self.send_all()  # what it has is older than what is here (or a metric ago)
                if fresh and self._on_view is not None:
                    self._on_view()
        elif kind == "resync":
            self.send_all()
        elif kind in ("stop_trial", "stop", "resume", "takeover"):
            ok, text = (False, "this widget takes no controls") if self._on_control is None \
                else self._on_control(content)
            self.send({"type": "reply", "request": content.get("request"),
                       "view": content.get("view"), "ok": ok, "text": text})

    def _has_all(self, content: dict) -> bool:
        """Whether a view's report says it has every point (the state it just got)."""
        with self._data_lock:
            total = sum(len(xs) for xs, _ in self._series.values())
            return content.get("metric") == self.metric and content.get("points") == total

    # -- updating ------------------------------------------------------------------------------
    def send_all(self) -> None:
        """Send every trial's points (a view that opened, or one that missed an append)."""
        with self._data_lock:
            meta, xs, ys = encode_series(self._series)
            self.send({"type": "series", "metric": self.metric, **meta, "x": 0, "y": 1,
                       "trials": self._trials}, buffers=[xs, ys])
            self.stats["full"] += 1

    def update(self, snap: "ExperimentSnapshot", metric: Optional[str], send: bool = True) -> bool:
        """Bring the chart up to date with ``snap`` plotting ``metric``; True if it changed.
        ``send``: whether to send what changed to the front end (False: only keep it, a view
        that opens gets it all)."""
        metric = metric or ""
        with self._data_lock:
            if metric != self.metric:
                self._versions.clear()
                self._series.clear()
                self._columns.clear()
                self.metric = metric
                appended = self._refresh_points(snap, metric)
                if send:
                    self.send_all()
                changed = True
            else:
                appended = self._refresh_points(snap, metric)
                changed = bool(appended)
                if appended and send:
                    self.send({"type": "delta", "metric": metric, "trials": finite(appended)})
                    self.stats["deltas"] += 1
                    self.stats["points_sent"] += sum(len(d["x"]) for d in appended.values())
        changed |= self._set_trials(self._trial_meta(snap), send)
        changed |= self._set_if_changed("restarts", self._restart_points(snap, metric))
        return changed

    def _set_if_changed(self, name: str, value: Any) -> bool:
        if getattr(self, name) == value:
            return False
        setattr(self, name, value)
        return True

    def _set_trials(self, trials: list[list], send: bool) -> bool:
        """Keep ``trials``; send the entries that changed (one trial's status: that entry)."""
        with self._data_lock:
            diff = rows_diff({t[0]: t for t in self._trials}, [t[0] for t in self._trials],
                             trials)
            if diff is None:
                return False
            self._trials = trials
            if send and len(diff.get("set", ())) * 2 > len(trials):  # mostly new: the list
                self.send({"type": "trials", "all": trials})
            elif send:
                self.send({"type": "trials", **diff})
        return True

    def set_controls(self, controls: dict) -> None:
        """Set the controls' state (sent only when it changed)."""
        self._set_if_changed("controls", controls)

    def _refresh_points(self, snap: "ExperimentSnapshot", metric: str) -> dict:
        """Update ``_series`` from the trials whose version changed; returns the appends
        ``{trial: {"start", "x", "y"}}`` (``start`` 0 with every point: its rows were
        replaced)."""
        appended: dict[str, dict] = {}
        for trial_id in snap.trial_ids:
            version = snap.version.get(trial_id)
            if self._versions.get(trial_id) == version:
                continue
            self._versions[trial_id] = version
            if not metric:
                continue
            columns = snap.result_columns(trial_id)
            xs, ys = snap.series(metric, [trial_id]).get(trial_id, ([], []))
            have = self._series.get(trial_id)
            # One ResultColumns only grows; a replaced result.json (a restart dropped rows)
            # comes as a new one: then the view's line is replaced whole.
            appending = (have is not None and columns is not None
                         and columns is self._columns.get(trial_id) and len(xs) >= len(have[0]))
            start = len(have[0]) if appending else 0
            if have is not None and start == len(xs) == len(have[0]):
                continue
            if not xs and have is None:
                continue
            self._series[trial_id] = (list(xs), list(ys))
            self._columns[trial_id] = columns
            appended[trial_id] = {"start": start, "x": list(xs[start:]), "y": list(ys[start:])}
        return appended

    def _trial_meta(self, snap: "ExperimentSnapshot") -> list[list]:
        rows = {r.trial_id: r for r in snap.view.rows}
        out = []
        for trial in snap.state.trials:
            if trial.trial_id not in self._series:
                continue
            row = rows.get(trial.trial_id)
            label = params_label(row.params) if row is not None else ""
            shown = shown_status(trial)
            out.append([trial.trial_id, label,
                        STATUSES.index(shown) if shown in STATUSES else shown])
        return out

    def _restart_points(self, snap: "ExperimentSnapshot", metric: str) -> list[dict]:
        """A mark where each trial's attempt started again: ``retry`` after a failure,
        ``resume`` after a pause (a stop, a driver gone)."""
        out = []
        for trial in snap.state.trials:
            attempts = trial.attempts
            if len(attempts) < 2:
                continue
            have = self._series.get(trial.trial_id)
            failed = {f.attempt: f for f in snap.failures.get(trial.trial_id, ())}
            for before, attempt in zip(attempts, attempts[1:]):
                iteration = attempt.start_iteration
                y = snap.value_at(trial.trial_id, metric, iteration) if metric else None
                if y is None:
                    if not have or not have[1]:
                        continue
                    y = have[1][0]  # from scratch (or before the first row): the first point
                failure = failed.get(before.number)
                retry = before.outcome in RETRIED_AFTER or failure is not None
                when = time.strftime("%H:%M:%S", time.localtime(attempt.started))
                text = (f"{trial.trial_id}: attempt {attempt.number} resumed from iteration "
                        f"{iteration} at {when}")
                if failure is not None and is_group_failure(failure):  # which rank, how long
                    took = restart_text(failure)
                    text += f" after rank {failure.rank} failed ({failure.kind})" + (
                        f"; {took}" if took else "")
                elif failure is not None:
                    text += f" after a failure ({failure.kind})"
                else:
                    text += " after a pause (not a retry)"
                out.append({"trial": trial.trial_id, "x": iteration, "y": finite(y),
                            "kind": "retry" if retry else "resume", "text": text})
        return out


class StaleHint:
    """What to do where a widget's model is gone (a kernel or server restart: JupyterLab shows
    "Error displaying widget: model not found"): an output displayed under the widget, saying
    to run ``%ftattach NAME``. The widget's own style sheet (loaded with any live ftnb widget
    view) hides it, so it shows only where no ftnb widget could be drawn, and in front ends
    without widgets (nbviewer, GitHub), where the view's text copy is above it."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def text(self) -> str:
        return (f"ftnb: if the view above is gone (\"model not found\": its kernel restarted), "
                f"run %ftattach {self.name} to see experiment {self.name} live again.")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        import html

        code = html.escape(f"%ftattach {self.name}")
        markup = (f"<div class='ftnb-stale-hint' data-testid='ftnb-stale-hint' "
                  f"style='font-size:90%'>ftnb: if the view above is gone (&quot;model not "
                  f"found&quot;: its kernel restarted), run <code>{code}</code> to see "
                  f"experiment {html.escape(self.name)} live again.</div>")
        return {"text/plain": self.text, "text/html": markup}
