"""What the panel's buttons do: stop an experiment, stop one trial, resume.

Stops are control requests written into the experiment's folder (:mod:`ftnb.storage.control`),
addressed to the live driver's lease epoch, wherever that driver runs (a supervisor, a
script's ``fit()``, ``ftnb run``, a Ray cluster): no kernel is involved. A resume starts a new
detached supervisor with ``ftnb resume PATH --detach``, which works only where the state
records where the trainable is (an experiment ``ftnb run`` started); otherwise the user's code
is needed, and :class:`ActionRefused` (409) says what to run where.

The state is data: anyone who can write one state file in a shared root could name any code.
So the server imports an experiment's code only when :func:`code_refusal` finds it is the code
the experiment started with (the sha256 recorded then), in the server's own folders, belonging
to the server's user; otherwise 409 names the file and the ``ftnb resume`` to run by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

from ..core.records import ExperimentState, ExperimentStatus, TrialStatus
from ..recorded_code import (
    TRUSTED_CODE_VARIABLE,
    files_run_by,
    import_root,
    is_code_reference,
    recorded_file,
    recorded_imports,
    untrusted_file,
    untrusted_imports,
    untrusted_path,
)
from ..storage import ExperimentPaths
from ..storage.control import STOP_EXPERIMENT, STOP_TRIAL, send_request
from ..storage.lease import live_lease
from ..ui import read_model
from ..ui.read_model import DriverStatus, ResumeContext
from ..wording import ftnb_command

__all__ = ["RESUME_TIMEOUT_S", "ActionRefused", "ResumePlan", "code_refusal",
           "delete_experiment", "resume", "resume_plan", "stop_experiment", "stop_trial"]

#: How long a resume may take to have its supervisor running (it imports the trainable's
#: modules, torch included) before the request gives up; the supervisor's own limit, plus a bit.
RESUME_TIMEOUT_S = 330.0


class ActionRefused(Exception):
    """An action that cannot be done (``status``: 404 no such trial, 409 not now / not from
    here); the message says why and what to do instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- stops -----------------------------------------------------------------------------------------
def stop_experiment(paths: ExperimentPaths) -> dict:
    """Ask the live driver to stop the experiment (it ends INTERRUPTED, resumable)."""
    owner = live_lease(paths)
    if owner is None:
        raise ActionRefused(409, f"experiment {paths.name!r} is not running "
                                 f"({read_model.read_status(paths)}): nothing to stop")
    request = send_request(paths, STOP_EXPERIMENT, epoch=owner.epoch)
    return {"ok": True, "path": paths.uri, "request_id": request.id}


def stop_trial(paths: ExperimentPaths, trial_id: Any) -> dict:
    """Ask the live driver to stop the trial ``trial_id`` (it ends TERMINATED)."""
    if not isinstance(trial_id, str) or not trial_id:
        raise ValueError(f"trial_id={trial_id!r} is not a trial's id. Fix: send the id the "
                         "experiment's page lists, e.g. {\"trial_id\": \"3f2a1_00000\"}")
    trials = {t.trial_id: t for t in read_model.read_state(paths).trials}
    trial = trials.get(trial_id)
    if trial is None:
        shown = ", ".join(list(trials)[:5]) + (f" ... ({len(trials)} trials)"
                                                if len(trials) > 5 else "")
        raise ActionRefused(404, f"experiment {paths.name!r} has no trial {trial_id!r}; its "
                                 f"trials: {shown or 'none yet'}")
    if TrialStatus(trial.status).is_finished():
        raise ActionRefused(409, f"trial {trial_id} already ended ({trial.status}): nothing "
                                 "to stop")
    owner = live_lease(paths)
    if owner is None:
        raise ActionRefused(409, f"experiment {paths.name!r} is not running "
                                 f"({read_model.read_status(paths)}), so no driver can stop "
                                 f"trial {trial_id}; it will not run until the experiment is "
                                 "resumed")
    request = send_request(paths, STOP_TRIAL, trial_id, epoch=owner.epoch)
    return {"ok": True, "path": paths.uri, "trial_id": trial_id, "request_id": request.id}


# -- delete ----------------------------------------------------------------------------------------
def delete_experiment(paths: ExperimentPaths, root_folder: str) -> dict:
    """Remove the experiment's folder, with all its results and checkpoints, as ``ftnb rm``
    does: refused (409) while a live driver owns it, and never the served root itself."""
    if paths.dir.rstrip("/") == root_folder.rstrip("/"):
        raise ActionRefused(409, f"path={paths.uri!r} is a storage root this server serves, "
                                 "not an experiment inside it: not removed")
    _refuse_live(paths, live_lease(paths))
    # Under the owner lock: a driver that starts now waits for the removal, then finds no
    # experiment, instead of losing its folder while it runs.
    with paths.storage.exclusive_lock(paths.lease_lock):
        _refuse_live(paths, live_lease(paths))
        paths.storage.remove(paths.dir, recursive=True)
    return {"ok": True, "path": paths.uri, "removed": True}


def _refuse_live(paths: ExperimentPaths, owner: Any) -> None:
    if owner is not None:
        raise ActionRefused(409, f"experiment {paths.name!r} is running (pid {owner.pid} on "
                                 f"{owner.host}); not removed. Fix: stop it first (the "
                                 "panel's Stop), then delete it")


# -- resume ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResumePlan:
    """Whether the server can resume the experiment (``available``), why not (``reason``),
    and the line a user runs to resume it themselves (``line``; None when there is nothing to
    resume)."""

    available: bool
    reason: Optional[str]
    line: Optional[str]

    def to_json(self) -> dict:
        return asdict(self)


def resume_plan(paths: ExperimentPaths, state: ExperimentState, status: str,
                driver: DriverStatus, takeover: bool = False,
                code_folders: Sequence[str] = ()) -> ResumePlan:
    """How the experiment whose stored ``state`` reads ``status`` (``driver``: its driver now)
    can be resumed; ``takeover``: by taking it over from its silent driver. ``code_folders``:
    the folders the server may import an experiment's code from (:func:`code_refusal`)."""
    if takeover and not driver.offers_takeover(state.status):
        return ResumePlan(False, "its driver is not silent: there is nothing to take over "
                                 "(a takeover is for a driver that stopped sending heartbeats)",
                          None)
    if driver.alive and not takeover:
        return ResumePlan(False, "it is running (a live driver owns it): nothing to resume",
                          None)
    if status == ExperimentStatus.FINISHED:
        return ResumePlan(False, "it finished: nothing to resume", None)
    line = read_model.resume_line(paths, state, ResumeContext.MAGICS, takeover=takeover)
    origin = state.settings.get("origin")
    origin = origin if isinstance(origin, dict) else {}
    if origin.get("via") == "cli" and origin.get("trainable"):
        refused = code_refusal(origin, code_folders)
        if refused is None:
            return ResumePlan(True, None, line)
        return ResumePlan(False, (
            f"{refused}. The server imports only the code an experiment started with, from "
            f"its own folders ({', '.join(code_folders) or 'none'}) and belonging to its user: "
            "anyone who can write an experiment's state could name other code. Fix: check "
            f"that file, then resume it from a terminal, which says which file it imports "
            f"and warns when it changed: {ftnb_command()} resume {paths.uri}"
            + (" --takeover" if takeover else "")), line)
    trainable = origin.get("trainable") or state.trainable.rsplit(".", 1)[-1]
    if origin:
        reason = (f"it was started by %ftrun or ftnb.launch, so its trainable ({trainable!r}) "
                  "is defined in a notebook's kernel, which the server cannot run. Fix: in a "
                  f"notebook that defines it (with %load_ext ftnb), run: {line}")
    else:
        reason = (f"it was run by a script (Tuner.fit() or ftnb.run), which records no place "
                  f"to import its trainable ({trainable!r}) from. Fix: resume it where that "
                  f"code is: {line}, or from a terminal: {ftnb_command()} resume {paths.uri} --trainable "
                  f"FILE.py:{trainable}" + (" --takeover" if takeover else ""))
    return ResumePlan(False, reason, line)


def code_refusal(origin: Mapping[str, Any], code_folders: Sequence[str],
                 uid: Optional[int] = None) -> Optional[str]:
    """Why the server must not run ``ftnb resume`` on what an ``ftnb run`` experiment's
    ``origin`` names (None when it may): the folder it ran in, its trainable's file and its
    search space's (when that is code) must lie inside ``code_folders`` and belong to the user
    ``uid`` (default: the server's), and each file must have the sha256 recorded when the
    experiment started (:mod:`ftnb.recorded_code`). A module's packages are checked too (their
    place and owner; only the module's own file has a hash)."""
    cwd = origin.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        return f"its state names no folder it ran in (cwd={cwd!r})"
    why = untrusted_path(cwd, code_folders, uid)
    if why is None and not os.path.isdir(cwd):
        why = f"{cwd} is not a folder"
    if why is not None:
        return f"the folder it ran in, {why}"
    for role in ("trainable", "param_space"):
        what = "trainable" if role == "trainable" else "search space"
        ref = origin.get(role)
        if role == "param_space" and (ref is None or (isinstance(ref, str)
                                                      and not is_code_reference(ref))):
            continue  # no space, or a dict literal or JSON file: data, not code
        if not isinstance(ref, str):
            return f"its {what} is recorded as {ref!r}, which names no Python file"
        files = files_run_by(ref, cwd)
        if files is None:
            return (f"its {what} {ref} names no file the server can check (an absolute "
                    f"FILE.py:NAME, or a module in the folder it ran in, {cwd})")
        record = recorded_file(origin, role)
        if record is None:
            return (f"its state records no sha256 of its {what}'s file {files[-1]} (it was "
                    "started by an older ftnb, or its state was edited)")
        if os.path.realpath(record.file) != os.path.realpath(files[-1]):
            return (f"its {what} {ref} imports {files[-1]}, but the sha256 its state records "
                    f"is of {record.file}")
        why = untrusted_file(record, code_folders, uid)
        for package in files[:-1]:
            why = why or untrusted_path(package, code_folders, uid)
        # (the file has its recorded content: it imports the modules it imported then)
        why = why or untrusted_imports(origin, role, files[-1],
                                       import_root(ref, files[-1], cwd), code_folders, uid)
        if why is not None:
            return f"its {what}'s file {why}"
    return None


def resume(paths: ExperimentPaths, takeover: Any = False,
           timeout_s: float = RESUME_TIMEOUT_S, code_folders: Sequence[str] = ()) -> dict:
    """Resume the experiment in a new detached supervisor (``ftnb resume PATH --detach``, run
    with this server's Python, in the folder ``ftnb run`` started it from), and return once
    that supervisor runs it. ``takeover``: take it over from its silent driver first
    (``--takeover``). ``code_folders``: where its code must be (:func:`code_refusal`: else
    409, and nothing is imported)."""
    if not isinstance(takeover, bool):
        raise ValueError(f"takeover={takeover!r} is not true or false. Fix: send "
                         "{\"takeover\": true} to take over a silent driver, or leave it out")
    state = read_model.read_state(paths)
    driver = read_model.read_driver(paths)
    status = read_model.as_read(state, driver).status
    plan = resume_plan(paths, state, status, driver, takeover, code_folders)
    if not plan.available:
        what = "take over" if takeover else "resume"
        raise ActionRefused(409, f"cannot {what} {paths.name!r} from the server: {plan.reason}")
    origin = state.settings["origin"]
    cwd = origin["cwd"]  # checked by the plan
    # The command reads the state again: it must import only the files checked here.
    space = origin.get("param_space")
    roles = ["trainable"] + (["param_space"] if isinstance(space, str)
                             and is_code_reference(space) else [])
    checked = [recorded_file(origin, role).to_json() for role in roles]  # type: ignore[union-attr]
    checked += [item.to_json() for role in roles for item in recorded_imports(origin, role)]
    env = dict(os.environ, **{TRUSTED_CODE_VARIABLE: json.dumps(checked)})
    # -P: python -m would put the folder it runs in first on sys.path, where a module named
    # like the standard library's or ftnb itself would be imported before them.
    isolated = ["-P"] if sys.version_info >= (3, 11) else []
    command = [sys.executable, *isolated, "-m", "ftnb", "resume", paths.uri, "--detach",
               "--json"]
    if takeover:
        command.append("--takeover")
    try:
        done = subprocess.run(command, cwd=cwd, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ActionRefused(409, f"ftnb resume {paths.uri} --detach did not report its "
                                 f"supervisor running within {timeout_s:.0f} s; see "
                                 f"{paths.uri}/supervisor.log") from None
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        raise ActionRefused(409, f"ftnb resume {paths.uri} --detach failed (exit "
                                 f"{done.returncode}): " + " ".join(said[-3:]))
    try:
        outcome = json.loads(done.stdout)
    except ValueError:
        outcome = {}
    return {"ok": True, "path": paths.uri, "status": outcome.get("status"),
            "supervisor": outcome.get("supervisor")}
