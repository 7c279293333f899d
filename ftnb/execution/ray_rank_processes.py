"""A Ray rank's output and the processes it starts: the local executor's promises, in an actor.

A Ray actor hosts one rank of one attempt and is killed (SIGKILL) when the attempt ends, or
earlier (a stop past its grace, a hang, a failed group). Two things must not depend on it
living to the end:

* **Its output.** The rank's stdout and stderr go into pipes, which a pump server
  (:class:`~ftnb.execution.pump_server.PumpServer`, the local executor's, started detached so
  that it is not the actor's child: Ray kills a worker's children with it) copies into the
  rank's files, capped at ``$FTNB_OUTPUT_MAX_BYTES`` (:class:`~ftnb.execution.output_pump.
  CappedFile`). A killed actor's last bytes are in the pipes and still reach the files.
* **What the rank starts.** It runs with ``FTNB_ATTEMPT=<token>.<trial>.<attempt>.rank<N>``
  in its environment, in a cgroup of its own where the machine gives one, and the actor is the
  subreaper of its orphans; forks without ``exec`` from the trainable's thread carry that
  thread's name, ``ftnb.<hash of the marker>``. When the attempt body returns the actor ends
  all of it (before its exit is reported); when the actor is killed, the pump server, which
  notices by its socket's end, ends it (:meth:`PumpServer.sweep_at_exit`).

One :class:`RankProcesses` per actor, made when the actor starts, used by its ``run``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from typing import Optional

from .output_pump import output_max_bytes
from .process_tree import (
    ATTEMPT_VARIABLE,
    AttemptCgroup,
    attempt_marker,
    become_subreaper,
    join_cgroup,
    kill_marked,
    kill_tree,
    name_this_thread,
)

__all__ = ["RankProcesses"]

#: How long the end of a rank waits for its output to be in its files.
_OUTPUT_WAIT_S = 5.0


def rank_marker(token: Optional[str], trial_id: str, attempt: int, rank: int) -> str:
    """The value of ``FTNB_ATTEMPT`` for one rank of an attempt on Ray (each rank's processes
    are ended on their own node, by their own actor or its pump server)."""
    return f"{attempt_marker(token, trial_id, attempt)}.rank{rank}"


def marker_name(marker: str) -> str:
    """The name (15 characters) that the rank's trainable thread, and what it forks, carry."""
    return "ftnb." + hashlib.sha1(marker.encode()).hexdigest()[:10]


class RankProcesses:
    """The actor's pump server (started here, before anything else runs in the actor), and
    for the rank it runs: its output's pipes and the end of what it started."""

    def __init__(self) -> None:
        from .pump_server import PumpServer

        try:
            self.server: Optional[PumpServer] = PumpServer(detached=True)
        except OSError as exc:  # then the rank writes its files itself, uncapped
            print(f"ftnb: no output pump for this Ray actor ({exc}); its output is not capped",
                  file=sys.stderr)
            self.server = None
        self.marker: Optional[str] = None
        self.name: Optional[str] = None
        self.cgroup: Optional[AttemptCgroup] = None
        self._pumps: list[int] = []

    @property
    def server_pid(self) -> int:
        return self.server.pid if self.server is not None else 0

    def begin(self, token: Optional[str], trial_id: str, attempt: int, rank: int) -> None:
        """In the thread that runs the trainable, before it runs: the marks and the cgroup."""
        self.marker = rank_marker(token, trial_id, attempt, rank)
        self.name = marker_name(self.marker)
        os.environ[ATTEMPT_VARIABLE] = self.marker
        self.cgroup = AttemptCgroup.create(self.marker)
        if self.cgroup is not None:
            join_cgroup(self.cgroup.folder)
        become_subreaper()
        name_this_thread(self.name)
        if self.server is not None:
            self.server.sweep_at_exit(self.marker, self.name,
                                      self.cgroup.folder if self.cgroup else None)

    def redirect(self, stdout_path: str, stderr_path: str) -> None:
        """File descriptors 1 and 2 (the actor's and what it starts) into pipes that the pump
        server copies into these files, capped; into the files directly without a server."""
        from .trial_process import _redirect_output

        if self.server is None or not self.server.alive():
            _redirect_output(stdout_path, stderr_path)
            return
        max_bytes = output_max_bytes()
        writers = []
        for path in (stdout_path, stderr_path):
            read, write = os.pipe()
            self._pumps.append(self.server.pump(read, path, max_bytes))
            writers.append(write)
        _redirect_output(*writers)

    def end(self) -> None:
        """The attempt body returned: end what the rank started (it may not outlive the
        attempt), then close the pipes and wait for the output to be in the files."""
        sys.stdout.flush()
        sys.stderr.flush()
        me = os.getpid()
        if self.cgroup is not None:  # (the actor is in it too: it ends with the actor)
            for pid in self.cgroup.pids():
                if pid != me:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        kill_tree(me, include_root=False, reap=True)
        if self.marker is not None:
            kill_marked(self.marker, self.name, exact=True)
        if not self._pumps or self.server is None:
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):  # the last writers of the pipes: their pumps end
            os.dup2(devnull, fd)
        os.close(devnull)
        self.server.wait_ended(self._pumps, _OUTPUT_WAIT_S)
        self._pumps = []
