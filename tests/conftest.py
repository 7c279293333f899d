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
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
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
# (``ray_cluster``, session: a head without CPUs and three worker nodes of 1 CPU each, health checks
# tuned so a lost node is noticed in about 1.5 s). Mark Ray tests with ``@pytest.mark.ray``;
# they are skipped when ray is not installed (``pip install 'ftnb[ray]'``).
# =================================================================================================

# One authentication mode for every Ray process of the session. Ray >= 2.60's ray.init() of a
# new local instance (ray_instance) sets RAY_AUTH_MODE=token in this process when it is unset;
# drivers started afterwards inherit it, and the ray_cluster started before it (no token) then
# has its RPCs to them refused: the GCS takes the refusal for "the owner dropped the actor" and
# cancels every trial actor they create. Set before any cluster starts, so all agree.
os.environ["RAY_AUTH_MODE"] = "disabled"

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


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster on this machine: a head without CPUs and three worker nodes of one
    CPU each, started once for the session (about 20 s idle, 25-40 s at load 10). Yields the
    ``ray.cluster_utils.Cluster``; a test that removes or drains a node adds one back (its
    ``add_node`` retries a node that misses Ray's start-up wait, as the fixture's do).
    This process does not connect to it (drivers run as child processes and connect by
    ``cluster.address``), so it can coexist with ``ray_instance``. No autoscaler monitor: drains
    go to the GCS directly (tests/test_ray_drain.py), and it is one Python process less to start."""
    pytest.importorskip("ray")
    cluster = _patient_ray_cluster_class()(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "no_monitor": True,
        "_system_config": RAY_HEALTH_CHECKS})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


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
# Parallel runs (pytest-xdist: `-n 2 --dist loadscope`, what the README's test command uses)
# -------------------------------------------------------------------------------------------------
# loadscope keeps a module's tests on one worker (its module-scoped kernels and servers start
# once). On top of it, the tests that share an expensive session fixture are one unit: every Ray
# test (one multi-node cluster, not one per worker: two clusters on two cores starve each other's
# health checks) and the tests on the shared JupyterLab server. (xdist's own xdist_group marks
# do not reach its scheduler under pytest 9: its node-id suffix is lost.)
# =================================================================================================

_RAY_MODULES = {"test_elastic_ray.py", "test_pbt_ray.py", "test_ray_cluster.py", "test_ray_s3.py",
                "test_ray_drain.py", "test_ray_objects.py", "test_ray_supervisor.py"}
_LAB_MODULES = {"test_browser_lab.py", "test_widget_chart.py"}


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
