"""Each rank of a TorchTrainer group writes its own output files in the trial's folder (rank 0:
the trial's ``stdout``/``stderr``; rank 1: ``stdout.rank1``/``stderr.rank1``), on local
processes and on Ray actors, and a group's error.txt shows the failing rank's last lines."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

import ftnb  # noqa: E402


def rank_1_prints_then_raises(config):
    rank = ftnb.get_context().get_world_rank()
    print(f"rank {rank} starts")
    ftnb.report({"step": 1})
    if rank == 1:
        for i in range(3):
            print(f"rank 1 line {i}")
        print("rank 1 warns on stderr", file=sys.stderr)
        raise ValueError("rank 1 fails on purpose")
    for step in range(2, 600):  # until the group is ended for rank 1's failure
        ftnb.report({"step": step})


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def executor(request):
    if request.param == "local":
        return "local"
    request.getfixturevalue("ray_instance")  # a local Ray of 2 CPUs, this process connected
    from ftnb.execution.ray import RayExecutor

    return RayExecutor()


def test_each_rank_has_its_own_output_and_error_txt_shows_the_failing_ranks(tmp_path, executor):
    trainer = ftnb.TorchTrainer(
        rank_1_prints_then_raises,
        scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ftnb.RunConfig(name="ranks", storage_path=str(tmp_path), verbose=0,
                                  executor=executor,
                                  failure_config=ftnb.FailureConfig(max_failures=0)))
    with pytest.raises(ftnb.TrainingFailedError):
        trainer.fit()
    (trial_dir,) = [p for p in (tmp_path / "ranks").iterdir() if p.is_dir() and p.name != "control"]
    text = {p.name: p.read_text() for p in trial_dir.iterdir()
            if p.name.startswith(("stdout", "stderr", "error.txt"))}

    rank_1_lines = ["rank 1 starts", "rank 1 line 0", "rank 1 line 1", "rank 1 line 2"]
    assert text["stdout.rank1"].splitlines() == rank_1_lines
    assert "rank 1 warns on stderr" in text["stderr.rank1"]
    assert "ValueError: rank 1 fails on purpose" in text["stderr.rank1"]  # its traceback
    # Rank 0's files are where they were, and hold only rank 0's output.
    assert text["stdout"].splitlines() == ["rank 0 starts"]
    assert "rank 1" not in text["stderr"]

    error = text["error.txt"]
    assert "First failing rank: 1" in error
    assert f"Rank 1's stdout: {trial_dir / 'stdout.rank1'}, its last 4 lines:\n" \
           + "\n".join(rank_1_lines) + "\n" in error
    assert (f"Rank 1's stderr: {trial_dir / 'stderr.rank1'}, its last line (then the "
            "traceback above):\nrank 1 warns on stderr\n") in error
    assert error.count("Traceback (most recent call last)") == 1


@pytest.mark.parametrize("where", ["local", "memory"])
def test_last_lines_reads_the_tail_of_an_output_file(tmp_path, where):
    from ftnb.storage import ExperimentPaths, Storage

    root = str(tmp_path) if where == "local" else f"memory://{tmp_path.name}-rank-output"
    paths = ExperimentPaths.of(Storage(root), "exp").trial("t0")
    paths.storage.makedirs(paths.dir)
    paths.storage.write_atomic(paths.rank_stdout(2), "".join(f"line {i}\n" for i in range(500)))
    assert paths.rank_stdout(2).endswith("stdout.rank2") and paths.rank_stderr(0) == paths.stderr
    assert paths.last_lines(paths.rank_stdout(2), 3) == ["line 497", "line 498", "line 499"]
    # From a tail of max_bytes, a line cut by it is left out.
    assert paths.last_lines(paths.rank_stdout(2), 100, max_bytes=20) == ["line 498", "line 499"]
    assert paths.last_lines(paths.rank_stderr(2), 3) == []  # never written
