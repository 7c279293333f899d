"""The body of a trial process, shared by every executor that runs attempts in processes.

It decodes the attempt's payload, runs the trainable under a :class:`~ftnb.session.TrialSession`,
and tells the controller how the attempt ended through ``conn``:

* ``("started", {"pid"})`` first,
* ``("result", row)`` after every persisted report,
* ``("error", {...})`` when the trainable raised, exited non-zero, or misused the API,
* ``("done", {"outcome"})`` when it ended on its own terms (finished, stopped, preempted).

The process's exit code and signal are reported by the executor, which sees them from outside.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from .executors.base import EXIT_PREEMPTED

EXIT_OK = 0
EXIT_ERROR = 1


def run_attempt(payload: bytes, conn: Any) -> int:
    import cloudpickle

    from . import session as session_mod
    from .objects import ObjectUnavailableError, resolve_refs
    from .results import ResultLog
    from .storage import ExperimentPaths

    def send(kind: str, data: Any) -> None:
        conn.send((kind, data))

    last_poll = [0.0]

    def poll_stop() -> bool:
        # Connection.poll builds a selector per call: look at most every 20 ms, not per report.
        now = time.monotonic()
        if now - last_poll[0] < 0.02:
            return False
        last_poll[0] = now
        try:
            while conn.poll(0):
                kind, _ = conn.recv()
                if kind == "stop":
                    return True
        except (EOFError, OSError):
            # The controller is gone; the fork server's exit will kill us, but stop anyway.
            return True
        return False

    send("started", {"pid": os.getpid()})
    try:
        spec = cloudpickle.loads(payload)
    except BaseException as exc:  # the trainable could not be unpickled (a missing module...)
        _send_exception(send, exc, "exception")
        return EXIT_ERROR

    storage = spec["storage"]
    experiment = ExperimentPaths(storage, spec["experiment_dir"])
    paths = experiment.trial(spec["trial_dir_name"])
    log = ResultLog(paths, existing=spec.get("rows"))
    fence = None
    if spec.get("fence"):
        from .lease import Fence

        fence = Fence(experiment, spec["fence"])
    context = session_mod.TrialContext(
        trial_id=spec["trial_id"],
        trial_name=spec["trial_id"],
        experiment_name=spec["experiment_name"],
        experiment_path=experiment.uri,
        trial_dir=storage.uri(paths.dir),
        attempt=spec["attempt"],
    )
    session = session_mod.TrialSession(
        context=context,
        storage=storage,
        paths=paths,
        log=log,
        send=send,
        poll_stop=poll_stop,
        start_iteration=spec["start_iteration"],
        time_offset=spec["time_offset"],
        next_checkpoint_index=spec["next_checkpoint_index"],
        restore_checkpoint=spec["restore_checkpoint"],
        stop=spec["stop"],
        checkpoint_score_attribute=spec["checkpoint_score_attribute"],
        metric=spec.get("metric"),
        fence=fence,
    )
    session_mod._set_session(session)
    _install_preemption_handler(session, spec["preemption_grace_period_s"], send)

    trainable = spec["trainable"]
    try:
        config = resolve_refs(spec["config"])
    except ObjectUnavailableError as exc:  # the driver that put it is gone: retrying cannot help
        _send_exception(send, exc, "usage")
        return EXIT_ERROR
    try:
        returned = trainable(config)
        if isinstance(returned, dict) and returned:
            session.report(returned)  # Ray's function API: a returned dict is the final result
        outcome = "finished"
    except session_mod._AttemptEnd as end:
        outcome = end.outcome
        if isinstance(end, session_mod._Fenced):
            print(f"ftnb: {end}", file=sys.stderr, flush=True)
    except session_mod.UsageError as exc:
        _send_exception(send, exc, "usage")
        return EXIT_ERROR
    except SystemExit as exc:
        code = exc.code
        if code in (None, 0):
            outcome = "finished"
        else:
            numeric = code if isinstance(code, int) else 1
            send("error", {"kind": "exit", "exit_code": numeric, "message": f"sys.exit({code!r})",
                           "iteration": session.iteration})
            return numeric
    except BaseException as exc:
        _send_exception(send, exc, "oom" if _is_out_of_memory(exc) else "exception",
                        session.iteration)
        return EXIT_ERROR
    finally:
        log.close()
    send("done", {"outcome": outcome, "iteration": session.iteration})
    return EXIT_OK


def _is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's OutOfMemoryError (CUDA, MPS...), told apart without torch."""
    return isinstance(exc, MemoryError) or any(
        cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__
    )


def _send_exception(send: Any, exc: BaseException, kind: str, iteration: int = 0) -> None:
    frames = exc.__traceback__
    # The first frame is ftnb calling the trainable: start the traceback at the user's code.
    if (
        frames is not None
        and frames.tb_next is not None
        and frames.tb_frame.f_code.co_filename == __file__
    ):
        frames = frames.tb_next
    tb = "".join(traceback.format_exception(type(exc), exc, frames))
    # The traceback also goes to the trial's stderr, where users look first.
    print(tb, file=sys.stderr, flush=True)
    send(
        "error",
        {
            "kind": kind,
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": tb,
            "iteration": iteration,
        },
    )


def _install_preemption_handler(session: Any, grace_s: float, send: Any) -> None:
    """SIGTERM means the slot is going away: ask for a checkpoint, then leave in time."""

    def on_sigterm(signum: int, frame: Any) -> None:
        if session.preempted:
            return
        session.preempted = True
        try:
            send("preempted", {"iteration": session.iteration})
        except OSError:
            pass

        def leave() -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_PREEMPTED)

        timer = threading.Timer(grace_s, leave)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_sigterm)
