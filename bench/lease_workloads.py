"""The owner lease's heartbeat: what one costs on a local disk and on an S3 server (moto on
loopback), and how soon a killed driver reads as silent, to choose the default TTL and
heartbeat interval (issue 19). ftnb only: Ray Tune has no such lease. Registered in
:mod:`bench.workloads`.

A heartbeat is what the driver's heartbeat thread does every interval
(``Lease._write_if_ours``): under the lease lock (``flock`` on a disk) read ``owner.json``,
check the token, write it back atomically; on S3, with no lock, the read takes the object's
ETag and the write is conditional on it (``If-Match``: a compare-and-swap). A reader (a view, a trial's
fence) reads ``owner.json``. The figures per interval follow: the share of one thread's time
spent beating, and the requests an object store bills per hour.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any, Optional

__all__ = ["lease_heartbeat", "s3_filesystem", "start_moto_server"]

_S3_KEY = "testing"
_KILLED_DRIVER = r"""
import sys, time
from ftnb.storage import ExperimentPaths
from ftnb.storage.lease import Lease
lease = Lease.acquire(ExperimentPaths.at(sys.argv[1]))
lease.start_heartbeat()
print("READY", flush=True)
time.sleep(3600)
"""


def lease_heartbeat(framework: str, storage_dir: str, beats: int, interval_s: float,
                    ttl_s: float) -> dict:
    """One lease heartbeat (lock, read, token check, atomic write) on a local disk and on an
    S3 server (moto, loopback), p50 and p99 of ``beats``; a reader's read of ``owner.json``; at
    the heartbeat interval ``interval_s`` (TTL ``ttl_s``), the share of a thread spent beating
    and the S3 requests per hour; and the time from a SIGKILLed driver (in another "machine":
    its death unprovable) until the read model calls it silent."""
    if framework != "ftnb":
        raise ValueError(f"lease_heartbeat measures ftnb only, not {framework!r}")
    out: dict[str, Any] = {}
    local = _beats(os.path.join(storage_dir, "local"), None, beats)
    out.update(beat_local_ms=local["p50"], beat_local_p99_ms=local["p99"],
               read_local_ms=local["read"],
               beat_local_busy_pct=100 * local["p50"] / 1e3 / interval_s)
    endpoint, server = start_moto_server(storage_dir)
    if server is not None:
        try:
            fs = s3_filesystem(endpoint)
            bucket = f"ftnb-bench-{uuid.uuid4().hex[:8]}"
            fs.mkdir(bucket)
            s3 = _beats(f"s3://{bucket}/runs", fs, beats)
            out.update(beat_s3_ms=s3["p50"], beat_s3_p99_ms=s3["p99"], read_s3_ms=s3["read"],
                       beat_s3_busy_pct=100 * s3["p50"] / 1e3 / interval_s,
                       # a GET and a conditional PUT per beat (no lock on S3)
                       s3_requests_per_hour=2 * 3600 / interval_s)
        finally:
            server.kill()
            server.wait(timeout=10)
    out["silent_after_kill_s"] = _silent_after_kill(storage_dir, interval_s, ttl_s)
    out["interval_s"] = interval_s
    return out


def _beats(root: str, fs: Any, beats: int) -> dict:
    from ftnb.storage import ExperimentPaths
    from ftnb.storage.lease import Lease, read_lease

    paths = ExperimentPaths.at(f"{root}/exp", fs)
    lease = Lease.acquire(paths)
    try:
        times, reads = [], []
        for _ in range(beats):
            t0 = time.perf_counter()
            if not lease._write_if_ours(released=False):
                raise RuntimeError("the benchmark's lease was lost")
            t1 = time.perf_counter()
            read_lease(paths)
            t2 = time.perf_counter()
            times.append((t1 - t0) * 1e3)
            reads.append((t2 - t1) * 1e3)
    finally:
        lease.release()
    times.sort()
    return {"p50": statistics.median(times), "p99": times[min(len(times) - 1,
                                                               int(0.99 * len(times)))],
            "read": statistics.median(reads)}


def _silent_after_kill(storage_dir: str, interval_s: float, ttl_s: float) -> float:
    """Seconds from SIGKILLing a driver whose death cannot be proven from here (another
    ``$FTNB_HOST_ID``) until its lease reads as silent."""
    from ftnb.storage import ExperimentPaths
    from ftnb.storage.lease import read_lease

    exp = os.path.join(storage_dir, "killed", "exp")
    env = dict(os.environ, FTNB_HOST_ID="bench-other-machine", FTNB_LEASE_TTL_S=str(ttl_s),
               FTNB_LEASE_HEARTBEAT_S=str(interval_s))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER, exp], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError("the driver to kill did not start")
        time.sleep(interval_s * 1.5)  # let it beat: it dies at a random point of an interval
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=10)
        paths = ExperimentPaths.at(exp)
        while True:
            lease = read_lease(paths)
            if lease is not None and lease.verdict().silent:
                return time.monotonic() - killed
            if time.monotonic() - killed > 3 * ttl_s:
                raise RuntimeError("the killed driver never read as silent")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# -- the S3 server ------------------------------------------------------------------------------
def start_moto_server(storage_dir: str) -> tuple[str, Optional[subprocess.Popen]]:
    """A moto S3 server on a free loopback port (the benchmark's S3 figures; the caller kills
    it), or ``("", None)`` when moto or s3fs is
    missing (neither is in the ``bench`` extra: ``pip install 'moto[server]' s3fs``, as the
    ``dev`` extra has them, for the S3 figures)."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
        print("note: moto[server] or s3fs is not installed: no S3 figures", file=sys.stderr)
        return "", None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile(dir=storage_dir)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=_S3_KEY, AWS_SECRET_ACCESS_KEY=_S3_KEY,
               AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=1.0):
                return endpoint, proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=10)
    log.seek(0)
    raise RuntimeError(f"moto did not start on {endpoint}: {log.read()[-2000:]!r}")


def s3_filesystem(endpoint: str) -> Any:
    """An fsspec S3 filesystem on the moto server at ``endpoint`` (its dummy credentials, no
    listing cache)."""
    import fsspec

    return fsspec.filesystem("s3", endpoint_url=endpoint, key=_S3_KEY, secret=_S3_KEY,
                             use_listings_cache=False, skip_instance_cache=True)
