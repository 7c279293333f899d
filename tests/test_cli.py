"""Behavioural tests for the ``ftnb`` command (ftnb/cli.py), on experiments made by real sweeps."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ftnb
from ftnb.cli import main
from ftnb.core.records import ExperimentState, TrialRecord
from ftnb.storage import ExperimentPaths
from ftnb.ui.view import ExperimentView

# -- trainables (module level: trial processes import them by reference) -----------------------


def train_flaky(config):
    """Fails once, on its first attempt, for x == 2; every other attempt runs to the end."""
    attempt = ftnb.get_context().attempt
    for step in range(3):
        if config["x"] == 2 and attempt == 1 and step == 1:
            raise ValueError("boom on the first attempt")
        ftnb.report({"loss": config["x"] / (step + 1), "acc": 0.1 * step})


def train_broken(config):
    """x == 2 fails on every attempt, so that trial ends ERRORED."""
    ftnb.report({"score": float(config["x"])})
    if config["x"] == 2:
        raise RuntimeError("always broken")
    ftnb.report({"score": 10.0 * config["x"]})


def _run(storage: Path, name: str, trainable, xs: list, metric: str | None = None) -> None:
    ftnb.Tuner(
        trainable,
        param_space={"x": ftnb.grid_search(xs), "fixed": "same"},
        tune_config=ftnb.TuneConfig(metric=metric, mode="min" if metric else None),
        run_config=ftnb.RunConfig(
            storage_path=str(storage),
            name=name,
            verbose=0,
            failure_config=ftnb.FailureConfig(max_failures=1),
        ),
    ).fit()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A storage folder with two real experiments (alpha older, beta newer) and some clutter."""
    root = tmp_path_factory.mktemp("store")
    _run(root, "alpha", train_flaky, [1, 2, 3], metric="loss")
    _run(root, "beta", train_broken, [1, 2])
    (root / "notes").mkdir()  # a folder without experiment_state.json: skipped silently
    (root / "notes" / "todo.txt").write_text("not an experiment\n")
    (root / "README.txt").write_text("a loose file\n")
    return root


def _copy_experiment(store: Path, name: str, dest_root: Path, new_name: str | None = None) -> Path:
    dest = dest_root / (new_name or name)
    shutil.copytree(store / name, dest)
    return dest


def _snapshot(root: Path) -> dict:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def _ls_rows(out: str) -> dict[str, list[str]]:
    lines = out.strip().splitlines()
    assert lines[0].split() == [
        "NAME", "STATUS", "TRIALS", "PEND", "RUN", "INTR", "PAUSE", "TERM", "ERR",
        "FAILURES", "PREEMPT", "UPDATED",
    ]
    rows = {}
    for line in lines[1:]:
        if not line.strip():
            break  # the UNREADABLE reasons follow the table after a blank line
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def _assert_one_line_error(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ftnb: error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- ftnb ls -----------------------------------------------------------------------------------


_DRIVER_KILLED_MID_RUN = """
import time
import ftnb

def train(config):
    for step in range(10_000):
        ftnb.report({{"step": step}})
        time.sleep(0.05)

ftnb.run(train, name="cut", storage_path={root!r}, param_space={{"x": ftnb.grid_search([1, 2, 3])}},
         tune_config=ftnb.TuneConfig(max_concurrent_trials=2))
"""


def test_ls_counts_the_trials_a_dead_driver_left_running(tmp_path, capsys) -> None:
    from procs import wait_for

    script = tmp_path / "driver.py"
    script.write_text(_DRIVER_KILLED_MID_RUN.format(root=str(tmp_path / "runs")))
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        exp = tmp_path / "runs" / "cut"

        def two_reporting() -> bool:
            assert driver.poll() is None, "the driver ended before it was killed"
            return len([r for r in exp.glob("*/result.json") if r.stat().st_size]) == 2

        wait_for(two_reporting, timeout=120, what="two trials reporting")
    finally:
        driver.kill()
        driver.wait()
    assert main(["ls", str(tmp_path / "runs")]) == 0
    row = _ls_rows(capsys.readouterr().out)["cut"]
    # The two trials that were running count as INTERRUPTED (they continue on a resume), the
    # third as PENDING: every trial is in some column.
    assert row[1:9] == ["INTERRUPTED", "3", "1", "0", "2", "0", "0", "0"]


def test_ls_lists_each_experiment_with_counts_and_failures(store, capsys) -> None:
    assert main(["ls", str(store)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = _ls_rows(out)
    assert list(rows) == ["alpha", "beta"]  # sorted by last update, newest last
    assert "notes" not in out and "README" not in out

    name, status, trials, pend, run, intr, pause, term, err_, failures, preempt, day, clock = rows[
        "alpha"
    ]
    assert (status, trials, pend, run, intr, pause, term, err_) == (
        "FINISHED", "3", "0", "0", "0", "0", "3", "0"
    )
    assert (failures, preempt) == ("1", "0")
    state = ExperimentState.load(ExperimentPaths.at(str(store / "alpha")))
    assert f"{day} {clock}" == time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(state.updated)
    )

    beta = rows["beta"]
    assert beta[2:9] == ["2", "0", "0", "0", "0", "1", "1"]  # one TERMINATED, one ERRORED
    assert beta[9] == "2"  # the ERRORED trial failed on both of its attempts


def test_ftls_lists_the_newest_first(store, capsys) -> None:
    # %ftls's listing: a cell's output is read from the top, so the newest comes first there
    # (a terminal's `ftnb ls` puts it last, next to the prompt).
    from ftnb.cli import list_experiments

    assert list_experiments(str(store), newest_first=True) == 0
    assert list(_ls_rows(capsys.readouterr().out)) == ["beta", "alpha"]


def test_ls_default_storage_comes_from_the_environment(store, capsys, monkeypatch) -> None:
    monkeypatch.setenv("FTNB_STORAGE_PATH", str(store))
    assert main(["ls"]) == 0
    assert list(_ls_rows(capsys.readouterr().out)) == ["alpha", "beta"]


def test_ls_json_is_a_list_for_scripts(store, capsys) -> None:
    assert main(["ls", str(store), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [e["name"] for e in data] == ["alpha", "beta"]
    alpha = data[0]
    assert alpha["status"] == "FINISHED"
    assert alpha["trials"] == 3
    assert alpha["counts"]["TERMINATED"] == 3
    assert alpha["failures"] == 1
    assert alpha["preemptions"] == 0
    assert alpha["error"] is None
    assert alpha["path"] == str(store / "alpha")
    assert data[0]["updated"] <= data[1]["updated"]


def test_ls_missing_storage_is_a_one_line_error(tmp_path, capsys) -> None:
    missing = tmp_path / "no-such-storage"
    assert main(["ls", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _assert_one_line_error(err, str(missing), "does not exist")


def test_ls_missing_default_storage_names_where_it_came_from(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "unset-storage"
    monkeypatch.setenv("FTNB_STORAGE_PATH", str(missing))
    assert main(["ls"]) == 2
    _assert_one_line_error(capsys.readouterr().err, str(missing), "FTNB_STORAGE_PATH")


def test_ls_on_a_file_is_an_error(store, capsys) -> None:
    assert main(["ls", str(store / "README.txt")]) == 2
    _assert_one_line_error(capsys.readouterr().err, "README.txt", "not a folder")


def test_ls_empty_storage(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "not-an-experiment").mkdir()
    assert main(["ls", str(tmp_path / "empty")]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"No experiments under {tmp_path / 'empty'}"
    assert err == ""


def test_ls_on_an_experiment_folder_shows_that_experiment(store, capsys) -> None:
    assert main(["ls", str(store / "alpha")]) == 0
    out, err = capsys.readouterr()
    assert list(_ls_rows(out)) == ["alpha"]
    assert "ftnb status" in err


# -- ftnb status -------------------------------------------------------------------------------


def test_status_shows_summary_and_a_row_per_trial(store, capsys) -> None:
    assert main(["status", str(store / "alpha")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("Experiment alpha: FINISHED | 3 TERMINATED | 1 failure, 0 pre")
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    # the varying param (x) is a column, the constant one (fixed) is not; the metric comes first
    assert header[:7] == ["trial_id", "status", "iter", "attempts", "failures", "x", "loss"]
    assert "fixed" not in header
    assert header[-1] == "last error"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:7]]
    state = ExperimentState.load(ExperimentPaths.at(str(store / "alpha")))
    assert [r[0] for r in rows] == [t.trial_id for t in state.trials]
    by_x = {r[5]: r for r in rows}
    assert by_x["2"][1:5] == ["TERMINATED", "3", "2", "1"]  # 2 attempts, 1 failure
    assert "ValueError: boom on the first attempt" in by_x["2"][-1]
    assert by_x["1"][1:5] == ["TERMINATED", "3", "1", "0"] and by_x["1"][-1] == ""
    assert by_x["3"][6] == "1"  # loss of the last report: 3 / 3
    assert str(store / "alpha") in out


def test_status_errored_trial_shows_its_error(store, capsys) -> None:
    assert main(["status", str(store / "beta")]) == 0
    out = capsys.readouterr().out
    assert "1 TERMINATED, 1 ERRORED" in out.splitlines()[0]
    assert "2 failures" in out.splitlines()[0]
    errored = [line for line in out.splitlines() if line.startswith("|") and "ERRORED" in line]
    assert len(errored) == 1 and "RuntimeError: always broken" in errored[0]


def test_status_metric_option_puts_that_metric_first(store, capsys) -> None:
    assert main(["status", str(store / "alpha"), "--metric", "acc"]) == 0
    header = [c.strip() for c in capsys.readouterr().out.splitlines()[2].strip("|").split("|")]
    assert header.index("acc") == 6 and header.index("loss") == 7


def test_status_unknown_metric_says_what_was_reported(store, capsys) -> None:
    assert main(["status", str(store / "alpha"), "--metric", "nope"]) == 0
    err = capsys.readouterr().err
    assert "'nope'" in err and "loss" in err and "acc" in err


def test_status_json_is_the_view_model(store, capsys) -> None:
    assert main(["status", str(store / "beta"), "--json", "--metric", "score"]) == 0
    data = json.loads(capsys.readouterr().out)
    # The view model, and what the text adds: when it changed, its driver, how to resume it.
    assert set(data) == {f.name for f in dataclasses.fields(ExperimentView)} | {
        "updated", "driver", "resume_line", "storage_fault", "supervisor_log", "supervisor",
        "driver_silent_s", "driver_dead_in_s", "takeover"}
    assert data["resume_line"] is None and data["supervisor_log"] is None
    assert data["storage_fault"] is None
    assert data["supervisor"] is None  # no supervisor ran it
    assert data["driver"]["alive"] is False
    assert data["name"] == "beta"
    assert data["path"] == str(store / "beta")
    assert data["counts"] == {
        "PENDING": 0, "RUNNING": 0, "PAUSED": 0, "TERMINATED": 1, "ERRORED": 1
    }
    assert data["total_failures"] == 2
    assert data["metric_columns"][0] == "score"
    assert data["param_columns"] == ["x"]
    rows = {r["params"]["x"]: r for r in data["rows"]}
    assert rows[1]["status"] == "TERMINATED" and rows[1]["metrics"]["score"] == 10.0
    assert rows[2]["status"] == "ERRORED" and rows[2]["failures"] == 2
    assert rows[2]["attempts"] == 2
    assert "RuntimeError: always broken" in rows[2]["last_error"]


def test_status_caps_rows_unless_all(store, tmp_path, capsys) -> None:
    # A copy of alpha grown to 60 trials (same records, new ids), saved the way ftnb saves.
    dest = _copy_experiment(store, "alpha", tmp_path, "wide")
    paths = ExperimentPaths.at(str(dest))
    state = ExperimentState.load(paths)
    template = state.trials[0].to_json()
    state.trials = [
        TrialRecord.from_json({**template, "trial_id": f"t{i:03d}", "dir_name": f"t{i:03d}"})
        for i in range(60)
    ]
    state.save(paths)

    assert main(["status", str(dest)]) == 0
    out = capsys.readouterr().out
    assert sum(1 for line in out.splitlines() if line.startswith("| t0")) == 50
    assert "10 more trials" in out and "--all" in out

    assert main(["status", str(dest), "--all"]) == 0
    out = capsys.readouterr().out
    assert sum(1 for line in out.splitlines() if line.startswith("| t0")) == 60
    assert "more trials" not in out


def test_status_accepts_the_state_file_itself(store, capsys) -> None:
    assert main(["status", str(store / "alpha" / "experiment_state.json")]) == 0
    assert capsys.readouterr().out.startswith("Experiment alpha:")


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("missing", ["does not exist"]),
        ("empty", ["is an empty folder", "experiment_state.json"]),
        ("storage", ["2 experiments", "alpha", "beta", "ftnb ls"]),
        ("trial", ["trial folder", "ftnb status"]),
        ("other", ["no experiment_state.json", "todo.txt"]),
        ("file", ["is a file"]),
    ],
)
def test_status_on_a_path_without_an_experiment(store, tmp_path, capsys, case, fragments):
    alpha_trial = ExperimentState.load(ExperimentPaths.at(str(store / "alpha"))).trials[0]
    path = {
        "missing": tmp_path / "nothing-here",
        "empty": tmp_path / "empty",
        "storage": store,
        "trial": store / "alpha" / alpha_trial.dir_name,
        "other": store / "notes",
        "file": store / "README.txt",
    }[case]
    if case == "empty":
        path.mkdir()
    assert main(["status", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    _assert_one_line_error(err, str(path), *fragments)


def test_status_of_a_newer_format_says_to_upgrade(store, tmp_path, capsys) -> None:
    dest = _copy_experiment(store, "alpha", tmp_path)
    for name in ("experiment_state.json", "experiment_state.prev.json"):
        data = json.loads((dest / name).read_text())
        data["format_version"] = 99
        (dest / name).write_text(json.dumps(data))
    assert main(["status", str(dest)]) == 2
    _assert_one_line_error(capsys.readouterr().err, "format_version 99", "upgrade ftnb")

    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert _ls_rows(out)["alpha"][1] == "UNREADABLE"
    assert "format_version 99" in out


# -- damaged state files -----------------------------------------------------------------------


def test_corrupt_state_falls_back_to_the_previous_generation(store, tmp_path, capsys) -> None:
    dest = _copy_experiment(store, "alpha", tmp_path)
    (dest / "experiment_state.json").write_text('{"format": "ftnb.experiment", "trials": [')

    assert main(["status", str(dest)]) == 0
    out, err = capsys.readouterr()
    # The previous generation: one save behind (the last save only marked the run FINISHED).
    assert out.startswith("Experiment alpha: ")
    assert "| 3 TERMINATED | 1 failure," in out.splitlines()[0]
    assert "boom on the first attempt" in out
    assert "experiment_state.prev.json" in err and "Traceback" not in err

    assert main(["ls", str(tmp_path)]) == 0
    row = _ls_rows(capsys.readouterr().out)["alpha"]
    assert row[1] != "UNREADABLE" and row[2] == "3" and row[7] == "3" and row[9] == "1"


def test_both_states_corrupt_is_listed_unreadable_with_the_reason(store, tmp_path, capsys):
    _copy_experiment(store, "beta", tmp_path)
    dest = _copy_experiment(store, "alpha", tmp_path)
    (dest / "experiment_state.json").write_text("{not json")
    (dest / "experiment_state.prev.json").write_bytes(b"")

    assert main(["ls", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = _ls_rows(out)
    assert list(rows) == ["beta", "alpha"]  # readable first, the broken one at the end
    assert rows["alpha"][1] == "UNREADABLE"
    assert rows["beta"][1] == "ERRORED"
    reason = [line for line in out.splitlines() if line.startswith("alpha: UNREADABLE:")]
    assert len(reason) == 1
    assert "experiment_state.json: not valid JSON" in reason[0]
    assert "experiment_state.prev.json: not valid JSON" in reason[0]
    assert str(dest) not in reason[0]  # the experiment's own path is not repeated

    assert main(["status", str(dest)]) == 2
    _assert_one_line_error(capsys.readouterr().err, "no readable experiment state", "not valid")


# -- read-only, URLs, the process entry point ---------------------------------------------------


def test_commands_never_write_to_storage(store, capsys) -> None:
    before = _snapshot(store)
    for argv in (
        ["ls", str(store)],
        ["ls", str(store), "--json"],
        ["status", str(store / "alpha")],
        ["status", str(store / "beta"), "--json", "--all"],
        ["status", str(store)],
    ):
        main(argv)
    capsys.readouterr()
    assert _snapshot(store) == before


def test_fsspec_urls_work_like_local_paths(store, capsys) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    base = "/ftnb-cli-test"
    try:
        fs.put(str(store / "alpha"), f"{base}/store/alpha", recursive=True)
        assert main(["ls", f"memory://{base}/store"]) == 0
        assert list(_ls_rows(capsys.readouterr().out)) == ["alpha"]
        assert main(["status", f"memory://{base}/store/alpha"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("Experiment alpha: FINISHED") and "boom" in out
        assert main(["status", f"memory://{base}/store"]) == 2
        _assert_one_line_error(capsys.readouterr().err, "1 experiment", "ftnb ls")
        assert main(["ls", f"memory://{base}/missing"]) == 2
        _assert_one_line_error(capsys.readouterr().err, f"memory://{base}/missing")
    finally:
        fs.rm(base, recursive=True)


def test_names_and_rm_work_on_fsspec_urls(store, capsys) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    base = "/ftnb-cli-rm-test"
    try:
        fs.put(str(store / "alpha"), f"{base}/store/alpha", recursive=True)
        fs.put(str(store / "beta"), f"{base}/store/beta", recursive=True)
        assert main(["status", "alpha", "--storage", f"memory://{base}/store"]) == 0
        assert capsys.readouterr().out.startswith("Experiment alpha: FINISHED")
        # Removed through ftnb's storage (as on s3://): the experiment, and nothing else.
        assert main(["rm", "alpha", "--storage", f"memory://{base}/store", "--yes"]) == 0
        assert capsys.readouterr().out.strip() == (
            f"ftnb: removed experiment 'alpha' (memory://{base}/store/alpha)")
        assert not fs.exists(f"{base}/store/alpha") and fs.exists(f"{base}/store/beta")
        assert main(["ls", f"memory://{base}/store"]) == 0
        assert list(_ls_rows(capsys.readouterr().out)) == ["beta"]
    finally:
        fs.rm(base, recursive=True)


def test_unknown_url_protocol_is_a_one_line_error(capsys) -> None:
    assert main(["ls", "nosuchproto://bucket/x"]) == 2
    _assert_one_line_error(capsys.readouterr().err, "nosuchproto://bucket/x")


def test_version_and_usage(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ftnb {ftnb.__version__}"
    assert main([]) == 2
    assert "ls" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_python_dash_m_ftnb_runs_as_a_process(store, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FTNB_DEBUG"}
    done = subprocess.run(
        [sys.executable, "-m", "ftnb", "ls", str(store)],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert list(_ls_rows(done.stdout)) == ["alpha", "beta"]

    done = subprocess.run(
        [sys.executable, "-m", "ftnb", "status", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    _assert_one_line_error(done.stderr, str(tmp_path / "nope"))

    # Fast start: the CLI never imports pandas.
    code = (
        "import sys; from ftnb.cli import main; rc = main(['status', sys.argv[1]]); "
        "sys.exit(rc if 'pandas' not in sys.modules else 99)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(store / "alpha")],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
