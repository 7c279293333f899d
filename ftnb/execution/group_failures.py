"""Which rank of a group attempt failed first: the one record of it that every executor running
groups keeps (:class:`GroupFailures`), and the rule that names the cause in the exit event
(:func:`first_failing_rank`). The contract's Groups rule (:mod:`ftnb.execution.contract`) says
what executors promise; this is how ftnb's own keep the promise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from .contract import RankExit

__all__ = ["PEER_ERROR_SETTLE_S", "GroupFailures", "first_failing_rank"]


def first_failing_rank(decided: Optional[int], failures: Sequence[tuple[int, bool]],
                       exits: Sequence[RankExit]) -> Optional[int]:
    """A group's cause (:attr:`~ftnb.execution.contract.ExitEvent.first_failing_rank`): the
    rank the executor decided on, else the first rank seen failing on its own (``failures``
    are ``(rank, peer)`` in the order seen), else the first seen at all, else the first that
    exited badly."""
    if decided is not None:
        return decided
    if failures:
        own = [rank for rank, peer in failures if not peer]
        return (own or [failures[0][0]])[0]
    return next((e.rank for e in exits if e.failed), None)


#: After a rank fails with a peer's error (a reset connection, a collective's timeout), how long
#: a group waits for the failure that caused it (a rank killed, one that raised) before it takes
#: the peer error as the cause.
PEER_ERROR_SETTLE_S = 2.0


@dataclass
class GroupFailures:
    """The failures seen in one group attempt, in order, and the cause decided from them: the
    one record of "which rank failed first" that every executor running groups keeps.

    A rank's failure of its own (it raised, was killed, exited badly) is the cause at once; a
    peer's error (:func:`~ftnb.execution.contract.is_peer_error`: the collectives' reaction to
    another rank's failure) opens a settle window of ``settle_s`` for that failure to show up,
    after which the first rank seen failing is the cause. A rank found stopped (SIGSTOP, a
    frozen machine) is why its peers time out: it is the cause (:attr:`hung`) once stopped for
    the collective timeout, or at once while a peer's error waits (:meth:`check`). The
    executor acts on the decision (it ends the other ranks) and names it in the exit event
    (:meth:`first_failing_rank`). Times are ``time.monotonic()``.

    >>> group = GroupFailures()
    >>> group.note(1, peer=True, now=0.0), group.settled(now=1.0)  # rank 1's peer error waits
    (None, None)
    >>> group.note(0, peer=False, now=1.5)  # rank 0 was killed: the cause
    0
    """

    settle_s: float = PEER_ERROR_SETTLE_S
    #: ``(rank, peer)`` for each failure, in the order seen.
    failures: list[tuple[int, bool]] = field(default_factory=list)
    #: The first failing rank, once decided.
    cause: Optional[int] = None
    #: When the settle window of a peer's error ends (None: none is open).
    settle_until: Optional[float] = None
    #: The cause when it is a rank found stopped (it hung), else None.
    hung: Optional[int] = None

    def note(self, rank: int, peer: bool, now: float) -> Optional[int]:
        """Rank ``rank`` failed (``peer``: with a peer's error). Returns the cause when this
        failure decides it (a failure of the rank's own, none decided before), else None."""
        self.failures.append((rank, peer))
        if self.cause is not None:
            return None
        if not peer:
            self.cause = rank
            return rank
        if self.settle_until is None:
            self.settle_until = now + self.settle_s
        return None

    @property
    def settling(self) -> bool:
        """A peer's error waits for its cause: no cause decided yet, the window open."""
        return self.cause is None and self.settle_until is not None

    def settled(self, now: float) -> Optional[int]:
        """Decide on the first rank seen failing once the settle window has passed with no
        failure of a rank's own; returns the cause so decided (None: not now)."""
        if self.settling and now >= self.settle_until:  # type: ignore[operator]
            self.cause = self.failures[0][0]
            return self.cause
        return None

    def check(self, now: float, stopped: Sequence[tuple[int, float]] = (),
              stopped_limit_s: float = float("inf")) -> Optional[int]:
        """The executor's periodic look at a running group; returns the cause it decides now
        (None: not now). ``stopped``: ``(rank, since)`` for each rank found stopped, in rank
        order; the first is the cause (and :attr:`hung`) once stopped for ``stopped_limit_s``
        or while a peer's error settles. Otherwise :meth:`settled` decides."""
        if self.cause is not None:
            return None
        if stopped:
            rank, since = stopped[0]
            if self.settling or now - since >= stopped_limit_s:
                self.cause = self.hung = rank
                return rank
            return None
        return self.settled(now)

    def first_failing_rank(self, exits: Sequence[RankExit]) -> Optional[int]:
        """The cause to name in the exit event (:func:`first_failing_rank`)."""
        return first_failing_rank(self.cause, self.failures, exits)
