"""``ftnb run --num-workers N``: each trial a group of N ranks (a TorchTrainer around the named
function), as real processes in a real torch.distributed group (gloo): in the foreground, with
--detach, resumed by ``ftnb resume``, a TorchTrainer named instead of a function, and the
mistakes that are refused before anything starts."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
from clirun import cli_in, literal, one_line_error, write
from procs import wait_for

import ftnb

pytestmark = pytest.mark.timeout(180)

#: A test that runs groups of ranks: real torch.distributed (the refused options need no torch).
runs_groups = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch")

#: ``groups.py``: every rank checks that it is one of a 2-rank group, all-reduces its rank + 1
#: (1 + 2 = 3 on both) and reports the trial's config as a plain trial would get it.
GROUPS = '''
import os, time
import ftnb

def _in_a_group_of_two():
    import torch
    import torch.distributed as dist

    ctx = ftnb.get_context()
    assert ctx.get_world_size() == 2 and dist.get_world_size() == 2, ctx.get_world_size()
    total = torch.tensor([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(total)
    assert total.item() == 3.0, total
    return total.item()

def train(config):
    total = _in_a_group_of_two()
    assert set(config) == {"x"}, config  # the trial's config itself, not the trainer's space
    for _ in range(2):
        ftnb.report({"sum": total * config["x"]})

def gated(config):
    """Reports every 50 ms until the file config["gate"] exists."""
    total = _in_a_group_of_two()
    while True:
        ftnb.report({"sum": total * config["x"]})
        if os.path.exists(config["gate"]):
            return
        time.sleep(0.05)

trainer = ftnb.TorchTrainer(train, train_loop_config={"x": 5},
                            scaling_config=ftnb.ScalingConfig(num_workers=3))
'''

GRID = literal({"x": {"grid_search": [1, 2]}})
GROUP = ("--num-workers", "2", "--cpus-per-worker", "0.5")


@pytest.fixture
def cli(tmp_path):
    for cli in cli_in(tmp_path):
        write(cli.cwd, "groups.py", GROUPS)
        yield cli


def _state(cli, name):
    return ftnb.attach(name, storage_path=str(cli.storage)).state()


def _check_groups(state, sums, attempts=1):
    """Every trial TERMINATED with ``sums`` as its last results, its ``attempts`` each a group
    of 2 ranks (2 pids)."""
    assert state.settings["num_workers"] == 2
    assert state.settings["resources_per_trial"]["cpu"] == 0.5
    assert [t.status for t in state.trials] == ["TERMINATED"] * len(sums)
    assert [t.last_result["sum"] for t in state.trials] == sums
    for trial in state.trials:
        assert len(trial.attempts) == attempts, trial.attempts
        for attempt in trial.attempts:
            assert attempt.num_workers == 2 and len(set(attempt.pids)) == 2, attempt


@pytest.mark.slow
@runs_groups
def test_run_in_the_foreground_runs_each_trial_in_a_group_of_two_ranks(cli):
    done = cli("run", "groups.py:train", "-p", GRID, "-n", "fg", *GROUP, "--verbose", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith(
        "ftnb: experiment 'fg' FINISHED: 2 trials, 2 terminated, 0 errored")
    state = _state(cli, "fg")
    _check_groups(state, [3.0, 6.0])
    assert [t.config for t in state.trials] == [{"train_loop_config": {"x": 1}},
                                                {"train_loop_config": {"x": 2}}]
    assert state.settings["trainer"]["kind"] == "TorchTrainer"
    assert state.settings["origin"]["param_space"] == GRID  # the space as given, to resume


@pytest.mark.slow
@runs_groups
def test_run_detached_runs_the_groups_in_the_supervisor_and_status_shows_their_ranks(cli):
    done = cli("run", "groups.py:train", "-p", GRID, "-n", "bg", *GROUP, "--detach")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "runs in the background" in done.stdout
    handle = ftnb.attach("bg", storage_path=str(cli.storage))
    assert handle.wait(timeout=90).num_errors == 0, pathlib.Path(handle.supervisor_log).read_text()
    _check_groups(handle.state(), [3.0, 6.0])
    status = cli("status", "bg")
    assert status.returncode == 0, status.stderr
    assert "2 ranks per trial" in status.stdout


@pytest.mark.slow
@runs_groups
def test_resume_runs_a_stopped_group_again_in_its_two_ranks(cli):
    space = literal({"x": 1, "gate": str(cli.cwd / "gate")})
    done = cli("run", "groups.py:gated", "-p", space, "-n", "gd", *GROUP, "--detach")
    assert done.returncode == 0, done.stdout + done.stderr

    def reporting():
        trials = _state(cli, "gd").trials
        return trials and trials[0].iteration >= 2

    wait_for(reporting, timeout=60, what="the group to report")
    stopped = cli("stop", "gd")
    assert stopped.returncode == 0, stopped.stderr
    assert _state(cli, "gd").status == "INTERRUPTED"
    cli.open_gate()
    # The function alone (the recorded reference) and the plain space it was started with:
    # each rank runs it in a group of 2 again, with the config a plain trial gets.
    resumed = cli("resume", "gd", "--verbose", "0")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming experiment 'gd'" in resumed.stdout
    _check_groups(_state(cli, "gd"), [3.0], attempts=2)


@pytest.mark.slow
@runs_groups
def test_a_torch_trainer_named_runs_with_the_options_replacing_its_scaling(cli):
    # Its own ScalingConfig says 3 ranks (1 CPU each): --num-workers/--cpus-per-worker win.
    done = cli("run", "groups.py:trainer", "-p", literal({"train_loop_config": {"x": 4}}),
               "-n", "tt", *GROUP, "--verbose", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    state = _state(cli, "tt")
    _check_groups(state, [12.0])
    assert state.trials[0].config == {"train_loop_config": {"x": 4}}


@pytest.mark.parametrize("options, fragments", [
    (("--num-workers", "2", "--cpus-per-trial", "2"),
     ("--cpus-per-trial 2 with --num-workers 2",
      "Fix: --cpus-per-worker 2 instead of --cpus-per-trial 2")),
    (("--gpus-per-worker", "1", "--gpus-per-trial", "1"),
     ("--gpus-per-trial 1 with --gpus-per-worker 1", "Fix: --gpus-per-worker 1")),
    (("--num-workers", "-1"),
     ("--num-workers -1: ScalingConfig(num_workers=-1) must be a whole number >= 1",)),
    (("--num-workers", "2", "--gpus-per-worker", "0.5"),
     ("--num-workers 2 --gpus-per-worker 0.5: ScalingConfig(num_workers=2",
      "cannot share a GPU")),
    (("--collective-timeout", "0"),
     ("--collective-timeout 0: ScalingConfig(collective_timeout_s=0.0)",
      "must be a number of seconds > 0")),
])
def test_bad_worker_options_are_one_line_usage_errors(cli, options, fragments):
    done = cli("run", "groups.py:train", "-n", "bad", *options)
    assert done.returncode == 2, done.stdout + done.stderr
    one_line_error(done.stderr, *fragments)
    assert not (cli.storage / "bad").exists()


def test_per_trial_resources_with_a_torch_trainer_are_refused_too(cli):
    done = cli("run", "groups.py:trainer", "--cpus-per-trial", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    one_line_error(done.stderr, "--cpus-per-trial 2 with a TorchTrainer",
                   "Fix: --cpus-per-worker 2 instead of --cpus-per-trial 2")
