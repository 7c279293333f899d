"""Short descriptions of stored objects, for refs and error messages: a type's public name,
a size in bytes as people read it, a one-line summary that stays cheap for huge objects."""

from __future__ import annotations

import reprlib
import sys
from typing import Any

__all__ = ["format_size", "summarize", "type_name"]


def type_name(cls: type) -> str:
    """The shortest public dotted name of ``cls``: ``pandas.DataFrame``, ``torch.nn.Linear``."""
    module, qualname = cls.__module__, cls.__qualname__
    if module == "builtins":
        return qualname
    parts = module.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if getattr(sys.modules.get(prefix), qualname, None) is cls:
            return f"{prefix}.{qualname}"
    return f"{module}.{qualname}"


def format_size(nbytes: int) -> str:
    """``1.2 GB``, ``200 MB``, ``512 B`` (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{nbytes} B"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 2, 4, 4, 4
_REPR.maxstring, _REPR.maxother = 30, 60


def summarize(obj: Any) -> str:
    """A one-line description of ``obj`` of at most 80 characters, cheap for huge objects."""
    name = type(obj).__name__
    try:
        shape = getattr(obj, "shape", None)
        torch = sys.modules.get("torch")
        if isinstance(shape, tuple):  # ndarray, DataFrame, Series, Tensor (torch.Size)
            dtype = getattr(obj, "dtype", None)
            text = f"{name}(shape={tuple(shape)}" + ("" if dtype is None else f", dtype={dtype}")
            text += ")"
        elif torch is not None and isinstance(obj, torch.nn.Module):
            count = sum(p.numel() for p in obj.parameters())
            text = f"{name}({count:,} parameters)"
        else:
            # reprlib bounds the work on big builtin containers; other types use their repr.
            text = _REPR.repr(obj)
    except Exception:  # a broken __repr__ or property must not fail put()
        text = f"<{name} object>"
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."
