"""Re-record the tutorials' outputs: run each notebook top to bottom in a fresh kernel and save
it in place, outputs included and live widgets' state left out (the widgets are re-created when
the notebook runs). Commit the result; ``tests/test_notebooks.py`` then compares every run with it.

    python notebooks/record.py                       # all of them
    python notebooks/record.py 02_trial_fault_tolerance.ipynb
"""

from __future__ import annotations

import glob
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))


def record(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": HERE}}).execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"{os.path.basename(path)}: recorded in {time.monotonic() - started:.1f} s")


def main(argv: list[str]) -> None:
    paths = [os.path.join(HERE, os.path.basename(a)) for a in argv] or sorted(
        glob.glob(os.path.join(HERE, "*.ipynb"))
    )
    for path in paths:
        record(path)


if __name__ == "__main__":
    main(sys.argv[1:])
