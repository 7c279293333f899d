"""A TorchTrainer named to ``ftnb run`` or ``%ftrun`` keeps its own RunConfig (its name, storage
path, failure and checkpoint configs): only the options given on the line replace what they
set. Real runs (one rank in a real torch.distributed group), through the command and through
the magics' plan launched as ``%ftrun`` launches it."""

from __future__ import annotations

import importlib.util

import pytest
from clirun import cli_in, write

import ftnb
from ftnb.cli.running import RUN, SPACE_FORMS, _Names
from ftnb.notebook.magic_commands import RunCommand
from ftnb.notebook.magic_options import MagicDefaults
from ftnb.run_options import RunDefaults, launch_arguments

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")]

TRAINER = '''
import ftnb

def train(config):
    for i in range(2):
        ftnb.report({"i": i, "x": config.get("x", 0)})

trainer = ftnb.TorchTrainer(
    train, train_loop_config={"x": 1}, scaling_config=ftnb.ScalingConfig(num_workers=1),
    run_config=ftnb.RunConfig(
        name="own_name", storage_path=STORE,
        failure_config=ftnb.FailureConfig(max_failures=2, preemption_grace_period_s=7.0),
        checkpoint_config=ftnb.CheckpointConfig(num_to_keep=1)))
'''


@pytest.fixture
def cli(tmp_path):
    for cli in cli_in(tmp_path):
        own = tmp_path / "own store"
        write(cli.cwd, "tt.py", f"STORE = {str(own)!r}\n" + TRAINER)
        cli.own = own
        yield cli


def _settings(path) -> dict:
    handle = ftnb.attach(str(path))
    assert handle.status() == "FINISHED"
    return handle.state().settings


def test_ftnb_run_keeps_the_trainers_run_config_but_for_the_options_given(cli, tmp_path):
    done = cli("run", "tt.py:trainer", "--verbose", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    settings = _settings(cli.own / "own_name")  # its name and storage, not $FTNB_STORAGE_PATH's
    assert settings["failure_config"]["max_failures"] == 2
    assert settings["failure_config"]["preemption_grace_period_s"] == 7.0
    assert settings["checkpoint_config"]["num_to_keep"] == 1
    assert not (cli.storage / "own_name").exists()

    # The options given replace what they set, and only that (parsed as the command does).
    other = tmp_path / "other store"
    args = RUN.parse(f"'{cli.cwd}/tt.py:trainer' -n given --storage '{other}' "
                     "--max-failures 5 --checkpoint-score-attribute x")
    built = launch_arguments(args, _Names(), trainable=args.trainable, param_space=None,
                             space_forms=SPACE_FORMS, defaults=RunDefaults(), origin={})
    rc = built.kwargs["run_config"]
    assert built.kwargs["name"] == "given" and built.kwargs["storage_path"] == str(other)
    assert rc.failure_config.max_failures == 5  # given: replaced
    assert rc.failure_config.preemption_grace_period_s == 7.0  # not given: kept
    assert rc.checkpoint_config.num_to_keep == 1
    assert rc.checkpoint_config.checkpoint_score_attribute == "x"
    assert built.trainable.run_config == rc


def test_ftrun_keeps_the_trainers_run_config_but_for_the_options_given(cli, tmp_path,
                                                                       monkeypatch):
    import importlib.util as util

    spec = util.spec_from_file_location("tt_module", cli.cwd / "tt.py")
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    namespace = {"trainer": module.trainer}
    defaults = MagicDefaults(storage_path=str(tmp_path / "magics store"), max_failures=0,
                             verbose=0)

    plan = RunCommand.parse("trainer", defaults).resolve(namespace)
    rc = plan.kwargs["run_config"]
    assert plan.kwargs["name"] == "own_name"
    assert plan.kwargs["storage_path"] == str(cli.own)  # not the magics' configured storage
    assert rc.failure_config.max_failures == 2 and rc.checkpoint_config.num_to_keep == 1

    plan = RunCommand.parse("trainer --num-to-keep 3 --fail-fast --name mine", defaults
                            ).resolve(namespace)
    rc = plan.kwargs["run_config"]
    assert plan.kwargs["name"] == "mine"
    assert rc.checkpoint_config.num_to_keep == 3 and rc.failure_config.fail_fast is True
    assert rc.failure_config.max_failures == 2  # not given: the trainer's
    monkeypatch.syspath_prepend(str(cli.cwd))  # the supervisor imports the trainer's module
    handle = ftnb.launch(plan.trainable, **dict(plan.kwargs, quiet=True), wait=True)
    assert handle.path == str(cli.own / "mine")
    settings = _settings(cli.own / "mine")
    assert settings["checkpoint_config"]["num_to_keep"] == 3
    assert settings["failure_config"]["max_failures"] == 2
