"""What the executors that run on this machine share: its resource pool, and attempts of one
worker. The local process executor and the in-process executor both derive from
:class:`OneMachineExecutor`, so they say the same about what fits and allocate the same way."""

from __future__ import annotations

from typing import Optional

from .contract import AttemptSpec, Capacity, NoRoomError, group_refused
from .machine import pool_of_this_machine
from .resources import Allocation, ResourcePool, TrialResources, check_fits, check_group_fits

__all__ = ["OneMachineExecutor"]


class OneMachineExecutor:
    """The resource half of the :class:`~ftnb.execution.contract.Executor` protocol for one
    machine's :class:`ResourcePool` (by default, this machine's); subclasses set ``name`` and
    run the attempts."""

    name = "one-machine"
    #: Whether it runs group attempts (``num_workers > 1``): each rank gets its own allocation.
    runs_groups = False

    def __init__(self, pool: Optional[ResourcePool] = None) -> None:
        self._pool = pool if pool is not None else pool_of_this_machine()
        self._closed = False  # set by shutdown(): nothing more starts

    def running(self) -> list[str]:  # pragma: no cover - every subclass says
        raise NotImplementedError

    def capacity(self) -> Capacity:
        return Capacity(self._pool.cpus, self._pool.gpu_ids)

    def check_fits(self, resources: TrialResources, num_workers: int = 1) -> None:
        if num_workers == 1:
            check_fits(resources, self._pool)
        elif not self.runs_groups or isinstance(num_workers, bool) \
                or not isinstance(num_workers, int) or num_workers < 1:
            raise group_refused(self.name, num_workers)
        else:
            check_group_fits(resources, num_workers, self._pool)

    def check_storage(self, storage: object) -> None:
        """Any storage: its attempts run on this machine, which the caller checks can write."""

    def has_room(self, resources: TrialResources, num_workers: int = 1) -> bool:
        self.check_fits(resources, num_workers)
        return self._pool.fits_now_group(resources, num_workers)

    def _admit(self, spec: AttemptSpec) -> tuple[bytes, list[Allocation]]:
        """The checks every start makes (not shut down, fits, no attempt of that trial running
        here), then ``spec`` pickled to travel and its resources taken from the pool, one
        allocation per rank (or :class:`NoRoomError`). The caller releases them if it cannot
        start."""
        from ..objects.cell_source import carry_cell_source, dumps

        if self._closed:
            raise RuntimeError("this executor was shut down: it starts nothing more")
        self.check_fits(spec.resources, spec.num_workers)
        if spec.trial_id in self.running():
            raise ValueError(f"trial {spec.trial_id!r} already has a running attempt here")
        carry_cell_source(spec.trainable)  # a notebook trainable's traceback shows its lines
        payload = dumps(spec)
        return payload, self._allocate(spec)

    def _allocate(self, spec: AttemptSpec) -> list[Allocation]:
        """Take ``spec``'s resources (for each rank) from the pool, or raise
        :class:`NoRoomError`."""
        allocation = self._pool.try_acquire_group(spec.resources, spec.num_workers)
        if allocation is None:
            raise NoRoomError(
                f"no room for trial {spec.trial_id!r} ({spec.resources.as_dict()}) now: "
                f"{self._pool!r}"
            )
        return allocation
