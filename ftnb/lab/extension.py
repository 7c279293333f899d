"""The extension's configuration (:class:`Ftnb`, ``c.Ftnb.*``) and its loading into a server."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from traitlets import Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ..storage import default_storage_path

__all__ = ["Ftnb", "load"]


class Ftnb(LoggingConfigurable):
    """ftnb's server extension settings, ``c.Ftnb.<name>`` in ``jupyter_server_config.py``."""

    storage_roots = List(
        Unicode(),
        help="The storage folders whose experiments the JupyterLab panel shows and controls: "
             "local folders (NFS mounts too) or fsspec URLs (s3://bucket/prefix, with "
             "credentials and endpoint as s3fs finds them: the environment, or fsspec's "
             "config such as FSSPEC_S3_ENDPOINT_URL). No path outside them is served. Default: "
             "ftnb's default storage path ($FTNB_STORAGE_PATH, else ~/ftnb_results).",
    ).tag(config=True)

    io_threads = Integer(
        8, help="Threads that read storage for the panel's requests (never the event loop)."
    ).tag(config=True)

    @default("storage_roots")
    def _default_storage_roots(self) -> list[str]:
        return [default_storage_path()]


def load(serverapp: Any) -> None:
    """Read ``c.Ftnb`` and add the routes to ``serverapp``'s web application. A bad
    ``storage_roots`` raises here (the server logs it, and serves no ftnb route)."""
    from .handlers import LabState, routes
    from .roots import StorageRoots

    settings = Ftnb(parent=serverapp)
    roots = StorageRoots(settings.storage_roots)
    executor = ThreadPoolExecutor(max(1, settings.io_threads), thread_name_prefix="ftnb-lab")
    # A resume imports an experiment's code only from the server's own folders: the local
    # roots and the folder the Jupyter server serves.
    code_folders = [r.base for r in roots.roots if r.storage.is_local]
    root_dir = getattr(serverapp, "root_dir", None)
    if isinstance(root_dir, str) and root_dir:
        code_folders.append(os.path.realpath(os.path.expanduser(root_dir)))
    lab = LabState(roots, executor, code_folders=code_folders)
    web_app = serverapp.web_app
    web_app.add_handlers(".*$", routes(web_app.settings["base_url"], lab))
    serverapp.log.info("ftnb: JupyterLab panel routes serve %s", ", ".join(roots.uris()))
