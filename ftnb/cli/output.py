"""What the ``ftnb`` command prints: strict JSON, aligned columns, times. An experiment's JSON
is its read model snapshot's (:meth:`ftnb.ui.read_model.ExperimentSnapshot.experiment_json`)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Optional

__all__ = ["columns", "local_time", "print_json"]


def print_json(obj: Any, *, indent: Optional[int] = 1) -> None:
    """Print ``obj`` as strict JSON (jq, JavaScript): NaN and infinities become null.
    ``indent=None``: one line (JSON Lines)."""
    from ..ui.read_model import finite  # imported when used: `ftnb --version` stays fast

    text = json.dumps(finite(obj), indent=indent, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def columns(header: list[str], rows: list[list[str]], right: set[int]) -> str:
    """``rows`` under ``header``, aligned; the columns numbered in ``right`` right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(header)] + [line(r) for r in rows])


def local_time(t: Optional[float]) -> str:
    """A timestamp as local ``YYYY-mm-dd HH:MM:SS`` ("-" for none)."""
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
