"""ftnb in Jupyter: the ``%ftrun`` magics (:mod:`ftnb.notebook.magics`) and the live widget.

Nothing here is imported by ``import ftnb``: IPython, ipywidgets and anywidget load only when a
notebook asks for them (``%load_ext ftnb``, ``handle.display()``); plotly only for
:mod:`ftnb.notebook.plots`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext ftnb.notebook``: register the ftnb magics (same as ``%load_ext ftnb``)."""
    from .magics import load_ipython_extension as load

    load(ipython)
