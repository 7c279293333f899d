"""The %ftrun family of magics (ftnb/notebook/magics.py).

Two layers: the plain command builders (RunCommand, ResumeCommand, the option tables) without a
shell, and the magics in a real in-process IPython InteractiveShell against real experiments
(detached supervisors and trial processes, in a temporary storage folder). End-to-end tests in a
real Jupyter kernel (jupyter_client) are in tests/test_kernel.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets import TraitError
from traitlets.config import Config

import ftnb
from ftnb.config import CheckpointConfig, FailureConfig, TuneConfig
from ftnb.notebook.magics import (
    FTATTACH,
    FTLS,
    FTRESUME,
    FTRUN,
    FTSTOP,
    CellDefinitions,
    FtnbMagics,
    MagicDefaults,
    MagicInputError,
    ResumeCommand,
    RunCommand,
)
from procs import wait_for


def train(config):
    ftnb.report({"loss": 1.0})


SPACE = {"x": ftnb.grid_search([1, 2])}
NS = {"train": train, "space": SPACE, "not_a_function": 3, "a_list": [1, 2],
      "models": type("Models", (), {"train": staticmethod(train)})}


def plan(line, namespace=NS, defaults=None, cell=None):
    return RunCommand.parse(line, defaults, cell=cell).resolve(namespace)


def input_error(call, *args, **kwargs) -> str:
    with pytest.raises(MagicInputError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# =================================================================================================
# The builders, without a shell
# =================================================================================================


def test_a_bare_line_gives_the_default_configs():
    p = plan("train")
    assert p.trainable is train
    kw = p.kwargs
    assert kw["param_space"] is None and kw["name"] is None and kw["storage_path"] is None
    assert kw["tune_config"] == TuneConfig()
    assert kw["run_config"].failure_config == FailureConfig()
    assert kw["run_config"].checkpoint_config == CheckpointConfig()
    assert kw["run_config"].stop is None and kw["run_config"].verbose == 1
    assert kw["resources_per_trial"] is None
    assert kw["restart_errored"] is False and kw["quiet"] is False
    assert kw["origin"] == {"trainable": "train", "source": "%ftrun train"}
    assert (p.output, p.widget, p.wait, p.metric) == (None, True, False, None)


def test_every_option_reaches_the_launch_arguments():
    line = (
        "train --param-space space --name sweep1 --storage /data/runs --stop loss=0.1 "
        "--stop training_iteration=10 --verbose 2 --num-samples 3 --concurrency 4 "
        "--cpus-per-trial 2 --gpus-per-trial 0.5 --metric loss --mode min --seed 7 "
        "--max-failures 3 --fail-fast --retry-repeated-errors --preemption-grace 12.5 "
        "--restart-errored --num-to-keep 2 --checkpoint-score-attribute acc "
        "--checkpoint-score-order min -o h --wait --no-widget -q"
    )
    p = plan(line)
    kw = p.kwargs
    assert kw["param_space"] is SPACE
    assert kw["name"] == "sweep1" and kw["storage_path"] == "/data/runs"
    assert kw["tune_config"] == TuneConfig(num_samples=3, max_concurrent_trials=4, metric="loss",
                                           mode="min", seed=7)
    rc = kw["run_config"]
    assert rc.failure_config == FailureConfig(max_failures=3, fail_fast=True,
                                              stop_on_repeated_error=False,
                                              preemption_grace_period_s=12.5)
    assert rc.checkpoint_config == CheckpointConfig(num_to_keep=2,
                                                    checkpoint_score_attribute="acc",
                                                    checkpoint_score_order="min")
    assert rc.stop == {"loss": 0.1, "training_iteration": 10}
    assert rc.verbose == 2
    assert rc.name is None and rc.storage_path is None  # launch's own arguments say those
    assert kw["resources_per_trial"] == {"cpu": 2, "gpu": 0.5}
    assert kw["restart_errored"] is True and kw["quiet"] is True
    assert kw["origin"] == {"trainable": "train", "param_space": "space",
                            "source": "%ftrun " + line}
    assert (p.output, p.widget, p.wait, p.metric) == ("h", False, True, "loss")


def test_short_options_and_equals_spelling():
    p = plan("train -p space -n s1 -o out --max-failures=-1 -q")
    assert p.kwargs["param_space"] is SPACE and p.kwargs["name"] == "s1" and p.output == "out"
    assert p.kwargs["run_config"].failure_config.max_failures == -1
    assert p.kwargs["quiet"] is True


def test_quoted_values_keep_their_spaces():
    p = plan("train --storage '/data/my runs' --name \"a b\"")
    assert p.kwargs["storage_path"] == "/data/my runs" and p.kwargs["name"] == "a b"


def test_configured_defaults_apply_only_when_the_option_is_missing():
    defaults = MagicDefaults(storage_path="/cfg", max_failures=5, concurrency=3, widget=False,
                             verbose=0)
    p = plan("train", defaults=defaults)
    assert p.kwargs["storage_path"] == "/cfg"
    assert p.kwargs["run_config"].failure_config.max_failures == 5
    assert p.kwargs["tune_config"].max_concurrent_trials == 3
    assert p.kwargs["run_config"].verbose == 0 and p.widget is False
    p = plan("train --storage /line --max-failures 0 --concurrency 1 --verbose 1",
             defaults=defaults)
    assert p.kwargs["storage_path"] == "/line"
    assert p.kwargs["run_config"].failure_config.max_failures == 0  # 0 is given, not missing
    assert p.kwargs["tune_config"].max_concurrent_trials == 1
    assert p.kwargs["run_config"].verbose == 1


def test_dotted_names_are_attributes():
    assert plan("models.train").trainable is train
    assert "models has no attribute 'trian'" in input_error(plan, "models.trian")


@pytest.mark.parametrize("stop, expected", [
    ("training_iteration=10", {"training_iteration": 10}),
    ("loss=0.5,acc=0.9", {"loss": 0.5, "acc": 0.9}),
    ("'{\"loss\": 1e-3}'", {"loss": 0.001}),
    ("limits", {"training_iteration": 4}),
])
def test_stop_criteria(stop, expected):
    ns = dict(NS, limits={"training_iteration": 4})
    assert plan(f"train --stop {stop}", ns).kwargs["run_config"].stop == expected


def test_stop_by_a_function_name():
    def done(trial_id, result):
        return result["training_iteration"] >= 3

    assert plan("train --stop done", dict(NS, done=done)).kwargs["run_config"].stop is done


@pytest.mark.parametrize("stop, says", [
    ("loss", "'loss' is not defined"),
    ("not_a_function", "is a int; it must be a dict of thresholds or a function"),
    ("loss=low", "'loss=low' is not METRIC=NUMBER"),
    ("=3", "is not METRIC=NUMBER"),
    ("'{1: 2'", "is not a dict literal"),
    ("loss=nan", "thresholds must be numbers"),  # RunConfig's own check, as one line
])
def test_bad_stop_criteria(stop, says):
    assert says in input_error(plan, f"train --stop {stop}")


def test_a_stop_object_cannot_be_mixed_with_pairs():
    ns = dict(NS, limits={"training_iteration": 4})
    assert "cannot be combined" in input_error(plan, "train --stop limits --stop loss=1", ns)


@pytest.mark.parametrize("line, says", [
    ("trian", "trainable 'trian' is not defined in this notebook. Did you mean 'train'?"),
    ("not_a_function", "trainable 'not_a_function' is a int, not a function"),
    ("train()", "is not a Python name. Fix: give the name alone, without parentheses"),
    ("train -p a_list", "param space 'a_list' is a list, not a dict"),
    ("train -p spaec", "param space 'spaec' is not defined in this notebook. Did you mean "
                       "'space'?"),
    ("train --filesystem fs", "--filesystem 'fs' is not defined"),
])
def test_names_that_do_not_resolve(line, says):
    assert says in input_error(plan, line)


@pytest.mark.parametrize("line, says", [
    ("", "%ftrun needs the trainable"),
    ("train --max-failure 3", "unknown option --max-failure. Did you mean --max-failures?"),
    ("train --concurency=2", "unknown option --concurency=2. Did you mean --concurrency?"),
    ("train extra", "unexpected argument 'extra'"),
    ("train --concurrency 0", "argument --concurrency: must be 1 or more, got 0"),
    ("train --num-samples two", "argument --num-samples: expected a whole number, got 'two'"),
    ("train --max-failures -2", "argument --max-failures: must be -1 or more"),
    ("train --gpus-per-trial -1", "argument --gpus-per-trial"),
    ("train --mode best", "argument --mode: invalid choice: 'best'"),
    ("train --verbose 3", "argument --verbose: invalid choice: 3"),
    ("train -o 'my handle'", "-o 'my handle' is not a valid variable name"),
    ("train -o class", "not a valid variable name"),
    ("train --name 'unclosed", "cannot split"),
    ("train --name", "argument -n/--name: expected one argument"),
])
def test_bad_lines(line, says):
    message = input_error(RunCommand.parse, line)
    assert says in message
    assert message.startswith("%ftrun")


def test_a_cell_supplies_the_trainable_and_the_space():
    cell = textwrap.dedent("""
        import ftnb
        def train_cell(config):
            ftnb.report({"x": 1})
        space = {"x": 1}
        other = {"not": "a space"}
    """)
    command = RunCommand.parse("--name c", cell=cell)
    assert (command.trainable_name, command.param_space_name) == ("train_cell", "space")
    assert command.source == "%%ftrun --name c"
    # The line's names win over the cell's.
    command = RunCommand.parse("train -p other", cell=cell)
    assert (command.trainable_name, command.param_space_name) == ("train", "other")


@pytest.mark.parametrize("cell, says", [
    ("x = 1", "the cell defines no function to run"),
    ("def a(c): pass\ndef b(c): pass", "the cell defines 2 functions (a, b). Fix: name the "
                                       "one to run: %%ftrun a"),
    ("def f(c): pass\nspace = {}\nparam_space = {}", "assigns both space and param_space"),
])
def test_cells_that_leave_the_choice_open(cell, says):
    assert says in input_error(RunCommand.parse, "", cell=cell)


def test_cell_definitions_read_only_the_top_level():
    found = CellDefinitions.of(textwrap.dedent("""
        def train(config):
            def inner(): pass
            space = {}
        async def atrain(config): pass
        param_space: dict = {"a": 1}
        if True:
            space = {}
        def train(config): pass
    """))
    assert found.functions == ("train", "atrain")
    assert found.spaces == ("param_space",)
    assert CellDefinitions.of("def broken(:") == CellDefinitions()


def test_resume_names_come_from_the_origin_then_the_stored_name():
    def train2(config):
        pass

    ns = dict(NS, train2=train2, space2={"y": 1})
    command = ResumeCommand.parse("sweep1")
    assert command.resolve(ns, {"trainable": "train", "param_space": "space"}) == (train, SPACE)
    assert command.resolve(ns, {}, stored_trainable="train2") == (train2, None)
    # A space of the original name that is not defined: restore needs it only for objects.
    assert command.resolve(ns, {"trainable": "train", "param_space": "gone"}) == (train, None)
    command = ResumeCommand.parse("sweep1 --trainable train2 -p space2 --restart-errored -o h")
    assert command.resolve(ns, {"trainable": "train"}) == (train2, {"y": 1})
    assert command.args.restart_errored and command.args.output == "h"
    assert ResumeCommand.parse("s --no-widget").widget is False
    assert ResumeCommand.parse("s", MagicDefaults(widget=False)).widget is False


@pytest.mark.parametrize("line, origin, stored, says", [
    ("sweep1", {"trainable": "gone_fn"}, None,
     "%ftresume sweep1 needs the trainable 'gone_fn' (the name it was started with), which is "
     "not defined in this notebook"),
    ("sweep1", {}, "<lambda>", "does not say which notebook name its trainable had. Fix: "
                               "pass it: --trainable NAME"),
    ("sweep1", {}, None, "--trainable NAME"),
    ("sweep1 --trainable trian", {}, None, "Did you mean 'train'?"),
    ("sweep1 --trainable not_a_function", {}, None, "is a int, not a function"),
    ("sweep1 -p gone", {"trainable": "train"}, None, "param space 'gone' is not defined"),
])
def test_resume_names_that_do_not_resolve(line, origin, stored, says):
    command = ResumeCommand.parse(line)
    assert says in input_error(command.resolve, NS, origin, stored)


@pytest.mark.parametrize("spec, line, says", [
    (FTATTACH, "", "the following arguments are required: NAME_OR_PATH"),
    (FTATTACH, "s1 --trial x", "unknown option --trial"),
    (FTSTOP, "s1 --trail x", "unknown option --trail. Did you mean --trial?"),
    (FTSTOP, "s1 --timeout soon", "argument --timeout: expected a number"),
    (FTRESUME, "s1 --restart-erored", "Did you mean --restart-errored?"),
    (FTLS, "a b", "unexpected argument 'b'"),
])
def test_bad_lines_of_the_other_magics(spec, line, says):
    message = input_error(spec.parse, line)
    assert says in message and message.startswith(f"%{spec.name}")


def test_the_other_magics_parse_their_options():
    a = FTSTOP.parse("s1 --trial t1 --no-wait --timeout 5")
    assert (a.target, a.trial, a.wait, a.timeout) == ("s1", "t1", False, 5)
    assert FTSTOP.parse("s1").wait is True and FTSTOP.parse("s1").timeout == 60.0
    a = FTATTACH.parse("s3://b/runs/s1 --metric loss -o h --no-widget --storage x")
    assert (a.target, a.metric, a.output, a.widget, a.storage_path) == (
        "s3://b/runs/s1", "loss", "h", False, "x")
    assert FTLS.parse("").storage_path is None and FTLS.parse("/r").storage_path == "/r"


def test_magic_help_lists_every_option_that_is_parsed():
    # The %ftrun? help (IPython's @magic_arguments) and the parser come from one table.
    for spec in (FTRUN, FTATTACH, FTLS, FTSTOP, FTRESUME):
        method = getattr(FtnbMagics, spec.name)
        parsed = [(a.dest, a.option_strings, a.metavar) for a in spec.parser()._actions]
        helped = [(a.dest, a.option_strings, a.metavar) for a in method.parser._actions]
        assert parsed == helped and parsed
        for flag in (f for a in spec.parser()._actions for f in a.option_strings):
            assert flag in method.__doc__
    for name in ("--max-failures", "--gpus-per-trial", "--concurrency", "--checkpoint-score-order",
                 "--stop", "--wait", "--no-widget", "--restart-errored", "TRAINABLE"):
        assert name in FtnbMagics.ftrun.__doc__


def test_import_ftnb_does_not_import_ipython():
    code = ("import sys, ftnb, ftnb.notebook; "
            "bad = [m for m in ('IPython', 'ipywidgets', 'plotly', 'traitlets') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- configuration ------------------------------------------------------------------------------
def test_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FTNB_STORAGE_PATH", "/env/runs")
    monkeypatch.setenv("FTNB_MAX_FAILURES", "-1")
    monkeypatch.setenv("FTNB_CONCURRENCY", "2")
    monkeypatch.setenv("FTNB_WIDGET", "off")
    monkeypatch.setenv("FTNB_VERBOSE", "0")
    assert FtnbMagics().defaults() == MagicDefaults("/env/runs", -1, 2, False, 0)
    for name in ("FTNB_STORAGE_PATH", "FTNB_MAX_FAILURES", "FTNB_CONCURRENCY", "FTNB_WIDGET",
                 "FTNB_VERBOSE"):
        monkeypatch.delenv(name)
    assert FtnbMagics().defaults() == MagicDefaults(None, 0, None, True, 1)


def test_a_bad_environment_value_is_ignored_with_a_warning(monkeypatch):
    monkeypatch.setenv("FTNB_CONCURRENCY", "0")
    monkeypatch.setenv("FTNB_MAX_FAILURES", "many")
    with pytest.warns(UserWarning, match=r"ignoring \$FTNB_CONCURRENCY='0'"):
        assert FtnbMagics().concurrency is None
    with pytest.warns(UserWarning, match=r"ignoring \$FTNB_MAX_FAILURES='many'"):
        assert FtnbMagics().max_failures == 0


def test_config_values_are_checked():
    magics = FtnbMagics()
    for trait, value in (("max_failures", -2), ("concurrency", 0), ("verbose", 5)):
        with pytest.raises(TraitError, match=f"FtnbMagics.{trait}={value}"):
            setattr(magics, trait, value)


def _trainer(**scaling):
    return ftnb.TorchTrainer(train, train_loop_config={"x": 0},
                             scaling_config=ftnb.ScalingConfig(**scaling))


def test_worker_options_run_the_function_as_a_torch_trainer_with_the_space_wrapped():
    p = plan("train -p space --num-workers 2 --gpus-per-worker 1 --cpus-per-worker 0.5 "
             "--collective-timeout 60 --max-failures 3")
    trainer = p.trainable
    assert isinstance(trainer, ftnb.TorchTrainer) and trainer.train_loop_per_worker is train
    assert trainer.scaling_config == ftnb.ScalingConfig(
        num_workers=2, use_gpu=True, resources_per_worker={"CPU": 0.5, "GPU": 1},
        collective_timeout_s=60.0)
    # Each rank's train(config) gets the trial's config, as a plain trial would.
    assert p.kwargs["param_space"] == {"train_loop_config": SPACE}
    assert p.kwargs["resources_per_trial"] is None
    assert trainer.run_config is p.kwargs["run_config"]
    assert p.kwargs["run_config"].failure_config.max_failures == 3
    assert p.kwargs["origin"] == {  # the names, to find them again when resuming
        "trainable": "train", "param_space": "space",
        "source": "%ftrun train -p space --num-workers 2 --gpus-per-worker 1 "
                  "--cpus-per-worker 0.5 --collective-timeout 60 --max-failures 3"}
    assert plan("train --num-workers 2").kwargs["param_space"] is None
    assert not isinstance(plan("train -p space").trainable, ftnb.TorchTrainer)


def test_worker_options_replace_only_what_they_give_of_a_trainers_scaling():
    trainer = _trainer(num_workers=3, resources_per_worker={"cpu": 2}, collective_timeout_s=9)
    ns = dict(NS, trainer=trainer, loop_space={"train_loop_config": SPACE})
    p = plan("trainer -p loop_space --gpus-per-worker 1", ns)
    assert p.trainable.scaling_config == ftnb.ScalingConfig(
        num_workers=3, use_gpu=True, resources_per_worker={"cpu": 2, "GPU": 1},
        collective_timeout_s=9)
    assert p.kwargs["param_space"] == {"train_loop_config": SPACE}  # a trainer's space as given
    # The notebook's trainer is left as it was.
    assert trainer.scaling_config.num_workers == 3 and not trainer.scaling_config.use_gpu
    # An elastic range and local mode, as ScalingConfig takes them.
    assert plan("trainer --num-workers 2:4", ns).trainable.scaling_config.num_workers == (2, 4)
    assert plan("trainer --num-workers 0", ns).trainable.scaling_config.local_mode
    p = plan("trainer -p space --num-workers 2 --cpus-per-worker 1", ns)
    assert p.trainable.scaling_config.num_workers == 2
    assert p.trainable.scaling_config.resources_per_worker == {"CPU": 1}
    assert p.kwargs["param_space"] == {"train_loop_config": SPACE}  # a plain space, wrapped
    # A trainer named without the options runs with its own scaling.
    assert plan("trainer", ns).trainable.scaling_config == trainer.scaling_config


@pytest.mark.parametrize("line, says", [
    ("train --num-workers 2 --cpus-per-trial 2",
     ("--cpus-per-trial 2 with --num-workers 2: in a data-parallel run each rank gets "
      "--cpus-per-worker and --gpus-per-worker (a trial takes --num-workers times that), so "
      "there is no per-trial amount to give. Fix: --cpus-per-worker 2 instead of "
      "--cpus-per-trial 2")),
    ("trainer --gpus-per-trial 0.5",
     "--gpus-per-trial 0.5 with a TorchTrainer: in a data-parallel run"),
    ("train --num-workers -1",
     ("--num-workers -1: ScalingConfig(num_workers=-1) must be a whole number >= 1 (the ranks of "
      "the group)")),
    ("train --num-workers 2 --gpus-per-worker 0.5",
     ("--num-workers 2 --gpus-per-worker 0.5: ScalingConfig(num_workers=2, "
      "resources_per_worker={'GPU': 0.5}): the ranks of a group cannot share a GPU")),
    ("train --collective-timeout 0",
     ("--collective-timeout 0: ScalingConfig(collective_timeout_s=0.0) must be a number of "
      "seconds > 0")),
    ("train --num-workers two", "%ftrun: argument --num-workers: expected N or MIN:MAX (an "
                                "elastic group, e.g. 2:4), got 'two'"),
    ("train --num-workers 3:2", "--num-workers 3:2: ScalingConfig(num_workers=(3, 2)) is not an "
                                "elastic range"),
    ("train --gpus-per-worker -1", "argument --gpus-per-worker: must be a finite number >= 0"),
])
def test_bad_worker_options(line, says):
    assert says in input_error(plan, line, dict(NS, trainer=_trainer(num_workers=2)))


def test_a_trainer_is_taken_where_a_function_is():
    trainer = _trainer(num_workers=2)
    trainable, _ = ResumeCommand.parse("sweep --trainable trainer").resolve(
        dict(NS, trainer=trainer))
    assert trainable is trainer
    assert "is a int, not a function" in input_error(plan, "not_a_function --num-workers 2")


def test_help_has_the_data_parallel_group():
    doc = FtnbMagics.ftrun.__doc__
    assert "data-parallel (ScalingConfig):" in doc
    for flag in ("--num-workers N", "--gpus-per-worker N", "--cpus-per-worker N",
                 "--collective-timeout SECONDS"):
        assert flag in doc


# =================================================================================================
# The magics in an in-process IPython shell, against real experiments
# =================================================================================================

_DEFINITIONS = '''
import os, time
import ftnb

def train_quick(config):
    for i in range(config.get("n", 3)):
        ftnb.report({"loss": config["x"] / (i + 1)})

def train_broken(config):
    if config["x"] == 2:
        raise ValueError("x=2 is broken")
    for i in range(3):
        ftnb.report({"loss": float(i)})

def train_gated(config):
    """Reports every few ms until the gate file exists (then once more) or it is stopped."""
    while True:
        ftnb.report({"x": config["x"]})
        if os.path.exists(config["gate"]):
            return
        time.sleep(0.02)

space = {"x": ftnb.grid_search([1, 2])}
'''


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """One InteractiveShell for the module, with ftnb loaded and a fresh storage folder."""
    saved_main, saved_dir = sys.modules["__main__"], os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(tmp_path_factory.mktemp("ipython"))
    InteractiveShell.clear_instance()
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "nocolor"  # plain tracebacks to assert on
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "ftnb")
    store = tmp_path_factory.mktemp("store")
    ip.run_line_magic("config", f"FtnbMagics.storage_path = {str(store)!r}")
    ip.run_line_magic("config", "FtnbMagics.verbose = 0")
    assert ip.run_cell(_DEFINITIONS).success
    ip.store = str(store)
    try:
        yield ip
    finally:
        InteractiveShell.clear_instance()
        sys.modules["__main__"] = saved_main
        if saved_dir is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = saved_dir


class Cell:
    """Runs cells in the shell and captures what they print."""

    def __init__(self, shell, capsys):
        self.shell, self.capsys = shell, capsys

    def __call__(self, source: str, ok: bool = True):
        self.capsys.readouterr()
        result = self.shell.run_cell(source)
        self.out, self.err = self.capsys.readouterr()
        if ok:
            assert result.success, (self.out, self.err, result.error_in_exec)
        return result

    def usage_error(self, source: str) -> str:
        """Run a cell that must fail with one line (a UsageError), not a traceback."""
        result = self(source, ok=False)
        assert isinstance(result.error_in_exec, UsageError), (self.err, result.error_in_exec)
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("UsageError: "), self.err
        assert "Traceback" not in self.out + self.err
        return lines[0][len("UsageError: "):]

    @property
    def ns(self) -> dict:
        return self.shell.user_ns


@pytest.fixture
def cell(shell, capsys):
    return Cell(shell, capsys)


@pytest.fixture(scope="module")
def finished(shell):
    """A finished experiment 'quick', started by a line with many options."""
    result = shell.run_cell(
        "%ftrun train_quick -p space --name quick --num-samples 2 --concurrency 2 --max-failures 2 "
        "--metric loss --mode min --seed 7 --stop training_iteration=2 --num-to-keep 2 "
        "--checkpoint-score-attribute loss --checkpoint-score-order min --cpus-per-trial 0.5 "
        "--wait -o quick_handle"
    )
    assert result.success, result.error_in_exec
    return shell.user_ns["quick_handle"]


def test_load_ext_registers_the_magics(shell):
    magics = shell.magics_manager.magics
    assert {"ftrun", "ftattach", "ftls", "ftstop", "ftresume"} <= set(magics["line"])
    assert "ftrun" in magics["cell"]


def test_help_shows_every_option(cell):
    cell("%ftrun?")
    for flag in ("--param-space", "--max-failures", "--gpus-per-trial", "--concurrency",
                 "--num-to-keep", "--wait", "-o NAME", "--restart-errored"):
        assert flag in cell.out


def test_dash_dash_help_prints_the_options_and_runs_nothing(cell, shell):
    cell("%ftrun?")
    help_text = cell.out
    for line in ("%ftrun --help", "%ftrun train_quick -p space --name helped --help",
                 "%ftrun -h"):
        cell(line)
        assert cell.out.startswith("%ftrun [-p SPACE]"), cell.out
        assert "--max-failures" in cell.out and "--gpus-per-trial" in cell.out
        assert cell.out.strip().splitlines()[-1] in help_text  # the same text as %ftrun?
        assert cell.err == ""
    cell("%%ftrun --help --name helped\ndef not_run(config): pass")
    assert "--param-space" in cell.out and "not_run" not in cell.ns
    for magic, option in (("ftstop", "--trial ID"), ("ftresume", "--restart-errored"),
                          ("ftattach", "--storage PATH"), ("ftls", "STORAGE")):
        cell(f"%{magic} --help")
        assert cell.out.startswith(f"%{magic} ") and option in cell.out, cell.out
    assert not os.path.exists(os.path.join(shell.store, "helped"))


def test_a_line_with_options_runs_the_experiment_they_describe(finished, cell):
    assert finished.status() == "FINISHED"
    state = finished.state()
    settings = state.settings
    assert settings["num_samples"] == 2 and settings["max_concurrent_trials"] == 2
    assert (settings["metric"], settings["mode"], settings["seed"]) == ("loss", "min", 7)
    assert settings["failure_config"]["max_failures"] == 2
    assert settings["checkpoint_config"] == {"num_to_keep": 2, "checkpoint_score_attribute": "loss",
                                             "checkpoint_score_order": "min",
                                             "checkpoint_frequency": 0, "checkpoint_at_end": None}
    assert settings["resources_per_trial"]["cpu"] == 0.5
    assert settings["stop"] == {"training_iteration": 2}
    assert settings["origin"]["trainable"] == "train_quick"
    assert settings["origin"]["param_space"] == "space"
    assert settings["origin"]["source"].startswith("%ftrun train_quick -p space --name quick")
    assert len(state.trials) == 4  # 2 grid points x 2 samples
    # The stop criterion ended every trial at iteration 2 of 3.
    assert [t.iteration for t in state.trials] == [2, 2, 2, 2]
    assert [t.status for t in state.trials] == ["TERMINATED"] * 4
    assert cell.ns["quick_handle"].path == finished.path


def test_attach_by_name_and_by_path(finished, cell, tmp_path):
    cell("%ftattach quick -o again")
    handle = cell.ns["again"]
    assert handle.path == finished.path and handle.status() == "FINISHED"
    assert "Experiment quick: FINISHED" in cell.out  # the text view, outside a kernel
    # One thing shown: the view; the handle went to -o, not to the cell's result too.
    assert "ExperimentHandle" not in cell.out and cell.shell.user_ns.get("_") is not handle
    cell("%ftattach quick --no-widget -o again")
    assert cell.out == "" and cell.ns["again"].path == finished.path
    # ...and it is the magic's value all the same, in the middle of a cell too.
    cell("h = %ftattach quick --no-widget -o again\nh.name")
    assert cell.ns["h"] is cell.ns["again"] and cell.out.strip() == "Out[0]: 'quick'"
    # Neither a view nor -o: the handle is the cell's result.
    cell(f"%ftattach {finished.path} --no-widget")
    assert "Experiment quick" not in cell.out and "ExperimentHandle('quick'" in cell.out
    message = cell.usage_error(f"%ftattach quick --storage {tmp_path}")
    assert message.startswith(f"No ftnb experiment named 'quick' under {tmp_path}")
    message = cell.usage_error(f"%ftattach {tmp_path}")
    assert message.startswith("No ftnb experiment in that folder")


def test_widget_config_turns_the_view_off(finished, cell):
    cell("%config FtnbMagics.widget = False")
    try:
        cell("%ftattach quick")
        assert "Experiment quick" not in cell.out
    finally:
        cell("%config FtnbMagics.widget = True")


def test_ftls_is_the_listing_of_ftnb_ls(finished, cell, capsys, shell, tmp_path):
    from ftnb.cli import main

    cell("%ftls")
    assert "quick" in cell.out and "FINISHED" in cell.out
    assert main(["ls", shell.store]) == 0
    assert capsys.readouterr().out == cell.out
    cell(f"%ftls {tmp_path}")
    assert cell.out.strip() == f"No experiments under {tmp_path}"
    message = cell.usage_error(f"%ftls {tmp_path}/missing")
    assert message == f"storage path {tmp_path}/missing does not exist"


def test_bad_input_is_one_line(cell, shell):
    assert "'train_quik' is not defined in this notebook. Did you mean 'train_quick'?" in (
        cell.usage_error("%ftrun train_quik -p space"))
    assert "trainable 'space' is a dict, not a function" in cell.usage_error("%ftrun space")
    assert "unknown option --max-failure." in cell.usage_error("%ftrun train_quick --max-failure 1")
    assert "must be 1 or more" in cell.usage_error("%ftrun train_quick --concurrency 0")
    # launch's own checks (here the name) are one line too, and nothing is created.
    assert "must be a single folder name, not a path" in cell.usage_error(
        "%ftrun train_quick --name a/b")
    assert "No ftnb experiment named 'nope'" in cell.usage_error("%ftstop nope")
    assert "No ftnb experiment named 'nope'" in cell.usage_error("%ftresume nope")
    assert "unexpected argument" in cell.usage_error("%ftattach a b")
    assert not os.path.exists(os.path.join(shell.store, "a"))


def test_stop_of_an_unknown_trial_is_one_line(finished, cell):
    message = cell.usage_error("%ftstop quick --trial nope")
    assert "experiment 'quick' has no trial 'nope'" in message


def test_stop_of_a_finished_experiment_says_so(finished, cell):
    cell("%ftstop quick")
    assert "is not running (FINISHED); nothing to stop" in cell.out


def test_cell_magic_runs_the_cell_and_uses_its_function_and_space(cell):
    body = textwrap.dedent("""
        def train_cell(config):
            ftnb.report({"y": config["y"] * 10})
        param_space = {"y": ftnb.grid_search([1, 2, 3])}
    """)
    cell("%%ftrun --name cellexp --concurrency 3 --wait --no-widget -o cell_handle\n" + body)
    assert callable(cell.ns["train_cell"])
    handle = cell.ns["cell_handle"]
    assert "ftnb: cellexp FINISHED: 3 trials, 3 terminated, 0 errored" in cell.out
    state = handle.state()
    assert sorted(t.last_result["y"] for t in state.trials) == [10, 20, 30]
    assert state.settings["origin"] == {
        "trainable": "train_cell", "param_space": "param_space",
        "source": "%%ftrun --name cellexp --concurrency 3 --wait --no-widget -o cell_handle"}
    # The same cell again: the experiment exists and is complete, as one line says.
    cell("%%ftrun --name cellexp --wait --no-widget\n" + body)
    assert "ftnb: experiment 'cellexp' already finished; attached to it" in cell.out
    assert handle.status() == "FINISHED" and len(handle.state().trials) == 3


def test_cell_magic_errors_stop_before_anything_runs(cell, shell):
    # Bad options and an unclear cell are found before the cell runs.
    message = cell.usage_error("%%ftrun --name two\ndef f1(c): pass\ndef f2(c): pass")
    assert "the cell defines 2 functions (f1, f2)" in message
    assert "f1" not in cell.ns
    # A cell that raises shows its own traceback, then one line: nothing was launched, and
    # the magic's cell fails too (so that "Run All" stops there).
    result = cell("%%ftrun --name raising\ndef f3(c): pass\nraise KeyError('in the cell')",
                  ok=False)
    assert isinstance(result.error_in_exec, UsageError)
    assert "KeyError: 'in the cell'" in cell.out + cell.err
    assert cell.err.strip().splitlines()[-1] == (
        "UsageError: %%ftrun: the cell failed (above), so nothing was launched")
    assert not os.path.exists(os.path.join(shell.store, "raising"))


def test_resume_restarts_errored_trials_with_another_trainable(cell):
    cell("%ftrun train_broken -p space --name broken --wait --no-widget -q")
    assert "broken ERRORED: 2 trials, 1 terminated, 1 errored" in cell.out
    # What ended the errored trial, as `ftnb run` says it (not only the counts).
    assert "_00001 ERRORED: exception ValueError: x=2 is broken" in cell.out.split(
        "1 errored", 1)[1], cell.out
    message = cell.usage_error("%ftresume broken --trainable train_quick --restart-errored")
    # A function of another name is refused, in the magic's words.
    assert message.endswith(
        "was run by 'train_broken', not 'train_quick': resuming its trials with other code would "
        "mix two programs in one experiment. Fix: --trainable train_broken (define it first), or "
        "--allow-different-trainable if train_quick is the same training under another name (a "
        "fixed version, say)"), message
    cell("%ftresume broken --trainable train_quick --restart-errored --allow-different-trainable "
         "--wait --no-widget -o fixed")
    assert "broken FINISHED: 2 trials, 2 terminated, 0 errored" in cell.out
    trials = cell.ns["fixed"].state().trials
    assert [t.status for t in trials] == ["TERMINATED", "TERMINATED"]
    # train_quick ran for x=2 from scratch: its loss is x / (i + 1).
    assert trials[1].last_result["loss"] == pytest.approx(2 / 3)


def test_resume_keeps_the_stop_criterion(cell):
    cell("%ftrun train_broken -p space --name stopped_at_2 --stop training_iteration=2 --wait "
         "--no-widget -q")
    cell("%ftresume stopped_at_2 --trainable train_quick --restart-errored "
         "--allow-different-trainable --wait --no-widget -o h")
    assert [t.iteration for t in cell.ns["h"].state().trials] == [2, 2]


def test_stop_a_trial_stop_the_experiment_and_resume_it(cell, tmp_path):
    gate = tmp_path / "gate"
    cell.ns["gated_space"] = {"x": ftnb.grid_search([1, 2]), "gate": str(gate)}
    cell("%ftrun train_gated -p gated_space --name gated --concurrency 2 --no-widget -o gated")
    handle = cell.ns["gated"]
    assert "ftnb: experiment 'gated' runs in the background" in cell.out

    def running():
        trials = handle.state().trials
        return all(t.status == "RUNNING" and t.iteration >= 1 for t in trials) and trials

    first, second = wait_for(running, timeout=60, what="both trials to report")

    cell(f"%ftstop gated --trial {first.trial_id}")
    assert f"ftnb: stopped trial {first.trial_id} of gated (STOPPED)" in cell.out
    statuses = {t.trial_id: t.status for t in handle.state().trials}
    assert statuses == {first.trial_id: "TERMINATED", second.trial_id: "RUNNING"}

    cell("%ftstop gated")
    assert "ftnb: stopped gated (INTERRUPTED); %ftresume " in cell.out
    assert handle.status() == "INTERRUPTED" and not handle.is_live()
    stopped_at = {t.trial_id: t.iteration for t in handle.state().trials}

    # A new session has not defined the trainable yet: %ftresume says which name it needs.
    saved = cell.ns.pop("train_gated")
    message = cell.usage_error("%ftresume gated")
    assert "needs the trainable 'train_gated'" in message and "--trainable NAME" in message
    cell.ns["train_gated"] = saved

    gate.write_text("done")
    cell("%ftresume gated --wait --no-widget -o resumed")
    assert "ftnb: gated FINISHED: 2 trials, 2 terminated, 0 errored" in cell.out
    trials = {t.trial_id: t for t in cell.ns["resumed"].state().trials}
    assert all(t.status == "TERMINATED" for t in trials.values())
    # The stopped trial never ran again; the interrupted one ran a second attempt.
    assert trials[first.trial_id].iteration == stopped_at[first.trial_id]
    assert len(trials[first.trial_id].attempts) == 1
    assert len(trials[second.trial_id].attempts) == 2
    assert trials[second.trial_id].last_result["x"] == 2


def test_ctrl_c_stops_the_waiting_not_the_experiment(cell, tmp_path):
    import _thread
    import threading

    gate = tmp_path / "gate"
    cell.ns["waited_space"] = {"x": 1, "gate": str(gate)}
    main_thread = threading.main_thread().ident

    def waiting_in_wait():
        frame = sys._current_frames().get(main_thread)
        while frame is not None:
            if frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("handle.py"):
                return True
            frame = frame.f_back
        return False

    def press_ctrl_c():
        wait_for(waiting_in_wait, timeout=60, what="%ftrun --wait to be waiting")
        _thread.interrupt_main()

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    cell("%ftrun train_gated -p waited_space --name waited --wait --no-widget -o waited")
    presser.join(timeout=60)
    handle = cell.ns["waited"]  # the handle was stored before the waiting began
    assert "stopped waiting; experiment 'waited' goes on in the background" in cell.err
    assert handle.is_live() and handle.status() == "RUNNING"
    gate.write_text("done")
    wait_for(lambda: handle.status() == "FINISHED", timeout=60, what="the experiment to end")


def test_resume_without_the_space_names_the_variable_to_define(cell, tmp_path):
    """Trials whose configs hold objects (not saved with the experiment) need the space again:
    the magics say which notebook name to define, not the Python API's param_space=."""
    gate = tmp_path / "gate"
    cell.ns["space_with_objects"] = {"x": ftnb.grid_search([1, 2]), "gate": str(gate),
                                     "lock": ftnb.put(bytearray(b"an object"))}
    cell("%ftrun train_gated -p space_with_objects --name needs_space --concurrency 2 "
         "--no-widget -q -o h")
    handle = cell.ns["h"]
    wait_for(lambda: all(t.iteration >= 1 for t in handle.state().trials), timeout=60,
             what="both trials to report")
    cell("%ftstop needs_space")
    saved = cell.ns.pop("space_with_objects")
    try:
        message = cell.usage_error("%ftresume needs_space")
        assert message.startswith("%ftresume needs_space needs its search space again: its "
                                  "trials hold objects that are not saved with the experiment "
                                  "(lock ("), message
        assert message.endswith("Fix: run the cell that defines 'space_with_objects' (the "
                                "search space it was started with, space_with_objects), or "
                                "pass another: --param-space NAME"), message
        assert "param_space=" not in message
        message = cell.usage_error("%ftrun train_gated --name needs_space")
        assert message.startswith("%ftrun: resuming experiment 'needs_space' needs its search "
                                  "space again"), message
        assert "'space_with_objects'" in message
        assert handle.status() == "INTERRUPTED"  # nothing was started
    finally:
        cell.ns["space_with_objects"] = saved
    gate.write_text("done")
    cell("%ftresume needs_space --wait --no-widget")
    assert "ftnb: needs_space FINISHED: 2 trials, 2 terminated, 0 errored" in cell.out


def test_a_name_under_two_storages_says_which_one_it_acts_on(finished, cell, shell, tmp_path):
    magics = shell.magics_manager.registry["FtnbMagics"]
    other = str(tmp_path / "other")
    try:
        cell(f"%ftrun train_quick -p space --name quick --storage {other} --wait --no-widget -q")
        assert magics.used_storages[0][0] == other
        cell("%ftattach quick --no-widget -o which")
        assert cell.ns["which"].path == finished.path  # the default storage first
        assert cell.out.strip() == (
            f"ftnb: note: 'quick' is the one under {shell.store} (the default storage); "
            f"another is under {other} (--storage {other}).")
        cell(f"%ftattach quick --storage {other} --no-widget -o which")
        assert cell.ns["which"].path == os.path.join(other, "quick") and cell.out == ""
    finally:
        magics.used_storages.clear()


def test_counts_are_singular_or_plural():
    from ftnb.core.records import ExperimentState, FailureRecord, TrialRecord
    from ftnb.ui.view import ExperimentView, plural

    assert [plural(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]
    assert plural(1, "retry", "retries") == "1 retry" and plural(3, "retry", "retries") == (
        "3 retries")
    failure = FailureRecord(attempt=1, time=0.0, iteration=1, kind="preemption", counted=False)
    counted = FailureRecord(attempt=2, time=0.0, iteration=1, kind="exception")
    state = ExperimentState(name="e", trainable="t", status="FINISHED", trials=[
        TrialRecord("a", "a", {}, status="TERMINATED", failures=[failure, counted])])
    summary = ExperimentView.from_state(state).summary()
    assert "| 1 failure, 1 preemption |" in summary, summary


def test_a_trial_that_failed_once_says_once(tmp_path):
    def fails(config):
        raise ValueError("boom")

    ftnb.run(fails, name="once", storage_path=str(tmp_path),
             run_config=ftnb.RunConfig(verbose=0))
    [trial] = ftnb.attach(str(tmp_path / "once")).state().trials
    assert trial.error["reason"] == (
        "it failed 1 time, more than FailureConfig(max_failures=0) allows")


def test_ftrun_of_an_existing_experiment_with_another_function_says_the_magics_fix(cell):
    cell("%ftrun train_broken -p space --name broken_again --wait --no-widget -q")
    message = cell.usage_error("%ftrun train_quick -p space --name broken_again")
    assert message.endswith("was run by 'train_broken', not 'train_quick': resuming its trials "
                            "with other code would mix two programs in one experiment. Fix: "
                            "%ftrun train_broken (define it first), or "
                            "--allow-different-trainable if train_quick is the same training "
                            "under another name (a fixed version, say)"), message


_GROUP_DEFINITIONS = '''
def train_group(config):
    """One rank of a group of 2: all-reduces rank + 1 (3 on both), then reports until the gate
    file (if any) exists."""
    import torch
    import torch.distributed as dist

    ctx = ftnb.get_context()
    assert ctx.get_world_size() == 2 and dist.get_world_size() == 2
    total = torch.tensor([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(total)
    assert total.item() == 3.0 and "train_loop_config" not in config, config
    while True:
        ftnb.report({"sum": total.item() * config["x"]})
        if "gate" not in config or os.path.exists(config["gate"]):
            return
        time.sleep(0.05)
'''


def _groups_of_two(state, attempts=1):
    assert state.settings["num_workers"] == 2
    for trial in state.trials:
        assert len(trial.attempts) == attempts
        assert all(a.num_workers == 2 and len(set(a.pids)) == 2 for a in trial.attempts)


@pytest.mark.slow
def test_ftrun_with_worker_options_runs_each_trial_in_a_group_of_ranks(cell):
    pytest.importorskip("torch")
    cell(_GROUP_DEFINITIONS)
    cell("%ftrun train_group -p space --name group --num-workers 2 --cpus-per-worker 0.5 "
         "--wait --no-widget -o group")
    assert "ftnb: group FINISHED: 2 trials, 2 terminated, 0 errored" in cell.out, cell.out
    state = cell.ns["group"].state()
    _groups_of_two(state)
    assert [t.last_result["sum"] for t in state.trials] == [3.0, 6.0]
    assert [t.config for t in state.trials] == [{"train_loop_config": {"x": 1}},
                                                {"train_loop_config": {"x": 2}}]


@pytest.mark.slow
def test_ftresume_runs_a_stopped_group_again_in_its_ranks(cell, tmp_path):
    pytest.importorskip("torch")
    cell(_GROUP_DEFINITIONS)
    gate = tmp_path / "gate"
    cell.ns["group_space"] = {"x": 2, "gate": str(gate)}
    cell("%ftrun train_group -p group_space --name group_gated --num-workers 2 "
         "--cpus-per-worker 0.5 --no-widget -q -o h")
    handle = cell.ns["h"]
    wait_for(lambda: [t.iteration for t in handle.state().trials] >= [2], timeout=60,
             what="the group to report")
    cell("%ftstop group_gated")
    assert handle.status() == "INTERRUPTED"
    gate.write_text("done")
    # The function alone and the notebook's plain space (the names %ftrun recorded): each rank
    # runs it in a group of 2 again, with the config a plain trial gets.
    cell("%ftresume group_gated --wait --no-widget -o resumed")
    assert "ftnb: group_gated FINISHED: 1 trial, 1 terminated, 0 errored" in cell.out, cell.out
    state = cell.ns["resumed"].state()
    _groups_of_two(state, attempts=2)
    assert state.trials[0].last_result["sum"] == 6.0
