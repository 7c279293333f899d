"""What the executors that run on this machine share: its resource pool, and attempts of one
worker. The local process executor and the in-process executor both derive from
:class:`OneMachineExecutor`, so they say the same about what fits and allocate the same way."""

from __future__ import annotations

from typing import Optional

from .contract import AttemptSpec, Capacity, NoRoomError, group_refused
from .machine import pool_of_this_machine
from .resources import Allocation, ResourcePool, TrialResources, check_fits

__all__ = ["OneMachineExecutor"]


class OneMachineExecutor:
    """The resource half of the :class:`~ftnb.execution.contract.Executor` protocol for one
    machine's :class:`ResourcePool` (by default, this machine's); subclasses set ``name`` and
    run the attempts."""

    name = "one-machine"

    def __init__(self, pool: Optional[ResourcePool] = None) -> None:
        self._pool = pool if pool is not None else pool_of_this_machine()

    def capacity(self) -> Capacity:
        return Capacity(self._pool.cpus, self._pool.gpu_ids)

    def check_fits(self, resources: TrialResources, num_workers: int = 1) -> None:
        if num_workers != 1:
            raise group_refused(self.name, num_workers)
        check_fits(resources, self._pool)

    def has_room(self, resources: TrialResources, num_workers: int = 1) -> bool:
        self.check_fits(resources, num_workers)
        return self._pool.fits_now(resources)

    def _allocate(self, spec: AttemptSpec) -> Allocation:
        """Take ``spec``'s resources from the pool, or raise :class:`NoRoomError`."""
        allocation = self._pool.try_acquire(spec.resources)
        if allocation is None:
            raise NoRoomError(
                f"no room for trial {spec.trial_id!r} ({spec.resources.as_dict()}) now: "
                f"{self._pool!r}"
            )
        return allocation
