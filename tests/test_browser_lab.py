"""The JupyterLab panel and the notebook widget in a real browser: a JupyterLab server started
here (``lab_server``, with the panel from labextension/'s build output and ftnb's server
extension), Debian's chromium driven by Playwright (``chromium``), real experiments with real
trial processes.

Each test saves a screenshot of what it checked under ``test-artifacts/browser/`` at the
repository root (git-ignored). Skipped, saying why, without chromium, playwright, jupyterlab or
the built panel (.ci/run installs and builds all of them).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

import ftnb
from procs import REPO, wait_for
from scripted import scripted

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

ARTIFACTS = os.path.join(REPO, "test-artifacts", "browser")
#: The issue's bound for a stop clicked in the panel to reach the trial (kernel busy).
STOP_BOUND_S = 2.0

# Four trials of 4 iterations, failures injected: one raises once, one is SIGKILLed once, one
# raises at the same point on every attempt (stopped as a deterministic bug after 2), one never
# fails. 4 failures in all; 3 trials end TERMINATED, 1 ERRORED.
FAULTS = [{}, {"1": [2, "raise"]}, {"1": [2, "sigkill"]}, {"1": [2, "raise"], "2": [2, "raise"]}]


def _screenshot(page, name: str) -> str:
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, f"{name}.png")
    page.screenshot(path=path, full_page=True)
    return path


def _write_notebook(folder, name: str, source: str = "") -> str:
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c0", "metadata": {},
                     "outputs": [], "source": source}],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                      "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    (folder / name).write_text(json.dumps(nb))
    return name


@pytest.fixture(scope="module")
def faults_experiment(lab_server):
    """A finished experiment with injected failures under the server's root: its handle."""
    ftnb.run(scripted, name="faults", storage_path=str(lab_server.experiments),
             param_space={"n": 4, "ckpt_every": 1, "faults": ftnb.grid_search(FAULTS)},
             run_config=ftnb.RunConfig(verbose=0,
                                       failure_config=ftnb.FailureConfig(max_failures=1)))
    return ftnb.attach(str(lab_server.experiments / "faults"))


@pytest.fixture
def page(chromium, lab_server, request):
    """A fresh browser page; what it showed when its test failed is saved as
    ``<test name>_failed.png``."""
    context = chromium.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(60_000)
    failed_before = request.session.testsfailed
    yield page
    if request.session.testsfailed > failed_before:
        _screenshot(page, f"{request.node.name}_failed")
    context.close()
    assert not [e for e in errors if "ftnb" in e], f"errors in the page: {errors}"


def _open_lab(page, lab_server, workspace: str, notebook: str = "") -> None:
    """JupyterLab in a workspace of its own (nothing another test opened is restored), with
    ``notebook`` open and its kernel idle: a cell run while the kernel still starts is not run
    (JupyterLab moves on to the next cell, leaving the prompt empty)."""
    page.goto(lab_server.page_url(f"lab/workspaces/{workspace}"
                                  + (f"/tree/{notebook}" if notebook else "")))
    page.locator("#jp-main-dock-panel").wait_for()
    if notebook:
        _wait_for_kernel_idle(page)


def _wait_for_kernel_idle(page) -> None:
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel?.status"
        " === 'idle'")


#: The code cells of the notebook shown (not of one hidden in another tab).
CODE_CELLS = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell"


def _open_panel(page):
    """Show the ftnb panel (its tab in the left sidebar) and return it."""
    panel = page.locator("[data-testid=ftnb-lab-panel]")
    if not panel.is_visible():
        page.locator(".jp-SideBar .lm-TabBar-tab[data-id=ftnb-experiments]").click()
    panel.wait_for(state="visible")
    return panel


def _luminance(locator, css_property: str) -> float:
    """The relative luminance (0 black .. 1 white) of an element's computed color."""
    color = locator.evaluate(f"e => getComputedStyle(e).getPropertyValue('{css_property}')")
    r, g, b = (int(v) / 255 for v in re.findall(r"[\d.]+", color)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _trial_statuses(handle) -> dict[str, str]:
    return {t.trial_id: str(getattr(t.status, "value", t.status)) for t in handle.state().trials}


def test_the_sidebar_lists_an_experiment_with_its_failures_and_trial_counts(
        page, lab_server, faults_experiment):
    statuses = _trial_statuses(faults_experiment)
    assert sorted(statuses.values()) == ["ERRORED", "TERMINATED", "TERMINATED", "TERMINATED"]
    _open_lab(page, lab_server, "sidebar")
    panel = _open_panel(page)
    row = panel.locator("[data-testid=ftnb-lab-experiment][data-name=faults]")
    row.wait_for()
    assert row.get_attribute("data-status") == faults_experiment.status()
    counts = {c.get_attribute("data-status"): int(c.get_attribute("data-count"))
              for c in row.locator("[data-testid=ftnb-lab-count]").all()}
    assert counts == {"TERMINATED": 3, "ERRORED": 1}
    assert row.locator("[data-testid=ftnb-lab-failures]").get_attribute("data-count") == "4"
    _screenshot(page, "sidebar_list")

    # Its detail: every trial, every failure with its traceback.
    row.click()
    detail = panel.locator("[data-testid=ftnb-lab-detail]")
    detail.wait_for()
    trials = detail.locator("[data-testid=ftnb-lab-trial]")
    wait_for(lambda: trials.count() == 4, timeout=30, what="the 4 trial rows")
    assert {t.get_attribute("data-trial-id"): t.get_attribute("data-status")
            for t in trials.all()} == statuses
    failures = detail.locator("details.ftnb-failure")
    assert failures.count() == 4
    failures.first.locator("summary").click()
    assert "Traceback" in failures.first.locator("pre").inner_text()
    chart = detail.locator("[data-testid=ftnb-lab-chart]")
    wait_for(lambda: chart.get_attribute("data-lines") == "4", timeout=30, what="4 chart lines")
    _screenshot(page, "sidebar_failures")

    # Themed: in JupyterLab's dark theme the panel and its chart are dark too.
    assert _luminance(panel, "background-color") > 0.8
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme',"
                  " {theme: 'JupyterLab Dark'})")
    page.locator("body[data-jp-theme-light=false]").wait_for(state="attached")
    wait_for(lambda: _luminance(panel, "background-color") < 0.2, timeout=30,
             what="the panel's background dark")
    assert _luminance(chart.locator(".ftnb-chart-tick").first, "fill") > 0.5
    _screenshot(page, "sidebar_dark")
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme',"
                  " {theme: 'JupyterLab Light'})")


def test_a_stop_clicked_in_the_panel_stops_that_trial_while_a_cell_is_busy(
        page, lab_server, tmp_path):
    # Two at a time: trial 0 ends at once, so trials 1 and 2 run and the list of running
    # trials has shrunk (what made the old widget stop the wrong one).
    handle = ftnb.launch(
        scripted, name="busy", storage_path=str(lab_server.experiments), quiet=True,
        param_space={"n": ftnb.grid_search([1, 10_000, 10_000]), "sleep": 0.05, "ckpt_every": 0},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2))
    try:
        wait_for(lambda: list(_trial_statuses(handle).values())
                 == ["TERMINATED", "RUNNING", "RUNNING"], timeout=60,
                 what="trial 0 done, trials 1 and 2 running")
        first, second, third = sorted(_trial_statuses(handle))
        notebook = _write_notebook(
            lab_server.notebooks, "busy.ipynb",
            f"import ftnb\nprint('waiting', flush=True)\nftnb.attach({handle.path!r}).wait()")
        _open_lab(page, lab_server, "busy", notebook)
        cell = page.locator(CODE_CELLS).first
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        # The kernel is busy in wait() (until the experiment ends): it printed, and its prompt
        # shows [*] until the cell ends.
        cell.locator(".jp-OutputArea-output", has_text="waiting").wait_for()
        busy = cell.locator(".jp-InputPrompt", has_text="*")
        assert busy.count() == 1

        panel = _open_panel(page)
        panel.locator("[data-testid=ftnb-lab-experiment][data-name=busy]").click()
        stop = panel.locator(f"[data-testid=ftnb-lab-stop-trial][data-trial-id='{third}']")
        stop.wait_for()
        stop.click()
        clicked = time.monotonic()
        wait_for(lambda: _trial_statuses(handle)[third] == "TERMINATED", timeout=STOP_BOUND_S,
                 what=f"trial {third} stopped within {STOP_BOUND_S} s of the click")
        stopped_after = time.monotonic() - clicked
        statuses = _trial_statuses(handle)
        assert statuses[second] == "RUNNING" and statuses[first] == "TERMINATED", statuses
        assert busy.count() == 1, "the cell ended: the stop must not need the kernel"
        row = panel.locator(f"[data-testid=ftnb-lab-trial][data-trial-id='{third}']"
                            "[data-status=TERMINATED]")
        row.wait_for()
        # Stopped by the user, not completed: shown as such.
        assert row.locator(".ftnb-status").inner_text() == "STOPPED"
        _screenshot(page, "stop_while_busy")
        print(f"trial stopped {stopped_after:.2f} s after the click")
    finally:
        handle.stop()
        handle.wait(timeout=60)


def test_the_widget_shows_its_whole_chart_again_after_a_page_reload(
        page, lab_server, faults_experiment):
    notebook = _write_notebook(lab_server.notebooks, "widget.ipynb")
    _open_lab(page, lab_server, "widget", notebook)
    page.locator(CODE_CELLS).first.click()
    # The panel's "Open widget" inserts and runs the attach cell in this notebook.
    panel = _open_panel(page)
    panel.locator("[data-testid=ftnb-lab-experiment][data-name=faults]").click()
    panel.locator("[data-testid=ftnb-lab-open-widget]").click()
    before = _chart_lines(page, expected=4)
    # Every row of every trial: 4 iterations each, 1 for the trial that failed at its second.
    assert sorted(len(ys) for ys in _heights(before).values()) == [1, 4, 4, 4]
    page.keyboard.press("Control+s")
    wait_for(lambda: "widget-view" in (lab_server.notebooks / notebook).read_text(),
             timeout=30, what="the notebook saved with the widget's output")

    page.reload()
    page.locator("#jp-main-dock-panel").wait_for()
    after = _chart_lines(page, expected=4)
    # The same points (the chart's width may differ: the sidebar may be open or not).
    assert _heights(after) == _heights(before)
    _screenshot(page, "widget_after_reload")


def _heights(lines: dict[str, str]) -> dict[str, list[str]]:
    """Each line's vertices' y coordinates (an SVG path ``M x,y L x,y ...``)."""
    return {trial: [xy.split(",")[1] for xy in re.split(r"[ML]", d) if xy]
            for trial, d in lines.items()}


def _chart_lines(page, expected: int) -> dict[str, str]:
    """The widget chart's lines (trial id -> path) once it shows ``expected`` of them."""
    lines = page.locator("[data-testid=ftnb-widget] [data-testid=ftnb-chart] path[data-trial-id]")
    try:
        wait_for(lambda: lines.count() == expected, timeout=60,
                 what=f"{expected} lines in the widget's chart")
    except AssertionError as exc:
        found = page.evaluate("""() => [...document.querySelectorAll(
            '[data-testid=ftnb-chart] path')].map(p => p.outerHTML.slice(0, 160))""")
        raise AssertionError(f"{exc}; the chart's paths: {found}") from None
    return {p.get_attribute("data-trial-id"): p.get_attribute("d") for p in lines.all()}
