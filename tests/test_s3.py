"""ftnb on a real S3-protocol server (moto in server mode, on loopback).

Trials run in their own processes and write their results, checkpoints and output to S3 through
the pickled ``RunConfig(storage_filesystem=...)``; the tests read everything back from S3 with
the filesystem (``fs.cat_file``), never from a local copy.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import signal
import sys
import tempfile
from typing import Optional

import pytest

import ftnb

pytestmark = pytest.mark.s3

# ---- trainables (module level: they travel to the trial processes) -----------------------------

N_ITERS = 6
STATE_FILE = "state.json"

# What each trial of the chaos sweep does on its first attempt, at the start of which step
# (0-based: "at step 2" means after 2 acknowledged reports).
CHAOS_PLANS = {
    "clean": None,
    "raise": 2,
    "sigkill": 3,
    "sigterm": 2,
    "sigkill_early": 0,  # dies before its first checkpoint: restarts from scratch
}


def _save_and_report(step: int, metrics: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, STATE_FILE), "w") as f:
            json.dump({"step": step, "trial_id": ftnb.get_context().trial_id}, f)
        with open(os.path.join(d, "weights.bin"), "wb") as f:
            f.write(bytes([step % 256]) * 1024)
        os.makedirs(os.path.join(d, "sub", "deeper"))
        with open(os.path.join(d, "sub", "deeper", "extra.txt"), "w") as f:
            f.write(f"step {step}")
        ftnb.report(metrics, checkpoint=ftnb.Checkpoint.from_directory(d))


def _restore() -> int:
    """The step to resume from: the one saved in the latest checkpoint, or 0."""
    ckpt = ftnb.get_checkpoint()
    if ckpt is None:
        return 0
    with ckpt.as_directory() as d:
        with open(os.path.join(d, STATE_FILE)) as f:
            saved = json.load(f)
    # A checkpoint of another trial would be a serious mix-up: fail loudly (and not retried
    # into success, as this is checked on every attempt).
    assert saved["trial_id"] == ftnb.get_context().trial_id, saved
    return saved["step"]


def chaos_train(config: dict) -> None:
    ctx = ftnb.get_context()
    start = _restore()
    print(f"[{ctx.trial_id}] attempt {ctx.attempt} starts at step {start}", flush=True)
    print(f"[{ctx.trial_id}] stderr of attempt {ctx.attempt}", file=sys.stderr, flush=True)
    fail_at = CHAOS_PLANS[config["plan"]]
    for step in range(start, N_ITERS):
        if ctx.attempt == 1 and step == fail_at:
            plan = config["plan"]
            if plan == "raise":
                raise RuntimeError(f"injected failure at step {step}")
            if plan.startswith("sigkill"):
                os.kill(os.getpid(), signal.SIGKILL)
            if plan == "sigterm":
                # Preemption: the handler marks the attempt; the next report with a checkpoint
                # ends it, and it is restarted from that checkpoint without counting a failure.
                os.kill(os.getpid(), signal.SIGTERM)
                assert ctx.should_checkpoint and ctx.preempted
        _save_and_report(step + 1, {"step": step + 1, "resumed_from": start})


# Scores reported with each checkpoint by the retention trainable (max is best).
RETENTION_SCORES = [0.5, 0.9, 0.1, 0.3, 0.2]


def retention_train(config: dict) -> None:
    ctx = ftnb.get_context()
    start = _restore()
    for step in range(start, len(RETENTION_SCORES)):
        if config.get("kill_at") == step and ctx.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        _save_and_report(step + 1, {"step": step + 1, "acc": RETENTION_SCORES[step],
                                    "resumed_from": start})


def simple_train(config: dict) -> None:
    for step in range(3):
        _save_and_report(step + 1, {"loss": config["lr"] * (3 - step), "step": step + 1,
                                    "nested": {"a": step}})


def sparse_checkpoint_train(config: dict) -> None:
    """Checkpoints on even iterations only; SIGKILLed on its first attempt right after reporting
    iteration 3 (which has no checkpoint), so iteration 3 must be redone, not duplicated."""
    ctx = ftnb.get_context()
    start = _restore()
    for step in range(start, 5):
        if ctx.attempt == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        metrics = {"step": step + 1, "resumed_from": start}
        if (step + 1) % 2 == 0:
            _save_and_report(step + 1, metrics)
        else:
            ftnb.report(metrics)


def marker_train(config: dict) -> None:
    # Must never run: the storage check fails first.
    with open(config["marker"], "w") as f:
        f.write("ran")


# ---- helpers -----------------------------------------------------------------------------------


def _strip(url: str) -> str:
    return url[len("s3://"):] if url.startswith("s3://") else url


def _state(fs, exp_dir: str) -> dict:
    return json.loads(fs.cat_file(posixpath.join(exp_dir, "experiment_state.json")))


def _rows(fs, trial_dir: str) -> list[dict]:
    data = fs.cat_file(posixpath.join(trial_dir, "result.json")).decode()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def _checkpoint_names(fs, trial_dir: str) -> list[str]:
    return sorted(
        posixpath.basename(p.rstrip("/"))
        for p in fs.ls(trial_dir, detail=False, refresh=True)
        if posixpath.basename(p.rstrip("/")).startswith("checkpoint_")
    )


def _run_config(url: str, fs, name: str, **kwargs) -> ftnb.RunConfig:
    kwargs.setdefault("failure_config", ftnb.FailureConfig(max_failures=2))
    return ftnb.RunConfig(storage_path=url, storage_filesystem=fs, name=name, verbose=0, **kwargs)


def staged_output_train(config: dict) -> None:
    """"quick" fails its first attempt and ends at its second; "slow" waits for the gate."""
    import time

    attempt = ftnb.get_context().attempt
    print(f"{config['kind']} attempt {attempt} prints", flush=True)
    if config["kind"] == "quick":
        if attempt == 1:
            raise RuntimeError("quick fails its first attempt")
        ftnb.report({"done": 1})
        return
    deadline = time.monotonic() + 120
    while not os.path.exists(config["gate"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    ftnb.report({"done": 1})


class _StagedWhenQuickEnds(ftnb.Callback):
    """Lists the driver's staging folders when the quick trial completes, then opens the gate."""

    def __init__(self, temp: str, gate: str) -> None:
        self.temp, self.gate = temp, gate
        self.seen: Optional[list] = None

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        if trial.config["kind"] == "quick":
            self.seen = _staged_folders(self.temp)
            open(self.gate, "w").close()


def _staged_folders(temp: str) -> list:
    return sorted(name for name in os.listdir(temp) if name.startswith("ftnb-staged-"))


# ---- tests -------------------------------------------------------------------------------------


def test_chaos_sweep_on_s3(s3_storage):
    """Trials that raise, are SIGKILLed and are preempted (SIGTERM) all finish, on S3, with every
    iteration exactly once, resumed each time from their latest checkpoint."""
    url, fs = s3_storage
    grid = ftnb.Tuner(
        chaos_train,
        param_space={"plan": ftnb.grid_search(list(CHAOS_PLANS))},
        tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
        run_config=_run_config(url, fs, "chaos"),
    ).fit()

    exp_dir = posixpath.join(_strip(url), "chaos")
    assert grid.experiment_path == f"s3://{exp_dir}"
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    assert grid.status == "FINISHED"

    state = _state(fs, exp_dir)
    assert state["status"] == "FINISHED"
    trials = {t["config"]["plan"]: t for t in state["trials"]}
    assert set(trials) == set(CHAOS_PLANS)

    for plan, trial in trials.items():
        where = f"trial {plan}"
        trial_dir = posixpath.join(exp_dir, trial["dir_name"])
        assert trial["status"] == "TERMINATED", where
        assert trial["iteration"] == N_ITERS, where

        # result.json on S3: iterations 1..N, each exactly once, in order.
        rows = _rows(fs, trial_dir)
        assert [r["training_iteration"] for r in rows] == list(range(1, N_ITERS + 1)), where
        assert [r["step"] for r in rows] == list(range(1, N_ITERS + 1)), where
        # progress.csv mirrors it.
        progress = fs.cat_file(posixpath.join(trial_dir, "progress.csv")).decode().splitlines()
        assert len(progress) == N_ITERS + 1, where

        # Every checkpoint folder is on S3, complete (marker), and matches its report.
        names = _checkpoint_names(fs, trial_dir)
        assert names == [r["checkpoint_dir_name"] for r in rows], where
        for row in rows:
            ckpt_dir = posixpath.join(trial_dir, row["checkpoint_dir_name"])
            marker = json.loads(fs.cat_file(posixpath.join(ckpt_dir, ".ftnb_checkpoint.json")))
            assert marker["training_iteration"] == row["training_iteration"], where
            saved = json.loads(fs.cat_file(posixpath.join(ckpt_dir, STATE_FILE)))
            assert saved == {"step": row["step"], "trial_id": trial["trial_id"]}, where
            assert len(fs.cat_file(posixpath.join(ckpt_dir, "weights.bin"))) == 1024, where
            extra = posixpath.join(ckpt_dir, "sub", "deeper", "extra.txt")
            assert fs.cat_file(extra) == f"step {row['step']}".encode(), where

        # Failure records match what was injected.
        failures = trial["failures"]
        fail_at = CHAOS_PLANS[plan]
        if plan == "clean":
            assert failures == [], where
            expected_attempts = 1
        else:
            assert len(failures) == 1, (where, failures)
            failure = failures[0]
            assert failure["attempt"] == 1, where
            if plan == "raise":
                assert failure["kind"] == "exception", where
                assert failure["type"] == "RuntimeError", where
                assert "injected failure at step 2" in failure["message"], where
                assert failure["counted"] is True, where
                assert failure["iteration"] == fail_at, where
            elif plan.startswith("sigkill"):
                assert failure["kind"] == "signal", where
                assert failure["signal"] == "SIGKILL", where
                assert failure["counted"] is True, where
                assert failure["iteration"] == fail_at, where
            elif plan == "sigterm":
                assert failure["kind"] == "preemption", where
                assert failure["counted"] is False, where
                # The preempted attempt saved one more checkpoint before it left.
                assert failure["iteration"] == fail_at + 1, where
            assert failure["lost_iterations"] == 0, where  # a checkpoint every iteration
            expected_attempts = 2
        attempts = trial["attempts"]
        assert len(attempts) == expected_attempts, (where, attempts)
        assert attempts[-1]["outcome"] == "finished", where

        # Each restart resumed from the latest checkpoint: the trainable records the step it
        # restored, the attempt record names the folder it restored from.
        by_iter = {r["training_iteration"]: r for r in rows}
        for attempt in attempts:
            mine = [r for r in rows if r["attempt"] == attempt["number"]]
            assert len(mine) == attempt["end_iteration"] - attempt["start_iteration"], where
            if not mine:  # died before its first report
                continue
            assert {r["resumed_from"] for r in mine} == {attempt["start_iteration"]}, where
            assert mine[0]["training_iteration"] == attempt["start_iteration"] + 1, where
            if attempt["start_iteration"]:
                restored = by_iter[attempt["start_iteration"]]["checkpoint_dir_name"]
                assert attempt["restored_from"] == restored, where
            else:
                assert attempt["restored_from"] is None, where
        if len(attempts) == 2:
            previous_end = attempts[0]["end_iteration"]
            expected_start = {"raise": 2, "sigkill": 3, "sigterm": 3, "sigkill_early": 0}[plan]
            assert previous_end == expected_start, where
            assert attempts[1]["start_iteration"] == expected_start, where

        # The trial's output was uploaded to S3, from every attempt.
        stdout = fs.cat_file(posixpath.join(trial_dir, "stdout")).decode()
        stderr = fs.cat_file(posixpath.join(trial_dir, "stderr")).decode()
        for attempt in attempts:
            assert (f"attempt {attempt['number']} starts at step {attempt['start_iteration']}"
                    in stdout), (where, stdout)
            assert f"stderr of attempt {attempt['number']}" in stderr, (where, stderr)
        if plan == "raise":
            assert "RuntimeError: injected failure at step 2" in stderr, where
            error_txt = fs.cat_file(posixpath.join(trial_dir, "error.txt")).decode()
            assert "RuntimeError" in error_txt, where
        if plan.startswith("sigkill"):
            assert "SIGKILL" in fs.cat_file(posixpath.join(trial_dir, "error.txt")).decode()

    # Two trials ran at a time (when the machine has 2 CPUs for them), never more.
    from ftnb.execution.machine import detect_cpus

    spans = [(a["started"], a["ended"]) for t in state["trials"] for a in t["attempts"]]
    most = max(sum(1 for s, e in spans if s <= t0 < e) for t0, _ in spans)
    assert most == min(2, int(detect_cpus())), spans

    # No leftovers of the storage probe or temporary checkpoint copies.
    leftovers = [p for p in fs.find(_strip(url)) if "/.ftnb-write-probe" in p or "/.tmp-" in p]
    assert leftovers == []


def test_rows_past_the_checkpoint_are_redone_once_on_s3(s3_storage):
    """Rows reported after the latest checkpoint by an attempt that died are dropped from
    result.json / progress.csv on S3, and redone by the next attempt exactly once."""
    url, fs = s3_storage
    grid = ftnb.Tuner(
        sparse_checkpoint_train, param_space={}, run_config=_run_config(url, fs, "sparse"),
    ).fit()
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    trial_dir = _strip(grid[0].path)
    rows = _rows(fs, trial_dir)
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["attempt"] for r in rows] == [1, 1, 2, 2, 2]
    assert [r["resumed_from"] for r in rows] == [0, 0, 2, 2, 2]
    progress = fs.cat_file(posixpath.join(trial_dir, "progress.csv")).decode().splitlines()
    assert len(progress) == 6
    assert _checkpoint_names(fs, trial_dir) == ["checkpoint_000000", "checkpoint_000001"]
    failure = _state(fs, posixpath.dirname(trial_dir))["trials"][0]["failures"][0]
    assert (failure["kind"], failure["signal"], failure["iteration"]) == ("signal", "SIGKILL", 3)
    assert failure["lost_iterations"] == 1
    assert list(grid[0].metrics_dataframe["training_iteration"]) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("kill_at", [None, 3], ids=["clean", "sigkill"])
def test_num_to_keep_on_s3(s3_storage, kill_at):
    """Only the 2 newest checkpoint folders remain on S3, also across a SIGKILL and restart."""
    url, fs = s3_storage
    grid = ftnb.Tuner(
        retention_train,
        param_space={"kill_at": kill_at},
        run_config=_run_config(url, fs, "keep2",
                               checkpoint_config=ftnb.CheckpointConfig(num_to_keep=2)),
    ).fit()
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    result = grid[0]
    trial_dir = _strip(result.path)
    assert _checkpoint_names(fs, trial_dir) == ["checkpoint_000003", "checkpoint_000004"]
    for name in ("checkpoint_000003", "checkpoint_000004"):
        assert fs.exists(posixpath.join(trial_dir, name, ".ftnb_checkpoint.json"))
    rows = _rows(fs, trial_dir)
    assert [r["training_iteration"] for r in rows] == [1, 2, 3, 4, 5]
    if kill_at is not None:
        assert {r["resumed_from"] for r in rows if r["attempt"] == 2} == {kill_at}
    assert result.checkpoint.path.endswith("checkpoint_000004")
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000003", "checkpoint_000004"]
    state = _state(fs, posixpath.dirname(trial_dir))
    assert [c["dir_name"] for c in state["trials"][0]["checkpoints"]] == [
        "checkpoint_000003", "checkpoint_000004"]


@pytest.mark.parametrize(
    "order, kept",
    [("max", ["checkpoint_000001", "checkpoint_000004"]),  # best acc 0.9, plus the latest
     ("min", ["checkpoint_000002", "checkpoint_000004"])],  # lowest acc 0.1, plus the latest
)
def test_num_to_keep_with_score_on_s3(s3_storage, order, kept):
    url, fs = s3_storage
    grid = ftnb.Tuner(
        retention_train,
        param_space={},
        run_config=_run_config(url, fs, f"score-{order}", checkpoint_config=ftnb.CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order=order)),
    ).fit()
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    result = grid[0]
    trial_dir = _strip(result.path)
    assert _checkpoint_names(fs, trial_dir) == kept
    assert result.checkpoint.path.endswith("checkpoint_000004")  # the latest, always kept
    best = result.best_checkpoints
    assert best[0][0].path.endswith(kept[0])
    assert best[0][1]["acc"] == (0.9 if order == "max" else 0.1)


def test_result_grid_on_s3(s3_storage, tmp_path):
    """ResultGrid, Result.checkpoint (as_directory / to_directory) and metrics_dataframe read
    straight from S3, from fit() and from ResultGrid.from_path()."""
    url, fs = s3_storage
    grid = ftnb.Tuner(
        simple_train,
        param_space={"lr": ftnb.grid_search([0.1, 0.2])},
        tune_config=ftnb.TuneConfig(metric="loss", mode="min"),
        run_config=_run_config(url, fs, "grid"),
    ).fit()
    exp_url = f"{url}/grid"
    assert grid.experiment_path == exp_url
    again = ftnb.ResultGrid.from_path(exp_url, filesystem=fs)

    for g in (grid, again):
        assert len(g) == 2 and g.num_terminated == 2 and g.num_errors == 0
        best = g.get_best_result()
        assert best.config["lr"] == 0.1
        assert best.metrics["loss"] == pytest.approx(0.1)
        assert best.path.startswith(f"{exp_url}/")
        df = g.get_dataframe()
        assert sorted(df["config/lr"]) == [0.1, 0.2]
        assert all(p.startswith("s3://") for p in df["logdir"])
        for result in g:
            mdf = result.metrics_dataframe
            assert list(mdf["training_iteration"]) == [1, 2, 3]
            assert list(mdf["nested/a"]) == [0, 1, 2]
            assert list(mdf["loss"]) == pytest.approx([result.config["lr"] * k for k in (3, 2, 1)])

            ckpt = result.checkpoint
            assert ckpt is not None
            assert ckpt.uri.startswith(f"{exp_url}/") and ckpt.uri.endswith("checkpoint_000002")
            with ckpt.as_directory() as d:
                assert os.path.isdir(d) and not d.startswith(_strip(url))
                with open(os.path.join(d, STATE_FILE)) as f:
                    assert json.load(f) == {"step": 3, "trial_id": result.trial_id}
                local = d
            assert not os.path.exists(local)  # the download is cleaned up

            target = tmp_path / f"{id(g)}-{result.trial_id}"
            out = ckpt.to_directory(str(target))
            assert out == str(target)
            with open(target / STATE_FILE) as f:
                assert json.load(f)["step"] == 3
            assert (target / "weights.bin").read_bytes() == bytes([3]) * 1024
            assert (target / "sub" / "deeper" / "extra.txt").read_text() == "step 3"
            out2 = ckpt.to_directory()  # a new temporary folder
            try:
                assert os.path.exists(os.path.join(out2, "weights.bin"))
            finally:
                shutil.rmtree(out2, ignore_errors=True)

            kept = result.best_checkpoints
            assert [c.path.rsplit("/", 1)[1] for c, _ in kept] == [
                "checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
            assert [m["training_iteration"] for _, m in kept] == [1, 2, 3]


def test_missing_bucket_fails_before_any_trial(s3_endpoint, s3_filesystem_factory, tmp_path):
    """A storage_path on a bucket that does not exist is an error at fit(), before any trial
    starts, and ftnb must not create the bucket behind the user's back."""
    import boto3
    import botocore.exceptions

    fs = s3_filesystem_factory()
    bucket = "ftnb-no-such-bucket"
    marker = tmp_path / "ran"
    tuner = ftnb.Tuner(
        marker_train,
        param_space={"marker": str(marker)},
        run_config=_run_config(f"s3://{bucket}/runs", fs, "nope"),
    )
    with pytest.raises(ValueError, match="storage_path") as info:
        tuner.fit()
    assert f"s3://{bucket}/runs" in str(info.value)
    assert not marker.exists()
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    with pytest.raises(botocore.exceptions.ClientError):
        client.head_bucket(Bucket=bucket)


def test_unreachable_endpoint_fails_before_any_trial(s3_filesystem_factory, tmp_path):
    """An S3 endpoint nobody listens on is an error at fit(), quickly, before any trial starts."""
    import socket

    # A port bound here but not listening: refused, and no other process can take it meanwhile.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        fs = s3_filesystem_factory(
            f"http://127.0.0.1:{port}",
            config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 1},
        )
        marker = tmp_path / "ran"
        tuner = ftnb.Tuner(
            marker_train,
            param_space={"marker": str(marker)},
            run_config=_run_config("s3://somebucket/runs", fs, "nope"),
        )
        with pytest.raises(ValueError, match="storage_path"):
            tuner.fit()
    assert not marker.exists()


def test_staged_output_goes_once_published_and_a_retry_continues_the_stored_copy(
        s3_storage, tmp_path, monkeypatch):
    """On S3 a trial's stdout and stderr are written in a local staging folder and uploaded at
    the attempt's end; the folder goes then, not at the driver's end: when a trial completes
    while another runs, only the running one's folder is left, and none after the run. The
    retry of a failed attempt starts from the stored copy, so the file holds both attempts."""
    url, fs = s3_storage
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the driver's staging folders
    gate = str(tmp_path / "gate")
    watcher = _StagedWhenQuickEnds(str(temp), gate)
    grid = ftnb.Tuner(
        ftnb.with_resources(staged_output_train, {"cpu": 0.25}),
        param_space={"kind": ftnb.grid_search(["quick", "slow"]), "gate": gate},
        run_config=_run_config(url, fs, "staged", callbacks=[watcher]),
    ).fit()
    assert grid.num_errors == 0, [str(e) for e in grid.errors]
    assert watcher.seen is not None and len(watcher.seen) == 1, watcher.seen  # slow's alone
    assert _staged_folders(str(temp)) == []
    state = _state(fs, posixpath.join(_strip(url), "staged"))
    for trial in state["trials"]:
        kind = trial["config"]["kind"]
        stdout = fs.cat_file(posixpath.join(_strip(url), "staged", trial["dir_name"],
                                            "stdout")).decode()
        attempts = [1, 2] if kind == "quick" else [1]
        assert [line for line in stdout.splitlines() if line.endswith(" prints")] == \
            [f"{kind} attempt {n} prints" for n in attempts], stdout
