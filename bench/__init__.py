"""Benchmarks of ftnb (and, later, Ray Tune) on the same workloads.

Run ``python -m bench`` from the repository root (``--help`` for the options). Each workload is a
function ``fn(framework, storage_dir, **size) -> {figure: number}`` registered in
:data:`bench.workloads.WORKLOADS`; every repetition runs in a fresh Python process (as a user's
script would), in its own temporary storage folder. The table shows the median over repetitions
and the JSON lines (one per workload and figure) are appended to ``bench/results/results.jsonl``.

Only ftnb variants exist for now: the Ray Tune column and the ratio print ``n/a``. A Ray variant is
added by implementing the framework hooks in :mod:`bench.frameworks` and
:func:`bench.trainables.trial_api`, and listing ``"ray"`` in a workload's ``variants``.

Layout: ``workloads.py`` (the registry and the workloads, driver side), ``trainables.py`` (what
runs in the trial processes; kept import-light so it does not pollute the trial-start figures),
``frameworks.py`` (driver-side framework adapters), ``runner.py`` (CLI, table, JSON lines),
``_child.py`` (one repetition in a fresh process).
"""

FRAMEWORKS = ("ftnb", "ray")
