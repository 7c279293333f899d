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

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

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
# (``ray_cluster``, module: a head without CPUs and two worker nodes of 1 CPU each, health checks
# tuned so a lost node is noticed in about 1.5 s). Mark Ray tests with ``@pytest.mark.ray``;
# they are skipped when ray is not installed (``pip install 'ftnb[ray]'``).
# =================================================================================================

RAY_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                     "health_check_timeout_ms": 500, "health_check_initial_delay_ms": 0}


@pytest.fixture(scope="session")
def ray_instance():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config=RAY_HEALTH_CHECKS)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster on this machine: a head without CPUs and three worker nodes of one
    CPU each, started once for the session (about 20 s). Yields the
    ``ray.cluster_utils.Cluster``; a test that removes or drains a node adds one back.
    This process does not connect to it (drivers run as child processes and connect by
    ``cluster.address``), so it can coexist with ``ray_instance``."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "_system_config": RAY_HEALTH_CHECKS})
    try:
        for _ in range(3):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
