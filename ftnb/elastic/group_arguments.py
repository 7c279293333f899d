"""The arguments of a :class:`~ftnb.elastic.group.WorkerGroup`, checked before any worker starts
(each error names the argument, the value received and the fix) and made ready for its backend:
:func:`checked_arguments`. :func:`takes_index` serves
:class:`~ftnb.elastic.sub_environments.SubEnvironments` too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .backend import backend_name

__all__ = ["GroupArguments", "check_whole", "checked_arguments", "takes_index",
           "worker_resources"]

_CPU_GPU = {"cpu": "cpu", "CPU": "cpu", "gpu": "gpu", "GPU": "gpu"}


@dataclass(frozen=True)
class GroupArguments:
    """What a group makes of its arguments once they are checked."""

    #: The backend's name: ``"local"`` or ``"ray"`` (None resolved, see backend_name).
    executor: str
    #: Each worker's CPUs and GPUs (a :class:`~ftnb.execution.resources.TrialResources`).
    resources: Any
    #: Each worker's custom resources (Ray only), as floats.
    custom: dict
    #: ``(factory, takes_index, get_state given)``, pickled by value for the workers.
    factory: bytes


def checked_arguments(
    factory: Callable[..., Any],
    num_workers: int,
    *,
    resources_per_worker: Optional[dict],
    max_restarts: int,
    consecutive_failure_tolerance: int,
    call_timeout_s: Optional[float],
    get_state: Optional[Callable[[], Any]],
    max_in_flight_per_worker: int,
    executor: Optional[str],
    spare_workers: int,
) -> GroupArguments:
    """Check ``WorkerGroup``'s arguments (see its docstring), raising a TypeError or ValueError
    for the first wrong one."""
    from ..objects.cell_source import dumps

    if not callable(factory):
        raise TypeError(
            f"WorkerGroup(factory={factory!r}) must be a function that builds a worker's "
            "object. Fix: WorkerGroup(make_worker, 4) (not make_worker())."
        )
    with_index = takes_index(factory)
    check_whole("num_workers", num_workers, 1)
    check_whole("max_restarts", max_restarts, -1)
    check_whole("consecutive_failure_tolerance", consecutive_failure_tolerance, 0)
    check_whole("max_in_flight_per_worker", max_in_flight_per_worker, 1)
    check_whole("spare_workers", spare_workers, 0)
    if call_timeout_s is not None and not (isinstance(call_timeout_s, (int, float))
                                           and not isinstance(call_timeout_s, bool)
                                           and call_timeout_s > 0):
        raise ValueError(
            f"WorkerGroup(call_timeout_s={call_timeout_s!r}) must be a number of seconds > 0"
            " or None. Fix: call_timeout_s=30."
        )
    if get_state is not None and not callable(get_state):
        raise TypeError(
            f"WorkerGroup(get_state={get_state!r}) must be a function returning the state "
            "to push into recreated workers. Fix: get_state=lambda: model.state_dict()."
        )
    executor = backend_name(executor)
    resources, custom = worker_resources(resources_per_worker, executor)
    try:
        payload = dumps((factory, with_index, get_state is not None))
    except Exception as exc:
        raise TypeError(
            f"WorkerGroup(factory=...) cannot be sent to a worker: "
            f"{type(exc).__name__}: {exc}. Fix: create unpicklable things (open files, "
            "locks) inside the factory."
        ) from exc
    return GroupArguments(executor=executor, resources=resources, custom=custom,
                          factory=payload)


def takes_index(factory: Callable[..., Any]) -> bool:
    """Whether ``factory`` takes the worker's index (an optional index parameter too)."""
    from ..config import signature_mismatch

    if signature_mismatch(factory, (0,)) is None:
        return True
    if signature_mismatch(factory, ()) is None:
        return False
    raise TypeError(
        f"WorkerGroup(factory={getattr(factory, '__name__', factory)!r}) must take no argument "
        "or one (the worker's index). Fix: def make_worker(index): ..."
    )


def worker_resources(value: Any, executor: str) -> tuple[Any, dict]:
    """``resources_per_worker`` as the CPUs and GPUs (a TrialResources) and the custom
    resources (Ray only)."""
    from ..execution.resources import TrialResources

    custom = {}
    if isinstance(value, dict):
        custom = {k: v for k, v in value.items() if k not in _CPU_GPU}
        value = {k: v for k, v in value.items() if k in _CPU_GPU}
    try:
        resources = TrialResources.from_user(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(str(exc).replace("resources_per_trial", "resources_per_worker")) \
            from None
    for key, amount in custom.items():
        if executor != "ray":
            raise ValueError(
                f"WorkerGroup(resources_per_worker={value | custom!r}): {key!r} is not 'cpu' or "
                "'gpu'; custom resources are for Ray actors. Fix: executor='ray', or keep "
                "only 'cpu' and 'gpu'."
            )
        if not isinstance(key, str) or isinstance(amount, bool) \
                or not isinstance(amount, (int, float)) or not amount >= 0:
            raise ValueError(
                f"WorkerGroup(resources_per_worker=...): the custom resource {key!r}: "
                f"{amount!r} must be named by a string and be a number >= 0. Fix: "
                "resources_per_worker={'cpu': 1, 'my_resource': 1}."
            )
    return resources, {k: float(v) for k, v in custom.items()}


def check_whole(name: str, value: Any, minimum: int) -> None:
    """Raise a ValueError unless ``WorkerGroup(name=value)`` is a whole number >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"WorkerGroup({name}={value!r}) must be a whole number >= {minimum}."
        )
