"""The read side. Readers never write to an experiment.

- ``read_model``: the one read model every UI uses (re-exports the four below): ``location``
  (what is at a path), ``status`` (status and driver: a dead driver reads as INTERRUPTED),
  ``resume_lines`` (the line that resumes it, worded for where it is read), ``snapshot`` (the
  experiment as a UI shows it, and its JSON).
- ``view``: the view model (rows, counts, times) and the text table.
- ``failures``: how a failure reads in every UI (a group's first failing rank, the other
  ranks, how long the restart took).
- ``monitor``: the incremental reader behind the live widget.
- ``terminal``: the status table a script prints while it runs.
"""
