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
                       "line": "driver pid 4242 on node1, since ...: ..."},  # or null
            "resume_line": null,          # INTERRUPTED: the line that resumes it (a notebook's)
            "error": null}]}

    404 when ``root`` does not exist; a folder that holds no experiment gives ``[]``.

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
                               "line": "%ftresume sweep1"}},  # what a user runs instead
        "root": "/home/u/ftnb_results"          # the configured root it is in

    404 when ``path`` holds no experiment.

``GET ftnb/api/results?path=<path>&metric=<m>&since=<json>``
    One metric's curves, incrementally. ``since`` is ``{"<trial_id>": rows_seen, ...}`` (the
    ``rows`` of the previous answer; absent: from the start). ``metric`` defaults to the
    experiment's ``metric`` setting, else the first one reported::

        {"metric": "loss", "metrics": ["loss", "acc"], "generation": 12,
         "series": {"3f2a1_00000": {"label": "lr=0.01, bs=32",  # its varying params (else id)
                                    "x": [5, 6], "y": [0.31, 0.29],  # training_iteration, value
                                    "rows": 6,       # rows read so far: the next `since`
                                    "reset": false}}}  # true: its rows were replaced (it
                                                       # restarted from a checkpoint): drop
                                                       # what you have, x/y start from row 0

    Trials with no new rows are left out. A NaN value is ``null`` (a gap in the curve).

``POST ftnb/api/stop`` body ``{"path": ...}``
    Ask the experiment's driver to stop (it ends INTERRUPTED, resumable):
    ``{"ok": true, "request_id": "...", "path": ...}``. 409 when no live driver owns it.

``POST ftnb/api/stop_trial`` body ``{"path": ..., "trial_id": ...}``
    Ask the driver to stop that trial (it ends TERMINATED; the others go on):
    ``{"ok": true, "request_id": "...", "trial_id": ...}``. 404: no such trial; 409: the trial
    already ended, or no live driver owns the experiment. The trial is named by its id, never by
    a position in a list.

``POST ftnb/api/resume`` body ``{"path": ...}``
    Resume an interrupted (or errored) experiment in a new detached supervisor:
    ``{"ok": true, "path": ..., "status": "RUNNING", "supervisor": {...}}``. Possible only for
    an experiment started by ``ftnb run`` (its state records the trainable as MODULE:NAME or
    FILE.py:NAME, and the folder it ran in): the server runs ``ftnb resume PATH --detach`` with
    its own Python, as its own user. One started by ``%ftrun`` / ``ftnb.launch`` or by a script
    needs the user's code: **409** with a message naming what to run where (``%ftresume NAME``
    in the notebook that defines the trainable, or ``Tuner.restore``). 409 too when a live
    driver owns it or it finished.

A bad argument (a missing ``path``, ``since`` that is not a JSON object, a body that is not a
JSON object) is a 400 that names the argument and the fix.
"""

from __future__ import annotations
