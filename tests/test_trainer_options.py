"""TorchTrainer's options of Ray Train 2.60 that shape a run rather than a rank: real gloo groups
of real processes.

* ``resume_from_checkpoint``: every rank's first ``get_checkpoint()`` is the given checkpoint;
  once the run has a checkpoint of its own (after a driver SIGKILL and a re-run), that one wins,
  and every iteration is in result.json exactly once. A non-Checkpoint or a missing folder is
  refused before anything runs.
* a Tuner over ``ScalingConfig(num_workers=grid_search([1, 2]))``: one trial per world size;
  bad sampled values are refused with ScalingConfig's own errors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import tempfile
import time

import pytest

import ftnb
from killed_driver import kill_when, run_to_end
from scripted import restored_step, result_rows

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")]


def counting_loop(config: dict) -> None:
    """Counts ``step`` up to ``config["steps"]`` from the checkpoint it is given (a
    ``state.json`` of ``{"step": n}``), checkpointing every step from rank 0. Each rank writes
    ``start-<pid>.json`` (the step it started at, its rank and world size) after an all-reduce
    over the group, and ``progress-<rank>`` (the step it has reported) into ``config["out"]``."""
    import torch
    import torch.distributed as dist

    ctx = ftnb.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    step = restored_step()
    total = torch.ones(1)
    dist.all_reduce(total)
    assert int(total.item()) == size == dist.get_world_size()
    out = pathlib.Path(config["out"])
    (out / f"start-{os.getpid()}.json").write_text(
        json.dumps({"step": step, "rank": rank, "size": size}))
    while step < config["steps"]:
        step += 1
        time.sleep(config.get("sleep", 0.0))
        saved = None
        if rank == 0:
            saved = tempfile.mkdtemp()
            with open(os.path.join(saved, "state.json"), "w") as f:
                json.dump({"step": step}, f)
        ftnb.report({"step": step, "size": size},
                    checkpoint=ftnb.Checkpoint.from_directory(saved) if saved else None)
        (out / f"progress-{rank}").write_text(str(step))


def saved_checkpoint(tmp_path: pathlib.Path, step: int) -> ftnb.Checkpoint:
    folder = tmp_path / f"given-{step}"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"step": step}))
    return ftnb.Checkpoint.from_directory(folder)


def starts(out: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("start-*.json"))]


def test_every_rank_starts_at_the_given_checkpoint(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    given = saved_checkpoint(tmp_path, 5)
    result = ftnb.TorchTrainer(
        counting_loop, train_loop_config={"out": str(out), "steps": 8},
        scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ftnb.RunConfig(name="given", storage_path=str(tmp_path / "results"),
                                  verbose=0),
        resume_from_checkpoint=given,
    ).fit()
    assert sorted((s["rank"], s["step"], s["size"]) for s in starts(out)) == [
        (0, 5, 2), (1, 5, 2)]
    assert [row["step"] for row in result_rows(result.path)] == [6, 7, 8]
    # its location is in the state, so a restore needs it no more (a path, never code)
    state = json.loads((tmp_path / "results" / "given" / "experiment_state.json").read_text())
    assert state["settings"]["trainer"]["resume_from_checkpoint"] == given.uri
    assert result.checkpoint.path != given.path  # the run's own, from its last report
    restored = ftnb.TorchTrainer.restore(tmp_path / "results" / "given")
    assert restored.resume_from_checkpoint == given


@pytest.mark.parametrize("value, error, words", [
    ("/some/folder", TypeError, "must be an ftnb.Checkpoint; got str"),
    ({"step": 5}, TypeError, "must be an ftnb.Checkpoint; got dict"),
])
def test_a_non_checkpoint_is_refused_before_anything_runs(tmp_path, value, error, words):
    with pytest.raises(error, match="resume_from_checkpoint") as raised:
        ftnb.TorchTrainer(counting_loop, resume_from_checkpoint=value,
                          run_config=ftnb.RunConfig(storage_path=str(tmp_path)))
    assert words in str(raised.value) and "Fix: resume_from_checkpoint=ftnb.Checkpoint" in str(
        raised.value)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_checkpoint_folder_is_refused_before_anything_runs(tmp_path):
    given = saved_checkpoint(tmp_path, 3)
    (pathlib.Path(given.path) / "state.json").unlink()
    pathlib.Path(given.path).rmdir()
    with pytest.raises(ValueError, match="no such folder") as raised:
        ftnb.TorchTrainer(counting_loop, resume_from_checkpoint=given)
    assert given.path in str(raised.value) and "Fix:" in str(raised.value)


DRIVER = """
import json, sys
import ftnb
from test_trainer_options import counting_loop

args = json.loads(sys.argv[1])
result = ftnb.TorchTrainer(
    counting_loop, train_loop_config={"out": args["out"], "steps": 40, "sleep": 0.1},
    scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
    run_config=ftnb.RunConfig(name="resumed", storage_path=args["storage"], verbose=0),
    resume_from_checkpoint=ftnb.Checkpoint.from_directory(args["given"]),
).fit()
print("DONE", result.metrics["step"], flush=True)
"""


def test_a_killed_driver_resumes_from_the_runs_own_checkpoint(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    given = saved_checkpoint(tmp_path, 10)
    args = [json.dumps({"out": str(out), "storage": str(tmp_path / "results"),
                        "given": given.path})]

    def progress() -> int:
        try:
            return int((out / "progress-0").read_text())
        except (OSError, ValueError):
            return 0

    kill_when(tmp_path, DRIVER, args, lambda: progress() >= 15, "rank 0 past step 15")
    first = starts(out)
    assert sorted((s["rank"], s["step"]) for s in first) == [(0, 10), (1, 10)]
    out_text = run_to_end(tmp_path, DRIVER, args)
    assert "DONE 40" in out_text, out_text
    later = [s for s in starts(out) if s not in first]
    # the re-run starts from the run's own latest checkpoint (past 15), not the given one (10)
    assert len(later) == 2 and len({s["step"] for s in later}) == 1, later
    assert later[0]["step"] >= 15
    trial = next((tmp_path / "results" / "resumed").glob("*/result.json")).parent
    assert [row["step"] for row in result_rows(str(trial))] == list(range(11, 41))


def searching(tmp_path, scaling, name):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    trainer = ftnb.TorchTrainer(
        counting_loop, train_loop_config={"out": str(out), "steps": 2},
        scaling_config=ftnb.ScalingConfig(num_workers=3))
    return ftnb.Tuner(
        trainer, param_space={"scaling_config": scaling},
        run_config=ftnb.RunConfig(name=name, storage_path=str(tmp_path / "results"),
                                  verbose=0))


def test_a_tuner_searches_the_trainers_num_workers(tmp_path):
    grid = searching(tmp_path, ftnb.ScalingConfig(num_workers=ftnb.grid_search([1, 2]),
                                                  resources_per_worker={"CPU": 0.5}),
                     "sizes").fit()
    assert not grid.errors
    by_size = {r.config["scaling_config"]["num_workers"]: r for r in grid}
    assert sorted(by_size) == [1, 2]
    for size, result in by_size.items():
        assert result.config["scaling_config"]["resources_per_worker"] == {"CPU": 0.5}
        # every row was reported by a group of that size (get_world_size() in each rank)
        assert {row["size"] for row in result_rows(result.path)} == {size}
    # each rank of each group saw its own world size after an all-reduce over it
    assert sorted((s["size"], s["rank"]) for s in starts(tmp_path / "out")) == [
        (1, 0), (2, 0), (2, 1)]
    state = json.loads((tmp_path / "results" / "sizes" / "experiment_state.json").read_text())
    assert sorted(a["num_workers"] for t in state["trials"] for a in t["attempts"]) == [1, 2]


@pytest.mark.parametrize("values, words", [
    ([0, -1], "gives a trial num_workers=0: a trial's num_workers must be a whole number >= 1"),
    ([1, -1], "gives a trial num_workers=-1: ScalingConfig(num_workers=-1) must be a whole"),
    ([2, (1, 2)], "gives a trial num_workers=(1, 2)"),
])
def test_bad_listed_values_are_refused_before_anything_runs(tmp_path, values, words):
    with pytest.raises(ValueError) as raised:
        searching(tmp_path, ftnb.ScalingConfig(num_workers=ftnb.grid_search(values)), "bad")
    assert words in str(raised.value) and "Fix:" in str(raised.value), raised.value
    assert not (tmp_path / "results").exists()


def test_domains_only_in_the_searchable_fields_and_only_in_a_tuner(tmp_path):
    with pytest.raises(ValueError, match=r"ScalingConfig\(use_gpu=.*only num_workers and "
                                         r"resources_per_worker may be search domains"):
        ftnb.ScalingConfig(use_gpu=ftnb.choice([True, False]))
    with pytest.raises(ValueError, match=r"holds search domains, which only a Tuner samples"):
        ftnb.TorchTrainer(counting_loop,
                          scaling_config=ftnb.ScalingConfig(num_workers=ftnb.grid_search([1])))
    with pytest.raises(TypeError, match=r"param_space\['scaling_config'\] must be an "
                                        r"ftnb.ScalingConfig; got int"):
        searching(tmp_path, 2, "bad")
    # Ray's dict of the ScalingConfig's arguments: checked the same way
    with pytest.raises(ValueError, match="gives a trial num_workers=0"):
        searching(tmp_path, {"num_workers": ftnb.grid_search([2, 0])}, "bad")
    with pytest.raises(TypeError, match=r"param_space\['scaling_config'\] = .*num_wokers"):
        searching(tmp_path, {"num_wokers": 2}, "bad")
    assert not (tmp_path / "results").exists()


def test_a_bad_sampled_value_errors_its_trial_saying_why(tmp_path):
    grid = searching(tmp_path, ftnb.ScalingConfig(num_workers=ftnb.randint(-3, -1)),
                     "sampled").fit()
    assert len(grid.errors) == 1
    message = str(grid.errors[0])
    assert "gives a trial num_workers=-" in message and "must be a whole number" in message
    assert starts(tmp_path / "out") == []  # no rank ran the loop


SWEEP = """
import json, sys
import ftnb
from test_trainer_options import counting_loop

args = json.loads(sys.argv[1])
trainer = ftnb.TorchTrainer(
    counting_loop, train_loop_config={"out": args["out"], "steps": 30, "sleep": 0.1},
    scaling_config=ftnb.ScalingConfig(resources_per_worker={"CPU": 0.5}))
path = args["storage"] + "/sweep"
if ftnb.Tuner.can_restore(path):  # without the space: the stored scaling_config is used
    grid = ftnb.Tuner.restore(path, trainer, verbose=0).fit()
else:
    grid = ftnb.Tuner(trainer, param_space={"scaling_config": ftnb.ScalingConfig(
        num_workers=ftnb.grid_search([1, 2]), resources_per_worker={"CPU": 0.5})},
        run_config=ftnb.RunConfig(name="sweep", storage_path=args["storage"], verbose=0)).fit()
print("DONE", len(grid.errors), flush=True)
"""


def test_a_killed_sweep_resumes_each_trial_with_its_own_group_size(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    exp = tmp_path / "results" / "sweep"
    args = [json.dumps({"out": str(out), "storage": str(tmp_path / "results")})]

    def both_past_step_3() -> bool:
        counts = [len(result_rows(str(p.parent))) for p in exp.glob("*/result.json")]
        return len(counts) == 2 and min(counts) >= 3

    kill_when(tmp_path, SWEEP, args, both_past_step_3, "both trials past step 3")
    first = starts(out)
    assert "DONE 0" in run_to_end(tmp_path, SWEEP, args)
    later = [s for s in starts(out) if s not in first]
    # every rank of each re-formed group is back at its trial's size, past where it was
    assert sorted((s["size"], s["rank"]) for s in later) == [(1, 0), (2, 0), (2, 1)]
    assert all(s["step"] >= 3 for s in later), later
    for trial in exp.glob("*/result.json"):
        rows = result_rows(str(trial.parent))
        assert [row["step"] for row in rows] == list(range(1, 31))
        assert len({row["size"] for row in rows}) == 1
