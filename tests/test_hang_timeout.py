"""FailureConfig(hang_timeout_s): a trial that stops reporting is killed, fails as ``hang`` and
is retried from its checkpoint. The decision is a table; one experiment runs real processes."""

from __future__ import annotations

import os
import time

import pytest

import ftnb
from ftnb.core.hang_watch import silent_attempts
from ftnb.core.policy import AttemptEnd, classify_end
from ftnb.core.records import ExperimentState, FailureKind
from ftnb.lifecycle.plan_restore import plan_restore
from ftnb.run_options import RunDefaults, run_config_of
from ftnb.storage import ExperimentPaths
from procs import pid_alive, wait_for
from scripted import report_step, restored_step


# -- the decision, without processes ---------------------------------------------------------------
@pytest.mark.parametrize("heard_at, now, timeout_s, expected", [
    ({"a": 0.0}, 10.0, None, {}),  # off: nothing ever hangs
    ({"a": 0.0}, 10.0, 10.0, {}),  # exactly the limit: not yet
    ({"a": 0.0}, 10.5, 10.0, {"a": 10.5}),
    ({"a": 0.0, "b": 9.0}, 12.0, 5.0, {"a": 12.0}),  # b reported lately
    ({"a": None, "b": 0.0}, 12.0, 5.0, {"b": 12.0}),  # a is not watched (asked to stop)
    ({}, 12.0, 5.0, {}),
])
def test_silent_attempts(heard_at, now, timeout_s, expected):
    assert silent_attempts(heard_at, now=now, timeout_s=timeout_s) == expected


@pytest.mark.parametrize("end", [
    AttemptEnd(exit_code=-9, silent_for_s=2.3),
    # Killed for hanging while a stop was also asked, or a SIGTERM reached it meanwhile: still
    # a hang, counted (neither a clean stop nor an uncounted preemption).
    AttemptEnd(exit_code=-9, stop_requested=True, silent_for_s=2.3),
    AttemptEnd(exit_code=-15, silent_for_s=2.3),
])
def test_a_killed_silent_attempt_is_a_counted_hang(end):
    ending = classify_end(end, attempt=1, iteration=2, now=0.0)
    assert ending.outcome.value == "failed"
    failure = ending.failure
    assert failure.kind == FailureKind.HANG.value and failure.counted
    assert "2.3 s" in failure.message and "hang_timeout_s" in failure.message


def test_a_silent_attempt_that_finished_meanwhile_finished():
    ending = classify_end(AttemptEnd(outcome="finished", exit_code=0, silent_for_s=2.0),
                          attempt=1, iteration=5, now=0.0)
    assert ending.outcome.value == "finished" and ending.failure is None


@pytest.mark.parametrize("value", [0, -1, "10", True, float("nan"), float("inf")])
def test_hang_timeout_is_checked_at_construction(value):
    with pytest.raises(ValueError) as err:
        ftnb.FailureConfig(hang_timeout_s=value)
    text = str(err.value)
    assert "hang_timeout_s=" in text and repr(value) in text and "Fix:" in text


def test_hang_timeout_option():
    """``--hang-timeout`` of ``ftnb run`` (the same table as %ftrun's), parsed as it is."""
    from ftnb.cli.running import RUN

    args = RUN.parse("scripted:scripted --hang-timeout 90 --max-failures 2")
    rc = run_config_of(args, RunDefaults())
    assert rc.failure_config.hang_timeout_s == 90.0 and rc.failure_config.max_failures == 2
    assert run_config_of(RUN.parse("scripted:scripted"), RunDefaults()
                         ).failure_config.hang_timeout_s is None


# -- real processes -------------------------------------------------------------------------------
def _hangs_in_attempt_one(config):
    """Reports (with a checkpoint) steps 1..n; its first attempt, after two reports, writes its
    pid and sleeps forever."""
    ctx, config = ftnb.get_context(), config["case"]
    for step in range(restored_step() + 1, config["n"] + 1):
        if config["hang"] and ctx.attempt == 1 and step == 3:
            with open(os.path.join(ctx.trial_dir, "hung.pid"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)  # forever, next to the timeout: a test without the watch ends
        time.sleep(config["sleep"])
        report_step({"step": step}, step, True)


def test_hung_trial_is_killed_and_retried_from_its_checkpoint(tmp_path):
    failure = ftnb.FailureConfig(hang_timeout_s=2, max_failures=1)
    started = time.monotonic()
    results = ftnb.Tuner(
        _hangs_in_attempt_one,
        param_space={"case": {"hang": True, "n": 5, "sleep": 0.0}},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="hang", verbose=0,
                                  failure_config=failure),
    ).fit()
    assert time.monotonic() - started < 50
    state = ExperimentState.load(ExperimentPaths.at(results.experiment_path))
    [hung] = state.trials
    assert results.num_errors == 0 and results.num_terminated == 1

    assert [f.kind for f in hung.failures] == ["hang"]
    record = hung.failures[0]
    assert record.counted and record.iteration == 2 and record.signal == "SIGKILL"
    assert "hang_timeout_s" in record.message
    assert len(hung.attempts) == 2
    assert hung.attempts[1].start_iteration == 2  # from the checkpoint of its second report
    hung_result = results[0]
    assert [r["training_iteration"] for r in hung_result.rows] == [1, 2, 3, 4, 5]
    error_txt = open(os.path.join(hung_result.path, "error.txt")).read()
    assert "hang" in error_txt
    pid = int(open(os.path.join(hung_result.path, "hung.pid")).read())
    wait_for(lambda: not pid_alive(pid), timeout=10, what=f"the hung trial's pid {pid} gone")
    # Kept with the experiment: a restore watches as the first run did.
    assert state.settings["failure_config"]["hang_timeout_s"] == 2
    restored = plan_restore(results.experiment_path, _hangs_in_attempt_one, verbose=0)
    assert restored.run_config.failure_config.hang_timeout_s == 2


def test_a_slow_steady_trial_is_not_hung(tmp_path):
    """Reports 0.5 s apart for 7 s, longer than the 5 s timeout: silent never that long."""
    results = ftnb.Tuner(
        _hangs_in_attempt_one,
        param_space={"case": {"hang": False, "n": 14, "sleep": 0.5}},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path), name="steady", verbose=0,
                                  failure_config=ftnb.FailureConfig(hang_timeout_s=5)),
    ).fit()
    [trial] = ExperimentState.load(ExperimentPaths.at(results.experiment_path)).trials
    assert trial.failures == [] and len(trial.attempts) == 1
    assert [r["training_iteration"] for r in results[0].rows] == list(range(1, 15))


def _group_rank_one_hangs(config):
    """Two gloo ranks, an all_reduce and a report (rank 0's with a checkpoint) per step; in
    attempt 1, rank 1 writes its pid and sleeps before step 3's all_reduce, so rank 0 waits
    there forever: the group, as a whole, never reports again."""
    import torch
    import torch.distributed as dist

    ctx = ftnb.get_context()
    for step in range(restored_step() + 1, 6):
        if ctx.attempt == 1 and step == 3 and ctx.get_world_rank() == 1:
            with open(os.path.join(config["dir"], "hung.pid"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(300)
        value = torch.ones(1)
        dist.all_reduce(value)
        assert int(value.item()) == 2
        report_step({"step": step}, step, ctx.get_world_rank() == 0)


def test_a_hung_rank_of_a_group_ends_the_attempt_as_a_hang(tmp_path):
    pytest.importorskip("torch")
    result = ftnb.TorchTrainer(
        _group_rank_one_hangs, train_loop_config={"dir": str(tmp_path)},
        # (its collective timeout far off: the hang watch is what ends it)
        scaling_config=ftnb.ScalingConfig(num_workers=2, collective_timeout_s=600),
        run_config=ftnb.RunConfig(
            storage_path=str(tmp_path), name="group", verbose=0,
            # (above the start of a retry's two ranks, torch's import and the gloo rendezvous
            # included, on a loaded machine: 3 s was not, and the retry hung too)
            failure_config=ftnb.FailureConfig(hang_timeout_s=10, max_failures=1)),
    ).fit()
    [trial] = ExperimentState.load(ExperimentPaths.at(os.path.dirname(result.path))).trials
    assert result.error is None, [(f.kind, f.message) for f in trial.failures]
    assert [f.kind for f in trial.failures] == ["hang"]
    assert trial.failures[0].counted and trial.failures[0].iteration == 2
    assert len(trial.attempts) == 2 and trial.attempts[1].start_iteration == 2
    assert [r["training_iteration"] for r in result.rows] == [1, 2, 3, 4, 5]
    pid = int(open(tmp_path / "hung.pid").read())
    assert not pid_alive(pid)  # the hung rank, ended with its attempt
