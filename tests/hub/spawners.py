"""The JupyterHub tests' spawner: a user's server stopped as real hubs stop theirs.

:class:`IsolatingSpawner` runs ``jupyterhub-singleuser`` as the current (root) user, as
JupyterHub's :class:`~jupyterhub.spawner.SimpleLocalProcessSpawner` does (its home is
``/tmp/<name>``; no system user is needed), with one of two isolations, chosen per start by
the ``isolation`` user option (the REST API's ``POST /users/<name>/server`` body):

``cgroup`` (the default), as SystemdSpawner and The Littlest JupyterHub stop a server (systemd's
``KillMode=control-group``): the server runs in a cgroup v2 child of its own; the stop sends
SIGTERM to every process in it, waits up to ``stop_grace_s`` for them to exit, then kills what
is left with ``cgroup.kill``. Where no cgroup v2 hierarchy is writable (or
``FTNB_HUB_UNITS=environment`` says so), the "unit" is every process whose environment carries
the server's unit id (inherited by every descendant, ``setsid`` ones and orphans too), found
through ``/proc``, stopped the same way.

``pidns``, as DockerSpawner and KubeSpawner stop a container: the server runs as PID 1 of a PID
namespace of its own (``unshare --pid --fork --mount-proc``); the stop SIGKILLs that PID 1, and
the kernel kills every process of the namespace at once (no SIGTERM reaches anyone).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Float

#: The environment variable that marks a server's processes where no cgroup can be made.
UNIT_ENV = "FTNB_TEST_SERVER_UNIT"


def cgroup2_root() -> str | None:
    """A writable cgroup v2 hierarchy (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a
    hybrid host), or None."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for fields in mounts:
        if len(fields) > 2 and fields[2] == "cgroup2":
            probe = os.path.join(fields[1], f"ftnb-probe-{os.getpid()}")
            try:
                os.mkdir(probe)
                os.rmdir(probe)
            except OSError:
                continue
            if os.path.exists(os.path.join(fields[1], "cgroup.procs")):
                return fields[1]
    return None


def unit_pids(unit: str) -> list[int]:
    """The processes whose environment carries ``UNIT_ENV=unit``."""
    marker = f"{UNIT_ENV}={unit}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


class ProcessGroupUnit:
    """The processes of one stoppable unit: a cgroup v2 child if one can be made here, else
    the processes marked with ``UNIT_ENV``. ``kind``: ``"cgroup"`` or ``"environment"``."""

    def __init__(self, name: str) -> None:
        self.name = name
        root = None if os.environ.get("FTNB_HUB_UNITS") == "environment" else cgroup2_root()
        self.path = os.path.join(root, name) if root else None
        if self.path:
            os.makedirs(self.path, exist_ok=True)
        self.kind = "cgroup" if self.path else "environment"

    def join(self) -> None:
        """Move the calling process into the unit (a spawned process's preexec_fn)."""
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write("0")

    def pids(self) -> list[int]:
        if self.path:
            try:
                with open(os.path.join(self.path, "cgroup.procs")) as f:
                    return [int(line) for line in f if line.strip()]
            except FileNotFoundError:
                return []
        return unit_pids(self.name)

    def signal_all(self, sig: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL every process of the unit (``cgroup.kill``, Linux 5.14+: none escapes by
        forking; else each process found)."""
        if self.path and os.path.exists(os.path.join(self.path, "cgroup.kill")):
            with open(os.path.join(self.path, "cgroup.kill"), "w") as f:
                f.write("1")
        else:
            self.signal_all(signal.SIGKILL)

    def remove(self) -> None:
        if self.path:
            try:
                os.rmdir(self.path)
            except OSError:
                pass


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] == "Z"
    except OSError:
        return True


class IsolatingSpawner(SimpleLocalProcessSpawner):
    """A local server stopped cgroup-wide or as a container is (see the module docstring)."""

    stop_grace_s = Float(5.0, config=True,
                         help="How long a cgroup-wide stop waits after SIGTERM before SIGKILL.")

    unit: ProcessGroupUnit | None = None

    @property
    def isolation(self) -> str:
        return (self.user_options or {}).get("isolation", "cgroup")

    def get_env(self):
        env = super().get_env()
        if self.isolation == "cgroup":
            self.unit = ProcessGroupUnit(f"ftnb-hub-{self.user.name}-{uuid.uuid4().hex[:8]}")
            env[UNIT_ENV] = self.unit.name
        return env

    def make_preexec_fn(self, name):
        parent = super().make_preexec_fn(name)
        unit = self.unit if self.isolation == "cgroup" else None

        def preexec():
            if unit is not None:
                unit.join()
            parent()

        return preexec

    async def start(self):
        if self.isolation not in ("cgroup", "pidns"):
            raise ValueError(f"isolation={self.isolation!r}: use 'cgroup' or 'pidns'")
        if self.isolation == "pidns":
            self.cmd = ["unshare", "--pid", "--fork", "--mount-proc", *self.cmd]
        return await super().start()

    def namespace_init_pid(self) -> int | None:
        """The host PID of the server's namespace PID 1: ``unshare``'s child."""
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                children = f.read().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    async def _wait(self, done, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return True
            await asyncio.sleep(0.05)
        return done()

    async def stop(self, now=False):
        if self.isolation == "pidns":
            init = self.namespace_init_pid()
            if init is not None:
                os.kill(init, signal.SIGKILL)
            await self._wait(lambda: self.proc is None or self.proc.poll() is not None, 10)
        elif self.unit is not None:
            unit = self.unit
            if not now:
                unit.signal_all(signal.SIGTERM)
                await self._wait(lambda: all(_zombie(p) for p in unit.pids()), self.stop_grace_s)
            unit.kill()
            await self._wait(lambda: not [p for p in unit.pids() if not _zombie(p)], 10)
            if self.proc is not None:
                self.proc.wait(5)
            await self._wait(lambda: not unit.pids(), 5)
            unit.remove()
        await super().stop(now=True)
