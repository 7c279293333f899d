"""``ScalingConfig``: how many ranks a data-parallel run has (a fixed number, an elastic
``(min, max)`` range, or 0 for local mode) and what each one gets, with Ray Train's names.

It lives here, beside the trainer that reads it; :mod:`ftnb.config` re-exports it with the other
configuration objects (``ftnb.ScalingConfig``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

__all__ = ["DEFAULT_COLLECTIVE_TIMEOUT_S", "SEARCHABLE_FIELDS", "ScalingConfig", "is_real_number"]

#: The fields of a ScalingConfig that a Tuner's ``param_space`` may search (Ray Tune's
#: ``{"scaling_config": ScalingConfig(num_workers=tune.grid_search([1, 2]))}``): what each
#: trial's group is made of. The others hold for the whole experiment.
SEARCHABLE_FIELDS = ("num_workers", "resources_per_worker")


def is_real_number(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool): what every config checks first."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


#: ScalingConfig's default hang limit: a dead or stopped peer is found in half a minute, while
#: an all-reduce of a real model (milliseconds to seconds) is far inside it.
DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0


@dataclass
class ScalingConfig:
    """How many ranks a data-parallel run has, and what each one gets (Ray Train's names).

    Args:
        num_workers: ranks of the group (processes running ``train_loop_per_worker``, joined in
            one ``torch.distributed`` process group). The group starts, fails and restarts as
            one unit. ``0``: local mode, as in Ray Train: the loop runs in the calling process
            (breakpoints and ``pdb`` work), with ``ftnb.report``, ``get_checkpoint`` and
            ``get_context`` (world size 1, rank 0) and no process group. ``(min, max)``: an
            elastic group (Ray Train's), two whole numbers with ``1 <= min <= max``; the group
            asks for ``max`` ranks and runs with as many as fit, never fewer than ``min``
            (docs/elastic-training.md).
        use_gpu: give each rank one GPU of its own (it sees only that one through
            ``CUDA_VISIBLE_DEVICES``) and use NCCL; else CPUs and gloo.
        resources_per_worker: ``{"CPU": n, "GPU": m}`` for each rank (default 1 CPU, and 1 GPU
            with ``use_gpu``). A trial of ``num_workers`` ranks takes ``num_workers`` times this.
        collective_timeout_s: how long a rank may wait on its peers (an all-reduce, a barrier,
            the rendezvous) or stay stopped before the group counts as hung and is restarted from
            its latest checkpoint. The default (30 s) finds a dead or stopped peer in half a
            minute and leaves every real all-reduce far inside it; raise it when one rank does
            long work alone (rank 0 downloading a dataset) while the others wait in a collective.
        placement_strategy: accepted for Ray compatibility ("PACK", "SPREAD", ...); on one
            machine every rank is on the same node.
        elastic_resize_monitor_interval_s: with an elastic ``num_workers=(min, max)``, how
            often (seconds) a group running with fewer than ``max`` ranks looks for room to
            grow (Ray Train's name and default, 60 s).

    In a Tuner's ``param_space`` (``{"scaling_config": ScalingConfig(num_workers=
    ftnb.grid_search([1, 2]))}``), ``num_workers`` and ``resources_per_worker`` may be search
    domains: each trial's sampled values are checked as here, and refused before it starts.

    Example:
        >>> ScalingConfig(num_workers=2).worker_resources()
        TrialResources(cpu=1.0, gpu=0.0)
    """

    num_workers: Union[int, tuple] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[dict] = None
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    placement_strategy: str = "PACK"
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:
        searched = self.searched_fields()
        if searched:
            self._check_searched(searched)
            return
        self.num_workers = _checked_num_workers(self.num_workers)
        interval = self.elastic_resize_monitor_interval_s
        if not is_real_number(interval) or not interval > 0 or not math.isfinite(interval):
            raise ValueError(
                f"ScalingConfig(elastic_resize_monitor_interval_s={interval!r}) must be a "
                "number of seconds > 0. Fix: ScalingConfig(num_workers=(2, 4), "
                "elastic_resize_monitor_interval_s=60.0)."
            )
        if not isinstance(self.use_gpu, bool):
            raise TypeError(
                f"ScalingConfig(use_gpu={self.use_gpu!r}) must be True or False."
            )
        if not is_real_number(self.collective_timeout_s) or not self.collective_timeout_s > 0 \
                or not math.isfinite(self.collective_timeout_s):
            raise ValueError(
                f"ScalingConfig(collective_timeout_s={self.collective_timeout_s!r}) must be a "
                "number of seconds > 0. Fix: ScalingConfig(collective_timeout_s=60)."
            )
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(
                f"ScalingConfig(placement_strategy={self.placement_strategy!r}) is not one of "
                "'PACK', 'SPREAD', 'STRICT_PACK', 'STRICT_SPREAD'."
            )
        if self.resources_per_worker is not None and not isinstance(self.resources_per_worker,
                                                                    Mapping):
            raise TypeError(
                f"ScalingConfig(resources_per_worker={self.resources_per_worker!r}) must be a "
                "dict like {'CPU': 2, 'GPU': 1}."
            )
        resources = self.worker_resources()
        if resources.gpu and not self.use_gpu:
            raise ValueError(
                f"ScalingConfig(resources_per_worker={self.resources_per_worker!r}) asks for GPUs "
                "but use_gpu=False. Fix: ScalingConfig(use_gpu=True, ...)."
            )
        if self.use_gpu and resources.gpu == 0:
            raise ValueError(
                f"ScalingConfig(use_gpu=True, resources_per_worker={self.resources_per_worker!r})"
                " gives each rank no GPU. Fix: leave 'GPU' out (one per rank) or set it to 1."
            )
        if self.elastic and 0 < resources.gpu < 1:
            raise ValueError(
                f"ScalingConfig(num_workers={self.num_workers!r}, resources_per_worker="
                f"{self.resources_per_worker!r}): an elastic group cannot give its ranks "
                "fractional GPUs (each rank of a group needs a device of its own, and a resize "
                "must find whole devices). Fix: 'GPU': 1 per rank, or a fixed num_workers=1 to "
                "share a GPU between trials."
            )
        if self.max_workers > 1 and 0 < resources.gpu < 1:
            raise ValueError(
                f"ScalingConfig(num_workers={self.num_workers}, resources_per_worker="
                f"{self.resources_per_worker!r}): the ranks of a group cannot share a GPU (NCCL "
                "refuses two ranks on one device). Fix: give each rank a whole GPU ('GPU': 1), or "
                "use num_workers=1 to share GPUs between trials."
            )

    def searched_fields(self) -> list:
        """The fields that hold search domains (``ftnb.grid_search``, ``ftnb.choice``...): a
        ScalingConfig for a Tuner's ``param_space`` only."""
        from ..search.domains import holds_domain

        return [f.name for f in dataclasses.fields(self) if holds_domain(getattr(self, f.name))]

    def _check_searched(self, searched: list) -> None:
        """Refuse domains in fields that hold for the whole experiment; check the others as
        usual (the searched ones are checked per trial, :func:`ftnb.train.searched_scaling`)."""
        fixed = [name for name in searched if name not in SEARCHABLE_FIELDS]
        if fixed:
            raise ValueError(
                f"ScalingConfig({fixed[0]}={getattr(self, fixed[0])!r}): only "
                f"{' and '.join(SEARCHABLE_FIELDS)} may be search domains (a Tuner's trials "
                f"differ in their groups' size and resources, not in {fixed[0]}). Fix: give "
                f"{fixed[0]} one value.")
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name in searched}
        dataclasses.replace(self, **defaults)  # raises as ScalingConfig(...) does

    def worker_resources(self) -> Any:
        """What each rank asks for, as a :class:`~ftnb.execution.resources.TrialResources`."""
        from ..execution.resources import TrialResources

        given = dict(self.resources_per_worker or {})
        keys = {str(k).lower() for k in given}
        if "cpu" not in keys:
            given["cpu"] = 1
        if "gpu" not in keys and self.use_gpu:
            given["gpu"] = 1
        try:
            return TrialResources.from_user(given)
        except (TypeError, ValueError) as exc:
            message = str(exc).replace("resources_per_trial", "resources_per_worker")
            raise type(exc)(f"ScalingConfig: {message}") from None

    @property
    def min_workers(self) -> int:
        """The fewest ranks the group runs with: ``num_workers``, or an elastic range's min
        (local mode, ``num_workers=0``: 0)."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The ranks the group asks for: ``num_workers``, or an elastic range's max."""
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def elastic(self) -> bool:
        """Whether the group's size may change while it runs (``num_workers=(min, max)``
        with ``min < max``; ``(n, n)`` is a fixed group of ``n``)."""
        return self.min_workers < self.max_workers

    @property
    def local_mode(self) -> bool:
        """Whether the loop runs in the calling process (``num_workers=0``)."""
        return self.max_workers == 0

    @property
    def total_resources(self) -> dict:
        """What the whole group takes at its full size: ``max_workers`` times
        :meth:`worker_resources` (local mode: one worker's, the caller's)."""
        one = self.worker_resources()
        ranks = max(self.max_workers, 1)
        return {"CPU": one.cpu * ranks, "GPU": one.gpu * ranks}


def _checked_num_workers(value: Any) -> Union[int, tuple]:
    """``ScalingConfig(num_workers=value)`` checked: a whole number >= 0, or ``(min, max)``
    (a list too, kept as a tuple) of whole numbers with ``1 <= min <= max``."""
    if isinstance(value, (tuple, list)):
        whole = len(value) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in value)
        if not whole or not 1 <= value[0] <= value[1]:
            raise ValueError(
                f"ScalingConfig(num_workers={value!r}) is not an elastic range: it must be two "
                "whole numbers (min, max) with 1 <= min <= max (the group runs with at least "
                "min and at most max ranks). Fix: ScalingConfig(num_workers=(2, 4)), or a "
                "whole number for a group of fixed size."
            )
        return (value[0], value[1])
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"ScalingConfig(num_workers={value!r}) must be a whole number >= 1 (the ranks of "
            "the group), 0 (local mode: the loop runs in this process) or an elastic range "
            "(min, max). Fix: ScalingConfig(num_workers=2)."
        )
    return value
