"""Words in messages and views, shared by every layer (it imports nothing of ftnb's)."""

from __future__ import annotations

from typing import Optional

__all__ = ["ftnb_command", "number", "plural"]


def number(value: float) -> str:
    """``2.0`` -> ``2``, ``0.5`` -> ``0.5``: what users typically type."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def plural(count: float, noun: str, many: Optional[str] = None) -> str:
    """``1 failure``, ``2 failures``, ``0.5 CPUs`` (``many`` for an irregular plural:
    ``plural(n, "retry", "retries")``)."""
    return f"{number(count)} {noun if count == 1 else (many or noun + 's')}"


def ftnb_command() -> str:
    """How to run the ``ftnb`` command of this Python, for the commands ftnb prints: ``ftnb``
    when the one on PATH is this environment's (an activated venv, an installed tool), else
    this environment's console script by its path (``.venv/bin/ftnb`` under the current
    folder, else the absolute path), else this interpreter's ``-m ftnb``. After the README's
    first command, in the same shell with the venv not activated, what ftnb prints runs as
    printed."""
    import os
    import shlex
    import shutil
    import sys

    here = os.path.dirname(os.path.abspath(sys.executable))
    found = shutil.which("ftnb")
    if found and os.path.dirname(os.path.abspath(found)) == here:
        return "ftnb"
    script = os.path.join(here, "ftnb")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return shlex.quote(_shown_path(script))
    return f"{shlex.quote(_shown_path(sys.executable))} -m ftnb"


def _shown_path(path: str) -> str:
    """``path`` relative to the current folder when it lies under it, else absolute."""
    import os

    try:
        relative = os.path.relpath(path)
    except ValueError:  # (another drive, on Windows)
        return path
    return path if relative.startswith("..") else relative
