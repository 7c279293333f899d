"""Smoke test of the rank-group workloads of the benchmark (group_recovery, group_start,
ddp_steps): their ftnb variant runs once at its --quick size through the CLI, so that the code
cannot rot unnoticed. No timing is asserted, only the shape of the figures and the behaviour
they record (every kill re-formed the group from its latest checkpoint, nothing left running).
torchrun and Ray Train are never run here: their columns read n/a. Also the table with more
than one framework to compare with, and the marker that finds a job's processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("psutil", reason="the benchmark needs psutil (the `bench` extra)")
pytest.importorskip("torch", reason="the rank-group workloads train a torch model")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.procs import RUN_MARKER_VAR, kill_processes, marked_processes  # noqa: E402
from bench.runner import format_table, rows_for, target_summary  # noqa: E402
from bench.workloads import WORKLOADS, Target, Variant, Workload  # noqa: E402

GROUP_WORKLOADS = ("group_recovery", "group_start", "ddp_steps")


@pytest.mark.slow
def test_cli_runs_the_group_workloads_for_ftnb(tmp_path: Path) -> None:
    out, md = tmp_path / "results.jsonl", tmp_path / "latest.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--reps", "1", "--no-warmup",
         "--only", ",".join(GROUP_WORKLOADS), "--framework", "ftnb", "--out", str(out),
         "--markdown", str(md), "--storage", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["workload"] for line in lines} == set(GROUP_WORKLOADS)
    figures = {(line["workload"], line["figure"]): line for line in lines}
    for line in lines:
        assert line["ray"] is None and line["torchrun"] is None, line
        assert line["ratio_ftnb_torchrun"] is None and line["params"] == \
            WORKLOADS[line["workload"]].quick
    recovery = {f: figures[("group_recovery", f)]["ftnb"] for w, f in figures
                if w == "group_recovery"}
    assert recovery["failed_reformations"] == 0
    assert recovery["stale_resumes"] == 0
    assert recovery["leftover_processes"] == 0
    assert recovery["recovery_s"] > recovery["recovery_to_entry_s"] > 0
    assert recovery["recovery_max_s"] >= recovery["recovery_s"]
    start = {f: figures[("group_start", f)]["ftnb"] for w, f in figures if w == "group_start"}
    assert start["group_start_s"] > start["ranks_entered_s"] > 0
    assert start["group_start_warm_s"] > 0
    assert figures[("ddp_steps", "steps_per_s")]["ftnb"] > 0
    # Both ratio targets of recovery_s name their framework; they cannot be judged without it.
    assert "ftnb/torchrun<=0.3 n/a; ftnb/ray<=0.1 n/a" in proc.stdout
    assert "ftnb<=0 met" in proc.stdout
    header = proc.stdout.splitlines()[[i for i, line in enumerate(proc.stdout.splitlines())
                                       if line.startswith("workload")][0]]
    assert header.split() == ["workload", "figure", "ftnb", "ray", "torchrun", "ftnb/ray",
                              "ftnb/torchrun", "target"]
    assert md.read_text().count("| group_recovery |") == len(recovery)
    # Every repetition's temporary storage was removed, and no job's process is left.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ftnb-bench-")]


def test_rows_compare_with_every_other_framework() -> None:
    wl = Workload(
        "g", lambda *a, **k: {}, "", {}, {},
        variants=(Variant("ftnb"), Variant("ray"), Variant("torchrun")),
        targets=(Target("r_s", "ratio<=", 0.3, against="torchrun"),
                 Target("r_s", "ratio<=", 0.1), Target("n", "ftnb<=", 0)),
    )
    values = {"ftnb": {"r_s": [1.0], "n": [0.0]}, "ray": {"r_s": [20.0]},
              "torchrun": {"r_s": [2.0], "n": [1.0]}}
    rows = rows_for(wl, values)
    by = {r["figure"]: r for r in rows}
    assert by["r_s"]["ratio_ftnb_torchrun"] == 0.5 and by["r_s"]["ratio_ftnb_ray"] == 0.05
    assert [t["met"] for t in by["r_s"]["targets"]] == [False, True]
    assert by["r_s"]["target_met"] is False
    assert by["r_s"]["target"] == "ftnb/torchrun<=0.3; ftnb/ray<=0.1"
    assert by["n"]["ray"] is None and by["n"]["torchrun"] == 1.0
    table = format_table(rows)
    assert "ftnb/torchrun<=0.3 MISSED; ftnb/ray<=0.1 met" in table
    assert table.splitlines()[0].split() == ["workload", "figure", "ftnb", "ray", "torchrun",
                                             "ftnb/ray", "ftnb/torchrun", "target"]
    assert target_summary(rows).startswith("targets: 2 met, 1 missed")
    # A workload compared with Ray alone keeps its table as it was: no torchrun column.
    tune = Workload("t", lambda *a, **k: {}, "", {}, {}, targets=(Target("r_s", "ratio<=", 1),))
    tune_rows = rows_for(tune, {"ftnb": {"r_s": [1.0]}, "ray": {"r_s": [2.0]}})
    assert "torchrun" not in tune_rows[0] and "ratio<=1 met" in format_table(tune_rows)


def test_marked_processes_finds_every_descendant_and_kills_them() -> None:
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{RUN_MARKER_VAR: marker})
    # A shell whose child outlives it: re-parented, but still carrying the marker.
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(marked_processes(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = marked_processes(marker)
        assert proc.pid in {pid for pid, _ in found} and len(found) == 2
        kill_processes(found)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked_processes(marker) == []
    finally:
        kill_processes(marked_processes(marker))
