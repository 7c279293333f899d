"""The routes of ftnb's Jupyter server extension: the server half of the JupyterLab panel, and
what the notebook widget sends its controls through while the kernel is busy.

Every route reads through ftnb's read model (:mod:`ftnb.ui.read_model`) and acts through control
requests (:mod:`ftnb.storage.control`), never through a kernel, so it works for experiments
started by ``%ftrun``, scripts, ``ftnb run`` or another user, on any executor. Storage is read
in a thread pool, never on the server's event loop (a slow S3 does not block the server), and
only when a request asks: the extension polls nothing in the background.

Base URL: ``<base_url>ftnb/api/``. Every route is authenticated like every Jupyter server route
(the token, or the login cookie); a POST also needs the ``_xsrf`` cookie echoed in the
``X-XSRFToken`` header (what ``@jupyterlab/services``' ``ServerConnection.makeRequest`` does),
or a token in the ``Authorization: token ...`` header. Errors are JSON ``{"message": "..."}``
with their HTTP status.

Confinement: every ``root`` and ``path`` must resolve inside one of the configured storage roots
(``c.Ftnb.storage_roots``; default: ftnb's default storage path, ``$FTNB_STORAGE_PATH`` or
``~/ftnb_results``). A ``..`` segment, a relative path, a local path outside every root (after
symlinks are resolved: a symlink leading out is refused), or a URL whose scheme or bucket no
root names, gets **403** with a message that says which roots are served.

``GET ftnb/api/roots``
    ``{"roots": ["/home/u/ftnb_results", "s3://bucket/exps"]}``: the configured roots, as a
    request names them.

``GET ftnb/api/experiments?root=<root>``
    The experiments in the folder ``root`` (a root, or a folder inside one), newest activity
    first, unreadable ones last::

        {"root": "/home/u/ftnb_results",
         "experiments": [
           {"name": "sweep1", "path": "/home/u/ftnb_results/sweep1",
            "status": "RUNNING",         # RUNNING | FINISHED | ERRORED | INTERRUPTED (its driver
                                         # is gone) | UNREADABLE (then "error" says why)
            "trials": {"PENDING": 0, "RUNNING": 2, "PAUSED": 0, "TERMINATED": 5, "ERRORED": 1},
            "num_trials": 8, "failures": 3, "preemptions": 0,
            "last_activity": 1767000000.0,  # unix seconds: its state's last save
            "created": 1766990000.0,
            "live": true,                 # a live driver owns it: stop / stop_trial act now
            "driver": {"pid": 4242, "host": "node1", "alive": true,
                       "line": "driver pid 4242 on node1, since ...: ...",
                       "silent_s": null,      # while its driver is silent (no heartbeat, its
                       "dead_in_s": null},    # death unproven): for how long, and when it
                                              # counts as dead (null: never on its own)
                                              # (driver: null when no lease, or it ended)
            "resume_line": null,          # INTERRUPTED: the line that resumes it (a notebook's)
            "takeover": null,             # silent driver: the line that takes it over
            "error": null}]}

    404 when ``root`` does not exist; a folder that holds no experiment gives ``[]``. Cost: a
    listing reads the folder's index (``.ftnb-index/``, kept by the drivers: see
    :mod:`ftnb.ui.listing`): the folder, the index and its snapshot, each entry that changed
    since the last listing, one owner lease per experiment whose state says RUNNING, and in
    full only the experiments the index does not know (made by an older ftnb, copied in).

``GET ftnb/api/experiment?path=<path>``
    The experiment's snapshot, exactly :meth:`ftnb.ui.read_model.ExperimentSnapshot.to_json`
    (format ``ftnb.snapshot``; its ``experiment`` part is what ``ftnb status --json`` prints:
    status, counts, rows with params, iteration, attempts, failures, last failure with its
    traceback; ``failures`` has every failure of every trial with tracebacks, ``restarts`` the
    restarts), with three more keys::

        "trials": {"3f2a1_00000": {"config": {...},     # the trial's whole config
                                   "attempts": [{"number": 1, "started": ..., "ended": ...,
                                                 "outcome": "failed", "start_iteration": 0,
                                                 "restored_from": null, "num_workers": 1,
                                                 ...}]}},
        "actions": {"stop": true,                # a live driver: POST stop acts
                    "stop_trial": ["3f2a1_00000"],  # trials a POST stop_trial can stop now
                    "resume": {"available": false,   # POST resume can start a supervisor
                               "reason": "...",      # why not, when it cannot
                               "line": "%ftresume sweep1"},  # what a user runs instead
                    "takeover": null},  # while its driver is silent: the same for POST resume
                                        # with "takeover": true
        "root": "/home/u/ftnb_results"          # the configured root it is in

    404 when ``path`` holds no experiment.

``GET ftnb/api/results?path=<path>&metric=<m>&since=<json>``
    One metric's curves, incrementally. ``since`` is ``{"<trial_id>": cursor, ...}``: each
    trial's ``cursor`` from the previous answer (absent: everything). A plain number of rows
    is taken too, but only a cursor tells that the rows were replaced meanwhile. ``metric``
    defaults to the experiment's ``metric`` setting, else the first one reported::

        {"metric": "loss", "metrics": ["loss", "acc"], "generation": 12,
         "series": {"3f2a1_00000": {"label": "lr=0.01, bs=32",  # its varying params (else id)
                                    "x": [5, 6], "y": [0.31, 0.29],  # training_iteration, value
                                    "rows": 6,        # rows read so far
                                    "cursor": "a3f2c91:6",  # send it back as since[trial_id]
                                    "reset": false}}}  # true: its rows were replaced (it
                                                       # restarted from a checkpoint, or the
                                                       # server restarted): drop what you
                                                       # have, x/y start from row 0

    Trials with no new rows are left out; rows without the metric add no point. A NaN value
    is ``null`` (a gap in the curve).

``POST ftnb/api/stop`` body ``{"path": ...}``
    Ask the experiment's driver to stop (it ends INTERRUPTED, resumable):
    ``{"ok": true, "request_id": "...", "path": ...}``. 409 when no live driver owns it.

``POST ftnb/api/stop_trial`` body ``{"path": ..., "trial_id": ...}``
    Ask the driver to stop that trial (it ends TERMINATED; the others go on):
    ``{"ok": true, "request_id": "...", "trial_id": ...}``. 404: no such trial; 409: the trial
    already ended, or no live driver owns the experiment. The trial is named by its id, never by
    a position in a list.

``POST ftnb/api/resume`` body ``{"path": ..., "takeover": false}``
    Resume an interrupted (or errored) experiment in a new detached supervisor (with
    ``"takeover": true``, one whose driver is silent, taking it over: ``--takeover``):
    ``{"ok": true, "path": ..., "status": "RUNNING", "supervisor": {...}}``. Possible only for
    an experiment started by ``ftnb run`` (its state records the trainable as MODULE:NAME or
    FILE.py:NAME, and the folder it ran in): the server runs ``ftnb resume PATH --detach`` with
    its own Python (``-P``: the folder is not put first on the module path), as its own user,
    and only when the code that imports is trusted (:func:`ftnb.lab.actions.code_refusal`):
    the folder and the files (trainable, and search space when it is code) inside the
    server's own folders (the local roots and the server's ``root_dir``), belonging to the
    server's user, each file with the sha256 recorded when the experiment started; else
    **409** naming the file and the ``ftnb resume`` to run by hand, and nothing is imported.
    One started by ``%ftrun`` / ``ftnb.launch`` or by a script needs the user's code: **409**
    with a message naming what to run where (``%ftresume NAME`` in the notebook that defines
    the trainable, or ``Tuner.restore``). 409 too when a live driver owns it or it finished.

``POST ftnb/api/delete`` body ``{"path": ...}``
    Remove the experiment's folder with all its results and checkpoints (what ``ftnb rm``
    does): ``{"ok": true, "path": ..., "removed": true}``. 409 while a live driver owns it
    (the message names its pid and host, and says to stop it first), or when ``path`` is a
    served root itself; 404 when ``path`` holds no experiment. It is removed under the owner
    lock, so a driver starting meanwhile waits, then finds no experiment. The panel asks once
    before it sends this.

Polling: every GET answer carries an ``ETag`` (a hash of its body); a GET that sends it back
in ``If-None-Match`` gets **304** with no body while the answer is unchanged. The panel sends
it on each poll of ``roots``, ``experiments`` and ``experiment``, so an unchanged listing or
page costs headers only.

A bad argument (a missing ``path``, ``since`` that is not a JSON object, a body that is not a
JSON object, a body field of the wrong type, such as a ``path`` that is a number, a list or an
object, or a field the route does not take) is a 400 that names the argument and the fix.
"""

from __future__ import annotations

import json
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import IOLoop

from ..core.records import FINISHED_STATUSES, StateFormatError
from ..storage import ExperimentPaths
from ..ui.read_model import ExperimentSnapshot, finite
from . import actions
from .actions import ActionRefused
from .listing import EndedExperiments, list_experiments
from .roots import PathRefused, StorageRoots
from .snapshots import OpenExperiments

__all__ = ["API_PREFIX", "LabState", "routes"]

#: Where the routes are, under the server's base URL.
API_PREFIX = "ftnb/api"



class LabState:
    """What every handler shares: the confined roots, the open experiments' readers, and the
    thread pool that does all storage I/O (never the event loop)."""

    def __init__(self, roots: StorageRoots, executor: Executor,
                 open_experiments: Optional[OpenExperiments] = None,
                 code_folders: Optional[Sequence[str]] = None) -> None:
        self.roots = roots
        self.executor = executor
        #: Where a resume may import an experiment's code from (:func:`actions.code_refusal`):
        #: the local roots, and the folder the Jupyter server serves (its ``root_dir``).
        self.code_folders: tuple[str, ...] = tuple(
            code_folders if code_folders is not None
            else [r.base for r in roots.roots if r.storage.is_local])
        self.open = open_experiments or OpenExperiments()
        self.ended = EndedExperiments()

    # -- what each route computes, in the pool -----------------------------------------------------
    def experiments(self, root_text: Optional[str]) -> dict:
        root, folder = self.roots.resolve(root_text or self.roots.uris()[0], "root")
        entries = list_experiments(root.storage, folder, holds=root.holds, ended=self.ended)
        if not entries and folder != root.base and not root.storage.isdir(folder):
            raise FileNotFoundError(f"root={root_text!r}: no such folder")
        return {"root": root.storage.uri(folder), "experiments": entries}

    def experiment(self, path: Optional[str]) -> dict:
        root, paths = self.roots.experiment(path)
        snap = self._poll(paths)
        live = snap.driver_status.alive
        data = snap.to_json()
        data["trials"] = finite({
            t.trial_id: {"config": t.to_json()["config"],
                         "attempts": [asdict(a) for a in t.attempts]}
            for t in snap.state.trials})
        data["actions"] = {
            "stop": live,
            "stop_trial": [r.trial_id for r in snap.view.rows
                           if live and r.status not in FINISHED_STATUSES],
            "resume": actions.resume_plan(paths, snap.state, snap.status, snap.driver_status,
                                          code_folders=self.code_folders).to_json(),
            "takeover": (actions.resume_plan(paths, snap.state, snap.status,
                                             snap.driver_status, takeover=True,
                                             code_folders=self.code_folders).to_json()
                         if snap.driver_status.offers_takeover(snap.state.status) else None),
        }
        data["root"] = root.uri
        return data

    def results(self, path: Optional[str], metric: Optional[str], since: dict) -> dict:
        _, paths = self.roots.experiment(path)
        snap = self._poll(paths)
        metric = metric or snap.state.settings.get("metric") or (
            snap.metrics[0] if snap.metrics else None)
        series = self.open.get(paths).series(snap, metric, since) if metric else {}
        return {"metric": metric, "metrics": list(snap.metrics),
                "generation": snap.generation, "series": series}

    def stop(self, body: dict) -> dict:
        return actions.stop_experiment(self._experiment_of(body))

    def stop_trial(self, body: dict) -> dict:
        return actions.stop_trial(self._experiment_of(body), body.get("trial_id"))

    def resume(self, body: dict) -> dict:
        return actions.resume(self._experiment_of(body), body.get("takeover", False),
                              code_folders=self.code_folders)

    def delete(self, body: dict) -> dict:
        root = self.roots.experiment(body.get("path"))[0]
        paths = self._experiment_of(body)
        answer = actions.delete_experiment(paths, root.base)
        self.open.forget(paths)
        return answer

    def _experiment_of(self, body: dict) -> ExperimentPaths:
        _, paths = self.roots.experiment(body.get("path"))
        if not paths.has_state():
            raise FileNotFoundError(f"path={body.get('path')!r} holds no ftnb experiment")
        return paths

    def _poll(self, paths: ExperimentPaths) -> ExperimentSnapshot:
        try:
            return self.open.get(paths).poll()
        except StateFormatError:
            self.open.forget(paths)
            raise


class _FtnbHandler(APIHandler):
    """A route: its work runs in the thread pool; its errors are JSON ``{"message"}``."""

    lab: LabState
    #: What a server's authorizer is asked about: reading ftnb's experiments (GET) and acting
    #: on them (POST, "write"), for deployments that restrict users (JupyterHub roles).
    auth_resource = "ftnb"

    def initialize(self, lab: LabState) -> None:
        self.lab = lab

    async def _answer(self, work: Callable[..., dict], *args: Any) -> None:
        try:
            data = await IOLoop.current().run_in_executor(self.lab.executor, work, *args)
        except PathRefused as exc:
            raise web.HTTPError(403, str(exc)) from None
        except ActionRefused as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        except (StateFormatError, FileNotFoundError) as exc:
            raise web.HTTPError(404, _one_line(exc)) from None
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None
        except Exception as exc:  # the storage's own errors: credentials, network, permissions
            self.log.exception("ftnb: %s %s failed", self.request.method, self.request.path)
            raise web.HTTPError(500, f"{type(exc).__name__}: {_one_line(exc)}") from None
        self.finish(json.dumps(data, allow_nan=False))

    def _body(self, *fields: "_Field") -> dict:
        """The request's JSON body, which must be an object holding the required ``fields``,
        each of its type, and no other: else 400 naming the field, what came and the fix."""
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as exc:
            raise web.HTTPError(400, f"the request body is not JSON ({exc}). Fix: send a "
                                     "JSON object, e.g. {\"path\": \"...\"}") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, f"the request body must be a JSON object; got "
                                     f"{_shown(body)}. Fix: {_example(fields)}")
        known = {field.name for field in fields}
        extra = sorted(str(name) for name in body if name not in known)
        if extra:
            which = "a field" if len(extra) == 1 else "fields"
            raise web.HTTPError(400, f"the request body has {which} this route does not take: "
                                     f"{', '.join(map(repr, extra))}. Fix: send only "
                                     f"{' and '.join(map(repr, sorted(known)))}, e.g. "
                                     f"{_example(fields)}")
        for field in fields:
            if field.name not in body:
                if field.required:
                    raise web.HTTPError(400, f"the request body has no {field.name!r}. Fix: "
                                             f"{_example(fields)}")
                continue
            value = body[field.name]
            if not field.accepts(value):
                raise web.HTTPError(400, f"the request body's {field.name!r} must be "
                                         f"{field.kind}; got {field.name}={_shown(value)} "
                                         f"({_json_kind(value)}). Fix: {_example(fields)}")
        return body


@dataclass(frozen=True)
class _Field:
    """A field of a POST body: its ``name``, its JSON ``kind`` in words, an ``example`` value,
    and whether it is ``required``."""

    name: str
    kind: str
    example: Any
    required: bool = True

    def accepts(self, value: Any) -> bool:
        return isinstance(value, type(self.example))


_PATH = _Field("path", "a string: the experiment's path or URL, as the listing gives it",
               "/home/u/ftnb_results/sweep1")
_TRIAL_ID = _Field("trial_id", "a string: the trial's id, as the experiment's page lists it",
                   "3f2a1_00000")
_TAKEOVER = _Field("takeover", "true or false", False, required=False)


def _example(fields: tuple[_Field, ...]) -> str:
    return json.dumps({field.name: field.example for field in fields})


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), "?")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _ReadHandler(_FtnbHandler):
    # A panel left open polls: that is no user activity, and must not keep an idle server
    # from being culled.
    _track_activity = False


class RootsHandler(_ReadHandler):
    """``GET ftnb/api/roots``."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps({"roots": self.lab.roots.uris()}))


class ExperimentsHandler(_ReadHandler):
    """``GET ftnb/api/experiments?root=``."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self._answer(self.lab.experiments, self.get_argument("root", None))


class ExperimentHandler(_ReadHandler):
    """``GET ftnb/api/experiment?path=``."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self._answer(self.lab.experiment, self.get_argument("path", None))


class ResultsHandler(_ReadHandler):
    """``GET ftnb/api/results?path=&metric=&since=``."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        since_text = self.get_argument("since", None)
        since: Any = {}
        if since_text:
            try:
                since = json.loads(since_text)
            except ValueError:
                since = None
            if not isinstance(since, dict):
                raise web.HTTPError(400, f"since={since_text!r} is not a JSON object. Fix: "
                                         "send the cursors of the last answer, "
                                         "{\"<trial_id>\": \"<cursor>\", ...}, or leave it out")
        await self._answer(self.lab.results, self.get_argument("path", None),
                           self.get_argument("metric", None), since)


class StopHandler(_FtnbHandler):
    """``POST ftnb/api/stop``."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self._answer(self.lab.stop, self._body(_PATH))


class StopTrialHandler(_FtnbHandler):
    """``POST ftnb/api/stop_trial``."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self._answer(self.lab.stop_trial, self._body(_PATH, _TRIAL_ID))


class ResumeHandler(_FtnbHandler):
    """``POST ftnb/api/resume``."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self._answer(self.lab.resume, self._body(_PATH, _TAKEOVER))


class DeleteHandler(_FtnbHandler):
    """``POST ftnb/api/delete``."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        await self._answer(self.lab.delete, self._body(_PATH))


def routes(base_url: str, lab: LabState) -> list[tuple[str, type, dict]]:
    """The extension's tornado routes under ``base_url``."""
    prefix = url_path_join(base_url, API_PREFIX)
    handlers = {"roots": RootsHandler, "experiments": ExperimentsHandler,
                "experiment": ExperimentHandler, "results": ResultsHandler,
                "stop": StopHandler, "stop_trial": StopTrialHandler, "resume": ResumeHandler,
                "delete": DeleteHandler}
    return [(url_path_join(prefix, name), handler, {"lab": lab})
            for name, handler in handlers.items()]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
