"""The JupyterLab panel at its default width, in Debian's chromium (Playwright), on the shared
JupyterLab server (``lab_server``): every trial's controls reachable without a sideways scroll,
text readable (WCAG AA, computed from the rendered styles) in the light and the dark theme, a
labelled metric dropdown, the filter box and progress figures, delete (asks once, refuses a live
experiment with the server's message), and polls of an unchanged list that download no body.
Screenshots go to ``test-artifacts/browser/`` as in test_browser_lab.py."""

from __future__ import annotations

import contextlib

import pytest

import ftnb
from procs import wait_for
from scripted import scripted
import test_browser_lab
from test_browser_lab import _luminance, _open_lab, _open_panel, _screenshot, _trial_statuses

#: test_browser_lab's page fixture (a fresh page; a failed test's screenshot).
page = test_browser_lab.page

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

#: JupyterLab's default width of a left-sidebar panel (px), the width the panel must fit.
DEFAULT_WIDTH = 250
#: WCAG 2 AA: the least contrast of normal text with its background.
AA_TEXT = 4.5

# Long params, as a real sweep has: they must wrap, not push Stop off to the right.
LONG = {"learning_rate_schedule": ftnb.grid_search(
    [f"cosine_with_linear_warmup_and_hard_restarts_{i}" for i in range(3)]),
    "n": 10_000, "sleep": 0.05, "ckpt_every": 0}

# Every visible text of the panel (not a disabled control's): its color composited over the
# backgrounds under it, and the WCAG contrast ratio with them.
CONTRASTS_JS = """panel => {
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 1;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  const rgba = c => {
    ctx.clearRect(0, 0, 1, 1); ctx.fillStyle = '#000'; ctx.fillStyle = c; ctx.fillRect(0, 0, 1, 1);
    const d = ctx.getImageData(0, 0, 1, 1).data;
    return [d[0], d[1], d[2], d[3] / 255];
  };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3]));
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let color = [255, 255, 255];
    for (const layer of layers.reverse()) color = over(layer, color);
    return color;
  };
  const lum = c => {
    const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const out = [];
  for (const el of panel.querySelectorAll('*')) {
    const text = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
    const rect = el.getBoundingClientRect();
    if (!text || rect.width === 0 || el.closest(':disabled') || el.closest('[hidden]')) continue;
    const style = getComputedStyle(el);
    const isSvg = el instanceof SVGElement;
    const bgEl = isSvg ? el.closest('svg').parentElement : el;
    const bg = background(bgEl);
    const fg = over(rgba(isSvg ? style.fill : style.color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    out.push({text: text.slice(0, 40), cls: String(el.className.baseVal ?? el.className), ratio: (hi + 0.05) / (lo + 0.05)});
  }
  return out;
}"""

# Whatever of the panel ends right of its visible width (what only a sideways scroll shows).
OVERFLOW_JS = """panel => {
  const right = panel.getBoundingClientRect().right + 0.5;
  const out = [];
  for (const el of panel.querySelectorAll('button, select, input, [data-testid], .ftnb-params, code')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > right) out.push(`${el.dataset.testid || el.className}: ${r.right}`);
  }
  return {width: panel.getBoundingClientRect().width, scrollWidth: panel.scrollWidth,
          clientWidth: panel.clientWidth, outside: out};
}"""


def _contrasts(panel) -> list[dict]:
    return panel.evaluate(CONTRASTS_JS)


def _assert_readable(panel, theme: str) -> None:
    texts = _contrasts(panel)
    assert len(texts) >= 5
    low = [t for t in texts if t["ratio"] < AA_TEXT]
    assert not low, f"{theme}: text under {AA_TEXT}:1: {low}"
    print(f"{theme}: {len(texts)} texts, least contrast {min(t['ratio'] for t in texts):.2f}:1")


def _assert_fits(panel) -> dict:
    fit = panel.evaluate(OVERFLOW_JS)
    assert fit["width"] <= DEFAULT_WIDTH + 1, f"not at the default width: {fit}"
    assert fit["scrollWidth"] <= fit["clientWidth"], f"the panel scrolls sideways: {fit}"
    assert not fit["outside"], f"controls right of the panel's width: {fit['outside']}"
    return fit


def _set_theme(page, name: str, light: bool) -> None:
    page.evaluate(f"window.jupyterapp.commands.execute('apputils:change-theme', {{theme: '{name}'}})")
    page.locator(f"body[data-jp-theme-light={'true' if light else 'false'}]").wait_for(
        state="attached")


@contextlib.contextmanager
def _dark_theme(page, panel):
    """JupyterLab's dark theme, applied to the panel (its background dark), then light again."""
    _set_theme(page, "JupyterLab Dark", light=False)
    try:
        wait_for(lambda: _luminance(panel, "background-color") < 0.2, timeout=30,
                 what="the panel's background dark")
        yield
    finally:
        _set_theme(page, "JupyterLab Light", light=True)
        wait_for(lambda: _luminance(panel, "background-color") > 0.8, timeout=30,
                 what="the panel's background light again")


@pytest.fixture(scope="module")
def live(lab_server):
    """A running sweep of three long trials with long params: its handle; stopped at the end."""
    handle = ftnb.launch(scripted, name="narrow", storage_path=str(lab_server.experiments),
                         quiet=True, param_space=LONG)
    try:
        wait_for(lambda: list(_trial_statuses(handle).values()).count("RUNNING") >= 2,
                 timeout=90, what="two trials running")
        yield handle
    finally:
        handle.stop()
        handle.wait(timeout=60)


def test_at_its_default_width_every_control_fits_and_text_is_readable_in_both_themes(
        page, lab_server, live):
    _open_lab(page, lab_server, "narrow")
    panel = _open_panel(page)
    row = panel.locator("[data-testid=ftnb-lab-experiment][data-name=narrow]")
    row.wait_for()
    progress = row.locator("[data-testid=ftnb-lab-progress]")
    assert progress.get_attribute("data-total") == "3"
    assert progress.inner_text().endswith(f"{progress.get_attribute('data-done')}/3 done")
    _assert_fits(panel)

    row.click()
    detail = panel.locator("[data-testid=ftnb-lab-detail]")
    stops = detail.locator("[data-testid=ftnb-lab-stop-trial]")
    wait_for(lambda: stops.count() >= 2, timeout=30, what="Stop on the running trials")
    wait_for(lambda: detail.locator("[data-testid=ftnb-lab-trial-metric]").count() == 3,
             timeout=30, what="each trial's metric")
    fit = _assert_fits(panel)
    for stop in stops.all():  # reachable: a real click lands on it, no scrolling sideways
        box = stop.bounding_box()
        assert box["x"] + box["width"] <= fit["width"] + panel.bounding_box()["x"] + 0.5
    params = detail.locator("[data-testid=ftnb-lab-trial-params]").first
    assert "learning_rate_schedule=\"cosine_with_linear_warmup_and_hard_restarts_" in (
        params.inner_text().replace("\n", ""))
    # The metric dropdown has an accessible name.
    metric = page.get_by_role("combobox", name="Metric", exact=True)
    assert metric.count() == 1 and metric.get_attribute("data-testid") == "ftnb-lab-metric"
    assert page.get_by_label("Metric", exact=True).count() == 1
    _screenshot(page, "panel_narrow_light")
    _assert_readable(panel, "light")
    with _dark_theme(page, panel):
        _assert_readable(panel, "dark")
        _assert_fits(panel)
        _screenshot(page, "panel_narrow_dark")
        # The list too, in the dark theme.
        detail.locator(".ftnb-back").click()
        panel.locator("[data-testid=ftnb-lab-experiment][data-name=narrow]").wait_for()
        _assert_readable(panel, "dark list")
    _assert_readable(panel, "light list")


def test_the_filter_finds_an_experiment_among_many_and_keeps_its_focus(page, lab_server, live):
    for i in range(3):  # more experiments, ended
        ftnb.run(scripted, name=f"other{i}", storage_path=str(lab_server.experiments),
                 param_space={"n": 1}, run_config=ftnb.RunConfig(verbose=0))
    _open_lab(page, lab_server, "filter")
    panel = _open_panel(page)
    rows = panel.locator("[data-testid=ftnb-lab-experiment]")
    wait_for(lambda: rows.count() >= 4, timeout=30, what="the experiments listed")
    box = panel.locator("[data-testid=ftnb-lab-filter]")
    box.fill("narrow")
    wait_for(lambda: [r.get_attribute("data-name") for r in rows.all()] == ["narrow"],
             timeout=10, what="only 'narrow' listed")
    box.press("End")
    page.keyboard.type(" running")  # typed on: the box kept its focus across redraws
    assert box.input_value() == "narrow running"
    assert [r.get_attribute("data-name") for r in rows.all()] == ["narrow"]
    box.fill("status:finished other1")
    wait_for(lambda: [r.get_attribute("data-name") for r in rows.all()] == ["other1"],
             timeout=10, what="only 'other1' listed")
    assert "1 of" in panel.locator("[data-testid=ftnb-lab-filter-count]").inner_text()
    done = rows.first.locator("[data-testid=ftnb-lab-progress]")
    assert (done.get_attribute("data-done"), done.get_attribute("data-total")) == ("1", "1")
    box.fill("")
    wait_for(lambda: rows.count() >= 4, timeout=10, what="everything listed again")


def test_an_unchanged_list_is_polled_without_its_body(page, lab_server, live):
    polls: list[tuple[int, int]] = []

    pages: list[tuple[int, int]] = []

    def seen(response):
        into = (polls if "/ftnb/api/experiments?" in response.url
                else pages if "/ftnb/api/experiment?" in response.url else None)
        if into is not None:
            try:
                size = len(response.body())
            except Exception:  # a 304 has no body to read
                size = 0
            into.append((response.status, size))

    page.on("response", seen)
    _open_lab(page, lab_server, "polls")
    panel = _open_panel(page)
    panel.locator("[data-testid=ftnb-lab-experiment][data-name=narrow]").wait_for()
    live.stop()
    live.wait(timeout=60)
    panel.locator("[data-testid=ftnb-lab-experiment][data-name=narrow]"
                  "[data-status=INTERRUPTED]").wait_for()

    def unchanged_polls():  # four polls in a row answered 304, without a body
        page.evaluate("0")  # (Playwright's sync API delivers page events during its calls)
        tail = polls[-4:]
        return len(tail) == 4 and all(p == (304, 0) for p in tail)

    wait_for(unchanged_polls, timeout=30, what=f"four polls in a row answered 304: {polls}")
    full = max(size for status, size in polls if status == 200)
    print(f"list polls: {polls}; a full list is {full} bytes, an unchanged one 0")
    assert full > 0

    # Its page, ended, is polled the same way.
    panel.locator("[data-testid=ftnb-lab-experiment][data-name=narrow]").click()
    panel.locator("[data-testid=ftnb-lab-detail]").wait_for()

    def unchanged_pages():
        page.evaluate("0")
        tail = pages[-3:]
        return len(tail) == 3 and all(p == (304, 0) for p in tail)

    wait_for(unchanged_pages, timeout=30, what="three polls of its page answered 304")
    print(f"page polls: {pages}")


def test_delete_refuses_a_live_experiment_and_asks_once(page, lab_server):
    handle = ftnb.launch(scripted, name="doomed", storage_path=str(lab_server.experiments),
                         quiet=True, param_space={"n": 10_000, "sleep": 0.05, "ckpt_every": 0})
    try:
        wait_for(lambda: "RUNNING" in _trial_statuses(handle).values(), timeout=90,
                 what="its trial running")
        _open_lab(page, lab_server, "delete")
        panel = _open_panel(page)
        panel.locator("[data-testid=ftnb-lab-experiment][data-name=doomed]").click()
        detail = panel.locator("[data-testid=ftnb-lab-detail][data-status=RUNNING]")
        detail.wait_for()
        detail.locator("[data-testid=ftnb-lab-delete]").click()
        detail.locator("[data-testid=ftnb-lab-delete-cancel]").click()  # asked; cancelled
        detail.locator("[data-testid=ftnb-lab-delete]").click()
        detail.locator("[data-testid=ftnb-lab-delete-confirm]").click()
        refused = detail.locator("[data-testid=ftnb-lab-delete-refused]")
        refused.wait_for()
        assert "is running (pid" in refused.inner_text() and "stop it first" in refused.inner_text()
        assert (lab_server.experiments / "doomed").is_dir()
        _screenshot(page, "panel_delete_refused")
    finally:
        handle.stop()
        handle.wait(timeout=60)
    detail = panel.locator("[data-testid=ftnb-lab-detail][data-status=INTERRUPTED]")
    detail.wait_for()
    # Ended statuses (INTERRUPTED, PAUSED: 2.7:1 on the old amber badges) read in both themes.
    _assert_readable(panel, "light, interrupted")
    with _dark_theme(page, panel):
        _assert_readable(panel, "dark, interrupted")
    detail.locator("[data-testid=ftnb-lab-delete]").click()
    assert (lab_server.experiments / "doomed").is_dir()  # one click only asks
    detail.locator("[data-testid=ftnb-lab-delete-confirm]").click()
    panel.locator("[data-testid=ftnb-lab-list]").wait_for()
    assert panel.locator("[data-testid=ftnb-lab-experiment][data-name=doomed]").count() == 0
    wait_for(lambda: not (lab_server.experiments / "doomed").exists(), timeout=10,
             what="its folder removed")
    with page.expect_response(lambda r: "/ftnb/api/experiments" in r.url):
        pass  # the next poll of the list: it is not listed again
    page.evaluate("0")
    assert panel.locator("[data-testid=ftnb-lab-experiment][data-name=doomed]").count() == 0
