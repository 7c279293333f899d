"""``SubEnvironments``: several sub-objects (environments, simulators, data readers) held by one
worker, where a failing one is recreated alone, blocking, and its error never reaches the group
(RLlib's ``restart_failed_sub_environments``)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from .group import WorkerGroupError, WorkerResult
from .group_arguments import takes_index
from .worker import describe_error

__all__ = ["SubEnvironments"]


class SubEnvironments:
    """``num`` objects built by ``factory()`` (or ``factory(index)``), each called through
    :meth:`call` / :meth:`map`: one that raises is closed (its ``close()``, if any) and built
    again at once, and the call gives a failed :class:`WorkerResult` instead of raising. Each
    index keeps its own restart count (``restarts[index]``); ``max_restarts`` (per index, -1:
    without limit) bounds them, after which :class:`WorkerGroupError` is raised (the worker
    fails, and its group recreates it).

    Example (inside a WorkerGroup's worker object):
        >>> class Runner:  # doctest: +SKIP
        ...     def __init__(self):
        ...         self.envs = ftnb.SubEnvironments(lambda i: gymnasium.make("CartPole-v1"), 4)
        ...     def step(self, actions):
        ...         return self.envs.map(lambda env, a: env.step(a), actions)
    """

    def __init__(self, factory: Callable[..., Any], num: int, *, max_restarts: int = -1) -> None:
        if not callable(factory):
            raise TypeError(
                f"SubEnvironments(factory={factory!r}) must be a function that builds one "
                "sub-environment. Fix: SubEnvironments(lambda i: make_env(), 4)."
            )
        if isinstance(num, bool) or not isinstance(num, int) or num < 1:
            raise ValueError(f"SubEnvironments(num={num!r}) must be a whole number >= 1.")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) \
                or max_restarts < -1:
            raise ValueError(
                f"SubEnvironments(max_restarts={max_restarts!r}) must be -1 (no limit) or >= 0."
            )
        self._factory = factory
        self._takes_index = takes_index(factory)
        self.max_restarts = max_restarts
        self.restarts = [0] * num
        self._objects = [self._build(i) for i in range(num)]

    def _build(self, index: int) -> Any:
        return self._factory(index) if self._takes_index else self._factory()

    def __len__(self) -> int:
        return len(self._objects)

    def __getitem__(self, index: int) -> Any:
        return self._objects[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._objects)

    def call(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> WorkerResult:
        """``fn(sub_environment, *args, **kwargs)`` on sub-environment ``index``; on an error
        the sub-environment is recreated and the result says what failed."""
        try:
            return WorkerResult(index, True, fn(self._objects[index], *args, **kwargs))
        except Exception as exc:
            error = describe_error(exc)
            self._recreate(index, error)
            return WorkerResult(index, False, None, error)

    def map(self, fn: Callable[..., Any], *per_env_args: Any) -> list[WorkerResult]:
        """:meth:`call` on every sub-environment; ``per_env_args`` are sequences with one
        argument per sub-environment (e.g. one action each)."""
        results = []
        for index in range(len(self._objects)):
            args = [values[index] for values in per_env_args]
            results.append(self.call(index, fn, *args))
        return results

    def _recreate(self, index: int, error: dict) -> None:
        if self.max_restarts >= 0 and self.restarts[index] >= self.max_restarts:
            raise WorkerGroupError(
                f"SubEnvironments: sub-environment {index} failed again after "
                f"{self.restarts[index]} restarts (max_restarts={self.max_restarts}): "
                f"{error.get('type')}: {error.get('message')}"
            )
        close = getattr(self._objects[index], "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                pass
        self.restarts[index] += 1
        self._objects[index] = self._build(index)
