"""The live widget's cost in a real Jupyter kernel: the ``widget_updater`` workload.

A writer process plays a big experiment (``trials`` trials of ``reports`` reports each, most of
them finished, ``running`` of them appending rows at ``rows_per_s`` each, starting and finishing
trials, saving the state once a second as the controller does, holding a real owner lease),
while a real IPython kernel started with jupyter_client shows :class:`ExperimentWidget` on it
and its updater polls twice a second. The figures: the kernel process's CPU over a window
(``kernel_cpu_pct``, % of one core; the target is under 5) and the same kernel's CPU before the
widget existed (``idle_kernel_cpu_pct``), how many updates it showed per second, what it sent to
the front end (``comm_kb_per_s``), how long building the widget took in the kernel
(``widget_build_s``), and what a monitor poll costs in this process on a still copy
(``poll_first_s``: the first, complete read; ``poll_idle_ms``: nothing changed;
``poll_changed_ms``: ``running`` trials appended a row).

No browser is attached: this client sends what a browser's view of the chart sends (it opens,
it closes), so the figures are those of a viewed widget; what a browser does with them is not
part of the figure.

The writer runs as ``python -m bench.widget_load writer SPEC_JSON``; ftnb-only (Ray Tune has no
such widget).
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import time
from typing import Any, Optional

from .procs import subprocess_env

__all__ = ["FULL", "QUICK", "TARGET_CPU_PCT", "WidgetKernel", "chart_comm_id", "display_bytes",
           "message_bytes", "widget_first_paint", "widget_updater", "write_experiment"]

# Registered in bench/workloads.py with these sizes and target.
FULL = {"trials": 500, "reports": 100, "running": 16, "rows_per_s": 4.0, "window_s": 20.0,
        "idle_s": 5.0}
QUICK = {"trials": 20, "reports": 10, "running": 4, "rows_per_s": 4.0, "window_s": 3.0,
         "idle_s": 1.0}
TARGET_CPU_PCT = 5.0  # of one core, at 2 updates/s

METRICS = ("loss", "accuracy", "lr_now")


def _row(trial_index: int, step: int, trial_id: str, attempt: int = 1) -> dict:
    now = time.time()
    return {
        "loss": 1.0 / step + trial_index * 1e-4,
        "accuracy": 1.0 - 1.0 / (step + 1),
        "lr_now": 0.1 * 0.99 ** step,
        "training_iteration": step,
        "trial_id": trial_id,
        "time_this_iter_s": 0.25,
        "time_total_s": 0.25 * step,
        "timestamp": now,
        "attempt": attempt,
    }


def _line(row: dict) -> bytes:
    return (json.dumps(row) + "\n").encode("utf-8")


def write_experiment(root: str, name: str, trials: int, reports: int, *,
                     finished: Optional[int] = None, partial: Optional[list[int]] = None,
                     status: str = "FINISHED") -> Any:
    """Lay out a synthetic experiment: ``finished`` trials (default all) TERMINATED with
    ``reports`` rows, then one RUNNING trial per entry of ``partial`` (its rows so far), the
    rest PENDING. Returns ``(paths, state)``; nothing holds its lease."""
    from ftnb.core.records import AttemptRecord, ExperimentState, TrialRecord
    from ftnb.storage import ExperimentPaths, Storage

    finished = trials if finished is None else finished
    partial = list(partial or [])
    paths = ExperimentPaths.of(Storage(root), name)
    os.makedirs(paths.dir, exist_ok=True)
    state = ExperimentState(name=name, trainable="train", status=status, settings={
        "metric": "loss", "mode": "min", "varying_keys": ["lr", "layers"]})
    now = time.time()
    for i in range(trials):
        trial_id = f"synth_{i:05d}"
        trial = TrialRecord(trial_id=trial_id, dir_name=f"train_{trial_id}",
                            config={"lr": round(0.001 * (1 + i % 50), 4), "layers": 2 + i % 3})
        trial_paths = paths.trial(trial.dir_name)
        os.makedirs(trial_paths.dir, exist_ok=True)
        if i < finished:
            steps, trial.status = reports, "TERMINATED"
        elif i - finished < len(partial):
            steps, trial.status = partial[i - finished], "RUNNING"
        else:
            steps = 0
        if trial.status != "PENDING":
            trial.attempts = [AttemptRecord(number=1, started=now)]
            if trial.status == "TERMINATED":
                trial.attempts[0].outcome, trial.attempts[0].ended = "finished", now
        rows = [_row(i, k, trial_id) for k in range(1, steps + 1)]
        with open(trial_paths.results, "wb") as f:
            f.write(b"".join(_line(r) for r in rows))
        trial.iteration, trial.last_result = steps, (rows[-1] if rows else None)
        trial.seq = 1
        paths.storage.write_atomic(trial_paths.record, json.dumps(trial.to_json()), durable=False)
        state.trials.append(trial)
    state.save(paths)
    return paths, state


class _Player:
    """The writer process: runs ``running`` trials at a time like a controller would."""

    def __init__(self, spec: dict) -> None:
        from ftnb.storage.lease import Lease
        from ftnb.storage import ExperimentPaths, Storage

        self.spec = spec
        self.reports = spec["reports"]
        trials, running = spec["trials"], spec["running"]
        rng = random.Random(0)
        partial = [rng.randrange(1, self.reports) for _ in range(running)]
        paths = ExperimentPaths.of(Storage(spec["root"]), spec["name"])
        self.lease = Lease.acquire(paths, what="run")
        self.lease.start_heartbeat()
        # Most trials done; a window of them running; a few to start during the measurement.
        self.paths, self.state = write_experiment(
            spec["root"], spec["name"], trials, self.reports,
            finished=max(0, trials - 2 * running), partial=partial, status="RUNNING")
        self.fds: dict[str, int] = {}

    def _persist(self, trial: Any) -> None:
        trial.seq += 1
        self.paths.storage.write_atomic(self.paths.trial(trial.dir_name).record,
                                        json.dumps(trial.to_json()), durable=False)

    def _append(self, index: int, trial: Any) -> None:
        fd = self.fds.get(trial.trial_id)
        if fd is None:
            fd = self.fds[trial.trial_id] = os.open(
                self.paths.trial(trial.dir_name).results, os.O_WRONLY | os.O_APPEND)
        row = _row(index, trial.iteration + 1, trial.trial_id)
        os.write(fd, _line(row))  # one write per row, as ftnb's ResultLog does
        trial.iteration, trial.last_result = row["training_iteration"], row

    def run(self) -> None:
        from ftnb.core.records import AttemptRecord

        interval = 1.0 / self.spec["rows_per_s"]
        deadline = time.time() + self.spec["duration_s"]
        last_save = time.time()
        with open(os.path.join(self.paths.dir, "writer.ready"), "w") as f:
            f.write("ready\n")
        while time.time() < deadline:
            tick = time.time()
            running = [(i, t) for i, t in enumerate(self.state.trials) if t.status == "RUNNING"]
            for index, trial in running:
                self._append(index, trial)
                if trial.iteration >= self.reports:
                    trial.status = "TERMINATED"
                    trial.attempts[-1].outcome, trial.attempts[-1].ended = "finished", time.time()
                    self._persist(trial)
            pending = [t for t in self.state.trials if t.status == "PENDING"]
            for trial in pending[: self.spec["running"] - len(
                    [t for t in self.state.trials if t.status == "RUNNING"])]:
                trial.status = "RUNNING"
                trial.attempts.append(AttemptRecord(number=1, started=time.time()))
                self._persist(trial)
            if time.time() - last_save >= 1.0:
                self.state.save(self.paths)
                last_save = time.time()
            time.sleep(max(0.0, interval - (time.time() - tick)))
        self.state.status = "INTERRUPTED"
        self.state.save(self.paths, final=True)
        self.lease.release()


def _writer_main(spec_json: str) -> int:
    _Player(json.loads(spec_json)).run()
    return 0


# -- the kernel side ------------------------------------------------------------------------------
def _cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WidgetKernel:
    """A real IPython kernel (jupyter_client), the messages it publishes, and a front end's
    side of its widgets: :meth:`open_view` reports a view of a chart as a browser's does."""

    def __init__(self, env: Optional[dict] = None, cwd: Optional[str] = None) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", env=env or subprocess_env(),
                                            cwd=cwd)
        self.cell: list[dict] = []  # the last cell's messages
        self.pid = int(self.run("import os; print(os.getpid())").strip())

    def run(self, code: str, timeout: float = 300.0) -> str:
        """Execute ``code``; its stdout. Raises with the traceback if it failed."""
        msg_id = self.kc.execute(code)
        out, error = [], None
        self.cell = []
        deadline = time.time() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.time()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            self.cell.append(msg)
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                error = "\n".join(msg["content"]["traceback"])
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        if error:
            raise RuntimeError(f"kernel code failed:\n{code}\n{error}")
        return "".join(out)

    def drain(self, seconds: float) -> tuple[int, int]:
        """Read what the kernel publishes for ``seconds``: (comm messages, their bytes)."""
        messages = self.comm_messages(seconds)
        return len(messages), sum(message_bytes(m) for m in messages)

    def comm_messages(self, seconds: float, until: Any = None) -> list[dict]:
        """The comm messages the kernel publishes within ``seconds`` (or until one satisfies
        ``until``)."""
        out: list[dict] = []
        deadline = time.time() + seconds
        while True:
            left = deadline - time.time()
            if left <= 0:
                return out
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                return out
            if msg["msg_type"] in ("comm_msg", "comm_open"):
                out.append(msg)
                if until is not None and until(msg):
                    return out

    def send_comm(self, comm_id: str, data: dict) -> None:
        """A front end's comm message to the widget ``comm_id`` (queued while a cell runs)."""
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data})
        self.kc.shell_channel.send(msg)

    def report_view(self, comm_id: str, event: str = "open", view: str = "bench-view",
                    **extra: Any) -> None:
        """What a browser's view of the chart ``comm_id`` sends when it opens (``open``), every
        30 s (``beat``) and when it goes (``close``)."""
        self.send_comm(comm_id, {"method": "custom", "content": {
            "type": "view", "view": view, "event": event, **extra}})

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def message_bytes(msg: dict) -> int:
    """A widget message's size on the wire, about: its content as JSON plus its buffers."""
    return len(json.dumps(msg["content"], default=str)) + sum(
        len(b) for b in msg.get("buffers") or [])


def display_bytes(cell: list[dict]) -> int:
    """What a cell that displayed a widget sent to show it: its widgets' comm_open messages and
    the display_data that places it."""
    return sum(message_bytes(m) for m in cell
               if m["msg_type"] in ("comm_open", "comm_msg", "display_data"))


def chart_comm_id(cell: list[dict]) -> str:
    """The comm id of the widget's chart among a cell's comm_open messages."""
    for msg in cell:
        if msg["msg_type"] == "comm_open":
            state = msg["content"]["data"].get("state", {})
            if state.get("_anywidget_id", "").endswith("TrialChart"):
                return msg["content"]["comm_id"]
    raise LookupError("no chart was opened in that cell")


def _measure_cpu(kernel: WidgetKernel, window_s: float) -> tuple[float, int, int]:
    start_cpu, start = _cpu_seconds(kernel.pid), time.time()
    count, size = kernel.drain(window_s)
    elapsed = time.time() - start
    return (_cpu_seconds(kernel.pid) - start_cpu) / elapsed * 100.0, count, size


def _poll_costs(storage_dir: str, trials: int, reports: int, running: int) -> tuple:
    """In this process, on a still copy of the experiment: the first poll (s), a poll that finds
    nothing new (ms, median of 5), and one after `running` trials appended a row (ms, median
    of 5)."""
    from ftnb.ui.monitor import ExperimentMonitor

    paths, state = write_experiment(storage_dir, "still", trials, reports)
    monitor = ExperimentMonitor(paths)
    t = time.perf_counter()
    monitor.poll()
    first = time.perf_counter() - t
    idle, changed = [], []
    for step in range(5):
        t = time.perf_counter()
        monitor.poll()
        idle.append(time.perf_counter() - t)
        for index, trial in enumerate(state.trials[:running]):
            with open(paths.trial(trial.dir_name).results, "ab") as f:
                f.write(_line(_row(index, reports + 1 + step, trial.trial_id)))
        t = time.perf_counter()
        monitor.poll()
        changed.append(time.perf_counter() - t)
    return first, 1000 * sorted(idle)[2], 1000 * sorted(changed)[2]


_BUILD = """
import time, json
from IPython.display import display
_t = time.perf_counter()
import ftnb
from ftnb.notebook.widget import ExperimentWidget
w = ExperimentWidget(ftnb.attach({path!r}))
display(w)
_build = time.perf_counter() - _t
print(json.dumps({{"build_s": _build, "updating": w.updating, "traces": len(w.chart.series),
                  "plotly": "plotly" in __import__("sys").modules}}))
"""


def widget_updater(framework: str, storage_dir: str, trials: int, reports: int, running: int,
                   rows_per_s: float, window_s: float, idle_s: float) -> dict:
    """The live widget's updater in a real kernel, on `trials` x `reports` rows while `running` trials report.

    A writer process plays the experiment (see bench/widget_load.py); a jupyter_client kernel
    shows ExperimentWidget on it. kernel_cpu_pct: the kernel's CPU (% of one core) over
    `window_s` with the widget updating (target under 5); idle_kernel_cpu_pct: the same kernel
    before the widget; updates_per_s: updates the widget showed; comm_kb_per_s: what it sent;
    widget_build_s: the first widget in a warm kernel (ftnb imported), from the cell's start to
    its display (the widget's imports, the first complete read, every trial's points);
    display_kb: what that display sent (its widgets' comm_open messages, the display_data);
    unviewed_comm_msgs: comm messages the kernel sent in the seconds after the display while no
    view reported itself (0: an unattended server is cullable); the CPU and comm figures are
    taken while one view (a browser's messages, sent by this client) looks;
    poll_first_s / poll_idle_ms / poll_changed_ms: an ExperimentMonitor poll in this process on a
    still copy: the first one / nothing changed / `running` trials appended a row.
    """
    if framework != "ftnb":
        raise ValueError("widget_updater measures ftnb's widget only")
    name = "widget_load"
    exp = os.path.join(storage_dir, name)
    spec = {"root": storage_dir, "name": name, "trials": trials, "reports": reports,
            "running": running, "rows_per_s": rows_per_s,
            "duration_s": window_s + idle_s + 600.0}
    log = open(os.path.join(storage_dir, "writer.log"), "wb")
    writer = subprocess.Popen(
        [sys.executable, "-m", "bench.widget_load", "writer", json.dumps(spec)],
        env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    kernel = None
    try:
        deadline = time.time() + 300
        while not os.path.exists(os.path.join(exp, "writer.ready")):
            if writer.poll() is not None or time.time() > deadline:
                log.flush()
                with open(log.name, "rb") as f:
                    raise RuntimeError("the writer did not start:\n" + f.read().decode()[-3000:])
            time.sleep(0.05)
        poll_first_s, poll_idle_ms, poll_changed_ms = _poll_costs(storage_dir, trials, reports,
                                                                  running)
        kernel = WidgetKernel()
        # A warm kernel: ftnb loaded (as %load_ext ftnb does); the widget's modules not yet.
        kernel.run("import ftnb, ftnb.ui.monitor, ipywidgets")
        idle_pct, _, _ = _measure_cpu(kernel, idle_s)
        built = json.loads(kernel.run(_BUILD.format(path=exp)).strip().splitlines()[-1])
        if not built["updating"]:
            raise RuntimeError("the widget's updater is not running")
        shown_bytes = display_bytes(kernel.cell)
        chart = chart_comm_id(kernel.cell)
        # No browser: the kernel sends nothing (an idle server stays cullable).
        unviewed, _ = kernel.drain(min(window_s, 3.0))
        # A view opens (what a browser's sends): caught up, then updated while it looks.
        kernel.report_view(chart, "open")
        kernel.drain(2.0)  # the catch-up and the first updates after it
        # The kernel's own clock times the stats: a busy machine delays the replies, not that.
        stats = "print(json.dumps(dict(w.stats, at=time.monotonic())))"
        before = json.loads(kernel.run(stats).strip())
        cpu_pct, count, size = _measure_cpu(kernel, window_s)
        after = json.loads(kernel.run(stats).strip())
        kernel.report_view(chart, "close")
        kernel.run("w.close()")
    finally:
        if kernel is not None:
            kernel.close()
        writer.kill()
        writer.wait(timeout=30)
        log.close()
    return {
        "kernel_cpu_pct": cpu_pct,
        "idle_kernel_cpu_pct": idle_pct,
        "updates_per_s": (after["updates"] - before["updates"]) / (after["at"] - before["at"]),
        "polls_per_s": (after["polls"] - before["polls"]) / (after["at"] - before["at"]),
        "stats_window_s": after["at"] - before["at"],
        "comm_msgs_per_s": count / window_s,
        "comm_kb_per_s": size / 1024 / window_s,
        "widget_build_s": built["build_s"],
        "display_kb": shown_bytes / 1024,
        "plotly_imported": int(built["plotly"]),
        "unviewed_comm_msgs": unviewed,
        "chart_traces": built["traces"],
        "poll_first_s": poll_first_s,
        "poll_idle_ms": poll_idle_ms,
        "poll_changed_ms": poll_changed_ms,
    }


_FIRST_PAINT_TRAINABLE = """
import ftnb, time
def reports_at_once(config):
    for step in range(1, 400):
        ftnb.report({"loss": 1.0 / step})
        time.sleep(0.05)
"""


def widget_first_paint(storage_dir: str, repetitions: int = 3) -> dict:
    """``%ftrun`` in a warm kernel (ftnb loaded, a trial process started once before) with the
    live widget, and a view of it as a browser opens one when the cell ends: seconds from the
    cell's end (``%ftrun`` returned) to the first comm message that carries the trials' points
    (``first_points_s``, median), the widget's display in that cell (``display_kb``), and
    whether plotly was imported on that path."""
    kernel = WidgetKernel(cwd=storage_dir)
    firsts, sizes = [], []
    try:
        kernel.run("%load_ext ftnb\n" + _FIRST_PAINT_TRAINABLE)
        kernel.run(f"%ftrun reports_at_once --name warmup --storage {storage_dir} --no-widget "
                   "-q -o h\nh.stop(wait=True)")
        for rep in range(repetitions):
            kernel.run(f"%ftrun reports_at_once --name paint{rep} --storage {storage_dir} -q")
            ended = time.monotonic()
            sizes.append(display_bytes(kernel.cell))
            kernel.report_view(chart_comm_id(kernel.cell), "open", view=f"paint{rep}")

            def has_points(msg: dict) -> bool:
                data = msg["content"].get("data", {})
                content = data.get("content") or {}
                if content.get("type") == "delta":
                    return any(t["y"] for t in content["trials"].values())
                return content.get("type") == "series" and any(content.get("n", ()))

            got = kernel.comm_messages(60, until=has_points)
            if not got or not has_points(got[-1]):
                raise RuntimeError("no points reached the front end within 60 s")
            firsts.append(time.monotonic() - ended)
            kernel.run(f"ftnb.attach('paint{rep}', storage_path={storage_dir!r}).stop(wait=True)")
        plotly = kernel.run("import sys; print('plotly' in sys.modules)").strip() == "True"
    finally:
        kernel.close()
    return {"first_points_s": sorted(firsts)[len(firsts) // 2], "first_points_max_s": max(firsts),
            "display_kb": max(sizes) / 1024, "plotly_imported": int(plotly)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["writer"]:
        sys.exit(_writer_main(sys.argv[2]))
    if sys.argv[1:2] == ["first_paint"]:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(widget_first_paint(folder), indent=1))
        sys.exit(0)
    sys.exit("usage: python -m bench.widget_load writer SPEC_JSON | first_paint "
             f"(got {sys.argv[1:]})")
