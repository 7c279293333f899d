"""Waiting on conditions with a deadline, and telling whether a process runs: what tests of
processes need (never a bare sleep). Shared by :mod:`ftnb.testing.executor_contract` and the
project's own tests."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

__all__ = ["pid_alive", "wait_for"]


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False
