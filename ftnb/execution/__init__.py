"""Executors, chosen by name: ``create_executor("local")``.

The contract every executor follows is in :mod:`ftnb.execution.contract`. The names are those of
:data:`ftnb.registry.EXECUTORS`, which maps a name to where its class lives and imports it only
when asked for, so ``import ftnb`` pays for none of them, and an executor whose extra is not
installed says which ``pip install`` brings it. A third party adds its own with
:func:`~ftnb.registry.register_executor`, and checks it with the contract suite
(:mod:`ftnb.testing.executor_contract`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..registry import EXECUTORS

if TYPE_CHECKING:
    from .contract import Executor

__all__ = ["EXECUTOR_ENV", "available_executors", "create_executor", "executor_class",
           "executor_for"]


def available_executors() -> list[str]:
    """The registered executor names: ftnb's own, then those registered by third parties
    (:func:`ftnb.registry.register_executor`)."""
    return EXECUTORS.names()


def executor_class(name: str) -> type:
    """The class registered as ``name``, imported now.

    Raises:
        ValueError: no executor has that name (the message names the known ones).
        ImportError: its extra is not installed (the message says which ``pip install``).
    """
    return EXECUTORS.load(name)


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
