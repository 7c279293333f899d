"""Executors, chosen by name: ``create_executor("local")``.

The contract every executor follows is in :mod:`ftnb.execution.contract`. This registry maps a name
to where its class lives and imports it only when asked for, so ``import ftnb`` pays for none of
them, and an executor whose extra is not installed says which ``pip install`` brings it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .contract import Executor

__all__ = ["EXECUTOR_ENV", "available_executors", "create_executor", "executor_class",
           "executor_for"]


@dataclass(frozen=True)
class _Entry:
    module: str
    cls: Optional[str]  # None: the name is reserved, not implemented yet
    requires: tuple[str, ...] = ()  # modules the executor needs (its extra)
    install: Optional[str] = None  # what brings them


_REGISTRY: dict[str, _Entry] = {
    "local": _Entry("ftnb.execution.local", "LocalProcessExecutor"),
    "inprocess": _Entry("ftnb.execution.inprocess", "InProcessExecutor"),
    "ray": _Entry("ftnb.execution.ray", "RayExecutor", ("ray",), "pip install 'ftnb[ray]'"),
}


def available_executors() -> list[str]:
    """The registered executor names, those reserved for later included."""
    return list(_REGISTRY)


def executor_class(name: str) -> type:
    """The class registered as ``name``, imported now.

    Raises:
        ValueError: no executor has that name.
        ImportError: its extra is not installed (the message says which ``pip install``).
        NotImplementedError: the name is reserved for an executor this ftnb does not have yet.
    """
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"executor={name!r} is not an executor ftnb knows{guess}. Fix: use one of "
            f"{', '.join(repr(n) for n in _REGISTRY)}."
        )
    if entry.cls is None:  # (before the extra: installing it would not help)
        raise NotImplementedError(
            f"executor={name!r} is not available yet in this version of ftnb. Fix: use "
            "executor='local' (trials as processes on this machine)."
        )
    missing = [m for m in entry.requires if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"executor={name!r} needs the {missing[0]!r} package, which is not installed. "
            f"Fix: {entry.install}."
        )
    return getattr(importlib.import_module(entry.module), entry.cls)


#: The executor a run uses when its RunConfig names none: a registered name.
EXECUTOR_ENV = "FTNB_EXECUTOR"


def executor_for(choice: Any, **options: Any) -> "Executor":
    """The executor ``RunConfig(executor=choice)`` means: an executor object as it is, a name
    built with ``options`` (see :func:`create_executor`), None: ``$FTNB_EXECUTOR``, else
    ``"local"``."""
    import os

    if choice is None:
        choice = os.environ.get(EXECUTOR_ENV) or "local"
    if isinstance(choice, str):
        return create_executor(choice, **options)
    return choice


def create_executor(name: str, **options: Any) -> "Executor":
    """A new executor of the kind registered as ``name``, built with ``options`` (for
    ``"local"`` and ``"inprocess"``: ``pool`` and ``output_events``). Raises like
    :func:`executor_class`."""
    return executor_class(name)(**options)
