"""A class Trainable's result shown to the driver's callbacks before it is persisted, so that
one of them may ask for a checkpoint with it (Ray Tune's ``result[SHOULD_CHECKPOINT] = True`` in
``Callback.on_trial_result``, :data:`ftnb.result.SHOULD_CHECKPOINT`).

Why before: a checkpoint belongs to the report it is persisted with (its row names it, and a
restore resumes from it at that row's iteration), so the trial must know whether to save one
before it writes the row. The trial sends the row it is about to report, marked
:data:`CHECKPOINT_QUERY`, as a report that waits for a decision; the controller shows it to the
callbacks (``on_result_preview``: their ``on_trial_result`` runs on it, once; the persisted row
that follows is not delivered to them again) and answers ``checkpoint`` or ``continue`` at
once. Nothing is stored for it: a driver that dies meanwhile answers nothing, the trial's
report then meets the new owner's fence as any report does.

A class trainable with ``checkpoint_at_end`` whose reports a driver-side stopper decides (and no
scheduler) asks too, marked :data:`AT_END`: the stopper sees the row here, once (its verdict is
kept for the persisted row: :class:`ftnb.stopper.DriverStopping`), and when it ends the trial
there the answer is ``checkpoint``, so the last report carries the final checkpoint, as Ray Tune
saves one at every STOP decision.

Only runs whose callbacks can set the key (a user's ``on_trial_result``) and class trainables
pay for it: one round trip to the driver per ``step()``, as every step of a Ray Trainable is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..execution.contract import ResultEvent
    from .controller import Controller
    from .records import TrialRecord

__all__ = ["AT_END", "CHECKPOINT_QUERY", "SHOULD_CHECKPOINT", "STOPS_HERE",
           "answer_checkpoint_query"]

#: Marks a result event as a class trainable's question (its row is not persisted yet).
CHECKPOINT_QUERY = "__ftnb_checkpoint_query__"

#: The query's value when the trial checkpoints at its end (``checkpoint_at_end``).
AT_END = "at_end"

#: Set in a previewed row by a driver-side stopper that ends the trial with it.
STOPS_HERE = "__ftnb_stops_here__"

#: Ray Tune's key (``ray.tune.result.SHOULD_CHECKPOINT``, ftnb.result's too).
SHOULD_CHECKPOINT = "should_checkpoint"

#: The answer that makes the trial checkpoint with the result it asked about.
CHECKPOINT = "checkpoint"


def answer_checkpoint_query(controller: "Controller", trial: "TrialRecord",
                            event: "ResultEvent") -> None:
    """Show the row the trial is about to report to the callbacks and answer whether one of
    them asked for a checkpoint with it."""
    at_end = event.row.get(CHECKPOINT_QUERY) == AT_END
    row = {k: v for k, v in event.row.items() if k != CHECKPOINT_QUERY}
    controller.emit("on_result_preview", controller.state, trial, row)
    wanted = row.get(SHOULD_CHECKPOINT) or (at_end and row.get(STOPS_HERE))
    answer = CHECKPOINT if wanted else "continue"
    controller.executor.decide(trial.trial_id, int(row.get("training_iteration") or 0), answer)
