"""The widget's chart and controls where behaviour depends on a front end and a kernel: every
trial's points in the model state (a reload shows the whole chart), the bytes one display
sends, a kernel that sends nothing while no view looks and catches a view up when one opens,
controls that name a trial by id (a stop for an ended or unknown trial is refused, never
redirected), a user-stopped trial and a resumed one shown apart from a completed one and a
retry, and the source lines of a notebook-defined trainable in its trial's traceback. The
kernels are real (jupyter_client); this client sends what a browser's view sends."""

from __future__ import annotations

import html
import json
import math
import os
import sys
from array import array

import pytest

pytest.importorskip("anywidget", reason="the widget needs ftnb[notebook]")
pytest.importorskip("jupyter_client", reason="needs jupyter_client")
pytest.importorskip("ipykernel", reason="needs ipykernel")

import ftnb  # noqa: E402
from ftnb.core.records import AttemptRecord, FailureRecord  # noqa: E402
from ftnb.notebook.widget import ExperimentWidget  # noqa: E402
from ftnb.storage.lease import Lease  # noqa: E402
from procs import REPO, TESTS, wait_for  # noqa: E402

sys.path.insert(0, REPO)
from bench.procs import subprocess_env  # noqa: E402
from bench.widget_load import (  # noqa: E402
    WidgetKernel,
    _line,
    _row,
    chart_comm_id,
    display_bytes,
    write_experiment,
)

pytestmark = pytest.mark.timeout(180)


def decode_series(series: dict, buffers: list = ()) -> dict:
    """The chart's ``series`` state (or a ``series`` message) as ``{trial: (xs, ys)}``; buffers
    given by index (a message) or inline (the state)."""
    def raw(value):
        return bytes(buffers[value]) if isinstance(value, int) else bytes(value)

    ys, xs = array("f"), array("i")
    ys.frombytes(raw(series["y"]))
    xs.frombytes(raw(series["x"]))
    out, yi, xi = {}, 0, 0
    for trial_id, n, x0 in zip(series["ids"], series["n"], series["x0"]):
        if x0 is None:
            trial_xs, xi = list(xs[xi:xi + n]), xi + n
        else:
            trial_xs = list(range(x0, x0 + n))
        out[trial_id] = (trial_xs, [None if math.isnan(v) else v for v in ys[yi:yi + n]])
        yi += n
    return out


def _append(paths, trial, index, step):
    with open(paths.trial(trial.dir_name).results, "ab") as f:
        f.write(_line(_row(index, step, trial.trial_id)))


def _loss(index, step):
    return array("f", [_row(index, step, "t")["loss"]])[0]  # as float32 carries it


def test_every_point_is_in_the_model_state_after_lines_were_added(tmp_path):
    paths, state = write_experiment(str(tmp_path), "grow", 4, 5, finished=2, partial=[2],
                                    status="RUNNING")
    w = ExperimentWidget(ftnb.attach(paths.dir), start=False)
    try:
        running, pending = state.trials[2], state.trials[3]
        for step in (3, 4, 5):
            _append(paths, running, 2, step)
        _append(paths, pending, 3, 1)  # a trial's first line, after the display
        w.refresh()
        # What a reloaded page (or a reopened notebook) gets: the whole current chart.
        series = decode_series(w.chart.get_state()["series"])
        assert set(series) == {t.trial_id for t in state.trials}
        assert series[running.trial_id] == ([1, 2, 3, 4, 5], [_loss(2, s) for s in range(1, 6)])
        assert series[pending.trial_id] == ([1], [_loss(3, 1)])
        assert series[state.trials[0].trial_id][0] == [1, 2, 3, 4, 5]
        # A trial restarted from a checkpoint: its rows replaced by fewer, then new ones.
        with open(paths.trial(running.dir_name).results, "wb") as f:
            f.write(b"".join(_line(_row(2, s, running.trial_id)) for s in (1, 2, 3)))
        w.refresh()
        assert decode_series(w.chart.get_state()["series"])[running.trial_id][0] == [1, 2, 3]
    finally:
        w.close()


def test_user_stopped_and_resumed_trials_are_shown_apart(tmp_path):
    paths, state = write_experiment(str(tmp_path), "kinds", 4, 6)
    done, stopped, resumed, retried = state.trials
    t0 = state.created
    stopped.note = "stopped by user"
    stopped.attempts[0].outcome = "stopped"
    resumed.attempts = [AttemptRecord(1, t0, outcome="interrupted", ended=t0 + 1),
                        AttemptRecord(2, t0 + 2, start_iteration=3, outcome="finished")]
    retried.attempts = [AttemptRecord(1, t0, outcome="failed", ended=t0 + 1),
                        AttemptRecord(2, t0 + 2, start_iteration=2, outcome="finished")]
    retried.failures = [FailureRecord(attempt=1, time=t0 + 1, iteration=2, kind="exception",
                                      type="ValueError", message="boom")]
    for trial in state.trials:
        trial.seq += 1
        paths.storage.write_atomic(paths.trial(trial.dir_name).record,
                                   json.dumps(trial.to_json()))
    state.save(paths, final=True)
    w = ExperimentWidget(ftnb.attach(paths.dir))
    try:
        shown = w.chart.trial_statuses
        assert shown == {done.trial_id: "TERMINATED", stopped.trial_id: "STOPPED",
                         resumed.trial_id: "TERMINATED", retried.trial_id: "TERMINATED"}
        assert "class='s-STOPPED'>STOPPED<" in w.table.value
        marks = {m["trial"]: m for m in w.chart.restarts}
        assert marks[resumed.trial_id]["kind"] == "resume"
        assert "after a pause (not a retry)" in marks[resumed.trial_id]["text"]
        assert marks[retried.trial_id]["kind"] == "retry"
        # One failure, one retry: the resume after a pause is none.
        assert "1 failure, 1 retry" in w.header.value
        rows = {r.trial_id: r for r in w.snapshot.view.rows}
        assert (rows[resumed.trial_id].retries, rows[retried.trial_id].retries) == (0, 1)
    finally:
        w.close()


# -- in a real kernel ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS, env.get("PYTHONPATH", "")])
    k = WidgetKernel(env=env, cwd=str(tmp_path_factory.mktemp("kernel")))
    k.run("import ftnb, json, sys")
    yield k
    k.close()


def _show(kernel, path, name="w"):
    kernel.run(f"from IPython.display import display\n"
               f"from ftnb.notebook.widget import ExperimentWidget\n"
               f"{name} = ExperimentWidget(ftnb.attach({path!r})); display({name})")
    return list(kernel.cell)


def _custom(msg):
    data = msg["content"].get("data", {})
    return data.get("content") if data.get("method") == "custom" else None


def test_one_display_is_under_300_kb_and_a_reload_gets_every_point(kernel, tmp_path):
    paths, _ = write_experiment(str(tmp_path), "big", 500, 100)
    cell = _show(kernel, paths.dir, "big")
    assert display_bytes(cell) < 300 * 1024, display_bytes(cell)
    assert kernel.run("print('plotly' in sys.modules)").strip() == "False"
    # A reloaded page asks each widget for its state: the chart's holds all 50,000 points.
    chart = chart_comm_id(cell)
    kernel.send_comm(chart, {"method": "request_state"})
    [reply] = kernel.comm_messages(30, until=lambda m: m["content"]["data"].get(
        "method") == "update" and "series" in m["content"]["data"]["state"])[-1:]
    data = reply["content"]["data"]
    buffers = {tuple(p): bytes(b) for p, b in zip(data["buffer_paths"], reply["buffers"])}
    series = dict(data["state"]["series"], x=buffers[("series", "x")],
                  y=buffers[("series", "y")])
    decoded = decode_series(series)
    assert len(decoded) == 500 and sum(len(xs) for xs, _ in decoded.values()) == 50_000
    kernel.run("big.close()")


def test_no_view_no_messages_then_a_view_is_caught_up_and_controls_name_trials(kernel, tmp_path):
    paths, state = write_experiment(str(tmp_path), "live", 3, 5, finished=1, partial=[2, 2],
                                    status="RUNNING")
    lease = Lease.acquire(paths, what="run")
    lease.start_heartbeat()
    try:
        cell = _show(kernel, paths.dir, "live")
        chart = chart_comm_id(cell)
        a, b = state.trials[1], state.trials[2]
        # The cell ended and no view reported itself: rows come, nothing is sent.
        for step in (3, 4):
            _append(paths, a, 1, step)
            assert kernel.comm_messages(1.5) == []
        assert json.loads(kernel.run("print(json.dumps(live.stats))"))["unviewed"] >= 1
        # A view opens: it gets every point as it is now, and the header.
        kernel.report_view(chart, "open", view="v1")
        got = kernel.comm_messages(30, until=lambda m: (_custom(m) or {}).get("type") == "series")
        full = got[-1]
        series = decode_series(_custom(full), full["buffers"])
        assert series[a.trial_id][0] == [1, 2, 3, 4]
        # While it looks, a new row goes as an append of that row alone.
        _append(paths, b, 2, 3)
        got = kernel.comm_messages(30, until=lambda m: (_custom(m) or {}).get("type") == "delta")
        assert _custom(got[-1])["trials"] == {b.trial_id: {"start": 2, "x": [3],
                                                            "y": [_row(2, 3, "")["loss"]]}}
        # A stop for a trial that ended, or one that is not there, is refused: no other trial
        # is stopped in its place (the id, never a position, travels).
        for trial_id, words in ((state.trials[0].trial_id, "already ended (TERMINATED)"),
                                ("nope_00007", "No trial nope_00007")):
            kernel.send_comm(chart, {"method": "custom", "content": {
                "type": "stop_trial", "trial_id": trial_id, "request": 3, "view": "v1"}})
            got = kernel.comm_messages(
                30, until=lambda m: (_custom(m) or {}).get("type") == "reply")
            reply = _custom(got[-1])
            assert reply["ok"] is False and words in reply["text"], reply
        assert paths.control_request_ids() == []  # no request was written
        # The view goes: silence again.
        kernel.report_view(chart, "close", view="v1")
        _append(paths, a, 1, 5)
        wait_for(lambda: json.loads(kernel.run("print(json.dumps(live.chart.views))")) == 0,
                 timeout=10, what="the view to be gone")
        assert kernel.comm_messages(1.5) == []
        kernel.run("live.close()")
    finally:
        lease.release()


RAISES = '''
def fails_here(config):
    step = config["x"] + 1
    raise ValueError(f"boom in a notebook cell at {step}")  # the line a traceback shows
'''


def test_a_notebook_trainable_traceback_shows_its_source_line(kernel, tmp_path):
    kernel.run("%load_ext ftnb\n" + RAISES)
    store = str(tmp_path / "store")
    # In the kernel's own Tuner, and through a detached supervisor (%ftrun): each trial's
    # traceback carries the cell's line.
    kernel.run(f"grid = ftnb.run(fails_here, param_space={{'x': 1}}, name='inline', "
               f"storage_path={store!r})")
    kernel.run("space = {'x': 2}")
    kernel.run(f"%ftrun fails_here -p space --name detached --storage {store} "
               "--wait --no-widget -q")
    for name, step in (("inline", 2), ("detached", 3)):
        trials = ftnb.attach(os.path.join(store, name)).state().trials
        [failure] = trials[0].failures
        assert failure.type == "ValueError" and f"at {step}" in failure.message
        assert 'raise ValueError(f"boom in a notebook cell at {step}")' in failure.traceback, (
            failure.traceback)


# -- the ES module in a real browser (no JupyterLab: a page gives it a model) -----------------
_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style id="css"></style></head>
<body><div id="host" style="width:800px"></div><script type="module">
import chart from "./chart.js";
const state = await (await fetch("./state.json")).json();
const bytes = (b64) => { const s = atob(b64), a = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) a[i] = s.charCodeAt(i); return new DataView(a.buffer); };
state.series.x = bytes(state.series.x); state.series.y = bytes(state.series.y);
document.getElementById("css").textContent = state._css;
const handlers = {};
window.sent = [];
window.model = {
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
  on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); },
  off: (e, f) => { handlers[e] = (handlers[e] || []).filter((g) => g !== f); },
  send: (m) => window.sent.push(m), save_changes: () => window.sent.push({saved: true}),
};
window.fire = (e, ...args) => (handlers[e] || []).forEach((f) => f(...args));
window.cleanup = chart.render({model: window.model, el: document.getElementById("host")});
window.ready = true;
</script></body></html>"""


@pytest.fixture
def chart_page(tmp_path):
    """A page serving the chart's ES module and a widget's state (its buffers as base64)."""
    import base64
    import functools
    import http.server
    import threading

    from ftnb.notebook import chart as chart_module

    paths, state = write_experiment(str(tmp_path / "runs"), "page", 4, 20, finished=3,
                                    partial=[5])
    stopped = state.trials[1]
    stopped.note = "stopped by user"
    stopped.attempts[0].outcome = "stopped"
    stopped.seq += 1
    paths.storage.write_atomic(paths.trial(stopped.dir_name).record,
                               json.dumps(stopped.to_json()))
    w = ExperimentWidget(ftnb.attach(paths.dir), start=False)
    try:
        data = w.chart.get_state()
    finally:
        w.close()
    data["series"] = dict(data["series"], x=base64.b64encode(data["series"]["x"]).decode(),
                          y=base64.b64encode(data["series"]["y"]).decode())
    data["controls"] = dict(data["controls"], running=True)
    site = tmp_path / "site"
    site.mkdir()
    (site / "state.json").write_text(json.dumps(data))
    (site / "chart.js").write_text(data["_esm"])
    (site / "page.html").write_text(_PAGE)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/page.html", state, chart_module
    finally:
        server.shutdown()


def test_the_es_module_draws_the_state_and_names_trials_by_id(chart_page):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright")
    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("needs Debian's chromium (/usr/bin/chromium)")
    url, state, _ = chart_page
    ids = [t.trial_id for t in state.trials]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.wait_for_function("window.ready === true", timeout=20_000)
            lines = page.eval_on_selector_all(
                "[data-testid=ftnb-chart] path.ftnb-line",
                "es => es.map(e => [e.dataset.trialId, e.dataset.status,"
                " e.getAttribute('stroke-dasharray')])")
            assert lines == [[ids[0], "TERMINATED", None], [ids[1], "STOPPED", "7 3"],
                             [ids[2], "TERMINATED", None], [ids[3], "RUNNING", None]]
            legend = page.inner_text("[data-testid=ftnb-chart-legend]")
            assert "lr=0.002, layers=3" in legend and "STOPPED" in legend
            options = page.eval_on_selector_all("[data-testid=ftnb-trial-select] option",
                                                "es => es.map(e => e.value)")
            assert options == [ids[3]]  # by id; the running one only
            # No ftnb server extension behind this page: the widget says controls wait.
            page.wait_for_function("document.querySelector('[data-testid=ftnb-control-mode]')"
                                   ".textContent.includes('wait for the kernel')")
            page.click("[data-testid=ftnb-stop-trial]")
            sent = page.evaluate("window.sent")
            assert sent[0]["type"] == "view" and sent[0]["event"] == "open"
            assert sent[0]["points"] == 3 * 20 + 5
            assert {k: sent[-1][k] for k in ("type", "trial_id")} == {
                "type": "stop_trial", "trial_id": ids[3]}
            page.evaluate("fire('msg:custom', {type: 'reply', view: window.sent.at(-1).view,"
                          " ok: false, text: 'refused: it ended'}, [])")
            assert page.inner_text("[data-testid=ftnb-control-status]") == "refused: it ended"
            # An append lengthens a line; one that skips rows asks for everything again.
            page.evaluate(f"fire('msg:custom', {{type: 'delta', metric: 'loss', trials: "
                          f"{{{ids[3]}: {{start: 5, x: [6, 7], y: [0.1, 0.09]}}}}}}, [])")
            page.wait_for_function(
                f"document.querySelector('[data-trial-id={ids[3]}]')"
                ".getAttribute('d').split('L').length === 7")
            page.evaluate(f"fire('msg:custom', {{type: 'delta', metric: 'loss', trials: "
                          f"{{{ids[3]}: {{start: 50, x: [51], y: [0.1]}}}}}}, [])")
            assert page.evaluate("window.sent.at(-1).type") == "resync"
            page.check("[data-testid=ftnb-log-scale]")
            assert page.evaluate("window.model.get('log_y')") is True
            page.wait_for_function("[...document.querySelectorAll('[data-testid=ftnb-chart]"
                                   " text')].some(e => e.textContent === 'loss (log)')")
            # A tab sent to the background is nobody looking; back in front, a view again.
            for state, event in (("hidden", "close"), ("visible", "open")):
                page.evaluate(f"Object.defineProperty(document, 'visibilityState', "
                              f"{{value: '{state}', configurable: true}});"
                              "document.dispatchEvent(new Event('visibilitychange'))")
                assert page.evaluate("window.sent.at(-1).event") == event
            page.evaluate("window.cleanup()")
            assert page.evaluate("window.sent.at(-1).event") == "close"
            assert errors == []
        finally:
            browser.close()


def test_the_plotly_chart_is_still_there_for_those_who_want_it(tmp_path):
    pytest.importorskip("plotly", reason="ftnb.notebook.plots needs plotly")
    from ftnb.notebook.plots import TrialChart
    from ftnb.ui.monitor import ExperimentMonitor

    paths, state = write_experiment(str(tmp_path), "plotted", 3, 4)
    chart = TrialChart("loss")
    assert chart.update(ExperimentMonitor(paths).poll(), "loss")
    assert set(chart.trial_traces) == {t.trial_id for t in state.trials}
    assert list(chart.trace(state.trials[0].trial_id).x) == [1, 2, 3, 4]


BUSY_CELLS = ["import ftnb\nw = ftnb.attach({path!r}).widget()\nw",
              "print('waiting', flush=True)\nftnb.attach({path!r}).wait()"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_widget_stops_the_trial_it_names_while_the_kernel_is_busy(request, tmp_path):
    """JupyterLab with ftnb's server extension (tests/conftest.py's ``lab_server``): the
    widget's Stop trial, clicked while a cell waits on the experiment, stops the trial chosen,
    through the server, and the cell is still busy."""
    import time

    try:
        lab_server = request.getfixturevalue("lab_server")
        chromium = request.getfixturevalue("chromium")
    except pytest.FixtureLookupError:
        pytest.skip("needs the lab_server and chromium fixtures (the browser tests')")
    from scripted import scripted

    handle = ftnb.launch(
        scripted, name="widget_busy", storage_path=str(lab_server.experiments), quiet=True,
        param_space={"n": ftnb.grid_search([1, 10_000, 10_000]), "sleep": 0.05, "ckpt_every": 0},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2))
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    try:
        def statuses():
            return {t.trial_id: str(t.status) for t in handle.state().trials}

        wait_for(lambda: list(statuses().values()) == ["TERMINATED", "RUNNING", "RUNNING"],
                 timeout=60, what="trial 0 done, trials 1 and 2 running")
        first, second, third = sorted(statuses())
        cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
                  "outputs": [], "source": source.format(path=handle.path)}
                 for i, source in enumerate(BUSY_CELLS)]
        (lab_server.notebooks / "widget_busy.ipynb").write_text(json.dumps({
            "cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {
                "display_name": "Python 3", "language": "python", "name": "python3"}}}))
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(lab_server.page_url("lab/tree/widget_busy.ipynb"))
        page.locator("#jp-main-dock-panel").wait_for()
        # The kernel started (a cold JupyterLab takes a while): the status bar says Idle.
        page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for()
        notebook_cells = page.locator(".jp-Notebook .jp-CodeCell")
        notebook_cells.first.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")  # the widget
        select = page.locator("[data-testid=ftnb-widget] [data-testid=ftnb-trial-select]")
        select.locator(f"option[value='{third}']").wait_for(state="attached")
        page.keyboard.press("Shift+Enter")  # the busy cell
        busy_cell = notebook_cells.nth(1)
        busy_cell.locator(".jp-OutputArea-output", has_text="waiting").wait_for()
        busy = busy_cell.locator(".jp-InputPrompt", has_text="*")
        assert busy.count() == 1
        page.locator("[data-testid=ftnb-control-mode]",
                     has_text="through the Jupyter server").wait_for()
        select.select_option(third)
        page.locator("[data-testid=ftnb-widget] [data-testid=ftnb-stop-trial]").click()
        clicked = time.monotonic()
        wait_for(lambda: statuses()[third] == "TERMINATED", timeout=30,
                 what=f"trial {third} stopped")
        print(f"stopped {time.monotonic() - clicked:.2f} s after the click")
        now = statuses()
        assert now[second] == "RUNNING" and now[first] == "TERMINATED", now
        assert busy.count() == 1, "the cell ended: the stop must not need the kernel"
        page.locator("[data-testid=ftnb-control-status]",
                     has_text="through the Jupyter server").wait_for()
    finally:
        context.close()
        handle.stop()
        handle.wait(timeout=60)


SILENT_DRIVER = """
import sys, time
from ftnb.storage import ExperimentPaths, Storage
from ftnb.storage.lease import Lease
lease = Lease.acquire(ExperimentPaths.of(Storage(sys.argv[1]), sys.argv[2]), what="run")
lease.start_heartbeat()
print("owner", flush=True)
time.sleep(600)
"""


class _RecordingHandle:
    """A real handle whose resume is recorded, not run (the synthetic experiment has no
    trainable to resume with)."""

    def __init__(self, real):
        self._real, self.name, self.path = real, real.name, real.path
        self.resumed = []

    def __getattr__(self, name):  # monitor, stop, stop_trial, silent_driver: the real ones
        return getattr(self._real, name)

    def resume(self, **kwargs):
        self.resumed.append(kwargs)
        return self


def test_a_silent_driver_shows_its_countdown_and_the_take_over_control(tmp_path):
    import signal
    import subprocess

    paths, _ = write_experiment(str(tmp_path), "silent", 2, 5, finished=1, partial=[2],
                                    status="RUNNING")
    # A driver on "another machine" (its host id says so): once killed, its death cannot be
    # proven from here, so it reads RUNNING, silent, until its TTL.
    env = dict(subprocess_env(), FTNB_HOST_ID="a-container-that-is-gone",
               FTNB_LEASE_TTL_S="120", FTNB_LEASE_HEARTBEAT_S="0.3")
    driver = subprocess.Popen([sys.executable, "-c", SILENT_DRIVER, str(tmp_path), "silent"],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "owner"
        handle = _RecordingHandle(ftnb.attach(paths.dir))
        w = ExperimentWidget(handle, start=False)
        try:
            assert w.chart.controls["takeover"] is None  # it beats: nothing to take over
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)

            def offer():
                w.refresh()
                return w.chart.controls["takeover"]

            takeover = wait_for(offer, timeout=20, what="the driver to read silent")
            assert takeover["available"] is True
            assert "has been silent for" in takeover["text"]
            assert "counts as dead in" in takeover["text"]
            assert w.snapshot.status == "RUNNING" and w.chart.controls["running"]
            # A stop is written, but the silent driver may never read it: the status line
            # says so (the handle's words: for how long, when it counts as dead) and points
            # at the Take over button.
            for stop, what in ((lambda: w.stop_trial("synth_00001"), "trial synth_00001 of "),
                               (w.stop, "")):
                ok, text = stop()
                assert ok, text
                assert (f"{what}experiment 'silent' is not stopped yet: its driver is silent"
                        in text), text
                assert "has been silent for" in text and "counts as dead in" in text, text
                assert text.endswith("or with the Take over button."), text
                assert html.escape(text) in w.status_line.value
            ok, text = w.take_over()
            assert ok, text
            assert handle.resumed == [{"wait": False, "takeover": True}]
        finally:
            w.close()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
