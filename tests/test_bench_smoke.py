"""Smoke test of the benchmark package: every ftnb workload runs once at its --quick size, so the
benchmark code cannot rot unnoticed. The figures' values are not checked (no timing here), only
their shape and the behaviour they record (iterations done twice, unpersisted reports, ...).
Ray Tune is never run here: the CLI test hides it, which also checks that it is skipped cleanly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psutil", reason="the benchmark needs psutil (the `bench` extra)")

import ftnb  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.runner import (  # noqa: E402
    check_figures,
    format_markdown,
    format_table,
    rows_for,
    run_repetition,
    target_summary,
)
from bench.trainables import percentile  # noqa: E402
from bench.workloads import WORKLOADS, Target, Variant, Workload  # noqa: E402

CLI_WORKLOADS = ("startup", "many_trials")


def _run_quick(name: str, tmp_path: Path) -> dict:
    """One --quick repetition of the ftnb variant of workload ``name``, in a fresh process."""
    figures = check_figures(
        run_repetition(WORKLOADS[name], "ftnb", WORKLOADS[name].quick, str(tmp_path), False)
    )
    assert all(math.isfinite(v) and v >= 0 for v in figures.values()), figures
    # The repetition's temporary storage was removed.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ftnb-bench-")]
    return figures


def test_cli_runs_ftnb_skips_missing_ray_and_writes_json_lines(tmp_path: Path) -> None:
    # A `ray` package that fails to import stands in for a machine without Ray Tune.
    fake = tmp_path / "fake"
    (fake / "ray").mkdir(parents=True)
    (fake / "ray" / "__init__.py").write_text("raise ImportError('no Ray here')\n")
    out, md = tmp_path / "results.jsonl", tmp_path / "latest.md"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(REPO_ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--reps", "1", "--no-warmup",
         "--only", ",".join(CLI_WORKLOADS), "--out", str(out), "--markdown", str(md),
         "--storage", str(tmp_path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ray Tune skipped" in proc.stdout and "[ray]" not in proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["workload"] for line in lines} == set(CLI_WORKLOADS)
    for line in lines:
        assert isinstance(line["ftnb"], (int, float)) and line["ftnb"] > 0, line
        assert line["ray"] is None and line["ratio_ftnb_ray"] is None
        assert line["values"]["ftnb"] == [line["ftnb"]]
        assert line["quick"] is True and line["reps"] == 1
        assert line["params"] == WORKLOADS[line["workload"]].quick
        for key in ("cpu_count", "python", "platform", "ftnb_version"):
            assert line["machine"][key], key
    figures = {(line["workload"], line["figure"]) for line in lines}
    assert {("startup", "import_ms"), ("many_trials", "trials_per_s"),
            ("many_trials", "peak_tree_rss_mb")} <= figures
    assert "ftnb/ray" in proc.stdout and "ratio>=10 n/a" in proc.stdout
    assert md.read_text().count("| startup |") == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ftnb-bench-")]


def test_trial_start_latency(tmp_path: Path) -> None:
    figures = _run_quick("trial_start_latency", tmp_path)
    assert figures["to_first_report_p50_ms"] >= figures["to_first_line_p50_ms"] > 0


def test_report_throughput_acknowledges_only_persisted_reports(tmp_path: Path) -> None:
    figures = _run_quick("report_throughput", tmp_path)
    assert figures["reports_per_s"] > 0 and figures["report_p99_ms"] > 0
    assert figures["unpersisted_acks"] == 0


def test_stopper_throughput_runs_both_sides(tmp_path: Path) -> None:
    figures = _run_quick("stopper_throughput", tmp_path)
    assert figures["reports_per_s"] > 0 and figures["stopper_reports_per_s"] > 0
    assert figures["stopper_vs_plain"] > 0


def test_searcher_overhead_measures_ftnb_and_ray_side_by_side(tmp_path: Path) -> None:
    figures = _run_quick("searcher_overhead", tmp_path)
    assert figures.get("optuna_ms", 1) > 0  # (each searcher whose library is installed)
    for name in ("hyperopt", "bayesopt", "nevergrad", "bohb", "optuna"):
        if f"{name}_ray_ms" in figures:
            assert figures[f"{name}_vs_ray"] == pytest.approx(
                figures[f"{name}_ms"] / figures[f"{name}_ray_ms"])


def test_checkpoint_io(tmp_path: Path) -> None:
    figures = _run_quick("checkpoint_io", tmp_path)
    assert figures["checkpoint_s"] > 0 and figures["vs_raw"] > 0
    assert set(figures) >= {"checkpoint_mb_per_s", "raw_mb_per_s", "refsync_vs_raw"}


def test_failure_recovery_redoes_no_checkpointed_iteration(tmp_path: Path) -> None:
    figures = _run_quick("failure_recovery", tmp_path)
    for mode in ("raise", "sigkill"):
        assert figures[f"{mode}_iterations_twice"] == 0
        assert figures[f"{mode}_to_first_report_s"] > figures[f"{mode}_to_restart_s"] > 0


@pytest.mark.skipif(
    not hasattr(ftnb.Tuner, "restore"), reason="ftnb.Tuner.restore does not exist yet"
)
def test_restore_after_driver_sigkill(tmp_path: Path) -> None:
    figures = _run_quick("restore", tmp_path)
    assert figures["complete_s"] >= figures["first_new_result_s"] > 0
    assert figures["iterations_twice"] == 0
    assert figures["stale_processes"] == 0


def test_widget_updater_in_a_real_kernel(tmp_path: Path) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("jupyter_client")
    figures = _run_quick("widget_updater", tmp_path)
    assert figures["updates_per_s"] > 0 and figures["comm_kb_per_s"] > 0
    assert figures["poll_first_s"] > 0


def test_rows_ratios_targets_and_tables() -> None:
    wl = Workload(
        "w", lambda *a, **k: {}, "", {}, {},
        variants=(Variant("ftnb"), Variant("ray"), Variant("ray", "fast", {"fast": True})),
        targets=(Target("a_s", "ratio<=", 0.1), Target("a_s", "ratio<=", 0.1, "fast"),
                 Target("n", "ftnb<=", 0)),
    )
    values = {
        "ftnb": {"a_s": [1.0, 3.0, 2.0], "n": [0.0]},
        "ray": {"a_s": [40.0], "n": [4.0]},
        "ray[fast]": {"a_s": [10.0]},
    }
    rows = rows_for(wl, values)
    by = {(r["ray_variant"], r["figure"]): r for r in rows}
    assert by[("", "a_s")]["ftnb"] == 2.0 and by[("", "a_s")]["ratio_ftnb_ray"] == 0.05
    assert by[("", "a_s")]["target_met"] is True and by[("", "a_s")]["unit"] == "s"
    assert by[("fast", "a_s")]["ray"] == 10.0 and by[("fast", "a_s")]["target_met"] is False
    assert by[("", "n")]["target_met"] is True and by[("fast", "n")]["ray"] is None
    table = format_table(rows)
    assert "ratio<=0.1 met" in table and "ratio<=0.1 MISSED" in table
    assert "w (ray fast)" in table and "n/a" in table
    assert format_markdown(rows).count("\n") == len(rows) + 1
    assert target_summary(rows).startswith("targets: 2 met, 1 missed")
    # Without any Ray figures the targets on ratios cannot be judged.
    only_ftnb = rows_for(wl, {"ftnb": values["ftnb"]})
    assert [r["target_met"] for r in only_ftnb] == [None, True]


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_bench_extra_installs_what_the_benchmarks_import():
    """`pip install -e '.[bench]'` must be enough to run every workload: each third-party module
    that bench/ imports (the kernel of the widget workload included) comes with a distribution
    that ftnb or its `bench` extra requires."""
    import ast
    import importlib.metadata as md
    import re

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    required = {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-")
                for r in project["dependencies"] + project["optional-dependencies"]["bench"]}
    modules: set[str] = set()
    for path in (REPO_ROOT / "bench").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # code run in the benchmark's kernel: "import a, b.c"
                for line in node.value.splitlines():
                    if line.strip().startswith("import "):
                        modules |= {m.strip().split(".")[0]
                                    for m in line.strip()[7:].split(";")[0].split(",")}
    by_module = md.packages_distributions()
    third_party = {m for m in modules
                   if m not in sys.stdlib_module_names and m not in ("bench", "ftnb", "__future__")}
    # (a module not installed here is taken to come from the distribution of its own name)
    missing = {m: by_module.get(m, [m]) for m in third_party
               if not {d.lower().replace("_", "-") for d in by_module.get(m, [m])} & required}
    # IPython comes with ipykernel, which the extra requires.
    missing.pop("IPython", None) if "ipykernel" in required else None
    assert missing == {}, f"bench imports these without the bench extra requiring them: {missing}"
