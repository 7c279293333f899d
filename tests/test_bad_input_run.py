"""Bad input and rough endings met by real processes: Ctrl+C in a script ends on the resume line
(no traceback, Ctrl+C's exit status), and a resumed experiment drops the temporary files a
killed driver left, only once it owns the experiment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import ftnb
from ftnb.core.records import ExperimentState
from ftnb.storage import ExperimentPaths
from procs import REPO, TESTS, run_again_line, run_script, wait_for
from scripted import result_rows, scripted

pytestmark = pytest.mark.slow

# Prints its pid, then runs two long trials; ``sys.argv[2]`` says what the script does with a
# KeyboardInterrupt: "let" it through, or "wrap" it in another error.
DRIVER = """
import os, sys
import ftnb
from scripted import scripted

print(os.getpid(), flush=True)
try:
    ftnb.run(scripted, name="long", storage_path=sys.argv[1],
             param_space={"n": 400, "sleep": 0.05, "i": ftnb.grid_search([0, 1])},
             run_config=ftnb.RunConfig(verbose=0))
except KeyboardInterrupt:
    if sys.argv[2] == "wrap":
        raise RuntimeError("the script's own error")
    raise
"""


def _interrupt_under_a_shell(tmp_path, handling: str) -> tuple[str, str]:
    """Run DRIVER as a shell runs a script, send its Python process SIGINT (what Ctrl+C sends)
    once both trials reported, and return (what the shell printed, Python's stderr)."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    err_path = tmp_path / "stderr.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]), PYTHONUNBUFFERED="1")
    shell = subprocess.Popen(
        ["bash", "-c", '"$0" "$1" "$2" "$3" 2>"$4"; echo "exit status $?"',
         sys.executable, str(script), str(tmp_path), handling, str(err_path)],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(shell.stdout.readline())
        exp = tmp_path / "long"
        wait_for(lambda: exp.is_dir() and len([d for d in exp.iterdir() if d.is_dir()]) == 2
                 and all(len(result_rows(str(d))) >= 2 for d in exp.iterdir() if d.is_dir()),
                 timeout=60, what="both trials to report")
        os.kill(pid, signal.SIGINT)
        out, _ = shell.communicate(timeout=60)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.communicate()
    return out, err_path.read_text()


def test_ctrl_c_in_a_script_ends_on_the_resume_line_with_status_130(tmp_path):
    out, err = _interrupt_under_a_shell(tmp_path, "let")
    exp = tmp_path / "long"
    assert out.strip() == "exit status 130", (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-2:] == [
        "ftnb: experiment 'long' interrupted; its trials were stopped and its state saved. "
        "Resume it with:",
        # ftnb.run resumes by name: the script's own command line, again.
        "    " + run_again_line(str(tmp_path / "driver.py"), str(tmp_path), "let"),
    ], err
    state = ExperimentState.load(ExperimentPaths.at(str(exp)))
    assert state.status == "INTERRUPTED"
    assert all(t.failures == [] for t in state.trials)


def test_an_error_of_the_script_after_ctrl_c_keeps_its_traceback(tmp_path):
    out, err = _interrupt_under_a_shell(tmp_path, "wrap")
    assert out.strip() == "exit status 1", (out, err)
    assert "Resume it with:" in err
    assert "Traceback" in err and err.strip().endswith("RuntimeError: the script's own error")


BLOCKED_DRIVER = """
import sys
import ftnb
from scripted import scripted

ftnb.run(scripted, name="held", storage_path=sys.argv[1],
         param_space={"n": 3, "ckpt_every": 1, "gate": sys.argv[2]},
         run_config=ftnb.RunConfig(verbose=0))
"""


def _leftovers(exp, trial_dir) -> dict:
    """Temporary files as a driver or a trial killed mid-write leaves them ("ours", which a
    resuming owner removes), and look-alikes it must leave alone."""
    hexa = "0123456789ab"
    return {
        "ours": [exp / f".experiment_state.prev.json.{hexa}.tmp",
                 exp / f".experiment_state.json.{hexa}.tmp",
                 trial_dir / f".params.json.{hexa}.tmp",
                 trial_dir / f".trial.json.{hexa}.tmp",
                 trial_dir / f".progress.csv.{hexa}.tmp",
                 # (written under the lease lock, whose next holder sweeps it)
                 exp / f".owner.json.{hexa}.tmp"],
        "others": [exp / "control" / f".request.json.{hexa}.tmp",
                   exp / ".experiment_state.prev.json.tmp",
                   exp / f".notes.txt.{hexa}.tmp",
                   trial_dir / f".my_data.csv.{hexa}.tmp",
                   exp / "notes.tmp"],
    }


def test_resume_removes_a_killed_drivers_temporary_files_once_it_owns_the_experiment(tmp_path):
    gate = tmp_path / "gate"
    proc = run_script(tmp_path, BLOCKED_DRIVER, str(tmp_path), str(gate))
    exp = tmp_path / "held"
    try:
        wait_for(lambda: exp.is_dir() and any(len(result_rows(str(d))) >= 2
                                              for d in exp.iterdir() if d.is_dir()),
                 what="the trial's first reports")
        trial_dir = next(d for d in exp.iterdir() if (d / "params.json").exists())
        files = _leftovers(exp, trial_dir)
        (exp / "control").mkdir(exist_ok=True)
        for path in files["ours"] + files["others"]:
            path.write_bytes(b"half-written")
        # The driver is alive: nobody else may touch its files, temporary ones included.
        with pytest.raises(ftnb.ExperimentLockedError):
            ftnb.run(scripted, name="held", storage_path=str(tmp_path))
        assert all(p.exists() for p in files["ours"] + files["others"])
        proc.kill()  # dies as a driver killed mid-write would
        proc.wait(timeout=30)  # (its blocked trial lives on, holding stdout, until reaped)
        gate.write_text("open")
        results = ftnb.run(scripted, name="held", storage_path=str(tmp_path),
                           run_config=ftnb.RunConfig(verbose=0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
    assert results.num_terminated == 1
    assert [p.name for p in files["ours"] if p.exists()] == []
    assert [p.name for p in files["others"] if not p.exists()] == []


def test_interrupting_fit_in_a_kernel_keeps_the_kernel(tmp_path):
    """The same Ctrl+C in a notebook (a real kernel, interrupted as JupyterLab's stop button
    does): the cell ends with the resume line and KeyboardInterrupt, the kernel lives on."""
    pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    import threading

    from test_kernel import Kernel

    kernel = Kernel(str(tmp_path))
    try:
        outputs = []
        cell = threading.Thread(target=lambda: outputs.append(kernel.run(
            "import ftnb\nfrom scripted import scripted\n"
            f"ftnb.run(scripted, name='nb', storage_path={str(tmp_path)!r}, "
            "param_space={'n': 400, 'sleep': 0.05}, run_config=ftnb.RunConfig(verbose=0))",
            timeout=120)))
        cell.start()
        exp = tmp_path / "nb"
        wait_for(lambda: exp.is_dir() and any(len(result_rows(str(d))) >= 2
                                              for d in exp.iterdir() if d.is_dir()),
                 timeout=90, what="the trial's first reports")
        kernel.km.interrupt_kernel()
        cell.join(timeout=120)
        assert outputs, "the cell never ended"
        out = outputs[0]
        assert f"ftnb.Tuner.restore({str(exp)!r}, scripted).fit()" in out, out
        assert out.rstrip().endswith("KeyboardInterrupt:"), out
        assert kernel.run("print(40 + 2)") == "42\n"
        state = ExperimentState.load(ExperimentPaths.at(str(exp)))
        assert state.status == "INTERRUPTED"
    finally:
        kernel.shutdown()
