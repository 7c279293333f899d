"""The trainables, run inside the trial processes.

They are module-level functions, so every framework pickles them by reference and each trial
process imports this module to find them. It therefore imports only modules that a trial
process has loaded already (json, os, time): its own import cost stays out of the start-up
figures.

Every trainable gets ``config["framework"]`` (which API to call), ``config["i"]`` (its index in
the grid) and ``config["out_dir"]`` (a folder of the benchmark's own, outside the experiment).
It leaves its measurements there: ``<i>.json`` once it is done, and the append-only
``events.jsonl`` for the trainables that fail or get killed half-way (one line per event,
written with one ``write()``, so lines of concurrent trials never mix).
"""

from __future__ import annotations

import json
import os
import time

EVENTS_FILE = "events.jsonl"
STATE_FILE = "state.json"


def ray_api():
    """Ray's module with ``report``, ``get_checkpoint``, ``Checkpoint``, ``get_context``,
    ``RunConfig`` and ``FailureConfig``: ``ray.tune`` in recent releases, ``ray.train`` in those
    before Tune had its own (the benchmark was run with Ray 2.60)."""
    import ray.tune

    if hasattr(ray.tune, "report") and hasattr(ray.tune, "RunConfig"):
        return ray.tune
    import ray.train

    return ray.train


def trial_api(framework: str):
    """The module whose ``report``, ``get_checkpoint`` and ``Checkpoint`` a trainable of
    ``framework`` calls: ftnb and Ray Tune spell these the same way."""
    if framework == "ftnb":
        import ftnb

        return ftnb
    if framework == "ray":
        return ray_api()
    raise ValueError(f"unknown framework {framework!r}")


def percentile(values: list, q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def output_path(config: dict) -> str:
    """Where the trial of ``config`` leaves its measurements when it is done."""
    return os.path.join(config["out_dir"], f"{config['i']}.json")


def _write_json(path: str, data: object) -> None:
    with open(path, "w") as f:
        json.dump(data, f)


def log_event(config: dict, event: str, **fields: object) -> None:
    """Append ``{"i", "event", "t" (time.time()), "pid", **fields}`` to the events file."""
    line = {"i": config["i"], "event": event, "t": time.time(), "pid": os.getpid(), **fields}
    fd = os.open(
        os.path.join(config["out_dir"], EVENTS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def read_events(out_dir: str) -> list[dict]:
    """The events logged in ``out_dir`` so far (none when nothing was logged yet)."""
    try:
        with open(os.path.join(out_dir, EVENTS_FILE)) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def reporting_trainable(config: dict) -> None:
    """Note the wall time at entry, report ``config["reports"]`` times, and leave the entry time
    and the time the first report() returned (the result was persisted)."""
    entry = time.time()
    report = trial_api(config["framework"]).report
    first_acked = None
    for step in range(config["reports"]):
        report({"step": step, "loss": 1.0 / (step + 1)})
        if first_acked is None:
            first_acked = time.time()
    _write_json(output_path(config), {"entry": entry, "first_report_acked": first_acked})


def _rows_on_disk(exp_dir: str) -> int:
    """The rows in the ``result.json`` of the one trial in the experiment folder ``exp_dir``
    (what a restore reads: Ray Tune's copy in its session folder does not count)."""
    for folder, _, files in os.walk(exp_dir):
        if "result.json" in files:
            with open(os.path.join(folder, "result.json"), "rb") as f:
                return f.read().count(b"\n")
    return 0


def throughput_trainable(config: dict) -> None:
    """Call report() ``config["reports"]`` times with a small dict, timing every call; then
    ``config["checks"]`` more untimed calls, after each of which the trial's ``result.json`` in
    the experiment folder is read to count the acknowledged reports whose row was not there."""
    report, n = trial_api(config["framework"]).report, config["reports"]
    clock = time.perf_counter
    latencies = [0.0] * n
    start = clock()
    for i in range(n):
        t = clock()
        report({"loss": 1.0 / (i + 1), "step": i})
        latencies[i] = clock() - t
    total = clock() - start
    missing = 0
    for i in range(n, n + config["checks"]):
        report({"loss": 1.0 / (i + 1), "step": i})
        missing += _rows_on_disk(config["exp_dir"]) < i + 1
    _write_json(
        output_path(config),
        {
            "reports": n,
            "total_s": total,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "unpersisted_acks": missing,
        },
    )


def _write_fsync(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_s(path: str) -> float:
    """How long fsync() of the file at ``path`` takes: about nothing once it is on disk."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _drop_cached_pages(path: str) -> None:
    """Evict the (clean) file's pages from the page cache, so that the next write of either
    side of a pair reuses freed pages: on these VMs a first touch of never-used memory makes a
    write up to 5x slower, and whichever side happened to get such pages would lose its pair."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _newest_copy(root: str, name: str) -> str:
    """The file called ``name`` in the last ``checkpoint_NNNNNN`` folder under ``root`` (both
    frameworks name checkpoint folders so; copies keep the source's mtime, so it cannot tell)."""
    copies = [os.path.join(d, name) for d, _, files in os.walk(root) if name in files]
    return max(copies, key=lambda path: os.path.basename(os.path.dirname(path)))


def checkpoint_trainable(config: dict) -> None:
    """Report ``config["checkpoints"]`` checkpoints of one ``size_mb`` file, each followed by
    (1) an fsync() of the persisted copy, timed: about 0 s when the framework had fsynced it,
    and (2) a raw write+fsync of the same bytes into ``config["work_dir"]`` (same disk), timed,
    so that every checkpoint is compared with the disk's speed of that moment. Between the two,
    and after the raw write, the written pages leave the page cache (see _drop_cached_pages)."""
    import tempfile

    api = trial_api(config["framework"])
    data = os.urandom(int(config["size_mb"] * 1e6))
    source = tempfile.mkdtemp(prefix="src-", dir=config["work_dir"])
    _write_fsync(os.path.join(source, "model.bin"), data)
    raw = os.path.join(config["work_dir"], "raw.bin")
    pairs = []
    for k in range(config["checkpoints"]):
        t = time.perf_counter()
        api.report({"k": k}, checkpoint=api.Checkpoint.from_directory(source))
        checkpoint_s = time.perf_counter() - t
        copy = _newest_copy(config["exp_dir"], "model.bin")
        refsync_s = _fsync_s(copy)
        _drop_cached_pages(copy)
        t = time.perf_counter()
        _write_fsync(raw, data)
        raw_s = time.perf_counter() - t
        os.unlink(raw)  # its pages go back to the free pool too
        pairs.append({"checkpoint_s": checkpoint_s, "raw_s": raw_s, "refsync_s": refsync_s})
    _write_json(output_path(config), {"bytes": len(data), "pairs": pairs})


def _resume_iteration(api) -> int:
    """The iteration after the one saved in the checkpoint to resume from (1 on a fresh start)."""
    ckpt = api.get_checkpoint()
    if ckpt is None:
        return 1
    with ckpt.as_directory() as d, open(os.path.join(d, STATE_FILE)) as f:
        return json.load(f)["iteration"] + 1


def _first_failure(config: dict) -> bool:
    """True exactly once per trial: the first attempt that reaches ``fail_at`` fails there."""
    try:
        os.close(os.open(os.path.join(config["out_dir"], f"failed-{config['i']}"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def _fail(config: dict, iteration: int) -> None:
    log_event(config, "fail", iteration=iteration)
    if config["fail_mode"] == "sigkill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"benchmark failure at iteration {iteration}")


def _stale_processes(config: dict) -> int:
    """How many processes of a killed driver's experiment still run, when the ``restore``
    workload has listed them (``[[pid, start_ticks], ...]``) in ``config["stale_file"]``."""
    try:
        with open(config["stale_file"]) as f:
            listed = json.load(f)
    except (KeyError, FileNotFoundError):
        return 0
    from bench.procs import count_running

    return count_running(listed)


def checkpointing_trainable(config: dict) -> None:
    """``config["iterations"]`` iterations of ``iter_s`` seconds, each reported with a tiny
    checkpoint and then logged as an ``iteration`` event; resumes after the checkpoint it is
    given. With ``fail_at``, the first attempt to reach that iteration fails before reporting
    it, by raising or, with ``fail_mode="sigkill"``, by SIGKILL of its own process. Its
    ``start`` event counts the processes of a killed driver that still run (``stale_file``)."""
    import tempfile

    api = trial_api(config["framework"])
    first = _resume_iteration(api)
    log_event(config, "start", iteration=first, stale=_stale_processes(config))
    for iteration in range(first, config["iterations"] + 1):
        time.sleep(config["iter_s"])
        if iteration == config.get("fail_at") and _first_failure(config):
            _fail(config, iteration)
        with tempfile.TemporaryDirectory() as d:
            _write_json(os.path.join(d, STATE_FILE), {"iteration": iteration})
            api.report({"iteration": iteration}, checkpoint=api.Checkpoint.from_directory(d))
        log_event(config, "iteration", iteration=iteration)
