"""GroupFailures (ftnb/execution/group_failures.py): which rank of a group failed first, the one
policy that both executors running groups (local processes, Ray) keep. Pure: times are given."""

from __future__ import annotations

import pytest

from ftnb.execution.contract import RankExit
from ftnb.execution.group_failures import GroupFailures

SETTLE_S = 2.0
LIMIT_S = 30.0  # the collective timeout: how long a rank may be stopped before it is hung

# Steps: ("note", rank, peer, now) a rank's failure (peer: a peer's error); ("check", now,
# stopped) the executor's periodic look, ``stopped`` being ``(rank, since)`` for each rank found
# stopped. Each returns the cause it decides, else None. Expected: what each step returned, the
# cause at the end, and the rank taken as hung (None: none).
CASES = {
    "a failure of its own is the cause at once": (
        [("note", 1, False, 0.0)], [1], 1, None),
    "a later failure does not change the cause": (
        [("note", 1, False, 0.0), ("note", 0, False, 0.1), ("check", 9.0, [])],
        [1, None, None], 1, None),
    "a peer's error waits for the failure that caused it": (
        [("note", 0, True, 0.0), ("check", 1.0, []), ("note", 1, False, 1.5),
         ("check", 3.0, [])],
        [None, None, 1, None], 1, None),
    "a peer's error is the cause once the window passed, not before": (
        [("note", 0, True, 0.0), ("check", 1.99, []), ("check", 2.0, [])],
        [None, None, 0], 0, None),
    "the window opens at the first peer's error only": (
        [("note", 0, True, 0.0), ("note", 1, True, 1.5), ("check", 2.0, [])],
        [None, None, 0], 0, None),
    "the first peer's error seen is the cause, whatever its rank": (
        [("note", 1, True, 0.0), ("note", 0, True, 0.5), ("check", 2.5, [])],
        [None, None, 1], 1, None),
    "a rank stopped for the collective timeout hangs": (
        [("check", 10.0, [(1, 0.0)]), ("check", 29.9, [(1, 0.0)]), ("check", 30.0, [(1, 0.0)])],
        [None, None, 1], 1, 1),
    "of the stopped ranks, the first in rank order is timed and hangs": (
        [("check", 40.0, [(0, 20.0), (2, 5.0)]), ("check", 50.0, [(0, 20.0), (2, 5.0)])],
        [None, 0], 0, 0),
    "a stopped rank is the cause at once while a peer's error settles": (
        [("note", 0, True, 0.0), ("check", 0.5, [(1, 0.4)])], [None, 1], 1, 1),
    "a rank stopped before a peer's error is the cause at that error": (
        [("check", 1.0, [(1, 0.0)]), ("note", 0, True, 5.0), ("check", 5.1, [(1, 0.0)])],
        [None, None, 1], 1, 1),
    "a stopped rank does not replace a cause decided before": (
        [("note", 2, False, 0.0), ("check", 99.0, [(1, 0.0)])], [2, None], 2, None),
    "a failure after a hang does not change the cause": (
        [("check", 30.0, [(1, 0.0)]), ("note", 0, False, 30.1)], [1, None], 1, 1),
    "nothing failed, nothing decided": ([("check", 5.0, [])], [None], None, None),
}


@pytest.mark.parametrize("steps,returned,cause,hung", CASES.values(), ids=CASES.keys())
def test_the_first_failing_rank_is_decided_by_one_policy(steps, returned, cause, hung):
    failures = GroupFailures(settle_s=SETTLE_S)
    got = []
    for kind, *args in steps:
        if kind == "note":
            rank, peer, now = args
            got.append(failures.note(rank, peer, now))
        else:
            now, stopped = args
            got.append(failures.check(now, stopped, LIMIT_S))
    assert (got, failures.cause, failures.hung) == (returned, cause, hung)
    assert not failures.settling or cause is None


def test_without_a_stopped_limit_a_stopped_rank_hangs_only_while_a_peer_error_settles():
    """Ray's executor sees no stopped processes: check(now) alone is the settle window."""
    failures = GroupFailures(settle_s=SETTLE_S)
    assert failures.check(1e9, [(1, 0.0)]) is None
    failures.note(0, peer=True, now=1e9)
    assert failures.settling
    assert failures.check(1e9 + 2.0) == 0 and failures.hung is None


@pytest.mark.parametrize("notes,exits,expected", [
    ([], [(0, 0), (1, 1)], 1),
    ([], [(0, 0), (1, 0)], None),
    ([(1, True), (0, True)], [(0, 1), (1, 1)], 1),
    ([(1, True), (0, False)], [(0, 1), (1, 1)], 0),
], ids=["nothing seen: the first bad exit", "a clean exit: no cause",
        "only peers' errors: the first one seen", "the cause decided"])
def test_the_exit_event_names_a_cause_even_undecided(notes, exits, expected):
    """An attempt may end undecided (every rank exited within a peer error's settle window)."""
    failures = GroupFailures(settle_s=SETTLE_S)
    for rank, peer in notes:
        failures.note(rank, peer, now=0.0)
    assert failures.first_failing_rank([RankExit(rank, code) for rank, code in exits]) == expected
