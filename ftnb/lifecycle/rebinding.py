"""Pairing a restored experiment's stored objects with those given again.

The experiment state holds plain JSON. Every object of a search space (a model, a tensor, a
DataFrame, a dataset) was stored with ``ftnb.put`` when the experiment started and appears in
the state as a placeholder ``{"__ftnb_ref__": id, "type", "size", "repr"}``. Restoring pairs
each stored placeholder with the object at the same place of the re-specified space: the
spaces are compared first (:func:`space_differences`), then the objects re-bound
(:func:`bind_configs`). Nothing here writes.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ..core.records import ExperimentState, encode_value
from ..objects import ObjectRef, bind_objects, is_placeholder, walk_placeholders
from ..search import encode_space
from ..storage import ExperimentPaths
from .stored import RestoreError

__all__ = [
    "bind_configs",
    "missing_objects_message",
    "needed_objects",
    "space_differences",
    "stored_configs",
    "with_originals",
]

#: What a large plain value shared with ``ftnb.put`` (``objects.SHARED_PLAIN_BYTES``) is.
_SHARED_PLAIN_TYPES = ("list", "tuple", "str")

#: The stand-in that ``encode_value`` writes for an object not put with ``ftnb.put`` (in states
#: written before ``ftnb.put``, every object): its type and repr, nothing to re-bind it by.
_LEGACY_OBJECT = "__ftnb_object__"


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
        if _type_of(new) in _SHARED_PLAIN_TYPES and isinstance(stored, (list, str)) and \
                (_type_of(new) == "str") == isinstance(stored, str):
            # A large plain value, shared now, that an older version copied into the space:
            # its trials keep the copy they have (their configs are stored whole).
            return []
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
    stored_at = dict(walk_placeholders(state.param_space))  # (paired by key path: a value
    for path, new in walk_placeholders(new_encoded):         # shared only now has no pair)
        old = stored_at.get(path)
        if old is not None:
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
    from ..search import Domain

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
    """The error for a restore without the search space whose trials need the objects
    ``needed`` (:func:`needed_objects`)."""
    keys = ", ".join(f"{key} ({kind})" for key, kind in needed)
    return (
        f"The experiment at {paths.uri} has trials to resume whose configs hold objects that "
        f"are not saved with the experiment: {keys}. Pass the search space again with those "
        f"objects re-created: Tuner.restore({paths.uri!r}, {trainable_name}, "
        "param_space=param_space) (or ftnb.run(..., param_space=param_space)), where "
        "param_space is the original space (same keys, grids and values)."
    )


def stored_configs(state: ExperimentState, trial_ids: Optional[set] = None) -> dict[str, Any]:
    """The trials' configs as stored (objects as placeholders), by trial id: all of them, or
    those of ``trial_ids``."""
    return {
        t.trial_id: t.config for t in state.trials if trial_ids is None or t.trial_id in trial_ids
    }


def with_originals(configs: dict, original: Any, bound: Any) -> dict:
    """The configs with each ref that ``bind_objects`` made replaced by the caller's own object
    (what ``Result.config`` should show), pairing the original and bound spaces by position."""
    from ..search import Domain

    originals: dict[str, Any] = {}

    def pair(orig: Any, new: Any) -> None:
        if isinstance(new, ObjectRef):
            if not isinstance(orig, ObjectRef):
                originals[new.id] = orig
        elif isinstance(new, Domain) and isinstance(orig, Domain):
            pair(getattr(orig, "categories", None), getattr(new, "categories", None))
        elif isinstance(new, Mapping) and isinstance(orig, Mapping):
            for key, value in new.items():
                pair(orig.get(key), value)
        elif isinstance(new, (list, tuple)) and isinstance(orig, (list, tuple)):
            for a, b in zip(orig, new):
                pair(a, b)

    pair(original, bound)
    if not originals:
        return configs

    def swap(value: Any) -> Any:
        if isinstance(value, ObjectRef):
            return originals.get(value.id, value)
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    return {trial_id: swap(config) for trial_id, config in configs.items()}
