"""A network outage between ftnb and S3 (a real TCP proxy in front of the moto server, cut and
mended): writers wait it out, the driver and its trials alike, so an outage longer than the
filesystem's own retries costs no failure and no iteration; one longer than
``$FTNB_STORAGE_OUTAGE_S`` stops the driver with a clear error, and the experiment resumes."""

from __future__ import annotations

import os
import subprocess
import threading
import urllib.parse

import pytest

import ftnb
from ftnb.storage import read_json_lines
from netcut import CuttableProxy
from procs import run_script, wait_for

pytestmark = pytest.mark.s3

N = 30

# Through the proxy, with the filesystem's own retries kept short (a few seconds in all), so the
# outage outlasts them quickly.
OUTAGE_DRIVER = """
import sys, ftnb
from conftest import make_s3_filesystem
from scripted import scripted

fs = make_s3_filesystem(sys.argv[2], config_kwargs={
    "retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 5})
grid = ftnb.run(scripted, name="outage", storage_path=sys.argv[1],
                param_space={"n": %d, "sleep": 0.1, "i": ftnb.grid_search([0, 1])},
                run_config=ftnb.RunConfig(verbose=0, storage_filesystem=fs))
print("STATUS", grid.status, flush=True)
""" % N


class _Output:
    """The driver's output, read as it comes (stdout and stderr together)."""

    def __init__(self, proc):
        self.proc = proc
        self.text = ""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.text += line

    def wait(self, timeout):
        self.proc.wait(timeout=timeout)
        self._thread.join(timeout=10)
        return self.text


def _rows_per_trial(fs, exp_url):
    """Result rows of each trial on S3 (read past the proxy), by trial folder."""
    out = {}
    try:  # (a listing that meets an object removed under it, as the lease's CAS probe is,
        # raises; the caller's wait_for asks again)
        paths = fs.glob(exp_url.removeprefix("s3://") + "/*/result.json")
    except FileNotFoundError:
        return out
    for path in paths:
        out[path.rsplit("/", 2)[-2]] = read_json_lines(fs.cat_file(path))
    return out


@pytest.fixture
def proxy(s3_endpoint):
    url = urllib.parse.urlparse(s3_endpoint)
    proxy = CuttableProxy((url.hostname, url.port))
    yield proxy
    proxy.close()


@pytest.fixture
def driver(tmp_path):
    """``start(*args, env=None)``: the outage driver through the proxy, its output read as it
    comes; whatever still runs at the end of the test is killed (its trials die with it)."""
    started = []

    def start(*args, env=None):
        proc = run_script(tmp_path, OUTAGE_DRIVER, *args, env=env)
        started.append(proc)
        return proc, _Output(proc)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


# A route that is gone (connections reset: s3fs gives up after its own retries, in seconds), and
# a network that drops packets (requests hang: each call's deadline ends them, 2 s here).
@pytest.mark.parametrize("stall", [False, True], ids=["reset", "stall"])
def test_a_network_outage_is_waited_out_without_a_failure(s3_storage, proxy, driver, stall):
    url, fs = s3_storage
    exp_url = f"{url}/outage"
    proc, out = driver(url, proxy.endpoint, env={"FTNB_STORAGE_CALL_TIMEOUT_S": "2"})
    try:
        wait_for(lambda: len(rows := _rows_per_trial(fs, exp_url)) == 2
                 and min(map(len, rows.values())) >= 3, timeout=60, what="both trials reporting")
        proxy.cut(stall=stall)
        # Seconds of outage: many connections turned away (each trial's report keeps trying;
        # the driver writes only when it has something to save).
        wait_for(lambda: proxy.refused >= (8 if stall else 40), timeout=60, what="tries")
        during = _rows_per_trial(fs, exp_url)
        assert proc.poll() is None, out.text
    finally:
        proxy.mend()
    text = out.wait(timeout=180)
    assert proc.returncode == 0 and "STATUS FINISHED" in text, text
    # aiohttp may log a reset connection's unretrieved task (frames of aiohttp and s3fs): not an
    # error of ftnb's. An error of ftnb's would have a frame in ftnb's own package.
    assert "StorageUnavailableError" not in text, text
    assert _frames_in_ftnb(text) == [], text

    # Nothing lost, nothing twice, nothing counted: every iteration once, in one attempt each.
    rows = _rows_per_trial(fs, exp_url)
    assert all(len(rows[d]) >= len(during[d]) for d in during)
    for trial_rows in rows.values():
        assert [r["training_iteration"] for r in trial_rows] == list(range(1, N + 1))
        assert {r["attempt"] for r in trial_rows} == {1}
    state = ftnb.attach(exp_url, storage_filesystem=fs).state()
    assert state.status == "FINISHED"
    assert all(t.failures == [] and len(t.attempts) == 1 for t in state.trials)
    # The trials' reports waited in ftnb's retries, past s3fs's own (their stderr is uploaded
    # when they end).
    stderrs = [fs.cat_file(p).decode() for p in fs.glob(exp_url.removeprefix("s3://") + "/*/stderr")]
    assert len(stderrs) == 2
    assert any("is not answering" in s and "answering again" in s for s in stderrs), stderrs


def _frames_in_ftnb(text: str) -> list[str]:
    """The traceback lines of ``text`` that point into ftnb's package (not a path that merely
    contains "ftnb", such as a checkout or a virtualenv named so)."""
    package = os.path.dirname(os.path.abspath(ftnb.__file__)) + os.sep
    return [line for line in text.splitlines()
            if line.lstrip().startswith('File "') and package in line]


def test_an_outage_past_the_limit_stops_the_driver_and_the_experiment_resumes(
        s3_storage, proxy, driver):
    url, fs = s3_storage
    exp_url = f"{url}/outage"
    proc, out = driver(url, proxy.endpoint,
                       env={"FTNB_STORAGE_OUTAGE_S": "3", "FTNB_STORAGE_CALL_TIMEOUT_S": "2"})
    try:
        wait_for(lambda: len(rows := _rows_per_trial(fs, exp_url)) == 2
                 and min(map(len, rows.values())) >= 3, timeout=60, what="both trials reporting")
        proxy.cut()
        try:
            text = out.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the driver did not stop:\n" + out.wait(timeout=30))
    finally:
        proxy.mend()
    assert proc.returncode != 0, text
    assert "StorageUnavailableError" in text and "has not answered for" in text, text
    assert "FTNB_STORAGE_OUTAGE_S" in text
    # Back up: the experiment reads as interrupted and resumes where its files say.
    assert ftnb.Tuner.can_restore(exp_url, storage_filesystem=fs)
    assert ftnb.attach(exp_url, storage_filesystem=fs).status() == "INTERRUPTED"
    proc, out = driver(url, proxy.endpoint)
    text = out.wait(timeout=180)
    assert proc.returncode == 0 and "STATUS FINISHED" in text, text
    for trial_rows in _rows_per_trial(fs, exp_url).values():
        assert [r["training_iteration"] for r in trial_rows] == list(range(1, N + 1))


def test_the_widget_keeps_its_view_through_an_outage(s3_storage, proxy):
    pytest.importorskip("ipywidgets", reason="the widget needs ftnb[notebook]")
    pytest.importorskip("plotly", reason="the widget needs ftnb[notebook]")
    from conftest import make_s3_filesystem
    from ftnb.notebook.widget import ExperimentWidget
    from scripted import scripted

    url, fs = s3_storage
    grid = ftnb.Tuner(scripted, param_space={"n": 3},
                      run_config=ftnb.RunConfig(storage_path=url, storage_filesystem=fs,
                                                name="seen", verbose=0)).fit()
    through_proxy = make_s3_filesystem(proxy.endpoint, config_kwargs={
        "retries": {"max_attempts": 1}, "connect_timeout": 1})
    w = ExperimentWidget(ftnb.attach(grid.experiment_path, storage_filesystem=through_proxy))
    try:
        shown = w.snapshot
        assert shown.status == "FINISHED" and w.status_line.value == ""
        proxy.cut()
        assert w.refresh() is shown  # the last view stays
        assert "cannot read the experiment" in w.status_line.value
        assert "FINISHED" in w.header.value
        proxy.mend()
        assert w.refresh().status == "FINISHED"
        assert w.status_line.value == ""  # and the message goes once it reads again
    finally:
        w.close()
