"""The attempt-level fence (ftnb.execution.attempt.AttemptGuard): once the trial's record
names a later attempt, an earlier attempt that still runs (a ghost on a node taken for lost)
writes nothing more, whatever its driver's lease says."""

from __future__ import annotations

import json

import pytest

import ftnb
from ftnb.execution.attempt import AttemptGuard, run_attempt
from ftnb.execution.contract import AttemptSpec, DoneEvent, ResultEvent
from ftnb.storage import ExperimentPaths, Storage
from ftnb.storage.lease import FencedError


class Channel:
    def __init__(self) -> None:
        self.events: list = []

    def send(self, event) -> None:
        self.events.append(event)

    def stop_requested(self) -> bool:
        return False


def _record(paths, attempts: int) -> None:
    paths.storage.write_atomic(paths.record, json.dumps(
        {"attempts": [{"number": n} for n in range(1, attempts + 1)]}))


@pytest.fixture
def trial(tmp_path):
    experiment = ExperimentPaths.of(Storage(str(tmp_path / "runs")), "exp")
    paths = experiment.trial("t0")
    experiment.storage.makedirs(paths.dir)
    return experiment, paths


def test_the_guard_passes_its_own_attempt_and_stops_an_earlier_one(trial):
    _, paths = trial
    _record(paths, 1)
    guard = AttemptGuard(paths, 1)
    guard.check()
    _record(paths, 2)  # the controller started attempt 2
    with pytest.raises(FencedError, match="attempt 1 was replaced by attempt 2"):
        guard.check()
    AttemptGuard(paths, 2).check()


def test_a_ghost_attempt_ends_fenced_and_writes_no_row(trial):
    experiment, paths = trial
    _record(paths, 1)

    def train(config):
        for i in range(10):
            if i == 3:
                _record(paths, 2)  # its replacement starts while it runs
            ftnb.report({"i": i})

    spec = AttemptSpec(trial_id="t0", attempt=1, trainable=train, config={},
                       storage=experiment.storage, experiment_dir=experiment.dir,
                       experiment_name="exp", trial_dir_name="t0")
    channel = Channel()
    assert run_attempt(spec, channel, this_thread_only=True,
                       guard=AttemptGuard(paths, 1)) == 0
    results = [e for e in channel.events if isinstance(e, ResultEvent)]
    assert [e.row["i"] for e in results] == [0, 1, 2]
    assert [r["i"] for r in paths.read_results()] == [0, 1, 2]
    (done,) = [e for e in channel.events if isinstance(e, DoneEvent)]
    assert done.outcome == "fenced"
