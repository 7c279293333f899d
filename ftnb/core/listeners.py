"""What the controller tells a UI: :class:`ExperimentListener`, and :class:`NullListener`, the
do-nothing one to subclass.

Listeners are told what happened and never steer (a stop goes through the controller's
``stop`` / ``stop_trial`` or a control request). Every method is optional: the controller calls
only those a listener has.
"""

from __future__ import annotations

from typing import Protocol

from .records import ExperimentState, FailureRecord, TrialRecord

__all__ = ["ExperimentListener", "NullListener"]


class ExperimentListener(Protocol):
    """What a UI may be told. Every method is optional (see :class:`NullListener`)."""

    def on_experiment_start(self, state: ExperimentState) -> None: ...
    def on_trial_start(self, state: ExperimentState, trial: TrialRecord) -> None: ...
    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None: ...
    def on_trial_failure(
        self, state: ExperimentState, trial: TrialRecord, failure: FailureRecord
    ) -> None: ...
    def on_trial_complete(self, state: ExperimentState, trial: TrialRecord) -> None: ...
    def on_output(self, trial_id: str, stream: str, text: str) -> None: ...
    def on_tick(self, state: ExperimentState) -> None: ...
    def on_experiment_end(self, state: ExperimentState) -> None: ...


class NullListener:
    """The do-nothing listener; subclass it and override what you need."""

    def on_experiment_start(self, state: ExperimentState) -> None:
        """The loop starts (after a restore brought the records up to date)."""

    def on_trial_start(self, state: ExperimentState, trial: TrialRecord) -> None:
        """An attempt of ``trial`` was handed to the executor."""

    def on_result(self, state: ExperimentState, trial: TrialRecord, row: dict) -> None:
        """``trial`` reported ``row`` (stored before this is called)."""

    def on_trial_failure(
        self, state: ExperimentState, trial: TrialRecord, failure: FailureRecord
    ) -> None:
        """An attempt of ``trial`` failed (``failure`` is recorded)."""

    def on_trial_complete(self, state: ExperimentState, trial: TrialRecord) -> None:
        """``trial`` ended (TERMINATED, ERRORED, or PAUSED by a stopping experiment)."""

    def on_output(self, trial_id: str, stream: str, text: str) -> None:
        """A trial printed ``text`` on ``stream`` (with ``RunConfig(verbose>=1)``)."""

    def on_tick(self, state: ExperimentState) -> None:
        """One turn of the loop (about ten a second)."""

    def on_experiment_end(self, state: ExperimentState) -> None:
        """The experiment ended; its final state is saved."""
