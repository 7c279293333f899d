"""Benchmarks of ftnb against Ray Tune, Ray Train and torchrun on the same workloads, side by
side (see ``bench/README.md``).

Run ``python -m bench`` from the repository root (``--help`` for the options). Each workload is a
function ``fn(framework, storage_dir, **size) -> {figure: number}`` registered in
:data:`bench.workloads.WORKLOADS` with its sizes, framework variants and targets; every
repetition runs in a fresh Python process (as a user's script would), in its own temporary
storage folder. The table shows the median over repetitions for each framework, the ratios
ftnb/other and whether each target is met; the JSON lines (one per figure) are appended to
``bench/results/results.jsonl``. Ray and torch come with the optional ``bench`` extra; a
framework that cannot be imported is skipped and its column prints ``n/a``.

Layout: ``workloads.py`` (the registry, targets and workloads, driver side), ``trainables.py``
(what runs in the trial processes; kept import-light so it does not pollute the trial-start
figures), ``frameworks.py`` (driver-side framework adapters), ``group_workloads.py``,
``group_loop.py`` and ``_group_driver.py`` (data-parallel jobs: the workloads, the loop every
rank runs, the training script), ``procs.py`` (subprocess environment, process-tree sampling),
``runner.py`` (CLI, table, JSON lines), ``_child.py`` (one repetition in a fresh process),
``_driver.py`` (the script the ``restore`` workload kills).
"""

FRAMEWORKS = ("ftnb", "ray", "torchrun", "optuna")
