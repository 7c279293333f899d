"""The ``command`` launcher: an admin's command template starts the supervisor elsewhere.

A Jupyter server's processes die with it when its spawner stops it cgroup-wide (SystemdSpawner,
The Littlest JupyterHub) or kills its container or pod (DockerSpawner, KubeSpawner). A command
that starts the supervisor outside that unit, container or pod lets the experiment outlive the
server::

    FTNB_LAUNCHER=command
    FTNB_LAUNCHER_COMMAND='systemd-run --user --collect --quiet --unit=ftnb-{name}-{id} {command}'

The template is split into words as a POSIX shell would (:func:`shlex.split`; no shell runs
it: ``sh -c {quoted_command}`` where one is needed). Placeholders, each replaced by a
shell-quoted value, as whole words or inside an unquoted word (``--unit=ftnb-{name}``):

``{command}``
    the supervisor's command line, ``PYTHON -m ftnb.supervisor --launch-file ... --log ...
    --reply-file ...``, as separate words (for commands that take a program and its arguments:
    ``systemd-run``, ``setsid``, ``docker run IMAGE``, ``kubectl exec POD --``).
``{quoted_command}``
    the same command line as one word (for commands that take a shell line: ``sbatch --wrap``,
    ``ssh HOST``, ``sh -c``).
``{name}``, ``{id}``
    the experiment's name and a unique id of this launch, both made of letters, digits and
    ``_.-`` only (for unit and job names).
``{log}``, ``{launch_dir}``, ``{python}``, ``{cwd}``
    the supervisor's log file until it moves into the experiment, the launch folder, this
    Python, this working directory.

One of ``{command}`` and ``{quoted_command}`` is required. ``{{`` and ``}}`` are literal braces.

**The launch file** (the trainable, the space, the configs: cloudpickled, mode 0600) is written
to the launch folder, ``$FTNB_LAUNCH_DIR``, else ``~/.ftnb/launch``: a folder the command's host
must see at the same path (the same machine, or the user's home on NFS or a shared volume),
as it must see the caller's code and the experiment's storage. The search space's objects travel
in it by value (the supervisor may run on another machine).

**How the caller learns the start went well**: the supervisor writes a reply file next to the
launch file (the experiment's path, or the exception that stopped it, raised by the caller as
its own). The caller waits for it until ``start_timeout_s`` (``$FTNB_LAUNCHER_TIMEOUT_S``,
default 300 s: a batch queue may hold the job for a while); a command that exits non-zero, or
no reply by then, is a :class:`~ftnb.supervisor.SupervisorError` that shows the command, its
output and the end of the supervisor's log. The command may return at once (``systemd-run``,
``sbatch``) or go on running (``ssh``, a wrapper that ``exec``\\ s the supervisor): either works.
A caller that gives up removes the launch file, so a supervisor that starts later runs nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import string
import subprocess
import time
import uuid
from typing import TYPE_CHECKING, Optional

from . import LauncherError

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..supervisor import LaunchSpec, SupervisorStart

__all__ = ["LAUNCHER_COMMAND_ENV", "LAUNCHER_TIMEOUT_ENV", "LAUNCH_DIR_ENV", "PLACEHOLDERS",
           "CommandLauncher"]

#: The command template when none is given.
LAUNCHER_COMMAND_ENV = "FTNB_LAUNCHER_COMMAND"
#: The folder of launch files (default ``~/.ftnb/launch``).
LAUNCH_DIR_ENV = "FTNB_LAUNCH_DIR"
#: How long to wait for a command-launched supervisor to reply (seconds).
LAUNCHER_TIMEOUT_ENV = "FTNB_LAUNCHER_TIMEOUT_S"
#: The placeholders a template may use (see the module docstring).
PLACEHOLDERS = ("command", "quoted_command", "name", "id", "log", "launch_dir", "python", "cwd")
_REQUIRED = ("command", "quoted_command")
_EXAMPLE = "systemd-run --user --collect --quiet {command}"
_POLL_S = 0.1


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:60]


class CommandLauncher:
    """Starts the supervisor with an admin's command template (see the module docstring).

    ``template``: default ``$FTNB_LAUNCHER_COMMAND``. ``launch_dir``: where the launch file
    goes, a folder the command's host sees (default ``$FTNB_LAUNCH_DIR``, else
    ``~/.ftnb/launch``). ``start_timeout_s``: how long to wait for the supervisor's reply
    (default ``$FTNB_LAUNCHER_TIMEOUT_S``, else 300). The template is checked here: a missing,
    unknown or malformed placeholder, or a program not on ``PATH``, raises
    :class:`~ftnb.launchers.LauncherError` before anything starts.

    Example:
        >>> CommandLauncher("sbatch --job-name=ftnb-{name} --wrap {quoted_command}")  # doctest: +SKIP
    """

    name = "command"
    objects_by_value = True

    def __init__(self, template: Optional[str] = None, *, launch_dir: Optional[str] = None,
                 start_timeout_s: Optional[float] = None) -> None:
        where = "launcher command"
        if template is None:
            template = os.environ.get(LAUNCHER_COMMAND_ENV) or None
            where = f"${LAUNCHER_COMMAND_ENV}"
            if template is None:
                raise LauncherError(
                    f"launcher='command' needs a command template, and none is set. Fix: set "
                    f"{LAUNCHER_COMMAND_ENV} (e.g. {_EXAMPLE!r}), %config "
                    "FtnbMagics.launcher_command, --launcher-command, or pass "
                    "CommandLauncher(template)."
                )
        self.template = template
        self._where = where
        check_template(template, where)
        self.launch_dir = os.path.abspath(os.path.expanduser(
            launch_dir or os.environ.get(LAUNCH_DIR_ENV) or "~/.ftnb/launch"))
        if start_timeout_s is None:
            try:
                start_timeout_s = float(os.environ.get(LAUNCHER_TIMEOUT_ENV) or 300.0)
            except ValueError:
                raise LauncherError(
                    f"${LAUNCHER_TIMEOUT_ENV}={os.environ[LAUNCHER_TIMEOUT_ENV]!r} is not a "
                    "number of seconds. Fix: e.g. 600."
                ) from None
        self.start_timeout_s = start_timeout_s

    def __repr__(self) -> str:
        return f"CommandLauncher({self.template!r})"

    def prepare(self, run_config: "RunConfig") -> "RunConfig":
        return run_config

    def check(self, run_config: "RunConfig") -> None:
        pass  # (the template was checked when this launcher was made)

    def command_for(self, argv: list, **values: str) -> list:
        """The command (a list of words) the template makes for the supervisor's ``argv``;
        ``values``: the other placeholders' values."""
        line = shlex.join(argv)
        quoted = {key: shlex.quote(value) for key, value in values.items()}
        filled = self.template.format(command=line, quoted_command=shlex.quote(line), **quoted)
        return shlex.split(filled)

    def start(self, spec: "LaunchSpec") -> "SupervisorStart":
        from ..objects.folders import remove_if_present
        from ..supervisor import (
            SupervisorError,
            log_tail,
            parse_message,
            reap_in_background,
            started_from,
            supervisor_command,
            supervisor_env,
            write_launch_file,
        )

        os.makedirs(self.launch_dir, mode=0o700, exist_ok=True)
        launch_file = write_launch_file(spec, self.launch_dir)
        base = launch_file[:-len(".pkl")]
        log, reply, output = f"{base}.log", f"{base}.reply", f"{base}.out"
        argv = supervisor_command(launch_file, log, reply_file=reply) + ["--launcher", "command"]
        command = self.command_for(
            argv, name=_safe(spec.name), id=uuid.uuid4().hex[:8], log=log,
            launch_dir=self.launch_dir, python=argv[0], cwd=spec.cwd)
        try:
            with open(output, "wb") as out:
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           cwd=spec.cwd, env=supervisor_env())
        except OSError as exc:
            remove_if_present(launch_file)
            raise SupervisorError(
                f"ftnb: the launcher command {shlex.join(command)} could not be run: {exc}. "
                f"Fix: check the template ({self._where}={self.template!r})."
            ) from None
        reap_in_background(process)
        deadline = time.monotonic() + self.start_timeout_s
        why = None
        while True:
            message = _read_reply(reply, parse_message)
            if message is not None:
                break
            code = process.poll()
            if code not in (None, 0):
                # Give a supervisor that replied just before the command failed its say.
                message = _read_reply(reply, parse_message)
                if message is not None:
                    break
                why = f"the launcher command exited with code {code}"
                break
            if time.monotonic() >= deadline:
                why = (f"no supervisor started within {self.start_timeout_s:.0f} s "
                       f"(${LAUNCHER_TIMEOUT_ENV} waits longer)")
                break
            time.sleep(_POLL_S)
        if message is None:
            remove_if_present(launch_file)  # a supervisor that starts after all finds nothing to run
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except OSError:
                    pass
            raise SupervisorError(
                f"ftnb: {why} before the experiment {spec.name!r} started.\n"
                f"The command: {shlex.join(command)}\n"
                f"Its output ({output}):\n{log_tail(output)}\n"
                f"The end of the supervisor's log ({log}):\n"
                f"{log_tail(log) if os.path.exists(log) else '(none: it never started)'}"
            )
        remove_if_present(reply)
        remove_if_present(output)
        started = started_from(message, None, "")
        started.where += f", started by {command[0]}"
        return started


def check_template(template: object, where: str = "launcher command") -> None:
    """Raise :class:`~ftnb.launchers.LauncherError` unless ``template`` is a command template
    that can work (see the module docstring); ``where`` names where it was set."""
    if not isinstance(template, str) or not template.strip():
        raise LauncherError(
            f"{where}={template!r} is not a command template. Fix: e.g. {_EXAMPLE!r}."
        )
    try:
        fields = [f for f in string.Formatter().parse(template) if f[1] is not None]
    except ValueError as exc:
        raise LauncherError(
            f"{where}={template!r} has a stray brace ({exc}). Fix: placeholders are "
            "{command}, {quoted_command}, ...; write a literal brace as {{ or }}."
        ) from None
    known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    for _, field_name, spec, conversion in fields:
        if field_name not in PLACEHOLDERS or spec or conversion:
            shown = "{" + field_name + (f"!{conversion}" if conversion else "") + (
                f":{spec}" if spec else "") + "}"
            raise LauncherError(
                f"{where}={template!r}: {shown} is not a placeholder ftnb fills. Fix: use "
                f"{known} (a literal brace is {{{{ or }}}})."
            )
    if not any(f[1] in _REQUIRED for f in fields):
        raise LauncherError(
            f"{where}={template!r} has no {{command}} (or {{quoted_command}}) placeholder, so "
            "the supervisor's command would go nowhere. Fix: put it where the command to run "
            f"goes, e.g. {_EXAMPLE!r}."
        )
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise LauncherError(f"{where}={template!r} cannot be split into words: {exc}. Fix: "
                            "close the quote.") from None
    program = words[0] if words else ""
    if "{" not in program and shutil.which(program) is None:
        raise LauncherError(
            f"{where}={template!r}: the program {program!r} is not found "
            f"{'' if os.sep in program else 'on PATH '}here. Fix: install it, or give its "
            "full path in the template."
        )


def _read_reply(path: str, parse: object) -> Optional[dict]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return parse(data)  # type: ignore[operator]
