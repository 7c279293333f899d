"""The storages a kernel used: where ``%ftattach NAME`` and the other magics look for an
experiment besides the default storage path.

An experiment launched or attached under another storage path (``--storage s3://...``) is
remembered here, so that later magics find it by its name alone (the default storage first, then
these, the last one used first) and ``%ftls`` lists them too. Plain Python, no IPython: the
magics (:class:`ftnb.notebook.magics.FtnbMagics`) hold one per kernel.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

__all__ = ["UsedStorages"]


class UsedStorages:
    """The storage paths other than the default that experiments were launched in or attached
    from in this kernel, the last one first, each with the filesystem it was reached with.

    ``configured`` arguments are the magics' configured storage path (``FtnbMagics.storage_path``;
    None: ``$FTNB_STORAGE_PATH``, else ``~/ftnb_results``).
    """

    def __init__(self) -> None:
        #: ``[(storage_path, filesystem), ...]``, the last one used first.
        self.entries: list[tuple[str, Any]] = []

    def attach(self, target: str, storage_path: Optional[str], filesystem: Any,
               configured: Optional[str]) -> Any:
        """The experiment ``target`` names: a folder, a name under ``storage_path`` (when
        given), or a name under the default storage, else under the storages this kernel used
        (the last one first)."""
        import ftnb

        from ..handle import ExperimentNotFoundError
        from ..ui.read_model import names_a_folder

        if storage_path or not self.entries or names_a_folder(target):
            handle = ftnb.attach(target, storage_path=storage_path or configured,
                                 storage_filesystem=filesystem)
            self.remember(handle, configured)
            return handle
        try:
            handle = ftnb.attach(target, storage_path=configured, storage_filesystem=filesystem)
        except ExperimentNotFoundError:
            return self._attach_used(target, configured)
        self._say_if_also_elsewhere(handle)
        return handle

    def _attach_used(self, name: str, configured: Optional[str]) -> Any:
        """Experiment ``name`` under the storages this kernel used, or an error that says where
        it was looked for."""
        import ftnb

        from ..handle import ExperimentNotFoundError
        from ..storage import default_storage_path

        for path, filesystem in self.entries:
            try:
                handle = ftnb.attach(name, storage_path=path, storage_filesystem=filesystem)
            except ExperimentNotFoundError:
                continue
            self.remember(handle, configured)
            return handle
        default = configured or default_storage_path()
        used = ", ".join(path for path, _ in self.entries)
        raise ExperimentNotFoundError(
            f"No ftnb experiment named {name!r} under {default} (the default storage) nor under "
            f"{used} (used in this kernel). Fix: check the name (`%ftls` lists them all), or "
            "give its storage: --storage PATH"
        )

    def _say_if_also_elsewhere(self, handle: Any) -> None:
        """A name found under the default storage may also be under a storage this kernel used:
        say which one the magic acts on, and how to reach the other."""
        from ..storage import ExperimentPaths, Storage

        for path, filesystem in self.entries:
            with contextlib.suppress(Exception):  # unreachable: it cannot be confused either
                if ExperimentPaths.of(Storage(path, filesystem), handle.name).has_state():
                    print(f"ftnb: note: {handle.name!r} is the one under {handle.paths.parent_uri}"
                          f" (the default storage); another is under {path} (--storage {path}).",
                          flush=True)
                    return

    def remember(self, handle: Any, configured: Optional[str]) -> None:
        """Put the storage of ``handle``'s experiment first, unless it is the default one."""
        from ..storage import default_storage_path
        from ..ui.read_model import same_storage_path

        path = handle.paths.parent_uri
        if same_storage_path(path, configured or default_storage_path()):
            return
        used = [(p, fs) for p, fs in self.entries if not same_storage_path(p, path)]
        self.entries[:] = [(path, handle.paths.storage.user_filesystem), *used]
