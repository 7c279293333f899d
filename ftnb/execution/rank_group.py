"""The ranks of a group attempt, from inside one of them: rendezvous, and reports in step.

An attempt of ``num_workers > 1`` ranks (a :class:`~ftnb.TorchTrainer` run) is a group that
starts, fails and stops as one unit. Each attempt gets a fresh rendezvous store (a
``torch.distributed.TCPStore`` served by rank 0 on a port the kernel picks, its address handed
to the other ranks by the executor), so a restarted group never meets a stale store of the
group before it. The same store carries ftnb's own agreement between ranks:

* every rank calls ``report()``; rank 0 persists the row (and checkpoint), then publishes the
  iteration's decision (go on, or end: stop criterion met, stop requested, preempted); the other
  ranks wait for it, so a report returns on every rank once it is persisted and every rank ends
  at the same iteration;
* at the end, rank 0 waits for the others to finish before it takes the store down with it.

Threads: a ``TCPStore`` client is not safe for two threads at once: each call holds the
client's lock to its end, a ``wait`` until its keys come. The training thread waits for the
other ranks (``decision``, ``exchange``) while the upload thread of asynchronous checkpoints says
or waits for the ranks' files (``shard_written``, ``shards_written``); on one client each would
hold up the ``set`` the other's peer waits for, and the group would deadlock. So the thread that
joined uses ``store``, any other thread gets a client of its own on first use, connected to the
same server (:meth:`RankGroup._client`), and so does torch's process group, whose own threads
(NCCL's monitor) use its client (:meth:`RankGroup.new_client`); the report path pays nothing
for it.

The process group of ``torch.distributed`` (gloo or NCCL) is built on the same store, with a
client and under a prefix of its own (see :mod:`ftnb.train.torch_trainer`). Only torch's store
is used here: no collective, so it works the same under any backend.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["RankGroup", "RankPlace", "rank_environment"]

#: How long a rank waits for rank 0's decision on a report: rank 0 may be persisting a large
#: checkpoint to an object store. A rank 0 that dies takes the store with it, which ends the
#: wait at once; one that hangs is found by the executor's liveness check.
_DECISION_WAIT = datetime.timedelta(days=1)
_PREFIX = "ftnb/"


@dataclass(frozen=True)
class RankPlace:
    """Where a rank is in its group: ``rank`` (world rank), ``world_size``, ``local_rank`` and
    ``local_world_size`` (on its node), ``node_rank``."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int = 0


def rank_environment(place: RankPlace, master_addr: str) -> dict[str, str]:
    """The variables torchrun sets, which libraries read (``MASTER_PORT`` is added once rank 0
    has its store's port)."""
    return {
        "RANK": str(place.rank),
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank),
        "LOCAL_WORLD_SIZE": str(place.local_world_size),
        "NODE_RANK": str(place.node_rank),
        "GROUP_RANK": str(place.node_rank),
        "MASTER_ADDR": master_addr,
    }


class RankGroup:
    """One rank's membership of a group attempt (see the module docstring)."""

    def __init__(self, place: RankPlace, store: Any, timeout_s: float,
                 connect: Callable[[], Any]) -> None:
        self.place = place
        #: The client of the thread that joined (see the module docstring, "Threads").
        self.store = store
        self.timeout_s = timeout_s
        self._connect = connect
        self._owner = threading.get_ident()
        self._clients = threading.local()

    def new_client(self) -> Any:
        """A new client of the group's store, for a user of its own (another thread, torch's
        process group): see the module docstring, "Threads"."""
        return self._connect()

    def _client(self) -> Any:
        """The calling thread's client of the group's store: ``store`` in the thread that
        joined, a client of its own (made on first use) in any other."""
        if threading.get_ident() == self._owner:
            return self.store
        client = getattr(self._clients, "store", None)
        if client is None:
            client = self._clients.store = self.new_client()
        return client

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def world_size(self) -> int:
        return self.place.world_size

    @classmethod
    def join(cls, place: RankPlace, rendezvous: Callable[[Optional[int]], tuple[str, int]],
             timeout_s: float) -> "RankGroup":
        """Join the group: rank 0 serves a fresh store and hands its port to ``rendezvous``
        (which tells the executor); the other ranks get the address from ``rendezvous(None)``
        and connect. Sets ``MASTER_ADDR`` and ``MASTER_PORT`` in this process's environment."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        if place.rank == 0:
            # Served on every interface; MASTER_ADDR (the executor's) is how peers reach it.
            host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
            store = dist.TCPStore(host, 0, place.world_size, True, timeout=timeout,
                                  wait_for_workers=False)
            addr, port = rendezvous(store.port)
        else:
            addr, port = rendezvous(None)
            store = dist.TCPStore(addr, port, place.world_size, False, timeout=timeout)
        os.environ["MASTER_ADDR"] = addr
        os.environ["MASTER_PORT"] = str(port)

        def connect() -> Any:  # not counted among the workers the server waits for
            return dist.TCPStore(addr, port, place.world_size, False, timeout=timeout,
                                 wait_for_workers=False)

        return cls(place, store, timeout_s, connect)

    # -- reports in step -------------------------------------------------------------------------
    def publish(self, iteration: int, end: Optional[str]) -> None:
        """Rank 0: the report of ``iteration`` is persisted; ``end`` names how the attempt ends
        there (None: it goes on)."""
        self._client().set(f"{_PREFIX}report/{iteration}", json.dumps({"end": end}))

    def decision(self, iteration: int) -> Optional[str]:
        """Any other rank: wait for rank 0 to persist the report of ``iteration``; how the
        attempt ends there (None: it goes on)."""
        key = f"{_PREFIX}report/{iteration}"
        store = self._client()
        store.wait([key], _DECISION_WAIT)
        return json.loads(store.get(key)).get("end")

    # -- checkpoints of several ranks (merged into one folder) -----------------------------------
    def exchange(self, iteration: int, info: Optional[dict]) -> list[Optional[dict]]:
        """Every rank: publish what this rank reports with the report of ``iteration`` (its
        checkpoint's files and name, None without one) and return every rank's, by rank."""
        store = self._client()
        store.set(f"{_PREFIX}ckpt/{iteration}/{self.rank}", json.dumps(info))
        keys = [f"{_PREFIX}ckpt/{iteration}/{r}" for r in range(self.world_size)]
        store.wait(keys, _DECISION_WAIT)
        return [json.loads(store.get(key)) for key in keys]

    def shard_written(self, iteration: int, error: Optional[str]) -> None:
        """This rank's files of the checkpoint of ``iteration`` are in storage (or ``error``)."""
        self._client().set(f"{_PREFIX}shard/{iteration}/{self.rank}",
                           json.dumps({"error": error}))

    def shards_written(self, iteration: int, ranks: list[int]) -> list[str]:
        """Rank 0: wait until ``ranks`` wrote their files of that checkpoint; their errors."""
        keys = [f"{_PREFIX}shard/{iteration}/{r}" for r in ranks]
        store = self._client()
        if keys:
            store.wait(keys, _DECISION_WAIT)
        errors = [json.loads(store.get(key)).get("error") for key in keys]
        return [f"rank {r}: {e}" for r, e in zip(ranks, errors) if e]

    # -- the end -------------------------------------------------------------------------------
    def finish(self) -> None:
        """This rank's trainable returned. Rank 0 serves the store, so it waits (up to the
        collective timeout) for the others to be done with it before it leaves."""
        try:
            store = self._client()
            done = store.add(f"{_PREFIX}done", 1)
            if self.place.rank != 0:
                return
            deadline = time.monotonic() + self.timeout_s
            while done < self.place.world_size and time.monotonic() < deadline:
                time.sleep(0.01)
                done = store.add(f"{_PREFIX}done", 0)
        except Exception:  # a peer failed: the executor ends the group, nothing to wait for
            pass
