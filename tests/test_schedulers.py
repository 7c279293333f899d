"""Trial schedulers as pure policy (issue 18): ASHA, HyperBand and the median stopping rule fed
results by hand, with no process and no controller. Their rungs, cutoffs, brackets and decisions
follow Ray Tune's rules; their state goes through JSON and back unchanged in what it decides;
decision points are the reports that wait; bad arguments are refused with the fix."""

from __future__ import annotations

import json
import math

import pytest

import ftnb
from ftnb.core.records import ExperimentState, TrialRecord
from ftnb.lifecycle.plan_restore import restored_scheduler
from ftnb.lifecycle.stored import RestoreError
from ftnb.schedulers import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    TrialScheduler,
    check_scheduler,
    describe_scheduler,
    initial_record,
    same_scheduler,
    scheduler_from_description,
)
from ftnb.schedulers.async_hyperband import nan_percentile
from ftnb.schedulers.decision_points import DecisionPoints
from ftnb.storage import ExperimentPaths, Storage

CONTINUE, PAUSE, STOP = TrialScheduler.CONTINUE, TrialScheduler.PAUSE, TrialScheduler.STOP


class FakeController:
    """The controller's view a scheduler gets (ftnb.schedulers.SchedulerController), over
    records held here: it notes what the scheduler asks."""

    def __init__(self, *trial_ids: str) -> None:
        self.trials = {t: TrialRecord(trial_id=t, dir_name=t, config={}) for t in trial_ids}
        self.stopped: dict[str, object] = {}
        self.more = True  # (what may_add_trials answers)

    def get_trials(self):
        return list(self.trials.values())

    def get_trial(self, trial_id):
        return self.trials[trial_id]

    def status_of(self, trial):
        return str(trial.status)

    def stop_trial(self, trial, note=None):
        self.stopped[trial.trial_id] = note
        trial.status = "TERMINATED"

    def pause_trial(self, trial):
        trial.status = "PAUSED"

    def next_pending_trial(self):
        return next((t for t in self.trials.values() if t.status == "PENDING"), None)

    def may_add_trials(self):
        return self.more


def _add(scheduler, ctl, *trial_ids):
    for trial_id in trial_ids:
        ctl.trials.setdefault(trial_id, TrialRecord(trial_id=trial_id, dir_name=trial_id,
                                                    config={}))
        scheduler.on_trial_add(ctl, ctl.trials[trial_id])


def _result(scheduler, ctl, trial_id, iteration, loss, attr="training_iteration"):
    return scheduler.on_trial_result(ctl, ctl.trials[trial_id], {attr: iteration, "loss": loss})


# -- ASHA -------------------------------------------------------------------------------------
def test_asha_rungs_are_rays():
    one = ASHAScheduler(metric="loss", mode="min", max_t=27, grace_period=1, reduction_factor=3)
    assert [m for m, _ in one._brackets[0].rungs] == [27, 9, 3, 1]
    two = ASHAScheduler(metric="loss", mode="min", max_t=27, grace_period=1, reduction_factor=3,
                        brackets=2)
    assert [m for m, _ in two._brackets[1].rungs] == [27, 9, 3]
    default = AsyncHyperBandScheduler(metric="loss", mode="min")  # max_t=100, rf=4
    assert [m for m, _ in default._brackets[0].rungs] == [64, 16, 4, 1]


def test_nan_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    for values in ([1.0], [3.0, 1.0, 2.0], [1.0, math.nan, 5.0, 2.5, -1.0], [2.0] * 4):
        for q in (0.0, 50.0, 66.6667, 75.0, 100.0):
            assert nan_percentile(values, q) == pytest.approx(np.nanpercentile(values, q))
    assert math.isnan(nan_percentile([math.nan], 50))


def test_asha_stops_a_trial_below_its_rungs_cutoff_and_keeps_the_rest():
    ctl = FakeController()
    asha = ASHAScheduler(metric="loss", mode="min", max_t=9, grace_period=1, reduction_factor=3)
    _add(asha, ctl, "a", "b", "c", "d")
    assert _result(asha, ctl, "a", 1, 1.0) == CONTINUE  # an empty rung: no cutoff
    assert _result(asha, ctl, "b", 1, 2.0) == STOP  # worse than the 2/3 quantile of {1.0}
    assert _result(asha, ctl, "c", 1, 0.5) == CONTINUE  # cutoff -1.333 (of -1, -2)
    assert _result(asha, ctl, "a", 2, 0.9) == CONTINUE  # between rungs: nothing to decide
    assert _result(asha, ctl, "a", 3, 0.8) == CONTINUE
    assert _result(asha, ctl, "c", 3, 0.85) == STOP  # a's -0.8 is the cutoff at rung 3
    assert _result(asha, ctl, "a", 9, 0.1) == STOP  # max_t: it ran its budget
    assert asha.stop_note(ctl.trials["a"]) is None
    note = asha.stop_note(ctl.trials["b"])
    assert note.startswith("stopped by ASHAScheduler at training_iteration=1: loss=2")
    assert asha.stop_note(ctl.trials["c"]).startswith(
        "stopped by ASHAScheduler at training_iteration=3: loss=0.85")
    # A report without the metric or the time attribute is not judged (Ray's rule).
    assert asha.on_trial_result(ctl, ctl.trials["d"], {"training_iteration": 1}) == CONTINUE


def test_asha_max_mode_and_a_time_attribute_of_the_users():
    ctl = FakeController()
    asha = ASHAScheduler(time_attr="epoch", metric="acc", mode="max", max_t=4, grace_period=2,
                         reduction_factor=2)
    _add(asha, ctl, "a", "b")
    assert asha.on_trial_result(ctl, ctl.trials["a"], {"epoch": 2, "acc": 0.9}) == CONTINUE
    assert asha.on_trial_result(ctl, ctl.trials["b"], {"epoch": 2.5, "acc": 0.5}) == STOP
    assert asha.decision_points(ctl.trials["a"]) == DecisionPoints("epoch", milestones=(2, 4))


def test_asha_state_survives_json_and_decides_the_same():
    ctl = FakeController()
    asha = ASHAScheduler(metric="loss", mode="min", max_t=27, grace_period=1,
                         reduction_factor=3, brackets=3)
    ids = [f"t{i}" for i in range(12)]
    _add(asha, ctl, *ids)
    for i, trial_id in enumerate(ids[:8]):
        _result(asha, ctl, trial_id, 1, (i * 7) % 5 + 0.1 * i)
    saved = json.loads(json.dumps(asha.get_state(), allow_nan=True))
    again = scheduler_from_description(json.loads(json.dumps(describe_scheduler(asha))))
    again.set_state(saved)
    assert again.get_state() == asha.get_state()
    for i, trial_id in enumerate(ids[8:]):
        for it in (1, 3):
            assert (_result(again, ctl, trial_id, it, 0.3 * i) ==
                    _result(asha, ctl, trial_id, it, 0.3 * i))
    # A trial's bracket comes from its id: the same for any scheduler it is added to.
    fresh = ASHAScheduler(metric="loss", mode="min", max_t=27, grace_period=1,
                          reduction_factor=3, brackets=3)
    _add(fresh, ctl, *reversed(ids))
    assert fresh._trial_bracket == asha._trial_bracket
    assert len(set(asha._trial_bracket.values())) > 1


def test_asha_decision_points_are_its_rungs_and_max_t():
    asha = ASHAScheduler(metric="loss", mode="min", max_t=10, grace_period=1,
                         reduction_factor=3)
    points = asha.decision_points(TrialRecord("x", "x", {}))
    assert points == DecisionPoints("training_iteration", milestones=(1, 3, 9, 10))
    waits = [points.reached(i - 1 if i > 1 else None, {"training_iteration": i})
             for i in range(1, 11)]
    assert waits == [i in (1, 3, 9, 10) for i in range(1, 11)]
    # A time attribute that jumps: the first report at or past each milestone.
    timed = DecisionPoints("time_total_s", milestones=(1.0, 3.0))
    assert [timed.reached(p, {"time_total_s": v}) for p, v in
            ((None, 0.4), (0.4, 1.7), (1.7, 2.9), (2.9, 5.0))] == [False, True, False, True]
    every = DecisionPoints("training_iteration", every=4)
    assert [i for i in range(1, 13) if every.reached(i - 1, {"training_iteration": i})] == [4, 8, 12]


# -- HyperBand --------------------------------------------------------------------------------
def test_hyperband_band_layout_is_rays():
    hb = HyperBandScheduler(metric="loss", mode="min", max_t=9, reduction_factor=3)
    ctl = FakeController()
    _add(hb, ctl, *[f"t{i}" for i in range(17)])
    sizes = [(b.s, b.n, b.r, len(b.live)) for b in hb._brackets]
    assert sizes == [(0, 3, 9, 3), (1, 5, 3, 5), (2, 9, 1, 9)]
    assert hb.decision_points(ctl.trials["t3"]) == DecisionPoints("training_iteration",
                                                                    milestones=(3, 9))
    assert hb.decision_points(ctl.trials["t0"]) == DecisionPoints("training_iteration",
                                                                    milestones=(9,))


def test_hyperband_pauses_at_the_milestone_then_halves():
    hb = HyperBandScheduler(metric="loss", mode="min", max_t=3, reduction_factor=3)
    ctl = FakeController()
    _add(hb, ctl, "a", "b", "c", "d", "e")  # a, b: bracket s=0 (r=3); c, d, e: s=1 (r=1)
    assert [len(b.live) for b in hb._brackets] == [2, 3]
    assert _result(hb, ctl, "c", 1, 0.5) == PAUSE
    ctl.trials["c"].status = "PAUSED"
    assert _result(hb, ctl, "d", 1, 0.2) == PAUSE
    ctl.trials["d"].status = "PAUSED"
    # The last of the bracket: d (the best) goes on, c and e (the current) stop.
    assert _result(hb, ctl, "e", 1, 0.9) == STOP
    assert ctl.stopped == {"c": hb.stop_note(ctl.trials["c"])}
    assert hb.stop_note(ctl.trials["c"]).startswith(
        "stopped by HyperBandScheduler at training_iteration=1: loss=0.5")
    assert hb.choose_trial_to_run(ctl) is ctl.trials["a"]  # a PENDING one first (s=0 bracket)
    ctl.trials["a"].status = ctl.trials["b"].status = "RUNNING"
    assert hb.choose_trial_to_run(ctl) is ctl.trials["d"]  # the PAUSED one to resume
    ctl.trials["d"].status = "RUNNING"
    assert _result(hb, ctl, "d", 2, 0.1) == CONTINUE
    assert _result(hb, ctl, "d", 3, 0.05) == STOP  # its last milestone: done
    assert hb.stop_note(ctl.trials["d"]) is None
    # The state goes through JSON and back.
    again = HyperBandScheduler(metric="loss", mode="min", max_t=3, reduction_factor=3)
    again.set_state(json.loads(json.dumps(hb.get_state())))
    assert again.get_state() == hb.get_state()


def test_hyperband_a_trial_that_errors_lets_its_bracket_go_on():
    hb = HyperBandScheduler(metric="loss", mode="min", max_t=3, reduction_factor=3)
    ctl = FakeController()
    _add(hb, ctl, "a", "b", "c", "d", "e")
    for trial_id, loss in (("c", 0.5), ("d", 0.2)):
        assert _result(hb, ctl, trial_id, 1, loss) == PAUSE
        ctl.trials[trial_id].status = "PAUSED"
    ctl.trials["e"].status = "ERRORED"
    hb.on_trial_error(ctl, ctl.trials["e"])
    assert ctl.stopped == {"c": hb.stop_note(ctl.trials["c"])}
    assert hb._brackets[1].to_unpause == ["d"]


# -- median stopping --------------------------------------------------------------------------
def test_median_stopping_rule_stops_below_the_median():
    rule = MedianStoppingRule(time_attr="training_iteration", metric="loss", mode="min",
                              grace_period=2, min_samples_required=2)
    ctl = FakeController()
    _add(rule, ctl, "a", "b", "c", "d")
    for trial in ctl.trials.values():
        trial.status = "RUNNING"  # (none waits to run: none is paused to make room)
    for it in (1, 2, 3):
        assert _result(rule, ctl, "a", it, 1.0 / it) == CONTINUE
        assert _result(rule, ctl, "b", it, 2.0 / it) == CONTINUE
    assert _result(rule, ctl, "c", 1, 9.0) == CONTINUE  # before the grace period
    assert _result(rule, ctl, "c", 2, 8.0) == STOP  # best 8 > median(0.75, 1.5)
    assert rule.stop_note(ctl.trials["c"]).startswith(
        "stopped by MedianStoppingRule at training_iteration=2: best loss=8")
    assert rule.decision_points(ctl.trials["d"]) == DecisionPoints("training_iteration",
                                                                     from_value=2)
    # A report redone after a restart from a checkpoint replaces the one it redoes.
    _result(rule, ctl, "a", 2, 0.4)
    assert rule.get_state()["results"]["a"] == [[1, 1.0], [2, 0.4]]


def test_median_stopping_rule_yields_to_waiting_trials_with_too_few_samples():
    rule = MedianStoppingRule(time_attr="training_iteration", metric="loss", mode="min",
                              grace_period=1, min_samples_required=3, hard_stop=False)
    ctl = FakeController()
    _add(rule, ctl, "a", "b")
    ctl.trials["a"].status = "RUNNING"
    assert _result(rule, ctl, "a", 1, 1.0) == PAUSE  # b waits to run: a yields (Ray's rule)
    ctl.trials["b"].status = "RUNNING"
    assert _result(rule, ctl, "b", 1, 1.0) == CONTINUE  # nobody waits


# -- settings, restore ------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: ASHAScheduler(grace_period=0), "grace_period=0"),
    (lambda: ASHAScheduler(reduction_factor=1), "reduction_factor=1"),
    (lambda: ASHAScheduler(max_t=-3), "max_t=-3"),
    (lambda: ASHAScheduler(brackets=0), "brackets=0"),
    (lambda: ASHAScheduler(mode="best"), "mode='best'"),
    (lambda: ASHAScheduler(grace_period=10, max_t=5), "grace_period=10, max_t=5"),
    (lambda: HyperBandScheduler(reduction_factor=0.5), "reduction_factor=0.5"),
    (lambda: MedianStoppingRule(min_samples_required=0), "min_samples_required=0"),
    (lambda: MedianStoppingRule(hard_stop="yes"), "hard_stop='yes'"),
])
def test_bad_arguments_are_refused_with_the_fix(make, message):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert message in str(info.value) and ("Fix" in str(info.value) or "must" in str(info.value))


def test_tune_config_checks_the_scheduler_before_anything_runs():
    with pytest.raises(TypeError, match="ftnb.schedulers.TrialScheduler"):
        ftnb.TuneConfig(scheduler="asha")
    with pytest.raises(ValueError, match="compares trials by a metric"):
        ftnb.TuneConfig(scheduler=ASHAScheduler())
    with pytest.raises(ValueError, match="differ"):
        ftnb.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(metric="acc",
                                                                          mode="max"))
    config = ftnb.TuneConfig(metric="loss", mode="min", scheduler=ftnb.ASHAScheduler())
    assert (config.scheduler.metric, config.scheduler.mode) == ("loss", "min")
    ftnb.TuneConfig(scheduler=FIFOScheduler())  # compares nothing: needs no metric


class MyScheduler(FIFOScheduler):
    """A scheduler of the user's: not rebuilt from the state, so given again on restore."""


def _stored(tmp_path, scheduler):
    paths = ExperimentPaths.of(Storage(str(tmp_path)), "exp")
    state = ExperimentState(name="exp", trainable="train",
                            settings={"metric": "loss", "mode": "min"})
    if scheduler is not None:
        scheduler.set_search_properties("loss", "min")
        state.scheduler = initial_record(scheduler)
    return paths, state


def test_a_restore_rebuilds_the_scheduler_or_refuses_another(tmp_path):
    asha = ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)
    paths, state = _stored(tmp_path, asha)
    rebuilt = restored_scheduler(paths, state, None)
    assert type(rebuilt) is ASHAScheduler and rebuilt._ftnb_settings() == asha._ftnb_settings()
    same = ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)
    assert restored_scheduler(paths, state, same) is same
    with pytest.raises(RestoreError, match=r"ASHAScheduler\(time_attr='training_iteration'.*"
                                           r"max_t=9.*Fix: leave the scheduler out"):
        restored_scheduler(paths, state, ASHAScheduler(max_t=27))
    with pytest.raises(RestoreError, match="another scheduler"):
        restored_scheduler(paths, state, HyperBandScheduler())
    # Run without one: none is added halfway.
    paths, state = _stored(tmp_path, None)
    assert restored_scheduler(paths, state, None) is None
    with pytest.raises(RestoreError, match="was run without a trial scheduler"):
        restored_scheduler(paths, state, ASHAScheduler())
    # A class of the user's: its state is stored, the class must be given again.
    paths, state = _stored(tmp_path, MyScheduler())
    with pytest.raises(RestoreError, match=r"MyScheduler, a class of your own.*"
                                           r"Tuner.restore\(path, trainable, scheduler="):
        restored_scheduler(paths, state, None)
    mine = MyScheduler()
    assert restored_scheduler(paths, state, mine) is mine
    assert same_scheduler(describe_scheduler(MyScheduler()), mine)


def test_check_scheduler_names_the_argument():
    with pytest.raises(TypeError, match="TuneConfig\\(scheduler=3\\)"):
        check_scheduler(3, None, None)


# -- HyperBandForBOHB -------------------------------------------------------------------------
def _bohb_trials(ctl, scheduler, n):
    _add(scheduler, ctl, *(f"t{i}" for i in range(n)))
    for trial in ctl.trials.values():
        trial.status = "RUNNING"
    return list(ctl.trials.values())


def _pause_all(scheduler, ctl, trials, losses):
    for trial, loss in zip(trials, losses):
        assert _result(scheduler, ctl, trial.trial_id, 1, loss) == PAUSE
        trial.status = "PAUSED"


def test_hyperband_for_bohb_fills_the_aggressive_bracket_first_and_pauses_until_it_is_full():
    from ftnb.schedulers.hb_bohb import HyperBandForBOHB

    scheduler = HyperBandForBOHB(metric="loss", mode="min", max_t=4, reduction_factor=2)
    ctl = FakeController()
    trials = _bohb_trials(ctl, scheduler, 5)
    first = scheduler._brackets[0]
    assert first.s == 2 and first.all_trials == ["t0", "t1", "t2", "t3"]
    assert scheduler._brackets[1].s == 1 and scheduler._brackets[1].all_trials == ["t4"]
    assert scheduler.decision_points(trials[0]).milestones == (1, 2, 4)
    # t0..t2 at milestone 1: paused (the bracket waits for t3), what TuneBOHB sees as paused.
    _pause_all(scheduler, ctl, trials[:3], (0.4, 0.1, 0.3))
    assert scheduler.paused_trials() == {"t0", "t1", "t2"}
    assert scheduler.budget_of("t0", {"training_iteration": 1}) == 1
    assert scheduler.budget_of("t0", {"training_iteration": 3}) is None
    assert scheduler.budget_of("t4", {"training_iteration": 1}) is None  # (bracket 1: 2, 4)
    assert scheduler.choose_trial_to_run(ctl) is None
    # The last one arrives: halving keeps the best 2 (t1 and t3 itself), stops t0 and t2.
    assert _result(scheduler, ctl, "t3", 1, 0.2) == CONTINUE
    assert sorted(ctl.stopped) == ["t0", "t2"] and first.to_unpause == ["t1"]
    assert ctl.stopped["t0"].startswith("stopped by HyperBandForBOHB at training_iteration=1")
    assert scheduler.choose_trial_to_run(ctl).trial_id == "t1"
    assert scheduler.paused_trials() == set()
    # The state is JSON and comes back whole; a rebuilt scheduler is the same.
    again = scheduler_from_description(json.loads(json.dumps(describe_scheduler(scheduler))))
    assert type(again) is HyperBandForBOHB
    again.set_state(json.loads(json.dumps(scheduler.get_state())))
    assert again.get_state() == scheduler.get_state()


def test_hyperband_for_bohb_halves_a_waiting_bracket_once_nothing_runs_and_no_trial_can_come():
    from ftnb.schedulers.hb_bohb import HyperBandForBOHB

    scheduler = HyperBandForBOHB(metric="loss", mode="max", max_t=4, reduction_factor=2)
    ctl = FakeController()
    trials = _bohb_trials(ctl, scheduler, 3)
    _pause_all(scheduler, ctl, trials, (0.5, 0.9, 0.1))
    assert scheduler.choose_trial_to_run(ctl) is None  # more trials may join the bracket
    ctl.more = False
    chosen = scheduler.choose_trial_to_run(ctl)  # halved with the 3 it has: 2 go on
    assert chosen.trial_id == "t0" and list(ctl.stopped) == ["t2"]
