"""Ray Tune's trainable wrappers: :func:`with_parameters` (large objects shared by every trial,
through :func:`ftnb.put`) and :func:`with_resources` (what each trial asks for).

    import ftnb as tune

    def train(config, data):
        ...

    trainable = tune.with_resources(tune.with_parameters(train, data=data), {"cpu": 2})
    tune.Tuner(trainable, param_space={"lr": tune.loguniform(1e-4, 1e-1)}).fit()

The objects are not saved with the experiment (no user objects in the state): to resume it,
pass ``tune.with_parameters(train, data=data)`` again (``Tuner.restore(path, trainable)`` or the
same script run again); a restore with the plain ``train`` is refused before anything runs.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .config import callable_name
from .input_checks import check_trainable, short_repr

if TYPE_CHECKING:
    from .execution.resources import TrialResources

__all__ = ["with_parameters", "with_resources"]


class _WrappedTrainable:
    """A trainable that calls another one: named after it, and carrying what the wrappers add
    (``_ftnb_parameters``: the names given to with_parameters; ``_ftnb_resources``: the request
    given to with_resources)."""

    def __init__(self, trainable: Any) -> None:
        self.trainable = trainable
        self.__name__ = callable_name(trainable)
        self.__qualname__ = getattr(trainable, "__qualname__", self.__name__)
        self.__doc__ = getattr(trainable, "__doc__", None)
        self._ftnb_parameters = getattr(trainable, "_ftnb_parameters", None)
        self._ftnb_resources = getattr(trainable, "_ftnb_resources", None)

    def __call__(self, config: dict) -> Any:
        return self.trainable(config)

    def __repr__(self) -> str:
        return f"<ftnb trainable {self.__name__}>"

    def _ftnb_resources_of(self, trial_id: str, config: Any) -> Optional["TrialResources"]:
        """What trial ``trial_id`` asks for with ``config`` when with_resources was given a
        function of the config (None otherwise): the controller asks again when the config
        changes under a trial (PopulationBasedTraining's exploit)."""
        if not callable(self._ftnb_resources):
            return None
        return _resources_for(self._ftnb_resources, trial_id, config)


class _WithParameters(_WrappedTrainable):
    def __init__(self, trainable: Any, refs: dict) -> None:
        super().__init__(trainable)
        self.refs = refs
        self._ftnb_parameters = sorted(refs)

    def __call__(self, config: dict) -> Any:
        from .objects import get

        return self.trainable(config, **{name: get(ref) for name, ref in self.refs.items()})


def with_parameters(trainable: Callable, **kwargs: Any) -> Callable[[dict], Any]:
    """``trainable`` (a function ``trainable(config, **kwargs)``) as a trainable of ``config``
    alone, each of ``kwargs`` stored once with :func:`ftnb.put` and given to every trial
    (memory-mapped on this machine, through the object store on a Ray cluster), as Ray Tune's
    ``tune.with_parameters``::

        tuner = ftnb.Tuner(ftnb.with_parameters(train, data=data), param_space=space)

    Raises TypeError when ``trainable`` cannot be called as ``trainable(config, **kwargs)``.
    """
    if not callable(trainable) or isinstance(trainable, type):
        raise TypeError(
            f"with_parameters(trainable=...) must be a function (config, **objects); got "
            f"{short_repr(trainable)}. Fix: def train(config, data): ...; "
            "ftnb.with_parameters(train, data=data).")
    try:
        inspect.signature(trainable).bind({}, **kwargs)
    except TypeError as exc:
        name = callable_name(trainable)
        given = ", ".join(kwargs) or "nothing"
        raise TypeError(
            f"with_parameters({name}, {given}): {name} cannot be called as "
            f"{name}(config, {', '.join(f'{k}=...' for k in kwargs)}): {exc}. Fix: define it as "
            f"`def {name}(config, {', '.join(kwargs)}): ...`.") from None
    except ValueError:
        pass  # no signature to inspect: calling it will tell
    from .objects import ObjectRef, put

    refs = {name: value if isinstance(value, ObjectRef) else put(value)
            for name, value in kwargs.items()}
    return _WithParameters(trainable, refs)


class _WithResources(_WrappedTrainable):
    def __init__(self, trainable: Any, resources: Any) -> None:
        super().__init__(trainable)
        self._ftnb_resources = resources


def with_resources(
    trainable: Callable,
    resources: Union[dict, Callable[[dict], dict]],
) -> Callable[[dict], Any]:
    """``trainable`` with the resources each of its trials gets, as Ray Tune's
    ``tune.with_resources``: a dict (``{"cpu": 2, "gpu": 1}``, Ray's ``"CPU"``/``"GPU"`` too) or a
    function of the trial's config returning one (``lambda config: {"gpu": 1 if
    config["big"] else 0}``). It takes the place of ``Tuner(resources_per_trial=...)``; trials
    start only when what they ask for is free. ``get_context().get_trial_resources()`` tells a
    trial what it got."""
    from .execution.resources import TrialResources

    check_trainable(trainable, "with_resources")
    if not callable(resources):
        TrialResources.from_user(resources)  # a bad request fails here, naming the argument
    return _WithResources(trainable, resources)


def trial_resources_of(trainable: Any, configs: dict) -> tuple[Any, dict]:
    """What ``with_resources`` asked for: (the request every trial makes or None, the requests
    by trial id when it is a function of the config)."""
    from .execution.resources import TrialResources

    resources = getattr(trainable, "_ftnb_resources", None)
    if resources is None:
        return None, {}
    if not callable(resources):
        return TrialResources.from_user(resources), {}
    return None, {trial_id: _resources_for(resources, trial_id, config)
                  for trial_id, config in configs.items()}


def _resources_for(resources: Callable[[Any], Any], trial_id: str,
                   config: Any) -> "TrialResources":
    from .execution.resources import TrialResources

    try:
        request = resources(config)
    except Exception as exc:
        raise TypeError(
            f"with_resources(resources={callable_name(resources)}) failed on the config of "
            f"trial {trial_id} ({short_repr(config)}): {type(exc).__name__}: {exc}. Fix: "
            "make it return a dict such as {'cpu': 1, 'gpu': 0} for every config."
        ) from exc
    return TrialResources.from_user(request)
