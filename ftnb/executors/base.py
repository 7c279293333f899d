"""The executor contract: start an attempt, stream its events, stop it.

Executors are thin: they never decide whether to retry, what counts as a failure, or what the
trial's status is. That policy lives in the controller. An executor is used from one thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

__all__ = ["EXIT_PREEMPTED", "AttemptLaunch", "Event", "Executor", "ExitInfo"]

#: The exit code of an attempt that was preempted (SIGTERM, 128 + 15) and ended itself, whether
#: or not it checkpointed in its grace period: still a preemption, not a failure.
EXIT_PREEMPTED = 143


@dataclass
class AttemptLaunch:
    """Everything one attempt needs. ``payload`` is cloudpickled (the trainable travels by value
    so functions defined in a notebook or ``__main__`` work)."""

    trial_id: str
    attempt: int
    payload: bytes
    env: dict[str, str] = field(default_factory=dict)
    stdout_path: Optional[str] = None
    stderr_path: Optional[str] = None
    # The caller's import path and working directory: modules and relative paths that work in
    # the notebook or script work in its trials too.
    sys_path: list[str] = field(default_factory=list)
    cwd: Optional[str] = None


@dataclass
class ExitInfo:
    """How an attempt's process ended."""

    exit_code: Optional[int]  # None if unknown; negative: killed by that signal
    oom_killed: bool = False

    @property
    def signal_number(self) -> Optional[int]:
        if self.exit_code is not None and self.exit_code < 0:
            return -self.exit_code
        return None


@dataclass
class Event:
    """One thing an attempt reported: ``kind`` is result | error | preempted | done | exit.

    Every attempt ends with exactly one ``exit`` event, after all of its other events.
    """

    trial_id: str
    attempt: int
    kind: str
    data: Any = None


class Executor(Protocol):
    def start(self, launch: AttemptLaunch) -> None:
        """Start the attempt; its events arrive through :meth:`poll`."""

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived, waiting up to ``timeout`` seconds for the first one."""

    def request_stop(self, trial_id: str) -> None:
        """Ask the attempt to end at its next report (it keeps its checkpoints)."""

    def kill(self, trial_id: str) -> None:
        """End the attempt now (SIGKILL to its whole process group)."""

    def running(self) -> list[str]:
        """Trial ids with a live attempt."""

    def shutdown(self) -> None:
        """Kill every attempt and release resources."""
