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
from scripted import result_rows

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
    step = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as f:
                step = json.load(f)["step"]
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
