"""The driver script of the ``restore`` workload: ``python -m bench._driver SPEC_JSON``.

It runs the experiment as a user's script would, until the workload SIGKILLs it. Import-safe:
ftnb's fork server imports the main module again, so nothing may happen at import time.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from bench import frameworks
    from bench.trainables import checkpointing_trainable

    spec = json.loads(argv[0])
    frameworks.init(spec["framework"], spec["temp_root"])
    frameworks.run_experiment(
        spec["framework"],
        checkpointing_trainable,
        storage_dir=spec["storage_dir"],
        name=spec["name"],
        trials=spec["trials"],
        max_concurrent=spec["concurrent"],
        config=spec["config"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
