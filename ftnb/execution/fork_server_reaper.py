"""Imported only by the fork servers of trial processes and WorkerGroup workers (it is in their
preload lists): it makes the server the child subreaper of its children's descendants.

A trial process ends what it started before it exits, but one that dies first (a signal, the
OOM killer) leaves orphans. Without a subreaper they would go to the machine's init, where
nothing reaps them in many containers; here they come to the fork server, whose SIGCHLD
handler reaps them when the executor has ended them
(:func:`ftnb.execution.process_tree.kill_marked`). That handler warns of each pid it did not
fork: expected here, so silenced.
"""

from __future__ import annotations

import warnings

from .process_tree import become_subreaper

warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
become_subreaper()
