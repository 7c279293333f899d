"""Run the workloads, print the table of medians, ratios and targets, append the JSON lines."""

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
from .procs import REPO_ROOT, subprocess_env, usable_cpus
from .workloads import MODULE_NAMES, WORKLOADS, Variant, Workload, run_in_storage, unit_of

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "results.jsonl")


class RepetitionFailed(RuntimeError):
    pass


def _split(items: Optional[list[str]]) -> list[str]:
    return [n.strip() for item in items or [] for n in item.split(",") if n.strip()]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark ftnb and Ray Tune (and, for data-parallel jobs, Ray Train and "
        "torchrun) side by side on the same workloads. Each repetition runs in a fresh Python "
        "process with its own temporary storage; the table shows medians, the ratios of ftnb's "
        "to the others' and whether each target is met.",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions per workload (default 3)")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this workload (repeat, or comma-separate, for several)",
    )
    p.add_argument(
        "--framework",
        action="append",
        metavar="NAME",
        help=f"run only this framework ({', '.join(FRAMEWORKS)}; default: all those each "
        "workload compares that can be imported; 'ray' is Ray Tune, or Ray Train for the "
        "rank-group workloads)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a figure)")
    p.add_argument(
        "--out", default=DEFAULT_OUT, help=f"JSON Lines file to append to (default {DEFAULT_OUT})"
    )
    p.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown to PATH")
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
        help="skip the untimed --quick-size repetition run before each workload's timed ones "
        "(one per framework and workload)",
    )
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    args.names = _split(args.only) or list(WORKLOADS)
    unknown = [n for n in args.names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    args.frameworks = _split(args.framework) or list(FRAMEWORKS)
    unknown = [n for n in args.frameworks if n not in FRAMEWORKS]
    if unknown:
        p.error(f"unknown framework(s) {', '.join(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    return args


# ---- running -------------------------------------------------------------------------------------


def module_unavailable(env: dict, module: str) -> Optional[str]:
    """Why the variants that need ``module`` cannot run here (None when it imports)."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True
    )
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"`import {module}` failed ({last}); install it with: pip install -e '.[bench]'"


def unavailable_modules(args: argparse.Namespace, env: dict) -> dict[str, str]:
    """``{module: why}`` for the modules that the selected variants need and cannot import."""
    needed = {v.module for name in args.names for v in WORKLOADS[name].variants
              if v.framework in args.frameworks}
    reasons = {m: module_unavailable(env, m) for m in sorted(needed)}
    return {m: why for m, why in reasons.items() if why}


def run_repetition(
    wl: Workload,
    framework: str,
    params: dict,
    storage_root: Optional[str],
    inline: bool,
    env: Optional[dict] = None,
) -> dict:
    """One repetition's figures, run in a fresh process (or in this one with ``inline``)."""
    timeout_s = wl.timeout_s
    if inline:
        return run_in_storage(wl.name, framework, params, storage_root)
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
            env=env if env is not None else subprocess_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise RepetitionFailed(f"exit code {proc.returncode}:\n{tail}")
        with open(out) as f:
            return json.load(f)
    except subprocess.TimeoutExpired as exc:
        raise RepetitionFailed(f"timed out after {timeout_s:.0f}s") from exc
    finally:
        os.unlink(out)


def check_figures(figures: Any) -> dict:
    if not isinstance(figures, dict) or not figures:
        raise RepetitionFailed(f"a workload must return a non-empty dict, got {figures!r}")
    for key, value in figures.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise RepetitionFailed(f"figure {key!r} is not a number: {value!r}")
    return figures


def _progress(text: str, end: str = "") -> None:
    print(text, end=end, file=sys.stderr, flush=True)


def _attempt(what: str, errors: list[str], fn: Any, *fn_args: Any) -> Optional[dict]:
    """``fn(*fn_args)``, or None after noting its failure in ``errors`` (the others still run)."""
    _progress(f"  {what} ...")
    t = time.perf_counter()
    try:
        result = fn(*fn_args)
    except Exception as exc:
        _progress(" FAILED", "\n")
        errors.append(f"{what}: {exc}")
        return None
    _progress(f" {time.perf_counter() - t:.1f}s", "\n")
    return result


def _checked_repetition(*args: Any) -> dict:
    return check_figures(run_repetition(*args))


def run_variant(
    wl: Workload, variant: Variant, args: argparse.Namespace, env: Optional[dict],
    errors: list[str], warm_up: bool,
) -> Optional[dict[str, list[float]]]:
    """``{figure: [value per repetition]}`` of one variant, or None if a repetition failed."""
    label = f"{wl.name} [{variant.key}]"
    where = (args.storage, args.inline, env)
    # Untimed, at --quick size: fills the byte-code and page caches, so rep 1 is not the odd one.
    warmup = {**wl.params(True), **variant.params}
    if warm_up and _attempt(
        f"{label} warm-up", errors, run_repetition, wl, variant.framework, warmup, *where
    ) is None:
        return None
    params = {**wl.params(args.quick), **variant.params}
    per_figure: dict[str, list[float]] = {}
    for rep in range(args.reps):
        figures = _attempt(
            f"{label} rep {rep + 1}/{args.reps}", errors,
            _checked_repetition, wl, variant.framework, params, *where,
        )
        if figures is None:
            return None
        for key, value in figures.items():
            per_figure.setdefault(key, []).append(float(value))
    return per_figure


def run_workload(
    wl: Workload, args: argparse.Namespace, env: Optional[dict]
) -> tuple[dict, list[str]]:
    """``({variant key: {figure: [values]}}, errors)`` for one workload."""
    values: dict[str, dict[str, list[float]]] = {}
    errors: list[str] = []
    warmed: set[str] = set()  # one warm-up per framework: its variants share the caches
    unavailable = getattr(args, "unavailable", {})
    for variant in wl.variants:
        if variant.framework in args.frameworks and variant.module not in unavailable:
            warm_up = args.warmup and variant.framework not in warmed
            warmed.add(variant.framework)
            result = run_variant(wl, variant, args, env, errors, warm_up)
            if result is not None:
                values[variant.key] = result
    return values, errors


# ---- reporting -----------------------------------------------------------------------------------


def _total_ram_gib() -> Optional[float]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def machine_info() -> dict:
    info = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable_cpus(),
        "ram_gib": _total_ram_gib(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "ftnb_version": frameworks.version("ftnb"),
        "ray_version": frameworks.version("ray"),
        "torch_version": frameworks.version("torchrun"),
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


def describe_machine(machine: dict) -> str:
    ram = f"{machine['ram_gib']:.0f} GiB RAM, " if machine.get("ram_gib") else ""
    return (
        f"{machine['cpus_usable'] or machine['cpu_count']} CPUs, {ram}{machine['platform']}, "
        f"Python {machine['python']}, ftnb {machine['ftnb_version']}, "
        f"Ray {machine['ray_version'] or 'not installed'}, "
        f"torch {machine.get('torch_version') or 'not installed'}"
    )


def _median(values: dict, key: str, figure: str) -> Optional[float]:
    series = values.get(key, {}).get(figure)
    return statistics.median(series) if series else None


def _labels(wl: Workload, values: dict) -> list[str]:
    """The variant labels to compare with: those of the other frameworks' variants that ran, or
    the default for a row of n/a."""
    labels: list[str] = []
    for v in wl.variants:
        if v.framework != "ftnb" and v.key in values and v.label not in labels:
            labels.append(v.label)
    return labels or [""]


def _others(wl: Workload) -> list[str]:
    """The frameworks a workload's rows compare ftnb with: Ray always has its columns."""
    return ["ray"] + [f for f in wl.others if f != "ray"]


def _combined(verdicts: list[Optional[bool]]) -> Optional[bool]:
    if False in verdicts:
        return False
    return None if None in verdicts else True


def rows_for(wl: Workload, values: dict) -> list[dict]:
    """One row per figure and variant label: ftnb's median and each other framework's (keys
    ``ray``, ``torchrun``), the ratios ftnb/other (``ratio_ftnb_ray``, ...), and the targets
    (``targets``: each with its verdict; ``target`` and ``target_met`` sum them up)."""
    rows = []
    others = _others(wl)
    for label in _labels(wl, values):
        keys = {"ftnb": "ftnb", **{f: Variant(f, label).key for f in others}}
        figures: list[str] = []
        for key in keys.values():
            figures += [f for f in values.get(key, {}) if f not in figures]
        for figure in figures:
            medians = {f: _median(values, key, figure) for f, key in keys.items()}
            ftnb_v = medians["ftnb"]
            row = {"workload": wl.name, "ray_variant": label, "figure": figure,
                   "unit": unit_of(figure), "ftnb": ftnb_v}
            for f in others:
                row[f] = medians[f]
                row[f"ratio_ftnb_{f}"] = (ftnb_v / medians[f]
                                          if ftnb_v is not None and medians[f] else None)
            targets = [t for t in wl.targets if t.figure == figure and t.ray_label == label]
            explicit = len(wl.others) > 1
            row["targets"] = [{"target": t.describe(explicit),
                               "met": t.met(ftnb_v, medians.get(t.against))} for t in targets]
            row["target"] = "; ".join(t["target"] for t in row["targets"]) or None
            row["target_met"] = _combined([t["met"] for t in row["targets"]])
            row["values"] = {key: values[key][figure] for key in keys.values()
                             if figure in values.get(key, {})}
            rows.append(row)
    return rows


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _verdict(row: dict) -> str:
    words = {True: "met", False: "MISSED", None: "n/a"}
    return "; ".join(f"{t['target']} {words[t['met']]}" for t in row.get("targets", ()))


def _columns(rows: list[dict]) -> list[str]:
    """The other frameworks with columns: Ray always, the others when a row has them."""
    from . import FRAMEWORKS

    return [f for f in FRAMEWORKS if f != "ftnb" and (f == "ray" or any(f in r for r in rows))]


def header(rows: list[dict]) -> tuple:
    others = _columns(rows)
    return ("workload", "figure", "ftnb", *others, *(f"ftnb/{f}" for f in others), "target")


def table_cells(rows: list[dict]) -> list[tuple]:
    others = _columns(rows)
    return [
        (
            r["workload"] + (f" (ray {r['ray_variant']})" if r["ray_variant"] else ""),
            r["figure"],
            _fmt(r["ftnb"]),
            *(_fmt(r.get(f)) for f in others),
            *(_fmt(r.get(f"ratio_ftnb_{f}")) for f in others),
            _verdict(r),
        )
        for r in rows
    ]


def format_table(rows: list[dict]) -> str:
    head = header(rows)
    body = table_cells(rows)
    widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]
    text_columns = (0, 1, len(head) - 1)
    lines = []
    for n, line in enumerate([head] + body):
        cells = [
            c.ljust(w) if i in text_columns else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(rows: list[dict]) -> str:
    head = header(rows)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(rows)]
    return "\n".join(lines)


def target_summary(rows: list[dict]) -> str:
    judged = [t["met"] for r in rows for t in r.get("targets", ())]
    return (
        f"targets: {judged.count(True)} met, {judged.count(False)} missed, "
        f"{judged.count(None)} not judged (a figure missing)"
    )


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
                "params": params,
                "machine": machine,
            }
            f.write(json.dumps(record) + "\n")


def write_markdown(path: str, rows: list[dict], args: argparse.Namespace, machine: dict,
                   notes: list[str]) -> None:
    stamp = time.strftime("%Y-%m-%d")
    text = [
        f"Run of `python -m bench` on {stamp}: medians of {args.reps} repetition(s)"
        f"{' at --quick sizes' if args.quick else ''}.",
        "",
        f"Machine: {describe_machine(machine)}.",
        "",
        format_markdown(rows),
        "",
        target_summary(rows) + ".",
    ]
    text += [""] + [f"- {n}" for n in notes] if notes else []
    with open(path, "w") as f:
        f.write("\n".join(text) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.list:
        for wl in WORKLOADS.values():
            print(f"{wl.name:20} {wl.description}\n{'':20} full={wl.full} quick={wl.quick}")
        return 0
    machine = machine_info()
    all_rows: list[dict] = []
    errors: list[str] = []
    notes: list[str] = []
    pycache_dir = None if args.inline else tempfile.mkdtemp(prefix="ftnb-bench-pycache-")
    env = subprocess_env(pycache_dir)
    args.unavailable = unavailable_modules(args, env)
    for module, reason in args.unavailable.items():
        notes.append(f"{MODULE_NAMES.get(module, module)} skipped: {reason}")
    try:
        for name in args.names:
            wl = WORKLOADS[name]
            values, errs = run_workload(wl, args, env)
            errors += errs
            rows = rows_for(wl, values)
            append_jsonl(args.out, rows, wl.params(args.quick), args, machine)
            all_rows += rows
    finally:
        if pycache_dir:
            import shutil

            shutil.rmtree(pycache_dir, ignore_errors=True)
    print()
    print(format_table(all_rows))
    print(
        f"\nmedians of {args.reps} rep(s){' (--quick sizes)' if args.quick else ''}; "
        f"{describe_machine(machine)}; JSON lines appended to {args.out}"
    )
    print(target_summary(all_rows))
    for note in notes:
        print(f"note: {note}")
    if args.markdown:
        write_markdown(args.markdown, all_rows, args, machine, notes)
    if errors:
        print("\nFAILED:", file=sys.stderr)
        for e in errors:
            print(f"- {e}", file=sys.stderr)
        return 1
    return 0
