"""Any fsspec filesystem works as ``RunConfig(storage_filesystem=...)`` (issue 18): a whole
``fit()``, then a ``Tuner.restore`` that resumes an errored trial from its checkpoint, on a
``DirFileSystem`` over a local folder (an async filesystem wrapping a synchronous one, with real
folders that writes do not create) and on a ``LocalFileSystem(auto_mkdir=False)``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

import ftnb
from ftnb.storage import Storage, call_deadline
from scripted import scripted

# The trial fails for good (max_failures=0) just before step 3, after checkpointing steps 1
# and 2; the restore resumes it from step 2's checkpoint.
CONFIG = {"n": 4, "ckpt_every": 1, "faults": {"1": [3, "raise"]}}


def _filesystem(kind: str, tmp_path):
    """``(storage_filesystem, storage_path)`` of each kind under test."""
    if kind == "dirfs":
        return DirFileSystem(str(tmp_path), fs=LocalFileSystem()), "/runs"
    return LocalFileSystem(auto_mkdir=False), str(tmp_path / "runs")


@pytest.mark.parametrize("kind", ["dirfs", "local_no_auto_mkdir"])
def test_fit_and_restore_through_the_filesystem(kind, tmp_path):
    fs, storage_path = _filesystem(kind, tmp_path)
    grid = ftnb.Tuner(
        scripted,
        param_space=CONFIG,
        tune_config=ftnb.TuneConfig(metric="score", mode="max"),
        run_config=ftnb.RunConfig(
            name="exp", storage_path=storage_path, storage_filesystem=fs, verbose=0,
            failure_config=ftnb.FailureConfig(max_failures=0)),
    ).fit()
    assert [r.status for r in grid] == ["ERRORED"]
    assert grid[0].metrics["score"] == 2
    assert (tmp_path / "runs" / "exp" / "owner.json").is_file()  # the real folder, not elsewhere

    exp_path = f"{storage_path}/exp"
    assert ftnb.Tuner.can_restore(exp_path, storage_filesystem=fs)
    grid = ftnb.Tuner.restore(exp_path, scripted, resume_errored=True,
                              storage_filesystem=fs, verbose=0).fit()
    result = grid[0]
    assert result.status == "TERMINATED", result.error
    assert [r["score"] for r in result.rows] == [1, 2, 3, 4]
    assert result.metrics["resumed_from"] == 2
    with result.checkpoint.as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text()) == {"step": 4}
    assert grid.get_best_result().metrics["score"] == 4
    # Ray Tune's Result.filesystem and Result.from_path, through the same filesystem.
    with result.filesystem.open(f"{result.path}/result.json") as f:
        assert len(f.read().splitlines()) == 4
    again = ftnb.Result.from_path(result.path, storage_filesystem=fs)
    assert again.metrics == result.metrics and len(again.best_checkpoints) == 4


def test_no_call_deadline_for_a_dirfs_over_a_synchronous_filesystem(tmp_path):
    """fsspec's sync wrappers of an async filesystem take ``timeout=``; a DirFileSystem hands
    it to the filesystem it wraps, which a local one refuses."""
    import fsspec

    over_local = DirFileSystem(str(tmp_path), fs=LocalFileSystem())
    assert call_deadline(over_local) == {}
    assert call_deadline(fsspec.filesystem("memory")) == {}
    storage = Storage("/runs", over_local)
    storage.check_writable()
    storage.write_atomic(storage.join(storage.root, "b.json"), b"{}")
    assert storage.read_text(storage.join(storage.root, "b.json")) == "{}"


def test_call_deadline_for_a_dirfs_over_an_async_filesystem():
    from fsspec.asyn import AsyncFileSystem

    class AsyncStore(AsyncFileSystem):
        protocol = "asyncstore"

    inner = AsyncStore(skip_instance_cache=True)
    assert "timeout" in call_deadline(inner, nbytes=1 << 20)
    assert "timeout" in call_deadline(DirFileSystem("/base", fs=inner))
