"""An experiment's curves as a plotly figure: one trace per trial, restart points marked (a
group's say which rank failed and how long the restart took).

The live widget does not use it: its chart (:mod:`ftnb.notebook.chart`) needs no plotly and
sends no plotly.js with each display. This is for callers who want plotly's own tools on the
same data (zoom, export, their own layout): :class:`TrialChart` owns a
``plotly.graph_objects.FigureWidget`` and brings it up to date from
:class:`ftnb.ui.monitor.ExperimentSnapshot` s, sending only what changed (a trial's trace is
restyled only when its points did, new trials are added in one message, every update is one
``batch_update()``). plotly is imported when a chart is built, never by importing this module.
Needs ``plotly`` (in ``ftnb[notebook]``)::

    from ftnb.notebook.plots import TrialChart
    from ftnb.ui.monitor import ExperimentMonitor

    chart = TrialChart("loss")
    chart.update(ExperimentMonitor("~/ftnb_results/sweep1").poll(), "loss")
    chart.figure
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any, Optional

from ..core.records import TrialStatus
from ..ui.failures import is_group_failure, restart_text

if TYPE_CHECKING:
    from ..ui.monitor import ExperimentSnapshot

__all__ = ["TrialChart"]

# Above this many trials a legend is a wall of names: hover tells which trial a line is.
LEGEND_MAX_TRIALS = 12
RESTARTS_NAME = "restarts"


class TrialChart:
    """A chosen metric against ``training_iteration`` for every trial.

    Attributes:
        figure: the ``FigureWidget`` to display.
        metric: the metric plotted (None until one is chosen or reported).
    """

    def __init__(self, metric: Optional[str] = None, height: int = 360) -> None:
        import plotly.graph_objects as go

        self.metric = metric
        self.figure = go.FigureWidget(
            data=[go.Scatter(
                x=[], y=[], mode="markers", name=RESTARTS_NAME, hoverinfo="text",
                marker=dict(symbol="x", size=10, color="black", line=dict(width=1)),
                showlegend=True,
            )],
            layout=go.Layout(
                height=height,
                margin=dict(l=50, r=20, t=30, b=40),
                xaxis=dict(title=dict(text="training_iteration")),
                yaxis=dict(title=dict(text=metric or "")),
                hovermode="closest",
                uirevision="ftnb",  # keep the user's zoom across updates
            ),
        )
        self._index: dict[str, int] = {}  # trial_id -> index of its trace
        self._sent: dict[str, tuple] = {}  # trial_id -> (xs, ys) last sent
        self._versions: dict[str, Any] = {}  # trial_id -> its snapshot version last looked at
        self._restarts_sent: tuple = ((), (), ())

    # -- reading back (tests, callers) ----------------------------------------------------------
    def trace(self, trial_id: str) -> Any:
        """The trace of ``trial_id`` (None if it has none yet)."""
        index = self._index.get(trial_id)
        return None if index is None else self.figure.data[index]

    @property
    def restarts_trace(self) -> Any:
        return self.figure.data[0]

    @property
    def trial_traces(self) -> dict[str, Any]:
        return {t: self.figure.data[i] for t, i in self._index.items()}

    # -- updating ------------------------------------------------------------------------------
    def update(self, snap: "ExperimentSnapshot", metric: Optional[str]) -> bool:
        """Bring the figure up to date with ``snap`` plotting ``metric``; True if it changed.

        Only trials whose version changed since the last update are looked at.
        """
        if metric != self.metric:
            self.metric = metric
            self._versions.clear()  # every trace changes
        changed = [t for t in snap.trial_ids if self._versions.get(t) != snap.version.get(t)]
        if not changed and self._title_ok():
            return False
        points = snap.series(metric, changed) if metric else {}
        changes: dict[str, tuple] = {}
        for trial_id in changed:
            xs, ys = points.get(trial_id, ((), ()))
            pair = (tuple(xs), tuple(ys))
            if self._sent.get(trial_id) != pair:
                changes[trial_id] = pair
            self._versions[trial_id] = snap.version.get(trial_id)
        restarts = self._restart_points(snap, metric, changes)
        if not changes and restarts == self._restarts_sent and self._title_ok():
            return False
        new = []
        with self.figure.batch_update():
            if not self._title_ok():
                self.figure.layout.yaxis.title.text = metric or ""
            for trial_id, (xs, ys) in changes.items():
                index = self._index.get(trial_id)
                if index is None:
                    if xs:
                        new.append(trial_id)  # added below, in one message
                    else:
                        self._sent[trial_id] = (xs, ys)
                    continue
                trace = self.figure.data[index]
                trace.x, trace.y = _array(xs, "int32"), _array(ys, "float64")
                mode = _mode(len(xs))
                if trace.mode != mode:
                    trace.mode = mode
                self._sent[trial_id] = (xs, ys)
            if restarts != self._restarts_sent:
                marker = self.figure.data[0]
                marker.x, marker.y, marker.hovertext = restarts
                self._restarts_sent = restarts
        if new:
            self._add_traces(snap, new, changes)
        self._show_legend(len(self._index))
        return True

    def _title_ok(self) -> bool:
        return self.figure.layout.yaxis.title.text == (self.metric or "")

    def _add_traces(self, snap: "ExperimentSnapshot", new: list[str], changes: dict) -> None:
        import plotly.graph_objects as go

        status = {t.trial_id: t.status for t in snap.state.trials}
        start = len(self.figure.data)
        traces = []
        for trial_id in new:
            xs, ys = changes[trial_id]
            traces.append(go.Scatter(
                x=_array(xs, "int32"), y=_array(ys, "float64"), mode=_mode(len(xs)), name=trial_id,
                hovertemplate=f"{html.escape(trial_id)}<br>iter %{{x}}: %{{y}}<extra></extra>",
                line=dict(dash="dot" if status.get(trial_id) == TrialStatus.ERRORED else None),
            ))
        # One addTraces message for all of them.
        self.figure.add_traces(traces)
        for offset, trial_id in enumerate(new):
            self._index[trial_id] = start + offset
            self._sent[trial_id] = changes[trial_id]

    def _show_legend(self, n: int) -> None:
        show = n <= LEGEND_MAX_TRIALS
        if self.figure.layout.showlegend != show:
            self.figure.layout.showlegend = show

    def _restart_points(self, snap: "ExperimentSnapshot", metric: Optional[str],
                        changes: dict) -> tuple:
        xs, ys, texts = [], [], []
        for trial_id, restarts in snap.restarts.items():
            sent = changes.get(trial_id) or self._sent.get(trial_id)
            failed = {f.attempt: f for f in snap.failures.get(trial_id, ())}
            for restart in restarts:
                y = snap.value_at(trial_id, metric, restart.iteration) if metric else None
                if y is None:
                    if not sent or not sent[1]:
                        continue
                    y = sent[1][0]  # from scratch (or before the first row): the first point
                xs.append(restart.iteration)
                ys.append(y)
                when = time.strftime("%H:%M:%S", time.localtime(restart.time))
                text = (f"{trial_id}: attempt {restart.attempt} resumed from iteration "
                        f"{restart.iteration} at {when}")
                failure = failed.get(restart.attempt - 1)
                if failure is not None and is_group_failure(failure):  # which rank, how long
                    took = restart_text(failure)
                    text += f" after rank {failure.rank} failed ({failure.kind})" + (
                        f"; {took}" if took else "")
                texts.append(text)
        return tuple(xs), tuple(ys), tuple(texts)


def _mode(n: int) -> str:
    # Lines alone hide a trial with a single point; markers on every point of 500 trials would
    # weigh on the browser.
    return "lines+markers" if n < 3 else "lines"


def _array(values: tuple, dtype: str) -> Any:
    """Points as a numpy array: plotly sends those as binary buffers (8 bytes a float instead
    of its decimal text) and validates them without a Python loop."""
    import numpy as np

    return np.asarray(values, dtype=dtype)
