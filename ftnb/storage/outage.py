"""Outages of remote storage: how long writers wait for it, and how long one call may hang.

A write to remote storage (an object store, any non-local fsspec filesystem) that fails
with anything but a permanent error (a missing path, a denied permission) is retried with
backoff for up to ``$FTNB_STORAGE_OUTAGE_S`` seconds (default 600) after the storage stopped
answering, past the filesystem's own few seconds of retries: the writer (the driver saving
state, a trial in ``report()``) waits out a network outage instead of failing, and an
acknowledged report is still a persisted one. Past that, :class:`StorageUnavailableError`.
Reads are not retried: readers (the widget, the CLI) poll again anyway. The retrying itself is
:class:`~ftnb.storage.backend.Storage`'s (one outage shares one deadline across its writes).

A network that drops packets instead of refusing connections makes a request hang rather than
fail, so every call to an async fsspec filesystem (s3fs, gcsfs, ...) has a deadline (other
filesystems take none, nor does a ``DirFileSystem`` over one of them):
``$FTNB_STORAGE_CALL_TIMEOUT_S`` (default 60) plus the time to move its bytes at 1 MB/s. A call
past it is cancelled and counts as a failure of the outage kind.
"""

from __future__ import annotations

import os
from typing import Any

OUTAGE_ENV = "FTNB_STORAGE_OUTAGE_S"
DEFAULT_OUTAGE_S = 600.0
CALL_TIMEOUT_ENV = "FTNB_STORAGE_CALL_TIMEOUT_S"
DEFAULT_CALL_TIMEOUT_S = 60.0
_SLOWEST_BYTES_PER_S = 1 << 20  # what a call's deadline allows for its data, on top
#: The first wait before a failed write is tried again, and the longest (the wait doubles).
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# Errors that waiting cannot cure: the path is wrong, or access is denied.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError,
              IsADirectoryError, ValueError, TypeError)


class StorageUnavailableError(OSError):
    """Remote storage did not take a write for longer than ``$FTNB_STORAGE_OUTAGE_S``."""


def _seconds_from_env(name: str, default: float, what: str, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= minimum:
        raise ValueError(f"{name}={raw!r} is not a number of seconds >= {minimum:g}. Fix: set it "
                         f"to {what} (default {default:.0f}).")
    return value


def outage_limit_s() -> float:
    """How long a writer waits for remote storage to answer again (``$FTNB_STORAGE_OUTAGE_S``)."""
    return _seconds_from_env(OUTAGE_ENV, DEFAULT_OUTAGE_S,
                             "how long writers should wait for storage")


def call_timeout_s() -> float:
    """The base deadline of one call to remote storage (``$FTNB_STORAGE_CALL_TIMEOUT_S``)."""
    return _seconds_from_env(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_S,
                             "the longest a storage request may hang", minimum=1.0)


def check_outage_settings() -> None:
    """Raise a clear error for a bad ``$FTNB_STORAGE_OUTAGE_S`` or ``$FTNB_STORAGE_CALL_TIMEOUT_S``
    now, before an experiment starts, rather than in the middle of an outage."""
    outage_limit_s()
    call_timeout_s()


def call_deadline(fs: Any, nbytes: int = 0) -> dict:
    """``timeout=`` for a call to an async fsspec filesystem that moves ``nbytes`` (see the
    module docstring); nothing for other filesystems, which take no such argument."""
    if not _takes_call_timeout(fs):
        return {}
    return {"timeout": call_timeout_s() + nbytes / _SLOWEST_BYTES_PER_S}


def _takes_call_timeout(fs: Any) -> bool:
    """Whether ``fs``'s methods take ``timeout=``: those of an async filesystem do (fsspec's
    sync wrappers consume it), but a wrapper that is async itself (``DirFileSystem``) hands it
    to the filesystem it wraps, which may be a synchronous one that refuses it (a local disk)."""
    from fsspec import AbstractFileSystem
    from fsspec.asyn import AsyncFileSystem

    if not isinstance(fs, AsyncFileSystem):
        return False
    wrapped = getattr(fs, "fs", None)
    return _takes_call_timeout(wrapped) if isinstance(wrapped, AbstractFileSystem) else True


def is_transient(exc: BaseException) -> bool:
    """Whether a storage error may go away by itself (a network or service outage)."""
    return isinstance(exc, Exception) and not isinstance(exc, _PERMANENT)
