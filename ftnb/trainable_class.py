"""Ray Tune's class API: :class:`Trainable` with ``setup / step / save_checkpoint /
load_checkpoint / cleanup``, run in a trial process like a function trainable.

    class MyTrainable(ftnb.Trainable):
        def setup(self, config):
            self.x = 0

        def step(self):
            self.x += 1
            return {"score": self.x}

        def save_checkpoint(self, checkpoint_dir):
            return {"x": self.x}

        def load_checkpoint(self, checkpoint):
            self.x = checkpoint["x"]

    ftnb.Tuner(MyTrainable, run_config=ftnb.RunConfig(
        stop={"training_iteration": 10},
        checkpoint_config=ftnb.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=True),
    )).fit()

Fault tolerance is the function API's: each ``step()`` result is a persisted report, each
checkpoint is persisted before the next step, and an attempt that failed (or a driver that died)
resumes in a new process from the latest checkpoint through ``load_checkpoint``, with
``training_iteration`` continuing.
"""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
from typing import Any, Optional, Union

from .core.checkpoint_queries import SHOULD_CHECKPOINT

__all__ = ["Trainable"]

#: Where a ``save_checkpoint`` that returned a dict keeps it in the checkpoint's folder.
_DICT_FILE = ".trainable_state.pkl"


class Trainable:
    """Base class of a class trainable (Ray Tune's ``tune.Trainable``). Override:

    - ``setup(config)``: build the model and state (called once per attempt).
    - ``step() -> dict``: one iteration; the dict is reported (``"done": True`` ends the trial).
    - ``save_checkpoint(checkpoint_dir) -> dict | None``: write state into ``checkpoint_dir``,
      or return a dict of it (pickled into the checkpoint).
    - ``load_checkpoint(checkpoint)``: restore from what ``save_checkpoint`` returned (the
      dict), or the checkpoint's folder path when it returned None.
    - ``cleanup()``: release what ``setup`` took (called when the attempt ends, also on errors).

    ``reset_config`` returns False: ftnb runs each trial in its own process and never reuses
    one for another config. Attributes: ``config``, ``iteration`` (= ``training_iteration``, the
    iterations done so far, restored ones included), ``trial_id``, ``trial_name``.
    """

    def __init__(self, config: Optional[dict] = None) -> None:
        self.config = dict(config or {})
        self._iteration = 0
        self.setup(self.config)

    # -- what subclasses override --------------------------------------------------------------
    def setup(self, config: dict) -> None:
        """Build the trainable's state from ``config``."""

    def step(self) -> dict:
        """One training iteration; returns the metrics to report."""
        raise NotImplementedError(
            f"{type(self).__name__}.step() is not defined. Fix: define `def step(self): ... "
            "return {'loss': loss}` in your Trainable subclass.")

    def save_checkpoint(self, checkpoint_dir: str) -> Optional[dict]:
        """Save state into ``checkpoint_dir`` (or return it as a dict)."""
        return None

    def load_checkpoint(self, checkpoint: Union[dict, str]) -> None:
        """Restore state saved by :meth:`save_checkpoint`."""

    def cleanup(self) -> None:
        """Release resources when the trial (attempt) ends."""

    def reset_config(self, new_config: dict) -> bool:
        """Ray reuses a trainable for another config when this returns True; ftnb never does."""
        return False

    # -- read-only facts -----------------------------------------------------------------------
    @property
    def iteration(self) -> int:
        """Iterations done so far (restored ones included)."""
        return self._iteration

    @property
    def training_iteration(self) -> int:
        return self._iteration

    @property
    def trial_id(self) -> str:
        from .session import get_context

        return get_context().get_trial_id()

    @property
    def trial_resources(self) -> Any:
        """What this trial was given, as Ray's ``Trainable.trial_resources``. A
        ``PlacementGroupFactory``, as ``get_context().get_trial_resources()`` returns."""
        from .session import get_context

        return get_context().get_trial_resources()

    @property
    def trial_name(self) -> str:
        from .session import get_context

        return get_context().get_trial_name()


def is_trainable_class(trainable: Any) -> bool:
    """Whether ``trainable`` is a :class:`Trainable` subclass."""
    return isinstance(trainable, type) and issubclass(trainable, Trainable)


class ClassTrainableRunner:
    """A :class:`Trainable` subclass as the function trainable a trial process runs, with the
    CheckpointConfig's ``checkpoint_frequency`` and ``checkpoint_at_end``."""

    def __init__(self, cls: type, checkpoint_frequency: int, checkpoint_at_end: bool,
                 ask_callbacks: bool = False) -> None:
        self.cls = cls
        #: Whether each result is shown to the driver's callbacks first (SHOULD_CHECKPOINT).
        self.ask_callbacks = ask_callbacks
        self.checkpoint_frequency = checkpoint_frequency
        self.checkpoint_at_end = checkpoint_at_end
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__doc__ = cls.__doc__

    def __call__(self, config: dict) -> None:
        from . import session as session_mod
        from .checkpoint import Checkpoint

        session = session_mod.current_session("Trainable")
        trainable = self.cls.__new__(self.cls)
        trainable._iteration = session.iteration
        trainable.config = dict(config or {})
        try:
            trainable.setup(trainable.config)
            checkpoint = session_mod.get_checkpoint()
            if checkpoint is not None:
                with checkpoint.as_directory() as folder:
                    trainable.load_checkpoint(_saved(folder))
            while True:
                result = trainable.step()
                if not isinstance(result, dict):
                    raise TypeError(
                        f"{self.__name__}.step() must return a dict of metrics; got "
                        f"{type(result).__name__}: {result!r}. Fix: return {{'loss': loss}}.")
                result = dict(result)
                done = bool(result.pop("done", False))
                asked = bool(result.pop(SHOULD_CHECKPOINT, False))
                trainable._iteration += 1
                if asked or self._checkpoint_now(trainable._iteration, result, done, session) \
                        or self._driver_asks(session, result):
                    with tempfile.TemporaryDirectory() as folder:
                        saved = trainable.save_checkpoint(folder)
                        if saved is not None:
                            with open(os.path.join(folder, _DICT_FILE), "wb") as f:
                                pickle.dump(saved, f)
                        session_mod.report(result, checkpoint=Checkpoint.from_directory(folder))
                else:
                    session_mod.report(result)
                if done:
                    return
        finally:
            trainable.cleanup()

    def _checkpoint_now(self, iteration: int, result: dict, done: bool, session: Any) -> bool:
        if self.checkpoint_frequency and iteration % self.checkpoint_frequency == 0:
            return True
        if not self.checkpoint_at_end:
            return False
        return done or _ends_at_report(session, {**result, "training_iteration": iteration})

    def _driver_asks(self, session: Any, result: dict) -> bool:
        """Whether the driver wants a checkpoint with ``result``: a callback set
        SHOULD_CHECKPOINT, or a driver-side stopper ends the trial with it (checkpoint_at_end)."""
        at_end = self.checkpoint_at_end and _stopper_decides(session)
        if not (self.ask_callbacks or at_end):
            return False
        return session.ask_checkpoint(result, at_end=at_end)

    def __repr__(self) -> str:
        return f"<ftnb trainable {self.__name__}>"


def _stopper_decides(session: Any) -> bool:
    """Whether only a driver-side stopper decides at the session's reports (no scheduler)."""
    points = getattr(session, "decision_points", None)
    return bool(getattr(points, "stopper_only", False))


def _ends_at_report(session: Any, row: dict) -> bool:
    """Whether the report of ``row`` will end the attempt: it was asked to stop (a stop request:
    a driver-side stopper, a scheduler, the user; or preemption), it is a scheduler's decision
    point (which may end it: a STOP or a PAUSE), or a ``stop={...}`` threshold
    or an in-trial stopper (``MaximumIterationStopper``, ``TrialPlateauStopper``) is met by it.
    Decided before the report, so that ``checkpoint_at_end``'s checkpoint goes with it, as Ray
    Tune saves one at every STOP decision."""
    from .schedulers.stop_criterion import stop_met

    if session.context.should_checkpoint:
        return True
    if session.poll_stop():
        session.stop_requested = True  # the report ends the attempt, as if it had polled
        return True
    points = getattr(session, "decision_points", None)
    if (points is not None and getattr(session, "wait_decision", None) is not None
            and not points.stopper_only and points.reached(session._decision_value, row)):
        # A scheduler decides at this report (an ASHA rung, a HyperBand milestone, a PBT
        # interval) and may end the trial there: STOP or PAUSE must find its checkpoint on it.
        return True
    stop = session.stop
    if stop is None:
        return False
    if callable(stop):
        # A copy asked: the report asks the stopper itself, which must see each row once.
        stop = copy.deepcopy(stop)
    return stop_met(row, stop, session.context.trial_id)


def _saved(folder: str) -> Union[dict, str]:
    """What :meth:`Trainable.load_checkpoint` gets: the dict ``save_checkpoint`` returned, or
    the checkpoint's folder."""
    path = os.path.join(folder, _DICT_FILE)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    return folder


def show_results_to(trainable: Any, callbacks: Any) -> None:
    """Make a wrapped class trainable show each result to the driver's ``callbacks`` before
    reporting it when one of them may set ``SHOULD_CHECKPOINT`` (callbacks are given again
    on each run, a restore's too, so this is decided when the run starts)."""
    from .callback import asks_checkpoints

    if isinstance(trainable, ClassTrainableRunner):
        trainable.ask_callbacks = asks_checkpoints(callbacks)


def as_function_trainable(trainable: Any, checkpoint_config: Any, stop: Any) -> Any:
    """``trainable`` as a function of the config: a :class:`Trainable` subclass is wrapped with
    the checkpoint settings; a function is returned as it is (and refused with
    ``checkpoint_frequency``/``checkpoint_at_end``, as in Ray Tune). ``stop`` is not needed:
    a trial's session knows its stop criteria (the wrapper asks it)."""
    freq = getattr(checkpoint_config, "checkpoint_frequency", 0) or 0
    at_end = getattr(checkpoint_config, "checkpoint_at_end", None)
    if is_trainable_class(trainable):
        return ClassTrainableRunner(trainable, freq, bool(at_end))
    inner = getattr(trainable, "trainable", None)
    if is_trainable_class(inner) and getattr(trainable, "_ftnb_parameters", None) is None:
        # with_resources(SomeTrainable, ...): the class, asking for what was given.
        runner = ClassTrainableRunner(inner, freq, bool(at_end))
        runner._ftnb_resources = trainable._ftnb_resources  # type: ignore[attr-defined]
        runner._ftnb_resources_of = trainable._ftnb_resources_of  # type: ignore[attr-defined]
        return runner
    if freq or at_end:
        raise ValueError(
            f"CheckpointConfig(checkpoint_frequency={freq}, checkpoint_at_end={at_end}) is for "
            "a class trainable (ftnb.Trainable); a function trainable saves its own checkpoints"
            " with report(..., checkpoint=...). Fix: leave them out, as Ray Tune requires.")
    return trainable
