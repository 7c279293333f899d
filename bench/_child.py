"""One repetition of one workload, in a fresh process: ``python -m bench._child WORKLOAD
FRAMEWORK PARAMS_JSON STORAGE_ROOT OUT_JSON``.

It runs the workload in a new temporary folder under STORAGE_ROOT (deleted afterwards, with
whatever the framework started) and writes its figures to OUT_JSON. Kept tiny and import-safe:
ftnb's fork server imports the main module again, so nothing may happen at import time.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from bench.workloads import run_in_storage

    name, framework, params, storage_root, out = argv
    figures = run_in_storage(name, framework, json.loads(params), storage_root or None)
    with open(out, "w") as f:
        json.dump(figures, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
