"""What a driver keeps in its storage folder's index (:mod:`ftnb.storage.experiment_index`):
its own entry, and, as it ends, what readers would read of the experiments beside it whose
driver died without rewriting theirs.

A SIGKILLed driver leaves an entry that says RUNNING. Every reader finds its lease dead and
reads the experiment as INTERRUPTED, with its trials' own records merged in
(:func:`~ftnb.core.records.merge_trial_records`, :func:`~ftnb.core.records.without_driver`,
the rules every reader shares). That read costs a few requests, for each such experiment and
each reader that has not read it before. So a driver that ends reads it once and keeps the
result in the index's snapshot, under the entry's version and a digest of the lease it found
dead. A reader uses it only while both are the same, and only where its own verdict on the
lease is "gone" too.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from ..storage import ExperimentPaths, Storage
from ..storage.experiment_index import IndexEntryWriter, read_files
from ..storage.lease import LeaseInfo
from .records import (
    ExperimentState,
    ExperimentStatus,
    merge_trial_records,
    without_driver,
)

__all__ = ["gone_summaries", "index_entry_writer", "lease_digest", "parse_lease",
           "resume_header"]

_RUNNING = ExperimentStatus.RUNNING.value
#: A search space bigger than this (as JSON) is not copied into the index: a reader that
#: needs the resume line reads the state instead.
_LARGEST_SPACE = 16_000


def index_entry_writer(paths: ExperimentPaths, lease: Any = None) -> IndexEntryWriter:
    """The writer of the experiment's entry (the controller's), which folds in
    :func:`gone_summaries` as its driver ends."""
    return IndexEntryWriter(paths, lease, derive=gone_summaries)


def lease_digest(raw: Optional[bytes]) -> str:
    """What identifies an ``owner.json`` as read (``""``: there is none)."""
    return hashlib.sha256(raw).hexdigest() if raw is not None else ""


def resume_header(state: ExperimentState) -> Optional[dict]:
    """What the line that resumes the experiment is made of (its name, trainable, origin,
    whether a trainer ran it, its search space: see :func:`ftnb.ui.read_model.resume_line`);
    None when its search space is too big to copy."""
    settings = {k: state.settings[k] for k in ("origin", "trainer") if k in state.settings}
    header = {"name": state.name, "trainable": state.trainable, "settings": settings,
              "param_space": state.param_space}
    try:
        if len(json.dumps(header, default=str)) > _LARGEST_SPACE:
            return None
    except (TypeError, ValueError):
        return None
    return header


def gone_summaries(storage: Storage, folder: str, entries: dict) -> dict:
    """For each experiment of ``entries`` (name -> its RUNNING entry) whose driver is gone as
    seen from here: its summary as every reader reads it, the digest of the lease found dead,
    and its resume header. Leases are read in one batch; a storage error leaves that
    experiment out."""
    paths = {name: ExperimentPaths.of(storage, name, folder) for name in entries}
    leases = read_files(storage, [p.lease for p in paths.values()])
    out = {}
    for name, where in paths.items():
        raw = leases.get(where.lease)
        if isinstance(raw, Exception) and not isinstance(raw, FileNotFoundError):
            continue
        raw = raw if isinstance(raw, bytes) else None
        lease = parse_lease(raw)
        if lease is not None and lease.verdict().alive:
            continue
        try:
            state = ExperimentState.load(where)
            if state.status != _RUNNING:
                continue  # saved since (a resume, or its final save): its entry follows
            read = without_driver(merge_trial_records(state, where))
        except Exception:
            continue
        out[name] = {
            "lease": lease_digest(raw),
            "summary": {"status": read.status, "trials": len(read.trials),
                        "counts": read.counts(),
                        "failures": sum(t.num_failures for t in read.trials),
                        "preemptions": sum(t.num_preemptions for t in read.trials),
                        "updated": read.updated},
            "resume": resume_header(state),
        }
    return out


def parse_lease(raw: Optional[bytes]) -> Optional[LeaseInfo]:
    """``owner.json``'s lease as :func:`ftnb.storage.lease.read_lease` reads it (None: there
    is none, or it is unreadable)."""
    if raw is None:
        return None
    try:
        return LeaseInfo.from_json(json.loads(raw))
    except (ValueError, TypeError, AttributeError):
        return None
