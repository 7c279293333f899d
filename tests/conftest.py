"""Shared pytest fixtures.

Each group of fixtures lives in its own clearly marked section; add new groups as new sections.
"""

from __future__ import annotations

# =================================================================================================
# S3: a real S3-protocol server (moto in server mode) on loopback
# -------------------------------------------------------------------------------------------------
# ``s3_server`` (session): starts ``python -m moto.server`` on a free loopback port in a subprocess,
#     waits (with a deadline) until its HTTP endpoint answers, and kills it at the end of the
#     session. Yields the endpoint URL. Tests are skipped if moto / s3fs / boto3 are missing.
# ``s3_storage`` (function): a fresh, empty bucket on that server and a matching fsspec
#     filesystem. Yields ``(storage_path_url, filesystem)``, e.g. ``("s3://ftnb-3f2a.../runs", fs)``.
# ``s3_endpoint`` (function): the endpoint URL, with the dummy credentials set in the environment.
# ``s3_filesystem_factory`` (function): ``make(endpoint=None, **s3fs_options)`` -> a new filesystem.
# Mark S3 tests with ``@pytest.mark.s3``.
# =================================================================================================

import contextlib
import dataclasses
import fnmatch
import json
import multiprocessing.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
import warnings

import pytest

S3_KEY = "testing"
S3_SECRET = "testing"
S3_REGION = "us-east-1"
_S3_START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _s3_answers(url: str) -> bool:
    """Whether an S3 server answers ``GET /`` (ListBuckets) at ``url``."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return b"ListAllMyBucketsResult" in resp.read()
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _die_with_parent() -> None:
    """In the server's process, before exec: ask Linux to SIGKILL it when pytest dies, so even a
    SIGKILLed test run leaves no server behind (best effort, Linux only)."""
    os.setsid()  # Ctrl+C in the terminal goes to pytest only, which then stops the server
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _start_moto_server(log) -> tuple[subprocess.Popen, str]:
    """Start moto on a free loopback port and wait, with a deadline, until it answers. A port
    taken between choosing it and binding it (the server exits at once) is retried."""
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET,
               AWS_DEFAULT_REGION=S3_REGION)
    failures = []
    for _ in range(3):
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        log.seek(0)
        log.truncate()
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            start_new_session=not sys.platform.startswith("linux"),
        )
        deadline = time.monotonic() + _S3_START_TIMEOUT_S
        try:
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    failures.append(
                        f"moto server on port {port} exited with code {proc.returncode}:\n"
                        + log.read().decode("utf-8", "replace")[-2000:]
                    )
                    break
                if _s3_answers(endpoint + "/"):
                    if proc.poll() is None:  # it is our server that answered
                        return proc, endpoint
                    continue
                if time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(
                        f"moto server did not answer on {endpoint} within "
                        f"{_S3_START_TIMEOUT_S}s:\n" + log.read().decode("utf-8", "replace")[-4000:]
                    )
                time.sleep(0.05)
        except BaseException:
            _stop(proc)
            raise
    raise RuntimeError("could not start the moto S3 server:\n" + "\n".join(failures))


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto S3 server running in a subprocess on 127.0.0.1."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    pytest.importorskip("boto3", reason="boto3 is not installed")

    with tempfile.TemporaryFile(prefix="ftnb-moto-") as log:
        proc, endpoint = _start_moto_server(log)
        try:
            yield endpoint
        finally:
            _stop(proc)


@pytest.fixture
def s3_endpoint(s3_server, monkeypatch):
    """The server's endpoint, with dummy AWS credentials in the environment (for boto3, s3fs
    and trial processes alike)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)
    # Never let a developer's real AWS profile or session token leak into the tests.
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return s3_server


def make_s3_filesystem(endpoint: str, **kwargs):
    """An s3fs filesystem for ``endpoint`` with the dummy credentials, no listing cache and no
    instance cache (so every test, and every trial process, sees the server's current state)."""
    import s3fs

    options = dict(
        endpoint_url=endpoint,
        key=S3_KEY,
        secret=S3_SECRET,
        use_listings_cache=False,
        skip_instance_cache=True,
    )
    options.update(kwargs)
    return s3fs.S3FileSystem(**options)


@pytest.fixture
def s3_filesystem_factory(s3_endpoint):
    """``make(endpoint=None, **s3fs_options)``: a new s3fs filesystem with the dummy credentials
    (default endpoint: the test server's)."""

    def make(endpoint=None, **kwargs):
        return make_s3_filesystem(endpoint or s3_endpoint, **kwargs)

    return make


@pytest.fixture
def s3_storage(s3_endpoint):
    """``(storage_path_url, filesystem)``: a prefix in a fresh, empty bucket on the S3 server."""
    import boto3

    bucket = f"ftnb-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
        region_name=S3_REGION,
    )
    client.create_bucket(Bucket=bucket)
    fs = make_s3_filesystem(s3_endpoint)
    yield f"s3://{bucket}/runs", fs
    # Empty and delete the bucket so a long session does not grow the server's memory.
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        client.delete_bucket(Bucket=bucket)
    except Exception:
        pass


# ======================================== end of S3 section ======================================


# =================================================================================================
# Ray: a local instance (``ray_instance``, session) and a real multi-node cluster on this machine
# (``ray_cluster``, started once a session: a head without CPUs and three worker nodes of 1 CPU
# each, health checks tuned so a lost node is noticed in about 1.5 s; after each test its worker
# nodes are three live ones again, all new after a failed test). Mark Ray tests with
# ``@pytest.mark.ray``; they are skipped when ray is not installed (``pip install 'ftnb[ray]'``).
# =================================================================================================

# One authentication mode for every Ray process of the session. Ray >= 2.60's ray.init() of a
# new local instance (ray_instance) sets RAY_AUTH_MODE=token in this process when it is unset;
# drivers started afterwards inherit it, and the ray_cluster started before it (no token) then
# has its RPCs to them refused: the GCS takes the refusal for "the owner dropped the actor" and
# cancels every trial actor they create. Set before any cluster starts, so all agree.
os.environ["RAY_AUTH_MODE"] = "disabled"

# The suite runs as a user with the venv activated: this Python's folder (its ``ftnb`` console
# script) first on PATH, so the commands ftnb prints are the bare ``ftnb ...`` the tests expect.
# tests/test_printed_commands.py runs them as printed with the venv not activated.
os.environ["PATH"] = os.pathsep.join(
    [os.path.dirname(sys.executable)]
    + [p for p in os.environ.get("PATH", "").split(os.pathsep)
       if p and p != os.path.dirname(sys.executable)])

RAY_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                     "health_check_timeout_ms": 500, "health_check_initial_delay_ms": 0}

# A raylet aborts when its dashboard agent (a Python process it starts) has not written its port
# within 15 s, and Ray's Node waits a hard-coded 30 s for the raylet to register; neither is a
# setting. On two cores loaded by other tests (load 6-10) an agent took longer than that: its
# `import ray` alone cost 1.7 CPU seconds, 1.2 of them compiling rfc3987_syntax's grammars. The
# Ray processes of these fixtures import that package lazily (tests/lazy_rfc3987), which cut a
# 4-node start at load 10 from failing to 25 s; a node that still misses the wait is removed
# (its processes killed) and started again until this deadline.
_RAY_NODE_START_DEADLINE_S = 180.0
_LAZY_RFC3987 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lazy_rfc3987")


@contextlib.contextmanager
def _ray_process_environment():
    """The environment the Ray processes started inside it inherit (raylets pass it on to their
    agents and workers): the lazy rfc3987_syntax first on PYTHONPATH."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_LAZY_RFC3987, before) if p)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def _half_started_ray_node(error: BaseException):
    """The ``ray._private.node.Node`` whose ``__init__`` raised ``error``, or None: its processes
    (a GCS, a raylet that may register late) are running and no one else will stop them."""
    from ray._private.node import Node

    for frame, _ in traceback.walk_tb(error.__traceback__):
        node = frame.f_locals.get("self")
        if isinstance(node, Node):
            return node
    return None


def _start_ray_node(start):
    """``start()`` (which starts one Ray node), again after killing the processes of an attempt
    that timed out, until ``_RAY_NODE_START_DEADLINE_S``."""
    deadline = time.monotonic() + _RAY_NODE_START_DEADLINE_S
    attempts = 0
    while True:
        attempts += 1
        try:
            with _ray_process_environment():
                return start()
        except Exception as error:
            node = _half_started_ray_node(error)
            if node is None:
                raise
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"A Ray node did not start in {attempts} attempts over "
                    f"{_RAY_NODE_START_DEADLINE_S:.0f} s (last: {error}); its raylet's log is "
                    f"under {node.get_logs_dir_path()}. Fix: run the Ray tests on a less "
                    f"loaded machine, or raise _RAY_NODE_START_DEADLINE_S.") from error
            warnings.warn(f"A Ray node missed Ray's start-up wait (attempt {attempts}: {error}); "
                          f"starting it again.", stacklevel=2)


@pytest.fixture(scope="session")
def ray_instance():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    # address="local": a new instance of its own; ray.init() with no address would join any
    # cluster running on this machine (the session's ray_cluster, or another run's).
    _start_ray_node(lambda: ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
        _system_config=RAY_HEALTH_CHECKS))
    yield ray
    ray.shutdown()


def _patient_ray_cluster_class():
    from ray.cluster_utils import Cluster

    class PatientCluster(Cluster):
        """``ray.cluster_utils.Cluster`` whose ``add_node`` (the head's too) starts a node again
        when it misses Ray's start-up waits on a loaded machine (``_start_ray_node``), and
        whose ``remove_node(allow_graceful=False)`` loses the node as a machine is lost: its
        worker processes (the actors on it) go with it."""

        def add_node(self, wait: bool = True, **node_args):
            return _start_ray_node(lambda: super(PatientCluster, self).add_node(wait, **node_args))

        def remove_node(self, node, allow_graceful: bool = True):
            # Ray's removal kills the node's daemons only; each worker exits once it notices
            # its raylet is gone. Until then (a second or more under load) it still serves
            # calls and writes to shared storage: a trial held on the node and released
            # right after the removal went on to end its attempt normally (a CI rehearsal),
            # which is no lost node. A lost machine's processes are gone at once.
            import psutil

            from procs import pid_alive, wait_for

            workers = []
            raylet = node.all_processes.get("raylet") or []
            if raylet and not allow_graceful:
                try:
                    workers = psutil.Process(raylet[0].process.pid).children(recursive=True)
                except psutil.Error:
                    pass
            super().remove_node(node, allow_graceful)
            for worker in workers:
                try:
                    worker.kill()
                except psutil.Error:
                    pass
            wait_for(lambda: not any(pid_alive(w.pid) for w in workers), 60,
                     "the removed node's worker processes to be gone")

    return PatientCluster


_RAY_WORKER_NODES = 3


@pytest.fixture(scope="session")
def _session_ray_cluster():
    pytest.importorskip("ray")
    cluster = _patient_ray_cluster_class()(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "no_monitor": True,
        "_system_config": RAY_HEALTH_CHECKS})
    try:
        for _ in range(_RAY_WORKER_NODES):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _restore_worker_nodes(cluster, fresh: bool) -> None:
    """Leave ``cluster`` with its three live worker nodes of one CPU: all of them new when
    ``fresh`` (after a failed test, which may have left a node drained, held or half removed)
    or when there are not three, else new ones only in place of those whose processes are gone
    (a node whose raylet left on its own)."""
    fresh = fresh or len(cluster.worker_nodes) != _RAY_WORKER_NODES
    changed = False
    for node in list(cluster.worker_nodes):  # (a set)
        if fresh or not node.remaining_processes_alive():
            cluster.remove_node(node, allow_graceful=False)
            changed = True
    while len(cluster.worker_nodes) < _RAY_WORKER_NODES:
        cluster.add_node(num_cpus=1)
        changed = True
    if changed:
        cluster.wait_for_nodes()


@pytest.fixture
def ray_cluster(_session_ray_cluster, request):
    """A real Ray cluster on this machine: a head without CPUs and three worker nodes of one
    CPU each, started once for the session (about 20 s idle, 25-40 s at load 10). Yields the
    ``ray.cluster_utils.Cluster``; a test that removes or drains a node adds one back (its
    ``add_node`` retries a node that misses Ray's start-up wait, as the fixture's do). After a
    test that failed, every worker node is replaced, so what it broke cannot reach the next.
    This process does not connect to it (drivers run as child processes and connect by
    ``cluster.address``), so it can coexist with ``ray_instance``. No autoscaler monitor: drains
    go to the GCS directly (tests/test_ray_drain.py), and it is one Python process less to start."""
    yield _session_ray_cluster
    _restore_worker_nodes(_session_ray_cluster, fresh=request.node.stash.get(_FAILED, False))


# =================================================================================================
# JupyterLab and a real browser (tests/test_browser_lab.py)
# -------------------------------------------------------------------------------------------------
# ``lab_server`` (module): a real JupyterLab server (``python -m jupyterlab``) on a free loopback
#     port with a token, serving ``c.Ftnb.storage_roots = [<tmp>/experiments]`` and notebooks
#     from ``<tmp>/notebooks``, with the panel loaded from labextension/'s build output (so a
#     fresh ``npm run build`` is what is tested, installed or not). Config, data, runtime and
#     settings folders are its own, under tmp. Yields a :class:`LabServer`. Skipped, saying
#     why, when jupyterlab or the built panel is missing.
# ``chromium`` (module): Debian's chromium (/usr/bin/chromium) driven by Playwright, headless.
#     Skipped, saying why, when chromium or the playwright package is missing (.ci/run installs
#     both; nothing downloads a browser).
# Mark browser tests ``@pytest.mark.browser`` (and ``slow``).
# =================================================================================================

LABEXTENSION_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  "labextension", "build")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
_LAB_START_TIMEOUT_S = 90.0


@dataclasses.dataclass
class LabServer:
    """A running JupyterLab: its URL (no trailing slash), token and folders."""

    url: str
    token: str
    experiments: pathlib.Path
    notebooks: pathlib.Path
    log: pathlib.Path

    def page_url(self, path: str = "lab") -> str:
        """``path`` under the server, with the token (it logs the browser in)."""
        return f"{self.url}/{path}?token={self.token}"

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def _lab_answers(url: str, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2.0) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


# Session-scoped: the browser tests and the widget's JupyterLab test share one server (each
# start costs about 20 s on CI's 2 cores); tests name their own experiments and notebooks.
@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install '.[dev]')")
    if not os.path.isfile(os.path.join(LABEXTENSION_BUILD, "ftnb-jupyterlab", "package.json")):
        pytest.skip("the JupyterLab panel is not built: cd labextension && npm ci && npm run build")
    base = tmp_path_factory.mktemp("lab")
    experiments, notebooks = base / "experiments", base / "notebooks"
    experiments.mkdir()
    notebooks.mkdir()
    config = base / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "Ftnb": {"storage_roots": [str(experiments)]},
        # The build output first: JupyterLab takes the first extension of a name it finds.
        "LabApp": {"extra_labextensions_path": [LABEXTENSION_BUILD]},
    }))
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # No "fetch the news?" toast over the page (and no request for it).
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"checkForUpdates": False, "fetchNews": "false"}))
    token = uuid.uuid4().hex
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_DATA_DIR=str(base / "data"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(base / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
               FTNB_STORAGE_PATH=str(experiments),
               # Kernels run this Python (the kernelspec says `python`).
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    log_path = base / "lab.log"
    with open(log_path, "wb") as log:
        for _ in range(3):  # a port taken between choosing and binding it: try another
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
                 "--ip=127.0.0.1", "--ServerApp.port_retries=0", "--allow-root",
                 f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
                 # window.jupyterapp: tests run JupyterLab's commands (a theme change)
                 "--LabApp.expose_app_in_browser=True"],
                cwd=str(base), env=env, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent)
            deadline = time.time() + _LAB_START_TIMEOUT_S
            while time.time() < deadline and proc.poll() is None and not _lab_answers(url, token):
                time.sleep(0.2)
            if _lab_answers(url, token):
                break
            _stop(proc)
        else:
            pytest.fail("JupyterLab did not start:\n"
                        + log_path.read_text(errors="replace")[-4000:])
    try:
        yield LabServer(url, token, experiments, notebooks, log_path)
    finally:
        # SIGTERM: the server shuts its kernels down before it exits.
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            _stop(proc)


@pytest.fixture(scope="module")
def chromium():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install '.[dev]')")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


# =================================================================================================
# Scripts a test started (tests/procs.py run_script) do not outlive it
# -------------------------------------------------------------------------------------------------
# A failed test never reaches the end of its driver script; left running, a driver (a Ray job,
# a sweep) went on loading the machine for the tests after it. Scripts started by module-scoped
# fixtures, before this fixture's setup, are theirs to end.
# =================================================================================================


@pytest.fixture(autouse=True)
def _scripts_end_with_their_test():
    import procs

    mark = len(procs.STARTED)
    yield
    procs.kill_started_since(mark)


# =================================================================================================
# Ctrl+C reaches what the tests start, however the suite itself was started
# -------------------------------------------------------------------------------------------------
# The Ctrl+C tests send SIGINT to a driver they started (or _thread.interrupt_main() in this
# process) and expect what a terminal's foreground job gets. A shell starts a background job
# (`pytest ... &` in a script, a loaded rehearsal beside `yes` loads) with SIGINT ignored; Python
# then keeps it ignored, and every process the suite starts inherits that: the drivers ran their
# trials to the end and exited 0, and interrupt_main() did nothing. SIGINT gets Python's own
# handler here again, which the drivers' exec resets to the default action.
# =================================================================================================


def pytest_configure(config):
    if (signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGINT, signal.default_int_handler)


# =================================================================================================
# Parallel runs (pytest-xdist: `-n 2 --dist loadscope`, what the README's test command uses)
# -------------------------------------------------------------------------------------------------
# loadscope keeps a module's tests on one worker (its module-scoped kernels and servers start
# once). On top of it, the tests that share an expensive session fixture are one unit: every Ray
# test (one multi-node cluster, not one per worker: two clusters on two cores starve each other's
# health checks) and the tests on the shared JupyterLab server. (xdist's own xdist_group marks
# do not reach its scheduler under pytest 9: its node-id suffix is lost.)
# =================================================================================================

_RAY_MODULES = {"test_elastic_ray.py", "test_pbt_ray.py", "test_ray_cluster.py", "test_ray_s3.py",
                "test_ray_drain.py", "test_ray_objects.py", "test_ray_supervisor.py",
                "test_ray_edges.py"}
_LAB_MODULES = {"test_browser_lab.py", "test_browser_panel.py", "test_widget_chart.py",
                "test_widget_table.py"}


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the shared group above."""
    path = nodeid.split("::", 1)[0]
    module = os.path.basename(path)
    if module in _RAY_MODULES or "[ray]" in nodeid or "[ray-" in nodeid:
        return "ray"
    if module in _LAB_MODULES:
        return "lab"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return _UnitScheduling(config, log)


# =================================================================================================
# Tiers: `pytest -m unit tests` (no process, no server: under a minute on two cores) and
# `pytest -m "not unit" tests` (the integration tier: processes, Ray, S3, browser, JupyterHub)
# -------------------------------------------------------------------------------------------------
# _UNIT_TIER below is the one place that says which tests are unit: a module, then ALL of its
# tests, ALL_BUT some or ONLY some. A pattern is a test's name after its module
# ("test_x", "TestClass::test_x", "test_x[local]"); `*` and `?` are wildcards, brackets are
# literal. A unit test must start no process (subprocess, fork, multiprocessing, os.system) and use
# no server fixture: the guard below fails one that does, in every run (the full suite's too), so
# the tier cannot rot. An entry naming a module or test that is gone is a usage error.
# Chosen by measuring, not by reading: every test run once with process starts refused, and the
# ones that passed, started nothing and took under 1 s on two loaded cores made the tier.
# =================================================================================================


@dataclasses.dataclass(frozen=True)
class _TierSelection:
    """Which tests of a module are in the unit tier: those matching ``patterns``, or (when
    ``exclude``) all but those."""

    patterns: tuple[str, ...]
    exclude: bool

    def selects(self, name: str) -> bool:
        """Whether the test ``name`` ("test_x[local]", "TestClass::test_x") is unit. A pattern
        without parameters stands for every parametrization of its test."""
        names = (name, name.split("[", 1)[0])
        # Brackets are literal (parameter ids): escape "[" so fnmatch does not read a set.
        hit = any(fnmatch.fnmatchcase(n, p.replace("[", "[[]"))
                  for p in self.patterns for n in names)
        return hit != self.exclude


def ALL_BUT(*patterns: str) -> _TierSelection:  # noqa: N802 (reads as a table entry)
    """Every test of the module but those matching ``patterns`` (new tests join the tier)."""
    return _TierSelection(patterns, exclude=True)


def ONLY(*patterns: str) -> _TierSelection:  # noqa: N802
    """Only the tests of the module matching ``patterns``."""
    return _TierSelection(patterns, exclude=False)


ALL = ALL_BUT()

_UNIT_TIER: dict[str, _TierSelection] = {
    "test_any_fsspec_filesystem.py": ALL_BUT("test_fit_and_restore_through_the_filesystem"),
    "test_attempt_guard.py": ALL,
    "test_bad_input.py": ALL_BUT(
        "test_bad_report_is_a_usage_error_not_retried",
        "test_a_yielded_value_that_is_not_a_dict_is_a_usage_error",
        "test_a_generator_trainable_reports_each_yielded_dict",
        "test_a_value_returned_after_reports_is_a_warning_in_the_trial_output",
        "test_existing_experiment_is_not_mixed",
        "test_state_file_fallback_and_newer_version",
        "test_metric_not_reported_is_named_at_the_first_report",
        "test_reported_metric_passes_and_ray_switch_allows_a_late_one",
        "test_metric_without_mode_warns_once_where_it_is_written",
        "test_restore_with_another_trainable_is_refused",
        "test_nan_and_infinite_metrics_keep_result_json_strict",
        "test_result_rows_with_bare_nan_tokens_are_still_read",
        "test_read_mode_open_file_in_param_space_is_refused",
        "test_trainables_that_can_take_a_config_are_accepted",
        "test_stop_function_with_wrong_signature_is_refused"),
    "test_bench_groups.py": ONLY("test_rows_compare_with_every_other_framework"),
    "test_bench_smoke.py": ONLY("test_rows_ratios_targets_and_tables", "test_percentile"),
    "test_cell_source.py": ALL_BUT("test_a_traceback_in_another_process_shows_the_cells_line"),
    "test_cli.py": ONLY("test_ls_missing_storage_is_a_one_line_error",
                        "test_ls_missing_default_storage_names_where_it_came_from",
                        "test_ls_empty_storage", "test_unknown_url_protocol_is_a_one_line_error",
                        "test_version_and_usage"),
    "test_cli_input.py": ALL_BUT("test_bad_input_to_run_is_one_line_exit_2_and_creates_nothing",
                                 "test_every_verb_says_when_there_is_no_such_experiment",
                                 "test_usage_errors_of_the_command_itself"),
    "test_control.py": ALL,
    "test_damaged_files.py": ONLY("test_the_marker_records_every_files_size_and_crc"),
    "test_dataset_shards.py": ALL_BUT("test_sharding_does_not_import_torch"),
    "test_docs.py": ONLY("test_every_python_and_shell_block_is_run_or_says_why_not",
                         "test_the_readmes_docs_build_command_is_the_one_this_module_runs",
                         "test_the_blocks_marked_for_this_module_run",
                         "test_the_reference_tables_name_exactly_what_the_code_has"),
    "test_elastic.py": ONLY("test_bad_arguments_name_themselves_and_the_fix"),
    "test_executor_contract.py": ONLY("TestInProcessExecutor::*"),
    "test_experiment_index.py": ONLY("test_concurrent_drivers_lose_no_entry_on_a_local_disk",
                                     "test_a_bad_entry_is_no_entry",
                                     "test_the_writer_writes_on_changes_and_when_due"),
    "test_group_failures.py": ALL,
    "test_group_views.py": ALL,
    "test_handle_views.py": ONLY(
        "test_run_time_adds_up_the_driver_sessions_and_the_wall_time_is_labelled",
        "test_states_written_before_driver_sessions_still_read"),
    "test_hang_timeout.py": ALL_BUT("test_hung_trial_is_killed_and_retried_from_its_checkpoint",
                                    "test_a_slow_steady_trial_is_not_hung",
                                    "test_a_hung_rank_of_a_group_ends_the_attempt_as_a_hang"),
    "test_import_cost.py": ALL_BUT(
        "test_the_fork_servers_preload_imports_no_scheduler",
        "test_a_scheduler_is_imported_on_first_use",
        "test_a_drivers_resume_line_imports_no_listing_snapshot_or_status"),
    "test_lab_untrusted.py": ONLY("test_local_imports_follow_the_folders_modules_only"),
    "test_labextension_build.py": ONLY(
        "test_the_build_is_a_federated_extension_with_a_style_and_remote_entry"),
    "test_launchers.py": ONLY(
        "test_launchers_and_templates_that_cannot_work_are_refused_before_anything_starts",
        "test_the_launcher_setting_argument_then_magic_option_then_config_then_environment"),
    # test_no_layer_imports_a_higher_one parses every module: about 3 s on two loaded cores.
    "test_layers.py": ALL_BUT("test_no_layer_imports_a_higher_one"),
    "test_lease.py": ONLY(
        "test_acquire_on_an_empty_folder_writes_epoch_1_for_this_process",
        "test_ttl_comes_from_the_environment_and_is_clamped",
        "test_check_raises_lease_lost_once_another_driver_took_over",
        "test_a_driver_elsewhere_without_heartbeats_is_silent_before_it_is_dead",
        "test_another_pid_namespace_of_this_machine_is_named",
        "test_the_heartbeat_interval_comes_from_the_environment_and_is_clamped",
        "test_the_heartbeat_thread_notices_a_takeover_and_stops_writing",
        "test_release_after_a_takeover_writes_nothing",
        "test_fence_passes_for_the_owner_and_stops_a_superseded_trial_at_once",
        "test_fence_stops_a_trial_whose_driver_released",
        "test_fence_on_a_local_disk_rereads_only_a_changed_file",
        "test_fence_of_a_trial_on_another_machine_needs_a_recent_heartbeat",
        "test_end_strays_of_never_kills_the_caller"),
    "test_loud_trials.py": ALL_BUT("test_a_trial_printing_1_gib"),
    "test_magics.py": ALL_BUT(
        "test_import_ftnb_does_not_import_ipython",
        "test_a_line_with_options_runs_the_experiment_they_describe",
        "test_attach_by_name_and_by_path", "test_widget_config_turns_the_view_off",
        "test_ftls_is_the_listing_of_ftnb_ls", "test_stop_of_an_unknown_trial_is_one_line",
        "test_stop_of_a_finished_experiment_says_so",
        "test_cell_magic_runs_the_cell_and_uses_its_function_and_space",
        "test_resume_restarts_errored_trials_with_another_trainable",
        "test_resume_keeps_the_stop_criterion",
        "test_stop_a_trial_stop_the_experiment_and_resume_it",
        "test_ctrl_c_stops_the_waiting_not_the_experiment",
        "test_resume_without_the_space_names_the_variable_to_define",
        "test_a_name_under_two_storages_says_which_one_it_acts_on",
        "test_a_trial_that_failed_once_says_once",
        "test_ftrun_of_an_existing_experiment_with_another_function_says_the_magics_fix",
        "test_ftrun_with_worker_options_runs_each_trial_in_a_group_of_ranks",
        "test_ftresume_runs_a_stopped_group_again_in_its_ranks"),
    "test_mlflow_wandb.py": ONLY(
        "test_a_run_whose_id_was_not_recorded_is_found_again_by_its_tags",
        "test_a_logger_that_cannot_start_says_so_once_and_the_experiment_goes_on",
        "test_bad_arguments_are_refused_before_anything_runs"),
    "test_monitor.py": ONLY("test_resume_line_for_notebook_launches"),
    "test_notebooks.py": ALL_BUT("test_notebook_runs_and_matches_its_outputs"),
    "test_objects.py": ALL_BUT(
        "test_torch_tensors_round_trip_with_dtype_grad_and_shared_storage",
        "test_two_processes_share_one_copy_of_a_200mb_array",
        "test_ref_unpickled_in_a_child_never_deletes_the_file",
        "test_forked_child_exiting_keeps_the_owners_file",
        "test_file_is_removed_when_the_owners_ref_is_collected",
        "test_files_of_a_killed_owner_are_swept_by_the_next_put",
        "test_the_objects_of_a_killed_trial_are_freed_before_its_retry",
        "test_a_large_plain_value_in_the_space_is_shared_not_copied_and_resumes",
        "test_refs_in_a_grid_reach_the_trials_and_are_bound_again_on_resume",
        "test_import_stays_light"),
    "test_oom_kills.py": ONLY("test_the_kernel_log_names_the_process_it_killed",
                              "test_no_record_no_oom", "test_a_cgroup_counts_its_own_oom_kills",
                              "test_the_attempts_cgroup_count_decides_over_the_kernel_log"),
    "test_pb2.py": ALL_BUT(
        "test_suggestions_stay_in_bounds_and_are_deterministic_under_a_seed",
        "test_suggestions_move_toward_the_better_values",
        "test_pb2_exploits_and_explores_toward_better_configs",
        "test_pb2_survives_a_driver_sigkill_mid_sweep"),
    "test_pbt.py": ALL_BUT(
        "test_pbt_exploits_the_better_trials_checkpoint",
        "test_pbt_on_an_object_store_copies_the_donors_checkpoint",
        "test_synchronous_pbt_with_fewer_slots_than_trials",
        "test_pbt_exploits_survive_three_driver_sigkills",
        "test_a_driver_killed_in_each_step_of_an_exploit"),
    "test_policy.py": ALL,
    "test_ported_boosting.py": ONLY("test_bad_arguments_are_named",
                                    "test_a_metric_the_library_does_not_log_is_named"),
    "test_ported_metric_values.py": ONLY(
        "test_values_that_are_not_json_are_kept_and_written_as_text"),
    "test_ported_multi_objective.py": ONLY("test_the_limiter_takes_*", "test_lists_that_*"),
    "test_ported_stopping.py": ONLY("test_which_stoppers_decide_in_the_driver*"),
    "test_ported_settings.py": ALL_BUT("test_a_ray_script_*", "test_a_class_trainable_*"),
    "test_processes.py": ONLY("test_oom_kill_is_classified"),
    "test_rank_output.py": ALL_BUT(
        "test_each_rank_has_its_own_output_and_error_txt_shows_the_failing_ranks"),
    "test_ray_s3.py": ONLY(
        "test_a_large_output_is_published_as_its_tail_while_written_and_whole_at_the_end"),
    "test_read_model.py": ONLY("test_the_resume_line_by_origin_and_where_it_is_read",
                               "test_read_from_and_file_versions",
                               "test_the_monitor_follows_rows_on_a_non_local_filesystem"),
    "test_readme.py": ALL_BUT("test_the_quick_start_runs_as_written"),
    "test_resources.py": ALL_BUT("test_import_does_not_import_torch"),
    "test_resizing.py": ALL,
    "test_scale.py": ALL_BUT(
        "*[local]", "*[s3]",
        "test_a_driver_killed_at_random_moments_of_2000_trials_restores_every_trial_once"),
    "test_schedulers.py": ALL,
    "test_schedulers_sweeps.py": ALL_BUT(
        "test_asha_stops_the_worse_trials_at_their_rungs",
        "test_asha_decisions_survive_three_driver_sigkills",
        "test_the_asha_benchmark_workload_runs_at_its_quick_size",
        "test_hyperband_and_median_decisions_survive_three_driver_sigkills"),
    "test_search.py": ALL,
    "test_search_ray_names.py": ALL_BUT(
        "test_ray_doc_space_runs_in_a_tuner_reproducibly_and_survives_restores",
        "test_an_interrupted_experiment_resumes_with_the_new_domains"),
    "test_searchers.py": ALL_BUT("test_num_samples_minus_one_ends_with_the_time_budget",
                                 "test_optuna_suggestions_follow_the_results"),
    "test_storage_contract.py": ALL_BUT(
        "*[s3]", "*[s3-*]", "test_exclusive_lock",
        "test_a_trial_that_died_mid_line_resumes_without_losing_a_row"),
    "test_supervisor.py": ONLY("test_bad_input_raises_in_the_caller_before_anything_starts",
                               "test_a_long_tmpdir_still_leaves_room_for_the_fork_servers_socket"),
    "test_takeover.py": ONLY("test_the_takeover_line_is_worded_for_where_it_is_read"),
    "test_torch_prepare.py": ONLY("test_outside_a_group_nothing_is_wrapped", "test_get_device",
                                  "test_move_to_device_false_or_a_device",
                                  "test_bad_input_names_the_argument_the_value_and_the_fix"),
    "test_torch_trainer_input.py": ALL,
    "test_trainable_checkpoint_at_end.py": ALL_BUT(
        "test_a_driver_side_stopper_ends_the_trial_with_its_final_checkpoint"),
    "test_tune_api_nested_metrics.py": ONLY("test_metric_value_reads_flattened_names"),
    "test_tune_api_parameters.py": ONLY("test_bad_wrappers_are_refused_naming_the_argument"),
    "test_tune_api_stoppers.py": ONLY("test_stoppers_check_their_arguments"),
    "test_tune_api_trainable.py": ONLY(
        "test_checkpoint_frequency_is_refused_for_a_function_trainable"),
    "test_tune_api_trials.py": ONLY(
        "test_bad_trial_creators_are_refused_before_the_experiment_is_written"),
    "test_whole_writes.py": ALL_BUT(
        "test_rows_meeting_a_full_disk_are_whole_or_raise_and_go_on_once_there_is_space"),
    "test_widget.py": ONLY("test_many_trials_cut_table", "test_close_stops_the_updater"),
    "test_widget_table.py": ONLY("test_the_diff_*", "test_the_table_markup_*"),
    "test_widget_chart.py": ONLY(
        "test_every_point_is_in_the_model_state_after_lines_were_added",
        "test_user_stopped_and_resumed_trials_are_shown_apart",
        "test_the_plotly_chart_is_still_there_for_those_who_want_it"),
}

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Fixtures that start a server or a cluster (in a process or, for jp_serverapp, in this one).
_SERVER_FIXTURES = frozenset({"s3_server", "ray_instance", "ray_cluster", "lab_server",
                              "chromium", "jp_serverapp"})


def _stale_tier_entries(module_name: str, module, selection: _TierSelection) -> list[str]:
    """The patterns of ``selection`` that name no test function or class of ``module``."""
    names = [n for n in vars(module) if n.startswith(("test", "Test"))]
    stale = []
    for pattern in selection.patterns:
        head = pattern.split("::", 1)[0].split("[", 1)[0]
        if not any(fnmatch.fnmatchcase(n, head) for n in names):
            stale.append(f"{module_name}: {pattern!r}")
    return stale


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    stale = [f"{m}: the module is gone" for m in _UNIT_TIER
             if not os.path.isfile(os.path.join(_TESTS_DIR, m))]
    seen = set()
    for item in items:
        module_name = os.path.basename(str(item.path))
        selection = _UNIT_TIER.get(module_name)
        if selection is None or os.path.dirname(str(item.path)) != _TESTS_DIR:
            continue
        if module_name not in seen:
            seen.add(module_name)
            stale += _stale_tier_entries(module_name, item.module, selection)
        if selection.selects(item.nodeid.split("::", 1)[1]):
            item.add_marker(pytest.mark.unit)
    if stale:
        raise pytest.UsageError(
            "tests/conftest.py's _UNIT_TIER names tests that are not there:\n  "
            + "\n  ".join(stale) + "\nFix: rename or remove those entries.")


class _ProcessStartRefused(RuntimeError):
    """A unit test tried to start a process."""


class _NoProcessStarts:
    """While installed, starting a process from the test's threads (this one and those started
    after it) raises, and is remembered: a unit test that catches the error still fails. Threads
    that were running before (an earlier module's servers, reaping threads) go on as before."""

    _TARGETS = ((subprocess.Popen, "_execute_child"), (os, "fork"), (os, "forkpty"),
                (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"),
                (multiprocessing.util, "spawnv_passfds"))

    def __init__(self, nodeid: str, earlier_threads: frozenset[int]):
        self.nodeid = nodeid
        self.refused: list[str] = []
        self._originals = []
        self._earlier_threads = earlier_threads

    def _refusing(self, what: str, original):
        def refuse(*args, **kwargs):
            if threading.get_ident() in self._earlier_threads:
                return original(*args, **kwargs)
            where = "".join(traceback.format_stack(limit=6)[:-1])
            self.refused.append(f"{what}, from:\n{where}")
            raise _ProcessStartRefused(
                f"{self.nodeid} is a unit test, and it started a process ({what}). Fix: make "
                f"it start none (the in-process executor, memory:// storage), or take it out "
                f"of the unit tier in tests/conftest.py's _UNIT_TIER.")
        return refuse

    def __enter__(self):
        for owner, name in self._TARGETS:
            original = getattr(owner, name, None)
            if original is not None:
                self._originals.append((owner, name, original))
                setattr(owner, name, self._refusing(f"{getattr(owner, '__name__', owner)}."
                                                    f"{name}", original))
        return self

    def __exit__(self, exc_type, exc, tb):
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        if self.refused and exc_type is None:
            pytest.fail(f"{self.nodeid} is a unit test, and it started a process: "
                        f"{self.refused[0]}Fix: make it start none, or take it out of the unit "
                        f"tier in tests/conftest.py's _UNIT_TIER.", pytrace=False)
        return False


_THREADS_BEFORE = pytest.StashKey[frozenset]()


def _unit_phase(item):
    if item.get_closest_marker("unit") is None:
        return contextlib.nullcontext()
    if _THREADS_BEFORE not in item.stash:  # set once, at setup: the test's fixtures' are its own
        item.stash[_THREADS_BEFORE] = frozenset(
            t.ident for t in threading.enumerate() if t.ident != threading.get_ident())
    return _NoProcessStarts(item.nodeid, item.stash[_THREADS_BEFORE])


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Notes on the item that its setup or call failed (for fixtures' teardowns)."""
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("unit") is not None:
        servers = sorted(_SERVER_FIXTURES.intersection(item.fixturenames))
        if servers:
            pytest.fail(f"{item.nodeid} is a unit test, and it uses {', '.join(servers)}. Fix: "
                        f"take it out of the unit tier in tests/conftest.py's _UNIT_TIER.",
                        pytrace=False)
    with _unit_phase(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _unit_phase(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _unit_phase(item):
        return (yield)
