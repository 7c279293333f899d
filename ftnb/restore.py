"""Restoring an experiment from its folder alone: finding it, checking a re-specified search
space against the stored one, and re-binding the objects that could not be stored.

The experiment state holds plain JSON. Every object of a search space (a model, a tensor, a
DataFrame, a dataset) was stored with ``ftnb.put`` when the experiment started and appears in
the state as a placeholder ``{"__ftnb_ref__": id, "type", "size", "repr"}``. Restoring pairs
each stored placeholder with the object at the same place of the re-specified space.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .objects import ObjectRef, bind_objects, is_placeholder, walk_placeholders
from .search import encode_space
from .core.records import ExperimentState, StateFormatError, StateVersionError, encode_value
from .storage import ExperimentPaths

__all__ = [
    "DifferentTrainableError",
    "RestoreError",
    "bind_configs",
    "check_same_trainable",
    "describe_location",
    "load_state",
    "space_differences",
]

_LEGACY_OBJECT = "__ftnb_object__"


class RestoreError(ValueError):
    """An experiment cannot be restored as asked; the message says why and how to fix it."""


class DifferentTrainableError(RestoreError):
    """The trainable given to resume an experiment is not named like the one it started with.

    Attributes: ``recorded`` (the name in the experiment's state), ``given`` (the name of the
    one given), ``path`` (the experiment's folder)."""

    def __init__(self, message: str, recorded: str, given: str, path: str) -> None:
        super().__init__(message)
        self.recorded, self.given, self.path = recorded, given, path


def check_same_trainable(paths: ExperimentPaths, state: ExperimentState, given: str) -> None:
    """Raise :class:`DifferentTrainableError` when ``given`` (a trainable's name) is not the
    name the experiment's state records (states that record none pass)."""
    recorded = state.trainable
    if not isinstance(recorded, str) or recorded in ("", "?") or recorded == given:
        return
    raise DifferentTrainableError(
        f"Cannot resume {paths.uri} with the trainable {given!r}: the experiment was run by "
        f"{recorded!r}, and resuming its trials with other code would mix two programs in one "
        f"experiment. Fix: pass {recorded} again, or pass allow_different_trainable=True if "
        f"{given} is the same training under another name (a fixed version, say).",
        recorded, given, paths.uri,
    )


def describe_location(paths: ExperimentPaths) -> str:
    """What is at ``paths.dir``, for an error that says there is no experiment there."""
    storage = paths.storage
    if not storage.exists(paths.dir):
        return "that path does not exist"
    if not storage.isdir(paths.dir):
        return "it is a file, not a folder"
    names = storage.listdir(paths.dir)
    if not names:
        return "the folder is empty"
    experiments = [
        n for n in names if storage.exists(ExperimentPaths.of(storage, n, folder=paths.dir).state)
    ]
    if experiments:
        shown = ", ".join(experiments[:5]) + (" ..." if len(experiments) > 5 else "")
        return (
            f"it is a storage folder that holds experiments ({shown}): pass one of them, e.g. "
            f"{ExperimentPaths.of(storage, experiments[0], folder=paths.dir).uri!r}"
        )
    if "tuner.pkl" in names or any(n.startswith("experiment_state-") for n in names):
        return "it looks like a Ray Tune experiment (tuner.pkl), which ftnb cannot restore"
    shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
    return f"the folder holds no experiment_state.json (it has: {shown})"


def load_state(paths: ExperimentPaths, what: str = "restore") -> ExperimentState:
    """The experiment's state, or a :class:`RestoreError` naming what was found instead."""
    if not paths.has_state():
        raise RestoreError(
            f"Cannot {what} {paths.uri}: no ftnb experiment there; {describe_location(paths)}. "
            "Fix: pass the experiment's folder, i.e. <storage_path>/<name> (`ftnb ls "
            "<storage_path>` lists them)."
        )
    try:
        return ExperimentState.load(paths)
    except StateVersionError as exc:
        raise RestoreError(f"Cannot {what} {paths.uri}: {exc}") from None
    except StateFormatError as exc:
        raise RestoreError(
            f"Cannot {what} {paths.uri}: {exc}. The state and its previous generation are both "
            "unreadable; the trials' result.json files and checkpoints are intact."
        ) from None


# -- comparing search spaces -------------------------------------------------------------------
def space_differences(stored: Any, new: Any, path: str = "") -> list[str]:
    """How the encoded space ``new`` differs from ``stored``, one line per difference.

    Objects (ref placeholders) may be replaced by any object; everything else (keys, grid sizes,
    domains, plain values) must be equal.
    """
    where = path or "<the whole space>"
    if is_placeholder(stored) or _is_legacy(stored):
        if is_placeholder(new):
            return []
        return [f"{where}: was an object ({_type_of(stored)}), now {_describe(new)}"]
    if is_placeholder(new):
        return [f"{where}: was {_describe(stored)}, now an object ({_type_of(new)})"]
    if isinstance(stored, dict) and isinstance(new, dict):
        if "grid_search" in stored and "grid_search" in new:
            old_grid, new_grid = stored["grid_search"], new["grid_search"]
            if len(old_grid) != len(new_grid):
                return [
                    f"{path}: grid_search of {len(old_grid)} values, now {len(new_grid)}"
                ]
        out = []
        for key in stored:
            sub = f"{path}/{key}" if path else str(key)
            if key not in new:
                out.append(f"{sub}: missing (it was {_describe(stored[key])})")
            else:
                out.extend(space_differences(stored[key], new[key], sub))
        for key in new:
            if key not in stored:
                sub = f"{path}/{key}" if path else str(key)
                out.append(f"{sub}: new key (not in the original space)")
        return out
    if isinstance(stored, list) and isinstance(new, list):
        if len(stored) != len(new):
            return [f"{where}: a list of {len(stored)} values, now {len(new)}"]
        out = []
        for i, (a, b) in enumerate(zip(stored, new)):
            out.extend(space_differences(a, b, f"{path}[{i}]"))
        return out
    if _same_plain(stored, new):
        return []
    return [f"{where}: was {_describe(stored)}, now {_describe(new)}"]


def _same_plain(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float))
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b
    )


def _is_legacy(value: Any) -> bool:
    return isinstance(value, dict) and _LEGACY_OBJECT in value


def _type_of(placeholder: dict) -> str:
    return str(placeholder.get("type") or placeholder.get(_LEGACY_OBJECT) or "object")


def _describe(value: Any) -> str:
    if is_placeholder(value) or _is_legacy(value):
        return f"an object ({_type_of(value)})"
    if isinstance(value, dict) and "grid_search" in value:
        return f"a grid_search of {len(value['grid_search'])} values"
    if isinstance(value, dict) and "__ftnb_domain__" in value:
        return f"the domain {json.dumps(value, default=str)[:80]}"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# -- re-binding objects ------------------------------------------------------------------------
def needed_objects(configs: dict[str, Any]) -> list[tuple[str, str]]:
    """(key path, type) of every object the given stored configs refer to, without repeats."""
    seen: dict[str, str] = {}
    for config in configs.values():
        for key, placeholder in walk_placeholders(config):
            seen.setdefault(key, _type_of(placeholder))
        for key, legacy in _walk_legacy(config, ""):
            seen.setdefault(key, _type_of(legacy))
    return sorted(seen.items())


def _walk_legacy(value: Any, path: str) -> list[tuple[str, dict]]:
    if _is_legacy(value):
        return [(path, value)]
    out = []
    if isinstance(value, dict) and not is_placeholder(value):
        for k, v in value.items():
            out.extend(_walk_legacy(v, f"{path}/{k}" if path else str(k)))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out.extend(_walk_legacy(v, f"{path}[{i}]"))
    return out


def bind_configs(
    state: ExperimentState, stored_configs: dict[str, Any], param_space: Any
) -> tuple[dict[str, Any], Any]:
    """Pair the stored space's objects with those of ``param_space`` and put them into the stored
    configs. Returns (configs by trial id, the re-bound space). Raises :class:`RestoreError`
    listing every difference when the structures differ."""
    bound_space, _ = bind_objects(param_space)
    new_encoded = encode_space(bound_space, encode_value)
    differences = space_differences(state.param_space, new_encoded)
    if differences:
        shown = "\n  ".join(differences[:20])
        more = f"\n  ... and {len(differences) - 20} more" if len(differences) > 20 else ""
        raise RestoreError(
            "Tuner.restore(param_space=...) must have the same structure as the original space: "
            "same keys, same grid sizes and domains, same plain values; only the objects "
            "(models, tensors, datasets, ftnb.put refs) may be given anew. Restoring resumes the "
            f"exact experiment; it cannot change the search. Differences:\n  {shown}{more}\n"
            "Fix: pass the original space with the objects re-created, or start a new "
            "experiment (another name) to search something else."
        )
    refs = {ref.id: ref for ref in _refs_in(bound_space)}
    mapping: dict[str, ObjectRef] = {}
    for (_, old), (_, new) in zip(walk_placeholders(state.param_space),
                                  walk_placeholders(new_encoded)):
        mapping.setdefault(old["__ftnb_ref__"], refs[new["__ftnb_ref__"]])
    configs = {}
    for trial_id, config in stored_configs.items():
        missing = [
            key for key, p in walk_placeholders(config) if p["__ftnb_ref__"] not in mapping
        ]
        if missing or _walk_legacy(config, ""):
            keys = missing or [k for k, _ in _walk_legacy(config, "")]
            raise RestoreError(
                f"Trial {trial_id}'s config holds objects at {', '.join(keys)} that do not come "
                "from the search space (a sample_from function made them), so they cannot be "
                "re-bound. Fix: put such objects in the space itself (or create them inside "
                "the trainable from plain config values)."
            )
        configs[trial_id] = _substitute(config, mapping)
    return configs, bound_space


def _refs_in(value: Any) -> list[ObjectRef]:
    from .search import Domain

    if isinstance(value, ObjectRef):
        return [value]
    if isinstance(value, Domain):
        value = getattr(value, "categories", [])
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _refs_in(v)]
    return []


def _substitute(value: Any, mapping: dict[str, ObjectRef]) -> Any:
    if is_placeholder(value):
        return mapping[value["__ftnb_ref__"]]
    if isinstance(value, dict):
        return {k: _substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, mapping) for v in value)
    return value


def missing_objects_message(paths: ExperimentPaths, trainable_name: str,
                            needed: list[tuple[str, str]]) -> str:
    keys = ", ".join(f"{key} ({kind})" for key, kind in needed)
    return (
        f"The experiment at {paths.uri} has trials to resume whose configs hold objects that "
        f"are not saved with the experiment: {keys}. Pass the search space again with those "
        f"objects re-created: Tuner.restore({paths.uri!r}, {trainable_name}, "
        "param_space=param_space) (or ftnb.run(..., param_space=param_space)), where "
        "param_space is the original space (same keys, grids and values)."
    )


def stored_configs(state: ExperimentState, trial_ids: Optional[set] = None) -> dict[str, Any]:
    return {
        t.trial_id: t.config for t in state.trials if trial_ids is None or t.trial_id in trial_ids
    }

