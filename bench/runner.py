"""Run the workloads, print the table of medians, append the JSON lines."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from . import FRAMEWORKS, frameworks
from .workloads import WORKLOADS, Workload, unit_of

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "results.jsonl")
CHILD_TIMEOUT_S = 600


class RepetitionFailed(RuntimeError):
    pass


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark ftnb (and later Ray Tune) on the same workloads. Each repetition "
        "runs in a fresh Python process with its own temporary storage; the table shows medians.",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions per workload (default 3)")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this workload (repeat, or comma-separate, for several)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a figure)")
    p.add_argument(
        "--out", default=DEFAULT_OUT, help=f"JSON Lines file to append to (default {DEFAULT_OUT})"
    )
    p.add_argument(
        "--storage",
        default=None,
        help="folder for the experiments' temporary storage (default: the system temp folder)",
    )
    p.add_argument(
        "--inline",
        action="store_true",
        help="run repetitions in this process instead of a fresh one each (for profiling)",
    )
    p.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the untimed --quick-size repetition run before each workload's timed ones",
    )
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    names = []
    for item in args.only or []:
        names += [n.strip() for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    args.names = names or list(WORKLOADS)
    return args


# ---- running -------------------------------------------------------------------------------------


def child_env(pycache_dir: Optional[str]) -> dict:
    """The environment of a repetition's process: ``bench`` importable, and byte-code caching on
    (in a private folder) even where ``PYTHONDONTWRITEBYTECODE`` is set, so that imports cost
    what they cost on a user's machine rather than a compile of every module each time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    if pycache_dir:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache_dir
    return env


def run_repetition(
    wl: Workload,
    framework: str,
    params: dict,
    storage_root: Optional[str],
    inline: bool,
    env: Optional[dict] = None,
) -> dict:
    if inline:
        storage = tempfile.mkdtemp(prefix=f"ftnb-bench-{wl.name}-", dir=storage_root)
        try:
            return wl.fn(framework, storage, **params)
        finally:
            import shutil

            shutil.rmtree(storage, ignore_errors=True)
    fd, out = tempfile.mkstemp(prefix="ftnb-bench-figures-", suffix=".json")
    os.close(fd)
    cmd = [
        sys.executable,
        "-m",
        "bench._child",
        wl.name,
        framework,
        json.dumps(params),
        storage_root or "",
        out,
    ]
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env if env is not None else child_env(None),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise RepetitionFailed(f"exit code {proc.returncode}:\n{tail}")
        with open(out) as f:
            return json.load(f)
    except subprocess.TimeoutExpired as exc:
        raise RepetitionFailed(f"timed out after {CHILD_TIMEOUT_S}s") from exc
    finally:
        os.unlink(out)


def check_figures(figures: Any) -> dict:
    if not isinstance(figures, dict) or not figures:
        raise RepetitionFailed(f"a workload must return a non-empty dict, got {figures!r}")
    for key, value in figures.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise RepetitionFailed(f"figure {key!r} is not a number: {value!r}")
    return figures


def run_workload(
    wl: Workload, args: argparse.Namespace, env: Optional[dict]
) -> tuple[dict, dict, list[str]]:
    """``({framework: {figure: [values]}}, params, errors)`` for one workload."""
    params = wl.params(args.quick)
    values: dict[str, dict[str, list[float]]] = {}
    errors = []
    for framework in FRAMEWORKS:
        if framework not in wl.variants:
            continue
        if args.warmup:
            # Untimed: fills the byte-code and page caches, so rep 1 is not the odd one out.
            print(f"  {wl.name} [{framework}] warm-up ...", end="", file=sys.stderr, flush=True)
            try:
                run_repetition(wl, framework, wl.params(True), args.storage, args.inline, env)
                print(" ok", file=sys.stderr, flush=True)
            except Exception as exc:
                print(" FAILED", file=sys.stderr, flush=True)
                errors.append(f"{wl.name} [{framework}] warm-up: {exc}")
                continue
        per_figure: dict[str, list[float]] = {}
        for rep in range(args.reps):
            t = time.perf_counter()
            print(
                f"  {wl.name} [{framework}] rep {rep + 1}/{args.reps} ...",
                end="",
                file=sys.stderr,
                flush=True,
            )
            try:
                figures = check_figures(
                    run_repetition(wl, framework, params, args.storage, args.inline, env)
                )
            except Exception as exc:
                print(" FAILED", file=sys.stderr, flush=True)
                errors.append(f"{wl.name} [{framework}] rep {rep + 1}: {exc}")
                break
            print(f" {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
            for key, value in figures.items():
                per_figure.setdefault(key, []).append(float(value))
        if per_figure and not any(e.startswith(f"{wl.name} [{framework}]") for e in errors):
            values[framework] = per_figure
    return values, params, errors


# ---- reporting -----------------------------------------------------------------------------------


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    info = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "ftnb_version": frameworks.version("ftnb"),
        "ray_version": frameworks.version("ray"),
        "env_dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
    }
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            info["git_dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def rows_for(name: str, values: dict) -> list[dict]:
    """One row per figure: the median per framework and the ftnb/ray ratio where both exist."""
    figures: list[str] = []
    for per_figure in values.values():
        figures += [f for f in per_figure if f not in figures]
    rows = []
    for figure in figures:
        medians = {
            fw: statistics.median(values[fw][figure]) if figure in values.get(fw, {}) else None
            for fw in FRAMEWORKS
        }
        ftnb_v, ray_v = medians.get("ftnb"), medians.get("ray")
        rows.append(
            {
                "workload": name,
                "figure": figure,
                "unit": unit_of(figure),
                **medians,
                "ratio_ftnb_ray": ftnb_v / ray_v if ftnb_v is not None and ray_v else None,
                "values": {fw: values[fw][figure] for fw in values if figure in values[fw]},
            }
        )
    return rows


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def format_table(rows: list[dict]) -> str:
    header = ("workload", "figure", "ftnb", "ray", "ratio ftnb/ray")
    body = [
        (r["workload"], r["figure"], _fmt(r["ftnb"]), _fmt(r["ray"]), _fmt(r["ratio_ftnb_ray"]))
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in [header] + body) for i in range(len(header))]
    lines = []
    for n, line in enumerate([header] + body):
        cells = [
            str(c).ljust(w) if i < 2 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(line, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def append_jsonl(path: str, rows: list[dict], params: dict, args: argparse.Namespace,
                 machine: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    now = time.time()
    stamp = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat()
    with open(path, "a") as f:
        for row in rows:
            record = {
                "timestamp": stamp,
                "unix_time": now,
                **row,
                "reps": args.reps,
                "quick": args.quick,
                "isolation": "inline" if args.inline else "process",
                "warmup": args.warmup,
                "params": params[row["workload"]],
                "machine": machine,
            }
            f.write(json.dumps(record) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.list:
        for wl in WORKLOADS.values():
            print(f"{wl.name:22} {wl.description}  full={wl.full} quick={wl.quick}")
        return 0
    machine = machine_info()
    all_rows: list[dict] = []
    params: dict[str, dict] = {}
    errors: list[str] = []
    pycache_dir = None if args.inline else tempfile.mkdtemp(prefix="ftnb-bench-pycache-")
    env = child_env(pycache_dir)
    try:
        for name in args.names:
            wl = WORKLOADS[name]
            values, params[name], errs = run_workload(wl, args, env)
            errors += errs
            rows = rows_for(name, values)
            append_jsonl(args.out, rows, params, args, machine)
            all_rows += rows
    finally:
        if pycache_dir:
            import shutil

            shutil.rmtree(pycache_dir, ignore_errors=True)
    print()
    print(format_table(all_rows))
    print(
        f"\nmedians of {args.reps} rep(s){' (--quick sizes)' if args.quick else ''}; "
        f"{machine['cpus_usable'] or machine['cpu_count']} CPUs, Python {machine['python']}, "
        f"ftnb {machine['ftnb_version']}; JSON lines appended to {args.out}"
    )
    if errors:
        print("\nFAILED:", file=sys.stderr)
        for e in errors:
            print(f"- {e}", file=sys.stderr)
        return 1
    return 0
