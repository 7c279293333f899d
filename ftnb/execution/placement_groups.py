"""What a trial asks for as bundles of resources: :class:`PlacementGroupFactory`, Ray Tune's
``tune.PlacementGroupFactory`` (``ray.tune.execution.placement_groups``).

ftnb runs a trial's attempt on one machine (the local executors) or as one Ray actor group, so
the bundles of a factory are summed into one request (:attr:`PlacementGroupFactory.
required_resources`): ``PlacementGroupFactory([{"CPU": 1}, {"CPU": 2, "GPU": 1}])`` asks for 3
CPUs and 1 GPU, whatever the strategy. Plain data with no machine in it (the trial schedulers
build them), so it sits with the base layer although it lives here, under Ray's path.

A factory is also a read-only dict, ``{"cpu": 3.0, "gpu": 1.0}`` (the sums): what
``with_resources`` and ``resources_per_trial`` take, and what
``get_context().get_trial_resources()`` returned before it returned a factory, so code that
reads ``get_trial_resources()["cpu"]`` or reports it as a metric keeps working.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

__all__ = ["PlacementGroupFactory", "STRATEGIES"]

#: Ray's placement strategies; on one machine they all mean the same.
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_KEYS = {"CPU": "CPU", "GPU": "GPU", "cpu": "CPU", "gpu": "GPU"}
_EXAMPLE = "PlacementGroupFactory([{'CPU': 1}, {'CPU': 1, 'GPU': 1}])"


def _read_only(self: Any, *args: Any, **kwargs: Any) -> None:
    raise TypeError("a PlacementGroupFactory cannot be changed: make a new one, e.g. "
                    f"{_EXAMPLE}.")


def _checked_bundle(index: int, bundle: Any) -> dict:
    """Bundle ``index`` as ``{"CPU": n, "GPU": m}`` (the keys given), checked."""
    if not isinstance(bundle, Mapping):
        raise TypeError(f"PlacementGroupFactory(bundles=...): bundle {index} is {bundle!r} "
                        f"({type(bundle).__name__}), not a dict. Fix: e.g. {_EXAMPLE}.")
    checked: dict = {}
    for key, amount in bundle.items():
        name = _KEYS.get(key) if isinstance(key, str) else None
        if name is None:
            raise ValueError(
                f"PlacementGroupFactory(bundles=...): bundle {index} asks for {key!r}; ftnb "
                "schedules only 'CPU' and 'GPU' (custom resources and memory are Ray "
                f"cluster features). Fix: e.g. {_EXAMPLE}.")
        if name in checked:
            raise ValueError(f"PlacementGroupFactory(bundles=...): bundle {index} gives "
                             f"{name!r} twice. Fix: keep one of {name!r} and {name.lower()!r}.")
        ok = isinstance(amount, numbers.Real) and not isinstance(amount, bool)
        if not ok or not math.isfinite(amount) or amount < 0:
            raise ValueError(f"PlacementGroupFactory(bundles=...): bundle {index} asks for "
                             f"{name}={amount!r}. Fix: a finite number >= 0.")
        checked[name] = amount
    return checked


class PlacementGroupFactory(dict):
    """Resources as bundles (Ray Tune's ``PlacementGroupFactory``), usable wherever a trial's
    resources are given (``ftnb.with_resources(train, PlacementGroupFactory([{"CPU": 2}]))``)
    and what ``get_context().get_trial_resources()`` and ``Trainable.trial_resources`` return.

    ``bundles``: a non-empty list of dicts of ``"CPU"`` and ``"GPU"`` amounts (the first is
    Ray's head bundle: the trainable's own); ``strategy``: one of :data:`STRATEGIES`. ftnb
    gives a trial the sum of its bundles (see the module's docstring).

    >>> pgf = PlacementGroupFactory([{"CPU": 1}, {"CPU": 0.5, "GPU": 1}])
    >>> pgf.required_resources, pgf.head_cpus, pgf["cpu"]
    ({'CPU': 1.5, 'GPU': 1.0}, 1.0, 1.5)
    """

    def __init__(self, bundles: Iterable[Mapping[str, float]], strategy: str = "PACK",
                 *args: Any, **kwargs: Any) -> None:
        if isinstance(bundles, (str, bytes, Mapping)) or not isinstance(bundles, Iterable):
            raise TypeError(f"PlacementGroupFactory(bundles={bundles!r}) must be a list of "
                            f"dicts. Fix: e.g. {_EXAMPLE}.")
        checked = [_checked_bundle(i, b) for i, b in enumerate(bundles)]
        if not checked:
            raise ValueError(f"PlacementGroupFactory(bundles=[]) has no bundle. Fix: at least "
                             f"one, e.g. {_EXAMPLE}.")
        if strategy not in STRATEGIES:
            raise ValueError(f"PlacementGroupFactory(strategy={strategy!r}) is not one of "
                             f"{', '.join(STRATEGIES)}. Fix: strategy='PACK'.")
        total = {key: float(sum(b.get(key, 0) for b in checked)) for key in ("CPU", "GPU")}
        if total["GPU"] > 1 and not total["GPU"].is_integer():
            raise ValueError(
                f"PlacementGroupFactory(bundles={checked!r}) asks for GPU={total['GPU']:g} in "
                "all: a fraction of a GPU is for trials sharing one GPU, so the sum must be "
                "below 1 or a whole number. Fix: e.g. GPU=1 or GPU=2.")
        self._bundles = checked
        self._strategy = strategy
        self._total = total
        super().__init__(cpu=total["CPU"], gpu=total["GPU"])

    @classmethod
    def from_amounts(cls, cpu: float, gpu: float = 0.0) -> "PlacementGroupFactory":
        """One bundle of ``cpu`` CPUs and ``gpu`` GPUs (no GPU key when 0)."""
        return cls([{"CPU": cpu, **({"GPU": gpu} if gpu else {})}])

    @property
    def bundles(self) -> list[dict]:
        """The bundles, a copy (keys ``"CPU"``/``"GPU"``)."""
        return [dict(b) for b in self._bundles]

    @property
    def strategy(self) -> str:
        return self._strategy

    @property
    def required_resources(self) -> dict:
        """The bundles summed, as ``{"CPU": n, "GPU": m}`` (the keys they name)."""
        keys = [k for k in ("CPU", "GPU") if any(k in b for b in self._bundles)]
        return {k: self._total[k] for k in keys}

    @property
    def head_cpus(self) -> float:
        """The CPUs of the first (head) bundle."""
        return float(self._bundles[0].get("CPU", 0))

    @property
    def head_bundle_is_empty(self) -> bool:
        """Whether the first bundle asks for nothing."""
        return not any(self._bundles[0].values())

    def _key(self) -> tuple:
        return (tuple(tuple(sorted((k, float(v)) for k, v in b.items() if v))
                      for b in self._bundles), self._strategy)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlacementGroupFactory):
            return self._key() == other._key()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._key())

    def __repr__(self) -> str:
        return f"PlacementGroupFactory({self._bundles!r}, strategy={self._strategy!r})"

    def __reduce__(self) -> tuple:
        return (PlacementGroupFactory, (self._bundles, self._strategy))

    def __copy__(self) -> "PlacementGroupFactory":
        return self

    def __deepcopy__(self, memo: dict) -> "PlacementGroupFactory":
        return self

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only
    __ior__ = _read_only  # type: ignore[assignment]
