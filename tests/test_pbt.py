"""PopulationBasedTraining (issue 18): the policy alone (quantiles, explore rules, perturbation
timing, its JSON state), then real sweeps where the worse trials continue from the better
ones' checkpoints with mutated configs, and the same sweep with its driver SIGKILLed three times
at random moments: every exploit carried out once and whole (new config with the donor's
checkpoint, never one without the other), every iteration recorded once."""

from __future__ import annotations

import json
import random

import pytest
from killed_driver import kill_when, run_to_end
from pbt_sweeps import written_by
from scripted import result_rows

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.schedulers import PopulationBasedTraining, pbt_history
from ftnb.schedulers.pbt import explore, quantiles
from ftnb.storage import ExperimentPaths


# -- the policy, without processes --------------------------------------------------------------
class _Trial:
    def __init__(self, trial_id, config, status="RUNNING", iteration=0, checkpoint=None):
        self.trial_id = trial_id
        self.config = config
        self.status = status
        self.iteration = iteration
        self.latest_checkpoint = checkpoint
        self.last_result = None


class _Controller:
    """The controller's view as PBT uses it; records the exploits asked for."""

    def __init__(self, trials):
        self.trials = {t.trial_id: t for t in trials}
        self.exploits = []

    def get_trials(self):
        return list(self.trials.values())

    def get_trial(self, trial_id):
        return self.trials[trial_id]

    def status_of(self, trial):
        return trial.status

    def exploit_trial(self, trial, donor, config):
        self.exploits.append((trial.trial_id, donor.trial_id, config))
        return {"donor_checkpoint": donor.latest_checkpoint["dir_name"],
                "donor_checkpoint_iteration": donor.latest_checkpoint["iteration"],
                "into": "checkpoint_000009", "config": config}


def test_quantiles_follow_rays_rules():
    scores = {"a": 4.0, "b": 1.0, "c": 3.0, "d": 2.0, "e": 0.0}
    assert quantiles(scores, 0.25, 5) == (["e", "b"], ["c", "a"])  # ceil(5 * 0.25) = 2
    assert quantiles(scores, 0.5, 5) == (["e", "b"], ["c", "a"])  # at most half: floor(5 / 2)
    assert quantiles(scores, 0.0, 5) == ([], [])
    assert quantiles({"a": 1.0}, 0.25, 4) == ([], ["a"])  # the only one scored: on top
    assert quantiles({"a": 1.0}, 0.25, 1) == ([], [])
    assert quantiles({}, 0.25, 4) == ([], [])


def test_explore_perturbs_numbers_shifts_lists_and_resamples():
    rng = random.Random(1)
    mutations = {"lr": ftnb.uniform(0.0, 1.0), "n": [8, 16, 32, 64], "k": lambda: 7,
                 "nested": {"m": [1, 2, 3]}}
    config = {"lr": 0.5, "n": 16, "k": 10, "nested": {"m": 1}, "other": "kept"}
    seen_lr, seen_n, seen_k, seen_m = set(), set(), set(), set()
    for _ in range(200):
        new = explore(config, mutations, 0.0, (1.2, 0.8), rng=rng)
        seen_lr.add(round(new["lr"], 9))
        seen_n.add(new["n"])
        seen_k.add(new["k"])
        seen_m.add(new["nested"]["m"])
        assert new["other"] == "kept"
    assert seen_lr == {0.6, 0.4} and seen_n == {8, 32} and seen_k == {12, 8}
    assert seen_m == {1, 2}  # the first category: shifted down it stays
    assert config == {"lr": 0.5, "n": 16, "k": 10, "nested": {"m": 1}, "other": "kept"}
    # Clipped to the domain's bounds; an int stays an int.
    assert explore({"lr": 0.9}, {"lr": ftnb.uniform(0, 1)}, 0.0, (2.0,), rng=rng) == {"lr": 1}
    assert explore({"k": 3}, {"k": lambda: 1}, 0.0, (1.5,), rng=rng) == {"k": 4}
    # Resampling always: from the domain, the list, the function.
    new = explore(config, mutations, 1.0, rng=rng)
    assert 0.0 <= new["lr"] <= 1.0 and new["n"] in (8, 16, 32, 64) and new["k"] == 7
    # A value not in the list is resampled; custom_explore_fn runs last.
    new = explore({"n": 5}, {"n": [8, 16]}, 0.0, custom_explore_fn=lambda c: {**c, "x": 1},
                  rng=rng)
    assert new["n"] in (8, 16) and new["x"] == 1
    with pytest.raises(TypeError, match="custom_explore_fn"):
        explore({"n": 8}, {}, 0.0, custom_explore_fn=lambda c: None)


def test_bad_arguments_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="hyperparam_mutations or custom_explore_fn"):
        PopulationBasedTraining()
    with pytest.raises(ValueError, match="quantile_fraction=0.7"):
        PopulationBasedTraining(hyperparam_mutations={"a": [1]}, quantile_fraction=0.7)
    with pytest.raises(ValueError, match="perturbation_interval=0"):
        PopulationBasedTraining(hyperparam_mutations={"a": [1]}, perturbation_interval=0)
    with pytest.raises(ValueError, match="resample_probability=2"):
        PopulationBasedTraining(hyperparam_mutations={"a": [1]}, resample_probability=2)
    with pytest.raises(ValueError, match="perturbation_factors"):
        PopulationBasedTraining(hyperparam_mutations={"a": [1]}, perturbation_factors=())
    with pytest.raises(TypeError, match=r"hyperparam_mutations\['a'\]=3"):
        PopulationBasedTraining(hyperparam_mutations={"a": 3})
    with pytest.raises(ValueError, match="sample_from"):
        PopulationBasedTraining(hyperparam_mutations={"a": ftnb.sample_from(lambda s: 1)})
    with pytest.raises(ValueError, match="mode='min'"):
        PopulationBasedTraining(hyperparam_mutations={"a": [1]}, mode="best")
    # A mutated key the space does not have: refused before anything is written.
    with pytest.raises(ValueError, match="mutates lr, which param_space does not have"):
        ftnb.Tuner(lambda c: None, param_space={"a": 1}, tune_config=ftnb.TuneConfig(
            metric="m", mode="max",
            scheduler=PopulationBasedTraining(hyperparam_mutations={"lr": [1, 2]})),
            run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="x")).fit()
    assert not (tmp_path / "x").exists()
    # No metric anywhere: refused before the experiment starts.
    with pytest.raises(ValueError, match="compares trials by a metric"):
        ftnb.Tuner(lambda c: None, param_space={"a": 1}, tune_config=ftnb.TuneConfig(
            scheduler=PopulationBasedTraining(hyperparam_mutations={"a": [1]}))).fit()


def _pbt(**kw):
    settings = dict(time_attr="training_iteration", metric="score", mode="max",
                    perturbation_interval=2, hyperparam_mutations={"lr": ftnb.uniform(0, 10)},
                    resample_probability=0.0, quantile_fraction=0.25)
    settings.update(kw)
    return PopulationBasedTraining(**settings)


def _report(pbt, controller, trial, iteration, score):
    trial.iteration = iteration
    return pbt.on_trial_result(controller, trial, {"training_iteration": iteration,
                                                   "score": score})


def test_perturbation_timing_burn_in_and_decision_points():
    pbt = _pbt(perturbation_interval=4, burn_in_period=6)
    trials = [_Trial(str(i), {"lr": 1.0}) for i in range(4)]
    controller = _Controller(trials)
    for t in trials:
        pbt.on_trial_add(controller, t)
    # Ray's rule on training_iteration: first at max(burn_in, interval) = 6, then every 4.
    points = [i for i in range(1, 20) if pbt._grid_index(i) > pbt._grid_index(i - 1)]
    assert points == [6, 10, 14, 18]
    decision_points = pbt.decision_points(trials[0])
    reached = [i for i in range(1, 20)
               if decision_points.reached(i - 1, {"training_iteration": i})]
    assert reached == points  # exactly those reports wait for the decision
    # A report that jumps over a point (a time in seconds) is one; the next point counts on.
    pbt2 = _pbt(time_attr="time_total_s", perturbation_interval=10)
    assert [pbt2._grid_index(t) for t in (9.9, 10.0, 19.9, 23.5, 30.1)] == [0, 1, 1, 2, 3]
    points = pbt2.decision_points(trials[0])
    assert points.reached(9.0, {"time_total_s": 23.5}) and not points.reached(
        10.5, {"time_total_s": 19.9})


def test_the_bottom_trial_exploits_a_top_trial_with_an_explored_config():
    random.seed(0)
    pbt = _pbt(quantile_fraction=0.5)
    checkpoint = {"dir_name": "checkpoint_000001", "iteration": 2}
    trials = [_Trial(str(i), {"lr": float(i + 1)}, checkpoint=dict(checkpoint))
              for i in range(4)]
    controller = _Controller(trials)
    for t in trials:
        pbt.on_trial_add(controller, t)
    assert _report(pbt, controller, trials[0], 1, 0.0) == "CONTINUE"  # no point yet
    # The first to reach the point is alone: on top, nothing to exploit.
    assert _report(pbt, controller, trials[3], 2, 40.0) == "CONTINUE"
    # Two scored: the bottom one of them (ceil(2 * 0.5) = 1) exploits the top one.
    assert _report(pbt, controller, trials[2], 2, 30.0) == "PAUSE"
    # Three scored: still one each (at most half); the lowest exploits the top one.
    assert _report(pbt, controller, trials[1], 2, 20.0) == "PAUSE"
    assert [(e[0], e[1]) for e in controller.exploits] == [("2", "3"), ("1", "3")]
    config = controller.exploits[-1][2]
    assert config["lr"] in (pytest.approx(4.0 * 1.2), pytest.approx(4.0 * 0.8))
    history = pbt.history
    assert [(h["trial_id"], h["donor_id"], h["iteration"]) for h in history] == [
        ("2", "3", 2), ("1", "3", 2)]
    assert history[1]["donor_checkpoint"] == "checkpoint_000001"
    assert history[1]["config"] == config and history[1]["score"] == 20.0
    assert history[1]["donor_score"] == 40.0 and history[1]["donor_config"] == {"lr": 4.0}
    # Not again before the next point; the next point decides again.
    assert _report(pbt, controller, trials[1], 3, 0.0) == "CONTINUE"
    # A donor without a checkpoint: no exploit.
    for t in trials:
        t.latest_checkpoint = None
    assert _report(pbt, controller, trials[0], 2, 0.0) == "CONTINUE"
    assert len(controller.exploits) == 2
    # The state is JSON and comes back whole.
    state = json.loads(json.dumps(pbt.get_state()))
    again = _pbt(quantile_fraction=0.5)
    again.set_state(state)
    assert again.get_state() == pbt.get_state()
    # A stopped run's settings rebuild it (mutations as JSON).
    from ftnb.schedulers import describe_scheduler, scheduler_from_description

    rebuilt = scheduler_from_description(json.loads(json.dumps(describe_scheduler(pbt))))
    assert rebuilt._ftnb_settings() == pbt._ftnb_settings()


def test_synchronous_mode_waits_for_the_whole_population():
    random.seed(0)
    pbt = _pbt(synch=True, quantile_fraction=0.5)
    checkpoint = {"dir_name": "checkpoint_000001", "iteration": 2}
    trials = [_Trial(str(i), {"lr": float(i + 1)}, checkpoint=dict(checkpoint))
              for i in range(4)]
    controller = _Controller(trials)
    for t in trials:
        pbt.on_trial_add(controller, t)
    assert _report(pbt, controller, trials[0], 2, 0.0) == "PAUSE"  # waits for the others
    trials[0].status = "PAUSED"
    assert pbt.choose_trial_to_run(controller) is None  # no PENDING/PAUSED one behind
    assert _report(pbt, controller, trials[3], 2, 30.0) == "PAUSE"
    trials[3].status = "PAUSED"
    assert _report(pbt, controller, trials[1], 2, 10.0) == "PAUSE"
    trials[1].status = "PAUSED"
    assert not controller.exploits
    # The last one: all are at the point; the bottom half (0 and 1) exploit the top half.
    assert _report(pbt, controller, trials[2], 2, 20.0) == "CONTINUE"
    assert sorted(e[0] for e in controller.exploits) == ["0", "1"]
    assert all(e[1] in ("2", "3") for e in controller.exploits)
    assert pbt._next_perturbation_sync == 4
    assert pbt.choose_trial_to_run(controller).trial_id in ("0", "1", "3")


# -- real sweeps ---------------------------------------------------------------------------------
# w grows by lr at each iteration (score = w: the higher lr, the better); a checkpoint at every
# report holds w and the trial that wrote it, and the first row of an attempt says what it loaded.
TRAIN = """
def train(config):
    import json, os, shutil, tempfile, time
    import ftnb

    context = ftnb.get_context()
    w, loaded = 0.0, None
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as f:
                loaded = json.load(f)
        w = loaded["w"]
    while True:
        time.sleep(config.get("sleep", 0.02))
        w += config["lr"]
        local = context.get_trial_dir()  # (on an object store: a temporary folder)
        folder = tempfile.mkdtemp(prefix="tmp-", dir=local if os.path.isdir(local) else None)
        with open(os.path.join(folder, "state.json"), "w") as f:
            json.dump({"w": w, "by": context.get_trial_id()}, f)
        try:
            ftnb.report({"score": w, "lr": config["lr"], "loaded": loaded},
                        checkpoint=ftnb.Checkpoint.from_directory(folder))
        finally:
            shutil.rmtree(folder)  # (persisted by report; it raises where the trial ends)
        loaded = None
"""
_namespace: dict = {}
exec(TRAIN, _namespace)  # (the same code the driver scripts run)
train = _namespace["train"]

ITERATIONS = 8
LRS = [0.1, 0.2, 0.3, 1.0]


def _pbt_for_sweep():
    return PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2, quantile_fraction=0.25,
        resample_probability=0.0, hyperparam_mutations={"lr": ftnb.uniform(0.01, 10.0)})


def _state(path) -> ExperimentState:
    return ExperimentState.load(ExperimentPaths.at(str(path)))


def _explored_by_pbt(entry: dict) -> None:
    """PBT's explore rule: the donor's lr scaled by 1.2 or 0.8, clipped to the domain."""
    donor_lr = entry["donor_config"]["lr"]
    assert entry["config"]["lr"] in (pytest.approx(min(donor_lr * 1.2, 10.0)),
                                     pytest.approx(max(donor_lr * 0.8, 0.01)))


def _check_exploits(exp, *, at_least: int = 1, explored=_explored_by_pbt) -> list:
    """Every exploit in the history carried out once and whole; every iteration once. ``exp``:
    the experiment's folder (a local path or an fsspec URL); ``explored(entry)`` checks an
    exploit's new config against its donor's (PB2's tests pass their own rule)."""
    exp = str(exp)
    paths = ExperimentPaths.at(exp)
    storage = paths.storage
    state = _state(exp)
    history = pbt_history(exp)
    entries = history["global"]
    assert len(entries) >= at_least, entries
    trials = {t.trial_id: t for t in state.trials}
    rows = {tid: paths.trial(t.dir_name).read_results() for tid, t in trials.items()}
    for tid, t in trials.items():
        assert t.status == "TERMINATED" and not t.failures, (tid, t.status, t.failures)
        assert [r["training_iteration"] for r in rows[tid]] == list(
            range(1, ITERATIONS + 1)), tid
        assert not [n for n in storage.listdir(paths.trial(t.dir_name).dir)
                    if "pbt_exploit" in n]
    by_trial: dict = {}
    for entry in entries:
        by_trial.setdefault(entry["trial_id"], []).append(entry)
    for tid, mine in by_trial.items():
        trial_rows = {r["training_iteration"]: r for r in rows[tid]}
        for n, entry in enumerate(mine):
            i = entry["iteration"]
            after = trial_rows[i + 1]
            # It continued from the donor's checkpoint (the state the donor had reported at
            # that checkpoint's iteration), with the explored config.
            # (or, when the donor's checkpoint was the copy it continued from itself after an
            # exploit, what that copy held: a chained exploit)
            by, w = written_by(entry, entries, rows)
            assert (after["loaded"]["by"], after["loaded"]["w"]) == (by, pytest.approx(w)), (
                entry, after)
            assert after["lr"] == pytest.approx(entry["config"]["lr"])
            explored(entry)
            assert after["score"] == pytest.approx(after["loaded"]["w"] + after["lr"])
            # Up to the next exploit (or the end) it ran with that config.
            end = mine[n + 1]["iteration"] if n + 1 < len(mine) else ITERATIONS
            assert {round(trial_rows[k]["lr"], 12) for k in range(i + 1, end + 1)} == {
                round(entry["config"]["lr"], 12)}
        # Its record and params.json hold the last config it ran with.
        last = mine[-1]["config"]
        assert trials[tid].config["lr"] == pytest.approx(last["lr"])
        params = json.loads(storage.read_bytes(paths.trial(trials[tid].dir_name).params))
        assert params["lr"] == pytest.approx(last["lr"])
        # A new attempt, never a failure; it restarted from the copy in its own folder.
        restored = [a.restored_from for a in trials[tid].attempts]
        assert entry["checkpoint"] in restored
    # Each exploit carried out once: once in the history, an attempt started from its copy of
    # the donor's checkpoint at the iteration it exploited (another one too when a driver died
    # before that attempt reported: a restart, not a second exploit), and without retention
    # the copy is among the trial's checkpoints once.
    for tid, t in trials.items():
        starts = [(a.restored_from, a.start_iteration) for a in t.attempts]
        iterations = [e["iteration"] for e in by_trial.get(tid, [])]
        assert len(set(iterations)) == len(iterations), by_trial[tid]
        for entry in by_trial.get(tid, []):
            assert (entry["checkpoint"], entry["iteration"]) in starts, (tid, starts)
        copies = [c["iteration"] for c in t.checkpoints if c.get("exploited_from")]
        if state.settings["checkpoint_config"].get("num_to_keep") is None:
            assert copies == [e["iteration"] for e in by_trial.get(tid, [])], tid
    # The trials that never exploited ran with their own lr throughout.
    for tid, t in trials.items():
        if tid not in by_trial:
            assert len({r["lr"] for r in rows[tid]}) == 1
    return entries


def test_pbt_exploits_the_better_trials_checkpoint(tmp_path):
    random.seed(1)
    results = ftnb.Tuner(
        ftnb.with_resources(train, {"cpu": 0.25}),
        param_space={"lr": ftnb.grid_search(LRS)},
        tune_config=ftnb.TuneConfig(metric="score", mode="max", scheduler=_pbt_for_sweep()),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="pbt", verbose=0,
                                  stop={"training_iteration": ITERATIONS},
                                  executor="inprocess"),
    ).fit()
    assert not results.errors
    entries = _check_exploits(tmp_path / "pbt")
    # Each exploiting trial took the state of a better one (a higher score at that point).
    assert all(e["donor_score"] >= e["score"] for e in entries), entries  # (ties: twins)


def test_pbt_on_an_object_store_copies_the_donors_checkpoint(tmp_path):
    """On fsspec's memory filesystem (an object store's rules: no rename), the staged copy is
    copied into place, and the exploiting trial restores the donor's state from it."""
    random.seed(2)
    url = f"memory://pbt-{tmp_path.name}"
    results = ftnb.Tuner(
        train, param_space={"lr": ftnb.grid_search(LRS), "sleep": 0.0},
        tune_config=ftnb.TuneConfig(metric="score", mode="max", scheduler=_pbt_for_sweep()),
        run_config=ftnb.RunConfig(storage_path=url, name="pbt", verbose=0,
                                  stop={"training_iteration": ITERATIONS},
                                  checkpoint_config=ftnb.CheckpointConfig(num_to_keep=1),
                                  executor="inprocess"),
    ).fit()
    assert not results.errors
    _check_exploits(f"{url}/pbt")


def test_synchronous_pbt_with_fewer_slots_than_trials(tmp_path):
    """synch=True with two trials at a time: each trial pauses at each perturbation point (its
    attempt ends there, it resumes from its checkpoint) until all four got there; then the bottom
    one exploits the top one, whose checkpoint is from that same point."""
    random.seed(3)
    results = ftnb.Tuner(
        train, param_space={"lr": ftnb.grid_search(LRS), "sleep": 0.0},
        tune_config=ftnb.TuneConfig(
            metric="score", mode="max", max_concurrent_trials=2,
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration", perturbation_interval=2, synch=True,
                resample_probability=0.0, hyperparam_mutations={"lr": ftnb.uniform(0.01, 10.0)})),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="pbt", verbose=0,
                                  stop={"training_iteration": ITERATIONS}, executor="inprocess"),
    ).fit()
    assert not results.errors
    entries = _check_exploits(tmp_path / "pbt")
    assert [e["iteration"] for e in entries] == [2, 4, 6]  # one per point (a quarter of 4)
    assert all(e["donor_checkpoint_iteration"] == e["iteration"] for e in entries)
    paused = 0
    for trial in _state(tmp_path / "pbt").trials:
        # Its attempts ended and resumed at perturbation points only (the last of the
        # population to reach a point goes on without a pause).
        starts = [a.start_iteration for a in trial.attempts]
        assert all(i % 2 == 0 for i in starts), starts
        paused += len(starts) - 1
    assert paused >= 6, paused  # 3 points, at least 2 waiting trials each


# The same sweep by a driver script that is SIGKILLed and run again: ftnb.run resumes it.
DRIVER = """
import sys, ftnb
from ftnb.schedulers import PopulationBasedTraining
__TRAIN__
ftnb.run(ftnb.with_resources(train, {"cpu": 0.25}), name="pbt", storage_path=sys.argv[1],
         param_space={"lr": ftnb.grid_search(__LRS__), "sleep": 0.05},
         tune_config=ftnb.TuneConfig(
             metric="score", mode="max",
             scheduler=PopulationBasedTraining(
                 time_attr="training_iteration", perturbation_interval=2,
                 quantile_fraction=0.25, resample_probability=0.0,
                 hyperparam_mutations={"lr": ftnb.uniform(0.01, 10.0)})),
         run_config=ftnb.RunConfig(verbose=0, stop={"training_iteration": __ITERATIONS__}))
print("DONE")
""".replace("__TRAIN__", TRAIN).replace("__LRS__", repr(LRS)).replace(
    "__ITERATIONS__", str(ITERATIONS))


RESTORE = """
import sys, ftnb
__TRAIN__
ftnb.Tuner.restore(sys.argv[1] + "/pbt", ftnb.with_resources(train, {"cpu": 0.25}),
                   verbose=0).fit()
print("DONE")
""".replace("__TRAIN__", TRAIN)


def _rows_so_far(exp) -> int:
    return sum(len(result_rows(str(p.parent))) for p in exp.glob("*/result.json"))


def _staged(exp) -> set:
    return {str(p) for p in exp.glob("*/pbt_exploit_*")}


def test_pbt_exploits_survive_three_driver_sigkills(tmp_path):
    exp = tmp_path / "pbt"
    rng = random.Random()
    kills = []
    # 32 reports in all: each driver is killed 1 to 8 reports into its run, or at once when an
    # exploit is staged (decided, its donor's checkpoint copied, not yet carried out).
    for _ in range(3):
        base, more, before = _rows_so_far(exp), rng.randint(1, 8), _staged(exp)
        kills.append(kill_when(
            tmp_path, DRIVER, [str(tmp_path)],
            lambda: (f"staged at {base}" if _staged(exp) - before else None) or (
                _rows_so_far(exp) >= base + more and _rows_so_far(exp)),
            f"{more} more reports after {base}, or an exploit staged"))
    assert "DONE" in run_to_end(tmp_path, DRIVER, [str(tmp_path)])
    _check_exploits(exp)
    state = _state(exp)
    # (A driver killed before its first save, e.g. while its restore staged an exploit it
    # decided from the persisted rows, leaves no session in the state: 2 to 4 of them.)
    assert 2 <= len(state.driver_sessions) <= 4, kills
    # The population's state is whole: every trial scored at its last perturbation point.
    population = state.scheduler["state"]["trials"]
    assert sorted(population) == sorted(t.trial_id for t in state.trials)
    assert all(p["last_score"] is not None and p["finished"] for p in population.values())


# The three moments a SIGKILL can hit an exploit, made to happen exactly: the driver kills
# itself (a real SIGKILL) at its first exploit (1) once the donor's checkpoint is staged, before
# the decision is saved, (2) once the decision is saved, before it is carried out, (3) once the
# trial's record holds the new config and checkpoint, before the state says it was carried out.
KILL_AT = """
import os, signal
import ftnb.core.exploits as exploits

def _die():
    os.kill(os.getpid(), signal.SIGKILL)

point = sys.argv[2]
_stage, _carry_out = exploits.stage, exploits.carry_out
if point == "staged":
    def stage(*args, **kwargs):
        decided = _stage(*args, **kwargs)
        _die()
    exploits.stage = stage
elif point == "decided":
    def carry_out(*args, **kwargs):
        _die()
    exploits.carry_out = carry_out
elif point == "committed":
    def carry_out(paths, trial, decided, persist, guard):
        def persist_then_die(record):
            persist(record)
            _die()
        return _carry_out(paths, trial, decided, persist_then_die, guard)
    exploits.carry_out = carry_out
"""


@pytest.mark.parametrize("point", ["staged", "decided", "committed"])
def test_a_driver_killed_in_each_step_of_an_exploit(tmp_path, point):
    exp = tmp_path / "pbt"
    killing = DRIVER.replace("from ftnb.schedulers import PopulationBasedTraining\n",
                             "from ftnb.schedulers import PopulationBasedTraining\n" + KILL_AT)
    from procs import run_script

    proc = run_script(tmp_path, killing, str(tmp_path), point)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -9, out  # it did exploit, and died there
    staged = [p.name for p in exp.glob("*/pbt_exploit_*")]
    before = _state(exp)
    history = (before.scheduler or {}).get("state", {}).get("history", [])
    # The donor's checkpoint was staged (on a local disk, renamed into place when committed);
    # committed, the one exploit carried out has no staged copy left, but a second one decided
    # in the same batch (two trials at a point together) may still be staged.
    if point == "committed":
        assert len(staged) <= len(history) - 1, (staged, history)
    else:
        assert staged, history
    if point == "staged":
        assert not history  # the decision was never saved: it did not happen
    else:
        # Saved before the trial heard it (two, when two trials reached a point together).
        assert 1 <= len(history) <= 2, history
    if point == "committed":
        # The record holds the exploit already (its trial.json is the newer word).
        committed = []
        for entry in history:
            record = json.loads((exp / entry["trial_id"] / "trial.json").read_text())
            latest = record["latest_checkpoint"] or {}
            if latest.get("exploited_from", {}).get("trial_id") == entry["donor_id"]:
                assert record["config"]["lr"] == pytest.approx(entry["config"]["lr"])
                assert not list((exp / entry["trial_id"]).glob("pbt_exploit_*"))
                committed.append(entry)
        assert len(committed) == 1, history
    # (After the kill between the decision and its carrying out, Tuner.restore without the
    # scheduler: the stored one is rebuilt, its population and the decision with it.)
    finish = RESTORE if point == "decided" else DRIVER
    assert "DONE" in run_to_end(tmp_path, finish, [str(tmp_path)])
    entries = _check_exploits(exp, at_least=0 if point == "staged" else 1)
    # The exploits decided before the kill are carried out, each once (_check_exploits).
    done = {(e["trial_id"], e["iteration"]) for e in entries}
    assert {(e["trial_id"], e["iteration"]) for e in history} <= done


def test_a_trial_that_met_its_stop_criterion_is_not_resumed_past_it(tmp_path):
    """Its last report met RunConfig(stop=...) with a checkpoint, and its driver died before
    seeing it end (the records say RUNNING): the restore ends it there, it runs no more (this
    sweep's driver, killed while PBT's trials end, found trials resumed to a 9th iteration)."""
    run_config = ftnb.RunConfig(storage_path=str(tmp_path), name="stop", verbose=0,
                                stop={"training_iteration": 3}, executor="inprocess")
    ftnb.Tuner(train, param_space={"lr": 1.0, "sleep": 0.0}, run_config=run_config).fit()
    exp = tmp_path / "stop"
    paths = ExperimentPaths.at(str(exp))
    state = ExperimentState.load(paths)
    trial = state.trials[0]
    trial.status, trial.attempts[-1].outcome, trial.attempts[-1].ended = "RUNNING", "running", None
    trial.seq += 10
    (exp / trial.dir_name / "trial.json").write_text(json.dumps(trial.to_json()))
    state.status = "RUNNING"
    state.save(paths, final=True)
    ftnb.Tuner.restore(str(exp), train).fit()
    trial = _state(exp).trials[0]
    assert [r["training_iteration"] for r in result_rows(str(exp / trial.dir_name))] == [1, 2, 3]
    assert trial.status == "TERMINATED" and len(trial.attempts) == 1 and trial.note is None
