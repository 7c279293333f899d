"""Checks of what a caller passes to start or resume an experiment (``Tuner``,
``Tuner.restore``, ``ftnb.run``, ``ftnb.launch``), made before anything is written: each error
names the argument, the value received and the fix."""

from __future__ import annotations

from typing import Any

from .config import callable_name, signature_mismatch

__all__ = ["check_instance", "check_picklable", "check_trainable", "short_repr"]


def check_trainable(trainable: Any, where: str) -> None:
    """Raise a TypeError unless ``trainable`` can be called as ``trainable(config)``;
    ``where`` names the call it was given to (``"Tuner"``, ``"ftnb.launch"``). A
    :class:`ftnb.TorchTrainer` is a trainable too (it checked its loop when it was built)."""
    if getattr(trainable, "_ftnb_trainer", False):
        return
    if not callable(trainable):
        raise TypeError(
            f"{where}(trainable=...) must be a function that takes a config dict; got "
            f"{type(trainable).__name__}: {short_repr(trainable)}. Fix: define "
            "`def train(config): ...` and pass `train` (not `train()`)."
        )
    problem = signature_mismatch(trainable, ("config",))
    if problem:
        name = callable_name(trainable)
        raise TypeError(
            f"{where}(trainable={name}) cannot be called as {name}(config), the way each trial "
            f"calls it with its config dict: {problem}. Fix: define it as "
            f"`def {name if name.isidentifier() else 'train'}(config): ...`; give it other "
            "inputs through param_space (or functools.partial)."
        )


def check_instance(value: Any, cls: type, argument: str, fix: str = "") -> None:
    """Raise a TypeError unless ``value`` (given as ``argument``, e.g.
    ``"Tuner(run_config=...)"``) is None or an instance of ``cls`` (``ftnb.<cls>``); ``fix``
    is an example of the right value."""
    if value is None or isinstance(value, cls):
        return
    hint = f" Fix: {fix}." if fix else ""
    raise TypeError(
        f"{argument} must be an ftnb.{cls.__name__}; got {short_repr(value)}.{hint}"
    )


def check_picklable(obj: Any, what: str) -> None:
    """Raise a TypeError unless ``obj`` (named ``what`` in the message) can travel to a trial
    process by cloudpickle."""
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        raise TypeError(
            f"{what}={short_repr(obj)} cannot be sent to a trial process: "
            f"{type(exc).__name__}: {exc}. Fix: do not capture unpicklable objects (open files, "
            "locks, live connections) in the function; create them inside it instead."
        ) from exc


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
