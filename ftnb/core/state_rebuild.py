"""An experiment state rebuilt when a journal segment it needs is damaged or deleted.

While a driver runs, the records of the trials at rest are in journal segments
(:mod:`ftnb.storage.record_journal`) that the state and its previous generation both list: one
damaged or deleted segment leaves neither generation readable. The trials' own files still say
what each trial is: ``trial.json`` (its record, written with every change the driver makes) and
``params.json`` (its config, written when the experiment was laid out). :func:`rebuild_state`
puts a state back together from a state file's header, every record its segments still hold,
and those files; restore uses it only when neither generation can be read, and says so.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ..storage import ExperimentPaths
from ..storage.record_journal import Segment
from .recoveries import JOURNAL_REBUILT, recovery
from .records import FORMAT, ExperimentState, StateFormatError, TrialRecord, parse_trial_record

__all__ = ["REBUILT", "rebuild_state"]

#: ``ExperimentState.loaded_from`` of a state that :func:`rebuild_state` made.
REBUILT = "<rebuilt from the trials' files>"


def rebuild_state(paths: ExperimentPaths) -> Optional[ExperimentState]:
    """The experiment's state rebuilt from the newest state file that is valid JSON and lists a
    journal, its ``loaded_from`` :data:`REBUILT` and the last of its ``recoveries`` saying how
    (how many trials it found, and where); None when no state file has a readable header
    (nothing to rebuild from)."""
    storage = paths.storage
    for path in (paths.state, paths.state_backup):
        try:
            data = json.loads(storage.read_bytes(path))
        except (FileNotFoundError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("format") != FORMAT or not data.get("journal"):
            continue
        try:
            return _rebuild(paths, path, data)
        except (StateFormatError, KeyError, TypeError, ValueError):
            continue
    return None


def _rebuild(paths: ExperimentPaths, path: str, data: dict) -> ExperimentState:
    storage = paths.storage
    by_id: dict[str, dict] = {}
    unreadable = []
    for entry in data.get("journal") or []:
        try:
            segment = Segment.from_json(entry)
            records = _readable_records(storage.read_bytes(storage.join(paths.dir, segment.file))
                                        [: segment.bytes])
        except (ValueError, FileNotFoundError):
            unreadable.append(str(entry.get("file") if isinstance(entry, dict) else entry))
            continue
        if len(records) != segment.records:
            unreadable.append(segment.file)
        for record in records:
            by_id[record["trial_id"]] = record
    for record in data.get("trials") or []:  # the state file's own records are the newest
        if isinstance(record, dict) and "trial_id" in record:
            by_id[record["trial_id"]] = record
    from_files = 0
    dir_names = {r.get("dir_name") for r in by_id.values()}
    for name in storage.listdir(paths.dir):
        trial_paths = paths.trial(name)
        try:
            raw = storage.read_bytes(trial_paths.record)
        except (FileNotFoundError, NotADirectoryError):  # (no trial folder: a file)
            raw = None
        if raw is not None:
            record = _any_trial_record(raw)
            if record is not None:
                known = by_id.get(record.trial_id)
                if known is None or record.seq > int(known.get("seq") or 0):
                    position = known.get("position") if known else None
                    by_id[record.trial_id] = {**record.to_json(), "position": position}
                    from_files += known is None
                continue
        if name in dir_names:
            continue
        try:  # a trial that never started has only its config
            config = json.loads(storage.read_bytes(trial_paths.params))
        except (FileNotFoundError, NotADirectoryError, ValueError):
            continue
        by_id[name] = {"trial_id": name, "dir_name": name, "config": config, "position": None}
        from_files += 1
    trials = sorted(by_id.values(), key=lambda r: (r.get("position") is None,
                                                   r.get("position") or 0, str(r["trial_id"])))
    listed = data.get("trial_count")
    state = ExperimentState.from_json({**data, "trials": trials},
                                      where=storage.uri(path))
    state.loaded_from = REBUILT
    found = f"{len(trials)} of the {listed} trials it lists" if isinstance(listed, int) \
        else f"{len(trials)} trials"
    state.recoveries.append(recovery(
        JOURNAL_REBUILT,
        f"the journal segments {', '.join(unreadable) or '(none)'} that "
        f"{storage.uri(path)} lists are damaged or missing; rebuilt the experiment state from "
        f"its other records and the trials' own files ({found}, {from_files} of them from "
        "their trial folders)."))
    return state


def _readable_records(data: bytes) -> list[dict]:
    """The records of a segment's lines that can be read (a damaged line is left out)."""
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "trial_id" in record:
            out.append(record)
    return out


def _any_trial_record(raw: bytes) -> Optional[TrialRecord]:
    """The record in a ``trial.json``, whichever trial's it is (None if unreadable)."""
    try:
        data: Any = json.loads(raw)
        trial_id = data["trial_id"]
    except (ValueError, TypeError, KeyError):
        return None
    return parse_trial_record(raw, trial_id)
