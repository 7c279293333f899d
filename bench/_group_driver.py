"""The driver script of the rank-group workloads: ``python -m bench._group_driver SPEC_JSON``.

A user's training script: it imports torch and the framework, readies the framework (Ray:
``ray.init()``), logs a ``fit`` event, runs the data-parallel job to its end
(:func:`bench.frameworks.fit_group`: ``TorchTrainer.fit()``, or torchrun), logs ``fit_done``
and shuts the framework down. With ``"fits": n`` it runs n jobs one after the other (as a
notebook would), the k-th named ``<name>-<k>`` and logging its events with ``"i": k``. The
workload watches the events and kills ranks from outside. Import-safe: ftnb's fork server
imports the main module again, so nothing may happen at import time.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import torch  # noqa: F401  (a training script has it; ftnb's fork server preloads it then)

    from bench import frameworks
    from bench.group_loop import group_loop
    from bench.trainables import log_event

    spec = json.loads(argv[0])
    framework, config = spec["framework"], spec["config"]
    frameworks.prepare_group(framework, spec["temp_root"])
    fits = spec.get("fits", 1)
    try:
        for k in range(fits):
            config_k = {**config, "i": k}
            log_event(config_k, "fit")
            frameworks.fit_group(
                framework,
                group_loop,
                storage_dir=spec["storage_dir"],
                name=spec["name"] if fits == 1 else f"{spec['name']}-{k}",
                num_workers=spec["num_workers"],
                max_failures=spec["max_failures"],
                config=config_k,
            )
            log_event(config_k, "fit_done")
    finally:
        frameworks.shutdown(framework)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
