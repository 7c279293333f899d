"""The worker process of a :class:`~ftnb.elastic.WorkerGroup`: it builds its object with the
factory, then answers calls ``fn(obj, *args, **kwargs)`` until told to stop.

It talks to the group through one pipe: the group sends ``("call", call_id, payload)``,
``("state", payload)`` or ``("close", None)``; the worker sends ``("ready", None)`` or
``("failed", error)`` once, then ``(call_id, True, value)`` or ``(call_id, False, error)`` per
call, where ``error`` is a dict (kind, type, message, traceback). It dies with its parent.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any, Optional

__all__ = ["worker_index", "worker_main"]

_INDEX: Optional[int] = None


def worker_index() -> Optional[int]:
    """This worker's index in its group (it keeps it when it is recreated), or None outside a
    worker (RLlib's ``worker_index``)."""
    return _INDEX


def describe_error(exc: BaseException) -> dict:
    """A raised exception as a worker error: kind ``oom`` (MemoryError, torch's
    OutOfMemoryError) or ``exception``, with its type, message and traceback."""
    from ..execution.attempt import _is_out_of_memory

    return {
        "kind": "oom" if _is_out_of_memory(exc) else "exception",
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def worker_main(index: int, factory_payload: bytes, conn: Any, env: dict) -> None:
    """Entry point of a worker process."""
    global _INDEX
    import cloudpickle

    from ..execution.trial_process import _die_with_parent, release_fork_server

    release_fork_server()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is for the caller, which closes us
    os.environ.update(env)
    _INDEX = index
    try:
        factory, takes_index, needs_set_state = cloudpickle.loads(factory_payload)
        obj = factory(index) if takes_index else factory()
        if needs_set_state and not callable(getattr(obj, "set_state", None)):
            raise TypeError(
                f"WorkerGroup(get_state=...) is given, but the worker object (a "
                f"{type(obj).__name__}) has no set_state(state) method to take the state. "
                "Fix: add `def set_state(self, state): ...` to it, or leave get_state out."
            )
    except BaseException as exc:
        conn.send(("failed", describe_error(exc)))
        os._exit(1)
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the group is gone
        kind = message[0]
        if kind == "close":
            break
        if kind == "state":
            try:
                obj.set_state(cloudpickle.loads(message[1]))
                conn.send(("state", True, None))
            except BaseException as exc:
                conn.send(("state", False, describe_error(exc)))
                os._exit(1)
            continue
        _, call_id, payload = message
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            value = fn(obj, *args, **kwargs)
        except BaseException as exc:
            conn.send((call_id, False, describe_error(exc)))
            sys.stderr.flush()
            os._exit(1)  # its state may be corrupt: the group recreates it (as RLlib does)
        try:
            conn.send((call_id, True, value))
        except Exception as exc:  # the value could not be pickled
            conn.send((call_id, False, describe_error(exc)))
            os._exit(1)
    try:
        close = getattr(obj, "close", None)
        if callable(close):
            close()
    finally:
        os._exit(0)
