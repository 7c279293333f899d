"""The JupyterLab panel's server side (ftnb.lab): how fast its list of experiments comes, and
what the extension costs while no panel asks.

``lab_listing`` makes two real experiments (a finished sweep with an injected failure, and one
whose supervisor was SIGKILLed: INTERRUPTED), copies them to ``experiments`` folders under a
local root and under a root on an S3 server (moto, loopback; 90 % finished, 10 % interrupted),
each copy with the index entry its driver would have left in the root's ``.ftnb-index/`` (the
template's entry under the copy's name), and the index's snapshot as the next driver to end
leaves it (:func:`ftnb.storage.experiment_index.compact_index` with
:func:`ftnb.core.index_upkeep.gone_summaries`: the interrupted copies read once, as readers
read them). It starts a real Jupyter
server (``python -m jupyter_server``) serving both roots, and times
``GET ftnb/api/experiments`` through it, side by side with ``ftnb ls --json`` on the same
roots (a new process each time). Then it leaves the server idle and counts its CPU time, and
that of the same server without the extension.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any, Optional

from ftnb.storage import TRIAL_RECORD_FILE
from ftnb.storage.experiment_index import INDEX_DIR, entry_file_name

from .lease_workloads import s3_filesystem, start_moto_server

__all__ = ["lab_listing", "listed_trainable"]

_TOKEN = "ftnb-bench-token"
_S3_KEY = "testing"
_FINISHED, _INTERRUPTED = "finished", "interrupted"


def listed_trainable(config: dict) -> None:
    """Three reports; ``fail`` makes the first attempt raise after the first; ``gate`` makes it
    wait for that file before ending (so its driver can be killed while it runs)."""
    import ftnb

    for step in range(1, 4):
        if config.get("fail") and ftnb.get_context().attempt == 1 and step == 2:
            raise ValueError("injected failure")
        ftnb.report({"loss": 1.0 / step})
    while config.get("gate") and not os.path.exists(config["gate"]):
        time.sleep(0.05)


def lab_listing(framework: str, storage_dir: str, experiments: int, repeats: int,
                s3_repeats: int, idle_s: float) -> dict:
    """Listing ``experiments`` experiments through the server's route (local disk, S3 server)
    against ``ftnb ls --json``; the server's CPU while idle, with and without the extension.

    list_local_s / list_s3_s: ``GET ftnb/api/experiments`` through a real Jupyter server, what
    a user who opens the panel waits for. On the local disk the median of the ``repeats``
    listings after the first (list_local_first_s: the first). On S3 list_s3_s is the first
    listing of a new server (nothing remembered: the root, its index and snapshot, and each
    interrupted experiment's lease, checked against the one the snapshot read it under), and
    list_s3_again_s the median of ``s3_repeats`` later ones (a panel's refresh: the same
    requests, the entries and their reads remembered). ls_*_s: ``ftnb ls --json`` on the
    same root (a new process each time: what a terminal user waits for). idle_cpu_ms /
    idle_cpu_noext_ms: the server's CPU time over ``idle_s`` seconds with no request, with the
    extension and without it.
    """
    templates = _make_templates(os.path.join(storage_dir, "templates"))
    local_root = os.path.join(storage_dir, "local")
    _copy_local(templates, local_root, experiments)
    endpoint, moto = start_moto_server(storage_dir)
    try:
        s3_root = _copy_s3(templates, endpoint, experiments) if endpoint else None
        roots = [local_root] + ([s3_root] if s3_root else [])
        env = _s3_env(endpoint)
        out: dict[str, Any] = {}
        with _JupyterServer(storage_dir, roots, env, extension=True) as server:
            local = _times(max(2, repeats), lambda: server.list(local_root, experiments))
            out["list_local_first_s"] = local[0]
            out["list_local_s"] = statistics.median(local[1:])
            if s3_root:
                s3 = _times(1 + max(1, s3_repeats), lambda: server.list(s3_root, experiments))
                out["list_s3_s"] = s3[0]
                out["list_s3_again_s"] = statistics.median(s3[1:])
            out["idle_cpu_ms"] = server.idle_cpu_ms(idle_s)
        with _JupyterServer(storage_dir, roots, env, extension=False) as server:
            out["idle_cpu_noext_ms"] = server.idle_cpu_ms(idle_s)
        out["ls_local_s"] = _median(repeats, lambda: _ftnb_ls(local_root, env, experiments))
        if s3_root:
            out["ls_s3_s"] = _median(s3_repeats, lambda: _ftnb_ls(s3_root, env, experiments))
        return out
    finally:
        if moto is not None:
            moto.kill()
            moto.wait(timeout=10)


# -- the experiments -------------------------------------------------------------------------------
def _make_templates(folder: str) -> dict[str, str]:
    """A finished sweep (one trial failed once) and an interrupted one (its supervisor killed
    while its trials ran), made by real runs."""
    import ftnb
    from ftnb.ui import read_model

    space = {"fail": ftnb.grid_search([False, True])}
    ftnb.run(listed_trainable, name=_FINISHED, storage_path=folder, param_space=space,
             run_config=ftnb.RunConfig(verbose=0))
    gate = os.path.join(folder, "gate")
    handle = ftnb.launch(listed_trainable, name=_INTERRUPTED, storage_path=folder,
                         param_space={**space, "gate": gate}, quiet=True)
    deadline = time.monotonic() + 120
    # Killed once its driver saved a running trial (its index entry says so), as a driver that
    # dies mid-run leaves it.
    while not _entry_says_running(folder, _INTERRUPTED):
        if time.monotonic() > deadline:
            raise RuntimeError("the interrupted template never saved a running trial")
        time.sleep(0.05)
    os.kill(read_model.supervisor_record(handle.paths)["pid"], signal.SIGKILL)
    open(gate, "w").close()  # (its trials die with it; none may linger)
    while handle.status() != "INTERRUPTED":
        if time.monotonic() > deadline:
            raise RuntimeError("the killed supervisor's experiment never read INTERRUPTED")
        time.sleep(0.05)
    return {kind: os.path.join(folder, kind) for kind in (_FINISHED, _INTERRUPTED)}


def _entry_says_running(folder: str, name: str) -> bool:
    try:
        with open(os.path.join(folder, INDEX_DIR, entry_file_name(name)), "rb") as f:
            entry = json.loads(f.read())
    except (OSError, ValueError):
        return False
    return entry.get("status") == "RUNNING" and entry.get("counts", {}).get("RUNNING", 0) > 0


def _kinds(experiments: int) -> list[tuple[str, str]]:
    """(name, template) of each copy: every tenth one interrupted."""
    return [(f"exp{i:05d}", _INTERRUPTED if i % 10 == 9 else _FINISHED)
            for i in range(experiments)]


def _copy_local(templates: dict[str, str], root: str, experiments: int) -> None:
    from ftnb.core.index_upkeep import gone_summaries
    from ftnb.storage import Storage
    from ftnb.storage.experiment_index import compact_index

    entries = _template_entries(templates)
    for name, kind in _kinds(experiments):
        shutil.copytree(templates[kind], os.path.join(root, name), symlinks=True)
        os.makedirs(os.path.join(root, INDEX_DIR), exist_ok=True)
        with open(os.path.join(root, INDEX_DIR, entry_file_name(name)), "wb") as f:
            f.write(_entry_as(entries[kind], name))
    if not compact_index(Storage(root), root, most=experiments, derive=gone_summaries,
                         most_derived=experiments):
        raise RuntimeError(f"could not write the index snapshot of {root}")


def _template_entries(templates: dict[str, str]) -> dict[str, dict]:
    """Each template's index entry, as its driver left it."""
    out = {}
    for kind, folder in templates.items():
        index = os.path.join(os.path.dirname(folder), INDEX_DIR, entry_file_name(kind))
        with open(index, "rb") as f:
            out[kind] = json.loads(f.read())
    return out


def _entry_as(entry: dict, name: str) -> bytes:
    """A template's entry as the copy ``name``'s driver would have written it."""
    return json.dumps({**entry, "name": name}).encode("utf-8")


def _copy_s3(templates: dict[str, str], endpoint: str, experiments: int) -> str:
    """The copies in a new bucket, uploaded concurrently (one batch of PUTs): the files a
    listing may read (the experiment's own, and each trial's record), not the trials' rows and
    logs, which only make the upload longer."""
    fs = s3_filesystem(endpoint)
    fs.mkdir("lab-listing")
    files: dict[str, dict[str, bytes]] = {}
    for kind, folder in templates.items():
        files[kind] = {}
        for parent, _, names in os.walk(folder):
            for name in names:
                if parent != folder and name != TRIAL_RECORD_FILE:
                    continue
                path = os.path.join(parent, name)
                with open(path, "rb") as f:
                    files[kind][os.path.relpath(path, folder)] = f.read()
    batch = {f"lab-listing/runs/{name}/{rel}": data
             for name, kind in _kinds(experiments) for rel, data in files[kind].items()}
    entries = _template_entries(templates)
    batch.update({f"lab-listing/runs/{INDEX_DIR}/{entry_file_name(name)}":
                  _entry_as(entries[kind], name) for name, kind in _kinds(experiments)})
    fs.pipe(batch)
    from ftnb.core.index_upkeep import gone_summaries
    from ftnb.storage import Storage
    from ftnb.storage.experiment_index import compact_index

    if not compact_index(Storage("s3://lab-listing/runs", fs), "lab-listing/runs",
                         most=experiments, derive=gone_summaries, most_derived=experiments):
        raise RuntimeError("could not write the index snapshot of s3://lab-listing/runs")
    return "s3://lab-listing/runs"


# -- the server --------------------------------------------------------------------------------
class _JupyterServer:
    """``python -m jupyter_server`` on a free loopback port, serving ``roots`` (or not loading
    the extension at all), stopped at the end of the ``with`` block."""

    def __init__(self, storage_dir: str, roots: list[str], env: dict, extension: bool) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}/"
        home = tempfile.mkdtemp(prefix="jupyter-", dir=storage_dir)
        config = os.path.join(home, "jupyter_server_config.json")
        with open(config, "w") as f:
            json.dump({"ServerApp": {"jpserver_extensions": {"ftnb.lab": extension}},
                       "Ftnb": {"storage_roots": roots}}, f)
        self.command = [sys.executable, "-m", "jupyter_server", "--no-browser",
                        f"--port={self.port}", "--ip=127.0.0.1", f"--config={config}",
                        f"--IdentityProvider.token={_TOKEN}", f"--ServerApp.root_dir={home}",
                        "--allow-root"]
        self.env = dict(env, JUPYTER_CONFIG_DIR=home, JUPYTER_RUNTIME_DIR=home)
        self.extension = extension
        self.process: Optional[subprocess.Popen] = None

    def __enter__(self) -> "_JupyterServer":
        self.process = subprocess.Popen(self.command, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        route = "ftnb/api/roots" if self.extension else "api/status"
        while True:
            try:
                self._get(route)
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter server did not start: {self.command}") from None
                time.sleep(0.1)

    def __exit__(self, *exc: Any) -> None:
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _get(self, route: str) -> Any:
        request = urllib.request.Request(self.base + route,
                                         headers={"Authorization": f"token {_TOKEN}"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def list(self, root: str, expected: int) -> None:
        listed = self._get("ftnb/api/experiments?" + urllib.parse.urlencode({"root": root}))
        _check(listed["experiments"], expected, root)

    def idle_cpu_ms(self, seconds: float) -> float:
        """The server's CPU time (user + system) over ``seconds`` without a request."""
        assert self.process is not None
        time.sleep(1.0)  # the last request's aftermath (its log line, a GC) is not idling
        before = _cpu_s(self.process.pid)
        time.sleep(seconds)
        return (_cpu_s(self.process.pid) - before) * 1e3


def _check(entries: list[dict], expected: int, root: str) -> None:
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    interrupted = sum(1 for _, kind in _kinds(expected) if kind == _INTERRUPTED)
    if len(entries) != expected or counts.get("INTERRUPTED", 0) != interrupted:
        raise RuntimeError(f"listing {root} gave {len(entries)} experiments {counts}, not "
                           f"{expected} with {interrupted} INTERRUPTED")


def _ftnb_ls(root: str, env: dict, expected: int) -> None:
    done = subprocess.run([sys.executable, "-m", "ftnb", "ls", root, "--json"], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    _check(json.loads(done.stdout), expected, root)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _times(repeats: int, run: Any) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def _median(repeats: int, run: Any) -> float:
    return statistics.median(_times(repeats, run))


# -- helpers --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _s3_env(endpoint: str) -> dict:
    """The environment in which s3fs (the server's, ``ftnb ls``'s) reaches the moto server:
    its endpoint through fsspec's own configuration."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=_S3_KEY, AWS_SECRET_ACCESS_KEY=_S3_KEY,
               AWS_DEFAULT_REGION="us-east-1")
    if endpoint:
        env["FSSPEC_S3"] = json.dumps({"endpoint_url": endpoint, "use_listings_cache": False})
    return env
