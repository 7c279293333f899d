"""Bad input to the ``ftnb`` command (real processes: one line, exit code 2, nothing created),
and the option table that ``ftnb run`` shares with ``%ftrun``: same options, same arguments,
search spaces given as dict literals in both."""

from __future__ import annotations

import pytest

import ftnb
from clirun import cli_in, one_line_error, write
from ftnb.cli.references import ReferenceNames
from ftnb.cli.running import RESUME, RUN
from ftnb.notebook.magics import FTRESUME, FTRUN, MagicInputError, ResumeCommand, RunCommand
from ftnb.run_options import InputError, RunDefaults, launch_arguments

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cli(tmp_path):
    yield from cli_in(tmp_path)


_FILES = {
    "raises.py": "import ftnb\nx = 1 / 0\n\ndef train(config):\n    pass\n",
    "exits.py": "import sys\nsys.exit(2)\n",
    "syntax.py": "def train(config)\n    pass\n",
    "noargs.py": "import ftnb\n\ndef train():\n    ftnb.report({'a': 1})\n",
}


@pytest.mark.parametrize("argv, fragments", [
    (["nofile.py:train"], ["TRAINABLE: no file 'nofile.py'", "check the path"]),
    (["jobs.py:quik"], ["jobs.py has no attribute 'quik'", "Did you mean 'quick'?"]),
    (["jobs.py"], ["names a file, not a function in it", "Fix: jobs.py:gated"]),
    (["jobs.py:space"], ["TRAINABLE 'jobs.py:space' is a dict, not a function"]),
    (["nomod.sub:train"], ["no module named 'nomod'", "path/to/sub.py:NAME"]),
    (["raises.py:train"], ["importing raises.py failed: ZeroDivisionError",
                           "(raises.py, line 2)"]),
    (["exits.py:train"], ["exited (SystemExit: 2)", 'if __name__ == "__main__":']),
    (["syntax.py:train"], ["SyntaxError", "(syntax.py, line 1)"]),
    (["noargs.py:train"], ["cannot be called as train(config)"]),
    (["jobs.py:quick", "-p", "{a:1}"], ["--param-space '{a:1}' is not a dict literal",
                                        "its quotes were lost", "Accepted: a dict literal"]),
    (["jobs.py:quick", "-p", "{a:", "1}"], ["--param-space '{a: 1}' is cut into words",
                                            "quoted as one word"]),
    (["jobs.py:quick", "-p", '{"x": ftnb.grid_search([1])}'], ["no calls",
                                                               '{"grid_search": [...]}']),
    (["jobs.py:quick", "-p", "[1, 2]"], ["not one of the accepted forms"]),
    (["jobs.py:quick", "-p", "jobs.py:not_a_dict"], ["is a list, not a dict"]),
    (["jobs.py:quick", "-p", "missing.json"], ["no file 'missing.json'"]),
    (["jobs.py:quick", "--max-failure", "3"], ["unknown option --max-failure",
                                               "Did you mean --max-failures?",
                                               "`ftnb run --help` shows the options"]),
    (["jobs.py:quick", "--concurrency", "0"], ["argument --concurrency: must be 1 or more"]),
    (["jobs.py:quick", "--stop", "loss=low"], ["'loss=low' is not METRIC=NUMBER"]),
    (["jobs.py:quick", "--stop", "jobs.py:nope"], ["jobs.py has no attribute 'nope'"]),
    (["jobs.py:quick", "--mode", "min"], ["mode"]),
    (["jobs.py:quick", "--name", "a/b"], ["--name 'a/b' must be a folder name without '/'"]),
    (["jobs.py:quick", "extra"], ["unexpected argument 'extra'"]),
    (["jobs.py:quick", "--name", "n" * 300], ["ftnb run: --name 'nnnnnnnnnnnnnnnnnnnn'... is too long "
                                              "(300 characters)", "at most 255 bytes",
                                              "Fix: a shorter name"]),
    (["jobs.py:quick", "--storage", "d" * 300 + "/runs"],
     ["ftnb run: --storage has a folder name 300 bytes long", "Fix: a storage path with shorter"]),
])
def test_bad_input_to_run_is_one_line_exit_2_and_creates_nothing(cli, argv, fragments):
    for name, body in _FILES.items():
        write(cli.cwd, name, body)
    done = cli("run", *argv, "--name", "never") if "--name" not in argv else cli("run", *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    one_line_error(done.stderr, *fragments)
    assert not cli.storage.exists()  # not even the storage folder


@pytest.mark.parametrize("verb", ["status", "stop", "resume", "logs", "watch", "rm"])
def test_every_verb_says_when_there_is_no_such_experiment(cli, verb):
    done = cli(verb, "nope")
    assert done.returncode == 2 and done.stdout == ""
    one_line_error(done.stderr, "no experiment named 'nope'")


def test_usage_errors_of_the_command_itself(cli):
    assert cli().returncode == 2
    done = cli("frobnicate")
    assert done.returncode == 2 and "invalid choice: 'frobnicate'" in done.stderr
    done = cli("watch", "x", "--intervall", "1")
    one_line_error(done.stderr, "ftnb watch: unknown option --intervall",
                   "Did you mean --interval?")
    assert "exit codes:" in cli("--help").stdout and "130" in cli("run", "--help").stdout


# -- one option table for %ftrun and ftnb run -----------------------------------------------------
def _options(spec, leave_out: str) -> list[tuple]:
    """(flags, dest, nargs, type, choices, default) of each option up to the front-end's own
    group, titled ``leave_out``."""
    out = []
    for item in spec.items:
        if getattr(item, "title", None) == leave_out:
            break
        if hasattr(item, "flags"):
            kw = item.kwargs
            out.append((item.flags, kw.get("dest"), kw.get("action"), kw.get("type"),
                        kw.get("choices"), kw.get("default")))
    return out


def test_ftnb_run_and_ftrun_take_the_same_options():
    ftrun, run = _options(FTRUN, "notebook"), _options(RUN, "command line")
    # The trainable differs only in being optional in %%ftrun (the cell may define it).
    assert ftrun[0][0] == run[0][0] == ("trainable",)
    assert ftrun[1:] == run[1:]
    ftresume, resume = _options(FTRESUME, "notebook"), _options(RESUME, "command line")
    assert ftresume[: len(resume)] == resume
    for flag in ("--allow-different-trainable", "--restart-errored", "--param-space"):
        assert any(flag in o[0] for o in resume)


def _launched_both_ways(line: str):
    """``line``'s launch arguments from %ftrun and from ``ftnb run``: (notebook, cli)."""
    notebook = RunCommand.parse(f"train -p '{{\"x\": 1}}' {line}").resolve(
        {"train": ftnb.report})
    args = RUN.parse(f"scripted:scripted {line}")
    cli = launch_arguments(args, ReferenceNames(), trainable=args.trainable,
                           param_space='{"x": 1}', space_forms="", defaults=RunDefaults(),
                           origin={})
    return notebook, cli


def test_the_same_line_gives_the_same_launch_arguments_in_both():
    line = ("--max-failures 3 --concurrency 2 --stop loss=0.1 --num-samples 2 --metric loss "
            "--mode min --seed 7 --cpus-per-trial 0.5 --fail-fast --num-to-keep 2 "
            "--preemption-grace 5 --restart-errored --allow-different-trainable --name n1")
    notebook, cli = _launched_both_ways(line)
    for key in ("param_space", "name", "tune_config", "run_config", "resources_per_trial",
                "restart_errored", "allow_different_trainable"):
        assert notebook.kwargs[key] == cli.kwargs[key], key
    assert notebook.kwargs["param_space"] == {"x": 1}


@pytest.mark.parametrize("given, says", [
    ("{a:1}", "its quotes were lost"),
    ("'{\"lr\": ftnb.grid_search([0.1])}'", "no calls"),
    ("'[1, 2]'", "'[1, 2]' is neither a name nor a dict literal"),
    ("not-a-name", "is neither a name nor a dict literal. Accepted: the name of a dict"),
])
def test_ftrun_says_what_param_space_accepts(given, says):
    with pytest.raises(MagicInputError) as info:
        RunCommand.parse(f"train -p {given}").resolve({"train": ftnb.report})
    assert says in str(info.value) and "\n" not in str(info.value)


def test_ftrun_and_ftresume_take_a_dict_literal():
    plan = RunCommand.parse("""train -p '{"x": {"grid_search": [1, 2]}, "on": true}'""").resolve(
        {"train": ftnb.report})
    assert plan.kwargs["param_space"] == {"x": {"grid_search": [1, 2]}, "on": True}
    command = ResumeCommand.parse("""s1 -p '{"y": 1}'""")
    assert command.resolve({"train": ftnb.report}, {"trainable": "train"}) == (
        ftnb.report, {"y": 1})


def test_endless_sampling_with_a_time_budget_is_the_same_in_both():
    notebook, cli = _launched_both_ways("--num-samples -1 --time-budget-s 30 --name n2")
    tune_config = cli.kwargs["tune_config"]
    assert (tune_config.num_samples, tune_config.time_budget_s) == (-1, 30)
    assert notebook.kwargs["tune_config"] == tune_config


def test_num_samples_zero_is_refused_naming_the_choices():
    with pytest.raises(InputError, match=r"--num-samples: must be 1 or more, or -1 .*got 0"):
        RUN.parse("scripted:scripted --num-samples 0")
