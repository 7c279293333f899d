"""Control requests to a running experiment: stop one trial, or stop the whole experiment.

Any process that can see the experiment's storage sends one by writing a small JSON file into
``<experiment>/control/``; the driver (``Tuner.fit()`` in a script, or the detached supervisor
behind ``%ftrun``) polls that folder and deletes each request once acted upon. A file, not a
socket, so a new kernel, the CLI or another machine needs nothing but the experiment's path, and
it works the same on local disks, NFS and object stores.

Requests only mean something to a live driver: a driver discards the requests sent before it
took the experiment (they were meant for one that is gone), and
:class:`ftnb.handle.ExperimentHandle` sends none to an experiment that no driver owns.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Optional

from .storage import ExperimentPaths

__all__ = ["ControlInbox", "ControlRequest", "send_request"]

STOP_EXPERIMENT = "stop"
STOP_TRIAL = "stop_trial"
_ACTIONS = (STOP_EXPERIMENT, STOP_TRIAL)
_SUFFIX = ".json"


@dataclass(frozen=True)
class ControlRequest:
    id: str
    action: str
    trial_id: Optional[str] = None
    reason: str = "stopped by user"


def send_request(paths: ExperimentPaths, action: str, trial_id: Optional[str] = None,
                 reason: str = "stopped by user") -> ControlRequest:
    """Ask the experiment's driver to ``action`` ("stop", or "stop_trial" with ``trial_id``)."""
    if action not in _ACTIONS:
        raise ValueError(f"control action {action!r} is not one of {', '.join(_ACTIONS)}.")
    if action == STOP_TRIAL and not trial_id:
        raise ValueError("a 'stop_trial' request needs the trial_id of the trial to stop.")
    # Sortable by time, unique across senders: requests are handled in the order they were sent.
    request = ControlRequest(f"{time.time_ns():020d}-{secrets.token_hex(4)}", action, trial_id,
                             reason)
    body = {"action": action, "trial_id": trial_id, "reason": reason, "sent": time.time(),
            "by": {"host": socket.gethostname(), "pid": os.getpid()}}
    paths.storage.makedirs(paths.control)
    paths.storage.write_atomic(paths.storage.join(paths.control, request.id + _SUFFIX),
                               json.dumps(body), durable=False)
    return request


def _sent_ns(name: str) -> int:
    try:
        return int(name.split("-", 1)[0])
    except ValueError:
        return 0


class ControlInbox:
    """The driver's side: :meth:`take` returns the new requests (at most every ``interval_s``,
    a listing of one folder) and removes their files."""

    def __init__(self, paths: ExperimentPaths, since: float,
                 interval_s: Optional[float] = None) -> None:
        """``since``: when this driver took the experiment (its lease); older requests were
        meant for a driver that is gone and are dropped."""
        self.paths = paths
        self.interval_s = interval_s if interval_s is not None else (
            0.2 if paths.storage.is_local else 2.0)
        self._next = 0.0
        for name in self._names():
            if _sent_ns(name) < since * 1e9:
                paths.storage.remove(paths.storage.join(paths.control, name))

    def _names(self) -> list[str]:
        return [n for n in self.paths.storage.listdir(self.paths.control) if n.endswith(_SUFFIX)]

    def take(self) -> list[ControlRequest]:
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self.interval_s
        storage = self.paths.storage
        requests = []
        for name in self._names():
            path = storage.join(self.paths.control, name)
            try:
                body = json.loads(storage.read_text(path))
                action = body["action"]
            except (OSError, ValueError, KeyError, TypeError):
                body, action = {}, None  # unreadable: drop it rather than trip over it forever
            storage.remove(path)
            if action in _ACTIONS:
                requests.append(ControlRequest(name[: -len(_SUFFIX)], action, body.get("trial_id"),
                                               str(body.get("reason") or "stopped by user")))
        return requests
