"""A driver script SIGKILLed at a chosen moment, then run again to its end: the tests of issue
18's fault tolerance (stoppers, with_parameters, the class API, callbacks) share this."""

from __future__ import annotations

from typing import Any, Callable

from procs import run_script, wait_for
from scripted import result_rows


def kill_when(tmp_path, script: str, args: list[str], condition: Callable[[], Any],
              what: str) -> Any:
    """Run ``script`` with ``args``, SIGKILL it once ``condition()`` is truthy (within 60 s),
    and return what the condition returned."""
    proc = run_script(tmp_path, script, *args)
    try:
        return wait_for(condition, timeout=60, what=what)
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def run_to_end(tmp_path, script: str, args: list[str]) -> str:
    """Run ``script`` with ``args`` to its end; it must succeed. Returns its output."""
    proc = run_script(tmp_path, script, *args)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def trial_with_reports(exp, count) -> Any:
    """The folder of a trial of the experiment folder ``exp`` whose result count is in
    ``count`` (a container), or None."""
    for result in exp.glob("*/result.json"):
        if len(result_rows(str(result.parent))) in count:
            return result.parent
    return None


def killed_then_rerun(tmp_path, script: str, args: list[str], condition: Callable[[], Any],
                      what: str) -> str:
    """SIGKILL ``script`` once ``condition()`` holds (:func:`kill_when`), then run it again to
    its end, which must print DONE; returns that run's output."""
    kill_when(tmp_path, script, args, condition, what)
    out = run_to_end(tmp_path, script, args)
    assert "DONE" in out, out
    return out
