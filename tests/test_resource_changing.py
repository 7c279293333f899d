"""Dynamic trial resources (issue 31 item 7): ``PlacementGroupFactory``, the Ray names
(``ftnb.experiment.Trial``, ``ftnb.execution.tune_controller.TuneController``),
``ResourceChangingScheduler`` with ``DistributeResources`` / ``DistributeResourcesToTopJob`` /
a function of the user's, first as policy over a fake controller, then on real trial processes
on a machine of 2 CPUs: a trial grows when the other ends (it sees it in
``get_trial_resources()``), each change a restart from its checkpoint and never a failure; and
the same sweep with its driver SIGKILLed twice, re-run to its end with every iteration done
once and the scheduler's state kept."""

from __future__ import annotations

import copy
import json
import pickle
import signal

import pytest
from killed_driver import kill_when, run_to_end
from procs import run_script
from resource_sweeps import executed, grows
from scripted import result_rows

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.execution.placement_groups import PlacementGroupFactory
from ftnb.execution.resources import TrialResources
from ftnb.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    PopulationBasedTraining,
    ResourceChangingScheduler,
    describe_scheduler,
    same_scheduler,
    scheduler_from_description,
)
from ftnb.schedulers.resource_changing_scheduler import (
    DistributeResources,
    DistributeResourcesToTopJob,
)
from ftnb.storage import ExperimentPaths


# -- PlacementGroupFactory ------------------------------------------------------------------------
def test_a_placement_group_factory_sums_its_bundles():
    pgf = PlacementGroupFactory([{"CPU": 1}, {"CPU": 0.5, "GPU": 1}], strategy="SPREAD")
    assert pgf.bundles == [{"CPU": 1}, {"CPU": 0.5, "GPU": 1}]
    assert pgf.required_resources == {"CPU": 1.5, "GPU": 1.0}
    assert pgf.head_cpus == 1.0 and pgf.strategy == "SPREAD"
    assert not pgf.head_bundle_is_empty
    assert PlacementGroupFactory([{}, {"CPU": 2}]).head_bundle_is_empty
    # Also the dict ftnb took before: what with_resources reads, and a report can carry.
    assert pgf == {"cpu": 1.5, "gpu": 1.0} and pgf["cpu"] == 1.5
    assert json.loads(json.dumps(pgf)) == {"cpu": 1.5, "gpu": 1.0}
    assert TrialResources.from_user(pgf).as_dict() == {"cpu": 1.5, "gpu": 1.0}
    # Two factories are equal when their bundles and strategy are.
    same = PlacementGroupFactory([{"cpu": 1}, {"GPU": 1, "CPU": 0.5}], strategy="SPREAD")
    assert same == pgf and hash(same) == hash(pgf)
    assert PlacementGroupFactory([{"CPU": 1.5, "GPU": 1}], strategy="SPREAD") != pgf
    assert pickle.loads(pickle.dumps(pgf)) == pgf and copy.deepcopy(pgf) == pgf
    assert PlacementGroupFactory.from_amounts(2).required_resources == {"CPU": 2.0}
    with pytest.raises(TypeError, match="cannot be changed"):
        pgf["cpu"] = 3


@pytest.mark.parametrize("bundles, strategy, error, words", [
    ({"CPU": 1}, "PACK", TypeError, "must be a list of dicts"),
    ("CPU", "PACK", TypeError, "must be a list of dicts"),
    ([], "PACK", ValueError, "has no bundle"),
    ([{"CPU": 1}, 2], "PACK", TypeError, "bundle 1 is 2"),
    ([{"memory": 10}], "PACK", ValueError, "'memory'"),
    ([{"CPU": -1}], "PACK", ValueError, "CPU=-1"),
    ([{"GPU": True}], "PACK", ValueError, "GPU=True"),
    ([{"CPU": 1, "cpu": 2}], "PACK", ValueError, "twice"),
    ([{"GPU": 0.5}, {"GPU": 1}], "PACK", ValueError, "GPU=1.5"),
    ([{"CPU": 1}], "SIDEWAYS", ValueError, "strategy='SIDEWAYS'"),
])
def test_bad_bundles_are_refused_with_the_fix(bundles, strategy, error, words):
    with pytest.raises(error, match="Fix") as info:
        PlacementGroupFactory(bundles, strategy)
    assert words in str(info.value)


def test_the_ray_names_import():
    from ftnb.execution.tune_controller import TuneController
    from ftnb.experiment import Trial

    assert ftnb.PlacementGroupFactory is PlacementGroupFactory
    assert ftnb.ResourceChangingScheduler is ResourceChangingScheduler
    assert {"get_live_trials", "get_total_resources", "get_trial_resources"} <= set(
        dir(TuneController))
    trial = Trial(_Record("t1", {"CPU": 1}), _Controller([], {}))
    assert trial.trial_id == "t1" and trial.placement_group_factory == PlacementGroupFactory(
        [{"CPU": 1}])
    assert trial.config == {"x": 1}  # (the record's, read through)
    assert not trial.is_finished()


# -- the policy, over a fake controller ----------------------------------------------------------
class _Record:
    def __init__(self, trial_id, bundle, status="RUNNING", score=None):
        self.trial_id = trial_id
        self.config = {"x": 1}
        self.status = status
        self.last_result = None if score is None else {"score": score}
        self.resources = PlacementGroupFactory([bundle])


class _Controller:
    """The view the scheduler gets, as the allocation functions use it."""

    def __init__(self, records, totals):
        self.records = {r.trial_id: r for r in records}
        self.totals = totals
        self.changed = []

    def get_live_trials(self):
        return [r for r in self.records.values() if r.status not in ("TERMINATED", "ERRORED")]

    def get_trial(self, trial_id):
        return self.records[trial_id]

    def get_total_resources(self):
        return self.totals

    def get_trial_resources(self, record):
        return record.resources

    def status_of(self, record):
        return record.status

    def next_pending_trial(self):
        return None

    def resources_problem(self, resources):
        return None if resources.required_resources.get("CPU", 0) <= self.totals["CPU"] else (
            "too many CPUs")

    def change_trial_resources(self, record, resources, by):
        self.changed.append((record.trial_id, resources))
        record.resources = resources


def _decide(function, records, totals, trial_id, result=None, base=None):
    scheduler = ResourceChangingScheduler(resources_allocation_function=function)
    controller = _Controller(records, totals)
    if base is not None:
        scheduler._base_trial_resources = base
    decision = scheduler.on_trial_result(controller, controller.get_trial(trial_id),
                                         result or {"training_iteration": 1, "score": 1})
    return decision, scheduler, controller


@pytest.mark.parametrize("running, totals, increase_by, times, expected_cpu", [
    # Two trials of 0.5 CPU on 2 CPUs: each may grow to its share, 1 CPU.
    ([0.5, 0.5], {"CPU": 2.0, "GPU": 0.0}, {"CPU": 0.5}, -1, 1.0),
    # Alone, it takes all of them; at most increase_by_times steps.
    ([0.5], {"CPU": 2.0, "GPU": 0.0}, {"CPU": 0.5}, -1, 2.0),
    ([0.5], {"CPU": 2.0, "GPU": 0.0}, {"CPU": 0.5}, 1, 1.0),
    # Never past what is free (the other holds 1.5 of 2), never below its base.
    ([0.5, 1.5], {"CPU": 2.0, "GPU": 0.0}, {"CPU": 0.5}, -1, None),
    # The default step is a whole CPU.
    ([1.0], {"CPU": 4.0, "GPU": 0.0}, None, -1, 4.0),
])
def test_distribute_resources_spreads_what_is_free(running, totals, increase_by, times,
                                                   expected_cpu):
    records = [_Record(f"t{i}", {"CPU": cpu}) for i, cpu in enumerate(running)]
    function = DistributeResources(increase_by=increase_by, increase_by_times=times)
    decision, scheduler, _ = _decide(function, records, totals, "t0")
    if expected_cpu is None:
        assert decision == "CONTINUE" and not scheduler._reallocate
        return
    assert decision == "PAUSE"  # (the trial ends at this report, to restart with them)
    assert scheduler._reallocate["t0"].required_resources["CPU"] == expected_cpu
    assert scheduler.base_trial_resources == PlacementGroupFactory([{"CPU": running[0]}])


def test_add_bundles_makes_a_bundle_per_step():
    decision, scheduler, _ = _decide(
        DistributeResources(add_bundles=True, increase_by={"CPU": 0.5}),
        [_Record("t0", {"CPU": 0.5})], {"CPU": 2.0, "GPU": 0.0}, "t0")
    assert scheduler._reallocate["t0"].bundles == [{"CPU": 0.5}] * 4


def test_the_top_job_takes_every_free_cpu():
    records = [_Record("t0", {"CPU": 0.5}, score=1), _Record("t1", {"CPU": 0.5}, score=5)]
    function = DistributeResourcesToTopJob(increase_by={"CPU": 0.5}, metric="score",
                                           mode="max")
    decision, _, _ = _decide(function, records, {"CPU": 2.0, "GPU": 0.0}, "t0",
                             {"training_iteration": 1, "score": 1})
    assert decision == "CONTINUE"  # not the best: keeps what it has
    decision, scheduler, _ = _decide(function, records, {"CPU": 2.0, "GPU": 0.0}, "t1",
                                     {"training_iteration": 1, "score": 5})
    assert scheduler._reallocate["t1"].required_resources["CPU"] == 1.5


def test_a_change_decided_and_not_carried_out_counts_as_used():
    records = [_Record("t0", {"CPU": 0.5}), _Record("t1", {"CPU": 0.5})]
    scheduler = ResourceChangingScheduler(resources_allocation_function=(
        DistributeResourcesToTopJob(increase_by={"CPU": 0.5}, metric="score", mode="max")))
    controller = _Controller(records, {"CPU": 2.0, "GPU": 0.0})
    assert scheduler.on_trial_result(controller, records[0],
                                     {"training_iteration": 1, "score": 5}) == "PAUSE"
    assert scheduler.upcoming_trial_resources(controller, records[0])["cpu"] == 1.5
    records[0].last_result = {"score": 5}
    # t1 is the best now, but t0's 1.5 CPUs are spoken for: nothing is free.
    assert scheduler.on_trial_result(controller, records[1],
                                     {"training_iteration": 1, "score": 10}) == "CONTINUE"


def test_a_change_is_carried_out_once_the_trial_paused_and_kept_in_the_state():
    record = _Record("t0", {"CPU": 0.5})
    decision, scheduler, controller = _decide(
        DistributeResources(increase_by={"CPU": 0.5}), [record], {"CPU": 2.0, "GPU": 0.0},
        "t0")
    assert decision == "PAUSE"
    assert scheduler.choose_trial_to_run(controller) is None  # (its attempt is still ending)
    state = json.loads(json.dumps(scheduler.get_state()))
    rebuilt = ResourceChangingScheduler(
        resources_allocation_function=DistributeResources(increase_by={"CPU": 0.5}))
    rebuilt.set_state(state)  # (a restore)
    record.status = "PAUSED"
    assert rebuilt.choose_trial_to_run(controller) is record
    assert controller.changed == [("t0", PlacementGroupFactory([{"CPU": 2.0}]))]
    record.status = "RUNNING"
    assert rebuilt.choose_trial_to_run(controller) is None and not rebuilt._reallocate
    assert rebuilt.base_trial_resources == PlacementGroupFactory([{"CPU": 0.5}])


def test_the_wrapped_schedulers_stop_stands_and_an_answer_that_never_fits_is_ignored():
    class Stops(FIFOScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            return "STOP"

    scheduler = ResourceChangingScheduler(Stops())
    controller = _Controller([_Record("t0", {"CPU": 1})], {"CPU": 2.0, "GPU": 0.0})
    assert scheduler.on_trial_result(controller, controller.get_trial("t0"),
                                     {"training_iteration": 1}) == "STOP"
    decision, scheduler, _ = _decide(lambda *args: {"CPU": 64}, [_Record("t0", {"CPU": 1})],
                                     {"CPU": 2.0, "GPU": 0.0}, "t0")
    assert decision == "CONTINUE" and not scheduler._reallocate
    with pytest.raises(TypeError, match="returned 'big'"):
        _decide(lambda *args: "big", [_Record("t0", {"CPU": 1})], {"CPU": 2.0}, "t0")


@pytest.mark.parametrize("build, error, words", [
    (lambda: ResourceChangingScheduler(base_scheduler="asha"), TypeError, "base_scheduler="),
    (lambda: ResourceChangingScheduler(resources_allocation_function=3), TypeError,
     "resources_allocation_function=3"),
    (lambda: DistributeResources(increase_by={"TPU": 1}), ValueError, "'TPU'"),
    (lambda: DistributeResources(increase_by={"CPU": 0}), ValueError, "increase_by="),
    (lambda: DistributeResources(increase_by_times=0), ValueError, "increase_by_times=0"),
    (lambda: DistributeResourcesToTopJob(mode="best"), ValueError, "mode='best'"),
])
def test_bad_arguments_are_refused_with_the_fix(build, error, words):
    with pytest.raises(error, match="Fix") as info:
        build()
    assert words in str(info.value)


def test_a_top_job_without_a_metric_is_refused_before_any_trial(tmp_path):
    with pytest.raises(ValueError, match="DistributeResourcesToTopJob ranks trials"):
        ftnb.Tuner(grows, param_space={"n": 1}, tune_config=ftnb.TuneConfig(
            scheduler=ResourceChangingScheduler(
                resources_allocation_function=DistributeResourcesToTopJob())),
            run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="x", verbose=0)).fit()
    assert not (tmp_path / "x").exists()


def test_the_scheduler_is_rebuilt_from_its_description():
    scheduler = ResourceChangingScheduler(
        ASHAScheduler(metric="score", mode="max", max_t=9),
        DistributeResourcesToTopJob(increase_by={"CPU": 0.5}, increase_by_times=2))
    description = json.loads(json.dumps(describe_scheduler(scheduler)))
    rebuilt = scheduler_from_description(description)
    assert isinstance(rebuilt, ResourceChangingScheduler)
    assert isinstance(rebuilt.base_scheduler, ASHAScheduler) and rebuilt.metric == "score"
    assert same_scheduler(description, rebuilt)
    assert not same_scheduler(description, ResourceChangingScheduler())
    # What the controller asks of PBT it asks of the wrapper too.
    pbt = ResourceChangingScheduler(PopulationBasedTraining(
        metric="score", mode="max", hyperparam_mutations={"lr": [0.1, 0.2]}))
    assert pbt._ftnb_exploits and pbt._ftnb_check_space is not None
    assert not scheduler._ftnb_exploits
    with pytest.raises(ValueError, match="lr"):
        pbt._ftnb_check_space({"x": 1})
    # A function of the user's is not recorded: a restore needs it given again.
    assert describe_scheduler(ResourceChangingScheduler(
        resources_allocation_function=lambda *a: None))["settings"] is None


def test_tune_bohb_finds_the_hyperband_for_bohb_it_wraps():
    pytest.importorskip("ConfigSpace")
    from ftnb.schedulers.hb_bohb import HyperBandForBOHB
    from ftnb.search.bohb import TuneBOHB

    hb = HyperBandForBOHB(metric="loss", mode="min", max_t=4)
    searcher = TuneBOHB()
    searcher.set_scheduler(ResourceChangingScheduler(hb))
    assert searcher._scheduler is hb


# -- real trials ---------------------------------------------------------------------------------
def _state(exp) -> ExperimentState:
    return ExperimentState.load(ExperimentPaths.at(str(exp)))


def _check_changes(exp, trial, n_changes_at_least):
    """``trial`` restarted once per recorded change, never as a failure, each iteration
    recorded once, and saw its resources grow from where each change was made."""
    rows = result_rows(str(exp / trial.dir_name))
    assert [r["training_iteration"] for r in rows] == list(range(1, len(rows) + 1))
    changes = trial.resource_changes
    assert len(changes) >= n_changes_at_least, changes
    assert trial.failures == [] and trial.num_failures == 0
    assert len([a for a in trial.attempts if a.outcome != "killed"]) >= len(changes) + 1
    for change in changes:
        assert change["new"]["cpu"] > change["old"]["cpu"]
        assert change["by"] == "ResourceChangingScheduler"
        # The report after the change was made with the new resources.
        after = [r for r in rows if r["training_iteration"] == change["iteration"] + 1]
        assert not after or after[0]["cpu"] >= change["new"]["cpu"], (change, rows)
    cpus = [r["cpu"] for r in rows]
    assert cpus == sorted(cpus)  # they only grew
    return rows


def test_distribute_resources_gives_an_ended_trials_cpus_to_the_other(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_CPUS", "2")
    scheduler = ResourceChangingScheduler(
        resources_allocation_function=DistributeResources(increase_by={"CPU": 0.5}))
    results = ftnb.Tuner(
        ftnb.with_resources(grows, PlacementGroupFactory([{"CPU": 0.5}])),
        # The short trial ends at 3; the long one goes on until it was given both CPUs.
        param_space={"case": ftnb.grid_search([{"n": 3, "until_cpu": 0},
                                                {"n": 6, "until_cpu": 2}])},
        tune_config=ftnb.TuneConfig(scheduler=scheduler, max_concurrent_trials=2),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="grow", verbose=0),
    ).fit()
    assert not results.errors
    state = _state(tmp_path / "grow")
    by_config = {(t.config["case"]["n"], t.config["case"]["until_cpu"]): t
                 for t in state.trials}
    long_rows = _check_changes(tmp_path / "grow", by_config[(6, 2)], 1)
    assert long_rows[0]["cpu"] == 0.5 and long_rows[-1]["cpu"] == 2.0
    for trial in state.trials:
        _check_changes(tmp_path / "grow", trial, 0)
        assert trial.status == "TERMINATED"
        assert sorted(executed(str(tmp_path / "grow" / trial.dir_name))) == list(
            range(1, trial.iteration + 1))  # (each iteration done once)
    assert state.scheduler["state"]["base_trial_resources"] == {"bundles": [{"CPU": 0.5}],
                                                                "strategy": "PACK"}


@pytest.mark.ray
def test_distribute_resources_on_ray_gives_the_actor_the_new_cpus(tmp_path, ray_instance):
    """The same on the Ray executor (a local Ray of 2 CPUs): each change restarts the trial's
    actor with the new CPUs, and Ray's own word for what the actor holds agrees."""
    from ftnb.execution.ray import RayExecutor

    results = ftnb.Tuner(
        ftnb.with_resources(grows, PlacementGroupFactory([{"CPU": 0.5}])),
        param_space={"case": ftnb.grid_search([{"n": 3, "until_cpu": 0},
                                                {"n": 6, "until_cpu": 2}]), "ray": True},
        tune_config=ftnb.TuneConfig(scheduler=ResourceChangingScheduler(
            resources_allocation_function=DistributeResources(increase_by={"CPU": 0.5}))),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="grow", verbose=0,
                                  executor=RayExecutor()),
    ).fit()
    assert not results.errors
    state = _state(tmp_path / "grow")
    for trial in state.trials:
        rows = _check_changes(tmp_path / "grow", trial, 0)
        assert all(r["ray_cpu"] == r["cpu"] for r in rows), rows
    long = next(t for t in state.trials if t.config["case"]["n"] == 6)
    assert result_rows(str(tmp_path / "grow" / long.dir_name))[-1]["cpu"] == 2.0


class Steps(ftnb.Trainable):
    """Counts its steps and reports what ``self.trial_resources`` says."""

    def setup(self, config):
        self.count = 0

    def step(self):
        self.count += 1
        given = self.trial_resources
        return {"count": self.count, "cpu": given.required_resources["CPU"],
                "done": self.count >= 4}

    def save_checkpoint(self, checkpoint_dir):
        return {"count": self.count}

    def load_checkpoint(self, checkpoint):
        self.count = checkpoint["count"]


def two_bundles_from_the_second_report(tune_controller, trial, result, scheduler):
    """A user's allocation function: a second bundle from iteration 2 on."""
    assert trial.placement_group_factory.required_resources["CPU"] in (0.5, 1.0)
    assert trial.trial_id in {t.trial_id for t in tune_controller.get_live_trials()}
    if result["training_iteration"] >= 2:
        return PlacementGroupFactory([{"CPU": 0.5}, {"CPU": 0.5}])
    return None


def test_a_users_function_changes_a_class_trainables_resources(tmp_path, monkeypatch):
    monkeypatch.setenv("FTNB_NUM_CPUS", "2")
    results = ftnb.Tuner(
        ftnb.with_resources(Steps, PlacementGroupFactory([{"CPU": 0.5}])),
        tune_config=ftnb.TuneConfig(scheduler=ResourceChangingScheduler(
            resources_allocation_function=two_bundles_from_the_second_report)),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="user", verbose=0,
            checkpoint_config=ftnb.CheckpointConfig(checkpoint_frequency=1)),
    ).fit()
    assert not results.errors
    (trial,) = _state(tmp_path / "user").trials
    rows = _check_changes(tmp_path / "user", trial, 1)
    assert [r["count"] for r in rows] == [1, 2, 3, 4]  # resumed from its checkpoint
    assert [r["cpu"] for r in rows] == [0.5, 0.5, 1.0, 1.0]
    assert trial.resource_changes[-1]["bundles"] == [{"CPU": 0.5}, {"CPU": 0.5}]
    assert len(trial.resource_changes) == 1  # (the same answer again is no change)


DRIVER = """
import sys, ftnb
from ftnb.schedulers import ResourceChangingScheduler
from ftnb.schedulers.resource_changing_scheduler import DistributeResources
from resource_sweeps import grows

ftnb.run(
    ftnb.with_resources(grows, {"cpu": 0.5}), name="rcs", storage_path=sys.argv[1],
    param_space={"case": ftnb.grid_search([{"n": 8, "until_cpu": 0},
                                            {"n": 30, "until_cpu": 2}]), "sleep": 0.05},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2, scheduler=ResourceChangingScheduler(
        resources_allocation_function=DistributeResources(increase_by={"CPU": 0.5}))),
    run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=0)),
)
print("DONE")
"""


def _changes_recorded(exp) -> int:
    total = 0
    for path in exp.glob("*/trial.json"):
        try:
            total += len(json.loads(path.read_text()).get("resource_changes") or [])
        except ValueError:
            pass  # (being replaced)
    return total


def _rows(exp) -> int:
    return sum(len(result_rows(str(p.parent))) for p in exp.glob("*/result.json"))


def test_a_sigkilled_driver_resumes_the_changes_with_every_iteration_once(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("FTNB_NUM_CPUS", "2")
    exp = tmp_path / "rcs"
    args = [str(tmp_path)]
    # Killed once a change is recorded, then again a few reports into the re-run.
    kill_when(tmp_path, DRIVER, args, lambda: _changes_recorded(exp) >= 1,
              "a resource change recorded")
    kept = {t.trial_id: list(t.resource_changes) for t in _state(exp).trials}
    stored = _state(exp).scheduler["state"]
    assert stored["base_trial_resources"] == {"bundles": [{"CPU": 0.5}], "strategy": "PACK"}
    assert _state(exp).status != "FINISHED"
    base = _rows(exp)
    kill_when(tmp_path, DRIVER, args, lambda: _rows(exp) >= base + 4, "4 more reports")
    assert _state(exp).status != "FINISHED"  # (killed mid-run, both times)
    assert "DONE" in run_to_end(tmp_path, DRIVER, args)

    _check_finished(exp, kept, stored, kills=2)


def _check_finished(exp, kept, stored, kills):
    """The experiment ``exp`` finished with the scheduler's state ``stored`` kept, the
    changes ``kept`` (per trial) standing, and every iteration done once but those past a
    killed driver's last checkpoint (one per kill)."""
    state = _state(exp)
    assert state.status == "FINISHED"
    assert state.scheduler["state"]["base_trial_resources"] == stored["base_trial_resources"]
    assert state.scheduler["state"]["reallocate"] == {}
    by_config = {(t.config["case"]["n"], t.config["case"]["until_cpu"]): t
                 for t in state.trials}
    for trial in state.trials:
        assert trial.status == "TERMINATED"
        rows = _check_changes(exp, trial, 0)
        # The changes recorded before a kill stand (a restore never undoes or redoes one).
        assert trial.resource_changes[: len(kept[trial.trial_id])] == kept[trial.trial_id]
        news = [c["new"] for c in trial.resource_changes]
        assert all(a != b for a, b in zip(news, news[1:])), news
        steps = executed(str(exp / trial.dir_name))
        assert sorted(set(steps)) == list(range(1, len(rows) + 1))
        assert len(steps) - len(set(steps)) <= kills, steps
    assert by_config[(30, 2)].resource_changes[-1]["new"]["cpu"] == 2.0


# The driver SIGKILLs itself at its first resource change: once the change is decided and
# saved, before the trial's record holds it ("decided"), or once the record holds it, before
# the experiment state says so ("committed").
KILL_AT = """
import os, signal, sys
from ftnb.core.scheduling import SchedulerView

_change = SchedulerView.change_trial_resources

def change(self, trial, resources, by):
    if sys.argv[2] == "decided":
        os.kill(os.getpid(), signal.SIGKILL)
    _change(self, trial, resources, by)
    if sys.argv[2] == "committed":
        os.kill(os.getpid(), signal.SIGKILL)

SchedulerView.change_trial_resources = change
"""


@pytest.mark.parametrize("point", ["decided", "committed"])
def test_a_driver_killed_in_each_step_of_a_change(tmp_path, monkeypatch, point):
    monkeypatch.setenv("FTNB_NUM_CPUS", "2")
    exp = tmp_path / "rcs"
    proc = run_script(tmp_path, KILL_AT + DRIVER, str(tmp_path), point)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, out
    state = _state(exp)
    assert state.scheduler["state"]["reallocate"], state.scheduler  # decided, saved
    # (The experiment state was saved before the change: the trials' own records say it.)
    assert _changes_recorded(exp) == (1 if point == "committed" else 0)
    kept = {t.trial_id: json.loads((exp / t.dir_name / "trial.json").read_text()).get(
        "resource_changes", []) for t in state.trials}
    assert "DONE" in run_to_end(tmp_path, KILL_AT + DRIVER, [str(tmp_path), "none"])
    _check_finished(exp, kept, state.scheduler["state"], kills=1)
