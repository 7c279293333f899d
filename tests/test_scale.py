"""Thousands of trials: the state's journal of trial records (format 2).

A running driver's ``experiment_state.json`` holds its running trials' records only; the others'
are lines of its journal's segments (``experiment_state.<generation>.jsonl``), written once. What must hold: a save writes what
changed, whatever the number of finished trials; a save killed at any write leaves the previous
or the new generation, whole; a driver SIGKILLed at random moments of a 2,000-trial run leaves a
directory that restores to every trial run once; every reader (restore, ResultGrid, the read
model, the monitor) sees the journal; object stores (memory://, the S3 server) too.
"""

from __future__ import annotations

import json
import os
import random
import signal

import pytest

import ftnb
from ftnb.core.records import ExperimentState, TrialRecord, TrialStatus, with_journal
from ftnb.storage import ExperimentPaths, Storage
from ftnb.storage.record_journal import SegmentGoneError
from procs import run_script, wait_for


class Crash(BaseException):
    """The process 'dies' at a write (raised instead of the write, or after half of it)."""


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request, tmp_path):
    if request.param == "local":
        return Storage(str(tmp_path / "runs"))
    if request.param == "memory":
        import uuid

        return Storage(f"memory://ftnb-scale-{uuid.uuid4().hex[:12]}/runs")
    url, fs = request.getfixturevalue("s3_storage")
    return Storage(url, fs)


def _state(n: int, name: str = "exp") -> ExperimentState:
    state = ExperimentState(name=name, trainable="train", settings={"metric": "loss"},
                            param_space={"lr": {"__ftnb_domain__": "loguniform", "lower": 1e-4,
                                                "upper": 1e-1, "base": 10}})
    state.trials = [TrialRecord(trial_id=f"t_{i:05d}", dir_name=f"t_{i:05d}", config={"i": i})
                    for i in range(n)]
    return state


def _start(state: ExperimentState, trial: TrialRecord) -> None:
    trial.status = TrialStatus.RUNNING.value
    trial.seq += 1


def _finish(state: ExperimentState, trial: TrialRecord) -> None:
    trial.status = TrialStatus.TERMINATED.value
    trial.iteration = 1
    trial.last_result = {"loss": trial.config["i"] / 10, "training_iteration": 1}
    trial.seq += 1


def _records(state: ExperimentState) -> list[dict]:
    return json.loads(json.dumps([t.to_json() for t in state.trials], default=str))


def _paths(storage: Storage) -> ExperimentPaths:
    paths = ExperimentPaths.of(storage, "exp")
    storage.makedirs(paths.dir)
    return paths


def _count_writes(storage: Storage) -> list[int]:
    """Wrap ``storage``'s writes; the list returned collects the bytes of each."""
    written: list[int] = []
    write_atomic, append = storage.write_atomic, storage.append_durably

    def counted_write(path, data, durable=True):
        written.append(len(data))
        write_atomic(path, data, durable)

    def counted_append(path, data):
        written.append(len(data))
        append(path, data)

    storage.write_atomic, storage.append_durably = counted_write, counted_append
    return written


def _run_saves(state: ExperimentState, paths: ExperimentPaths, saves: int, per_save: int,
               first: int) -> None:
    """``saves`` driver saves, each finishing ``per_save`` running trials and starting as many
    (trials from ``first`` on), as a controller's saves do."""
    next_trial = first
    running = []
    for _ in range(saves):
        changed = set()
        for trial in running:
            _finish(state, trial)
            changed.add(trial.trial_id)
        running = state.trials[next_trial: next_trial + per_save]
        next_trial += per_save
        for trial in running:
            _start(state, trial)
            changed.add(trial.trial_id)
        state.save_changes(paths, changed)


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_a_save_writes_what_changed_not_every_finished_trial(tmp_path, backend):
    """The bytes that 40 saves write (5 trials ending and 5 starting in each) are the same with
    5,000 trials, 4,750 of them finished, as with 300 (50 finished)."""
    totals = {}
    for n in (300, 5_000):
        storage = (Storage(str(tmp_path / f"runs{n}")) if backend == "local"
                   else Storage(f"memory://ftnb-scale-bytes-{os.getpid()}-{n}/runs"))
        paths = _paths(storage)
        state = _state(n)
        for trial in state.trials[: n - 250]:
            _finish(state, trial)
        state.save_changes(paths, ())  # the driver's first save: every record, once
        written = _count_writes(storage)
        _run_saves(state, paths, saves=40, per_save=5, first=n - 250)
        totals[n] = sum(written)
        assert ExperimentState.load(paths).trials == state.trials
    # Object stores merge the newest segments as they pile up: with 300 trials those merges
    # reach the first segment, with 5,000 they do not; either way no save rewrites the rest.
    assert totals[5_000] <= 1.1 * totals[300], totals
    # What a save writes: the state's header, 5 running records, 5 finished ones (twice: the
    # state and its previous generation) and the merges, far from a 5,000-record state.
    assert totals[5_000] / 40 < 30_000, totals


def test_the_state_file_holds_the_running_trials_and_the_journal_the_rest(tmp_path):
    paths = _paths(Storage(str(tmp_path / "runs")))
    state = _state(50)
    _run_saves(state, paths, saves=3, per_save=4, first=0)
    data = json.loads(paths.storage.read_bytes(paths.state))
    assert data["format_version"] == 2 and data["trial_count"] == 50
    assert sorted(t["trial_id"] for t in data["trials"]) == [f"t_{i:05d}" for i in (8, 9, 10, 11)]
    # One segment, grown by appends.
    assert [s["file"] for s in data["journal"]] == ["experiment_state.00000001.jsonl"]
    # Each journal line is a trial's record, readable with jq; the newest line of a trial wins.
    lines = paths.storage.read_bytes(
        paths.state_segment("experiment_state.00000001.jsonl")).splitlines()
    # The first save: every trial but the 4 it started; then the 8 that finished since.
    assert len(lines) == 46 + 8
    loaded = ExperimentState.load(paths)
    assert _records(loaded) == _records(state)
    # The driver's last save puts every record back in the state file, as format 1 had them,
    # and the journal goes.
    state.save(paths, final=True)
    data = json.loads(paths.storage.read_bytes(paths.state))
    assert "journal" not in data and len(data["trials"]) == 50
    assert [n for n in paths.storage.listdir(paths.dir) if n.endswith(".jsonl")] == []


def _save_steps(state: ExperimentState, step: int) -> set:
    """The changes before save number ``step`` of the crash test: trials start and finish."""
    changed = set()
    for trial in state.trials:
        if trial.status == TrialStatus.RUNNING and (int(trial.trial_id[2:]) + step) % 2:
            _finish(state, trial)
            changed.add(trial.trial_id)
    waiting = [t for t in state.trials if t.status == TrialStatus.PENDING][:3]
    for trial in waiting:
        _start(state, trial)
        changed.add(trial.trial_id)
    return changed


def test_a_save_killed_at_any_write_leaves_the_old_or_the_new_state(storage):
    """Every write of five saves (segment appends or puts, merges, the fallback, the state,
    deletions) is, in turn, the one the process dies at (an append torn half way); a new
    reader then finds the generation before that save or the one after, whole, and a new
    driver carries on from it."""
    # (On the S3 server, where each write is a request: fewer trials, and only the third save,
    # which merges segments.)
    on_server = storage.uri(storage.root).startswith("s3://")
    n, saves = (8, 3) if on_server else (16, 5)
    crashes = 0
    for crash_save in [saves - 1] if on_server else range(saves):
        for crash_at in range(1, 20):
            paths = ExperimentPaths.of(storage, f"exp-{crash_save}-{crash_at}")
            storage.makedirs(paths.dir)
            state = _state(n)
            state.save(paths)  # a new experiment's first save
            for step in range(crash_save):
                state.save_changes(paths, _save_steps(state, step))
            changed = _save_steps(state, crash_save)
            before = _records(ExperimentState.load(paths))
            if not _save_dies(state, paths, changed, crash_at):
                break  # that save has fewer writes: every one of them was tried
            crashes += 1
            again = ExperimentState.load(paths)
            assert _records(again) in (before, _records(state))
            # A new driver: its first save rewrites the journal, then saves as usual.
            again.save_changes(paths, ())
            for step in range(2):
                again.save_changes(paths, _save_steps(again, step + 10))
            assert _records(ExperimentState.load(paths)) == _records(again)
    assert crashes >= (3 if on_server else 10)


def _save_dies(state: ExperimentState, paths: ExperimentPaths, changed: set,
               crash_at: int) -> bool:
    """Save, dying at the ``crash_at``-th write or deletion; whether it died."""
    storage = paths.storage
    calls = [0]
    real = {name: getattr(storage, name) for name in ("write_atomic", "append_durably", "remove")}

    def step(name):
        def call(path, *args, **kwargs):
            calls[0] += 1
            if calls[0] == crash_at:
                if name == "append_durably":
                    real[name](path, args[0][: len(args[0]) // 2])  # a torn append
                raise Crash(name)
            return real[name](path, *args, **kwargs)
        return call

    for name in real:
        setattr(storage, name, step(name))
    try:
        state.save_changes(paths, changed)
        return False
    except Crash:
        return True
    finally:
        for name in real:
            delattr(storage, name)


def test_object_stores_keep_few_segments_and_readers_outlive_their_merges():
    storage = Storage(f"memory://ftnb-scale-merge-{os.getpid()}/runs")
    paths = _paths(storage)
    state = _state(400)
    state.save_changes(paths, ())
    stale = json.loads(storage.read_bytes(paths.state))
    _run_saves(state, paths, saves=70, per_save=5, first=0)
    listed = json.loads(storage.read_bytes(paths.state))["journal"]
    assert len(listed) <= 10  # about log2 of the records written, not one per save
    # Only what the state or its previous generation lists is kept.
    prev = json.loads(storage.read_bytes(paths.state_backup))["journal"]
    assert {n for n in storage.listdir(paths.dir) if n.endswith(".jsonl")} == {
        s["file"] for s in listed + prev}
    # A reader that read the state before those merges finds its segments gone: it reads the
    # state again (load does).
    with pytest.raises(SegmentGoneError):
        with_journal(paths, stale)
    assert ExperimentState.load(paths).trials == state.trials


def test_readers_see_a_running_experiment_through_its_journal(tmp_path):
    from ftnb.ui import read_model
    from ftnb.ui.monitor import ExperimentMonitor

    paths = _paths(Storage(str(tmp_path / "runs")))
    state = _state(30)
    _run_saves(state, paths, saves=4, per_save=3, first=0)
    for trial in state.trials:
        paths.storage.makedirs(paths.trial(trial.dir_name).dir)
    assert [t.status for t in read_model.read_state(paths).trials] == [
        t.status for t in state.trials]
    monitor = ExperimentMonitor(paths)  # (no driver: its running trials read INTERRUPTED)
    as_read = [t.status for t in state.without_driver().trials]
    assert [t.status for t in monitor.poll().state.trials] == as_read
    _run_saves(state, paths, saves=2, per_save=3, first=12)
    as_read = [t.status for t in state.without_driver().trials]
    assert [t.status for t in monitor.poll().state.trials] == as_read
    grid = ftnb.ResultGrid.from_path(paths.uri)
    assert len(grid) == 30 and grid.num_terminated == 12
    assert read_model.summarize(paths).counts["TERMINATED"] == 12


SCALE_DRIVER = """
import sys
import ftnb

def trivial(config):
    ftnb.report({"i": config["i"]})

storage, trials = sys.argv[1], int(sys.argv[2])
if sys.argv[3] == "new":
    ftnb.Tuner(trivial, param_space={"i": ftnb.grid_search(list(range(trials)))},
               tune_config=ftnb.TuneConfig(max_concurrent_trials=8),
               run_config=ftnb.RunConfig(storage_path=storage, name="scale", verbose=0,
                                         executor="inprocess")).fit()
else:
    ftnb.Tuner.restore(storage + "/scale", trivial, verbose=0).fit()
"""


@pytest.mark.slow
def test_a_driver_killed_at_random_moments_of_2000_trials_restores_every_trial_once(tmp_path):
    """2,000 trivial trials (threads of the driver: the in-process executor), the driver
    SIGKILLed three times at random moments (a random save, then a random fraction of a second
    after it); after each kill the directory reads whole, and restoring it ends with every
    trial TERMINATED with its one report."""
    trials, seed = 2000, random.randrange(1 << 30)
    rng = random.Random(seed)
    store = tmp_path / "store"
    paths = ExperimentPaths.at(str(store / "scale"))
    done = 0
    for kill in range(4):
        proc = run_script(tmp_path, SCALE_DRIVER, str(store), str(trials),
                          "new" if kill == 0 else "restore")
        if kill == 3:
            out, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, out
            break
        start = _generation(paths)
        target = start + rng.randrange(1, 4)
        try:
            wait_for(lambda: _generation(paths) >= target or proc.poll() is not None,
                     timeout=120, what=f"save {target} (seed {seed})")
            # A random moment after that save: during the next one, or between two.
            _spin(rng.uniform(0.0, 0.8))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=60)
        if proc.returncode == 0:
            # A fast machine's driver finished every trial before this kill's moment came:
            # nothing is left to kill; what the earlier kills left is checked below.
            assert kill > 0, (out, seed)
            break
        assert proc.returncode == -signal.SIGKILL, out
        state = ExperimentState.load(paths)  # whole, and every trial in it
        assert len(state.trials) == trials, seed
        finished = sum(t.status == TrialStatus.TERMINATED for t in state.trials)
        assert finished >= done, seed
        done = finished
    final = ExperimentState.load(paths)
    assert final.status == "FINISHED" and final.loaded_from == paths.state
    assert all(t.status == TrialStatus.TERMINATED for t in final.trials), seed
    for trial in final.trials:
        rows = paths.trial(trial.dir_name).read_results()
        assert [r["training_iteration"] for r in rows] == [1], (trial.trial_id, seed)
    assert json.loads(paths.storage.read_bytes(paths.state)).get("journal") is None
    assert ftnb.ResultGrid.from_path(paths.uri).num_terminated == trials


def _generation(paths: ExperimentPaths) -> int:
    try:
        return json.loads(paths.storage.read_bytes(paths.state)).get("generation", 0)
    except (FileNotFoundError, ValueError):
        return 0


def _spin(seconds: float) -> None:
    """Let ``seconds`` pass: the random moment to kill at (not a wait for anything)."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
