"""Words in messages and views, shared by every layer (it imports nothing of ftnb's)."""

from __future__ import annotations

from typing import Optional

__all__ = ["number", "plural"]


def number(value: float) -> str:
    """``2.0`` -> ``2``, ``0.5`` -> ``0.5``: what users typically type."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def plural(count: float, noun: str, many: Optional[str] = None) -> str:
    """``1 failure``, ``2 failures``, ``0.5 CPUs`` (``many`` for an irregular plural:
    ``plural(n, "retry", "retries")``)."""
    return f"{number(count)} {noun if count == 1 else (many or noun + 's')}"
