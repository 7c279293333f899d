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

from .listing import ListedExperiment, ListingMemory, list_folder, read_experiment
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
from .snapshot import (
    SNAPSHOT_FORMAT,
    SNAPSHOT_FORMAT_VERSION,
    ExperimentSnapshot,
    Restart,
    ResultColumns,
    finite,
    read_snapshot,
    with_rows,
)
from .status import (
    DriverStatus,
    ExperimentSummary,
    as_read,
    merge_trial_records,
    newer_record,
    parse_trial_record,
    read_driver,
    read_state,
    read_status,
    summarize,
    supervisor_log,
    supervisor_record,
    without_driver,
)

__all__ = [
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_FORMAT_VERSION",
    "DriverStatus",
    "ExperimentSnapshot",
    "ExperimentSummary",
    "Found",
    "ListedExperiment",
    "ListingMemory",
    "Location",
    "Restart",
    "ResultColumns",
    "ResumeContext",
    "as_read",
    "experiment_names",
    "experiment_paths",
    "finite",
    "ftnb_magics_loaded",
    "is_experiment",
    "list_folder",
    "locate",
    "merge_trial_records",
    "names_a_folder",
    "newer_record",
    "parse_trial_record",
    "read_driver",
    "read_experiment",
    "read_snapshot",
    "read_state",
    "read_status",
    "resume_line",
    "same_storage_path",
    "summarize",
    "supervisor_log",
    "supervisor_record",
    "tuner_restore_line",
    "with_rows",
    "without_driver",
]
