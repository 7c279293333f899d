"""The terminal reporter: a listener that prints the live status table and trial output."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from ..core.controller import NullListener
from ..core.records import (
    FINISHED_STATUSES,
    AttemptOutcome,
    ExperimentState,
    FailureRecord,
    TrialRecord,
    TrialStatus,
)
from .failures import cause_line, collateral_lines, is_group_failure, restart_text
from .view import ExperimentView, plural, render_table

__all__ = ["TerminalReporter"]


class TerminalReporter(NullListener):
    """Prints the status table every ``interval_s`` seconds while something changed, each
    failure as it happens, the trials' output prefixed with their id, and a final table.

    verbose=1: table, failures and output; verbose=2: also one line per result.

    A group attempt's failure also says which rank failed first (the cause) and how the others
    ended, and once the group is back (its first report) how long the restart took.
    """

    def __init__(
        self,
        verbose: int = 1,
        interval_s: float = 2.0,
        stream: Optional[TextIO] = None,
        path: str = "",
        resume_announced: bool = False,
    ) -> None:
        self.verbose = verbose
        #: Whether the run's caller already said it resumes the experiment (``ftnb.run``,
        #: ``ftnb run``/``resume``, ``%ftrun``: :func:`ftnb.ui.resume_lines.resuming_line`),
        #: so a restore's start says nothing more.
        self.resume_announced = resume_announced
        self.interval_s = interval_s
        self.stream = stream
        self.path = path
        self._last_print = 0.0
        self._changed = True
        self._recoveries_said: set[tuple[str, int]] = set()  # (trial_id, attempt failed)

    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    def _print(self, text: str) -> None:
        out = self._out()
        out.write(text if text.endswith("\n") else text + "\n")
        out.flush()

    def _table(self, state: ExperimentState) -> str:
        return render_table(ExperimentView.from_state(state, self.path))

    def on_experiment_start(self, state: ExperimentState) -> None:
        if not self.verbose:
            return
        if len(state.driver_sessions) > 1:  # a restore: the same experiment goes on
            if self.resume_announced:
                return
            done = sum(t.status in FINISHED_STATUSES for t in state.trials)
            self._print(
                f"ftnb: resuming experiment {state.name} ({plural(len(state.trials), 'trial')}: "
                f"{done} done, {len(state.trials) - done} to run) -> {self.path}"
            )
            return
        self._print(
            f"ftnb: experiment {state.name} with {plural(len(state.trials), 'trial')} -> "
            f"{self.path}"
        )

    def on_trial_start(self, state: ExperimentState, trial: TrialRecord) -> None:
        self._changed = True
        if self.verbose and len(trial.attempts) > 1:
            latest = trial.latest_checkpoint
            before = trial.attempts[-2]
            if latest:
                where = f"from {latest['dir_name']} (iter {latest['iteration']})"
            else:
                why = _why_from_scratch(state, trial, before.started)
                where = f"from scratch ({why})" if why else "from scratch"
            # After a pause (a scheduler's, or a stopped or interrupted experiment's) it
            # resumes; else it is a restart after a failure.
            verb = "resuming" if before.outcome in (AttemptOutcome.STOPPED,
                                                    AttemptOutcome.INTERRUPTED) else "restarting"
            self._print(f"ftnb: {verb} trial {trial.trial_id} (attempt {len(trial.attempts)}) {where}")

    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None:
        self._changed = True
        if self.verbose:
            self._say_recovery(trial)
        if self.verbose >= 2:
            shown = {k: v for k, v in row.items() if k not in ("trial_id", "timestamp")}
            self._print(f"ftnb: {trial.trial_id} result {shown}")

    def on_trial_failure(
        self, state: ExperimentState, trial: TrialRecord, failure: FailureRecord
    ) -> None:
        self._changed = True
        if self.verbose:
            lines = [f"ftnb: trial {trial.trial_id} {failure.summary()}"]
            if is_group_failure(failure):
                # Its restart is said once it happened (on_result): the trial may not restart.
                lines += [f"  {line}" for line in (cause_line(failure), *collateral_lines(failure))]
            self._print("\n".join(lines))

    def _say_recovery(self, trial: TrialRecord) -> None:
        """A group trial's first report after a failure: how long the restart took."""
        if not trial.failures:
            return
        failure = trial.failures[-1]
        key = (trial.trial_id, failure.attempt)
        if not is_group_failure(failure) or failure.recovered_s is None \
                or key in self._recoveries_said:
            return
        self._recoveries_said.add(key)
        attempt = trial.attempts[-1].number if trial.attempts else failure.attempt + 1
        self._print(f"ftnb: trial {trial.trial_id} {restart_text(failure, trial)} "
                    f"(attempt {attempt})")

    def on_trial_complete(self, state: ExperimentState, trial: TrialRecord) -> None:
        self._changed = True
        if self.verbose and trial.status == TrialStatus.ERRORED and trial.error:
            self._print(f"ftnb: trial {trial.trial_id} ERRORED: {trial.error.get('reason')}")

    def on_output(self, trial_id: str, stream: str, text: str) -> None:
        if not self.verbose:
            return
        prefix = f"({trial_id}) " if stream == "stdout" else f"({trial_id} stderr) "
        self._print("".join(prefix + line for line in text.splitlines(keepends=True)))

    def on_tick(self, state: ExperimentState) -> None:
        now = time.time()
        if self.verbose and self._changed and now - self._last_print >= self.interval_s:
            self._last_print = now
            self._changed = False
            self._print(self._table(state))

    def on_experiment_end(self, state: ExperimentState) -> None:
        if self.verbose:
            self._print(self._table(state))


def _why_from_scratch(state: ExperimentState, trial: TrialRecord, since: float) -> str:
    """Why ``trial`` starts again from scratch: what the restore fell back to for it after
    ``since`` (its folder was missing, no checkpoint intact), or that it saved no checkpoint
    though it reported; "" when it had nothing to resume from (it never reported)."""
    for entry in reversed(state.recoveries):
        if entry.get("trial_id") == trial.trial_id and entry.get("reason") \
                and entry.get("time", 0.0) >= since:
            return entry["reason"]
    return "it saved no checkpoint" if trial.iteration else ""
