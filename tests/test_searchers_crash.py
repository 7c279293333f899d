"""An OptunaSearch sweep whose driver is SIGKILLed three times at random moments and re-run with
ftnb.run until done: no config suggested twice, none lost, every iteration once, Optuna's study
(read with Optuna's own journal reader) holding exactly ftnb's trials with their results. And a
restore on S3 (the journal written through ftnb's storage, no local file)."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths, Storage
from procs import run_script, wait_for
from scripted import InterruptAfter, result_rows

optuna = pytest.importorskip("optuna")

N_TRIALS, N_STEPS = 12, 4

DRIVER = f"""
import sys, ftnb, optuna
from ftnb.search import ConcurrencyLimiter
from ftnb.search.optuna import OptunaSearch
from scripted import scripted

optuna.logging.set_verbosity(optuna.logging.WARNING)
ftnb.run(
    scripted, name="opt", storage_path=sys.argv[1],
    param_space={{"slope": ftnb.uniform(-1, 1), "n": {N_STEPS}, "sleep": 0.25, "ckpt_every": 1}},
    tune_config=ftnb.TuneConfig(metric="score", mode="max", num_samples={N_TRIALS},
                                search_alg=ConcurrencyLimiter(OptunaSearch(seed=3), 2)),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=0)),
)
print("DONE")
"""

KILLS = 3


def _mtime(path):
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _study(path):
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    return optuna.load_study(study_name="ftnb", storage=optuna.storages.JournalStorage(backend))


@pytest.mark.slow
def test_optuna_sweep_survives_three_driver_sigkills(tmp_path):
    seed = int(os.environ.get("FTNB_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    exp = tmp_path / "opt"
    state_file = exp / "searcher_state.json"
    kills = 0
    while True:
        before = _mtime(state_file)
        proc = run_script(tmp_path, DRIVER, str(tmp_path))
        if kills < KILLS:
            # Killed at a random moment once its controller runs (it writes the searcher's
            # state as it starts): while it suggests, records, and tells.
            wait_for(lambda: _mtime(state_file) != before or proc.poll() is not None,
                     timeout=60, what="the driver's controller to start")
            try:
                proc.wait(timeout=rng.uniform(0.0, 1.2))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=30)
                kills += 1
                continue
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0 and "DONE" in out, f"seed {seed}: {out}"
        break
    if kills < KILLS:
        pytest.fail(f"seed {seed}: the sweep ended before the driver was killed {KILLS} times")

    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert state.status == "FINISHED", f"seed {seed}"
    trials = state.trials
    assert len(trials) == N_TRIALS and all(t.status == "TERMINATED" for t in trials), seed
    # No config suggested twice, none lost: one trial per suggestion, ids in order.
    slopes = [t.config["slope"] for t in trials]
    assert len(set(slopes)) == N_TRIALS, f"seed {seed}: {slopes}"
    assert [t.trial_id for t in trials] == sorted(t.trial_id for t in trials)
    saved = json.loads((exp / "searcher_state.json").read_text())
    assert saved["pending"] == {} and saved["live"] == {} and saved["made"] == N_TRIALS
    # Every iteration once.
    rows = {t.trial_id: result_rows(str(exp / t.dir_name)) for t in trials}
    for trial_id, trial_rows in rows.items():
        assert [r["training_iteration"] for r in trial_rows] == list(range(1, N_STEPS + 1)), \
            f"seed {seed}: {trial_id}"
    # Optuna's study (read by Optuna itself) holds exactly these trials, each told once.
    study = _study(exp / "optuna_journal.jsonl")
    by_id = {t.user_attrs["ftnb_trial_id"]: t for t in study.trials}
    assert len(study.trials) == N_TRIALS and sorted(by_id) == sorted(rows), f"seed {seed}"
    for trial in trials:
        frozen = by_id[trial.trial_id]
        assert frozen.state == optuna.trial.TrialState.COMPLETE, f"seed {seed}"
        assert frozen.params == {"slope": trial.config["slope"]}
        assert frozen.value == rows[trial.trial_id][-1]["score"]
        assert frozen.intermediate_values == {
            r["training_iteration"]: r["score"] for r in rows[trial.trial_id]}, f"seed {seed}"


def _quadratic(config):
    import ftnb

    for i in range(2):
        ftnb.report({"loss": (config["x"] - 0.5) ** 2 + i})


@pytest.mark.s3
def test_optuna_search_restores_on_s3(s3_storage):
    import ftnb
    from ftnb.search.optuna import OptunaSearch, StorageJournalBackend

    url, fs = s3_storage
    tuner = ftnb.Tuner(_quadratic, param_space={"x": ftnb.uniform(0, 1)},
                       tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=5,
                                                   max_concurrent_trials=1,
                                                   search_alg=OptunaSearch(seed=0)),
                       run_config=ftnb.RunConfig(storage_path=url, storage_filesystem=fs,
                                                 name="s3opt", verbose=0, executor="inprocess"))
    tuner.listeners.append(InterruptAfter(2))
    with pytest.raises(KeyboardInterrupt):
        tuner.fit()
    results = ftnb.Tuner.restore(f"{url}/s3opt", _quadratic, storage_filesystem=fs,
                                 verbose=0).fit()
    assert len(results) == 5 and results.status == "FINISHED"
    assert len({r.config["x"] for r in results}) == 5
    storage = Storage(f"{url}/s3opt", fs)
    backend = StorageJournalBackend(storage, ExperimentPaths.at(f"{url}/s3opt", fs).optuna_journal)
    study = optuna.load_study(study_name="ftnb", storage=optuna.storages.JournalStorage(backend))
    assert sorted(t.user_attrs["ftnb_trial_id"] for t in study.trials) == sorted(
        r.metrics["trial_id"] for r in results)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
