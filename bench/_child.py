"""One repetition of one workload, in a fresh process: ``python -m bench._child WORKLOAD
FRAMEWORK PARAMS_JSON STORAGE_ROOT OUT_JSON``.

It runs the workload in a new temporary folder under STORAGE_ROOT (deleted afterwards) and
writes its figures to OUT_JSON. Kept tiny and import-safe: ftnb's fork server imports the main
module again in every trial process, so nothing may happen at import time.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import shutil
    import tempfile

    from bench.workloads import WORKLOADS

    name, framework, params, storage_root, out = argv
    storage = tempfile.mkdtemp(prefix=f"ftnb-bench-{name}-", dir=storage_root or None)
    try:
        figures = WORKLOADS[name].fn(framework, storage, **json.loads(params))
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    with open(out, "w") as f:
        json.dump(figures, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
