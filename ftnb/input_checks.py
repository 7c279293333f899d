"""Checks of what a caller passes to start or resume an experiment (``Tuner``,
``Tuner.restore``, ``ftnb.run``, ``ftnb.launch``), made before anything is written: each error
names the argument, the value received and the fix."""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Callable, Mapping, TypeVar

from .config import callable_name, signature_mismatch

__all__ = ["check_instance", "check_picklable", "check_trainable", "keywords_after",
           "short_repr"]

_Function = TypeVar("_Function", bound=Callable[..., Any])


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


def keywords_after(where: str, mapping_keyword: str) -> Callable[[_Function], _Function]:
    """Decorate a function whose parameters after the first (or two) are keyword-only, so that a
    value given by position raises a TypeError naming ``where`` (``"Tuner"``), the value and the
    keyword it belongs to, instead of Python's "takes 2 positional arguments but 3 were given".
    The keyword is guessed from the value: ``mapping_keyword`` for a dict (``"param_space"``),
    ``run_config`` for a RunConfig, and so on; the signature seen by ``help()`` is unchanged."""

    def decorate(function: _Function) -> _Function:
        parameters = inspect.signature(function).parameters.values()
        positional = [p.name for p in parameters
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keywords = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
        shown = [name for name in positional if name not in ("self", "cls")]

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if len(args) > len(positional):
                extra = args[len(positional)]
                given = ", ".join(shown)
                shown_value = _brief(extra)
                keyword = _keyword_for(extra, keywords, mapping_keyword)
                fix = (f"{where}({given}, {keyword}={shown_value})" if keyword else
                       f"{where}({given}, <keyword>={shown_value}), the keyword being one of "
                       f"{', '.join(keywords)}")
                raise TypeError(
                    f"{where}({given}, {shown_value}) was given {shown_value} by position; "
                    f"{where} takes only {' and '.join(shown)} by position and everything else "
                    "by keyword. "
                    f"Fix: {fix}."
                )
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


def _keyword_for(value: Any, keywords: list, mapping_keyword: str) -> str:
    """The keyword-only parameter ``value`` most likely meant: ``run_config`` for a RunConfig
    (its class name in snake case, when such a keyword exists), ``mapping_keyword`` for a dict;
    "" when there is no telling."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", type(value).__name__).lower()
    if snake in keywords:
        return snake
    if isinstance(value, Mapping) and mapping_keyword in keywords:
        return mapping_keyword
    return ""


def _brief(value: Any) -> str:
    """``repr(value)`` up to 40 characters; a longer one of a class of its own as
    ``RunConfig(...)``, any other cut short."""
    text = repr(value)
    if len(text) <= 40:
        return text
    if type(value).__module__ != "builtins":
        return f"{type(value).__name__}(...)"
    return text[:37] + "..."


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
