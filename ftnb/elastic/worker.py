"""What runs in a worker of a :class:`~ftnb.elastic.WorkerGroup`, whichever backend started it:
:class:`WorkerBody` builds the worker's object with the factory, then answers calls
``fn(obj, *args, **kwargs)`` and state pushes. :func:`worker_main` is the local backend's
process around it, talking to the group through one pipe: the group sends
``("call", call_id, payload)``, ``("state", payload)`` or ``("close", None)``; the worker sends
``("ready", None)`` or ``("failed", error)`` once, then ``(call_id, True, value)`` or
``(call_id, False, error)`` per call, where ``error`` is a dict (kind, type, message,
traceback). It dies with its parent. The Ray backend's actor wraps the same body
(:mod:`ftnb.elastic.ray_workers`).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Any, Optional

__all__ = ["WorkerBody", "describe_error", "load_factory", "worker_index", "worker_main"]

_INDEX: Optional[int] = None


def worker_index() -> Optional[int]:
    """This worker's index in its group (it keeps it when it is recreated), or None outside a
    worker (RLlib's ``worker_index``)."""
    return _INDEX


def describe_error(exc: BaseException) -> dict:
    """A raised exception as a worker error: kind ``oom`` (MemoryError, torch's
    OutOfMemoryError) or ``exception``, with its type, message and traceback."""
    from ..execution.oom import is_out_of_memory

    return {
        "kind": "oom" if is_out_of_memory(exc) else "exception",
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def load_factory(factory_payload: bytes) -> tuple:
    """The group's cloudpickled ``(factory, takes_index, needs_set_state)``, loaded (which
    imports the modules the factory comes from)."""
    import cloudpickle

    return cloudpickle.loads(factory_payload)


class WorkerBody:
    """One worker's object and the calls on it. Building it (``factory``: the payload, or
    :func:`load_factory`'s tuple) raises what the factory raised; :meth:`call` and
    :meth:`set_state` return ``(ok, value or error)``: after a failed one the caller ends the
    worker (its state may be corrupt), as RLlib does."""

    def __init__(self, index: int, factory: "bytes | tuple") -> None:
        global _INDEX

        _INDEX = index
        if isinstance(factory, bytes):
            factory = load_factory(factory)
        factory, takes_index, needs_set_state = factory
        self.obj = factory(index) if takes_index else factory()
        if needs_set_state and not callable(getattr(self.obj, "set_state", None)):
            raise TypeError(
                f"WorkerGroup(get_state=...) is given, but the worker object (a "
                f"{type(self.obj).__name__}) has no set_state(state) method to take the state. "
                "Fix: add `def set_state(self, state): ...` to it, or leave get_state out."
            )

    def call(self, payload: bytes) -> tuple[bool, Any]:
        import cloudpickle

        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            return True, fn(self.obj, *args, **kwargs)
        except BaseException as exc:
            return False, describe_error(exc)

    def set_state(self, state: bytes) -> tuple[bool, Optional[dict]]:
        import cloudpickle

        try:
            self.obj.set_state(cloudpickle.loads(state))
            return True, None
        except BaseException as exc:
            return False, describe_error(exc)

    def close(self) -> None:
        close = getattr(self.obj, "close", None)
        if callable(close):
            close()


def worker_main(index: int, factory_payload: bytes, conn: Any, env: dict) -> None:
    """Entry point of a local worker process."""
    from ..execution.process_tree import become_subreaper
    from ..execution.trial_process import die_with_parent, release_fork_server

    become_subreaper()  # what it starts ends with it (end_descendants, or the group's kill)
    release_fork_server()
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is for the caller, which closes us
    os.environ.update(env)
    try:
        body = WorkerBody(index, factory_payload)
    except BaseException as exc:
        conn.send(("failed", describe_error(exc)))
        _leave(1)
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            _leave(0)  # the group is gone
        kind = message[0]
        if kind == "close":
            break
        if kind == "state":
            ok, error = body.set_state(message[1])
            conn.send(("state", ok, error))
            if not ok:
                _leave(1)
            continue
        _, call_id, payload = message
        ok, value = body.call(payload)
        try:
            conn.send((call_id, ok, value))
        except Exception as exc:  # the value could not be pickled
            conn.send((call_id, False, describe_error(exc)))
            ok = False
        if not ok:
            sys.stderr.flush()
            _leave(1)  # its state may be corrupt: the group recreates it (as RLlib does)
    try:
        body.close()
    finally:
        _leave(0)


def _leave(code: int) -> None:
    """End the worker, and every process it started with it (a subreaper's orphans are its own)."""
    from ..execution.process_tree import end_descendants

    end_descendants()
    os._exit(code)
