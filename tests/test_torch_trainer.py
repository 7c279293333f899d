"""TorchTrainer: a group of ranks (real processes, real torch.distributed over gloo) that fails
and restarts as one, whatever happens to a rank: SIGKILL, an exception, SIGSTOP (a hang),
SIGTERM (a preemption), a killed driver. Every iteration is in result.json exactly once, one
failure is counted per group attempt, and no process is left behind."""

from __future__ import annotations

import json
import os
import pathlib
import signal

import pytest

torch = pytest.importorskip("torch")

import ftnb  # noqa: E402
from procs import pid_alive, run_script, wait_for  # noqa: E402

pytestmark = pytest.mark.slow

DRIVER = """
import json, sys
import numpy
import ftnb
from group_trainables import ddp_loop

args = json.loads(sys.argv[1])
trainer = ftnb.TorchTrainer(
    ddp_loop,
    train_loop_config={"dir": args["dir"], "steps": args["steps"], "sleep": args.get("sleep", 0.05)},
    datasets={"numbers": numpy.arange(10)} if args.get("datasets") else None,
    scaling_config=ftnb.ScalingConfig(
        num_workers=args["workers"], resources_per_worker={"CPU": 0.5},
        collective_timeout_s=args.get("timeout", 30.0)),
    run_config=ftnb.RunConfig(
        name="ddp", storage_path=args["storage"], verbose=0,
        failure_config=ftnb.FailureConfig(max_failures=args.get("max_failures", 3),
                                          preemption_grace_period_s=args.get("grace", 30.0))),
)
try:
    result = trainer.fit()
except ftnb.TrainingFailedError as exc:
    print("FAILED", exc, flush=True)
    sys.exit(3)
print("DONE", result.metrics["training_iteration"], flush=True)
"""


class Run:
    """A driver process running the DDP loop, and what its ranks leave in ``folder``."""

    def __init__(self, tmp_path: pathlib.Path, **args) -> None:
        self.folder = tmp_path / "marks"
        self.folder.mkdir(exist_ok=True)
        self.storage = tmp_path / "results"
        self.args = {"dir": str(self.folder), "storage": str(self.storage), **args}
        self.tmp_path = tmp_path
        self.process = None

    def start(self) -> "Run":
        self.process = run_script(self.tmp_path, DRIVER, json.dumps(self.args))
        return self

    def finish(self, timeout: float = 120) -> str:
        out, _ = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, out
        return out

    def progress(self, rank: int) -> tuple[int, int]:
        try:
            attempt, step = (self.folder / f"progress-{rank}").read_text().split()
        except (OSError, ValueError):
            return (0, 0)
        return int(attempt), int(step)

    def wait_step(self, attempt: int, step: int, rank: int = 0, timeout: float = 60) -> None:
        wait_for(lambda: self.progress(rank) >= (attempt, step), timeout,
                 f"rank {rank} past step {step} in attempt {attempt}")

    def pid(self, attempt: int, rank: int) -> int:
        path = self.folder / f"pid-{attempt}-{rank}"
        return int(wait_for(lambda: path.exists() and path.read_text(), 30, f"{path.name}"))

    def all_pids(self) -> list[int]:
        return [int(p.read_text()) for p in self.folder.glob("pid-*")]

    def state(self) -> dict:
        return json.loads((self.storage / "ddp" / "experiment_state.json").read_text())

    def trial(self) -> dict:
        (trial,) = self.state()["trials"]
        return trial

    def iterations(self) -> list[int]:
        trial = self.trial()
        path = self.storage / "ddp" / trial["dir_name"] / "result.json"
        return [json.loads(line)["training_iteration"]
                for line in path.read_text().splitlines() if line.strip()]


def assert_every_iteration_once(run: Run, steps: int) -> None:
    assert run.iterations() == list(range(1, steps + 1))


def assert_no_process_left(run: Run) -> None:
    pids = run.all_pids()
    assert pids
    wait_for(lambda: not any(pid_alive(p) for p in pids), 15, "every rank process to be gone")


@pytest.mark.parametrize("workers", [2, 3])
def test_any_rank_failing_restarts_the_group_from_its_checkpoint(tmp_path, workers):
    steps = 30
    run = Run(tmp_path, workers=workers, steps=steps, max_failures=3).start()
    run.wait_step(1, 4)
    os.kill(run.pid(1, 1), signal.SIGKILL)  # rank 1, mid-run
    run.wait_step(2, 10)
    os.kill(run.pid(2, 0), signal.SIGKILL)  # rank 0, which serves the rendezvous store
    run.wait_step(3, 16)
    (run.folder / "raise-1").write_text("")  # rank 1 raises at its next step
    out = run.finish()
    assert f"DONE {steps}" in out

    trial = run.trial()
    assert trial["status"] == "TERMINATED"
    failures = trial["failures"]
    assert [(f["kind"], f["rank"], f["counted"]) for f in failures] == [
        ("signal", 1, True), ("signal", 0, True), ("exception", 1, True)]
    assert failures[0]["signal"] == "SIGKILL" and failures[1]["signal"] == "SIGKILL"
    assert failures[2]["type"] == "ValueError" and "planned failure in rank 1" in failures[2]["message"]
    assert "planned failure" in failures[2]["traceback"]
    for failure in failures:
        # Every rank is accounted for; the others ended because of the cause, not on their own.
        assert [r["rank"] for r in failure["ranks"]] == list(range(workers))
        others = [r for r in failure["ranks"] if r["rank"] != failure["rank"]]
        assert all(r["ended"] in ("stopped", "peer") for r in others), failure["ranks"]
        assert failure["recovered_s"] is not None and failure["recovered_s"] >= 0
    attempts = trial["attempts"]
    assert len(attempts) == 4 and all(a["num_workers"] == workers for a in attempts)
    assert all(len(a["pids"]) == workers for a in attempts)
    assert [a["restored_from"] is not None for a in attempts] == [False, True, True, True]
    assert_every_iteration_once(run, steps)
    assert_no_process_left(run)
    error_txt = (run.storage / "ddp" / trial["dir_name"] / "error.txt").read_text()
    assert "First failing rank: 1" in error_txt and "ValueError" in error_txt


def test_a_stopped_rank_is_found_hung_and_the_group_restarts(tmp_path):
    steps = 20
    run = Run(tmp_path, workers=2, steps=steps, timeout=3.0, max_failures=1).start()
    run.wait_step(1, 3)
    stopped = run.pid(1, 1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        out = run.finish(timeout=120)
    finally:
        if pid_alive(stopped):
            os.kill(stopped, signal.SIGCONT)
    assert f"DONE {steps}" in out
    (failure,) = run.trial()["failures"]
    assert failure["kind"] == "hang" and failure["rank"] == 1 and failure["counted"]
    assert "collective_timeout_s" in failure["message"]
    assert {r["rank"]: r["ended"] for r in failure["ranks"]}[1] == "hung"
    assert_every_iteration_once(run, steps)
    assert_no_process_left(run)


def test_sigterm_to_one_rank_checkpoints_every_rank_and_counts_nothing(tmp_path):
    steps = 20
    run = Run(tmp_path, workers=2, steps=steps, max_failures=0).start()
    run.wait_step(1, 3)
    os.kill(run.pid(1, 1), signal.SIGTERM)
    out = run.finish()
    assert f"DONE {steps}" in out  # max_failures=0: a counted failure would have ended it
    trial = run.trial()
    (failure,) = trial["failures"]
    assert failure["kind"] == "preemption" and not failure["counted"]
    first, second = trial["attempts"][:2]
    assert first["outcome"] == "preempted"
    # Ended at the first report with a checkpoint after the SIGTERM, on every rank together:
    # the next attempt starts where the first one stopped.
    assert second["start_iteration"] == first["end_iteration"]
    assert_every_iteration_once(run, steps)
    assert_no_process_left(run)


def test_a_killed_driver_is_resumed_by_running_the_same_script_again(tmp_path):
    steps = 30
    run = Run(tmp_path, workers=2, steps=steps, max_failures=0).start()
    run.wait_step(1, 5)
    ranks = [run.pid(1, 0), run.pid(1, 1)]
    run.process.kill()  # SIGKILL the driver
    run.process.wait(10)
    wait_for(lambda: not any(pid_alive(p) for p in ranks), 15, "its ranks to die with it")
    out = run.start().finish()
    assert f"DONE {steps}" in out
    assert len(run.state()["driver_sessions"]) == 2
    trial = run.trial()
    assert trial["status"] == "TERMINATED"
    assert [f for f in trial["failures"] if f["counted"]] == []  # max_failures=0 held
    assert trial["attempts"][-1]["restored_from"] is not None
    assert_every_iteration_once(run, steps)
    assert_no_process_left(run)


SHARDS = """
import json, sys
import numpy, pandas, torch
import ftnb
from group_trainables import shard_loop

args = json.loads(sys.argv[1])
n = 11
datasets = {
    "array": numpy.arange(n),
    "frame": pandas.DataFrame({"id": range(n)}),
    "list": list(range(n)),
    "torch": torch.utils.data.TensorDataset(torch.arange(n)),
    "ref": ftnb.put(numpy.arange(n)),
}
result = ftnb.TorchTrainer(
    shard_loop, train_loop_config={"dir": args["dir"], "names": sorted(datasets)},
    datasets=datasets,
    scaling_config=ftnb.ScalingConfig(num_workers=args["workers"],
                                      resources_per_worker={"CPU": 0.5}),
    run_config=ftnb.RunConfig(name="shards", storage_path=args["storage"], verbose=0),
).fit()
print("DONE", flush=True)
"""


def test_each_rank_gets_a_disjoint_shard_of_every_kind_of_dataset(tmp_path):
    process = run_script(tmp_path, SHARDS, json.dumps(
        {"dir": str(tmp_path), "storage": str(tmp_path / "results"), "workers": 3}))
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    for name in ("array", "frame", "list", "torch", "ref"):
        shards = [json.loads((tmp_path / f"shard-{name}-{r}.json").read_text()) for r in range(3)]
        assert [len(s) for s in shards] == [4, 4, 3], name
        assert sum(shards, []) == list(range(11)), name  # disjoint, covering, in order

    # The datasets are never stored: a restore must be given them again, and says which.
    path = tmp_path / "results" / "shards"
    assert ftnb.TorchTrainer.can_restore(path)
    with pytest.raises(ftnb.RestoreError) as info:
        ftnb.TorchTrainer.restore(path)
    message = str(info.value)
    for name in ("'array'", "'frame'", "'list'", "'ref'", "'torch'"):
        assert name in message
    assert "Fix: TorchTrainer.restore(path, datasets={" in message
    with pytest.raises(ftnb.RestoreError, match="'torch' again"):
        ftnb.TorchTrainer.restore(path, datasets={"array": 1, "frame": 2, "list": 3, "ref": 4})
    assert not ftnb.TorchTrainer.can_restore(tmp_path / "nothing")


TUNER = """
import json, sys
import ftnb
from group_trainables import ddp_loop

args = json.loads(sys.argv[1])
trainer = ftnb.TorchTrainer(
    ddp_loop, scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
grid = ftnb.Tuner(
    trainer,
    param_space={"train_loop_config": {"dir": ftnb.grid_search(args["dirs"]),
                                       "steps": args["steps"], "sleep": 0.02}},
    tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
    run_config=ftnb.RunConfig(name="sweep", storage_path=args["storage"], verbose=0,
                              failure_config=ftnb.FailureConfig(max_failures=1)),
).fit()
print("DONE", [r.status for r in grid], flush=True)
"""


def test_a_tuner_of_groups_restarts_only_the_trial_whose_rank_failed(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for folder in dirs:
        folder.mkdir()
    (dirs[1] / "raise-1").write_text("")  # rank 1 of trial b raises once
    steps = 8
    process = run_script(tmp_path, TUNER, json.dumps(
        {"dirs": [str(d) for d in dirs], "storage": str(tmp_path / "results"), "steps": steps}))
    out, _ = process.communicate(timeout=180)
    assert process.returncode == 0, out
    state = json.loads((tmp_path / "results" / "sweep" / "experiment_state.json").read_text())
    assert state["settings"]["num_workers"] == 2
    by_dir = {t["config"]["train_loop_config"]["dir"]: t for t in state["trials"]}
    healthy, failing = by_dir[str(dirs[0])], by_dir[str(dirs[1])]
    assert healthy["status"] == failing["status"] == "TERMINATED"
    assert healthy["failures"] == [] and len(healthy["attempts"]) == 1
    (failure,) = failing["failures"]
    assert failure["kind"] == "exception" and failure["rank"] == 1
    assert failure["type"] == "ValueError"
    for trial in state["trials"]:
        rows = (tmp_path / "results" / "sweep" / trial["dir_name"] / "result.json").read_text()
        iterations = [json.loads(line)["training_iteration"] for line in rows.splitlines()]
        assert iterations == list(range(1, steps + 1))


RESTORE = """
import json, sys
import numpy
import ftnb

args = json.loads(sys.argv[1])
assert ftnb.TorchTrainer.can_restore(args["path"])
result = ftnb.TorchTrainer.restore(args["path"], datasets={"numbers": numpy.arange(10)}).fit()
print("DONE", result.metrics["training_iteration"], flush=True)
"""


def test_torch_trainer_restore_resumes_a_run_whose_driver_died(tmp_path):
    steps = 25
    run = Run(tmp_path, workers=2, steps=steps, datasets=True, max_failures=0).start()
    run.wait_step(1, 5)
    run.process.kill()
    run.process.wait(10)
    # Only the datasets are given again: the loop comes from trainer.pkl, the rest from the state.
    process = run_script(tmp_path, RESTORE, json.dumps({"path": str(run.storage / "ddp")}),
                         name="restore.py")
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    assert f"DONE {steps}" in out
    trial = run.trial()
    assert trial["status"] == "TERMINATED" and not [f for f in trial["failures"] if f["counted"]]
    assert trial["attempts"][-1]["restored_from"] is not None
    assert_every_iteration_once(run, steps)
    assert_no_process_left(run)


GPU_DRIVER = """
import json, sys
import ftnb
from group_trainables import gpu_loop

args = json.loads(sys.argv[1])
result = ftnb.TorchTrainer(
    gpu_loop, train_loop_config={"dir": args["dir"], "steps": 6},
    scaling_config=ftnb.ScalingConfig(num_workers=2, use_gpu=True),
    run_config=ftnb.RunConfig(name="gpu", storage_path=args["storage"], verbose=0,
                              failure_config=ftnb.FailureConfig(max_failures=1)),
).fit()
print("DONE", result.metrics["training_iteration"], flush=True)
"""


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 GPUs (the device machine); CI has none")
def test_one_gpu_per_rank_with_nccl_and_a_cuda_oom_recovered(tmp_path):
    process = run_script(tmp_path, GPU_DRIVER, json.dumps(
        {"dir": str(tmp_path), "storage": str(tmp_path / "results")}))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out
    assert "DONE 6" in out
    seen = [json.loads((tmp_path / f"gpu-1-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(s["count"] == 1 and s["backend"] == "nccl" for s in seen)
    assert all(s["device"] == "cuda:0" for s in seen)
    assert len({s["visible"] for s in seen}) == 2  # each rank its own GPU
    state = json.loads((tmp_path / "results" / "gpu" / "experiment_state.json").read_text())
    (failure,) = state["trials"][0]["failures"]
    assert failure["kind"] == "oom" and failure["rank"] == 1 and failure["counted"]
    assert failure["type"] == "OutOfMemoryError"


def test_a_launched_trainer_with_datasets_resumes_by_its_resume_line(tmp_path):
    import numpy

    from group_trainables import slow_shard_loop

    storage = tmp_path / "results"
    trainer = ftnb.TorchTrainer(
        slow_shard_loop, train_loop_config={"steps": 15}, datasets={"train": numpy.arange(10)},
        scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ftnb.RunConfig(name="ddp", storage_path=str(storage),
                                  failure_config=ftnb.FailureConfig(max_failures=3)))
    handle = ftnb.launch(trainer, quiet=True)  # the trainer's own RunConfig: name, storage...
    try:
        assert handle.path == str(storage / "ddp")
        assert handle.state().settings["failure_config"]["max_failures"] == 3
        wait_for(lambda: handle.state().trials[0].iteration >= 3, 60, "3 reports")
        supervisor = json.loads(pathlib.Path(handle.paths.supervisor).read_text())["pid"]
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: handle.status() == "INTERRUPTED", 60, "the run to read INTERRUPTED")
        line = handle.resume_line
        assert line == (f"ftnb.attach({handle.path!r}).resume(ftnb.TorchTrainer.restore("
                        f"{handle.path!r}, datasets={{'train': train}}))")
        resumed = eval(line, {"ftnb": ftnb, "train": numpy.arange(10)})  # what a user pastes
        grid = resumed.wait(120)
        (result,) = list(grid)
        assert result.status == "TERMINATED" and result.metrics["n"] == 5  # each rank's half
        iterations = [row["training_iteration"] for row in result.rows]
        assert iterations == list(range(1, 16))
    finally:
        if handle.is_live():
            handle.stop()
