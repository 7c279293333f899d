"""Durability under a dying driver: repeated SIGKILLs with ftnb.run re-run until done, ghost
trials fenced off, take-over of a hung driver, re-bound objects, and the same on S3."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess

import pytest

import ftnb
from ftnb.storage.lease import process_name
from ftnb.system.processes import process_status
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths
from procs import pid_alive, processes_named, run_script, stop_outside_the_lease_lock, wait_for
from scripted import executed, result_rows, scripted, uses_objects

DURABLE_DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.run(
    scripted, name="dur", storage_path=sys.argv[1],
    param_space={"n": 30, "sleep": 0.04, "ckpt_every": ftnb.grid_search([1, 3]),
                 "i": ftnb.grid_search([0, 1])},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=0)),
)
print("DONE")
"""


def _owner_token(exp):
    try:
        return json.loads((exp / "owner.json").read_text())["token"]
    except (OSError, ValueError):
        return None


def _trial_dirs(exp):
    return sorted(d for d in exp.iterdir() if d.is_dir()) if exp.exists() else []


MAX_KILLS = 12


def test_repeated_sigkill_of_the_driver_never_loses_or_duplicates(tmp_path):
    seed = int(os.environ.get("FTNB_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    exp = tmp_path / "dur"
    kills = 0
    acknowledged: dict[str, list[dict]] = {}  # rows up to each trial's last checkpoint
    for _ in range(MAX_KILLS + 1):
        proc = run_script(tmp_path, DURABLE_DRIVER, str(tmp_path))
        try:
            # Killed at a random moment, many times; the last run may finish.
            out, _ = proc.communicate(timeout=rng.uniform(0.3, 1.2) if kills < MAX_KILLS else 120)
            assert proc.returncode == 0 and "DONE" in out, f"seed {seed}: {out}"
            break
        except subprocess.TimeoutExpired:
            token = _owner_token(exp)
            proc.kill()
            proc.communicate(timeout=30)
            kills += 1
        # Its trials die with it (and a restore kills any that linger before it writes).
        if token:
            wait_for(lambda: not processes_named(process_name(token)), timeout=10,
                     what="the killed driver's trials to die")
        if (exp / "experiment_state.json").exists():
            json.loads((exp / "experiment_state.json").read_text())  # never half-written
            ExperimentState.load(ExperimentPaths.at(str(exp)))
        for d in _trial_dirs(exp):
            rows = result_rows(str(d))
            marks = [i for i, r in enumerate(rows) if r.get("checkpoint_dir_name")]
            if marks:
                acknowledged[d.name] = rows[: marks[-1] + 1]
    else:
        pytest.fail(f"seed {seed}: the experiment did not finish")

    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert state.status == "FINISHED", f"seed {seed}"
    assert [t.status for t in state.trials] == ["TERMINATED"] * 4
    for trial in state.trials:
        d = exp / trial.dir_name
        rows = result_rows(str(d))
        # Every iteration exactly once, in order.
        assert [r["training_iteration"] for r in rows] == list(range(1, 31)), f"seed {seed}"
        # What was checkpointed before any kill is still there, unchanged: never redone.
        before = acknowledged.get(trial.dir_name, [])
        assert rows[: len(before)] == before, f"seed {seed}"
        # Every checkpoint a report acknowledged exists, complete.
        for row in rows:
            if row.get("checkpoint_dir_name"):
                assert (d / row["checkpoint_dir_name"] / ".ftnb_checkpoint.json").exists()
        # Only steps after a trial's last checkpoint can be redone, at most once per kill.
        steps = [s for _, s in executed(str(d))]
        redone = len(steps) - len(set(steps))
        every = json.loads((d / "params.json").read_text())["ckpt_every"]
        assert redone <= kills * every, f"seed {seed}"
        assert trial.failures == [], f"seed {seed}: a dead driver is not a trial failure"
    assert kills >= 3, f"seed {seed}: the driver was killed only {kills} times"


GHOST_DRIVER = """
import sys, ftnb
from scripted import scripted

ftnb.run(scripted, name="ghost", storage_path=sys.argv[1],
         param_space={"n": 100000, "sleep": 0.05}, run_config=ftnb.RunConfig(verbose=0))
"""


def test_ghost_trials_of_a_hung_driver_are_fenced(tmp_path, monkeypatch):
    """A driver on "another machine" hangs (SIGSTOP) while its trial keeps running; a new
    driver takes over. The old trial must stop by itself before writing anything more (the new
    driver cannot kill a process on another machine), and the old driver, once it wakes up,
    must write nothing."""
    proc = run_script(tmp_path, GHOST_DRIVER, str(tmp_path),
                      env={"FTNB_HOST_ID": "machine-a", "FTNB_LEASE_TTL_S": "6"})
    exp = tmp_path / "ghost"
    try:
        trial_dir = wait_for(lambda: _trial_dirs(exp) and _trial_dirs(exp)[0], what="a trial")
        wait_for(lambda: len(result_rows(str(trial_dir))) >= 3, what="a few results")
        state = wait_for(lambda: _state_with_pid(exp), what="the trial's pid in the state")
        ghost_pid = state.trials[0].attempts[0].pid
        old_token = _owner_token(exp)
        # (not inside a heartbeat: stopped there, a driver of another machine holds this
        # disk's lease lock until continued, and the takeover waits for it)
        stop_outside_the_lease_lock(proc.pid, exp)

        monkeypatch.setenv("FTNB_HOST_ID", "machine-b")
        with pytest.raises(ftnb.ExperimentLockedError, match="machine-a|pid"):
            ftnb.Tuner.restore(str(exp), scripted)  # its heartbeat is fresh: alive
        stop_at = len(result_rows(str(trial_dir))) + 10
        results = ftnb.Tuner.restore(str(exp), scripted, takeover=True,
                                     stop={"training_iteration": stop_at}, verbose=0).fit()
        assert results.num_terminated == 1
        # The ghost stopped by itself: nobody on "machine-b" killed it.
        wait_for(lambda: not pid_alive(ghost_pid), timeout=10, what="the ghost to stop")
        assert processes_named(process_name(old_token)) == []
        rows = result_rows(str(trial_dir))
        _assert_each_iteration_once(rows, stop_at)
        attempts = [r["attempt"] for r in rows]
        assert attempts == sorted(attempts)  # no row of the ghost after the new attempt's
        stderr = (trial_dir / "stderr").read_text()
        assert "now run by another driver" in stderr
        final = (exp / "experiment_state.json").read_text()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    # The old driver woke up, found its lease gone, and stopped without writing.
    assert proc.returncode != 0 and "LeaseLostError" in out and "took over" in out, out
    assert (exp / "experiment_state.json").read_text() == final
    assert json.loads((exp / "owner.json").read_text())["host_id"] == "machine-b"


def _assert_each_iteration_once(rows, stop_at):
    """Every iteration exactly once, and the new driver's attempt wrote the last ones. The old
    trial runs on until the takeover stops it, so on a busy machine it may pass ``stop_at``
    before that: then the new attempt resumes after it and stops at its first report."""
    iterations = [r["training_iteration"] for r in rows]
    assert iterations == list(range(1, len(rows) + 1))
    assert iterations[-1] >= stop_at
    last_attempt = rows[-1]["attempt"]
    assert last_attempt > rows[0]["attempt"]
    if iterations[-1] > stop_at:  # the old trial got past stop_at: one new report, then stop
        assert [r["attempt"] for r in rows].count(last_attempt) == 1


def _state_with_pid(exp):
    try:
        state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    except Exception:
        return None
    trial = state.trials[0]
    return state if trial.attempts and trial.attempts[0].pid else None


def test_taking_over_a_hung_driver_on_this_machine_kills_its_trials(tmp_path):
    proc = run_script(tmp_path, GHOST_DRIVER, str(tmp_path))
    exp = tmp_path / "ghost"
    try:
        trial_dir = wait_for(lambda: _trial_dirs(exp) and _trial_dirs(exp)[0], what="a trial")
        wait_for(lambda: len(result_rows(str(trial_dir))) >= 2, what="a few results")
        old_token = _owner_token(exp)
        wait_for(lambda: processes_named(process_name(old_token)), what="its trial process")
        os.kill(proc.pid, signal.SIGSTOP)
        # (the signal takes effect when the kernel next schedules it: a loaded machine shows
        # it running a moment longer, and a takeover of a running driver is refused)
        wait_for(lambda: process_status(proc.pid) == "T", what="the driver to read stopped")
        # (far enough that the old trial, reporting every 0.05 s until the takeover kills it,
        # does not get there first: then no new attempt would be needed)
        stop_at = len(result_rows(str(trial_dir))) + 60
        tuner = ftnb.Tuner.restore(str(exp), scripted, takeover=True,
                                   stop={"training_iteration": stop_at}, verbose=0)
        results = tuner.fit()
        assert results.num_terminated == 1
        assert processes_named(process_name(old_token)) == []  # killed before we ran
        _assert_each_iteration_once(result_rows(str(trial_dir)), stop_at)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    # A driver stopped on this machine is ended by the takeover (it could hold the lease lock,
    # stopped inside a heartbeat; continued it could only run without a lease).
    assert proc.returncode == -signal.SIGKILL, out


OBJECTS_DRIVER = """
import sys, numpy as np, pandas as pd, ftnb
from scripted import uses_objects

space = {
    "data": ftnb.put(np.ones(1000)),
    "frame": pd.DataFrame({"x": [1.0, 2.0]}),
    "w": ftnb.grid_search([1, 2]),
    "n": 30,
}
ftnb.run(uses_objects, name="objs", storage_path=sys.argv[1], param_space=space,
         run_config=ftnb.RunConfig(verbose=0))
"""


def test_objects_must_be_re_specified_and_are_re_bound(tmp_path):
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    proc = run_script(tmp_path, OBJECTS_DRIVER, str(tmp_path))
    exp = tmp_path / "objs"
    try:
        wait_for(lambda: len(_trial_dirs(exp)) == 2
                 and all(len(result_rows(str(d))) >= 2 for d in _trial_dirs(exp)),
                 what="results that used the objects")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    state = json.loads((exp / "experiment_state.json").read_text())
    # The state holds placeholders, never the objects.
    assert state["param_space"]["data"]["__ftnb_ref__"]
    assert state["param_space"]["frame"]["type"].endswith("DataFrame")
    assert os.path.getsize(exp / "experiment_state.json") < 20_000

    with pytest.raises(ftnb.RestoreError) as err:
        ftnb.Tuner.restore(str(exp), uses_objects)
    assert "data (numpy.ndarray)" in str(err.value) and "frame (pandas" in str(err.value)
    assert "param_space=" in str(err.value)

    new_space = {
        "data": ftnb.put(np.full(1000, 5.0)),
        "frame": pd.DataFrame({"x": [10.0, 20.0]}),
        "w": ftnb.grid_search([1, 2]),
        "n": 30,
    }
    with pytest.raises(ftnb.RestoreError, match=r"w: grid_search of 2 values, now 3"):
        ftnb.Tuner.restore(str(exp), uses_objects,
                           param_space={**new_space, "w": ftnb.grid_search([1, 2, 3])})
    with pytest.raises(ftnb.RestoreError, match=r"n: was 30, now 31"):
        ftnb.Tuner.restore(str(exp), uses_objects, param_space={**new_space, "n": 31})

    results = ftnb.run(uses_objects, name="objs", storage_path=str(tmp_path),
                       param_space=new_space, run_config=ftnb.RunConfig(verbose=0))
    assert results.num_terminated == 2
    for d in _trial_dirs(exp):
        rows = result_rows(str(d))
        assert [r["training_iteration"] for r in rows] == list(range(1, 31))
        old = [r for r in rows if r["attempt_seen"] == 1]
        new = [r for r in rows if r["attempt_seen"] > 1]
        assert old and new
        assert {r["data_sum"] for r in old} == {1000.0} and {r["frame_sum"] for r in old} == {3.0}
        assert {r["data_sum"] for r in new} == {5000.0} and {r["frame_sum"] for r in new} == {30.0}


S3_DRIVER = """
import sys, ftnb
from conftest import make_s3_filesystem
from scripted import scripted

fs = make_s3_filesystem(sys.argv[2])
ftnb.run(scripted, name="s3exp", storage_path=sys.argv[1],
         param_space={"n": 30, "sleep": 0.1, "i": ftnb.grid_search([0, 1])},
         run_config=ftnb.RunConfig(verbose=1, storage_filesystem=fs))
print("DONE")
"""


@pytest.mark.s3
def test_restore_from_s3_after_a_driver_kill(s3_storage, s3_endpoint, tmp_path):
    url, fs = s3_storage
    exp_url = f"{url}/s3exp"
    proc = run_script(tmp_path, S3_DRIVER, url, s3_endpoint)
    try:
        # Both trials have results, and (3 s each) neither can have finished yet.
        wait_for(lambda: len(rows := _s3_rows(fs, exp_url)) == 2 and rows[0] >= 2, timeout=60,
                 what="results of both trials on S3")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert ftnb.Tuner.can_restore(exp_url, storage_filesystem=fs)
    assert not ftnb.Tuner.can_restore(f"{url}/nothing", storage_filesystem=fs)
    # The second run of the same script resumes (the original machine's disk is not needed).
    proc = run_script(tmp_path, S3_DRIVER, url, s3_endpoint)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "DONE" in out and "resuming experiment 's3exp'" in out, out
    results = ftnb.ResultGrid.from_path(exp_url, filesystem=fs)
    assert results.num_terminated == 2
    for result in results:
        assert [r["training_iteration"] for r in result.rows] == list(range(1, 31))
        assert {r["attempt"] for r in result.rows} == {1, 2}


def _s3_rows(fs, exp_url):
    """The number of result rows of each trial on S3, fewest first."""
    try:
        return sorted(len(fs.cat_file(path).splitlines())
                      for path in fs.glob(exp_url.removeprefix("s3://") + "/*/result.json"))
    except FileNotFoundError:
        return []
