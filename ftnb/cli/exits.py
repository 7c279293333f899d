"""Exit codes and the one-line error of the ``ftnb`` command."""

from __future__ import annotations

__all__ = [
    "EXIT_ERRORED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "describe",
    "one_line",
]

#: Done: the command did what was asked (an experiment it waited for FINISHED).
EXIT_OK = 0
#: The experiment errored (a trial ended ERRORED), or something unexpected failed (a bug, a
#: storage backend's failure).
EXIT_ERRORED = 1
#: A usage error: a bad option or path, no experiment there, a trainable that cannot be found.
EXIT_USAGE = 2
#: Interrupted: Ctrl+C (or SIGTERM), or the experiment stopped before it ended; resumable.
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user error: printed as one line on stderr, exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(text.split())


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    return f"{type(exc).__name__}: {one_line(str(exc))}"
