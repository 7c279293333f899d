"""What a restore fell back to because a file of the experiment was damaged or missing.

A restore never costs more than the damage: it reads the previous state generation when the
latest is unreadable, cuts the damaged end off a ``result.json``, resumes a trial from its
newest intact checkpoint, starts one over when none is intact. None of that may happen in
silence: each fallback is a :func:`recovery` entry kept in the state
(``ExperimentState.recoveries``, for ``ftnb status`` and anyone reading the experiment later)
and said on stderr when it happens (:func:`say`).
"""

from __future__ import annotations

import sys
import time
from typing import Iterable, Optional

__all__ = ["CHECKPOINT_PASSED_OVER", "JOURNAL_REBUILT", "PREVIOUS_STATE", "RESULTS_TAIL_CUT", "STARTED_OVER",
           "recovery", "say"]

#: The latest state generation was unreadable; the previous one was read.
PREVIOUS_STATE = "previous_state"
#: A journal segment of the state was damaged or missing: the state was rebuilt from the rest
#: and the trials' own files.
JOURNAL_REBUILT = "journal_rebuilt"
#: A trial's newest checkpoint did not match its marker; an older one is resumed from.
CHECKPOINT_PASSED_OVER = "checkpoint_passed_over"
#: No checkpoint of the trial was intact: it starts over from scratch.
STARTED_OVER = "started_over"
#: Lines at the end of a trial's result.json that are not rows were cut off.
RESULTS_TAIL_CUT = "results_tail_cut"


def recovery(what: str, message: str, trial_id: Optional[str] = None,
             reason: Optional[str] = None) -> dict:
    """One entry of ``ExperimentState.recoveries``: ``what`` (one of this module's names),
    ``message`` (a sentence that names the file, what was wrong and what was done instead),
    and for a trial, ``reason``: a few words on why, for the line that starts it again
    ("its folder was missing")."""
    entry = {"time": time.time(), "trial_id": trial_id, "what": what, "message": message}
    if reason:
        entry["reason"] = reason
    return entry


def say(entries: Iterable[dict]) -> None:
    """One line on stderr per entry: a fallback is never silent."""
    for entry in entries:
        print(f"ftnb: {entry['message']}", file=sys.stderr, flush=True)
