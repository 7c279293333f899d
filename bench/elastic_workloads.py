"""The elastic worker-group workload: ``ftnb.WorkerGroup`` (issue 16) losing workers during
``map`` steps, recreating them with a synchronised state, and its per-map cost against a plain
``multiprocessing`` pool. ftnb only (Ray's RLlib actor manager is not run here); the sizes and
targets are registered in :mod:`bench.workloads`.

The workers' functions live here at module level: they travel by reference, as a script's
would, and a worker imports this module (stdlib only at the top) on its first call.
"""

from __future__ import annotations

import os
import signal
import statistics
import time

__all__ = ["elastic_map", "elastic_map_ray"]

NUM_WORKERS = 4


class _Runner:
    """A worker's object: holds the state pushed into it."""

    def __init__(self) -> None:
        self.state = b""

    def set_state(self, state: bytes) -> None:
        self.state = state


def _step(runner: _Runner, victim: int, call_s: float, hang: bool = False) -> int:
    """One call: the victim SIGKILLs itself (or hangs, with ``hang``), the others work
    ``call_s`` seconds. Returns the length of the state the worker holds."""
    from ftnb.elastic import worker_index

    if worker_index() == victim:
        if hang:
            time.sleep(3600)  # the group kills it at call_timeout_s
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(call_s)
    return len(runner.state)


def _trivial(runner: object, x: int = 0) -> int:
    return x


def _pool_trivial(x: int) -> int:
    return x


def _lost_steps(group, timeout_s: float, call_s: float, kills: int, state_bytes: int,
                first_victim: int = 0, gap_s: float = 0.0) -> tuple[list[float], list[float]]:
    """``kills`` map steps in which one worker (a different one each time) SIGKILLs itself,
    each followed, ``gap_s`` later (the caller's work on the results, a sleep here), by the map
    that takes its replacement: (step times, failed map -> next map's results, gap
    included)."""
    steps, recreations = [], []
    for k in range(first_victim, first_victim + kills):
        victim = k % NUM_WORKERS
        t0 = time.perf_counter()
        results = group.map(_step, victim, call_s)
        t1 = time.perf_counter()
        failed = [r for r in results if not r.ok]
        if [(r.index, r.error["kind"]) for r in failed] != [(victim, "signal")]:
            raise RuntimeError(f"expected worker {victim} to fail with a signal: {results}")
        if gap_s:
            time.sleep(gap_s)
        results = group.map(_step, -1, 0.0)
        t2 = time.perf_counter()
        if not all(r.ok for r in results) or results[victim].value != state_bytes:
            raise RuntimeError(f"worker {victim} did not come back with the state: {results}")
        steps.append(t1 - t0)
        recreations.append(t2 - t1)
    if timeout_s and max(steps) > 10 * timeout_s:
        raise RuntimeError(f"a step took {max(steps):.1f} s with call_timeout_s={timeout_s}")
    return steps, recreations


def _hung_steps(group, timeout_s: float, call_s: float, hangs: int) -> list[float]:
    """``hangs`` map steps in which one worker hangs: each lasts call_timeout_s, then the
    worker is killed; the next map recreates it (not timed)."""
    steps = []
    for k in range(hangs):
        victim = k % NUM_WORKERS
        t0 = time.perf_counter()
        results = group.map(_step, victim, call_s, True)
        steps.append(time.perf_counter() - t0)
        if [(r.index, r.error["kind"]) for r in results if not r.ok] != [(victim, "timeout")]:
            raise RuntimeError(f"expected worker {victim} to time out: {results}")
        group.map(_step, -1, 0.0)
    return steps


def _spare_steps(group, call_s: float, kills: int, state_bytes: int) -> list[float]:
    """The recreations of ``_lost_steps`` in a group with a spare, each kill coming once the
    spare is up (a worker lost no sooner than a Ray worker's start-up after the last one)."""
    recreations = []
    for k in range(kills):
        deadline = time.monotonic() + 120
        while group.stats["workers_spare"] < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no spare came up in 120 s: {group.stats}")
            time.sleep(0.05)
        _, (recreation,) = _lost_steps(group, 0.0, call_s, 1, state_bytes, first_victim=k)
        recreations.append(recreation)
    return recreations


def _failure_figures(steps: list[float], recreations: list[float], hung: list[float],
                     timeout_s: float, after_gap: list[float], gap_s: float) -> dict:
    return {
        "death_step_s": statistics.median(steps),
        "death_step_vs_timeout": max(steps) / timeout_s,
        "hang_step_vs_timeout": max(hung) / timeout_s,
        "recreate_sync_s": statistics.median(recreations),
        "recreate_sync_max_s": max(recreations),
        "recreate_gap_s": statistics.median(after_gap),
        "recreate_gap_wait_s": statistics.median(after_gap) - gap_s,
        "recreate_gap_wait_max_s": max(after_gap) - gap_s,
    }


def _per_map_ms(maps: int, block: int) -> tuple[float, float]:
    """Median time of one map over NUM_WORKERS workers with a trivial function: a
    multiprocessing pool's ``pool.map(f, range(NUM_WORKERS))`` and a WorkerGroup's
    ``group.map(f, 0)``, timed in alternating blocks of ``block`` maps (drift hits both)."""
    import multiprocessing

    import ftnb

    pool_times: list[float] = []
    group_times: list[float] = []
    with multiprocessing.get_context("fork").Pool(NUM_WORKERS) as pool, \
            ftnb.WorkerGroup(_Runner, NUM_WORKERS) as group:
        for _ in range(max(10, block // 2)):  # warm both (imports, first pickles)
            pool.map(_pool_trivial, range(NUM_WORKERS))
            group.map(_trivial, 0)
        while len(group_times) < maps:
            for _ in range(block):
                t = time.perf_counter()
                pool.map(_pool_trivial, range(NUM_WORKERS))
                pool_times.append(time.perf_counter() - t)
            for _ in range(block):
                t = time.perf_counter()
                results = group.map(_trivial, 0)
                group_times.append(time.perf_counter() - t)
            if len(results) != NUM_WORKERS or not all(r.ok for r in results):
                raise RuntimeError(f"a trivial map failed: {results}")
    return statistics.median(pool_times) * 1e3, statistics.median(group_times) * 1e3


def elastic_map(framework: str, storage_dir: str, kills: int, hangs: int, timeout_s: float,
                call_s: float, state_mb: float, maps: int, block: int, gap_kills: int,
                gap_s: float) -> dict:
    """ftnb.WorkerGroup of 4 workers: map steps that lose a worker, its recreation with a
    synchronised state, and the cost of one map against a multiprocessing pool.

    death_step_vs_timeout: the slowest of `kills` map steps during which one worker SIGKILLs
    itself (the others work `call_s`), over call_timeout_s (`timeout_s`); target <= 1.1 (a
    dead worker never holds a step longer than the timeout; here the step ends when the
    others are done). hang_step_vs_timeout: the same for a worker that hangs, which the group
    kills at the timeout (`hangs` steps; it can only be >= 1). recreate_sync_s: the median time
    from the failed map returning to the next map's results, which recreate the worker and push
    get_state()'s `state_mb` MB of bytes into it first (target < 1 s); recreate_sync_max_s the
    slowest. recreate_gap_s: the same with `gap_s` seconds of the caller's work (a sleep) between
    the failed map and the next (`gap_kills` more kills), gap included: the replacement starts
    when the failure is seen, so the next map finds it up; recreate_gap_wait_s (target < 1 s)
    and recreate_gap_wait_max_s: what is left beyond the gap (median, slowest), the next map's
    own time. pool_map_ms / group_map_ms: the median time of one map of a trivial function over
    4 workers with multiprocessing's Pool (fork) and with the group (`maps` each, alternating
    blocks of `block`); map_overhead_ms their difference (target <= 1 ms).
    """
    import ftnb

    if framework != "ftnb":
        raise ValueError(f"elastic_map runs for ftnb only, not {framework!r}")
    state = os.urandom(int(state_mb * 2**20))
    with ftnb.WorkerGroup(_Runner, NUM_WORKERS, call_timeout_s=timeout_s,
                          get_state=lambda: state) as group:
        group.map(_step, -1, 0.0)  # warm: every worker has imported this module
        steps, recreations = _lost_steps(group, timeout_s, call_s, kills, len(state))
        hung = _hung_steps(group, timeout_s, call_s, hangs)
        _, after_gap = _lost_steps(group, timeout_s, call_s, gap_kills, len(state), gap_s=gap_s)
        restarts = group.stats["worker_restarts"]
    if restarts != kills + hangs + gap_kills:
        raise RuntimeError(f"{restarts} restarts for {kills} + {gap_kills} kills and {hangs} "
                           "hangs")
    pool_ms, group_ms = _per_map_ms(maps, block)
    return {
        **_failure_figures(steps, recreations, hung, timeout_s, after_gap, gap_s),
        "pool_map_ms": pool_ms,
        "group_map_ms": group_ms,
        "map_overhead_ms": group_ms - pool_ms,
    }


def elastic_map_ray(framework: str, storage_dir: str, kills: int, hangs: int, timeout_s: float,
                    call_s: float, state_mb: float, maps: int, gap_kills: int,
                    gap_s: float) -> dict:
    """ftnb.WorkerGroup(executor="ray") of 4 workers (Ray actors of 0.25 CPU on a local Ray
    instance): the map steps of elastic_map that lose a worker, and the recreation of its actor
    with a synchronised state.

    death_step_vs_timeout: the slowest of `kills` map steps during which one worker's actor
    process SIGKILLs itself, over call_timeout_s (`timeout_s`); target <= 1.1.
    hang_step_vs_timeout: the same for a worker that hangs, which the group kills (ray.kill) at
    the timeout. recreate_sync_s: the median time from the failed map returning to the next
    map's results, which start a new actor and push get_state()'s `state_mb` MB into it first
    (one ray.put) (target < 1 s; its floor is a Ray worker process's start, begun when the
    failed map sees the death); recreate_sync_max_s the slowest. recreate_gap_s,
    recreate_gap_wait_s (target < 1 s), recreate_gap_wait_max_s: as in elastic_map, with
    `gap_s` seconds of the caller's work between the maps, during which the replacement's actor
    starts. group_map_ms: the median time
    of one map of a trivial function over the 4 actors (`maps` of them).
    recreate_sync_spare_s / recreate_sync_spare_max_s: the same recreation in a second group
    with ``spare_workers=1`` (`kills` more, each once the spare is up): the failed slot takes
    the spare, which builds its object and takes the state, instead of a new actor.
    """
    import ftnb

    from . import frameworks

    if framework != "ftnb":
        raise ValueError(f"elastic_map_ray runs for ftnb only, not {framework!r}")
    frameworks.init("ray")
    try:
        state = os.urandom(int(state_mb * 2**20))
        with ftnb.WorkerGroup(_Runner, NUM_WORKERS, executor="ray", call_timeout_s=timeout_s,
                              resources_per_worker={"cpu": 0.25},
                              get_state=lambda: state) as group:
            group.map(_step, -1, 0.0)  # warm: every worker has imported this module
            steps, recreations = _lost_steps(group, timeout_s, call_s, kills, len(state))
            hung = _hung_steps(group, timeout_s, call_s, hangs)
            _, after_gap = _lost_steps(group, timeout_s, call_s, gap_kills, len(state),
                                       gap_s=gap_s)
            restarts = group.stats["worker_restarts"]
            for _ in range(10):
                group.map(_trivial, 0)
            map_times = []
            for _ in range(maps):
                t = time.perf_counter()
                group.map(_trivial, 0)
                map_times.append(time.perf_counter() - t)
        with ftnb.WorkerGroup(_Runner, NUM_WORKERS, executor="ray", spare_workers=1,
                              resources_per_worker={"cpu": 0.25},
                              get_state=lambda: state) as group:
            group.map(_step, -1, 0.0)
            spare = _spare_steps(group, call_s, kills, len(state))
    finally:
        frameworks.shutdown("ray")
    if restarts != kills + hangs + gap_kills:
        raise RuntimeError(f"{restarts} restarts for {kills} + {gap_kills} kills and {hangs} "
                           "hangs")
    return {**_failure_figures(steps, recreations, hung, timeout_s, after_gap, gap_s),
            "group_map_ms": statistics.median(map_times) * 1e3,
            "recreate_sync_spare_s": statistics.median(spare),
            "recreate_sync_spare_max_s": max(spare)}
