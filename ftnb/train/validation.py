"""Asynchronous validation of reported checkpoints (Ray Train 2.60's names):
``TorchTrainer(..., validation_config=ValidationConfig(fn, task_config))`` and
``ftnb.report(metrics, checkpoint=..., validation=True | ValidationTaskConfig(...))``.

* :class:`ValidationConfig`, :class:`ValidationTaskConfig`: checked when made (a clear error
  naming the argument, the value and the fix).
* :func:`validation_request`: what one ``report(validation=...)`` asks for, checked before the
  report does any work.
* :class:`ValidationRunner`: the validations of one attempt, run in order by one thread, each
  ``fn(checkpoint, **fn_kwargs)`` in a process of its own (``python -m ftnb.train.validation``,
  the function, checkpoint and keywords cloudpickled over its stdin: nothing read from storage
  names code to run). The training thread never waits for it, except at the attempt's end.

Where it is recorded: the report's row carries ``"validation": {"status": "pending",
"fn_kwargs": {...}}`` from the start (so a validation pending when the trial's process or the
driver dies is found again and run by the next attempt); once it ends the row is rewritten in
``result.json`` with the metrics merged in (the validated value wins on a shared key) and the
status ``"done"``, or ``"error"`` with the error's text. A row moves out of ``"pending"`` once:
a result is recorded at most once and never lost once recorded.

Threads: :meth:`ValidationRunner.submit` is called by whichever thread persisted the row (the
training thread, or the upload thread for ``ASYNC``); :meth:`ValidationRunner.finished` and
:meth:`ValidationRunner.wait` by the training thread only, which alone writes the rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..core.live_attempt import VALIDATION_RECORD

__all__ = ["PENDING", "AttemptValidations", "VALIDATION_KEY", "ValidationConfig", "ValidationRunner",
           "ValidationTaskConfig", "merged_row", "pending_validations", "validation_request"]

#: The row key that records a validation's state.
VALIDATION_KEY = "validation"
PENDING, DONE, ERROR = "pending", "done", "error"


def _check_kwargs(fn_kwargs: Any, where: str) -> dict:
    if fn_kwargs is None:
        return {}
    if not isinstance(fn_kwargs, dict) or not all(isinstance(k, str) for k in fn_kwargs):
        raise TypeError(f"{where}(fn_kwargs=...) must be a dict of keyword names to values; got "
                        f"{type(fn_kwargs).__name__}: {fn_kwargs!r}. Fix: fn_kwargs={{'split': "
                        "'val'}.")
    try:
        json.dumps(fn_kwargs)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}(fn_kwargs={fn_kwargs!r}) must be JSON (it is recorded with the "
                        f"report, to run the validation again after a crash): {exc}. Fix: pass "
                        "names, paths and numbers, and load the data inside the function.") from None
    return dict(fn_kwargs)


@dataclass
class ValidationTaskConfig:
    """The keyword arguments of one validation: ``fn(checkpoint, **fn_kwargs)``. Given to
    :class:`ValidationConfig` (the defaults) or to ``report(validation=...)`` (that report's,
    replacing the defaults). ``fn_kwargs`` must be JSON, as in Ray.

    >>> ValidationTaskConfig(fn_kwargs={"split": "val"}).fn_kwargs
    {'split': 'val'}
    """

    fn_kwargs: Optional[dict] = None

    def __post_init__(self) -> None:
        self.fn_kwargs = _check_kwargs(self.fn_kwargs, "ValidationTaskConfig")


@dataclass
class ValidationConfig:
    """How the checkpoints reported with ``validation=True`` are validated, given to
    ``TorchTrainer(validation_config=...)``: ``fn(checkpoint, **fn_kwargs) -> dict`` runs in a
    process of its own while training goes on; the dict's metrics are merged into the report's
    row. ``ray_remote_kwargs`` is accepted for Ray's signature and not used (the validation runs
    as a local process beside the trial's rank 0).

    >>> def validate(checkpoint, split="val"):
    ...     return {"val_loss": 0.1}
    >>> ValidationConfig(validate).task_config
    ValidationTaskConfig(fn_kwargs={})
    """

    fn: Callable[..., dict]
    task_config: Optional[ValidationTaskConfig] = None
    ray_remote_kwargs: Optional[dict] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(
                f"ValidationConfig(fn=...) must be a function; got {type(self.fn).__name__}: "
                f"{self.fn!r}. Fix: ValidationConfig(fn=validate) with "
                "`def validate(checkpoint, **kwargs): return {'val_loss': ...}`.")
        if self.task_config is None:
            self.task_config = ValidationTaskConfig()
        elif not isinstance(self.task_config, ValidationTaskConfig):
            raise TypeError(
                f"ValidationConfig(task_config=...) must be a ValidationTaskConfig; got "
                f"{type(self.task_config).__name__}: {self.task_config!r}. Fix: task_config="
                "ftnb.ValidationTaskConfig(fn_kwargs={...}).")


def validation_request(validation: Any, config: Optional[ValidationConfig],
                       has_checkpoint: Optional[bool], metrics: dict) -> Optional[dict]:
    """The ``fn_kwargs`` of the validation that ``report(validation=...)`` asks for, or None
    for none; a ValueError naming the mistake. ``has_checkpoint`` None: not known yet (a rank of
    a group, whose checkpoint may be merged from the others')."""
    if validation is None or validation is False:
        return None
    if validation is not True and not isinstance(validation, ValidationTaskConfig):
        raise ValueError(
            f"report(validation={validation!r}) must be True, False or a ValidationTaskConfig. "
            "Fix: validation=True, or validation=ftnb.ValidationTaskConfig(fn_kwargs={...}).")
    if config is None:
        raise ValueError(
            f"report(validation={validation!r}) but the trainer has no validation function. "
            "Fix: TorchTrainer(..., validation_config=ftnb.ValidationConfig(fn=validate)).")
    if has_checkpoint is False:
        raise ValueError(
            f"report(validation={validation!r}) without a checkpoint: a validation validates the "
            "report's checkpoint. Fix: report(metrics, checkpoint=ftnb.Checkpoint."
            "from_directory(folder), validation=True), or leave validation out.")
    if VALIDATION_KEY in metrics:
        raise ValueError(
            f"report(validation={validation!r}) with a metric named {VALIDATION_KEY!r}, which "
            "records the validation's state. Fix: rename that metric.")
    task = validation if isinstance(validation, ValidationTaskConfig) else config.task_config
    assert task is not None and task.fn_kwargs is not None
    return dict(task.fn_kwargs)


def pending_validations(rows: list[dict]) -> list[tuple[str, dict]]:
    """(checkpoint name, fn_kwargs) of the rows whose validation never ended (its trial's
    process or driver died first): the next attempt runs them again."""
    out = []
    for row in rows:
        state = row.get(VALIDATION_KEY)
        if isinstance(state, dict) and state.get("status") == PENDING \
                and row.get("checkpoint_dir_name"):
            out.append((row["checkpoint_dir_name"], dict(state.get("fn_kwargs") or {})))
    return out


def merged_row(row: dict, outcome: dict, reserved: Any = ()) -> Optional[dict]:
    """``row`` with the validation's ``outcome`` (``metrics`` or ``error``) recorded, or None
    when the row's validation is not pending (recorded already: never twice). Metrics named
    in ``reserved`` (ftnb's own keys: ``training_iteration``, ...) are left out."""
    state = row.get(VALIDATION_KEY)
    if not isinstance(state, dict) or state.get("status") != PENDING:
        return None
    kwargs = state.get("fn_kwargs") or {}
    if "error" in outcome:
        return {**row, VALIDATION_KEY: {"status": ERROR, "fn_kwargs": kwargs,
                                         "error": outcome["error"]}}
    new = {**row, **{k: v for k, v in outcome["metrics"].items()
                     if k not in reserved and k not in (VALIDATION_KEY, "checkpoint_dir_name")}}
    new[VALIDATION_KEY] = {"status": DONE, "fn_kwargs": kwargs}
    return new


class ValidationRunner:
    """See the module's docstring. ``fn``: the trainer's validation function; ``checkpoint``:
    a checkpoint's name -> its :class:`~ftnb.Checkpoint` in storage."""

    def __init__(self, fn: Callable[..., dict], checkpoint: Callable[[str], Any]) -> None:
        self.fn = fn
        self.checkpoint = checkpoint
        self._todo: deque[tuple[str, dict]] = deque()
        self._done: list[tuple[str, dict]] = []
        self._busy = 0
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def submit(self, name: str, fn_kwargs: dict) -> None:
        """Validate the checkpoint ``name`` (whose row is persisted) once those before it are."""
        with self._cond:
            self._todo.append((name, fn_kwargs))
            self._busy += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ftnb-validations",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def finished(self) -> list[tuple[str, dict]]:
        """The validations that ended since the last call: (name, outcome), in order."""
        with self._cond:
            done, self._done = self._done, []
            return done

    def wait(self) -> None:
        """Until every submitted validation ended."""
        with self._cond:
            while self._busy:
                self._cond.wait(0.5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._todo:
                    self._cond.wait()
                name, kwargs = self._todo.popleft()
            try:
                outcome = run_validation(self.fn, self.checkpoint(name), kwargs)
            except BaseException as exc:  # e.g. the function does not pickle
                outcome = {"error": f"{type(exc).__name__}: {exc}"}
            with self._cond:
                self._done.append((name, outcome))
                self._busy -= 1
                self._cond.notify_all()


class AttemptValidations:
    """The validations of one attempt, on its rank 0 (the one that records rows): submits
    those whose rows are persisted, and records their outcomes in the rows, from the training
    thread (one writer of the trial's files at a time, see
    :mod:`~ftnb.storage.checkpoint_uploads`)."""

    def __init__(self, session: Any, config: ValidationConfig, reserved: Any) -> None:
        self.session = session
        self.config = config
        self.reserved = frozenset(reserved)
        self.runner = ValidationRunner(
            config.fn, lambda name: _checkpoint_at(session, name))

    def resume(self) -> None:
        """Run again the validations that an earlier attempt left pending."""
        for name, kwargs in pending_validations(self.session.log.rows):
            self.runner.submit(name, kwargs)

    def record_finished(self) -> None:
        """Record the validations that ended (training thread; never waits for one)."""
        s = self.session
        for name, outcome in self.runner.finished():
            job = _RecordJob(self, name, outcome)
            if s._uploads is None or s._uploads.idle():
                job()
            else:  # behind the rows queued for upload: one writer, in order
                s._uploads.put(job, False)

    def finish(self) -> None:
        """The attempt's end: wait for every validation and record it."""
        self.runner.wait()
        self.record_finished()

    def record(self, name: str, outcome: dict) -> None:
        s = self.session
        rows = list(s.log.rows)
        at = next((i for i, r in enumerate(rows) if r.get("checkpoint_dir_name") == name), None)
        new = merged_row(rows[at], outcome, self.reserved) if at is not None else None
        if new is None:
            return  # recorded already, or its row is gone (past a restore): never twice
        rows[at] = new
        s._check_fence(force=True)
        s.log.rewrite(rows)
        s.send("result", {VALIDATION_RECORD: name, "row": new})


class _RecordJob:
    def __init__(self, owner: AttemptValidations, name: str, outcome: dict) -> None:
        self.owner, self.name, self.outcome = owner, name, outcome

    def __call__(self) -> None:
        self.owner.record(self.name, self.outcome)


def _checkpoint_at(session: Any, name: str) -> Any:
    from ..checkpoint import Checkpoint

    return Checkpoint(session.paths.checkpoint(name), session.storage.fs)


def run_validation(fn: Callable[..., dict], checkpoint: Any, fn_kwargs: dict) -> dict:
    """``fn(checkpoint, **fn_kwargs)`` in a new process: ``{"metrics": {...}}`` or
    ``{"error": text}`` (what it raised, or how its process ended)."""
    import cloudpickle

    payload = cloudpickle.dumps((fn, checkpoint, fn_kwargs))
    env = dict(os.environ)
    # The child finds the modules the function lives in as this process does.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with tempfile.TemporaryDirectory(prefix="ftnb-validation-") as tmp:
        out = os.path.join(tmp, "outcome.json")
        proc = subprocess.run([sys.executable, "-m", "ftnb.train.validation", out, str(os.getpid())],
                              input=payload, env=env)
        try:
            with open(out, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {"error": f"the validation's process ended with exit code {proc.returncode} "
                             "before recording a result"}


def _watch_parent(parent: int) -> None:
    """End this process when the trial's process that started it is gone (a SIGKILL): its
    result could not be recorded, and the next attempt runs it again."""
    import time

    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.2)


def _main(out: str, parent: int) -> None:
    import cloudpickle

    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        fn, checkpoint, kwargs = cloudpickle.loads(sys.stdin.buffer.read())
        metrics = fn(checkpoint, **kwargs)
        if not isinstance(metrics, dict) or not all(isinstance(k, str) for k in metrics):
            raise TypeError(f"the validation function returned {type(metrics).__name__}: "
                            f"{metrics!r}, not a dict of metric names to values. Fix: return "
                            "{'val_loss': ...}.")
        from ..core.records import encode_metrics

        outcome: dict = {"metrics": json.loads(json.dumps(encode_metrics(metrics), default=str))}
    except BaseException as exc:
        traceback.print_exc()
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(outcome, f)
    os.replace(tmp, out)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
