"""How error messages name a place in a param space and show a value found there.

Shared by the search package and :mod:`ftnb.objects` (whose errors name the same key paths).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["format_key_path", "short_repr"]


def format_key_path(path: Sequence[str | int]) -> str:
    """Render a key path as ``model/layers[0]/units`` for error messages.

    >>> format_key_path(("model", "layers", 0, "units"))
    'model/layers[0]/units'
    >>> format_key_path(())
    '<root>'
    """
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += ("/" if out else "") + str(part)
    return out or "<root>"


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages.

    >>> short_repr(list(range(100)), 20)
    '[0, 1, 2, 3, 4, 5...'
    """
    # Param spaces may hold datasets; never dump a megabyte into an error message.
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not mask the real error
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
