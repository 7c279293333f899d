"""ftnb.core.resizing as tables: the size an elastic group's attempt starts with (what fits of a
real resource pool, between min and its target) and the reason each re-form is recorded with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ftnb.core.records import AttemptRecord, TrialRecord
from ftnb.core.resizing import GroupResizing
from ftnb.execution.one_machine import OneMachineExecutor
from ftnb.execution.resources import ResourcePool, TrialResources

ONE_CPU = TrialResources(cpu=1.0)


class _Machine(OneMachineExecutor):
    """The resource half of the local executor, over a pool of ``cpus``."""

    runs_groups = True

    def running(self):
        return []


def _resizing(cpus, held, min_workers=2, max_workers=4):
    machine = _Machine(ResourcePool(cpus, []))
    if held:
        assert machine._pool.try_acquire_group(ONE_CPU, held) is not None
    controller = SimpleNamespace(executor=machine, dirty=False, stopping=None, trainable=None,
                                 configs={})
    return GroupResizing(controller, min_workers, max_workers, 60.0)


@pytest.mark.parametrize("cpus, held, target, expected", [
    (8, 0, None, 4),     # room for max: max
    (8, 5, None, 3),     # 3 free: 3
    (8, 6, None, 2),     # only min fits: min
    (8, 7, None, None),  # fewer than min fit: it waits
    (3, 0, None, 3),     # max never fits this machine: the most that does
    (8, 0, 3, 3),        # after a lost rank: the survivors, though more would fit
    (8, 6, 3, 2),        # the survivors do not all fit: what does, down to min
])
def test_the_size_an_attempt_starts_with(cpus, held, target, expected):
    resizing = _resizing(cpus, held)
    trial = TrialRecord("t", "t", {})
    if target is not None:
        resizing._targets["t"] = (target, "rank lost")
    assert resizing.size_to_start(trial, ONE_CPU) == expected
    assert (trial.note is not None) == (expected is None)  # a waiting trial says why


def test_a_fixed_group_waits_for_its_size():
    resizing = _resizing(8, 6, min_workers=3, max_workers=3)
    assert resizing.size_to_start(TrialRecord("t", "t", {}), ONE_CPU) is None
    resizing = _resizing(8, 5, min_workers=3, max_workers=3)
    assert resizing.size_to_start(TrialRecord("t", "t", {}), ONE_CPU) == 3


@pytest.mark.parametrize("sizes, target, reason", [
    ([2], None, "capacity at start"),
    ([4, 3], (3, "rank lost"), "rank lost"),
    ([4, 2], (3, "rank lost"), "rank lost; fewer fit"),
    ([3, 4], None, "capacity returned"),
    ([4, 3], None, "fewer fit"),
    ([4, 4], None, None),  # the same size: no entry
    ([4], None, None),
])
def test_the_reason_a_re_form_is_recorded_with(sizes, target, reason):
    resizing = _resizing(8, 0)
    trial = TrialRecord("t", "t", {})
    trial.attempts = [AttemptRecord(number=i + 1, started=0.0, num_workers=n)
                      for i, n in enumerate(sizes)]
    if target is not None:
        resizing._targets["t"] = target
    resizing.started(trial, sizes[-1])
    if reason is None:
        assert trial.resizes == []
    else:
        (entry,) = trial.resizes
        old = sizes[-2] if len(sizes) > 1 else 4
        assert (entry["reason"], entry["old_size"], entry["new_size"], entry["mode"]) == (
            reason, old, sizes[-1], "cold")
        assert entry["attempt"] == len(sizes)
