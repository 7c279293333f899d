"""The Jupyter server extension (ftnb.lab): its routes on a real Jupyter server (pytest-jupyter's
``jp_fetch``), over experiments made by real runs: a script's sweep with injected failures, a
detached experiment stopped trial by trial, a foreground ``ftnb run`` SIGKILLed and resumed
through the server, and an S3 root on the moto server. Authentication (token, cookie + XSRF)
and confinement to the configured roots are checked on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse

import pytest
from clirun import JOBS, Cli, literal, write
from scripted import scripted
from tornado.httpclient import HTTPClientError

import ftnb
from ftnb.storage import ExperimentPaths
from ftnb.system.processes import process_status
from ftnb.ui import read_model

pytest.importorskip("jupyter_server", reason="needs ftnb[lab] (jupyter_server)")
pytest.importorskip("pytest_jupyter", reason="needs pytest-jupyter[server] (ftnb[dev])")
# pytest-jupyter's fixtures (jp_fetch, jp_serverapp, ...), imported here rather than declared in
# `pytest_plugins`, which would register the plugin for the whole session: its autouse
# fixtures (a new event loop, a ServerApp cleanup) would then wrap every test of the suite.
from pytest_jupyter.jupyter_server import *  # noqa: E402,F403

pytestmark = pytest.mark.timeout(120)

API = ("ftnb", "api")


# -- the experiments and the server ------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory):
    """A root holding one finished script sweep (``ftnb.run``): trial 0 clean, trial 1 fails
    once and recovers, trial 2 fails twice and ends ERRORED (max_failures=1)."""
    root = tmp_path_factory.mktemp("lab") / "results"
    faults = [{}, {"1": [2, "raise"]}, {"1": [2, "raise"], "2": [2, "raise"]}]
    ftnb.run(scripted, name="sweep", storage_path=str(root),
             param_space={"n": 3, "faults": ftnb.grid_search(faults)},
             run_config=ftnb.RunConfig(failure_config=ftnb.FailureConfig(max_failures=1),
                                       verbose=0))
    return root


@pytest.fixture
def lab_roots(sweep_root, tmp_path):
    """What ``c.Ftnb.storage_roots`` serves in a test: the sweep's root, and the test's own
    folder ``copies``."""
    return [str(sweep_root), str(tmp_path / "copies")]


@pytest.fixture
def jp_server_config(lab_roots):
    return {"ServerApp": {"jpserver_extensions": {"ftnb.lab": True}},
            "Ftnb": {"storage_roots": lab_roots}}


def on_server_loop(test):
    """Run the coroutine ``test`` on the loop the test server serves from (pytest-jupyter's
    ``jp_asyncio_loop``: its hook that runs coroutine tests is a plugin's, not loaded here)."""
    signature = inspect.signature(test)
    asks = "jp_asyncio_loop" in signature.parameters

    def run(*args, **kwargs):
        loop = kwargs["jp_asyncio_loop"] if asks else kwargs.pop("jp_asyncio_loop")
        return loop.run_until_complete(test(*args, **kwargs))

    loop_parameter = inspect.Parameter("jp_asyncio_loop", inspect.Parameter.KEYWORD_ONLY)
    run.__signature__ = signature if asks else signature.replace(
        parameters=[*signature.parameters.values(), loop_parameter])
    run.__name__, run.__qualname__, run.__doc__ = test.__name__, test.__qualname__, test.__doc__
    return run


async def _get(jp_fetch, route, **params):
    response = await jp_fetch(*API, route, params=params)
    return json.loads(response.body)


async def _post(jp_fetch, route, body, **kwargs):
    return await jp_fetch(*API, route, method="POST", body=json.dumps(body),
                          raise_error=False, **kwargs)


async def _until(probe, what, timeout=60.0):
    """Await ``probe()`` until it returns something truthy (the server shares this loop: never
    block it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


def _message(response):
    return json.loads(response.body)["message"]


# -- reading ---------------------------------------------------------------------------------------
@on_server_loop
async def test_roots_and_the_listing_of_a_script_sweep(jp_fetch, sweep_root):
    assert (await _get(jp_fetch, "roots"))["roots"][0] == str(sweep_root)
    listing = await _get(jp_fetch, "experiments", root=str(sweep_root))
    assert listing["root"] == str(sweep_root)
    [entry] = listing["experiments"]
    assert entry["name"] == "sweep" and entry["path"] == str(sweep_root / "sweep")
    assert entry["status"] == "ERRORED" and entry["num_trials"] == 3
    assert (entry["trials"]["TERMINATED"], entry["trials"]["ERRORED"]) == (2, 1)
    assert entry["failures"] == 3 and entry["live"] is False
    assert entry["last_activity"] > time.time() - 600
    # No root given: the first served one.
    assert (await _get(jp_fetch, "experiments"))["experiments"] == [entry]


@on_server_loop
async def test_a_listed_ended_experiment_shows_its_new_state_once_resumed(jp_fetch, sweep_root,
                                                                         tmp_path):
    root = tmp_path / "copies"
    shutil.copytree(sweep_root / "sweep", root / "again")
    twice = [await _get(jp_fetch, "experiments", root=str(root)) for _ in range(2)]
    assert twice[0] == twice[1] and twice[0]["experiments"][0]["status"] == "ERRORED"
    # The errored trial runs again (its third attempt has no fault): the state file is
    # rewritten, and the listing reads it again.
    ftnb.run(scripted, name="again", storage_path=str(root),
             run_config=ftnb.RunConfig(verbose=0))
    [entry] = (await _get(jp_fetch, "experiments", root=str(root)))["experiments"]
    assert entry["status"] == "FINISHED" and entry["trials"]["TERMINATED"] == 3


@on_server_loop
async def test_an_experiments_page_has_trials_failures_tracebacks_and_attempts(jp_fetch,
                                                                               sweep_root):
    page = await _get(jp_fetch, "experiment", path=str(sweep_root / "sweep"))
    assert page["format"] == "ftnb.snapshot" and page["root"] == str(sweep_root)
    rows = {r["trial_id"]: r for r in page["experiment"]["rows"]}
    by_attempts = sorted(len(t["attempts"]) for t in page["trials"].values())
    assert by_attempts == [1, 2, 2]
    errored = [t for t, r in rows.items() if r["status"] == "ERRORED"]
    assert len(errored) == 1
    failures = page["failures"][errored[0]]
    assert len(failures) == 2
    assert "ValueError: injected failure at step 2" in failures[-1]["traceback"]
    assert page["trials"][errored[0]]["config"]["faults"] == {"1": [2, "raise"],
                                                              "2": [2, "raise"]}
    # A script's sweep: no driver to stop, and the server cannot resume it without its code.
    assert page["actions"]["stop"] is False and page["actions"]["stop_trial"] == []
    resume = page["actions"]["resume"]
    assert resume["available"] is False
    assert "script" in resume["reason"] and "Tuner.restore" in resume["line"]


@on_server_loop
async def test_curves_come_incrementally_with_cursors(jp_fetch, sweep_root):
    path = str(sweep_root / "sweep")
    first = await _get(jp_fetch, "results", path=path)
    assert first["metric"] == "score" and "score" in first["metrics"]
    series = first["series"]
    # The errored trial failed at step 2 twice: one row.
    assert sorted(s["rows"] for s in series.values()) == [1, 3, 3]
    for trial in series.values():
        assert trial["x"] == [1, 2, 3][:trial["rows"]] and trial["y"] == trial["x"]
        assert not trial["reset"] and trial["label"].startswith("faults=")
    cursors = {t: s["cursor"] for t, s in series.items()}
    # Nothing new since those cursors.
    again = await _get(jp_fetch, "results", path=path, since=json.dumps(cursors))
    assert again["series"] == {}
    # A number of rows: the rows after them.
    some = next(t for t, s in series.items() if s["rows"] == 3)
    tail = await _get(jp_fetch, "results", path=path, metric="score",
                      since=json.dumps({some: 1}))
    assert tail["series"][some]["x"] == [2, 3] and len(tail["series"]) == 3
    # A cursor of another reading of the file: all of it again, marked reset.
    stale = await _get(jp_fetch, "results", path=path,
                       since=json.dumps({some: "elsewhere:2"}))
    assert stale["series"][some]["reset"] is True and stale["series"][some]["x"] == [1, 2, 3]


@on_server_loop
async def test_bad_arguments_are_400s_that_name_them(jp_fetch, sweep_root):
    path = str(sweep_root / "sweep")
    response = await jp_fetch(*API, "results", params={"path": path, "since": "[1"},
                              raise_error=False)
    assert response.code == 400 and "since=" in _message(response)
    response = await jp_fetch(*API, "experiment", raise_error=False)
    assert response.code == 400 and "'path'" in _message(response)
    response = await _post(jp_fetch, "stop_trial", {"path": path, "trial_id": 3})
    assert response.code == 400 and "trial_id=3" in _message(response)
    response = await jp_fetch(*API, "stop", method="POST", body="not json", raise_error=False)
    assert response.code == 400
    response = await jp_fetch(*API, "experiment", params={"path": str(sweep_root / "nope")},
                              raise_error=False)
    assert response.code == 404


@on_server_loop
async def test_an_unchanged_listing_is_a_304_without_a_body(jp_fetch, sweep_root, tmp_path):
    copies = tmp_path / "copies"
    copies.mkdir()
    shutil.copytree(sweep_root / "sweep", copies / "one")
    first = await jp_fetch(*API, "experiments", params={"root": str(copies)})
    etag = first.headers["Etag"]
    assert first.code == 200 and len(first.body) > 300
    again = await jp_fetch(*API, "experiments", params={"root": str(copies)},
                           headers={"If-None-Match": etag}, raise_error=False)
    assert again.code == 304 and again.body == b""
    roots = await jp_fetch(*API, "roots")
    same = await jp_fetch(*API, "roots", headers={"If-None-Match": roots.headers["Etag"]},
                          raise_error=False)
    assert same.code == 304
    # An ended experiment's page too.
    page = await jp_fetch(*API, "experiment", params={"path": str(copies / "one")})
    same = await jp_fetch(*API, "experiment", params={"path": str(copies / "one")},
                          headers={"If-None-Match": page.headers["Etag"]}, raise_error=False)
    assert same.code == 304 and same.body == b""
    # A change (another experiment) is a 200 with the new listing and a new tag.
    shutil.copytree(sweep_root / "sweep", copies / "two")
    changed = await jp_fetch(*API, "experiments", params={"root": str(copies)},
                             headers={"If-None-Match": etag}, raise_error=False)
    assert changed.code == 200 and changed.headers["Etag"] != etag
    names = sorted(e["name"] for e in json.loads(changed.body)["experiments"])
    assert names == ["one", "two"]


@on_server_loop
async def test_delete_removes_an_ended_experiment_and_only_that(jp_fetch, sweep_root, tmp_path):
    copies = tmp_path / "copies"
    shutil.copytree(sweep_root / "sweep", copies / "doomed")
    shutil.copytree(sweep_root / "sweep", copies / "kept")
    response = await _post(jp_fetch, "delete", {"path": str(copies / "doomed")})
    assert response.code == 200, response.body
    assert json.loads(response.body) == {"ok": True, "path": str(copies / "doomed"),
                                         "removed": True}
    assert not (copies / "doomed").exists() and (copies / "kept").is_dir()
    names = [e["name"] for e in (await _get(jp_fetch, "experiments", root=str(copies)))
             ["experiments"]]
    assert names == ["kept"]
    again = await _post(jp_fetch, "delete", {"path": str(copies / "doomed")})
    assert again.code == 404
    # Not an experiment (the root itself), outside the roots, a malformed body: refused.
    root = await _post(jp_fetch, "delete", {"path": str(copies)})
    assert root.code == 404 and copies.is_dir()
    out = await _post(jp_fetch, "delete", {"path": f"{copies}/../../elsewhere"})
    assert out.code == 403 and "not inside the storage roots" in _message(out)
    bad = await _post(jp_fetch, "delete", {"path": 3})
    assert bad.code == 400 and "'path'" in _message(bad)
    extra = await _post(jp_fetch, "delete", {"path": str(copies / "kept"), "force": True})
    assert extra.code == 400 and "'force'" in _message(extra)
    assert (copies / "kept").is_dir()


# -- authentication and confinement ----------------------------------------------------------------
@on_server_loop
async def test_every_route_needs_the_token(jp_fetch, sweep_root):
    for route, method in [("roots", "GET"), ("experiments", "GET"), ("experiment", "GET"),
                          ("results", "GET"), ("stop", "POST"), ("stop_trial", "POST"),
                          ("resume", "POST"), ("delete", "POST")]:
        body = json.dumps({"path": str(sweep_root / "sweep")}) if method == "POST" else None
        with pytest.raises(HTTPClientError) as refused:
            await jp_fetch(*API, route, method=method, body=body,
                           params={"path": str(sweep_root / "sweep")},
                           headers={"Authorization": "token wrong"})
        assert refused.value.code == 403, route


@on_server_loop
async def test_a_post_with_the_login_cookie_needs_the_xsrf_header(jp_fetch, jp_serverapp,
                                                                  sweep_root):
    token = jp_serverapp.identity_provider.token
    login = await jp_fetch("login", headers={"Authorization": ""})
    xsrf = _cookie(login, "_xsrf")
    response = await jp_fetch("login", method="POST", follow_redirects=False,
                              raise_error=False, headers={"Authorization": "",
                                                          "Cookie": f"_xsrf={xsrf}"},
                              body=urllib.parse.urlencode({"password": token, "_xsrf": xsrf}))
    assert response.code == 302, response.body
    cookies = f"_xsrf={xsrf}; " + "; ".join(
        c.split(";", 1)[0] for c in response.headers.get_list("Set-Cookie")
        if c.startswith("username-"))
    browser = {"Authorization": "", "Cookie": cookies}
    # The cookie alone reads ...
    listing = await jp_fetch(*API, "experiments", headers=browser)
    assert json.loads(listing.body)["experiments"][0]["name"] == "sweep"
    # ... but acts only with the XSRF header (what @jupyterlab/services sends).
    body = {"path": str(sweep_root / "sweep")}
    refused = await _post(jp_fetch, "stop", body, headers=dict(browser))
    assert refused.code == 403 and "_xsrf" in _message(refused)
    allowed = await _post(jp_fetch, "stop", body, headers={**browser, "X-XSRFToken": xsrf})
    assert allowed.code == 409 and "not running" in _message(allowed)


def _cookie(response, name):
    for header in response.headers.get_list("Set-Cookie"):
        key, _, value = header.split(";", 1)[0].partition("=")
        if key == name:
            return value
    raise AssertionError(f"no {name} cookie in {response.headers}")


@pytest.fixture
def outside(sweep_root, tmp_path):
    """A real experiment outside the served root, and a symlink to it inside the root."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(sweep_root / "sweep", elsewhere / "copy")
    link = sweep_root / "link_out"
    if not link.is_symlink():
        os.symlink(elsewhere, link)
    yield elsewhere
    link.unlink()


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "s3", "relative", "file"])
@on_server_loop
async def test_paths_outside_the_roots_are_refused(jp_fetch, sweep_root, outside, how):
    path = {"dotdot": f"{sweep_root}/../{sweep_root.name}/sweep",
            "absolute": str(outside / "copy"),
            "symlink": str(sweep_root / "link_out" / "copy"),
            "s3": "s3://bucket/results/sweep",
            "relative": "sweep",
            "file": f"file://{outside}/copy"}[how]
    for route, method in [("experiment", "GET"), ("results", "GET"), ("stop", "POST"),
                          ("experiments", "GET")]:
        params = {"root" if route == "experiments" else "path": path}
        response = await jp_fetch(*API, route, method=method, params=params,
                                  body=json.dumps(params) if method == "POST" else None,
                                  raise_error=False)
        assert response.code == 403, (route, response.body)
        message = _message(response)
        assert "not inside the storage roots this server serves" in message
        assert str(sweep_root) in message  # says what is served
    # The symlink out is not listed either.
    names = [e["name"] for e in (await _get(jp_fetch, "experiments"))["experiments"]]
    assert names == ["sweep"]


# -- acting ------------------------------------------------------------------------------------
@pytest.fixture
def gated(tmp_path, monkeypatch):
    """``jobs.py`` (its ``gated`` trainable reports every 20 ms until the gate file exists) in
    a folder of its own, importable; the gate is opened at the end whatever happens."""
    work = tmp_path / "work"
    write(work, "jobs.py", JOBS)
    monkeypatch.syspath_prepend(str(work))
    cli = Cli(work, tmp_path / "store")
    yield cli
    cli.open_gate()


async def _trials(jp_fetch, path):
    page = await _get(jp_fetch, "experiment", path=path)
    return {r["trial_id"]: r["status"] for r in page["experiment"]["rows"]}, page


class TestActions:
    """Experiments that run while the test acts on them through the server."""

    @pytest.fixture
    def lab_roots(self, sweep_root, gated):
        # The work folder too: a resume imports only code in the server's own folders.
        return [str(sweep_root), str(gated.storage), str(gated.cwd)]

    @pytest.mark.slow
    @on_server_loop
    async def test_stop_trial_stops_that_trial_and_stop_interrupts(self, jp_fetch, gated):
        import jobs

        gate = str(gated.cwd / "gate")
        handle = ftnb.launch(jobs.gated, name="live", storage_path=str(gated.storage),
                             param_space={"x": ftnb.grid_search([1, 2, 3]), "gate": gate},
                             quiet=True)
        path = handle.path
        listed = await _get(jp_fetch, "experiments", root=str(gated.storage))
        assert listed["experiments"][0]["live"] is True
        assert listed["experiments"][0]["driver"]["alive"] is True
        # A live experiment is not deleted: the refusal names its driver and the fix.
        refused = await _post(jp_fetch, "delete", {"path": path})
        assert refused.code == 409 and "is running (pid" in _message(refused)
        assert "stop it first" in _message(refused) and os.path.isdir(path)

        async def running():
            statuses, page = await _trials(jp_fetch, path)
            ids = [t for t, s in statuses.items() if s == "RUNNING"]
            return ids if page["actions"]["stop_trial"] and ids else None

        # The last running one, by its id: not a position in a list that shrinks.
        target = (await _until(running, "a running trial"))[-1]
        others = None
        response = await _post(jp_fetch, "stop_trial", {"path": path, "trial_id": target})
        assert response.code == 200, response.body
        assert json.loads(response.body)["trial_id"] == target

        async def stopped():
            nonlocal others
            statuses, _ = await _trials(jp_fetch, path)
            others = {t: s for t, s in statuses.items() if t != target}
            return statuses[target] == "TERMINATED"

        await _until(stopped, f"trial {target} to stop")
        # The others go on (none was stopped in its place).
        assert "TERMINATED" not in others.values(), others
        again = await _post(jp_fetch, "stop_trial", {"path": path, "trial_id": target})
        assert again.code == 409 and "already ended" in _message(again)
        unknown = await _post(jp_fetch, "stop_trial", {"path": path, "trial_id": "nope_0"})
        assert unknown.code == 404 and "has no trial 'nope_0'" in _message(unknown)

        # A driver stopped (SIGSTOP) is silent: the listing says so, with the takeover line.
        driver = read_model.read_driver(handle.paths).lease.pid
        os.kill(driver, signal.SIGSTOP)
        try:
            async def driver_stopped():  # (a loaded machine shows it running a moment longer)
                return process_status(driver) in ("T", "t")

            await _until(driver_stopped, "the driver to be stopped")
            [entry] = (await _get(jp_fetch, "experiments", root=str(gated.storage)))["experiments"]
            _, page = await _trials(jp_fetch, path)
            refused = await _post(jp_fetch, "resume", {"path": path, "takeover": True})
        finally:
            os.kill(driver, signal.SIGCONT)
        assert entry["status"] == "RUNNING" and entry["driver"]["silent_s"] is not None
        assert entry["takeover"] == f"%ftresume {path} --takeover"
        # Its trainable is a kernel's: the server cannot take it over; the page says what can.
        assert page["actions"]["takeover"]["line"] == f"%ftresume {path} --takeover"
        assert page["actions"]["takeover"]["available"] is False
        assert refused.code == 409 and "cannot take over" in _message(refused)

        response = await _post(jp_fetch, "stop", {"path": path})
        assert response.code == 200, response.body

        async def interrupted():
            listing = await _get(jp_fetch, "experiments", root=str(gated.storage))
            entry = listing["experiments"][0]
            return entry if entry["status"] == "INTERRUPTED" and not entry["live"] else None

        entry = await _until(interrupted, "the experiment to stop")
        assert entry["resume_line"] == f"%ftresume {path}"
        # Launched from Python (as %ftrun does): its trainable lives in a kernel.
        response = await _post(jp_fetch, "resume", {"path": path})
        assert response.code == 409
        assert "%ftresume" in _message(response) and "'gated'" in _message(response)
        response = await _post(jp_fetch, "stop", {"path": path})
        assert response.code == 409 and "not running (INTERRUPTED)" in _message(response)
        await asyncio.get_running_loop().run_in_executor(None, handle.wait_for_supervisor_exit)
        # Stopped, it can be deleted.
        response = await _post(jp_fetch, "delete", {"path": path})
        assert response.code == 200 and not os.path.exists(path), response.body

    @pytest.mark.slow
    @on_server_loop
    async def test_a_killed_ftnb_run_reads_interrupted_and_the_server_resumes_it(
            self, jp_fetch, gated):
        space = {"x": {"grid_search": [1, 2]}, "gate": str(gated.cwd / "gate")}
        run = gated.start("run", "jobs.py:gated", "-p", literal(space), "-n", "cli1",
                          "--verbose", "0", stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
        path = str(gated.storage / "cli1")
        try:
            async def live():
                listing = await _get(jp_fetch, "experiments", root=str(gated.storage))
                return any(e["live"] and e["trials"]["RUNNING"] for e in listing["experiments"])

            await _until(live, "ftnb run to run its trials")
        finally:
            os.killpg(run.pid, signal.SIGKILL)  # the driver and its trials, at once
            run.wait()

        listing = await _get(jp_fetch, "experiments", root=str(gated.storage))
        [entry] = listing["experiments"]
        assert entry["status"] == "INTERRUPTED" and entry["live"] is False
        assert entry["resume_line"] == f"ftnb resume {path}"
        assert "is gone" in entry["driver"]["line"]
        _, page = await _trials(jp_fetch, path)
        assert page["actions"]["resume"] == {"available": True, "reason": None,
                                             "line": f"ftnb resume {path}"}

        response = await _post(jp_fetch, "resume", {"path": path}, request_timeout=120)
        assert response.code == 200, response.body
        outcome = json.loads(response.body)
        assert outcome["ok"] is True and outcome["supervisor"]["pid"] > 0
        listing = await _get(jp_fetch, "experiments", root=str(gated.storage))
        assert listing["experiments"][0]["live"] is True

        # Its new driver stops answering (SIGSTOP): a resume is refused, a takeover is not.
        stopped = read_model.read_driver(ExperimentPaths.at(path)).lease.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            async def is_stopped():  # (a process in a system call stops once it returns)
                return process_status(stopped) in ("T", "t")

            await _until(is_stopped, "the new driver to be stopped")
            refused = await _post(jp_fetch, "resume", {"path": path})
            assert refused.code == 409 and "running" in _message(refused)
            response = await _post(jp_fetch, "resume", {"path": path, "takeover": True},
                                   request_timeout=120)
            assert response.code == 200, response.body
            new_driver = read_model.read_driver(ExperimentPaths.at(path))
            assert new_driver.alive and new_driver.lease.pid != stopped
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)  # (the takeover killed it already)
        gated.open_gate()

        async def finished():
            listing = await _get(jp_fetch, "experiments", root=str(gated.storage))
            entry = listing["experiments"][0]
            return entry["status"] == "FINISHED" and not entry["live"]

        await _until(finished, "the resumed experiment to finish")


# -- an S3 root ----------------------------------------------------------------------------------
@pytest.mark.s3
class TestS3Root:
    """A root on the moto S3 server: s3fs finds the endpoint in fsspec's config (as
    FSSPEC_S3_ENDPOINT_URL would set it)."""

    @pytest.fixture
    def lab_roots(self, sweep_root, s3_storage, s3_endpoint, monkeypatch):
        import fsspec.config

        monkeypatch.setitem(fsspec.config.conf, "s3", {
            "endpoint_url": s3_endpoint, "use_listings_cache": False,
            "skip_instance_cache": True})
        url, fs = s3_storage
        # The script's sweep, as a sync to the bucket leaves it (a run on S3 takes seconds of
        # its polling; what is tested here is the server's reading of S3).
        fs.put(str(sweep_root / "sweep"), f"{url}/on_s3", recursive=True)
        return [url]

    @pytest.mark.slow
    @on_server_loop
    async def test_list_read_and_confine_an_s3_root(self, jp_fetch, lab_roots):
        [url] = lab_roots
        assert (await _get(jp_fetch, "roots"))["roots"] == [url]
        [entry] = (await _get(jp_fetch, "experiments", root=url))["experiments"]
        assert entry["path"] == f"{url}/on_s3" and entry["status"] == "ERRORED"
        assert entry["failures"] == 3 and entry["trials"]["TERMINATED"] == 2
        page = await _get(jp_fetch, "experiment", path=entry["path"])
        assert page["experiment"]["path"] == entry["path"]
        tracebacks = [f["traceback"] for fs in page["failures"].values() for f in fs]
        assert len(tracebacks) == 3
        assert all("ValueError: injected failure at step 2" in t for t in tracebacks)
        curves = await _get(jp_fetch, "results", path=entry["path"], metric="score")
        assert sorted(s["rows"] for s in curves["series"].values()) == [1, 3, 3]
        bucket = url.split("/")[2]
        for refused in (f"s3://other-{bucket}/runs/on_s3", f"s3://{bucket}/elsewhere",
                        f"{url}/../elsewhere", "/etc"):
            response = await jp_fetch(*API, "experiment", params={"path": refused},
                                      raise_error=False)
            assert response.code == 403, refused
            assert url in _message(response)


# -- importing -------------------------------------------------------------------------------------
def test_import_ftnb_does_not_import_jupyter_server():
    code = ("import sys, ftnb, ftnb.lab; "
            "print(sorted(m for m in ('jupyter_server', 'tornado', 'traitlets') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    assert re.fullmatch(r"\[\{'module': 'ftnb\.lab'\}\]",
                        repr(__import__("ftnb.lab").lab._jupyter_server_extension_points()))
