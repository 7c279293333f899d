"""Waiting on conditions with a deadline, and telling whether a process runs: what tests of
processes need (never a bare sleep). Shared by :mod:`ftnb.testing.executor_contract` and the
project's own tests."""

from __future__ import annotations

import time
from typing import Any, Callable

from ..system.processes import pid_exists, process_status

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
    return pid_exists(pid) and process_status(pid) not in (None, "Z")
