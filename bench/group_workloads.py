"""The rank-group workloads: data-parallel training over 2 ranks on CPUs (gloo), run by
``ftnb.TorchTrainer``, Ray Train's ``TorchTrainer`` (framework ``"ray"``) and ``torchrun``.

Each job is a driver script of its own (:mod:`bench._group_driver`, a user's training script)
started in a new session, with a marker in its environment that everything it starts inherits;
the workload watches the events the ranks log (:mod:`bench.group_loop`), kills ranks with
SIGKILL from outside, and afterwards kills whatever of the job still runs, found by that marker
(:func:`bench.procs.marked_processes`), wherever it was re-parented to. Sizes and targets are
registered in :mod:`bench.workloads`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable, Optional

from .procs import RUN_MARKER_VAR, kill_processes, marked_processes, start_ticks, subprocess_env
from .trainables import read_events

__all__ = ["GroupJob", "ddp_steps", "group_recovery", "group_start"]

#: The model and batch every rank-group workload trains: a 3-layer MLP of width 128 (about
#: 50,000 parameters, a 0.4 MB checkpoint with the optimizer's momentum), a batch of 64.
MODEL = {"width": 128, "depth": 3, "batch": 64}
NUM_WORKERS = 2
#: How long a job may take to start, and to end once asked to.
_START_TIMEOUT_S = 180.0
_FINISH_TIMEOUT_S = 180.0
#: How long the processes of a job that ended by itself get to go away before they count as
#: left behind.
_LEFTOVER_GRACE_S = 5.0


class GroupJob:
    """One data-parallel job: its driver script in a new session, its events, its end.

    ``with GroupJob(...) as job:`` starts it; leaving the block kills every process of the job
    still running (the driver's session, then every process carrying the job's marker).
    ``leftovers`` is how many of them were still running ``_LEFTOVER_GRACE_S`` after the driver
    exited by itself (0 when the framework cleaned up after itself; None if it did not exit).
    """

    def __init__(self, framework: str, storage_dir: str, name: str, config: dict,
                 max_failures: int = 0, num_workers: int = NUM_WORKERS, fits: int = 1) -> None:
        self.framework = framework
        self.out_dir = config["out_dir"]
        self.marker = uuid.uuid4().hex
        # Short and under /tmp: Ray puts its Unix sockets in here (a path of at most 107 bytes).
        self.temp_root = tempfile.mkdtemp(prefix="rg-", dir="/tmp")
        self.log_path = os.path.join(storage_dir, f"{name}-driver.log")
        self.spec = {
            "framework": framework, "storage_dir": storage_dir, "name": name,
            "num_workers": num_workers, "max_failures": max_failures,
            "temp_root": self.temp_root, "config": config, "fits": fits,
        }
        self.proc: Optional[subprocess.Popen] = None
        self.leftovers: Optional[int] = None

    def __enter__(self) -> "GroupJob":
        env = {**subprocess_env(), RUN_MARKER_VAR: self.marker}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench._group_driver", json.dumps(self.spec)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil

        assert self.proc is not None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        kill_processes(marked_processes(self.marker))
        deadline = time.monotonic() + 10
        while marked_processes(self.marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        still = marked_processes(self.marker)
        shutil.rmtree(self.temp_root, ignore_errors=True)
        if still and exc[0] is None:
            raise RuntimeError(f"{self.framework}: processes of the job survived SIGKILL: {still}")

    def events(self) -> list[dict]:
        return read_events(self.out_dir)

    def log_tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:]

    def wait_for(self, found: Callable[[list[dict]], Optional[dict]], timeout_s: float,
                 what: str) -> Optional[dict]:
        """Poll the events until ``found(events)`` returns something (returned), ``timeout_s``
        passes (None), or the driver exits (an error)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = found(self.events())
            if result is not None:
                return result
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.framework}: the job ended (exit {self.proc.returncode})"
                                   f" while waiting for {what}:\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def finish(self, timeout_s: float = _FINISH_TIMEOUT_S) -> None:
        """Wait for the driver to exit; raise with its output unless it succeeded. Then count
        the job's processes still running after a grace period (``leftovers``)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self.framework}: the job did not end within {timeout_s:.0f} s:"
                               f"\n{self.log_tail()}") from None
        if code != 0:
            raise RuntimeError(f"{self.framework}: the job failed (exit {code}):\n"
                               f"{self.log_tail()}")
        deadline = time.monotonic() + _LEFTOVER_GRACE_S
        while marked_processes(self.marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.leftovers = len(marked_processes(self.marker))


def _loop_config(framework: str, out_dir: str, **loop: object) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    return {"framework": framework, "out_dir": out_dir, "i": 0, **MODEL, **loop}


def _first_steps_after(t: float, world: int) -> Callable[[list[dict]], Optional[dict]]:
    """A ``GroupJob.wait_for`` condition: every rank has logged ``first_step`` after time
    ``t``, i.e. a rank process started after ``t`` finished its first step. Returns
    ``{rank: that event}``."""

    def found(events: list[dict]) -> Optional[dict]:
        firsts: dict = {}
        for e in events:
            if e["event"] == "first_step" and e["t"] > t:
                firsts.setdefault(e["rank"], e)
        return firsts if len(firsts) == world else None

    return found


def _starts_after(events: list[dict], t: float) -> dict:
    """``{rank: its first start event after t}``."""
    starts: dict = {}
    for e in events:
        if e["event"] == "start" and e["t"] > t:
            starts.setdefault(e["rank"], e)
    return starts


def _entered(events: list[dict], firsts: dict, t: float) -> float:
    """When the last of the processes that logged ``firsts`` entered the loop (after ``t``)."""
    pids = {e["pid"] for e in firsts.values()}
    return max(e["t"] for e in events if e["event"] == "entry" and e["pid"] in pids
               and e["t"] > t)


def _current_pid(events: list[dict], rank: int) -> tuple[int, int]:
    """The (pid, start ticks) of the running process of ``rank``, from its latest ``start``."""
    pid = max((e for e in events if e["event"] == "start" and e["rank"] == rank),
              key=lambda e: e["t"])["pid"]
    ticks = start_ticks(pid)
    if ticks is None:
        raise RuntimeError(f"rank {rank}'s process {pid} is not running")
    return pid, ticks


def group_recovery(framework: str, storage_dir: str, kills: int, step_s: float,
                   settle_s: float, deadline_s: float, kill_rank: str = "alternate") -> dict:
    """SIGKILL one rank of a 2-rank DDP job `kills` times; each time, the time until every rank
    of the re-formed group is past its first step from the checkpoint.

    The loop takes a checkpoint (rank 0) and reports on every rank at every step (`step_s` of
    sleep stand for the rest of the step); FailureConfig(max_failures=-1), torchrun
    --max-restarts 1000. `settle_s` (plus a random part of a step) after the group is back, the
    next rank is killed: rank 1, 0, 1, ... (`kill_rank="alternate"`) or always the one given.
    recovery_s: the median over the kills of (the last rank's first step from the checkpoint
    done) - (the kill); recovery_max_s the worst; recovery_kill_rank0_s / _rank1_s the medians
    by the rank killed; recovery_to_entry_s the median until the last rank's loop began
    (its first line; the process group is ready by then): the framework's own part, before the
    loop's imports, model, optimizer, checkpoint load and first step. failed_reformations:
    kills after which the group was not back within `deadline_s`. stale_resumes: re-formed
    groups that resumed from an older checkpoint than the newest one whose report() had
    returned on rank 0 before the kill. leftover_processes: the job's
    processes still running 5 s after its driver exited.
    """
    out_dir = os.path.join(storage_dir, "out")
    config = _loop_config(framework, out_dir, steps=10**9, step_s=step_s, report_every=1,
                          checkpoint_every=1, stop_file=os.path.join(out_dir, "stop"),
                          log_checkpoints=True)
    rng = random.Random(0)
    recoveries: list[float] = []
    to_entry: list[float] = []
    by_rank: dict[int, list[float]] = {r: [] for r in range(NUM_WORKERS)}
    failed = stale = 0
    with GroupJob(framework, storage_dir, "group", config, max_failures=-1) as job:
        if job.wait_for(_first_steps_after(0.0, NUM_WORKERS), _START_TIMEOUT_S,
                        "the first steps") is None:
            raise RuntimeError(f"{framework}: no first step within {_START_TIMEOUT_S:.0f} s:\n"
                               f"{job.log_tail()}")
        for k in range(kills):
            time.sleep(settle_s + rng.uniform(0, max(step_s, 0.01)))
            rank = (1 - k % 2) if kill_rank == "alternate" else int(kill_rank)
            victim = _current_pid(job.events(), rank)
            t_kill = time.time()
            kill_processes([victim])
            back = _first_steps_after(t_kill, NUM_WORKERS)
            firsts = job.wait_for(back, deadline_s, f"the group back after kill {k + 1}")
            if firsts is None:
                failed += 1
                firsts = job.wait_for(back, deadline_s, f"the group back after kill {k + 1}")
                if firsts is None:  # it is not coming back: the remaining kills fail too
                    failed += kills - k - 1
                    break
            recovery = max(e["t"] for e in firsts.values()) - t_kill
            recoveries.append(recovery)
            by_rank[rank].append(recovery)
            events = job.events()
            to_entry.append(_entered(events, firsts, t_kill) - t_kill)
            acked = max((e["step"] for e in events
                         if e["event"] == "checkpointed" and e["t"] < t_kill), default=-1)
            resumed = min(e["resumed_from"] for e in _starts_after(events, t_kill).values())
            stale += resumed < acked + 1
        with open(config["stop_file"], "w"):
            pass
        job.finish()
    figures = {
        "recovery_s": statistics.median(recoveries) if recoveries else float("inf"),
        "recovery_max_s": max(recoveries, default=float("inf")),
        "recovery_to_entry_s": statistics.median(to_entry) if to_entry else float("inf"),
    }
    for rank, values in by_rank.items():
        if values:
            figures[f"recovery_kill_rank{rank}_s"] = statistics.median(values)
    figures.update({"failed_reformations": failed, "stale_resumes": stale,
                    "leftover_processes": job.leftovers})
    return figures


def group_start(framework: str, storage_dir: str, runs: int, steps: int) -> dict:
    """A new 2-rank DDP job: from fit() (torchrun: its launch) to every rank's first step.

    `runs` training scripts one after the other (medians), each running two jobs of `steps`
    steps (a report and a checkpoint at every step) one after the other. The clock starts when
    the script calls ``TorchTrainer(...).fit()`` (torch and the framework imported, Ray's
    ``ray.init()`` done) or starts ``python -m torch.distributed.run``. group_start_s: the
    first job's, until the last rank's first step (and its report) is done; ranks_entered_s:
    until the last rank's loop began (its first line; its process group is ready);
    group_start_warm_s: the second job's group_start_s (what a notebook's next fit() takes:
    ftnb's fork server and Ray's instance are running by then; torchrun starts from scratch
    every time).
    """
    cold, entered, warm = [], [], []
    for run in range(runs):
        out_dir = os.path.join(storage_dir, f"out-{run}")
        config = _loop_config(framework, out_dir, steps=steps, report_every=1,
                              checkpoint_every=1)
        with GroupJob(framework, storage_dir, f"start-{run}", config, fits=2) as job:
            job.finish()
        for fit in (0, 1):
            events = [e for e in job.events() if e["i"] == fit]
            t_fit = next(e["t"] for e in events if e["event"] == "fit")
            firsts = _first_steps_after(t_fit, NUM_WORKERS)(events)
            if firsts is None:
                raise RuntimeError(f"{framework}: not every rank logged its first step: {events}")
            (warm if fit else cold).append(max(e["t"] for e in firsts.values()) - t_fit)
            if not fit:
                entered.append(_entered(events, firsts, t_fit) - t_fit)
    return {
        "group_start_s": statistics.median(cold),
        "ranks_entered_s": statistics.median(entered),
        "group_start_warm_s": statistics.median(warm),
    }


def ddp_steps(framework: str, storage_dir: str, steps: int, timed_from: int,
              report_every: int) -> dict:
    """Steps/s of a 2-rank DDP job without failures: `steps` steps, a report (metrics only) on
    every rank every `report_every` steps, timed inside the loop from step `timed_from` on.

    steps_per_s: `report_every` steps over the median time of a window of that many steps
    and its one report (the slower rank's): robust to a burst of load from elsewhere on the
    machine; overall_steps_per_s: all the timed steps over the slower rank's time.
    report_p50_ms: the median time of one report() call (the slower rank's): ftnb and Ray
    Train persist the metrics and answer every rank, a torchrun script's rank 0 appends a line
    to a file.
    """
    out_dir = os.path.join(storage_dir, "out")
    config = _loop_config(framework, out_dir, steps=steps, report_every=report_every,
                          checkpoint_every=0, timed_from=timed_from)
    with GroupJob(framework, storage_dir, "steps", config) as job:
        job.finish()
    timings = [e for e in job.events() if e["event"] == "timing"]
    if len(timings) != NUM_WORKERS:
        raise RuntimeError(f"{framework}: {len(timings)} ranks timed their steps, not "
                           f"{NUM_WORKERS}")
    return {
        "steps_per_s": min(report_every / statistics.median(e["windows_s"]) for e in timings),
        "overall_steps_per_s": min(e["timed_steps"] / e["elapsed_s"] for e in timings),
        "report_p50_ms": max(e["report_p50_s"] for e in timings) * 1e3,
    }
