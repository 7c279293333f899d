"""Smoke test of the benchmark package: every workload runs once at its --quick size, so the
benchmark code cannot rot unnoticed. (The figures themselves are not checked, only their shape.)"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.runner import format_table, rows_for  # noqa: E402
from bench.trainables import percentile  # noqa: E402
from bench.workloads import WORKLOADS  # noqa: E402


def test_every_workload_runs_quick_and_writes_json_lines(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--reps", "1", "--out", str(out),
         "--storage", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["workload"] for line in lines} == set(WORKLOADS)
    for line in lines:
        value = line["ftnb"]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, line
        assert line["ray"] is None and line["ratio_ftnb_ray"] is None
        assert line["values"]["ftnb"] == [value]
        assert line["quick"] is True and line["reps"] == 1
        machine = line["machine"]
        for key in ("cpu_count", "python", "platform", "ftnb_version"):
            assert machine[key], key
        assert line["timestamp"] and line["params"] == WORKLOADS[line["workload"]].quick
    figures = {(line["workload"], line["figure"]) for line in lines}
    for expected in [
        ("startup", "import_ms"),
        ("trial_start_latency", "to_first_line_p50_ms"),
        ("trial_start_latency", "to_first_report_p95_ms"),
        ("trial_start_latency", "trials_per_s"),
        ("many_trials", "fit_s"),
        ("report_throughput", "reports_per_s"),
        ("report_throughput", "report_p99_us"),
    ]:
        assert expected in figures
    # The table has a row per figure, with n/a for the missing Ray variant.
    assert "ratio ftnb/ray" in proc.stdout
    assert proc.stdout.count("n/a") == 2 * len(lines)
    # Every experiment's temporary storage was removed.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ftnb-bench-")]


def test_percentile_and_table() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
    rows = rows_for("w", {"ftnb": {"a_ms": [1.0, 3.0, 2.0]}})
    assert rows[0]["ftnb"] == 2.0 and rows[0]["ray"] is None and rows[0]["unit"] == "ms"
    table = format_table(rows)
    assert "w" in table and "a_ms" in table and "n/a" in table
