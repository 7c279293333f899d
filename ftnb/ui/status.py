"""An experiment's status and trials as every reader sees them, and who drives it.

A state that says RUNNING while no live driver owns the experiment (its driver was killed, its
machine lost) reads as ``INTERRUPTED``, and so do the trials that driver ran (:func:`as_read`);
the stored state is never changed, so a resume continues from it. :class:`DriverStatus` says
who the driver is, and why it counts as alive or gone. Each trial's record from the state is
replaced by its own ``trial.json`` when that is newer (:func:`newer_record`; the controller
writes it at every transition, the whole state at most once a second). Also: the supervisor
that ran it (:func:`supervisor_log`, :func:`supervisor_line`) and the one-experiment summary of
a listing (:func:`summarize`). Part of the read model (:mod:`ftnb.ui.read_model`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Optional

from ..core.records import (
    INTERRUPTED,
    ExperimentState,
    ExperimentStatus,
    merge_trial_records,
    newer_record,
    parse_trial_record,
    without_driver,
)
from ..storage import ExperimentPaths
from ..storage.lease import LeaseInfo, read_lease

__all__ = [
    "DriverStatus",
    "ExperimentSummary",
    "as_read",
    "merge_trial_records",
    "newer_record",
    "parse_trial_record",
    "read_driver",
    "read_state",
    "read_status",
    "summarize",
    "supervisor_line",
    "supervisor_log",
    "supervisor_record",
    "without_driver",
]

_RUNNING = ExperimentStatus.RUNNING


# -- its driver and status -------------------------------------------------------------------------
@dataclass(frozen=True)
class DriverStatus:
    """Who drives an experiment, as its owner lease (``owner.json``) says, seen from this
    process: ``alive`` and ``why`` are :meth:`ftnb.storage.lease.LeaseInfo.verdict`'s verdict.

    A driver may be alive as far as anyone can prove and yet *silent* (``silent_s``: no
    heartbeat for two of its intervals while its death cannot be proven from here, say its
    container was killed; or it is stopped on this machine): the views then say for how long,
    when it will count as dead (``dead_in_s``; None: never on its own), and offer the takeover
    (``ftnb resume --takeover``). ``alive_here``: provably alive on this machine, where a
    takeover is refused.
    """

    lease: Optional[LeaseInfo]
    alive: bool
    why: str
    silent_s: Optional[float] = None
    dead_in_s: Optional[float] = None
    alive_here: bool = False

    @classmethod
    def of(cls, lease: Optional[LeaseInfo], now: Optional[float] = None) -> "DriverStatus":
        """The verdict on ``lease`` (None: there is no owner.json) at ``now`` (default: now)."""
        if lease is None:
            return cls(None, False, "")
        verdict = lease.verdict(now)
        return cls(lease, verdict.alive, verdict.why, verdict.silent_s, verdict.dead_in_s,
                   verdict.alive_here)

    @property
    def silent(self) -> bool:
        """Alive as far as can be proven, but silent: a takeover is offered."""
        return self.alive and self.silent_s is not None

    def gone(self, stored_status: str) -> bool:
        """Whether an experiment whose state says ``stored_status`` lost its driver: the state
        says RUNNING but no live driver owns it."""
        return stored_status == _RUNNING and not self.alive

    def offers_takeover(self, stored_status: str) -> bool:
        """Whether the views offer the takeover: the state says RUNNING and its driver is
        silent."""
        return stored_status == _RUNNING and self.silent

    def line(self, stored_status: str) -> str:
        """One line on the driver: alive (or silent, for how long, and when it will count as
        dead), or gone and why; "" when there is nothing to say (a stopped experiment whose
        driver let go, or died after saving it)."""
        lease = self.lease
        if lease is None:
            return "no driver owns it (no owner.json)" if stored_status == _RUNNING else ""
        if self.silent:
            return f"driver {lease.describe()} is silent: {self.why}"
        if self.alive:
            return f"driver {lease.describe()}: {self.why}"
        if stored_status != _RUNNING:
            return ""
        return f"driver {lease.describe()} is gone: {self.why}"


def read_driver(paths: ExperimentPaths) -> DriverStatus:
    """The experiment's driver as its owner lease says now."""
    return DriverStatus.of(read_lease(paths))


def as_read(state: ExperimentState, driver: DriverStatus) -> ExperimentState:
    """``state`` as every view shows it: :func:`without_driver` if its driver is gone."""
    return without_driver(state) if driver.gone(state.status) else state


def read_status(paths: ExperimentPaths) -> ExperimentStatus:
    """RUNNING, FINISHED, ERRORED or INTERRUPTED (which a RUNNING state whose driver is gone
    reads as): an :class:`~ftnb.core.records.ExperimentStatus` whichever it is (it compares
    equal to its name)."""
    status = ExperimentStatus(ExperimentState.load(paths).status)
    if status != _RUNNING:
        return status
    return INTERRUPTED if read_driver(paths).gone(status) else status


# -- its trials ------------------------------------------------------------------------------------
def read_state(paths: ExperimentPaths) -> ExperimentState:
    """The experiment's state as its files have it, trial records merged (not as read: see
    :func:`as_read`). Raises :class:`ftnb.core.records.StateFormatError` where there is none."""
    return merge_trial_records(ExperimentState.load(paths), paths)


# -- the supervisor that ran it --------------------------------------------------------------------
def supervisor_record(paths: ExperimentPaths) -> dict:
    """``supervisor.json`` (empty when no supervisor ran the experiment, or it is unreadable)."""
    try:
        record = json.loads(paths.storage.read_bytes(paths.supervisor))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def supervisor_line(record: dict) -> str:
    """One line on the supervisor that ran the experiment, as ``supervisor.json`` (``record``)
    says: the launcher it was started with (local, command, ray), where it runs (its host and
    pid; a Ray actor's name and node too), and, once it ended, when and how. "" when no
    supervisor ran it (a script's ``fit()``, a foreground ``ftnb run``).

        Supervisor: local launcher, pid 4242 on node1
        Supervisor: ray launcher, actor ftnb-sweep1-3f2a (namespace ftnb) on node
        9c1e0b2f77aa, pid 4242 on node3; ended 2026-01-01 12:00:00 (finished)   (one line)
    """
    if not record.get("pid"):
        return ""
    where = f"pid {record['pid']} on {record.get('host') or 'an unknown host'}"
    if record.get("actor"):
        namespace = f" (namespace {record['namespace']})" if record.get("namespace") else ""
        node = f" on node {str(record['node_id'])[:12]}" if record.get("node_id") else ""
        where = f"actor {record['actor']}{namespace}{node}, {where}"
    line = f"Supervisor: {record.get('launcher') or 'local'} launcher, {where}"
    ended = record.get("ended")
    if isinstance(ended, (int, float)):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ended))
        line += f"; ended {when} ({record.get('outcome') or 'ended'})"
    return line


def supervisor_log(paths: ExperimentPaths) -> Optional[str]:
    """The supervisor's log as a reader finds it: the experiment's ``supervisor.log`` once the
    supervisor moved (local disk) or uploaded (at its end, elsewhere) it there, else the file
    ``supervisor.json`` names (on the supervisor's machine); None when no supervisor ran it."""
    if paths.storage.exists(paths.supervisor_log):
        return paths.storage.uri(paths.supervisor_log)
    return supervisor_record(paths).get("log")


# -- a summary: one experiment in a list -----------------------------------------------------------
@dataclass(frozen=True)
class ExperimentSummary:
    """One experiment as a list of them shows it (``ftnb ls``), status as read."""

    name: str
    path: str
    status: str
    trials: int
    counts: dict
    failures: int
    preemptions: int
    updated: float
    #: While its driver is silent (:class:`DriverStatus`): for how long, and in how many
    #: seconds it counts as dead (None: never on its own); else None.
    driver_silent_s: Optional[float] = None
    driver_dead_in_s: Optional[float] = None


def summarize(paths: ExperimentPaths, state: Optional[ExperimentState] = None,
              driver: Optional[DriverStatus] = None) -> ExperimentSummary:
    """The experiment's summary, from its state file (one read) and, when the state says
    RUNNING, its owner lease. When that driver is gone the state stopped at its last save, so
    the trials' own records are read too, as :func:`ftnb.ui.snapshot.read_snapshot` reads
    them. Raises :class:`ftnb.core.records.StateFormatError` where there is no readable state.
    ``state`` and ``driver``: as the caller just read them (not read again); ``state`` is then
    changed in place (its trials' newer records merged in)."""
    state = ExperimentState.load(paths) if state is None else state
    if state.status != _RUNNING:
        driver = None
    elif driver is None:
        driver = read_driver(paths)
    if driver is not None and driver.gone(state.status):
        state = as_read(merge_trial_records(state, paths), driver)
    silent = driver is not None and driver.offers_takeover(state.status)
    return ExperimentSummary(
        name=paths.name, path=paths.uri, status=state.status, trials=len(state.trials),
        counts=state.counts(), failures=sum(t.num_failures for t in state.trials),
        preemptions=sum(t.num_preemptions for t in state.trials), updated=state.updated,
        driver_silent_s=driver.silent_s if silent else None,
        driver_dead_in_s=driver.dead_in_s if silent else None)

