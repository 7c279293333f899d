"""The caller and its trial processes: isolation, GPU assignment, dying drivers, Ctrl+C."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths

from procs import pid_alive, run_script, wait_for


def _gpu_probe(config):
    import time as _t

    ftnb.report({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), "start": _t.time()})
    _t.sleep(0.3)
    ftnb.report({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), "start": _t.time()})


def test_gpus_are_given_exclusively(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    results = ftnb.Tuner(
        _gpu_probe,
        param_space={"i": ftnb.grid_search(list(range(4)))},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="gpu", verbose=0),
        resources_per_trial={"cpu": 0.1, "gpu": 1},
    ).fit()
    assert results.num_terminated == 4
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    devices = [r.rows[0]["cuda"] for r in results]
    assert sorted(set(devices)) == ["0", "1"]
    # Never two trials on one GPU at the same time.
    spans = [(t.attempts[0].started, t.attempts[0].ended, d) for t, d in zip(state.trials, devices)]
    for i, (s1, e1, d1) in enumerate(spans):
        for s2, e2, d2 in spans[i + 1 :]:
            if d1 == d2:
                assert e1 <= s2 or e2 <= s1


def test_no_gpu_requested_sees_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_GPUS", "2")
    results = ftnb.Tuner(
        _gpu_probe, run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="cpu", verbose=0)
    ).fit()
    assert results[0].rows[0]["cuda"] == ""


def test_trainable_defined_in_main_with_relative_paths(tmp_path):
    proc = run_script(
        tmp_path,
        """
        import ftnb
        SCALE = 3

        def train(config):
            with open("data.txt") as f:  # relative to the caller's working directory
                base = int(f.read())
            ftnb.report({"value": base * SCALE * config["x"]})

        if __name__ == "__main__":
            r = ftnb.Tuner(train, param_space={"x": ftnb.grid_search([1, 2])},
                           run_config=ftnb.RunConfig(storage_path="res", name="m", verbose=0)).fit()
            print("VALUES", sorted(res.metrics["value"] for res in r))
        """,
    )
    (tmp_path / "data.txt").write_text("7")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "VALUES [21, 42]" in out


LONG_DRIVER = """
import os, sys, time, ftnb

def train(config):
    with open(os.path.join(sys.argv[1], f"pid-{config['i']}"), "w") as f:
        f.write(str(os.getpid()))
    for step in range(10_000):
        time.sleep(0.05)
        ftnb.report({"step": step})

if __name__ == "__main__":
    ftnb.Tuner(train, param_space={"i": ftnb.grid_search([0, 1])},
               run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="long", verbose=0)).fit()
"""


def _trial_pids(tmp_path):
    pids = []
    for i in (0, 1):
        path = tmp_path / f"pid-{i}"
        if not path.exists() or not path.read_text():
            return None
        pids.append(int(path.read_text()))
    return pids


def test_trials_die_with_a_killed_driver(tmp_path):
    proc = run_script(tmp_path, LONG_DRIVER, str(tmp_path))
    pids = wait_for(lambda: _trial_pids(tmp_path), what="trial processes")
    assert all(pid_alive(p) for p in pids)
    proc.kill()  # SIGKILL: no cleanup code runs in the driver
    proc.wait(10)
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10, what="orphans to die")
    # Nothing writes into the experiment any more (a trial killed before its first report has
    # no result.json: a ghost would make one).
    trial_dirs = [d for d in (tmp_path / "long").iterdir() if d.is_dir()]

    def sizes():
        return [(d / "result.json").stat().st_size if (d / "result.json").exists() else None
                for d in trial_dirs]

    before = sizes()
    time.sleep(0.3)  # a window in which a ghost would have reported several times
    assert sizes() == before


def test_ctrl_c_stops_trials_cleanly_and_persists(tmp_path):
    proc = run_script(tmp_path, LONG_DRIVER, str(tmp_path))
    pids = wait_for(lambda: _trial_pids(tmp_path), what="trial processes")
    paths = ExperimentPaths.at(str(tmp_path / "long"))
    wait_for(
        lambda: all(t.iteration >= 2 for t in ExperimentState.load(paths).trials),
        what="a few results",
    )
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGINT  # Ctrl+C's exit status (130 in a shell)
    # The script ends on the line that resumes it, without a traceback.
    assert "Resume it with:" in out and "Traceback" not in out, out
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10, what="trials to stop")
    state = ExperimentState.load(paths)
    assert state.status == "INTERRUPTED"
    assert {t.status for t in state.trials} == {"PAUSED"}
    for trial in state.trials:
        # The state knows every result the trial persisted (nothing acknowledged is lost).
        rows = paths.trial(trial.dir_name).read_results()
        assert rows and rows[-1]["training_iteration"] == trial.iteration
        assert trial.failures == []  # an interrupt is not a failure


def test_state_is_valid_json_while_running(tmp_path):
    proc = run_script(tmp_path, LONG_DRIVER, str(tmp_path))
    try:
        wait_for(lambda: _trial_pids(tmp_path), what="trial processes")
        path = tmp_path / "long" / "experiment_state.json"
        for _ in range(40):
            json.loads(path.read_text())  # atomic replacement: never a half-written file
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("how", ["raise", "exit", "segfault", "sigkill"])
def test_caller_survives_anything_a_trial_does(tmp_path, how):
    results = ftnb.Tuner(
        _die,
        param_space={"how": how},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=how, verbose=0),
    ).fit()
    assert results.num_errors == 1
    assert os.getpid() > 0  # still here


def _die(config):
    how = config["how"]
    if how == "raise":
        raise KeyboardInterrupt  # even a BaseException stays in the trial
    if how == "exit":
        os._exit(7)
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)
    os.kill(os.getpid(), signal.SIGKILL)


def test_oom_kill_is_classified(tmp_path):
    # A real OOM kill would endanger the test machine; the classifier is tested on its input.
    from ftnb.core.policy import AttemptEnd, classify_end

    failure = classify_end(AttemptEnd(exit_code=-9, oom_killed=True), attempt=1, iteration=0,
                           now=time.time()).failure
    assert failure.kind == "oom" and failure.signal == "SIGKILL"
    assert "out-of-memory" in failure.message


def test_script_without_main_guard(tmp_path):
    # Trial processes must not re-run the caller's script (it would start the experiment again).
    proc = run_script(
        tmp_path,
        """
        import ftnb

        def train(config):
            ftnb.report({"x": config["i"]})

        r = ftnb.Tuner(train, param_space={"i": ftnb.grid_search([1, 2, 3])},
                       run_config=ftnb.RunConfig(storage_path="res", name="g", verbose=0)).fit()
        print("RESULT", r.num_terminated, r.num_errors)
        """,
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "RESULT 3 0" in out
    assert out.count("RESULT") == 1
