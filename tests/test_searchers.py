"""Search algorithms: the Searcher interface, BasicVariantGenerator (points_to_evaluate,
num_samples=-1), ConcurrencyLimiter, OptunaSearch, and the rules that keep a search whole
across a driver's death (ftnb.core.searching), each crash window played out in-process.

Sweeps run on the in-process executor (threads): the behaviour under test is the controller's
and the searcher's, not processes'. tests/test_searchers_crash.py kills real drivers."""

from __future__ import annotations

import json
import os
import time
import warnings

import pytest

import ftnb
from ftnb.core.records import ExperimentState, TrialRecord
from ftnb.core.searching import PersistedSearcher
from ftnb.search import (
    BasicVariantGenerator,
    ConcurrencyLimiter,
    Searcher,
    generate_variants,
    grid_search,
    randint,
    uniform,
)
from ftnb.storage import ExperimentPaths, Storage

optuna = pytest.importorskip("optuna")
from ftnb.search.optuna import OptunaSearch, StorageJournalBackend  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def quadratic(config):
    """loss = (x - target)^2, reported 3 times (each a little worse: a real curve)."""
    for i in range(config.get("n", 3)):
        time.sleep(config.get("sleep", 0))
        ftnb.report({"loss": (config["x"] - config.get("target", 0.3)) ** 2 + 0.001 * i,
                     "started": config.get("t0", 0)})


def _run(tmp_path, name, search_alg=None, num_samples=4, space=None, resources=None, **tune):
    return ftnb.Tuner(
        quadratic, param_space=space if space is not None else {"x": uniform(0, 1)},
        tune_config=ftnb.TuneConfig(metric="loss", mode="min", num_samples=num_samples,
                                    search_alg=search_alg, **tune),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name=name, verbose=0,
                                  executor="inprocess"),
        resources_per_trial=resources,
    ).fit()


def _paths(tmp_path, name="e"):
    return ExperimentPaths.of(Storage(str(tmp_path)), name)


def _study(exp_dir):
    """The study as Optuna itself reads the journal (its own JournalFileBackend)."""
    backend = optuna.storages.journal.JournalFileBackend(str(exp_dir / "optuna_journal.jsonl"))
    return optuna.load_study(study_name="ftnb",
                             storage=optuna.storages.JournalStorage(backend))


# -- the interface --------------------------------------------------------------------------------
class CountingSearcher(Searcher):
    """A user's searcher: x = 0.1, 0.2, ...; remembers what it was told (JSON state)."""

    def __init__(self):
        super().__init__()
        self.n = 0
        self.told = []

    def suggest(self, trial_id):
        self.n += 1
        return {"x": round(0.1 * self.n, 3)}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.told.append(trial_id)

    def get_state(self):
        return {"n": self.n, "told": self.told}

    def set_state(self, state):
        self.n, self.told = state["n"], state["told"]


def test_searcher_validates_and_saves_its_state_as_json(tmp_path):
    with pytest.raises(ValueError, match="mode='avg'"):
        Searcher(mode="avg")
    with pytest.raises(TypeError, match="metric=3"):
        Searcher(metric=3)
    searcher = CountingSearcher()
    searcher.set_search_properties("loss", "min", {})
    assert (searcher.metric, searcher.mode) == ("loss", "min")
    searcher.suggest("a")
    searcher.on_trial_complete("a")
    searcher.save(str(tmp_path / "s.json"))
    assert json.loads((tmp_path / "s.json").read_text())["state"] == {"n": 1, "told": ["a"]}
    other = CountingSearcher()
    other.restore(str(tmp_path / "s.json"))
    assert other.suggest("b") == {"x": 0.2}


def test_a_users_searcher_drives_a_sweep_and_is_told_each_trial_once(tmp_path):
    searcher = CountingSearcher()
    results = _run(tmp_path, "e", search_alg=searcher, num_samples=3,
                   space={"x": uniform(0, 1), "n": 2})
    assert sorted(r.config["x"] for r in results) == [0.1, 0.2, 0.3]
    assert all(r.config["n"] == 2 for r in results)  # the space's constants stay
    assert sorted(searcher.told) == sorted(r.metrics["trial_id"] for r in results)
    saved = json.loads((tmp_path / "e" / "searcher_state.json").read_text())
    assert saved["pending"] == {} and saved["live"] == {} and saved["made"] == 3


def test_tune_config_refuses_bad_search_settings():
    with pytest.raises(TypeError, match="search_alg"):
        ftnb.TuneConfig(search_alg="optuna")
    with pytest.raises(ValueError, match="-1 to sample"):
        ftnb.TuneConfig(num_samples=-2)
    with pytest.raises(TypeError, match="ConcurrencyLimiter"):
        ConcurrencyLimiter({"x": 1}, 2)
    with pytest.raises(ValueError, match="max_concurrent"):
        ConcurrencyLimiter(BasicVariantGenerator(), 0)


# -- BasicVariantGenerator ------------------------------------------------------------------------
def _bvg(space, num_samples, points=None, seed=3):
    bvg = BasicVariantGenerator(points_to_evaluate=points)
    bvg.set_search_properties(None, None, space, num_samples=num_samples, seed=seed)
    return bvg


def test_basic_variant_generator_is_generate_variants_without_points():
    space = {"a": grid_search([1, 2]), "b": randint(0, 100), "c": {"d": uniform(0, 1)}}
    assert _bvg(space, 3).variants() == generate_variants(space, 3, 3)


def test_points_to_evaluate_replace_samples_as_in_ray():
    # Ray's docstring example: four samples make six trials.
    space = {"a": grid_search([1, 2]), "b": randint(0, 3)}
    variants = _bvg(space, 4, points=[{"a": 2, "b": 2}, {"a": 1}, {"b": 2}]).variants()
    assert len(variants) == 6
    assert variants[0] == {"a": 2, "b": 2}
    assert variants[1]["a"] == 1
    assert [(v["a"], v["b"]) for v in variants[2:4]] == [(1, 2), (2, 2)]


def test_endless_generator_goes_on_where_its_state_says():
    space = {"x": uniform(0, 1)}
    first = _bvg(space, -1)
    made = [first.suggest(f"t{i}") for i in range(5)]
    state = json.loads(json.dumps(first.get_state()))
    again = _bvg(space, -1, seed=99)  # a restore: the state's seed wins
    again.set_state(state)
    assert again.suggest("t5") == first.suggest("t5")
    assert len({m["x"] for m in made}) == 5


def test_points_to_evaluate_run_first_in_a_sweep(tmp_path):
    points = [{"x": 0.25}, {"x": 0.75}]
    results = _run(tmp_path, "bvg", BasicVariantGenerator(points_to_evaluate=points),
                   num_samples=4, max_concurrent_trials=1)
    order = sorted(results, key=lambda r: r.metrics["trial_id"])
    assert [r.config["x"] for r in order[:2]] == [0.25, 0.75]
    assert len(results) == 4  # each point replaces a sample

    results = _run(tmp_path, "opt", OptunaSearch(points_to_evaluate=points, seed=0),
                   num_samples=3, max_concurrent_trials=1)
    order = sorted(results, key=lambda r: r.metrics["trial_id"])
    assert [r.config["x"] for r in order[:2]] == [0.25, 0.75]


def test_num_samples_minus_one_ends_with_the_time_budget(tmp_path):
    results = ftnb.Tuner(
        quadratic, param_space={"x": uniform(0, 1), "sleep": 0.05},
        tune_config=ftnb.TuneConfig(num_samples=-1, time_budget_s=1.0, max_concurrent_trials=2),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="endless", verbose=0,
                                  executor="inprocess"),
    ).fit()
    assert results.status == "FINISHED"
    assert len(results) >= 2
    assert all(r.status == "TERMINATED" for r in results)
    state = ExperimentState.load(_paths(tmp_path, "endless"))
    assert state.settings["num_samples"] == -1
    # Every trial made is recorded with its folder; none was made after the budget ran out.
    assert sorted(t.trial_id for t in state.trials) == sorted(
        d for d in os.listdir(tmp_path / "endless") if (tmp_path / "endless" / d).is_dir())


def test_num_samples_minus_one_without_a_bound_warns():
    with pytest.warns(UserWarning, match="time_budget_s"):
        ftnb.Tuner(quadratic, tune_config=ftnb.TuneConfig(num_samples=-1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ftnb.Tuner(quadratic, tune_config=ftnb.TuneConfig(num_samples=-1, time_budget_s=5))


# -- ConcurrencyLimiter ---------------------------------------------------------------------------
def test_concurrency_limiter_says_not_now_and_batches():
    inner = _bvg({"x": uniform(0, 1)}, -1)
    limiter = ConcurrencyLimiter(inner, 2)
    assert limiter.suggest("a") and limiter.suggest("b")
    assert limiter.suggest("c") is None
    limiter.on_trial_complete("a", {"loss": 1})
    assert limiter.suggest("c") is not None

    told = []
    inner = CountingSearcher()
    inner.on_trial_complete = lambda trial_id, result=None, error=False: told.append(trial_id)
    batch = ConcurrencyLimiter(inner, 2, batch=True)
    batch.suggest("a"), batch.suggest("b")
    batch.on_trial_complete("a", {"loss": 1})
    assert told == [] and batch.suggest("c") is None  # the batch is not done
    batch.on_trial_complete("b", {"loss": 2})
    assert told == ["a", "b"] and batch.suggest("c") is not None
    state = json.loads(json.dumps(batch.get_state()))
    assert state["searcher"] == {"n": 3, "told": []}


def _max_overlap(state):
    events = []
    for trial in state.trials:
        for attempt in trial.attempts:
            events += [(attempt.started, 1), (attempt.ended, -1)]
    running = peak = 0
    for _, delta in sorted(events):
        running += delta
        peak = max(peak, running)
    return peak


def test_concurrency_limiter_limits_a_real_sweep(tmp_path):
    # The machine would run 4 at once (a quarter CPU each, max_concurrent_trials=4); the
    # limiter allows 2.
    space = {"x": uniform(0, 1), "sleep": 0.03}
    _run(tmp_path, "lim", ConcurrencyLimiter(BasicVariantGenerator(), 2), num_samples=6,
         space=space, max_concurrent_trials=4, resources={"cpu": 0.25})
    assert _max_overlap(ExperimentState.load(_paths(tmp_path, "lim"))) == 2
    _run(tmp_path, "free", BasicVariantGenerator(), num_samples=6, space=space,
         max_concurrent_trials=4, resources={"cpu": 0.25})
    assert _max_overlap(ExperimentState.load(_paths(tmp_path, "free"))) > 2


# -- OptunaSearch ---------------------------------------------------------------------------------
def _suggested(results):
    return [r.config["x"] for r in sorted(results, key=lambda r: r.metrics["trial_id"])]


def test_optuna_suggestions_follow_the_results(tmp_path):
    """The same seed, two objectives: the startup suggestions (random) are the same; after
    them, TPE's concentrate where each objective is good, unlike random search's."""
    def sweep(name, target, search_alg):
        return _suggested(_run(tmp_path, name, ConcurrencyLimiter(search_alg, 1),
                               num_samples=24, space={"x": uniform(0, 1), "target": target}))

    low = sweep("low", 0.2, OptunaSearch(seed=7, sampler=None))
    high = sweep("high", 0.8, OptunaSearch(seed=7))
    rand = sweep("random", 0.8, BasicVariantGenerator(random_state=7))
    assert low[:10] == high[:10]  # TPE's random start-up: the results did not count yet
    assert low[10:] != high[10:]

    def spread(xs, target):
        return sorted(abs(x - target) for x in xs)[len(xs) // 2]  # the median distance

    assert spread(low[12:], 0.2) < 0.1 and spread(high[12:], 0.8) < 0.1
    assert spread(high[12:], 0.8) < spread(rand[12:], 0.8)


def test_optuna_study_matches_the_trials(tmp_path):
    results = _run(tmp_path, "e", ConcurrencyLimiter(OptunaSearch(seed=1), 2), num_samples=6,
                   space={"x": uniform(0, 1), "model": {"depth": randint(1, 4)}, "n": 3})
    study = _study(tmp_path / "e")
    by_id = {t.user_attrs["ftnb_trial_id"]: t for t in study.trials}
    assert sorted(by_id) == sorted(r.metrics["trial_id"] for r in results)
    for r in results:
        trial = by_id[r.metrics["trial_id"]]
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert trial.value == r.metrics["loss"]
        assert trial.params == {"x": r.config["x"], "model/depth": r.config["model"]["depth"]}
        assert sorted(trial.intermediate_values) == [1, 2, 3]
        assert r.config["n"] == 3


def test_an_optuna_search_prepared_twice_or_used_again_stays_right(tmp_path):
    # ftnb.launch checks the experiment in the caller (preparing the searcher) and its
    # supervisor prepares the same searcher again: not "a space of its own".
    searcher = OptunaSearch(seed=0)
    for _ in range(2):
        PersistedSearcher.prepare(searcher, {"x": uniform(0, 1)}, metric="loss", mode="min",
                                  num_samples=2, seed=None, check_space=True)
    _run(tmp_path, "first", searcher, num_samples=2)
    _run(tmp_path, "second", searcher, num_samples=3)  # its own study, in its own folder
    assert len(_study(tmp_path / "first").trials) == 2
    assert len(_study(tmp_path / "second").trials) == 3


def test_optuna_space_errors_come_before_the_folder(tmp_path):
    for space, match in (({"x": grid_search([1, 2])}, "grid_search"),
                         ({"x": ftnb.randn()}, "randn"),
                         ({"x": ftnb.choice([{"a": 1}])}, "categories")):
        with pytest.raises(ValueError, match=match):
            _run(tmp_path, "bad", OptunaSearch(), space=space)
        assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="space of its own"):
        _run(tmp_path, "bad", OptunaSearch(space={"x": uniform(0, 1)}))
    assert not (tmp_path / "bad").exists()


def test_optuna_define_by_run_space_and_its_restore(tmp_path):
    def space(trial):
        trial.suggest_float("x", 0, 1)
        return {"target": 0.5}

    class StopAfter:  # interrupts the driver after 2 trials ended
        def __init__(self):
            self.n = 0

        def on_trial_complete(self, state, trial):
            self.n += 1
            if self.n == 2:
                raise KeyboardInterrupt

    tuner = ftnb.Tuner(quadratic, tune_config=ftnb.TuneConfig(
        metric="loss", mode="min", num_samples=4, max_concurrent_trials=1,
        search_alg=OptunaSearch(space=space, seed=0)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="dbr", verbose=0,
                                  executor="inprocess"))
    tuner.listeners.append(StopAfter())
    with pytest.raises(KeyboardInterrupt):
        tuner.fit()
    path = str(tmp_path / "dbr")
    with pytest.raises(ftnb.RestoreError, match="search_alg"):
        ftnb.Tuner.restore(path, quadratic)
    results = ftnb.Tuner.restore(path, quadratic, verbose=0,
                                 search_alg=OptunaSearch(space=space, seed=0)).fit()
    assert len(results) == 4 and all(r.config["target"] == 0.5 for r in results)
    assert len({r.config["x"] for r in results}) == 4
    assert sorted(t.user_attrs["ftnb_trial_id"] for t in _study(tmp_path / "dbr").trials) == \
        sorted(r.metrics["trial_id"] for r in results)


# -- the journal over ftnb's storage --------------------------------------------------------------
def test_journal_drops_a_flush_a_dying_writer_left_half_written(tmp_path):
    storage = Storage(str(tmp_path))
    path = storage.join(storage.root, "j.jsonl")
    backend = StorageJournalBackend(storage, path)
    study = optuna.create_study(storage=optuna.storages.JournalStorage(backend), study_name="s")
    study.enqueue_trial({"x": 1.0})
    backend.flush()
    committed = (tmp_path / "j.jsonl").read_bytes()
    study.enqueue_trial({"x": 2.0})
    backend.flush()
    whole = (tmp_path / "j.jsonl").read_bytes()
    # A writer killed in the middle of its second flush: whole lines without their mark, then
    # a torn one.
    lines = whole[len(committed):].splitlines(keepends=True)
    (tmp_path / "j.jsonl").write_bytes(committed + b"".join(lines[:-1]) + lines[-1][:7])
    again = StorageJournalBackend(storage, path)
    assert (tmp_path / "j.jsonl").read_bytes() == committed  # repaired before any append
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(again))
    assert [t.params for t in study.get_trials()] == [{}]  # the first enqueued trial only
    assert len(study.trials) == 1
    assert study.trials[0].system_attrs["fixed_params"] == {"x": 1.0}


def test_journal_on_an_object_store_is_segments_merged_as_a_binary_counter():
    import uuid

    storage = Storage(f"memory://ftnb-test-{uuid.uuid4().hex[:8]}/exp")
    path = storage.join(storage.root, "optuna_journal.jsonl")
    backend = StorageJournalBackend(storage, path)
    study = optuna.create_study(storage=optuna.storages.JournalStorage(backend), study_name="s")
    backend.flush()  # commit 1
    for i in range(6):
        study.enqueue_trial({"x": float(i)})
        backend.flush()  # commits 2..7
    names = [n for n in storage.listdir(storage.root) if n.startswith("optuna_journal.")]
    assert sorted(names) == ["optuna_journal.00000001-00000004.jsonl",
                             "optuna_journal.00000005-00000006.jsonl",
                             "optuna_journal.00000007-00000007.jsonl"]
    # A merge the writer died in: the merged object written, its pieces not deleted yet.
    merged = storage.read_bytes(storage.join(storage.root, names[1])) + storage.read_bytes(
        storage.join(storage.root, names[2]))
    storage.write_atomic(storage.join(storage.root, "optuna_journal.00000005-00000008.jsonl"),
                         merged)
    again = StorageJournalBackend(storage, path)
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(again))
    assert [t.system_attrs["fixed_params"]["x"] for t in study.trials] == [0, 1, 2, 3, 4, 5]
    assert sorted(n for n in storage.listdir(storage.root) if n.startswith("optuna_")) == [
        "optuna_journal.00000001-00000004.jsonl", "optuna_journal.00000005-00000008.jsonl"]


# -- the crash windows of a PersistedSearcher, one by one -----------------------------------------
def _keeper(tmp_path, resuming, searcher=None):
    paths = _paths(tmp_path)
    paths.storage.makedirs(paths.dir)
    searcher = searcher or OptunaSearch(seed=0)
    PersistedSearcher.prepare(searcher, {"x": uniform(0, 1)}, metric="loss", mode="min",
                              num_samples=10, seed=1, check_space=True)
    make = PersistedSearcher.resume if resuming else PersistedSearcher.start
    return make(searcher, paths, {"x": uniform(0, 1)}, num_samples=10, id_prefix="t", seed=1)


def _trial(keeper, trial_id, config, status="PENDING", last=None):
    return TrialRecord(trial_id=trial_id, dir_name=trial_id, config=config, status=status,
                       last_result=last)


def test_a_suggestion_made_durable_by_optuna_only_is_suggested_again_alike(tmp_path):
    keeper = _keeper(tmp_path, False)
    config = keeper.searcher.suggest("t_00000")  # Optuna asked...
    keeper.searcher.flush()  # ...and its journal written; then the driver died
    keeper = _keeper(tmp_path, True)
    assert keeper.unlisted([]) == []
    keeper.recover([], lambda t: [])
    assert keeper.suggest(keeper.trial_id(0)) == config  # the same trial id: the same config
    assert len(_study(tmp_path / "e").trials) == 1


def test_a_suggestion_without_its_trial_is_adopted(tmp_path):
    keeper = _keeper(tmp_path, False)
    config = keeper.suggest("t_00000")
    keeper.hold("t_00000", "dir_0")  # durable; the driver died before the state listed it
    keeper = _keeper(tmp_path, True)
    assert keeper.unlisted(["t_other"]) == [("t_00000", config, "dir_0")]
    keeper.recover([], lambda t: [])
    assert keeper.suggest("t_00001") != config
    keeper.hold("t_00001", "t_00001")
    assert len(_study(tmp_path / "e").trials) == 2


def test_an_ended_trial_is_told_once_whatever_the_moment_of_the_crash(tmp_path):
    keeper = _keeper(tmp_path, False)
    config = keeper.suggest("t_00000")
    keeper.hold("t_00000", "t_00000")
    keeper.recorded("t_00000")
    rows = [{"training_iteration": i, "loss": 1.0 / i} for i in (1, 2, 3)]
    keeper.on_result("t_00000", rows[0])  # told in memory, lost with the driver
    done = _trial(keeper, "t_00000", config, "TERMINATED", rows[-1])
    # 1. The trial's final record was written; the driver died before telling the searcher.
    keeper = _keeper(tmp_path, True)
    keeper.recover([done], lambda t: rows)
    frozen = _study(tmp_path / "e").trials[0]
    assert frozen.state == optuna.trial.TrialState.COMPLETE and frozen.value == 1.0 / 3
    assert frozen.intermediate_values == {1: 1.0, 2: 0.5, 3: 1.0 / 3}
    # 2. Told and written: a restore tells nothing again.
    keeper = _keeper(tmp_path, True)
    keeper.searcher.on_trial_complete = lambda *a, **k: pytest.fail("told twice")
    keeper.recover([done], lambda t: rows)


def test_a_generic_searcher_is_told_once_and_replayed_from_the_rows(tmp_path):
    told = []

    class Recording(CountingSearcher):
        def on_trial_result(self, trial_id, result):
            told.append(("result", trial_id, result["training_iteration"]))

        def on_trial_complete(self, trial_id, result=None, error=False):
            told.append(("complete", trial_id, error))

    keeper = _keeper(tmp_path, False, Recording())
    config = keeper.suggest("t_00000")
    keeper.hold("t_00000", "t_00000")
    keeper.recorded("t_00000")
    rows = [{"training_iteration": i, "loss": 1.0} for i in (1, 2, 3)]
    keeper.on_result("t_00000", rows[0])
    keeper.commit()  # a commit (another trial's suggestion) after iteration 1 was told
    told.clear()
    errored = _trial(keeper, "t_00000", config, "ERRORED", rows[-1])
    keeper = _keeper(tmp_path, True, Recording())
    keeper.recover([errored], lambda t: rows)
    assert told == [("result", "t_00000", 2), ("result", "t_00000", 3),
                    ("complete", "t_00000", True)]
    told.clear()
    keeper = _keeper(tmp_path, True, Recording())
    keeper.recover([errored], lambda t: rows)
    assert told == []


def test_trials_a_searcher_makes_are_named_and_restore_checks_the_search_alg(tmp_path):
    results = ftnb.Tuner(
        quadratic, param_space={"x": uniform(0, 1)},
        tune_config=ftnb.TuneConfig(
            metric="loss", mode="min", num_samples=2, search_alg=OptunaSearch(seed=0),
            trial_name_creator=lambda trial: f"opt_{trial.experiment_tag}",
            trial_dirname_creator=lambda trial: f"dir_{trial.trial_id}"),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="named", verbose=0,
                                  executor="inprocess"),
    ).fit()
    state = ExperimentState.load(_paths(tmp_path, "named"))
    assert [t.dir_name for t in state.trials] == [f"dir_{t.trial_id}" for t in state.trials]
    assert [t.name.split("_")[1] for t in state.trials] == ["0", "1"]
    assert all((tmp_path / "named" / t.dir_name / "result.json").exists() for t in state.trials)
    assert len(results) == 2
    # An experiment whose trials were all made at its start has no searcher to go on with.
    _run(tmp_path, "plain", None, num_samples=2)
    with pytest.raises(ftnb.RestoreError, match="not run with a search algorithm"):
        ftnb.Tuner.restore(str(tmp_path / "plain"), quadratic, search_alg=OptunaSearch())


def test_optuna_search_needs_a_metric_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        ftnb.Tuner(quadratic, param_space={"x": uniform(0, 1)},
                   tune_config=ftnb.TuneConfig(num_samples=2, search_alg=OptunaSearch()),
                   run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="nometric",
                                             verbose=0, executor="inprocess")).fit()
    assert not (tmp_path / "nometric").exists()
    # Optuna distributions, nested or not, make a space of their own.
    space = {"x": optuna.distributions.FloatDistribution(0, 1),
             "m": {"k": optuna.distributions.IntDistribution(1, 3)}}
    results = _run(tmp_path, "dists", OptunaSearch(space=space, seed=0), num_samples=2,
                   space={"n": 2})
    assert all(set(r.config) == {"x", "m", "n"} and 1 <= r.config["m"]["k"] <= 3
               for r in results)


def test_optuna_multi_objective_study(tmp_path):
    def two(config):
        ftnb.report({"loss": (config["x"] - 0.3) ** 2, "size": config["x"]})

    results = ftnb.Tuner(
        two, param_space={"x": uniform(0, 1)},
        tune_config=ftnb.TuneConfig(num_samples=3, search_alg=OptunaSearch(
            metric=["loss", "size"], mode=["min", "max"], seed=0)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="multi", verbose=0,
                                  executor="inprocess"),
    ).fit()
    study = optuna.load_study(study_name="ftnb", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "multi" /
                                                       "optuna_journal.jsonl"))))
    by_id = {t.user_attrs["ftnb_trial_id"]: t for t in study.trials}
    for r in results:
        assert by_id[r.metrics["trial_id"]].values == [r.metrics["loss"], r.metrics["size"]]


def test_a_limited_variant_generator_makes_the_whole_grid_each_sample(tmp_path):
    results = _run(tmp_path, "grid", ConcurrencyLimiter(BasicVariantGenerator(), 1),
                   num_samples=2, space={"x": grid_search([0.1, 0.2, 0.3])})
    assert sorted(r.config["x"] for r in results) == [0.1, 0.1, 0.2, 0.2, 0.3, 0.3]


def test_a_trial_the_state_did_not_list_yet_is_restored_from_its_own_record(tmp_path):
    """The driver died after a trial the searcher made had run (its record and results
    written), before a save of the state listed it: a restore records it as it got, and it is
    neither run again nor told twice."""
    _run(tmp_path, "e", OptunaSearch(seed=0), num_samples=3, max_concurrent_trials=1)
    paths = _paths(tmp_path)
    state = ExperimentState.load(paths)
    last = state.trials[-1]
    rows_before = (tmp_path / "e" / last.dir_name / "result.json").read_bytes()
    # The state as it was before a save listed the last trial, the searcher's file as it was
    # when the trial's suggestion was held.
    state.trials = state.trials[:-1]
    state.status = "RUNNING"
    state.save(paths)
    saved = json.loads((tmp_path / "e" / "searcher_state.json").read_text())
    saved["pending"] = {last.trial_id: {"config": last.config, "dir_name": last.dir_name}}
    saved["live"] = {last.trial_id: 0}
    (tmp_path / "e" / "searcher_state.json").write_text(json.dumps(saved))
    # ...and Optuna's study as it was before the trial was told (its last commit dropped).
    journal = tmp_path / "e" / "optuna_journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    commits = [i for i, line in enumerate(lines) if b'"ftnb_commit"' in line]
    journal.write_bytes(b"".join(lines[: commits[-2] + 1]))

    results = ftnb.Tuner.restore(str(tmp_path / "e"), quadratic, verbose=0).fit()
    assert len(results) == 3 and results.status == "FINISHED"
    assert (tmp_path / "e" / last.dir_name / "result.json").read_bytes() == rows_before
    restored = ExperimentState.load(paths).trials[-1]
    assert restored.trial_id == last.trial_id and len(restored.attempts) == 1
    frozen = {t.user_attrs["ftnb_trial_id"]: t for t in _study(tmp_path / "e").trials}
    assert frozen[last.trial_id].state == optuna.trial.TrialState.COMPLETE
    assert sorted(frozen[last.trial_id].intermediate_values) == [1, 2, 3]
    assert len(frozen) == 3


def test_optuna_search_with_asha_tells_stopped_trials_at_their_rung(tmp_path):
    from ftnb.schedulers import ASHAScheduler

    def curve(config):
        for i in range(1, 10):
            ftnb.report({"loss": (config["x"] - 0.3) ** 2 + 1.0 / i})

    results = ftnb.Tuner(
        curve, param_space={"x": uniform(0, 1)},
        tune_config=ftnb.TuneConfig(
            metric="loss", mode="min", num_samples=9,
            search_alg=ConcurrencyLimiter(OptunaSearch(seed=0), 2),
            scheduler=ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)),
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="asha", verbose=0,
                                  executor="inprocess"),
    ).fit()
    by_id = {t.user_attrs["ftnb_trial_id"]: t for t in _study(tmp_path / "asha").trials}
    assert len(by_id) == 9
    iterations = []
    for r in results:
        frozen = by_id[r.metrics["trial_id"]]
        iterations.append(r.metrics["training_iteration"])
        assert frozen.state == optuna.trial.TrialState.COMPLETE
        assert frozen.value == r.metrics["loss"]  # its last result, as Ray tells it
        assert sorted(frozen.intermediate_values) == list(
            range(1, r.metrics["training_iteration"] + 1))
    assert min(iterations) < 9 and max(iterations) == 9  # ASHA stopped some at a rung


def test_optuna_evaluated_rewards_are_in_the_study_not_run(tmp_path):
    results = _run(tmp_path, "warm", OptunaSearch(points_to_evaluate=[{"x": 0.31}],
                                                  evaluated_rewards=[0.0001], seed=0),
                   num_samples=2)
    assert len(results) == 2 and all(r.config["x"] != 0.31 for r in results)
    trials = _study(tmp_path / "warm").trials
    warm = [t for t in trials if "ftnb_trial_id" not in t.user_attrs]
    assert [(t.params, t.value) for t in warm] == [({"x": 0.31}, 0.0001)]
    assert len(trials) == 3


def test_restore_refuses_another_search_algorithm(tmp_path):
    _run(tmp_path, "one", OptunaSearch(seed=0), num_samples=1)
    with pytest.raises(ftnb.RestoreError, match="another one"):
        ftnb.Tuner.restore(str(tmp_path / "one"), quadratic, search_alg=BasicVariantGenerator())
    ftnb.Tuner.restore(str(tmp_path / "one"), quadratic, search_alg=OptunaSearch(seed=0))


def test_a_suggestion_that_never_became_a_trial_is_closed_when_the_search_ends(tmp_path):
    keeper = _keeper(tmp_path, False)
    config = keeper.suggest("t_00000")
    keeper.hold("t_00000", "t_00000")
    keeper.searcher.suggest("t_00001")  # Optuna asked and wrote it; the driver died there
    keeper.searcher.flush()
    keeper = _keeper(tmp_path, True)  # ...and the restored experiment ends (a time budget)
    keeper.close({"t_00000"})
    by_id = {t.user_attrs["ftnb_trial_id"]: t for t in _study(tmp_path / "e").trials}
    assert by_id["t_00000"].state == optuna.trial.TrialState.RUNNING  # a trial: left alone
    assert by_id["t_00001"].state == optuna.trial.TrialState.FAIL
    assert "never run" in by_id["t_00001"].user_attrs["ftnb_note"]
    assert config
