"""The notebook path end to end, in real Jupyter kernels started with jupyter_client:
%ftrun an experiment, watch its widget's comm messages, lose the kernel (shut down, or
SIGKILLed), %ftattach from a new kernel and see it complete; a killed supervisor resumed with
%ftresume from a new kernel."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import time

import pytest

from ftnb.storage.lease import read_lease
from ftnb.storage import ExperimentPaths, Storage
from procs import REPO, TESTS, pid_alive, state_trials, wait_for
from scripted import executed, result_rows

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

_START_TIMEOUT_S = 90


class Kernel:
    """A real kernel, and every iopub message it sent (widget comms included)."""

    def __init__(self, cwd: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]), PYTHONUNBUFFERED="1")
        self.km, self.kc = jupyter_client.manager.start_new_kernel(
            kernel_name="python3", startup_timeout=_START_TIMEOUT_S, cwd=cwd, env=env)
        self.messages: list[dict] = []
        self.closed = False

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 120, on_message=None) -> str:
        """Execute ``code``; return its text output (stdout, results, errors as one line).
        ``self.cell`` keeps the cell's messages; ``on_message`` sees each as it comes."""
        msg_id = self.kc.execute(code)
        out = []
        self.cell: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self._next(deadline, f"the cell {code[:60]!r}")
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            self.cell.append(msg)
            if on_message is not None:
                on_message(msg)
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                out.append(f"{content['ename']}: {content['evalue']}\n")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)

    def _next(self, deadline: float, what: str) -> dict:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out waiting for {what}")
        try:
            msg = self.kc.get_iopub_msg(timeout=min(remaining, 1.0))
        except queue.Empty:
            return self._next(deadline, what)
        self.messages.append(msg)
        return msg

    def wait_for_comm(self, predicate, timeout: float = 60) -> dict:
        """The first widget message (already seen or still to come) whose data matches."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for msg in self.messages[seen:]:
                if msg["msg_type"] in ("comm_open", "comm_msg") and predicate(
                        json.dumps(msg["content"].get("data", {}))):
                    return msg
            seen = len(self.messages)
            self._next(deadline, "a widget message")

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

    def kill(self) -> None:
        self.closed = True
        os.kill(self.pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(self.pid), timeout=30, what="the kernel to die")
        self.kc.stop_channels()
        self.km.cleanup_resources()


@pytest.fixture
def kernels(tmp_path):
    started: list[Kernel] = []

    def start() -> Kernel:
        kernel = Kernel(str(tmp_path))
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.shutdown()


def _define(tmp_path, n=6) -> str:
    return f"""
from scripted import scripted as train
import ftnb
space = {{"n": {n}, "sleep": 0.1, "ckpt_every": 1, "gate": {str(tmp_path / 'gate')!r},
          "x": ftnb.grid_search([0, 1])}}
"""


def _paths(store: str, name: str) -> ExperimentPaths:
    return ExperimentPaths.of(Storage(store), name)


def _trial_ids(paths: ExperimentPaths) -> list[str]:
    return [t["trial_id"] for t in state_trials(paths.dir)]


def _check_complete(paths: ExperimentPaths, n: int) -> None:
    for trial_id in _trial_ids(paths):
        rows = result_rows(os.path.join(paths.dir, trial_id))
        assert [r["training_iteration"] for r in rows] == list(range(1, n + 1)), trial_id


@pytest.mark.parametrize("how", ["shutdown", "sigkill"])
def test_ftrun_survives_the_kernel_and_ftattach_sees_it_complete(tmp_path, kernels, how):
    store = str(tmp_path / "store")
    first = kernels()
    assert first.run("%load_ext ftnb") == ""
    first.run(_define(tmp_path))
    out = first.run(f"%ftrun train --param-space space --name k1 --storage {store} -o h")
    assert "runs in the background" in out, out
    paths = _paths(store, "k1")
    supervisor_pid = read_lease(paths).pid
    assert supervisor_pid != first.pid
    ids = _trial_ids(paths)
    # The live widget: comm messages carry the trials' states as they change.
    first.wait_for_comm(lambda data: "jupyter.widget" in data or "_view_name" in data)
    first.wait_for_comm(lambda data: any(i in data for i in ids) and "RUNNING" in data)
    assert first.run("print(h.status())").strip() == "RUNNING"
    wait_for(lambda: all(len(executed(os.path.join(paths.dir, i))) >= 2 for i in ids),
             timeout=60, what="two steps of each trial")

    first.shutdown() if how == "shutdown" else first.kill()
    assert pid_alive(supervisor_pid), "the experiment must outlive its kernel"

    second = kernels()
    second.run("%load_ext ftnb")
    out = second.run(f"%ftattach k1 --storage {store} -o h2")
    assert "Error" not in out, out
    second.wait_for_comm(lambda data: any(i in data for i in ids) and "RUNNING" in data)
    (tmp_path / "gate").write_text("open")
    out = second.run("r = h2.wait(timeout=90); print(h2.status(), len(r), len(r.errors))")
    assert out.split() == ["FINISHED", "2", "0"], out
    second.wait_for_comm(lambda data: "FINISHED" in data)
    _check_complete(paths, 6)
    # One run: nothing started twice while the kernels came and went.
    with open(paths.state) as f:
        assert all(len(t["attempts"]) == 1 for t in json.load(f)["trials"])


def test_a_killed_supervisor_is_resumed_with_ftresume_from_a_new_kernel(tmp_path, kernels):
    store = str(tmp_path / "store")
    first = kernels()
    first.run("%load_ext ftnb")
    first.run(_define(tmp_path, n=8))
    first.run(f"%ftrun train -p space --name k2 --storage {store} --no-widget")
    paths = _paths(store, "k2")
    ids = _trial_ids(paths)
    wait_for(lambda: all(len(executed(os.path.join(paths.dir, i))) >= 3 for i in ids),
             timeout=60, what="three steps of each trial")
    os.kill(read_lease(paths).pid, signal.SIGKILL)
    out = first.run(f"h = ftnb.attach('k2', storage_path={store!r}); print(h.status())")
    wait_for(lambda: first.run("print(h.status())").strip() == "INTERRUPTED", timeout=30,
             what="INTERRUPTED")
    first.shutdown()

    second = kernels()
    second.run("%load_ext ftnb")
    out = second.run(f"%ftattach k2 --storage {store}")
    second.wait_for_comm(lambda data: "INTERRUPTED" in data)
    second.wait_for_comm(lambda data: "%ftresume" in data)  # the line that resumes it
    # The trainable and space come from this kernel's namespace, under the names %ftrun used.
    second.run(_define(tmp_path, n=8))
    (tmp_path / "gate").write_text("open")
    out = second.run(f"%ftresume k2 --storage {store} --wait --no-widget -o h")
    assert "resuming experiment 'k2'" in out, out
    assert second.run("print(h.status())").strip() == "FINISHED"
    _check_complete(paths, 8)


def test_bad_input_is_one_line_in_the_cell(tmp_path, kernels):
    kernel = kernels()
    kernel.run("%load_ext ftnb")
    out = kernel.run(f"%ftrun nosuchfn --name x --storage {tmp_path}")
    assert "nosuchfn" in out and "Traceback" not in out and len(out.strip().splitlines()) == 1
    out = kernel.run(f"%ftattach nope --storage {tmp_path}")
    assert "No ftnb experiment" in out and len(out.strip().splitlines()) == 1
    out = kernel.run("%ftrun --bogus-option")
    assert "bogus" in out and len(out.strip().splitlines()) == 1


def test_cell_magic_defines_and_runs_an_experiment(tmp_path, kernels):
    """%%ftrun: the cell body defines the trainable and the space; ipykernel runs it."""
    store = str(tmp_path / "store")
    kernel = kernels()
    kernel.run("%load_ext ftnb")
    out = kernel.run(f"""%%ftrun --name cell --storage {store} --wait --no-widget -o h
import ftnb
from scripted import scripted
def train(config):
    scripted(config)
param_space = {{"n": 3, "x": ftnb.grid_search([0, 1, 2])}}
""")
    assert "Error" not in out, out
    assert kernel.run("print(h.status(), len(h.results()))").split() == ["FINISHED", "3"]
    _check_complete(_paths(store, "cell"), 3)


def _of_kind(messages: list[dict], kind: str) -> list[dict]:
    return [m["content"] for m in messages if m["msg_type"] == kind]


def test_ftls_and_ftattach_find_what_ftrun_storage_launched(tmp_path, kernels):
    """A name that is not under the default storage is looked for under the storages this
    kernel used (the last one first); %ftls lists them all."""
    default, store = str(tmp_path / "default"), str(tmp_path / "store")
    os.makedirs(default)
    kernel = kernels()
    kernel.run("%load_ext ftnb")
    kernel.run(f"%config FtnbMagics.storage_path = {default!r}")
    kernel.run(_define(tmp_path, n=2))
    (tmp_path / "gate").write_text("open")
    out = kernel.run(f"%ftrun train -p space --name elsewhere --storage {store} --wait "
                     "--no-widget -q -o h")
    assert "elsewhere FINISHED" in out, out

    out = kernel.run("%ftls")
    assert f"Under {default} (the default storage):" in out, out
    assert f"No experiments under {default}" in out
    assert f"Under {store} (used in this kernel):" in out
    assert out.index("elsewhere") > out.index(f"Under {store}") and "FINISHED" in out

    out = kernel.run("%ftattach elsewhere --no-widget -o again\nprint(again.path)")
    assert out.strip() == os.path.join(store, "elsewhere"), out
    out = kernel.run("%ftstop elsewhere")  # the other magics resolve names the same way
    assert "is not running (FINISHED); nothing to stop" in out, out

    out = kernel.run("%ftattach nope")
    assert out.strip() == (
        f"UsageError: No ftnb experiment named 'nope' under {default} (the default storage) "
        f"nor under {store} (used in this kernel). Fix: check the name (`%ftls` lists them "
        "all), or give its storage: --storage PATH"), out


def test_ftrun_shows_one_thing_and_the_handle_tells_when_its_status_was_read(tmp_path,
                                                                            kernels):
    """With the widget (or -o) the cell has no result; without either its result is the
    handle, whose text says when its status was read."""
    store = str(tmp_path / "store")
    kernel = kernels()
    kernel.run("%load_ext ftnb")
    kernel.run(_define(tmp_path, n=3))
    kernel.run(f"%ftrun train -p space --name one --storage {store} -q")
    assert _of_kind(kernel.cell, "execute_result") == []
    widgets = [d for d in _of_kind(kernel.cell, "display_data")
               if "application/vnd.jupyter.widget-view+json" in d["data"]]
    assert len(widgets) == 1, kernel.cell
    kernel.run(f"%ftattach one --storage {store} -o h")
    assert _of_kind(kernel.cell, "execute_result") == []
    # The magic's value is the handle all the same, and shows as usual in a later cell.
    kernel.run(f"h2 = %ftattach one --storage {store}")
    assert _of_kind(kernel.cell, "execute_result") == []
    kernel.run("h2")
    [result] = _of_kind(kernel.cell, "execute_result")
    assert result["data"]["text/plain"].startswith("ExperimentHandle('one', "), kernel.cell
    kernel.run(f"%ftattach one --storage {store} --no-widget -o h")
    assert _of_kind(kernel.cell, "execute_result") == [] and _of_kind(kernel.cell,
                                                                       "display_data") == []
    out = kernel.run(f"%ftattach one --storage {store} --no-widget")
    [result] = _of_kind(kernel.cell, "execute_result")
    assert re.fullmatch(rf"ExperimentHandle\('one', RUNNING as of \d\d:\d\d:\d\d, "
                        rf"{re.escape(repr(os.path.join(store, 'one')))}\)",
                        result["data"]["text/plain"]), out
    (tmp_path / "gate").write_text("open")
    kernel.run("h.wait(timeout=90)")
    out = kernel.run("h")
    assert out.strip() == f"ExperimentHandle('one', FINISHED, {os.path.join(store, 'one')!r})"


def test_wait_brings_the_widgets_plain_text_up_to_date(tmp_path, kernels):
    """%ftrun --wait: the widget's text/plain (front ends without widgets, saved notebooks)
    is the experiment as it ended, not as it started."""
    store = str(tmp_path / "store")
    kernel = kernels()
    kernel.run("%load_ext ftnb")
    kernel.run(_define(tmp_path, n=3))

    def open_the_gate_once_shown(msg):
        if msg["msg_type"] == "display_data":  # the widget, while the trials wait on the gate
            (tmp_path / "gate").write_text("open")

    out = kernel.run(f"%ftrun train -p space --name waited --storage {store} --wait -q",
                     on_message=open_the_gate_once_shown)
    assert "waited FINISHED" in out, out
    [shown] = [d for d in _of_kind(kernel.cell, "display_data")
               if "application/vnd.jupyter.widget-view+json" in d["data"]]
    display_id = shown["transient"]["display_id"]
    assert "Experiment waited: RUNNING" in shown["data"]["text/plain"]
    updates = [d for d in _of_kind(kernel.cell, "update_display_data")
               if d["transient"]["display_id"] == display_id]
    assert updates, kernel.cell
    text = updates[-1]["data"]["text/plain"]
    assert text.startswith("Experiment waited: FINISHED | 2 TERMINATED | 0 failures"), text
    assert (updates[-1]["data"]["application/vnd.jupyter.widget-view+json"]
            == shown["data"]["application/vnd.jupyter.widget-view+json"])


def test_a_saved_notebook_keeps_the_end_of_a_waited_run(tmp_path, monkeypatch):
    """What nbconvert/nbclient store for a %ftrun --wait cell: the widget's text as it ended."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    store = str(tmp_path / "store")
    (tmp_path / "gate").write_text("open")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext ftnb\n" + _define(tmp_path, n=3)),
        nbformat.v4.new_code_cell(f"%ftrun train -p space --name saved --storage {store} "
                                  "--wait -q"),
    ])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, TESTS]))  # the kernel's too
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", store_widget_state=False,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = [o["data"]["text/plain"] for o in nb.cells[1].outputs
             if o["output_type"] == "display_data"
             and "application/vnd.jupyter.widget-view+json" in o["data"]]
    # Under it, what to run where the widget is gone (a restart): %ftattach NAME.
    hints = [o["data"]["text/html"] for o in nb.cells[1].outputs
             if o["output_type"] == "display_data" and "text/html" in o["data"]]
    assert len(hints) == 1 and "%ftattach saved" in hints[0], nb.cells[1].outputs
    assert len(texts) == 1, nb.cells[1].outputs
    assert texts[0].startswith("Experiment saved: FINISHED | 2 TERMINATED"), texts[0]
