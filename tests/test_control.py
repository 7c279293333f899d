"""Control requests are addressed to a driver by its lease epoch: a driver acts on its own,
drops those meant for earlier drivers, and leaves those of a newer one; the senders' clocks do
not matter."""

from __future__ import annotations

import json
import os
import time

import pytest

from ftnb.storage.control import STOP_EXPERIMENT, STOP_TRIAL, ControlInbox, send_request
from ftnb.storage.lease import Lease
from ftnb.storage import ExperimentPaths, Storage


@pytest.fixture
def paths(tmp_path):
    paths = ExperimentPaths.of(Storage(str(tmp_path)), "exp")
    paths.storage.makedirs(paths.dir)
    return paths


def _files(paths):
    return sorted(os.listdir(paths.control))


def test_a_driver_acts_on_its_epoch_only(paths):
    first = Lease.acquire(paths)
    early = send_request(paths, STOP_TRIAL, "t1")  # addressed to the current owner: epoch 1
    assert json.loads(open(os.path.join(paths.control, early.id + ".json")).read())["epoch"] == 1
    first.release()
    second = Lease.acquire(paths)
    assert second.info.epoch == 2
    inbox = ControlInbox(paths, epoch=second.info.epoch, interval_s=0)
    mine = send_request(paths, STOP_EXPERIMENT)  # the current lease: epoch 2
    newer = send_request(paths, STOP_TRIAL, "t2", epoch=3)
    assert [r.id for r in inbox.take()] == [mine.id]
    # The old one is gone unheeded; the newer driver's is left for it.
    assert _files(paths) == [newer.id + ".json"]
    assert inbox.take() == []
    assert ControlInbox(paths, epoch=3, interval_s=0).take()[0].trial_id == "t2"
    assert _files(paths) == []
    second.release()


def test_the_senders_clock_does_not_matter(paths):
    lease = Lease.acquire(paths)
    inbox = ControlInbox(paths, epoch=lease.info.epoch, interval_s=0)
    # From a machine whose clock is a day behind the driver's: it still counts.
    behind = time.time_ns() - 86_400 * 10**9
    os.makedirs(paths.control, exist_ok=True)
    with open(os.path.join(paths.control, f"{behind:020d}-skewed.json"), "w") as f:
        json.dump({"action": STOP_TRIAL, "trial_id": "t1", "epoch": lease.info.epoch}, f)
    assert [(r.action, r.trial_id) for r in inbox.take()] == [(STOP_TRIAL, "t1")]
    lease.release()


def test_requests_without_an_owner_or_unreadable_are_dropped(paths):
    nobody = send_request(paths, STOP_EXPERIMENT)  # no owner.json: epoch 0
    assert json.loads(open(os.path.join(paths.control, nobody.id + ".json")).read())["epoch"] == 0
    with open(os.path.join(paths.control, "00000000000000000001-bad.json"), "w") as f:
        f.write("{not json")
    with open(os.path.join(paths.control, "00000000000000000002-old.json"), "w") as f:
        json.dump({"action": "stop"}, f)  # no epoch: written by an ftnb before epochs
    lease = Lease.acquire(paths)
    assert ControlInbox(paths, epoch=lease.info.epoch, interval_s=0).take() == []
    assert _files(paths) == []
    lease.release()


def test_bad_requests_are_refused_before_anything_is_written(paths):
    with pytest.raises(ValueError, match="control action 'pause'"):
        send_request(paths, "pause")
    with pytest.raises(ValueError, match="needs the trial_id"):
        send_request(paths, STOP_TRIAL)
    assert not os.path.exists(paths.control)
