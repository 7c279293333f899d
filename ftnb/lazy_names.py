"""Names a module exports but imports on first use (from its ``__getattr__``, PEP 562), so that
importing the module stays cheap: ``import ftnb``, :mod:`ftnb.schedulers`, :mod:`ftnb.logger`,
:mod:`ftnb.ui.read_model`."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

__all__ = ["lazy_attribute"]


def lazy_attribute(namespace: dict, names: Mapping[str, str], name: str) -> Any:
    """The attribute ``name`` of the module whose globals are ``namespace``, imported from its
    module in ``names`` (name -> module, relative to the module's package) and kept in
    ``namespace``; AttributeError for a name not in ``names``. The module's ``__getattr__``::

        def __getattr__(name: str) -> Any:
            return lazy_attribute(globals(), _LAZY, name)
    """
    module = names.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", namespace["__package__"]), name)
    namespace[name] = value
    return value
