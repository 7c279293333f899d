"""One registry for what ftnb picks by name: executors, launchers and elastic worker backends.

Each kind is a table from a name to where its class lives (a dotted path, imported only when the
name is used, so ``import ftnb`` pays for none of them) and how to install what it needs::

    "ray": ("ftnb.execution.ray.RayExecutor", "pip install 'ftnb[ray]'")

An unknown name is refused with the known ones (and a close match); a name whose optional
dependency is missing says which ``pip install`` brings it. A third party adds its own::

    from ftnb.registry import register_executor

    register_executor("slurm", "my_package.executors.SlurmExecutor",
                      hint="pip install my-package")
    ftnb.Tuner(train, run_config=ftnb.RunConfig(executor="slurm"))

Registering a name that is taken by another class is refused unless ``clobber=True``;
registering the same class again is a no-op. A registration lives in the process that made it:
a detached supervisor (``ftnb.launch``) started elsewhere knows only ftnb's own names and those
its own imports register, so hand it an executor object rather than a third-party name.

Who looks names up: :func:`ftnb.execution.create_executor` (``RunConfig(executor=...)``,
``$FTNB_EXECUTOR``), :func:`ftnb.launchers.launcher_for` (``launch(launcher=...)``,
``$FTNB_LAUNCHER``) and :class:`ftnb.elastic.WorkerGroup` (``executor=``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Iterator, Optional, Union

__all__ = ["ELASTIC_BACKENDS", "EXECUTORS", "LAUNCHERS", "Registry", "RegistryEntry",
           "register_elastic_backend", "register_executor", "register_launcher"]

_NAME = re.compile(r"[a-z][a-z0-9_.-]*\Z")


@dataclass(frozen=True)
class RegistryEntry:
    """Where a name's class lives: ``target`` is ``"package.module.Class"`` (imported on first
    use) or the class itself; ``hint`` is how to install what it needs; ``requires`` names the
    modules it needs that its own module imports only later (checked before it is handed out:
    ``ftnb.execution.ray`` imports without ray, its executor cannot run without it)."""

    target: Union[str, type]
    hint: Optional[str] = None
    requires: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """The dotted path of the class."""
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}.{self.target.__qualname__}"


class Registry:
    """The names of one kind (``kind``: "executor"; ``argument``: the option that takes them,
    as error messages show it; ``function``: the one third parties register with). Iterating
    gives the names in the order they were registered; ``name in registry`` says whether one
    is known."""

    def __init__(self, kind: str, argument: str,
                 entries: Optional[dict[str, RegistryEntry]] = None,
                 function: Optional[str] = None) -> None:
        self.kind = kind
        self.argument = argument
        self.function = function or f"register_{kind.replace(' ', '_')}"
        self._entries: dict[str, RegistryEntry] = dict(entries or {})

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)!r})"

    def names(self) -> list[str]:
        """The registered names, ftnb's own first."""
        return list(self._entries)

    def entry(self, name: str) -> Optional[RegistryEntry]:
        """The entry of ``name``, or None."""
        return self._entries.get(name) if isinstance(name, str) else None

    def register(self, name: str, target: Union[str, type], hint: Optional[str] = None, *,
                 requires: tuple[str, ...] = (), clobber: bool = False) -> None:
        """Register ``target`` (a class or ``"package.module.Class"``) as ``name``.

        Raises:
            ValueError: ``name`` is not a lower-case name, ``target`` is neither a class nor a
                dotted path, or ``name`` is registered to another class and ``clobber`` is
                False (registering the same class again is fine).
        """
        where = self.function
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"{where}(name={name!r}): a name is lower case: a letter, then letters, digits, "
                f"'_', '-' or '.'. Fix: e.g. {where}('my-{self.kind.split()[-1]}', ...)."
            )
        if not isinstance(target, type) and not (
                isinstance(target, str) and "." in target.strip(".")):
            raise ValueError(
                f"{where}({name!r}, {target!r}): the target must be a class or its dotted path "
                f"'package.module.Class'. Fix: {where}({name!r}, 'my_package.module.MyClass')."
            )
        if isinstance(requires, str):
            requires = (requires,)
        new = RegistryEntry(target, hint, tuple(requires))
        old = self._entries.get(name)
        if old is not None and not clobber and old.path != new.path:
            raise ValueError(
                f"{where}({name!r}, {new.path!r}): {name!r} is already the {self.kind} "
                f"{old.path!r}. Fix: choose another name, or pass clobber=True to replace it."
            )
        self._entries[name] = new

    def unregister(self, name: str) -> None:
        """Forget ``name`` (nothing happens if it is not registered)."""
        self._entries.pop(name, None)

    def unknown(self, name: object, shown: Optional[str] = None, also: str = "") -> str:
        """What to say of a name nobody registered (``shown``: how the value appears, default
        ``argument=name``; ``also``: other accepted values, after the names)."""
        shown = shown or f"{self.argument}={name!r}"
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        article = "an" if self.kind[0] in "aeiou" else "a"
        return (f"{shown} is not {article} {self.kind} ftnb knows{guess}. Fix: use one of "
                f"{', '.join(repr(n) for n in self._entries)}{also}.")

    def load(self, name: str, shown: Optional[str] = None, also: str = "") -> type:
        """The class registered as ``name``, imported now.

        Raises:
            ValueError: no such name (see :meth:`unknown`).
            ImportError: what it needs is not installed (the message says how to install it),
                or its module has no such class.
        """
        entry = self.entry(name)
        if entry is None:
            raise ValueError(self.unknown(name, shown, also))
        shown = shown or f"{self.argument}={name!r}"
        missing = [m for m in entry.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise ImportError(_missing(shown, missing[0], entry.hint))
        if not isinstance(entry.target, str):
            return entry.target
        module_name, _, attribute = entry.target.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            top = (exc.name or module_name).split(".")[0]
            raise ImportError(_missing(shown, top, entry.hint)) from exc
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise ImportError(
                f"{shown} is registered as {entry.target!r}, but {module_name} has no "
                f"{attribute!r}. Fix: register the class where it is defined."
            ) from None


def _missing(shown: str, module: str, hint: Optional[str]) -> str:
    fix = hint or f"install the package that provides {module!r}"
    return f"{shown} needs the {module!r} package, which is not installed. Fix: {fix}."


_RAY = "pip install 'ftnb[ray]'"

#: Where trials run: ``RunConfig(executor=...)``, ``$FTNB_EXECUTOR``.
EXECUTORS = Registry("executor", "executor", entries={
    "local": RegistryEntry("ftnb.execution.local.LocalProcessExecutor"),
    "inprocess": RegistryEntry("ftnb.execution.inprocess.InProcessExecutor"),
    "ray": RegistryEntry("ftnb.execution.ray.RayExecutor", _RAY, ("ray",)),
})


#: Where a detached supervisor runs: ``launch(launcher=...)``, ``$FTNB_LAUNCHER``. A launcher
#: class is built with no arguments (see :class:`ftnb.launchers.Launcher`); the ``ray``
#: launcher itself says, in ``check``, when Ray is missing or unreachable. An unknown name is a
#: :class:`~ftnb.launchers.LauncherError` (:func:`ftnb.launchers.launcher_for` raises it).
LAUNCHERS = Registry("launcher", "launcher", entries={
    "local": RegistryEntry("ftnb.launchers.LocalLauncher"),
    "ray": RegistryEntry("ftnb.launchers.ray.RayLauncher", _RAY),
    "command": RegistryEntry("ftnb.launchers.command.CommandLauncher"),
})

#: Where a :class:`~ftnb.elastic.WorkerGroup`'s workers run: ``WorkerGroup(executor=...)``. A
#: backend class is built as ``cls(resources, custom)`` (see
#: :class:`ftnb.elastic.backend.WorkerBackend`).
ELASTIC_BACKENDS = Registry("worker backend", "executor", entries={
    "local": RegistryEntry("ftnb.elastic.local_workers.LocalWorkers"),
    "ray": RegistryEntry("ftnb.elastic.ray_workers.RayWorkers", _RAY, ("ray",)),
}, function="register_elastic_backend")


def register_executor(name: str, target: Union[str, type], hint: Optional[str] = None, *,
                      requires: tuple[str, ...] = (), clobber: bool = False) -> None:
    """Make ``RunConfig(executor=name)`` (and ``$FTNB_EXECUTOR=name``) build ``target``: a class
    following :class:`ftnb.execution.contract.Executor`, or its dotted path (imported when the
    name is first used). ``hint``: how to install what it needs (shown when an import fails);
    ``requires``: modules to find before importing it. ``create_executor(name, **options)``
    calls the class with ``options``. See :meth:`Registry.register` for the errors.

    Example::

        register_executor("slurm", "my_package.executors.SlurmExecutor", "pip install my-package")
    """
    EXECUTORS.register(name, target, hint, requires=requires, clobber=clobber)


def register_launcher(name: str, target: Union[str, type], hint: Optional[str] = None, *,
                      requires: tuple[str, ...] = (), clobber: bool = False) -> None:
    """Make ``launch(launcher=name)`` (``%ftrun --launcher``, ``$FTNB_LAUNCHER``) build
    ``target()``: a class following :class:`ftnb.launchers.Launcher`, or its dotted path. The
    arguments are as :func:`register_executor`'s."""
    LAUNCHERS.register(name, target, hint, requires=requires, clobber=clobber)


def register_elastic_backend(name: str, target: Union[str, type], hint: Optional[str] = None,
                             *, requires: tuple[str, ...] = (), clobber: bool = False) -> None:
    """Make ``WorkerGroup(executor=name)`` run its workers on ``target(resources, custom)``: a
    class following :class:`ftnb.elastic.backend.WorkerBackend`, or its dotted path. The
    arguments are as :func:`register_executor`'s."""
    ELASTIC_BACKENDS.register(name, target, hint, requires=requires, clobber=clobber)
