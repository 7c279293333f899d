"""ftnb's Jupyter server extension: authenticated routes over ftnb's read model, the server half
of the JupyterLab panel (``<base_url>ftnb/api/...``, described in :mod:`ftnb.lab.handlers`).

Installed with ``pip install 'ftnb[lab]'``, it is enabled by default (the package ships
``etc/jupyter/jupyter_server_config.d/ftnb.json``); ``jupyter server extension list`` shows it.
What it serves is configured in ``jupyter_server_config.py``::

    c.Ftnb.storage_roots = ["~/ftnb_results", "s3://bucket/exps"]

(default: ftnb's default storage path, ``$FTNB_STORAGE_PATH`` or ``~/ftnb_results``). No path
outside those roots is ever read or written. ``import ftnb`` does not import this package;
jupyter_server imports it when it loads its extensions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict]:
    """Where jupyter_server finds the extension (this module)."""
    return [{"module": "ftnb.lab"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the routes to ``serverapp``'s web application (jupyter_server calls it)."""
    from .extension import load

    load(serverapp)
