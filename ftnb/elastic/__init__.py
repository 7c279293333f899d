"""Elastic worker groups: keep going on the healthy workers, recreate the failed ones.

:class:`WorkerGroup` maps calls over N stateful workers (each in a process of its own, or a
Ray actor on a cluster's nodes) and returns a result or an error per worker, so a lost worker
(or node) costs speed, not the run;
:class:`SubEnvironments` restarts a failing sub-object inside one worker without restarting the
worker. See :mod:`ftnb.elastic.group` for the rules.
"""

from .group import WorkerGroup, WorkerGroupError, WorkerResult
from .sub_environments import SubEnvironments
from .worker import worker_index

__all__ = ["SubEnvironments", "WorkerGroup", "WorkerGroupError", "WorkerResult", "worker_index"]
