"""report(...) with Ray Train's checkpoint keywords (issue 29): checkpoint_dir_name,
checkpoint_upload_mode SYNC/ASYNC/NO_UPLOAD, delete_local_checkpoint_after_upload,
checkpoint_upload_fn; bad input refused before any work; ASYNC returning at once yet exactly
once: rows visible only once their checkpoint is whole, back pressure, SIGKILLs of the trial and
of the driver mid-upload, on local disk and on the S3 server."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import signal
import tempfile

import pytest

import ftnb
from ftnb.storage import ExperimentPaths, Storage
from ftnb.storage.checkpoint_files import checkpoint_damage
from ftnb.storage.reported_checkpoints import ReportOptionError, check_dir_name, check_upload_mode
from async_checkpoints import async_train
from procs import pid_alive, run_script, wait_for
from scripted import result_rows


def _trial_dir(exp) -> str:
    dirs = [d for d in os.listdir(exp) if os.path.isfile(os.path.join(exp, d, "params.json"))]
    assert len(dirs) == 1, dirs
    return os.path.join(exp, dirs[0])


def _assert_whole_and_exactly_once(storage: Storage, exp_dir: str, trial: str, n: int) -> list:
    """Every listed checkpoint is whole, every iteration 1..n is in result.json once, and no
    temporary copy is left; returns the rows."""
    paths = ExperimentPaths(storage, storage.join(storage.root, exp_dir)).trial(trial)
    rows = paths.read_results()
    assert [r["training_iteration"] for r in rows] == list(range(1, n + 1)), rows
    for name in paths.checkpoint_dirs():
        assert checkpoint_damage(storage, paths.checkpoint(name)) is None, name
    leftovers = [x for x in storage.listdir(paths.dir) if x.startswith(".tmp-")]
    assert not leftovers
    return rows


# ---- options, checked ---------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("name", ["../x", "a/b", "", ".", "..", ".hidden", "/abs", "result.json",
                                  "checkpoint_000001", "stdout", 3])
def test_dir_names_that_leave_the_trial_folder_or_clash_are_refused(name):
    with pytest.raises(ReportOptionError, match="checkpoint_dir_name"):
        check_dir_name(name)


@pytest.mark.unit
def test_upload_modes():
    assert check_upload_mode(None) is ftnb.CheckpointUploadMode.SYNC
    assert check_upload_mode("async") is ftnb.CheckpointUploadMode.ASYNC
    assert ftnb.CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()
    assert not ftnb.CheckpointUploadMode.SYNC.default_delete_local_checkpoint_after_upload()
    with pytest.raises(ReportOptionError, match="checkpoint_upload_mode='LATER'.*ASYNC"):
        check_upload_mode("LATER")
    assert check_dir_name("epoch_0003") == "epoch_0003"


def _bad_report(config):
    case = config["case"]
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "f"), "w").write("x")
        ckpt = ftnb.Checkpoint.from_directory(d)
        kwargs = {
            "mode": dict(checkpoint_upload_mode="LATER"),
            "escape": dict(checkpoint_dir_name="../elsewhere"),
            "fn_not_callable": dict(checkpoint_upload_fn="s3://x"),
            "fn_returns_none": dict(checkpoint_upload_fn=lambda c, n: None),
            "fn_elsewhere": dict(checkpoint_upload_fn=lambda c, n: ftnb.Checkpoint(d)),
            "no_upload_outside": dict(checkpoint_upload_mode=ftnb.CheckpointUploadMode.NO_UPLOAD),
            "delete_not_bool": dict(delete_local_checkpoint_after_upload="yes"),
            "async_fn_returns_none": dict(checkpoint_upload_fn=lambda c, n: None,
                                          checkpoint_upload_mode="ASYNC"),
        }[case]
        ftnb.report({"x": 1}, checkpoint=ckpt, **kwargs)
        ftnb.report({"x": 2})  # (an ASYNC upload's error is raised here, or at the end)


BAD = {"mode": "checkpoint_upload_mode='LATER'", "escape": "checkpoint_dir_name='../elsewhere'",
       "fn_not_callable": "not callable", "fn_returns_none": "returned NoneType",
       "fn_elsewhere": "must be written to the trial's folder",
       "no_upload_outside": "not a folder directly in the trial's folder",
       "delete_not_bool": "delete_local_checkpoint_after_upload='yes'",
       "async_fn_returns_none": "returned NoneType"}


def test_bad_options_fail_the_trial_with_a_clear_error_and_write_nothing(tmp_path):
    grid = ftnb.run(_bad_report, name="bad", storage_path=str(tmp_path),
                    param_space={"case": ftnb.grid_search(sorted(BAD))},
                    run_config=ftnb.RunConfig(verbose=0))
    assert grid.num_errors == len(BAD)
    for result in grid:
        case = result.config["case"]
        assert BAD[case] in str(result.error), (case, str(result.error))
        assert "UsageError" in str(result.error) or "Fix" in str(result.error)
        files = os.listdir(result.path)
        assert not [f for f in files if f.startswith(("checkpoint_", ".tmp-"))], (case, files)
        assert result_rows(result.path) == [], case  # the row with the bad checkpoint is not kept
        attempts = json.load(open(os.path.join(result.path, "trial.json")))["attempts"]
        assert len(attempts) == 1, case  # a usage error is never retried


# ---- names, upload fn, NO_UPLOAD, local deletion -----------------------------------------------


def _named_train(config):
    side = config["side"]
    start = 0
    if ftnb.get_checkpoint() is not None:
        with ftnb.get_checkpoint().as_directory() as d:
            start = int(open(os.path.join(d, "step")).read())
    trial_dir = ftnb.get_context().get_trial_dir()
    for step in range(start, 4):
        name = f"epoch_{step + 1:03d}"
        how = config["how"]
        if how == "no_upload":
            d = os.path.join(trial_dir, name)
            os.makedirs(d)
        else:
            d = tempfile.mkdtemp(dir=side)
        open(os.path.join(d, "step"), "w").write(str(step + 1))
        kwargs = {"checkpoint_dir_name": name}
        if how == "no_upload":
            kwargs = {"checkpoint_upload_mode": ftnb.CheckpointUploadMode.NO_UPLOAD}
            inode = os.stat(os.path.join(d, "step")).st_ino
        elif how == "fn":
            def upload(ckpt, dir_name):
                dest = os.path.join(trial_dir, dir_name)
                shutil.copytree(ckpt.path, dest)
                return ftnb.Checkpoint(dest)
            kwargs["checkpoint_upload_fn"] = upload
        elif how in ("sync_delete", "async_keep"):
            kwargs["delete_local_checkpoint_after_upload"] = how == "sync_delete"
        if how.startswith("async"):
            kwargs["checkpoint_upload_mode"] = ftnb.CheckpointUploadMode.ASYNC
        ftnb.report({"step": step + 1, "resumed_from": start},
                    checkpoint=ftnb.Checkpoint.from_directory(d), **kwargs)
        if how == "no_upload":  # registered where it is, never copied
            assert os.stat(os.path.join(d, "step")).st_ino == inode
        with open(os.path.join(side, f"{how}.local"), "a") as f:
            f.write(f"{d}\n")
        if step + 1 == 2 and ftnb.get_context().attempt == 1:
            raise RuntimeError("fail once after the second checkpoint")


@pytest.mark.parametrize("how", ["sync", "fn", "no_upload", "sync_delete", "async",
                                 "async_keep"])
def test_named_checkpoints_restore_and_local_deletion(tmp_path, how):
    """Checkpoints named by the trainable, written by its upload fn or registered in place, are
    resumed from after a failure (iterations exactly once), and the local folder is deleted
    after the upload when asked (ASYNC's default) and only then."""
    side = tmp_path / "side"
    side.mkdir()
    grid = ftnb.run(_named_train, name="named", storage_path=str(tmp_path / "exp"),
                    param_space={"side": str(side), "how": how},
                    run_config=ftnb.RunConfig(verbose=0,
                                              failure_config=ftnb.FailureConfig(max_failures=1)))
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    result = grid[0]
    rows = _assert_whole_and_exactly_once(Storage(str(tmp_path / "exp")), "named",
                                          os.path.basename(result.path), 4)
    assert [r["checkpoint_dir_name"] for r in rows] == [f"epoch_{i:03d}" for i in range(1, 5)]
    assert [r["resumed_from"] for r in rows] == [0, 0, 2, 2]
    assert result.checkpoint.path.endswith("epoch_004")
    assert sorted(p for p in os.listdir(result.path) if p.startswith("epoch_")) == [
        f"epoch_{i:03d}" for i in range(1, 5)]
    if how != "no_upload":
        local = (side / f"{how}.local").read_text().split()
        deleted = how in ("async", "sync_delete")
        assert [not os.path.exists(p) for p in local] == [deleted] * len(local)


# ---- ASYNC: at once, yet exactly once ------------------------------------------------------------


DRIVER = """
import sys, ftnb
from async_checkpoints import async_train

ftnb.run(async_train, name="up", storage_path=sys.argv[1],
         param_space={"side": sys.argv[2], "n": int(sys.argv[3]), "size": 1 << 16,
                      "gated": True, "kill_after": int(sys.argv[4])},
         run_config=ftnb.RunConfig(verbose=0, failure_config=ftnb.FailureConfig(max_failures=1)))
print("DONE")
"""


def _returned(side, attempt=1) -> list[int]:
    try:
        lines = (side / f"returned.{attempt}").read_text().splitlines()
        return [json.loads(x)["step"] for x in lines]
    except FileNotFoundError:
        return []


def _exp_trial(tmp_path):
    exp = tmp_path / "exp" / "up"
    return wait_for(lambda: exp.exists() and [d for d in exp.iterdir()
                                              if (d / "params.json").exists()],
                    timeout=60, what="the trial's folder")[0]


def test_async_returns_at_once_row_waits_for_a_whole_checkpoint_then_sigkill_mid_upload(
        tmp_path, monkeypatch):
    """ASYNC: report returns while the upload is held (the trainable's TemporaryDirectory is
    gone); the row is not in result.json and the folder not listed until the checkpoint is
    whole; a second checkpoint waits while one is in flight (FTNB_MAX_ASYNC_CHECKPOINTS=1); a
    SIGKILL of the trial mid-upload leaves no listed partial checkpoint, and the retry resumes
    from the last whole one with every iteration exactly once."""
    side = tmp_path / "side"
    side.mkdir()
    proc = run_script(tmp_path, DRIVER, str(tmp_path / "exp"), str(side), "4", "0",
                      env={"FTNB_MAX_ASYNC_CHECKPOINTS": "1"})
    try:
        wait_for(lambda: (side / "uploading.checkpoint_000000").exists() or proc.poll(),
                 timeout=60, what="the first upload, held")
        assert proc.poll() is None, proc.communicate()[0]
        trial = _exp_trial(tmp_path)
        wait_for(lambda: _returned(side) == [1], timeout=30, what="report 1 returned")
        assert result_rows(str(trial)) == []  # not visible: its checkpoint is not whole
        paths = ExperimentPaths(Storage(str(tmp_path / "exp" / "up")),
                                str(tmp_path / "exp" / "up")).trial(trial.name)
        assert paths.checkpoint_dirs() == []
        (side / "open.checkpoint_000000").write_text("")
        wait_for(lambda: (side / "uploading.checkpoint_000001").exists(), timeout=30,
                 what="the second upload, held")
        assert [r["training_iteration"] for r in result_rows(str(trial))] == [1]
        assert paths.checkpoint_dirs() == ["checkpoint_000000"]
        wait_for(lambda: _returned(side) == [1, 2], timeout=30, what="report 2 returned")
        # Back pressure: report 3 waits while checkpoint 2 is in flight.
        with pytest.raises(AssertionError, match="timed out"):
            wait_for(lambda: len(_returned(side)) > 2, timeout=1.5, what="report 3 returned")
        pid = int((side / "pid.1").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)  # mid-upload: checkpoint_000001 holds part of its files
        wait_for(lambda: not pid_alive(pid), timeout=30, what="the trial's death")
        assert (trial / "checkpoint_000001" / "state.json").exists()
        assert paths.checkpoint_dirs() == ["checkpoint_000000"]  # the partial one: not listed
        (side / "open.all").write_text("")
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    rows = _assert_whole_and_exactly_once(Storage(str(tmp_path / "exp")), "up", trial.name, 4)
    assert [r["attempt"] for r in rows] == [1, 2, 2, 2]
    assert [r["resumed_from"] for r in rows] == [0, 1, 1, 1]


def test_async_driver_sigkill_mid_upload_then_rerun(tmp_path):
    """The driver SIGKILLed while an ASYNC upload is held: the re-run lists no partial
    checkpoint, resumes from the last whole one, every iteration exactly once."""
    side = tmp_path / "side"
    side.mkdir()
    proc = run_script(tmp_path, DRIVER, str(tmp_path / "exp"), str(side), "5", "0")
    try:
        (side / "open.checkpoint_000000").write_text("")
        (side / "open.checkpoint_000001").write_text("")
        wait_for(lambda: (side / "uploading.checkpoint_000002").exists(), timeout=60,
                 what="the third upload, held")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    trial = _exp_trial(tmp_path)
    assert [r["training_iteration"] for r in result_rows(str(trial))] == [1, 2]
    (side / "open.all").write_text("")
    proc = run_script(tmp_path, DRIVER, str(tmp_path / "exp"), str(side), "5", "0")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    rows = _assert_whole_and_exactly_once(Storage(str(tmp_path / "exp")), "up", trial.name, 5)
    assert [r["resumed_from"] for r in rows][:2] == [0, 0]
    assert all(r["resumed_from"] == 2 for r in rows[2:]), rows


@pytest.mark.parametrize("where", ["local", "s3"])
def test_async_sigkill_right_after_report_on_real_uploads(tmp_path, where, request):
    """The real upload path (a copy on local disk, a multi-file upload to the S3 server): the
    trial SIGKILLs itself right after an ASYNC report of a 12 MB checkpoint returned; the retry
    resumes from a whole checkpoint and every iteration is in result.json once; retention
    (num_to_keep=2) keeps the last two whole ones; the dead trial's snapshots are swept."""
    side = tmp_path / "side"
    side.mkdir()
    if where == "s3":
        url, fs = request.getfixturevalue("s3_storage")
        run_config = ftnb.RunConfig(storage_path=url, storage_filesystem=fs, name="real",
                                    verbose=0, failure_config=ftnb.FailureConfig(max_failures=1),
                                    checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2))
        storage = Storage(url, fs)
    else:
        run_config = ftnb.RunConfig(storage_path=str(tmp_path / "exp"), name="real", verbose=0,
                                    failure_config=ftnb.FailureConfig(max_failures=1),
                                    checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2))
        storage = Storage(str(tmp_path / "exp"))
    grid = ftnb.Tuner(async_train, param_space={"side": str(side), "n": 5, "size": 12 << 20,
                                                "kill_after": 3},
                      run_config=run_config).fit()
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    trial = posixpath.basename(grid[0].path.rstrip("/"))
    rows = _assert_whole_and_exactly_once(storage, "real", trial, 5)
    second = [r for r in rows if r["attempt"] == 2]
    assert second and all(r["resumed_from"] == second[0]["training_iteration"] - 1
                          for r in second)
    # The last whole checkpoint when it died: 3, or an earlier one while up to 2 were in flight.
    assert second[0]["resumed_from"] in (1, 2, 3)
    paths = ExperimentPaths(storage, storage.join(storage.root, "real")).trial(trial)
    assert paths.checkpoint_dirs() == [r["checkpoint_dir_name"] for r in rows[-2:]]
    dead = (side / "pid.1").read_text().split()[0]
    assert not [n for n in os.listdir(tempfile.gettempdir())
                if n.startswith(f".ftnb-snapshot-{dead}-")]


def test_async_stall_is_bounded_while_sync_waits_for_the_upload(tmp_path):
    """A functional bound, not the benchmark: with an upload fn that takes 1.5 s, SYNC stalls
    the loop for it and ASYNC does not (each report well under the upload's time)."""
    side = tmp_path / "side"
    side.mkdir()
    (side / "open.all").write_text("")

    def slow(config):
        import time

        def upload(ckpt, dir_name):
            time.sleep(1.5)
            dest = os.path.join(ftnb.get_context().get_trial_dir(), dir_name)
            shutil.copytree(ckpt.path, dest)
            return ftnb.Checkpoint(dest)

        inside = []
        for step in range(3):
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "w"), "wb").write(os.urandom(1 << 20))
                started = time.monotonic()
                ftnb.report({"step": step}, checkpoint=ftnb.Checkpoint.from_directory(d),
                            checkpoint_upload_mode=config["mode"], checkpoint_upload_fn=upload)
                inside.append(time.monotonic() - started)
        with open(os.path.join(config["side"], config["mode"]), "w") as f:
            json.dump(inside, f)

    grid = ftnb.run(slow, name="stall", storage_path=str(tmp_path / "exp"),
                    param_space={"side": str(side), "mode": ftnb.grid_search(["SYNC", "ASYNC"])},
                    run_config=ftnb.RunConfig(verbose=0))
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    sync = json.loads((side / "SYNC").read_text())
    asynchronous = json.loads((side / "ASYNC").read_text())
    assert min(sync) >= 1.5
    # The first two go at once (2 may be in flight); the third may wait for the first upload.
    assert max(asynchronous[:2]) < 0.75, asynchronous
    for result in grid:
        assert [r["step"] for r in result_rows(result.path)] == [0, 1, 2]


GROUP_DRIVER = """
import json, sys
import ftnb
from async_checkpoints import group_loop

args = json.loads(sys.argv[1])
try:
    result = ftnb.TorchTrainer(
        group_loop, train_loop_config={"n": 4, "bad_rank": args["bad_rank"]},
        scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ftnb.RunConfig(name="grp", storage_path=args["storage"], verbose=0),
    ).fit()
except ftnb.TrainingFailedError as exc:
    print("FAILED", exc, flush=True)
    sys.exit(3)
print("DONE", result.metrics["training_iteration"], flush=True)
"""


@pytest.mark.parametrize("bad_rank", [None, 1])
def test_every_rank_of_a_torch_trainer_takes_the_keywords(tmp_path, bad_rank):
    """A 2-rank group reporting ASYNC checkpoints from every rank: rank 0's rows are recorded,
    every checkpoint whole with both ranks' files, in order; an unknown mode on rank 1 fails the
    run with its message."""
    proc = run_script(tmp_path, GROUP_DRIVER, json.dumps(
        {"storage": str(tmp_path / "exp"), "bad_rank": bad_rank}))
    out, _ = proc.communicate(timeout=180)
    if bad_rank is not None:
        assert proc.returncode == 3, out
        assert "checkpoint_upload_mode='LATER'" in out or "checkpoint_upload_mode='LATER'" in \
            "".join(p.read_text() for p in (tmp_path / "exp").rglob("error.txt")), out
        return
    assert proc.returncode == 0 and "DONE 4" in out, out
    trial = _trial_dir(str(tmp_path / "exp" / "grp"))
    rows = _assert_whole_and_exactly_once(Storage(str(tmp_path / "exp")), "grp",
                                          os.path.basename(trial), 4)
    assert [r["rank"] for r in rows] == [0, 0, 0, 0]
    for rank in (0, 1):  # both ranks' files, merged into the checkpoint's one folder
        last = os.path.join(trial, rows[-1]["checkpoint_dir_name"], f"state.rank{rank}.json")
        assert json.load(open(last)) == {"step": 4, "rank": rank}


DCP_DRIVER = """
import json, sys
import ftnb
from async_checkpoints import dcp_loop

args = json.loads(sys.argv[1])
try:
    result = ftnb.TorchTrainer(
        dcp_loop, train_loop_config=args["config"],
        scaling_config=ftnb.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ftnb.RunConfig(name="dcp", storage_path=args["storage"], verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
except ftnb.TrainingFailedError as exc:
    print("FAILED", exc, flush=True)
    sys.exit(3)
print("DONE", result.metrics["training_iteration"], result.checkpoint.path, flush=True)
"""


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_rank_sharded_checkpoint_with_torch_distributed_checkpoint(tmp_path, mode):
    """Both ranks of a gloo group save with torch.distributed.checkpoint and report: their files
    merge into one checkpoint (.metadata from rank 0, a .distcp file per rank); after rank 1
    fails, every rank restores the whole folder with dcp.load; rows exactly once, rank 0's."""
    side = tmp_path / "side"
    side.mkdir()
    proc = run_script(tmp_path, DCP_DRIVER, json.dumps(
        {"storage": str(tmp_path / "exp"),
         "config": {"side": str(side), "n": 4, "mode": mode}}))
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "DONE 4" in out, out
    trial = _trial_dir(str(tmp_path / "exp" / "dcp"))
    rows = _assert_whole_and_exactly_once(Storage(str(tmp_path / "exp")), "dcp",
                                          os.path.basename(trial), 4)
    assert [r["rank"] for r in rows] == [0, 0, 0, 0]
    assert [r["attempt"] for r in rows] == [1, 1, 2, 2]
    for name in [r["checkpoint_dir_name"] for r in rows]:
        files = sorted(f for f in os.listdir(os.path.join(trial, name))
                       if not f.startswith(".ftnb"))
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"], (name, files)
    for rank in (0, 1):
        loaded = json.loads((side / f"loaded.2.{rank}").read_text())
        assert loaded["step"] == 2 and loaded["w"] == [float(10 * rank + 2)] * 4
        assert "__0_0.distcp" in loaded["files"] and "__1_0.distcp" in loaded["files"]


def test_two_ranks_writing_one_file_name_is_a_clear_error(tmp_path):
    side = tmp_path / "side"
    side.mkdir()
    proc = run_script(tmp_path, DCP_DRIVER, json.dumps(
        {"storage": str(tmp_path / "exp"),
         "config": {"side": str(side), "n": 2, "mode": "SYNC", "clash": True}}))
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 3, out
    errors = "".join(p.read_text() for p in (tmp_path / "exp").rglob("error.txt")) + out
    assert "ranks 0 and 1 both have the file 'same.txt'" in errors, errors
    trial = _trial_dir(str(tmp_path / "exp" / "dcp"))
    assert not [f for f in os.listdir(trial) if "checkpoint_" in f]  # nothing was written


@pytest.mark.unit
def test_merging_the_ranks_checkpoints_is_decided_the_same_from_the_same_facts():
    from ftnb.storage.rank_checkpoints import merged_checkpoint

    def info(files, name=None, special=False):
        return {"files": files, "dir_name": name, "special": special}

    assert merged_checkpoint([None, None], 3, set()) is None
    only0 = merged_checkpoint([info({"a": [1, 5]}), None], 3, set())
    assert (only0.name, only0.ranks, only0.merged) == ("checkpoint_000003", [0], False)
    same = merged_checkpoint([info({"a": [1, 5], "m": [2, 9]}), info({"a": [1, 5]})], 0, set())
    assert same.ranks == [0, 1] and same.duplicates == {1: ["a"]}  # same bytes: written once
    with pytest.raises(ReportOptionError, match="ranks 0 and 1 both have the file 'a'"):
        merged_checkpoint([info({"a": [1, 5]}), info({"a": [1, 6]})], 0, set())
    with pytest.raises(ReportOptionError, match="too big to compare"):
        merged_checkpoint([info({"a": [9, None]}), info({"a": [9, None]})], 0, set())
    with pytest.raises(ReportOptionError, match="named this report's checkpoint differently"):
        merged_checkpoint([info({}, "x"), info({}, "y")], 0, set())
    with pytest.raises(ReportOptionError, match="upload_fn or NO_UPLOAD"):
        merged_checkpoint([info({"a": [1, 5]}), info({"b": [1, 5]}, special=True)], 0, set())
    named = merged_checkpoint([None, info({"b": [1, 5]}, "epoch_1")], 0, set())
    assert (named.name, named.ranks) == ("epoch_1", [1])
    with pytest.raises(ReportOptionError, match="already named"):
        merged_checkpoint([None, info({"b": [1, 5]}, "epoch_1")], 0, {"epoch_1"})
