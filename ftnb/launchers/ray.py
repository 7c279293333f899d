"""The ``ray`` launcher: the supervisor as a detached, named Ray actor on the cluster.

The actor (``lifetime="detached"``, ``max_restarts=-1``, no CPU) holds the owner lease and runs
the same controller as a supervisor process (:func:`ftnb.supervisor.host`, in a thread of the
actor), so the experiment outlives the notebook, its kernel and its server: closing the laptop,
culling the JupyterHub server or restarting the kernel leave it running. Its name is derived
from the experiment (:func:`actor_name`: its name and a digest of its folder's URL, in the Ray
namespace ``ftnb``), so a second launch of the same experiment finds the actor and attaches.

If the actor dies (its process killed, its node lost), Ray restarts it with the same launch
file, and it resumes the experiment through the normal restore path: its trials (Ray actors
it owned, which died with it) continue from their latest checkpoints. A restarted actor takes
over the lease of its previous incarnation at once (Ray restarts an actor only once it counts
it dead; fencing stops anything of the old one that still runs). When the experiment ends, the
actor removes itself (no restart).

The launch file (the trainable, the search space with its objects by value, the configs) is kept
in the GCS's key-value store under the actor's name, not passed as the actor's constructor
argument: Ray keeps a large constructor argument only until the actor first starts, so a restart
would fail without it (ray-project/ray#53727). The actor deletes it when it ends.

Trials run on Ray too unless the run config names another executor (``RunConfig(executor=...)``
or ``$FTNB_EXECUTOR``). The cluster: the launcher's ``address``, else the Ray executor's
(``--ray-address``), else ``$RAY_ADDRESS``, else the one this process is connected to, else
``"auto"`` (a cluster started on this machine with ``ray start``). The storage must be reachable
from every node, as for the Ray executor (a local path on a cluster of several nodes is refused
unless declared shared).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from . import LauncherError

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..supervisor import LaunchSpec, SupervisorStart

__all__ = ["NAMESPACE", "RayLauncher", "SupervisorActor", "actor_name"]

#: The Ray namespace of supervisor actors.
NAMESPACE = "ftnb"
_CONNECT_CHECK_S = 3.0
#: How long an actor whose start failed waits for its caller to take the error.
_REPLY_KEPT_S = 30.0


def actor_name(name: str, experiment_uri: str) -> str:
    """The supervisor actor's name for the experiment ``name`` at ``experiment_uri``."""
    digest = hashlib.sha1(experiment_uri.encode("utf-8")).hexdigest()[:12]
    return f"ftnb-supervisor:{name}:{digest}"


class RayLauncher:
    """Starts the supervisor as a detached Ray actor (see the module docstring).

    ``address``: the cluster (see the module docstring for the default). ``start_timeout_s``:
    how long to wait for the actor's controller to run."""

    name = "ray"
    objects_by_value = True

    def __init__(self, address: Optional[str] = None, *, start_timeout_s: float = 300.0,
                 namespace: str = NAMESPACE) -> None:
        self.address = address
        self.start_timeout_s = start_timeout_s
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"RayLauncher(address={self.address!r})"

    # -- before anything starts ------------------------------------------------------------------
    def prepare(self, run_config: "RunConfig") -> "RunConfig":
        """Trials on Ray unless another executor is named; the cluster of ``--ray-address``
        when the launcher has none."""
        from ..execution import EXECUTOR_ENV

        executor = run_config.executor
        if self.address is None:
            self.address = getattr(executor, "address", None) if not isinstance(
                executor, str) else None
        if executor is None and not os.environ.get(EXECUTOR_ENV):
            return dataclasses.replace(run_config, executor="ray")
        return run_config

    def check(self, run_config: "RunConfig") -> None:
        """Ray installed, its cluster reachable (connects to it), and the storage reachable
        from every node (the Ray executor's own check)."""
        from ..execution.one_machine import OneMachineExecutor
        from ..storage import Storage, default_storage_path

        ray = _import_ray()
        self._connect(ray)
        executor = run_config.executor
        # A name, or trials run by the supervisor's own machine (the actor's node, any node):
        # whether every node reaches the storage is what the Ray executor checks.
        if executor is None or isinstance(executor, (str, OneMachineExecutor)):
            from ..execution import executor_class

            executor = executor_class("ray")()
        executor.check_storage(Storage(run_config.storage_path or default_storage_path(),
                                       run_config.storage_filesystem))

    def _connect(self, ray: Any) -> None:
        if ray.is_initialized():
            return
        address = self.address or os.environ.get("RAY_ADDRESS") or "auto"
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
        except Exception as exc:
            raise LauncherError(
                f"launcher='ray' could not connect to a Ray cluster at {address!r}: "
                f"{' '.join(str(exc).split())[:300]} Fix: start one (`ray start --head`), or "
                "give its address: --ray-address ADDR, RAY_ADDRESS, or "
                "RayLauncher(address=...)."
            ) from None

    # -- starting ----------------------------------------------------------------------------------
    def start(self, spec: "LaunchSpec") -> "SupervisorStart":
        from ..storage import ExperimentPaths, Storage, default_storage_path
        from ..supervisor import SupervisorError, launch_bytes, started_from

        ray = _import_ray()
        self._connect(ray)
        rc = spec.run_config
        paths = ExperimentPaths.of(Storage(spec.storage_path or default_storage_path(),
                                           getattr(rc, "storage_filesystem", None)), spec.name)
        name = actor_name(spec.name, paths.uri)
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(_launch_key(name), launch_bytes(spec), overwrite=True,
                         namespace=NAMESPACE)
        actor = ray.remote(SupervisorActor).options(
            name=name, namespace=self.namespace, lifetime="detached", get_if_exists=True,
            max_restarts=-1, max_task_retries=-1, num_cpus=0, max_concurrency=4,
        ).remote(name)
        try:
            message = ray.get(actor.started.remote(self.start_timeout_s),
                              timeout=self.start_timeout_s + 30)
        except Exception as exc:
            _remove(ray, actor, name)
            raise SupervisorError(
                f"ftnb: the supervisor actor {name!r} did not start the experiment "
                f"{spec.name!r}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
            ) from None
        if message is None:
            _remove(ray, actor, name)
            raise SupervisorError(
                f"ftnb: the supervisor actor {name!r} did not start the experiment "
                f"{spec.name!r} within {self.start_timeout_s:.0f} s; it was removed."
            )
        started = started_from(message, None, "")
        started.where = f"Ray actor {name!r}, {started.where}"
        return started


def _launch_key(name: str) -> str:
    """Where the GCS keeps the launch file of the supervisor actor ``name``."""
    return f"launch:{name}"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LauncherError(
            "launcher='ray' needs the 'ray' package, which is not installed. Fix: pip install "
            "'ftnb[ray]', or use launcher='local' or 'command'."
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """A ``host:port`` address that nothing answers on is refused in seconds (``ray.init``
    would try for a minute)."""
    if "://" in address or address == "auto" or ":" not in address:
        return
    host_name, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host_name, int(port)), timeout=_CONNECT_CHECK_S):
            return
    except (OSError, ValueError) as exc:
        raise LauncherError(
            f"launcher='ray': no Ray cluster answers at {address!r} ({exc}). Fix: start one "
            "(`ray start --head`), or give the address of a running one (--ray-address, "
            "RAY_ADDRESS)."
        ) from None


def _remove(ray: Any, actor: Any, name: str) -> None:
    """Remove a supervisor actor that could not start, and its launch file."""
    from ray.experimental.internal_kv import _internal_kv_del

    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass
    _internal_kv_del(_launch_key(name), namespace=NAMESPACE)


# -- the actor ---------------------------------------------------------------------------------
class SupervisorActor:
    """The supervisor on the cluster (made a Ray actor class on use). Its constructor starts
    the experiment in a thread (Ray runs it again, with the same launch file, when it restarts
    the actor); :meth:`started` says how the start went."""

    def __init__(self, name: str) -> None:
        import ray
        from ray.experimental.internal_kv import _internal_kv_get

        from ..supervisor import log_to
        from .temp_folders import private_temp_folder, sweep_temp_folders

        context = ray.get_runtime_context()
        self._restarted = bool(context.was_current_actor_reconstructed)
        self._name = name
        self._message: Optional[dict] = None
        self._replied = threading.Event()
        self._asked = threading.Event()  # the caller took the reply
        fd, self._log = tempfile.mkstemp(prefix="ftnb-supervisor-", suffix=".log")
        os.close(fd)
        log_to(self._log)  # (this process is the actor's alone: its output is the log)
        print(f"ftnb supervisor pid {os.getpid()} on {socket.gethostname()}, Ray actor "
              f"{name!r}{' restarted by Ray' if self._restarted else ''}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
        sweep_temp_folders()
        private_temp_folder()
        launch = _internal_kv_get(_launch_key(name), namespace=NAMESPACE)
        extra = {"actor": name, "namespace": NAMESPACE, "node_id": context.get_node_id()}
        self._thread = threading.Thread(target=self._run, args=(launch, extra),
                                        name="ftnb-supervisor", daemon=True)
        self._thread.start()

    def _run(self, launch: Optional[bytes], extra: dict) -> None:
        import ray
        from ray.experimental.internal_kv import _internal_kv_del

        from ..supervisor import Reply, host

        takeover = _previous_incarnation(self._name) if self._restarted else None
        try:
            if launch is None:
                print(f"ftnb: the launch file of {self._name!r} is gone from the GCS; nothing "
                      "to run.", flush=True)
            else:
                host(launch, Reply(callback=self._reply), self._log, launcher="ray",
                     extra=extra, takeover_from=takeover)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            self._reply(None)
            if self._message is None or "error" in self._message:
                # A start that failed: let the caller take the error before the actor goes.
                self._asked.wait(_REPLY_KEPT_S)
                time.sleep(0.5)
            # Done (finished, stopped, failed): no restart, and the name is free again.
            _internal_kv_del(_launch_key(self._name), namespace=NAMESPACE)
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def _reply(self, message: Optional[dict]) -> None:
        if not self._replied.is_set():
            self._message = message
            self._replied.set()

    def started(self, timeout: float) -> Optional[dict]:
        """The supervisor's reply (see :class:`ftnb.supervisor.Reply`) once it has one, else
        None after ``timeout`` seconds."""
        self._replied.wait(timeout)
        self._asked.set()
        return self._message

    def pid(self) -> int:
        """The actor's process id (on its node)."""
        return os.getpid()


def _previous_incarnation(name: str) -> Any:
    """``takeover_from`` of a restarted actor: whether the experiment's owner is the actor's
    previous incarnation (``supervisor.json`` names this actor, and the owner's process is the
    one it recorded)."""

    def owned_by_it(paths: Any) -> bool:
        from ..storage.lease import read_lease
        from ..ui.read_model import supervisor_record

        record = supervisor_record(paths)
        lease = read_lease(paths)
        return (lease is not None and not lease.released and record.get("actor") == name
                and (lease.pid, lease.host_id) == (record.get("pid"), record.get("host_id")))

    return owned_by_it
