"""Control requests to a running experiment: stop one trial, or stop the whole experiment.

Any process that can see the experiment's storage sends one by writing a small JSON file into
``<experiment>/control/``; the driver (``Tuner.fit()`` in a script, or the detached supervisor
behind ``%ftrun``) polls that folder and deletes each request once acted upon. A file, not a
socket, so a new kernel, the CLI or another machine needs nothing but the experiment's path, and
it works the same on local disks, NFS and object stores.

Requests only mean something to a live driver, so each is addressed to one: it carries the
epoch of the owner lease its sender saw (:mod:`ftnb.storage.lease`; every new driver gets the next
epoch). A driver acts on the requests of its own epoch and drops those of earlier ones (they were
meant for a driver that is gone), whatever the clocks of the machines involved say; and
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

from . import ExperimentPaths, is_transient

__all__ = ["ControlInbox", "ControlRequest", "send_request"]

STOP_EXPERIMENT = "stop"
STOP_TRIAL = "stop_trial"
_ACTIONS = (STOP_EXPERIMENT, STOP_TRIAL)


@dataclass(frozen=True)
class ControlRequest:
    """One request: its ``id`` (sortable by the time it was sent), its ``action``, the trial
    it is about (``trial_id``, for "stop_trial") and the ``reason`` to record."""

    id: str
    action: str
    trial_id: Optional[str] = None
    reason: str = "stopped by user"


def send_request(paths: ExperimentPaths, action: str, trial_id: Optional[str] = None,
                 reason: str = "stopped by user", *, epoch: Optional[int] = None
                 ) -> ControlRequest:
    """Ask the experiment's driver to ``action`` ("stop", or "stop_trial" with ``trial_id``).

    ``epoch``: the lease epoch of the driver meant; by default the current lease's (none: 0,
    which no driver acts on). A driver that takes the experiment later drops the request."""
    if action not in _ACTIONS:
        raise ValueError(f"control action {action!r} is not one of {', '.join(_ACTIONS)}.")
    if action == STOP_TRIAL and not trial_id:
        raise ValueError("a 'stop_trial' request needs the trial_id of the trial to stop.")
    if epoch is None:
        from .lease import read_lease

        lease = read_lease(paths)
        epoch = lease.epoch if lease is not None else 0
    # Sortable by time, unique across senders: requests are handled in the order they were sent.
    request = ControlRequest(f"{time.time_ns():020d}-{secrets.token_hex(4)}", action, trial_id,
                             reason)
    body = {"action": action, "trial_id": trial_id, "reason": reason, "epoch": epoch,
            "sent": time.time(), "by": {"host": socket.gethostname(), "pid": os.getpid()}}
    paths.storage.makedirs(paths.control)
    paths.storage.write_atomic(paths.control_request(request.id), json.dumps(body),
                               durable=False)
    return request


class ControlInbox:
    """The driver's side: :meth:`take` returns the new requests addressed to this driver (at
    most every ``interval_s``, a listing of one folder) and removes their files, and those of
    requests meant for earlier drivers."""

    def __init__(self, paths: ExperimentPaths, epoch: int,
                 interval_s: Optional[float] = None) -> None:
        """``epoch``: the epoch of this driver's lease."""
        self.paths = paths
        self.epoch = epoch
        self.interval_s = interval_s if interval_s is not None else (
            paths.storage.poll_interval_s)
        self._next = 0.0

    def take(self) -> list[ControlRequest]:
        """The requests addressed to this driver that arrived since the last call (none when
        called again within ``interval_s``), oldest first."""
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self.interval_s
        storage = self.paths.storage
        requests = []
        try:
            request_ids = self.paths.control_request_ids()
        except Exception as exc:
            if is_transient(exc):
                return []  # storage is not answering: look again next time
            raise
        for request_id in request_ids:
            path = self.paths.control_request(request_id)
            try:
                text = storage.read_text(path)
            except Exception as exc:
                if is_transient(exc):
                    continue  # storage is not answering: read it next time
                text = ""
            try:
                body = json.loads(text)
                action, epoch = body["action"], body.get("epoch")
            except (ValueError, KeyError, TypeError, AttributeError):
                body, action, epoch = {}, None, None  # unreadable: drop it, not trip over it
            if isinstance(epoch, int) and epoch > self.epoch:
                continue  # for a driver newer than this one (which is about to find out)
            storage.remove(path)
            if action in _ACTIONS and epoch == self.epoch:
                requests.append(ControlRequest(request_id, action, body.get("trial_id"),
                                               str(body.get("reason") or "stopped by user")))
        return requests
