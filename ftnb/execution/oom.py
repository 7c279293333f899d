"""Whether a process that died of SIGKILL was killed by the kernel's OOM killer, and whether an
exception a trainable raised is an out-of-memory error (:func:`is_out_of_memory`).

Only a record of that very process counts: its own cgroup's ``oom_kill`` count (when the
process had a memory cgroup of its own) or the kernel's log line naming its pid
(``Killed process <pid>``, ``/dev/kmsg``). Machine-wide counters (``/proc/vmstat``'s
``oom_kill``, a shared cgroup's) count every process's kills: a trial SIGKILLed while something
else ran out of memory is not out of memory. Where neither record can be read (``/dev/kmsg``
needs root or ``CAP_SYSLOG``), a SIGKILL is a signal, never a guess.
"""

from __future__ import annotations

import errno
import os
import re
import time
from typing import Iterable, Optional

__all__ = ["cgroup_oom_kills", "is_out_of_memory", "kernel_killed", "oom_killed"]

# "Out of memory: Killed process 123 (python) ...", "Memory cgroup out of memory: Killed
# process 123 ...", and older kernels' "Kill process 123 (python) score ..." lines.
_KILLED = re.compile(rb"\bKill(?:ed)? process (\d+) ")


def cgroup_oom_kills(cgroup_dir: Optional[str]) -> Optional[int]:
    """The OOM kills counted in a cgroup's own memory files (v2 ``memory.events``, v1
    ``memory.oom_control``), or None where the cgroup has none."""
    if not cgroup_dir:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(cgroup_dir, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def kernel_killed(pid: int, since: float, records: Iterable[bytes]) -> bool:
    """Whether one of the kernel's log ``records`` (``/dev/kmsg`` lines: ``prio,seq,usec,flags;
    text``) says the OOM killer killed ``pid`` at or after ``since`` (``time.monotonic()``
    seconds, the kernel log's clock: the pid may have been another process's before)."""
    for record in records:
        head, _, text = record.partition(b";")
        match = _KILLED.search(text)
        if match is None or int(match.group(1)) != pid:
            continue
        fields = head.split(b",")
        try:
            at = int(fields[2]) / 1e6
        except (IndexError, ValueError):
            continue
        if at >= since:
            return True
    return False


def _kernel_records() -> list[bytes]:
    """The kernel log's records still in its buffer (empty where it cannot be read)."""
    records: list[bytes] = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return records
    try:
        while True:
            try:
                records.append(os.read(fd, 8192))  # one record per read
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while we read: skip on
                    continue
                break  # EAGAIN: the end; EINVAL, EPERM: unreadable
    finally:
        os.close(fd)
    return records


def oom_killed(pid: int, since: float, cgroup_kills: Optional[int] = None) -> bool:
    """Whether the process ``pid``, started at ``since`` (``time.monotonic()``) and dead of
    SIGKILL, was killed by the OOM killer. ``cgroup_kills``: the OOM kills counted in a memory
    cgroup made for the process (:func:`cgroup_oom_kills`; None: it had none, or one without
    memory accounting)."""
    if cgroup_kills is not None:
        return cgroup_kills > 0
    # The kernel writes the record before the kill is delivered, so it is there by the time
    # the death is seen; a moment of grace for a log read in the same instant.
    deadline = time.monotonic() + 0.2
    while True:
        if kernel_killed(pid, since, _kernel_records()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's OutOfMemoryError (CUDA, MPS...), told apart without torch."""
    return isinstance(exc, MemoryError) or any(
        cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__
    )
