"""Experiments that run in the background: :func:`launch`, :func:`attach`, :class:`ExperimentHandle`.

``ftnb.launch(train, ...)`` returns at once: the experiment runs in a detached supervisor
(``ftnb/supervisor.py``) that outlives the kernel: a process of its own on this machine, or,
by the launcher's choice (:mod:`ftnb.launchers`), one an admin's command starts elsewhere, or a
detached Ray actor on a cluster. A handle is only a path: any kernel, or a
script, re-creates it with ``ftnb.attach(name_or_path)`` and can then watch, stop, resume or read
the experiment. The ``%ftrun`` family of magics is a thin layer over this module.

    >>> h = ftnb.launch(train, param_space=space, name="sweep1")   # doctest: +SKIP
    >>> h.status(), h.wait().get_dataframe()                        # doctest: +SKIP

(Over 500 lines because :class:`ExperimentHandle` is the whole public surface of a detached
experiment, one method each for watch, wait, stop, resume and read; launching and attaching are
the two ways to get one.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Optional

from .config import RunConfig, TuneConfig
from .core.records import FINISHED_STATUSES, ExperimentState, ExperimentStatus, TrialStatus
from .input_checks import keywords_after
from .storage import ExperimentPaths, Storage, default_storage_path
from .ui import read_model
from .wording import ftnb_command

__all__ = ["DriverSilentError", "ExperimentHandle", "ExperimentNotFoundError", "attach", "launch"]

_POLL_S = 0.2
_SUPERVISOR_EXIT_S = 10.0


class ExperimentNotFoundError(ValueError):
    """No ftnb experiment where the caller pointed."""


class DriverSilentError(TimeoutError):
    """A stop that cannot be seen through: the experiment's driver is silent (no heartbeat, its
    death not provable from here: its container killed, or it is stopped), so it may never read
    the request. The request stands (a driver that wakes honours it); the experiment is not
    stopped yet. ``silent_s``: for how long it has been silent; ``dead_in_s``: in how many
    seconds it counts as dead (None: never on its own, a process stopped on this machine);
    ``takeover``: the line that takes it over now."""

    def __init__(self, message: str, silent_s: float, dead_in_s: Optional[float],
                 takeover: str) -> None:
        super().__init__(message)
        self.silent_s = silent_s
        self.dead_in_s = dead_in_s
        self.takeover = takeover


# -- starting and finding experiments ----------------------------------------------------------
@keywords_after("ftnb.launch", "param_space")
def launch(
    trainable: Callable[[dict], Any],
    *,
    param_space: Optional[Mapping[str, Any]] = None,
    name: Optional[str] = None,
    storage_path: Optional[str] = None,
    tune_config: Optional[TuneConfig] = None,
    run_config: Optional[RunConfig] = None,
    resources_per_trial: Any = None,
    restart_errored: bool = False,
    allow_different_trainable: bool = False,
    wait: bool = False,
    origin: Optional[dict] = None,
    quiet: bool = False,
    launcher: Any = None,
) -> "ExperimentHandle":
    """Run an experiment in the background and return its handle at once.

    The arguments are :class:`ftnb.Tuner`'s (``name`` and ``storage_path`` override those of
    ``run_config``). The controller runs in a detached supervisor process with its own log
    (``<experiment>/supervisor.log``): restarting, interrupting or culling the kernel does not
    stop the experiment, and its ``ftnb.put`` objects live on in the supervisor.

    When an experiment of that name exists: if it is running, the handle attaches to it; if not
    (it was interrupted, its supervisor died), it is resumed as :func:`ftnb.run` does (errored
    trials continue from their latest checkpoint, or start over with ``restart_errored``),
    with ``param_space`` giving the objects again. Either way one line says so. A trainable
    named otherwise than the experiment's is refused unless ``allow_different_trainable``.

    Bad input raises here, before anything starts. ``wait=True`` blocks until the experiment
    ends. ``origin`` records where the trainable and space came from (names in the caller's
    namespace, e.g. ``{"trainable": "train", "param_space": "space"}``), so that a new kernel
    can resume with them (:meth:`ExperimentHandle.resume`).

    ``launcher`` decides where the supervisor runs (:mod:`ftnb.launchers`): ``"local"`` (a
    process on this machine), ``"command"`` (an admin's command template,
    ``$FTNB_LAUNCHER_COMMAND``), ``"ray"`` (a detached Ray actor on the cluster; trials then run
    on Ray too unless ``run_config`` names another executor), or a launcher object such as
    ``CommandLauncher("systemd-run --user --collect {command}")``. Default: ``$FTNB_LAUNCHER``,
    else ``"local"``. A launcher that cannot work raises :class:`ftnb.launchers.LauncherError`
    here, before anything starts.
    """
    from . import supervisor
    from .input_checks import check_trainable
    from .launchers import launcher_for
    from .launchers.temp_folders import sweep_temp_folders
    from .objects import bind_objects
    from .objects.cell_source import carry_cell_source
    from .storage.lease import ExperimentLockedError
    from .tuner import check_new_experiment, start_or_resume

    chosen = launcher_for(launcher)
    check_trainable(trainable, "ftnb.launch")
    carry_cell_source(trainable)  # its traceback in a trial shows the notebook cell's lines
    # Recorded, so that a new kernel finds the trainable again (%ftresume, handle.resume()).
    origin = origin or {"trainable": getattr(trainable, "__name__", None)}
    rc = _launch_run_config(trainable, run_config, name, storage_path, chosen)
    existing = _existing_experiment(rc, wait, quiet)
    if existing is not None:
        return existing
    sweep_temp_folders()  # of supervisors SIGKILLed on this machine
    # Objects go to this machine's object store once; a supervisor here adopts them (one
    # elsewhere gets them by value, in the launch file).
    space = bind_objects(param_space)[0] if param_space is not None else None
    # Check everything here, where the error belongs, before a process is spawned.
    tuner, resuming = start_or_resume(
        trainable, name=rc.name, param_space=space, storage_path=rc.storage_path,
        tune_config=tune_config, run_config=rc, resources_per_trial=resources_per_trial,
        restart_errored=restart_errored, allow_different_trainable=allow_different_trainable,
        caller="ftnb.launch")
    note = ""
    if not resuming:
        plan = check_new_experiment(tuner)
        rc, note = dataclasses.replace(rc, name=plan.name), plan.concurrency_note
    spec = supervisor.LaunchSpec(
        trainable=trainable, name=rc.name,
        param_space=param_space if chosen.objects_by_value else space,
        storage_path=rc.storage_path, tune_config=tune_config, run_config=rc,
        resources_per_trial=resources_per_trial, restart_errored=restart_errored,
        allow_different_trainable=allow_different_trainable, origin=origin,
        launcher=chosen.name)
    try:
        started = chosen.start(spec)
    except ExperimentLockedError:
        existing = _live_handle(rc)  # another launch won the race: watch that one
        if existing is None:
            raise
        existing._say(f"ftnb: experiment {rc.name!r} was just started by another launch "
                      f"({existing._owner_text()}); attached to it.", quiet)
        return existing._finish_launch(wait)
    handle = ExperimentHandle(
        ExperimentPaths.of(_storage(rc), rc.name), trainable=trainable, param_space=param_space,
        space_refs=space, process=started.process)
    if started.resuming:
        handle._say(started.resuming, quiet)
    handle._say(f"ftnb: experiment {rc.name!r} runs in the background (supervisor "
                f"{started.where}, log {started.log})", quiet)
    if note:
        handle._say(note, quiet)
    return handle._finish_launch(wait)


def _launch_run_config(trainable: Any, run_config: Optional[RunConfig], name: Optional[str],
                       storage_path: Optional[str], chosen: Any) -> RunConfig:
    """The run config a launch runs with: ``run_config`` (or a TorchTrainer's own: name,
    storage, failure config), with ``name`` and ``storage_path`` over it and the storage path
    spelled out, as the launcher ``chosen`` prepares and checks it."""
    if run_config is None:  # a TorchTrainer brings its own (name, storage, failure config)
        run_config = getattr(trainable, "run_config", None) if getattr(
            trainable, "_ftnb_trainer", False) else None
    rc = run_config if run_config is not None else RunConfig()
    if not isinstance(rc, RunConfig):
        raise TypeError(f"ftnb.launch(run_config=...) must be an ftnb.RunConfig; got {rc!r}.")
    # The path itself, not $FTNB_STORAGE_PATH: a supervisor elsewhere may not have that variable.
    rc = dataclasses.replace(rc, name=name or rc.name,
                             storage_path=storage_path or rc.storage_path or default_storage_path())
    rc = chosen.prepare(rc)
    chosen.check(rc)
    return rc


def _existing_experiment(rc: RunConfig, wait: bool, quiet: bool) -> Optional["ExperimentHandle"]:
    """The handle a launch returns without starting anything, saying so: the experiment named
    ``rc.name`` is running (attached to it) or finished; None when there is one to start or
    resume."""
    if not rc.name:
        return None
    existing = _live_handle(rc)
    if existing is not None:
        existing._say(f"ftnb: experiment {rc.name!r} is already running "
                      f"({existing._owner_text()}); attached to it.", quiet)
        return existing._finish_launch(wait)
    finished = finished_experiment(rc)
    if finished is not None:
        finished._say(f"ftnb: experiment {rc.name!r} already finished; attached to it "
                      "(nothing to resume).", quiet)
    return finished


def attach(name_or_path: Any, *, storage_path: Optional[str] = None,
           storage_filesystem: Any = None) -> "ExperimentHandle":
    """The handle of an existing experiment, running or not, from any process: by ``name``
    under ``storage_path`` (default ``$FTNB_STORAGE_PATH`` or ``~/ftnb_results``), or by its
    folder (a local path or a URL such as ``s3://bucket/exps/sweep1``)."""
    text = os.fspath(name_or_path) if isinstance(name_or_path, os.PathLike) else name_or_path
    if not isinstance(text, str) or not text:
        raise ExperimentNotFoundError(
            f"ftnb.attach({name_or_path!r}): give an experiment's name or its folder, e.g. "
            "ftnb.attach('sweep1') or ftnb.attach('s3://bucket/exps/sweep1')."
        )
    root = storage_path or default_storage_path()
    paths = read_model.experiment_paths(text, root, storage_filesystem)
    if not paths.has_state():
        if paths.name != text:
            raise ExperimentNotFoundError(
                f"No ftnb experiment in that folder ({paths.uri}). Fix: check the path; "
                f"`{ftnb_command()} ls FOLDER` (or `%ftls FOLDER`) lists the experiments under a "
                "storage path.")
        # (Not `%ftls`: a notebook's magics may list another storage path.)
        raise ExperimentNotFoundError(
            f"No ftnb experiment named {text!r} under {root} ({paths.uri}). Fix: check the "
            f"name (`{ftnb_command()} ls {root}` lists them), or give the storage path it is "
            "under (storage_path=..., --storage).")
    return ExperimentHandle(paths)


def _storage(rc: RunConfig) -> Storage:
    return Storage(rc.storage_path or default_storage_path(), rc.storage_filesystem)


def _live_handle(rc: RunConfig) -> Optional["ExperimentHandle"]:
    paths = ExperimentPaths.of(_storage(rc), rc.name)
    if not paths.has_state():
        return None
    handle = ExperimentHandle(paths)
    return handle if handle.is_live() else None


def finished_experiment(rc: RunConfig) -> Optional["ExperimentHandle"]:
    """The handle of experiment ``rc.name`` (under ``rc.storage_path``) if a resume would run
    none of its trials (all TERMINATED: errored ones are resumed, or restarted), else None.
    :func:`launch` and ``ftnb run``/``ftnb resume`` attach to it instead of resuming."""
    paths = ExperimentPaths.of(_storage(rc), rc.name)
    if not paths.has_state():
        return None
    try:
        state = read_model.read_state(paths)
    except Exception:
        return None  # restore will say what is wrong with it
    if state.trials and all(t.status == TrialStatus.TERMINATED for t in state.trials):
        return ExperimentHandle(paths)
    return None


# -- the handle ----------------------------------------------------------------------------------
class ExperimentHandle:
    """An experiment, by its folder: its status, results, live view and controls.

    Holds nothing but the path (and, when this process launched it, the trainable and objects
    to resume it with), so it can be re-created anywhere with :func:`ftnb.attach`. Every method
    reads the experiment directory; ``stop`` and ``stop_trial`` send requests that the running
    driver picks up (:mod:`ftnb.storage.control`).
    """

    def __init__(self, paths: ExperimentPaths, *, trainable: Any = None, param_space: Any = None,
                 space_refs: Any = None, process: Any = None) -> None:
        self.paths = paths
        self._trainable = trainable
        self._param_space = param_space
        self._space_refs = space_refs  # keeps this process's refs (hence their files) alive
        self._process = process

    # -- what it is ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.paths.name

    @property
    def path(self) -> str:
        return self.paths.uri

    def state(self) -> ExperimentState:
        """The experiment's state as its files have it (trial records merged)."""
        return read_model.read_state(self.paths)

    def is_live(self) -> bool:
        """Whether a driver (a supervisor, or a script's ``fit()``) owns it and is alive."""
        return read_model.read_driver(self.paths).alive

    def status(self) -> ExperimentStatus:
        """RUNNING, FINISHED, ERRORED or INTERRUPTED, always an :class:`ExperimentStatus`
        (``h.status() == "FINISHED"`` holds; ``h.status().is_finished()`` too). A state that
        says RUNNING whose driver is gone (killed, its machine lost) is INTERRUPTED: resume it
        (:meth:`resume`)."""
        return read_model.read_status(self.paths)

    @property
    def resume_line(self) -> str:
        """The one line that resumes this experiment. For one launched with ``%ftrun`` or
        ``ftnb.launch``: ``%ftresume NAME`` where the magics are loaded, else the Python line
        ``ftnb.attach(PATH).resume(train, param_space=space)`` (the recorded names); for one
        run by ``Tuner.fit()``, the ``Tuner.restore`` call (:func:`ftnb.ui.read_model.resume_line`)."""
        return read_model.resume_line(self.paths, ExperimentState.load(self.paths))

    @property
    def resume_code(self) -> str:
        """The Python call that resumes it (with the trainable under its recorded name)."""
        return f"ftnb.attach({self.path!r}).resume()"

    @property
    def supervisor_log(self) -> Optional[str]:
        """The supervisor's log file, when a supervisor ran this experiment
        (:func:`ftnb.ui.read_model.supervisor_log`)."""
        return read_model.supervisor_log(self.paths)

    def _supervisor_record(self) -> dict:
        """``supervisor.json`` (empty when no supervisor ran this experiment)."""
        return read_model.supervisor_record(self.paths)

    def _owner(self) -> Any:
        from .storage.lease import live_lease

        return live_lease(self.paths)

    def _owner_text(self) -> str:
        owner = self._owner()
        return f"pid {owner.pid} on {owner.host}" if owner is not None else "no live driver"

    # -- waiting and results -------------------------------------------------------------------
    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the experiment ends (finished, errored, or interrupted) and its driver
        let go of it, and return its :class:`ftnb.ResultGrid`. Ctrl+C stops the waiting, not
        the experiment."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while self.is_live():
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"experiment {self.name!r} is still running after {timeout} s "
                        f"(ftnb.attach({self.path!r}).wait() waits again)."
                    )
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            magic = f" or %ftstop {self.path}" if read_model.ftnb_magics_loaded() else ""
            print(f"ftnb: stopped waiting; experiment {self.name!r} goes on in the background "
                  f"(stop it with handle.stop(){magic}).", file=sys.stderr)
            raise
        self.wait_for_supervisor_exit(deadline)
        return self.results()

    def wait_for_supervisor_exit(self, deadline: Optional[float] = None) -> None:
        """After its driver let go, a supervisor on this machine still records its outcome in
        ``supervisor.json`` and its log, then exits (milliseconds): wait for that too, so both
        are complete when :meth:`wait` returns (10 s at most, and never past ``deadline``, a
        :func:`time.monotonic` time). ``ftnb logs --follow`` waits so for the log's last lines."""
        from .system.processes import host_id, process_state

        limit = time.monotonic() + _SUPERVISOR_EXIT_S
        if deadline is not None:
            limit = min(limit, deadline)
        if self._process is not None:  # launched from here: its own child
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=max(0.0, limit - time.monotonic()))
            return
        record = self._supervisor_record()
        if not record.get("pid") or record.get("host_id") != host_id():
            return
        while (time.monotonic() < limit
               and process_state(record["pid"], record.get("pid_start")) == "running"):
            time.sleep(0.02)

    def results(self) -> Any:
        """The results as they stand (:class:`ftnb.ResultGrid`; ``get_dataframe()``)."""
        from .result import ResultGrid

        return ResultGrid(self.paths, self.state())

    def monitor(self) -> Any:
        """A new incremental reader of the experiment (:class:`ftnb.ui.monitor.ExperimentMonitor`)."""
        from .ui.monitor import ExperimentMonitor

        return ExperimentMonitor(self.paths)

    # -- controls ------------------------------------------------------------------------------
    def stop(self, wait: bool = True, timeout: float = 60.0) -> None:
        """Stop the experiment cleanly: running trials end at their next report (or are killed
        after the grace period) and are PAUSED; the experiment is INTERRUPTED, resumable.

        While waiting, a driver that is or goes silent (:meth:`silent_driver`: it may never
        read the request) raises :class:`DriverSilentError` at once, saying for how long it
        has been silent, when it counts as dead and the line that takes it over; the request
        stays written, so a driver that wakes still stops."""
        from .storage.control import STOP_EXPERIMENT, send_request

        owner = self._owner()
        if owner is None:
            self._say(f"ftnb: experiment {self.name!r} is not running ({self.status()}); "
                      "nothing to stop.", False)
            return
        send_request(self.paths, STOP_EXPERIMENT, epoch=owner.epoch)
        if wait:  # until the driver let go of it too: a resume right after must not find it live
            self._wait_until(lambda: not self.is_live(), timeout, "stop",
                             give_up=self.silent_driver)

    def silent_driver(self, context: Any = None, trial_id: Optional[str] = None
                      ) -> Optional[DriverSilentError]:
        """Why a stop cannot be seen through now, as the error :meth:`stop` raises, when the
        experiment's driver is silent (alive as far as can be proven, no heartbeat: see
        :class:`ftnb.ui.status.DriverStatus`); None while it beats, or no driver holds it.
        ``context``: how to word the takeover line (:class:`ftnb.ui.read_model.ResumeContext`;
        default: where this runs); ``trial_id``: the stop was of that trial."""
        driver = read_model.read_driver(self.paths)
        if not driver.silent:
            return None
        line = read_model.resume_line(self.paths, ExperimentState.load(self.paths), context,
                                      takeover=True)
        what = f"experiment {self.name!r}"
        if trial_id is not None:
            what = f"trial {trial_id} of {what}"
        return DriverSilentError(
            f"ftnb: {what} is not stopped yet: its driver is silent "
            f"({driver.why}), so it may never read the stop request. The request stands: a "
            f"driver that wakes stops then. Take it over now with: {line}",
            driver.silent_s or 0.0, driver.dead_in_s, line)

    def stop_trial(self, trial_id: str, wait: bool = True, timeout: float = 60.0) -> None:
        """Stop one trial cleanly (TERMINATED, with what it reported); the others go on."""
        from .storage.control import STOP_TRIAL, send_request

        trial = self._trial(trial_id)
        if trial.status in FINISHED_STATUSES:
            self._say(f"ftnb: trial {trial_id} already ended ({trial.status}).", False)
            return
        owner = self._owner()
        if owner is None:
            raise RuntimeError(
                f"ftnb: experiment {self.name!r} is not running ({self.status()}), so no driver "
                f"can stop trial {trial_id}. It will not run until the experiment is resumed "
                f"({self.resume_line})."
            )
        send_request(self.paths, STOP_TRIAL, trial_id, epoch=owner.epoch)
        if wait:
            self._wait_until(lambda: self._trial(trial_id).status in FINISHED_STATUSES
                             or not self.is_live(), timeout, f"stop trial {trial_id}",
                             give_up=lambda: self.silent_driver(trial_id=trial_id))

    def resume(self, trainable: Any = None, *, param_space: Any = None,
               restart_errored: bool = False, allow_different_trainable: bool = False,
               wait: bool = False, takeover: bool = False,
               namespace: Optional[dict] = None, quiet: bool = False,
               launcher: Any = None) -> "ExperimentHandle":
        """Resume an interrupted experiment in a new supervisor (a running one is left alone).

        ``trainable`` and ``param_space`` default to the ones this process launched it with,
        else to the names it was launched under (``%ftrun``'s), looked up in ``namespace``
        (default: the notebook's, ``__main__``), else to the trainable's own name there.

        ``takeover=True`` first takes the experiment over at once from a driver that still
        counts as alive but is silent (its machine or container was killed less than the lease
        TTL ago, or it is stopped: the snapshot's ``takeover`` says so), instead of waiting for
        it to count as dead; the old driver is fenced and can write nothing more. Refused
        (:class:`ftnb.ExperimentLockedError`) while that driver runs on this machine. What a
        front end's "take over" button calls. ``launcher``: where the new supervisor runs, as
        for :func:`launch`."""
        driver = read_model.read_driver(self.paths)
        if driver.alive and not takeover:
            if driver.silent:
                line = read_model.resume_line(self.paths, ExperimentState.load(self.paths),
                                              takeover=True)
                self._say(f"ftnb: experiment {self.name!r} still has a driver, silent: "
                          f"{driver.why}. Nothing to resume until then; take it over now with: "
                          f"{line}", quiet)
            else:
                self._say(f"ftnb: experiment {self.name!r} is running ({self._owner_text()}); "
                          "nothing to resume.", quiet)
            return self
        found_trainable, found_space = self._from_namespace(namespace)
        trainable = trainable or self._trainable or found_trainable
        if param_space is None:
            param_space = self._param_space if self._param_space is not None else found_space
        if trainable is None:
            raise ValueError(
                f"ftnb: cannot resume {self.name!r} without its trainable: "
                f"{self._origin_text()} is not defined here. Fix: run the cell that defines it, "
                f"or pass it: ftnb.attach({self.path!r}).resume(train)."
            )
        if param_space is None and not getattr(trainable, "_ftnb_trainer", False):
            # (A TorchTrainer brings its datasets: the restore takes them from it.)
            self._check_space_not_needed()
        if takeover:
            from .lifecycle.own import take_over_driver

            said = take_over_driver(self.paths)
            if said:
                self._say(said, quiet)
        return launch(trainable, param_space=param_space, name=self.name,
                      storage_path=self.paths.parent_uri,
                      run_config=RunConfig(storage_filesystem=self._filesystem()),
                      restart_errored=restart_errored,
                      allow_different_trainable=allow_different_trainable, wait=wait, quiet=quiet,
                      origin=self._origin(), launcher=launcher)

    def objects_needed_to_resume(self) -> list[tuple[str, str]]:
        """The objects (key, type) of the search space that the trials a resume would run hold
        and that are not saved with the experiment: the space must be given again for them."""
        from .lifecycle.rebinding import needed_objects, stored_configs

        state = self.state()
        to_run = {t.trial_id for t in state.trials if t.status != TrialStatus.TERMINATED.value}
        return needed_objects(stored_configs(state, to_run))

    def _check_space_not_needed(self) -> None:
        """Resuming without a space: name the variable to define when the trials need objects
        of it (a notebook's widget button resumes this way), before restore's own error."""
        from .lifecycle.stored import RestoreError

        needed = self.objects_needed_to_resume()
        if not needed:
            return
        keys = ", ".join(f"{key} ({kind})" for key, kind in needed)
        name = self._origin().get("param_space")
        define = (f"define {name!r} (the search space it was started with, those objects "
                  "re-created) and resume again, or pass it: " if name else "pass ")
        raise RestoreError(
            f"ftnb: cannot resume {self.name!r} without its search space: its trials hold "
            f"objects that are not saved with the experiment ({keys}). Fix: {define}"
            f"ftnb.attach({self.path!r}).resume(param_space=space)."
        )

    def _origin(self) -> dict:
        try:
            state = ExperimentState.load(self.paths)
        except Exception:
            return {}
        origin = dict(state.settings.get("origin") or {})
        origin.setdefault("trainable", state.trainable.rsplit(".", 1)[-1] if state.trainable
                          else None)
        return origin

    def _origin_text(self) -> str:
        name = self._origin().get("trainable")
        return f"the function {name!r}" if name else "the trainable"

    def _from_namespace(self, namespace: Optional[dict]) -> tuple[Any, Any]:
        if namespace is None:
            main = sys.modules.get("__main__")
            namespace = vars(main) if main is not None else {}
        origin = self._origin()
        trainable = namespace.get(origin.get("trainable") or "")
        space = namespace.get(origin.get("param_space") or "")
        return (trainable if callable(trainable) else None,
                space if isinstance(space, Mapping) else None)

    def _filesystem(self) -> Any:
        return self.paths.storage.user_filesystem

    def _trial(self, trial_id: str) -> Any:
        state = self.state()
        for trial in state.trials:
            if trial.trial_id == trial_id:
                return trial
        ids = [t.trial_id for t in state.trials]
        shown = ", ".join(ids[:5]) + (f" ... ({len(ids)} trials)" if len(ids) > 5 else "")
        raise ValueError(f"experiment {self.name!r} has no trial {trial_id!r}; its trials: {shown}.")

    def _wait_until(self, condition: Callable[[], bool], timeout: float, what: str,
                    give_up: Optional[Callable[[], Optional[Exception]]] = None) -> None:
        """Poll ``condition`` until it holds; TimeoutError after ``timeout`` seconds, or the
        error ``give_up`` returns as soon as it returns one (a silent driver)."""
        deadline = time.monotonic() + timeout
        while not condition():
            error = give_up() if give_up is not None else None
            if error is not None:
                raise error
            if time.monotonic() >= deadline:
                raise TimeoutError(f"ftnb: {what} of experiment {self.name!r} not done after "
                                   f"{timeout} s; the request stands (see {self.path}/control).")
            time.sleep(_POLL_S)

    # -- display -------------------------------------------------------------------------------
    def widget(self, metric: Optional[str] = None) -> Any:
        """The live ipywidgets view of this experiment (needs ``ftnb[notebook]``)."""
        from .notebook.widget import ExperimentWidget

        return ExperimentWidget(self, metric=metric)

    def display(self, metric: Optional[str] = None) -> None:
        """Show the live widget in a notebook; print the text table anywhere else."""
        self.display_with_text_update(metric)

    def display_with_text_update(self, metric: Optional[str] = None
                                 ) -> Optional[Callable[[], None]]:
        """:meth:`display`; returns, when it displayed the widget, a function that shows the
        experiment as it is now in that output's plain-text copy (what a front end without
        widgets shows, and what a saved notebook keeps), else None: the magics call it when
        ``--wait`` saw the experiment end."""
        if _in_kernel():
            try:
                from IPython.display import display

                widget = self.widget(metric=metric)
            except ImportError:
                pass
            else:
                shown = display(widget, display_id=True)
                display(widget.stale_hint())  # shows where the widget cannot be drawn

                def update_text() -> None:
                    widget.refresh()
                    shown.update(widget)

                return update_text
        print(self.text())
        return None

    def text(self) -> str:
        """The view as a text table: the widget's rows, and how to resume it if it stopped."""
        from .ui.monitor import text_view

        return text_view(read_model.read_snapshot(self.paths))

    def __repr__(self) -> str:
        """The name, the status read now, and the path. A status that can still change says
        when it was read: a notebook keeps this text while the experiment goes on."""
        try:
            status = self.status()
        except Exception:
            status = "unreadable"
        if status != ExperimentStatus.FINISHED:
            status += f" as of {time.strftime('%H:%M:%S')}"
        return f"ExperimentHandle({self.name!r}, {status}, {self.path!r})"

    def _say(self, line: str, quiet: bool) -> None:
        if not quiet:
            print(line, flush=True)

    def _finish_launch(self, wait: bool) -> "ExperimentHandle":
        if wait:
            self.wait()
        return self


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None
