"""The read model: what every UI knows about an experiment, answered in one place.

* **What is at this path?** :func:`locate` says what a folder is (an experiment, a storage folder
  of experiments, a trial's folder, ...); :func:`experiment_paths` resolves a name or a folder as
  :func:`ftnb.attach` takes it; :func:`experiment_names` lists a storage folder.
* **What is in this storage folder?** :func:`list_folder`: each experiment's summary, status as
  read, through the folder's index where it can (:mod:`ftnb.ui.listing`); one experiment read
  in full: :func:`read_experiment`.
* **What is its status?** :func:`read_status`. A state that says RUNNING while no live driver
  owns the experiment (its driver was killed, its machine lost) reads as ``INTERRUPTED``, and so
  do the trials that driver ran (:func:`as_read`); the stored state is never changed, so a
  resume continues from it. :class:`DriverStatus` says who the driver is, and why it counts as
  alive or gone.
* **What are its trials?** :func:`read_state`: each trial's record from the state, replaced by
  its own ``trial.json`` when that is newer (:func:`newer_record`; the controller writes it at
  every transition, the whole state at most once a second); in a snapshot, with its progress
  (iteration, last result) from its ``result.json`` rows (:func:`with_rows`).
* **What line resumes it?** :func:`resume_line`, worded for where it is read
  (:class:`ResumeContext`: a Python prompt, an IPython shell with the ``%ft`` magics, a
  terminal).
* **All of it at once:** :func:`read_snapshot` returns an :class:`ExperimentSnapshot`; the widget
  gets one from each poll of its incremental :class:`ftnb.ui.monitor.ExperimentMonitor`, which
  builds them here (:meth:`ExperimentSnapshot.build`).

The widget, ``ftnb status``/``ls``/``watch``/``logs``/``stop``, :class:`ftnb.ExperimentHandle`
and the JupyterLab panel read experiments through these functions only, so they never disagree.

Each question has its module (:mod:`ftnb.ui.location`, :mod:`ftnb.ui.status`,
:mod:`ftnb.ui.resume_lines`, :mod:`ftnb.ui.snapshot`, whose docstring describes the snapshot's
JSON); this module gathers their answers under one name, ``read_model.<name>``, so a reader
needs no other import and no two readers can word a rule (a dead driver, the newer record, the
resume line) differently.
"""

from __future__ import annotations

from typing import Any

from ..lazy_names import lazy_attribute
from .location import (
    Found,
    Location,
    experiment_names,
    experiment_paths,
    is_experiment,
    locate,
    names_a_folder,
    same_storage_path,
)
from .resume_lines import ResumeContext, ftnb_magics_loaded, resume_line, tuner_restore_line

#: Imported on first use, not with this module: a driver imports it for its resume line alone
#: (:mod:`ftnb.tuner`), and needs neither the listing (with the folder's index) nor the
#: snapshot and status readers. Public name -> its module in this package.
_LAZY = {
    "ListedExperiment": "listing",
    "ListingMemory": "listing",
    "list_folder": "listing",
    "read_experiment": "listing",
    "SNAPSHOT_FORMAT": "snapshot",
    "SNAPSHOT_FORMAT_VERSION": "snapshot",
    "ExperimentSnapshot": "snapshot",
    "Restart": "snapshot",
    "ResultColumns": "snapshot",
    "finite": "snapshot",
    "read_snapshot": "snapshot",
    "with_rows": "snapshot",
    "DriverStatus": "status",
    "ExperimentSummary": "status",
    "as_read": "status",
    "merge_trial_records": "status",
    "newer_record": "status",
    "parse_trial_record": "status",
    "read_driver": "status",
    "read_state": "status",
    "read_status": "status",
    "summarize": "status",
    "supervisor_log": "status",
    "supervisor_record": "status",
    "without_driver": "status",
}

# (The names above, and those imported above from location and resume_lines.)
__all__ = [*_LAZY, "Found", "Location", "ResumeContext", "experiment_names", "experiment_paths",
           "ftnb_magics_loaded", "is_experiment", "locate", "names_a_folder", "resume_line",
           "same_storage_path", "tuner_restore_line"]


def __getattr__(name: str) -> Any:
    return lazy_attribute(globals(), _LAZY, name)


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))

