"""ftnb under a real JupyterHub (issue 19): experiments that outlive the user's server, and
servers that can still be culled.

The hub (tests/hub/jupyterhub_config.py): DummyAuthenticator, configurable-http-proxy (npm ci in
tests/hub), jupyterhub-idle-culler as a service, and a spawner that stops a server as real hubs
do: cgroup-wide (SystemdSpawner, TLJH) or by SIGKILL of its PID namespace's PID 1 (DockerSpawner,
KubeSpawner); see tests/hub/spawners.py. The hub-wide default an admin sets is the ``command``
launcher, whose template asks a root-side launch agent (tests/hub/launch_agent.py, started here,
what ``systemd-run`` is on a systemd host) to start the supervisor outside the server's cgroup
and namespace. The tests act as a user's browser: the hub's REST API with a token, then a
kernel's websocket through the proxy (``/user/<name>/api/kernels/<id>/channels``).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import _free_port
from procs import REPO, TESTS, pid_alive, wait_for

requests = pytest.importorskip("requests")
websocket = pytest.importorskip("websocket")
pytest.importorskip("jupyterhub")
pytest.importorskip("jupyterhub_idle_culler")

HUB_DIR = os.path.join(TESTS, "hub")
PROXY = os.path.join(HUB_DIR, "node_modules", ".bin", "configurable-http-proxy")
sys.path.insert(0, HUB_DIR)
from spawners import ProcessGroupUnit

pytestmark = [
    pytest.mark.hub, pytest.mark.slow, pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists(PROXY),
                       reason="configurable-http-proxy missing: (cd tests/hub && npm ci)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the hub's spawner runs servers as root"),
]

#: Lease settings of every server (the documented variables): a driver reads as silent after
#: 1 s without a heartbeat, as dead only after 300 s, so a takeover that completes the
#: experiment before then was not waiting out the TTL.
LEASE_ENV = {"FTNB_LEASE_TTL_S": "300", "FTNB_LEASE_HEARTBEAT_S": "0.5"}


class Hub:
    """The running hub, driven through its REST API as a service with an admin token."""

    def __init__(self, url: str, token: str, culler_token: str, storage: str) -> None:
        self.url = url
        self.token = token
        self.culler_token = culler_token
        self.storage = storage
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {token}"

    def api(self, method: str, path: str, **kwargs):
        response = self.http.request(method, f"{self.url}/hub/api{path}", timeout=30, **kwargs)
        assert response.status_code < 400, (method, path, response.status_code, response.text)
        return response

    def server(self, user: str) -> dict | None:
        return self.api("GET", f"/users/{user}").json()["servers"].get("")

    def start(self, user: str, isolation: str = "cgroup") -> None:
        """Create the user if needed and start their server; return once it answers."""
        if self.http.get(f"{self.url}/hub/api/users/{user}", timeout=30).status_code == 404:
            self.api("POST", f"/users/{user}")
        self.api("POST", f"/users/{user}/server", json={"isolation": isolation})
        wait_for(lambda: (self.server(user) or {}).get("ready"), 60, f"{user}'s server ready")

    def stop(self, user: str) -> None:
        self.api("DELETE", f"/users/{user}/server")
        wait_for(lambda: self.server(user) is None, 60, f"{user}'s server stopped")

    def kernel(self, user: str) -> KernelSocket:
        response = self.http.post(f"{self.url}/user/{user}/api/kernels", json={}, timeout=60)
        assert response.status_code == 201, response.text
        return KernelSocket(self, user, response.json()["id"])


class KernelSocket:
    """A kernel driven over its websocket through the proxy, as JupyterLab in a browser does
    (no widget view ever opens: comm messages are received and left unanswered)."""

    def __init__(self, hub: Hub, user: str, kernel_id: str) -> None:
        url = hub.url.replace("http", "ws", 1) + f"/user/{user}/api/kernels/{kernel_id}/channels"
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {hub.token}"],
                                              timeout=60)
        self.session = uuid.uuid4().hex
        self.comm_opens = 0
        self.execute("%load_ext ftnb")

    def execute(self, code: str, timeout: float = 90) -> str:
        """Run a cell; return what it showed (streams, text/plain of results and displays);
        an error in the cell fails the test with its traceback."""
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": self.session, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        shown, replied, idle = [], None, False
        deadline = time.time() + timeout
        while not (replied and idle):
            assert time.time() < deadline, f"cell {code!r} still running; so far: {shown}"
            msg = _message(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                shown.append(content["text"])
            elif kind in ("execute_result", "display_data", "update_display_data"):
                shown.append(content["data"].get("text/plain", ""))
            elif kind == "comm_open":
                self.comm_opens += 1
            elif kind == "error":
                shown.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "execute_reply":
                replied = content
        text = "\n".join(shown)
        assert replied["status"] == "ok", text
        return text

    def close(self) -> None:
        self.ws.close()


def _message(frame) -> dict:
    """A kernel message from a websocket frame: JSON text, or a binary frame with buffers
    (the widget's arrays): a count of parts, their offsets, the JSON first."""
    if isinstance(frame, str):
        return json.loads(frame)
    offsets = [int.from_bytes(frame[4 + 4 * i:8 + 4 * i], "big")
               for i in range(int.from_bytes(frame[:4], "big"))]
    return json.loads(frame[offsets[0]:offsets[1] if len(offsets) > 1 else None])


def _space(gate: str, n: int, sleep: float) -> str:
    return (f"import ftnb\nfrom scripted import scripted\n"
            f"space = {{'n': {n}, 'sleep': {sleep}, 'ckpt_every': 1, 'gate': {gate!r}, "
            f"'x': ftnb.grid_search([0, 1])}}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    storage = base / "storage"  # the users' persistent storage (a home volume, NFS)
    storage.mkdir()
    agent_unit = ProcessGroupUnit(f"ftnb-hub-agent-{uuid.uuid4().hex[:8]}")
    agent_socket = str(base / "agent.sock")
    agent = subprocess.Popen(
        [sys.executable, os.path.join(HUB_DIR, "launch_agent.py"), "--serve", "--socket",
         agent_socket, "--cgroup", agent_unit.name, "--log", str(base / "agent.log")])
    wait_for(lambda: os.path.exists(agent_socket), 30, "the launch agent's socket")
    template = " ".join(shlex.quote(word) for word in (
        sys.executable, os.path.join(HUB_DIR, "launch_agent.py"), "--socket", agent_socket,
        "--")) + " {command}"
    server_env = {
        "FTNB_STORAGE_PATH": str(storage),
        "FTNB_LAUNCHER": "command",  # the hub-wide default an admin sets
        "FTNB_LAUNCHER_COMMAND": template,
        "FTNB_LAUNCH_DIR": str(storage / ".launch"),
        "PYTHONPATH": TESTS + os.pathsep + REPO,
        "JUPYTERHUB_ACTIVITY_INTERVAL": "1",  # the server reports its activity every second
        **LEASE_ENV,
    }
    port = _free_port()
    env = dict(os.environ, FTNB_HUB_DIR=str(base), FTNB_HUB_PORT=str(port),
               FTNB_HUB_INTERNAL_PORT=str(_free_port()),
               FTNB_HUB_PROXY_API_PORT=str(_free_port()),
               FTNB_HUB_TOKEN=uuid.uuid4().hex, FTNB_HUB_CULLER_TOKEN=uuid.uuid4().hex,
               FTNB_HUB_SERVER_ENV=json.dumps(server_env))
    with open(base / "hub.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", os.path.join(HUB_DIR, "jupyterhub_config.py")],
            cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    hub = Hub(f"http://127.0.0.1:{port}", env["FTNB_HUB_TOKEN"], env["FTNB_HUB_CULLER_TOKEN"],
              str(storage))

    def answers():
        assert proc.poll() is None, (base / "hub.log").read_text()[-3000:]
        try:
            return hub.http.get(f"{hub.url}/hub/api/", timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(answers, 60, "the hub")
        yield hub
    finally:
        proc.send_signal(signal.SIGTERM)  # it stops every server (cleanup_servers)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        agent.kill()
        agent.wait()
        agent_unit.kill()  # the supervisors and trials the agent started
        wait_for(lambda: not agent_unit.pids(), 10, "the agent's processes gone")
        agent_unit.remove()
        print(f"hub log: {base / 'hub.log'} (units: {agent_unit.kind})")


N_STEPS = 3


def _status(path: str) -> dict:
    """``ftnb status PATH --json`` from the test's machine (outside every server)."""
    done = subprocess.run([sys.executable, "-m", "ftnb", "status", path, "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _status_if(path: str, condition) -> dict | None:
    status = _status(path)
    return status if condition(status) else None


def _steps(path: str) -> dict:
    """Each trial's executed steps, "attempt step" per line (tests/scripted.py)."""
    steps = {}
    for entry in sorted(os.listdir(path)):
        log = os.path.join(path, entry, "executed.log")
        if os.path.exists(log):
            with open(log) as f:
                steps[entry] = [tuple(map(int, line.split())) for line in f]
    return steps


def _waiting_at_the_gate(path: str) -> bool:
    """Both trials ran every step but the last, which waits for the gate."""
    steps = _steps(path) if os.path.isdir(path) else {}
    return len(steps) == 2 and all(len(done) == N_STEPS - 1 for done in steps.values())


def _every_step_once(path: str, n: int = N_STEPS) -> None:
    steps = _steps(path)
    assert len(steps) == 2
    for trial, done in steps.items():
        assert sorted(step for _, step in done) == list(range(1, n + 1)), (trial, done)


def _reported(path: str) -> int:
    return sum(len(done) for done in _steps(path).values())


def _supervisor(path: str) -> dict:
    with open(os.path.join(path, "supervisor.json")) as f:
        return json.load(f)


def _run_experiment(hub: Hub, user: str, name: str, gate, options: str, n: int = N_STEPS,
                    sleep: float = 0.05):
    """Start the user's server and ``%ftrun`` an experiment there whose two trials run ``n``
    steps, the last one once the gate opens; return (once both trials reported two steps:
    with ``N_STEPS``, once both wait at the gate) its path, the kernel and ``supervisor.json``."""
    path = os.path.join(hub.storage, name)
    hub.start(user)
    kernel = hub.kernel(user)
    kernel.execute(_space(str(gate), n, sleep))
    kernel.execute(f"%ftrun scripted -p space --name {name} {options}")
    wait_for(lambda: len(_steps(path)) == 2 and all(
        len(done) >= 2 for done in _steps(path).values()), 60, "both trials reporting")
    return path, kernel, _supervisor(path)


def test_the_command_launcher_keeps_an_experiment_running_through_a_cgroup_wide_stop(
        hub, tmp_path):
    user, name, gate = "ada", "through_cgroup_stop", tmp_path / "gate"
    path, kernel, supervisor = _run_experiment(hub, user, name, gate, "--no-widget")
    assert _waiting_at_the_gate(path)
    assert supervisor["launcher"] == "command"  # the hub's default
    kernel_pid = int(kernel.execute("import os; print(os.getpid())"))
    kernel.close()

    hub.stop(user)  # SIGTERM to the server's cgroup, then cgroup.kill
    assert not pid_alive(kernel_pid)
    assert pid_alive(supervisor["pid"])  # started by the agent, outside the server's cgroup
    assert _status(path)["status"] == "RUNNING"

    hub.start(user)
    kernel = hub.kernel(user)
    shown = kernel.execute(f"%ftattach {name} -o h")  # the widget, and its text view
    assert "RUNNING" in shown, shown
    gate.touch()
    assert kernel.execute("print(h.wait(timeout=60) is not None, h.status())").split()[-1] \
        == "FINISHED"
    _every_step_once(path)
    assert {attempt for done in _steps(path).values() for attempt, _ in done} == {1}
    kernel.close()
    hub.stop(user)


def test_the_local_launcher_is_interrupted_by_a_cgroup_stop_and_taken_over_after_a_namespace_kill(
        hub, tmp_path):
    user, name, gate = "grace", "local_supervisor", tmp_path / "gate"
    path, kernel, supervisor = _run_experiment(hub, user, name, gate,
                                               "--launcher local --no-widget")
    assert _waiting_at_the_gate(path)
    assert supervisor["launcher"] == "local"
    kernel.close()

    # A cgroup-wide stop sends SIGTERM first: the supervisor pauses its trials and says so.
    hub.stop(user)
    assert not pid_alive(supervisor["pid"])
    status = wait_for(lambda: _status_if(path, lambda s: s["status"] == "INTERRUPTED"), 10,
                      "INTERRUPTED")
    assert status["counts"]["PAUSED"] == 2 and status["total_failures"] == 0, status
    assert status["driver_silent_s"] is None and status["resume_line"]

    # Resumed in a server in a PID namespace of its own, which is then SIGKILLed as a
    # container is: nobody says goodbye, and from outside the namespace the death is unproven.
    hub.start(user, "pidns")
    kernel = hub.kernel(user)
    kernel.execute(_space(str(gate), N_STEPS, 0.05))
    kernel.execute(f"%ftresume {name} --launcher local --no-widget")
    wait_for(lambda: _status(path)["counts"]["RUNNING"] == 2, 60, "the resumed trials")
    kernel.close()
    hub.stop(user)
    silent = wait_for(lambda: _status_if(path, lambda s: s["driver_silent_s"] is not None), 30,
                      "the driver to read as silent")
    assert silent["status"] == "RUNNING"
    assert 0 < silent["driver_dead_in_s"] <= float(LEASE_ENV["FTNB_LEASE_TTL_S"])
    assert "takeover=True" in silent["takeover"]  # the line that takes it over now

    hub.start(user)
    kernel = hub.kernel(user)
    kernel.execute(_space(str(gate), N_STEPS, 0.05))
    shown = kernel.execute(f"%ftattach {name} -o h")  # the widget, and its text view
    assert "silent" in shown and "takeover" in shown, shown
    gate.touch()
    # At once: the old driver counts as dead only after far longer than these cells' deadlines.
    assert _status(path)["driver_dead_in_s"] > 150
    kernel.execute(f"%ftresume {name} --takeover --launcher local --no-widget -o h", timeout=60)
    assert kernel.execute("print(h.wait(timeout=60) is not None, h.status())").split()[-1] \
        == "FINISHED"
    _every_step_once(path)
    kernel.close()
    hub.stop(user)


def test_the_idle_culler_culls_a_server_whose_widget_nobody_views(hub, tmp_path):
    user, name, gate = "linus", "culled", tmp_path / "gate"
    # With its live widget, and trials that report every 0.1 s for 20 s: all through the
    # culler's wait there is news a chatty widget would send (and so keep the server busy).
    n = 200
    path, kernel, _ = _run_experiment(hub, user, name, gate, "", n=n, sleep=0.1)
    assert kernel.comm_opens >= 1  # the widget was displayed (no browser draws it)
    kernel.close()
    reported_when_closed = _reported(path)

    culler_log = tmp_path / "culler.log"
    with open(culler_log, "wb") as log:
        culler = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub_idle_culler", f"--url={hub.url}/hub/api",
             "--timeout=4", "--cull-every=1"],
            env=dict(os.environ, JUPYTERHUB_API_TOKEN=hub.culler_token), stdout=log,
            stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: hub.server(user) is None, 60, "the culler to cull the idle server")
    finally:
        culler.terminate()
        culler.wait(10)
    assert f"Culling server {user}" in culler_log.read_text()
    assert _reported(path) > reported_when_closed  # the experiment reported while idle
    assert _status(path)["status"] == "RUNNING"
    gate.touch()
    wait_for(lambda: _status(path)["status"] == "FINISHED", 120, "the experiment to finish")

    hub.start(user)
    kernel = hub.kernel(user)
    shown = kernel.execute(f"%ftattach {name} -o h")  # the widget, and its text view
    assert "FINISHED" in shown, shown
    _every_step_once(path, n)
    kernel.close()
    hub.stop(user)
