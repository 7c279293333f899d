"""Where the detached supervisor runs (ftnb.launchers): the ``command`` launcher with a real
command template (a wrapper script that records its invocation and execs the supervisor with
``setsid``, as ``systemd-run`` or ``ssh`` would start it elsewhere), the errors of launchers and
templates that cannot work, which setting wins, and the temporary folders a SIGKILLed supervisor
leaves behind, swept by the next launch. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest

import ftnb
from ftnb import supervisor
from ftnb.launchers import temp_folders
from ftnb.launchers import LauncherError, LocalLauncher, launcher_for, launcher_setting
from ftnb.launchers.command import CommandLauncher
from ftnb.notebook.magic_commands import RunCommand
from ftnb.notebook.magic_options import MagicDefaults
from ftnb.notebook.magics import FtnbMagics
from ftnb.run_options import InputError
from procs import pid_alive, wait_for
from scripted import executed, scripted

pytestmark = pytest.mark.timeout(180)


def _space(tmp_path, n=4, trials=1):
    return {"n": n, "sleep": 0.05, "ckpt_every": 1, "gate": str(tmp_path / "gate"),
            "x": ftnb.grid_search(list(range(trials)))}


def _wrapper(tmp_path) -> tuple[str, str]:
    """A launcher command of our own: records how it was called, then execs the command in a
    session of its own (``setsid``), returning at once as ``systemd-run`` does."""
    record = tmp_path / "invocations"
    script = tmp_path / "start supervisor.sh"  # a space: the template must quote it
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{record}'\nexec setsid \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return f"'{script}' {{command}}", str(record)


def _record(handle) -> dict:
    with open(handle.paths.supervisor) as f:
        return json.load(f)


@pytest.fixture
def launch_dir(tmp_path, monkeypatch):
    folder = tmp_path / "launch files"
    monkeypatch.setenv("FTNB_LAUNCH_DIR", str(folder))
    return folder


def test_the_command_launcher_runs_an_experiment_that_attach_stop_and_resume_reach(
        tmp_path, monkeypatch, launch_dir, capsys):
    template, record = _wrapper(tmp_path)
    monkeypatch.setenv("FTNB_LAUNCHER", "command")  # the hub-wide default, as a spawner sets it
    monkeypatch.setenv("FTNB_LAUNCHER_COMMAND", template)
    store = str(tmp_path / "store")
    # (A trial waiting at the gate does not report: a stop kills it after the grace period.)
    quick = ftnb.RunConfig(failure_config=ftnb.FailureConfig(preemption_grace_period_s=0.5))
    handle = ftnb.launch(scripted, param_space=_space(tmp_path, n=6), name="cmd",
                         storage_path=store, run_config=quick)
    assert "runs in the background" in capsys.readouterr().out
    with open(record) as f:
        (invocation,) = f.read().splitlines()
    assert "-m ftnb.supervisor --launch-file" in invocation and "--launcher command" in invocation
    record_json = _record(handle)
    assert record_json["launcher"] == "command"
    pid = record_json["pid"]
    assert handle._process is None  # not this process's child: the command started it
    assert os.getsid(pid) == pid != os.getsid(0)
    # Any process that sees the storage finds it, running.
    attached = ftnb.attach("cmd", storage_path=store)
    assert attached.is_live() and attached.status() == "RUNNING"
    wait_for(lambda: attached.state().trials and attached.state().trials[0].iteration >= 2,
             timeout=60, what="two iterations")
    attached.stop(timeout=60)
    assert attached.status() == "INTERRUPTED"
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the supervisor to exit")
    (tmp_path / "gate").write_text("open")
    resumed = attached.resume(scripted, param_space=_space(tmp_path, n=6), quiet=True)
    results = resumed.wait(timeout=90)
    assert resumed.status() == "FINISHED" and results[0].metrics["training_iteration"] == 6
    with open(record) as f:
        assert len(f.read().splitlines()) == 2  # the resume went through the command too
    assert _record(resumed)["launcher"] == "command" and _record(resumed)["pid"] != pid
    (trial,) = resumed.state().trials
    steps = [step for _, step in executed(os.path.join(resumed.path, trial.dir_name))]
    assert sorted(steps) == list(range(1, 7)) == sorted(set(steps))  # each iteration once
    # Nothing left in the launch folder: the launch file read, the reply and output taken,
    # the log moved into the experiment.
    assert os.listdir(launch_dir) == []
    with open(resumed.supervisor_log) as f:
        assert "supervisor exiting" in f.read()


def test_a_command_that_fails_is_reported_with_its_output_and_starts_nothing(tmp_path,
                                                                           launch_dir):
    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 3\n")
    failing.chmod(0o755)
    store = tmp_path / "store"
    with pytest.raises(supervisor.SupervisorError) as caught:
        ftnb.launch(scripted, param_space=_space(tmp_path), name="never",
                    storage_path=str(store), launcher=CommandLauncher(f"{failing} {{command}}"))
    message = str(caught.value)
    assert "exited with code 3" in message and "invalid partition" in message
    assert str(failing) in message  # the command as run
    assert not (store / "never").exists()
    assert not [f for f in os.listdir(launch_dir) if f.endswith(".pkl")]  # no launch file left


def test_launchers_and_templates_that_cannot_work_are_refused_before_anything_starts(
        tmp_path, monkeypatch):
    store = tmp_path / "store"

    def launch(**kwargs):
        ftnb.launch(scripted, param_space={"n": 1}, name="bad", storage_path=str(store),
                    **kwargs)

    with pytest.raises(LauncherError, match=r"launcher='rya' is not a launcher.*did you mean "
                                            r"'ray'.*'local', 'ray', 'command'"):
        launch(launcher="rya")
    monkeypatch.setenv("FTNB_LAUNCHER", "kubernetes")
    with pytest.raises(LauncherError, match=r"\$FTNB_LAUNCHER='kubernetes' is not a launcher"):
        launch()
    monkeypatch.setenv("FTNB_LAUNCHER", "command")
    monkeypatch.delenv("FTNB_LAUNCHER_COMMAND", raising=False)
    with pytest.raises(LauncherError, match="needs a command template.*FTNB_LAUNCHER_COMMAND"):
        launch()
    monkeypatch.setenv("FTNB_LAUNCHER_COMMAND", "systemd-run --user --collect")
    with pytest.raises(LauncherError, match=r"\$FTNB_LAUNCHER_COMMAND='systemd-run --user "
                                            r"--collect' has no \{command\}"):
        launch()
    bad_templates = {
        "setsid {cmd}": r"\{cmd\} is not a placeholder ftnb fills.*\{command\}, "
                        r"\{quoted_command\}",
        "setsid {command": "stray brace",
        "setsid {command!r}": r"\{command!r\} is not a placeholder",
        "sh -c 'exec {command}": "cannot be split into words",
        "no-such-launcher-xyz {command}": "'no-such-launcher-xyz' is not found on PATH",
        "": "is not a command template",
    }
    for template, error in bad_templates.items():
        with pytest.raises(LauncherError, match=error):
            launch(launcher=CommandLauncher(template))
    with pytest.raises(LauncherError, match="neither a launcher's name nor a launcher"):
        launch(launcher=42)
    assert not store.exists()
    # The front-ends: one line each (argparse's choices; the template's own check).
    with pytest.raises(InputError, match="--launcher: invalid choice: 'rya'"):
        RunCommand.parse("train --launcher rya")
    with pytest.raises(InputError, match="has no {command}"):
        RunCommand.parse("train --launcher-command 'ssh gpu1'").resolve({"train": scripted})
    with pytest.raises(Exception, match="FtnbMagics.launcher='rya'"):
        FtnbMagics(launcher="rya")


def test_the_launcher_setting_argument_then_magic_option_then_config_then_environment(
        monkeypatch):
    monkeypatch.setenv("FTNB_LAUNCHER", "ray")
    monkeypatch.setenv("FTNB_LAUNCHER_COMMAND", "setsid {command}")
    # The environment: the default of every front-end, read when nothing else is set.
    assert launcher_for(None).name == "ray"
    assert isinstance(launcher_for("command"), CommandLauncher)
    assert launcher_for("command").template == "setsid {command}"
    magics = FtnbMagics()
    assert (magics.launcher, magics.launcher_command) == ("ray", "setsid {command}")
    # %config beats the environment; the magic's option beats %config.
    magics = FtnbMagics(launcher="command", launcher_command="nohup {command}")
    plan = RunCommand.parse("train", magics.defaults()).resolve({"train": scripted})
    assert plan.kwargs["launcher"].template == "nohup {command}"
    plan = RunCommand.parse("train --launcher local", magics.defaults()).resolve(
        {"train": scripted})
    assert plan.kwargs["launcher"] == "local"
    plan = RunCommand.parse("train --launcher-command 'setsid -f {command}'",
                            magics.defaults()).resolve({"train": scripted})
    assert plan.kwargs["launcher"].template == "setsid -f {command}"
    # A template in the configuration alone does not switch the launcher.
    assert launcher_setting(None, None, None, "nohup {command}") is None
    assert launcher_setting("ray", None, "command", "nohup {command}") == "ray"
    # The argument of ftnb.launch beats everything: it is what the front-ends pass.
    assert isinstance(launcher_for(LocalLauncher()), LocalLauncher)
    assert launcher_for("local").name == "local"
    monkeypatch.delenv("FTNB_LAUNCHER")
    assert launcher_for(None).name == "local"  # the default on a plain machine


def test_the_cli_takes_the_launcher_and_a_launcher_implies_detach(tmp_path, launch_dir):
    from ftnb.cli.running import RUN, cmd_run

    template, record = _wrapper(tmp_path)
    (tmp_path / "jobs.py").write_text(
        "import ftnb\n"
        "def train(config):\n"
        "    for i in range(3):\n"
        "        ftnb.report({'x': config['x'] * i})\n")
    args = RUN.parse(f"{tmp_path}/jobs.py:train -p '{{\"x\": 2}}' -n clirun --storage "
                     f"'{tmp_path}/store' --launcher-command \"{template}\"")
    args.json = True
    assert cmd_run(args) == 0  # returned at once: detached
    handle = ftnb.attach("clirun", storage_path=str(tmp_path / "store"))
    assert handle.wait(timeout=60)[0].metrics["x"] == 4
    assert _record(handle)["launcher"] == "command"
    assert os.path.exists(record)


def test_a_sigkilled_supervisor_leaves_no_temporary_folder_after_the_next_launch(tmp_path):
    """multiprocessing's ``pymp-*`` folder (the fork server's socket) lives in a folder named
    after the supervisor, which a SIGKILL leaves behind and the next launch removes."""
    store = str(tmp_path / "store")
    handle = ftnb.launch(scripted, param_space=_space(tmp_path), name="killed",
                         storage_path=store, quiet=True)
    record = _record(handle)
    pid = record["pid"]
    root = temp_folders.temp_folders_root()
    mine = [n for n in os.listdir(root) if n.split("-")[1:2] == [str(pid)]]
    assert len(mine) == 1, os.listdir(root)
    folder = os.path.join(root, mine[0])
    wait_for(lambda: handle.state().trials and handle.state().trials[0].iteration >= 1,
             timeout=60, what="a trial to report")
    assert [n for n in os.listdir(folder) if n.startswith("pymp-")]  # the fork server's
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the supervisor to die")
    assert os.path.isdir(folder)  # left behind
    (tmp_path / "gate").write_text("open")
    again = ftnb.launch(scripted, param_space=_space(tmp_path), name="killed",
                        storage_path=store, quiet=True)
    assert not os.path.exists(folder)
    again.wait(timeout=60)
    # The supervisor that ended normally removed its own.
    new_pid = _record(again)["pid"]
    assert not [n for n in os.listdir(root) if n.split("-")[1:2] == [str(new_pid)]]
