"""Where a detached supervisor runs: the launchers of :func:`ftnb.launch`, ``%ftrun`` and
``ftnb run --detach``.

* ``local`` (the default): a process of its own on this machine, in a new session
  (:func:`ftnb.supervisor.start`).
* ``command``: an admin's command template that starts ``python -m ftnb.supervisor ...``
  elsewhere: outside the Jupyter server's unit, container or pod (``systemd-run --user
  --collect {command}``, ``sbatch --wrap {quoted_command}``, ``ssh host {quoted_command}``,
  ``kubectl ...``); see :class:`~ftnb.launchers.command.CommandLauncher`.
* ``ray``: a detached, named Ray actor on the cluster, restarted by Ray if it dies; see
  :class:`~ftnb.launchers.ray.RayLauncher`. Trials then run on Ray too unless the run
  config names another executor.

The setting, first found first: the ``launcher=`` argument (``%ftrun --launcher``, ``ftnb run
--launcher``), ``%config FtnbMagics.launcher``, ``$FTNB_LAUNCHER``, else ``local``. A command
template likewise: ``--launcher-command``, ``%config FtnbMagics.launcher_command``,
``$FTNB_LAUNCHER_COMMAND``. A hub-wide default is these two variables in every user server's
environment (JupyterHub's ``c.Spawner.environment``).

Whatever the launcher, the experiment is found, watched, stopped and resumed the same way: the
owner lease and the control files live in the experiment's storage, and ``supervisor.json``
records where its supervisor runs (``launcher``, ``host``, ``pid``, ``actor``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Protocol, Union

from ..registry import LAUNCHERS

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..supervisor import LaunchSpec, SupervisorStart

__all__ = ["LAUNCHERS", "LAUNCHER_ENV", "Launcher", "LauncherError", "LocalLauncher",
           "launcher_for", "launcher_setting"]

#: The launcher a launch uses when none is given: a name of :data:`LAUNCHERS`.
LAUNCHER_ENV = "FTNB_LAUNCHER"
# LAUNCHERS (imported above): the launchers' names, ftnb's own ("local", "ray", "command") and
# any a third party registered (ftnb.registry.register_launcher); `name in LAUNCHERS` works.


class LauncherError(ValueError):
    """A launcher that cannot work as set (an unknown name, a template without its
    placeholder, Ray missing or unreachable): raised before anything starts."""


class Launcher(Protocol):
    """Starts a detached supervisor for a :class:`~ftnb.supervisor.LaunchSpec`.

    ``name``: as ``supervisor.json`` records it. ``objects_by_value``: whether the search
    space's objects travel in the launch file itself (the supervisor may run on another
    machine, where this one's ``ftnb.put`` files are not) rather than as refs."""

    name: str
    objects_by_value: bool

    def prepare(self, run_config: "RunConfig") -> "RunConfig":
        """The run config with this launcher's defaults (``ray``: trials on Ray too)."""

    def check(self, run_config: "RunConfig") -> None:
        """Raise :class:`LauncherError` if it cannot start a supervisor for this run."""

    def start(self, spec: "LaunchSpec") -> "SupervisorStart":
        """Start the supervisor; return once its controller runs (or raise what stopped it)."""


class LocalLauncher:
    """A supervisor process on this machine, in a session of its own (the default)."""

    name = "local"
    objects_by_value = False

    def prepare(self, run_config: "RunConfig") -> "RunConfig":
        return run_config

    def check(self, run_config: "RunConfig") -> None:
        pass

    def start(self, spec: "LaunchSpec") -> "SupervisorStart":
        from ..supervisor import start

        return start(spec)

    def __repr__(self) -> str:
        return "LocalLauncher()"


def launcher_for(choice: Union[str, Launcher, None] = None) -> Launcher:
    """The launcher ``launch(launcher=choice)`` means: a launcher object as it is; a name
    (``"local"``, ``"ray"``, ``"command"``: its template from ``$FTNB_LAUNCHER_COMMAND``);
    None: ``$FTNB_LAUNCHER``, else ``"local"``. Raises :class:`LauncherError` naming where a
    wrong value came from."""
    where = "launcher"
    if choice is None:
        choice = os.environ.get(LAUNCHER_ENV, "").strip() or "local"
        where = f"${LAUNCHER_ENV}" if os.environ.get(LAUNCHER_ENV, "").strip() else where
    if not isinstance(choice, str):
        if all(hasattr(choice, attr) for attr in ("name", "prepare", "check", "start")):
            return choice
        raise LauncherError(
            f"launcher={choice!r} is neither a launcher's name nor a launcher. Fix: one of "
            f"{', '.join(repr(n) for n in LAUNCHERS)}, or e.g. "
            "CommandLauncher('systemd-run --user --collect {command}')."
        )
    name = choice.strip().lower()
    if name not in LAUNCHERS:
        raise LauncherError(LAUNCHERS.unknown(name, shown=f"{where}={choice!r}"))
    try:
        return LAUNCHERS.load(name, shown=f"{where}={choice!r}")()
    except ImportError as exc:  # a third party's launcher whose package is missing
        raise LauncherError(str(exc)) from exc


def launcher_setting(option: Optional[str] = None, option_template: Optional[str] = None,
                     configured: Optional[str] = None,
                     configured_template: Optional[str] = None) -> Union[str, Launcher, None]:
    """What a front-end passes as ``launch(launcher=...)``: the launcher named by its option
    (``--launcher``; ``--launcher-command`` alone means ``command``), else by its configuration
    (``FtnbMagics.launcher``), else None (``launch`` then reads ``$FTNB_LAUNCHER``); for
    ``command``, with the template of the option, else of the configuration (else
    ``$FTNB_LAUNCHER_COMMAND``, read by :class:`~ftnb.launchers.command.CommandLauncher`)."""
    name = option or ("command" if option_template else None) or configured
    if name is not None and name.strip().lower() == "command":
        from .command import CommandLauncher

        return CommandLauncher(option_template or configured_template)
    return name
