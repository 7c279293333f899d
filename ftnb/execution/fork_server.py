"""The fork server that trial processes and :class:`~ftnb.elastic.WorkerGroup` workers are forked
from: a process that has already imported ftnb (and the heavy modules the caller has imported,
such as torch), so starting a trial or a worker costs a fork rather than a Python start-up.

Python has one fork server per process, whatever asks for it: the local executor
(:mod:`ftnb.execution.local`) and the local worker backend (:mod:`ftnb.elastic.local_workers`)
share it, so its preload list is theirs together, set once by :func:`fork_server_context`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from typing import Any, Optional

__all__ = ["ALWAYS_PRELOAD", "PRELOAD_IF_LOADED", "TRIAL_PROCESS_PREFIX", "WORKER_PROCESS_PREFIX",
           "fork_server_context", "skip_main_for_trials"]

# Imported once in the fork server so that every trial and worker starts with them in memory.
ALWAYS_PRELOAD = [
    "ftnb", "ftnb.execution.local", "ftnb.execution.attempt", "ftnb.session", "ftnb.objects",
    "ftnb.storage.lease", "ftnb.elastic.worker",
    "cloudpickle", "fsspec",
    # Every trial unpickles its storage (fsspec's local filesystem) and arms faulthandler: in
    # the server once, not in each trial (a quarter of a trial process's own instructions).
    "fsspec.implementations.local", "faulthandler",
    # Makes the server the subreaper of its children's orphans (see the module).
    "ftnb.execution.fork_server_reaper",
]
# Imported in the fork server too when the caller has already imported them: a notebook that
# trains with torch will have trials that need torch, and importing it once saves seconds a trial.
PRELOAD_IF_LOADED = ["numpy", "pandas", "torch", "torch.distributed", "sklearn", "s3fs",
                     "gymnasium"]

#: The names of trial processes (then the trial id, and ``-rankN`` in a group) and of
#: WorkerGroup workers (then the worker's index).
TRIAL_PROCESS_PREFIX = "ftnb-trial-"
WORKER_PROCESS_PREFIX = "ftnb-worker-"
#: Processes whose children must not re-import the caller's ``__main__``.
_NO_MAIN_PREFIXES = (TRIAL_PROCESS_PREFIX, WORKER_PROCESS_PREFIX)

_context_lock = threading.Lock()
_context: Optional[Any] = None


def skip_main_for_trials() -> None:
    """Trial processes (and workers) must not re-run the caller's ``__main__``.

    multiprocessing re-imports the parent's main script in every child so that pickled
    references to its functions resolve. ftnb sends the trainable by value, so that is pure
    cost (every import at the top of the script, per trial) and, worse, a script without an
    ``if __name__ == "__main__":`` guard would start its experiment again in every trial.
    """
    import multiprocessing.spawn as spawn

    original = spawn.get_preparation_data
    if getattr(original, "_ftnb", False):
        return

    def get_preparation_data(name: str) -> dict:
        data = original(name)
        if name.startswith(_NO_MAIN_PREFIXES):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._ftnb = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def fork_server_context() -> Any:
    """The process-wide fork-server context, started on first use and reused afterwards."""
    global _context
    with _context_lock:
        if _context is None:
            skip_main_for_trials()
            ctx = multiprocessing.get_context("forkserver")
            preload = list(ALWAYS_PRELOAD)
            preload += [m for m in PRELOAD_IF_LOADED if m in sys.modules]
            if "torch.distributed" in sys.modules:
                # DDP's constructor imports torch._dynamo (seconds): once here, not in every
                # rank of every restart of a group.
                preload.append("torch._dynamo")
            extra = os.environ.get("FTNB_PRELOAD", "")
            preload += [m.strip() for m in extra.split(",") if m.strip()]
            ctx.set_forkserver_preload(preload)
            _context = ctx
        return _context
