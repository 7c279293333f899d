"""What ``ftnb run`` / ``ftnb resume`` name: ``module.sub:attr`` or ``path/to/file.py:attr``.

A reference is imported as Python would run it, so that the objects it gives also reach the
processes that run them (the detached supervisor, the trial processes): those unpickle a
function by importing its module, on the ``sys.path`` that travels with them.

* ``module.sub:attr``: the module is imported with the current folder first on ``sys.path``
  (as ``python -m`` does).
* ``path/file.py:attr``: the file's folder goes first on ``sys.path`` (as ``python file.py``
  does, so that its own imports of sibling modules work) and the file is imported as the module
  of its name. A file whose name is not a free module name (``my-train.py``, ``json.py``, a name
  another module has) is loaded under a private name instead, and its functions are sent by
  value (cloudpickle's ``register_pickle_by_value``).

``attr`` may be dotted (``models.train``). :class:`ReferenceNames` is the CLI's
:class:`ftnb.run_options.Names`; a search space may also be a JSON file (``space.json``).
Every mistake is an :class:`ftnb.run_options.InputError` that names the option, what was
given, and the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import json
import keyword
import os
import re
import sys
import traceback
from types import ModuleType
from typing import Any, Callable, Mapping, Optional

from ..recorded_code import is_code_reference, is_file_reference, split_reference
from ..run_options import InputError

__all__ = ["SPACE_FORMS", "ReferenceNames", "absolute_reference", "is_code_reference",
           "load_reference", "reference_file"]

#: Every form ``--param-space`` takes on the command line.
SPACE_FORMS = ("a dict literal of plain values, quoted ('{\"lr\": 0.1, \"x\": {\"grid_search\": "
               "[1, 2]}}'), a JSON file (space.json), or MODULE:NAME / FILE.py:NAME naming a "
               "dict")
_FORMS = "MODULE:NAME (mypkg.train:train) or FILE.py:NAME (train.py:train)"
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def absolute_reference(text: str) -> str:
    """``text`` with a file's path made absolute (what the experiment records, so that
    ``ftnb resume`` finds it from any folder)."""
    target, attr = split_reference(text)
    if attr is None or not is_file_reference(target):
        return text
    return f"{os.path.abspath(os.path.expanduser(target))}:{attr}"


def reference_file(text: str) -> Optional[str]:
    """The absolute path of the file that importing the reference ``text`` runs, found without
    running it where that can be done: a ``FILE.py:NAME``'s file; for ``MODULE:NAME``, where
    Python finds the module from the current folder (its parent packages are imported to find
    a dotted one's). None when it cannot be found (importing it then says why)."""
    target, attr = split_reference(text.strip())
    if attr is None or not target:
        return None
    if is_file_reference(target):
        return os.path.abspath(os.path.expanduser(target))
    loaded = sys.modules.get(target)
    if loaded is not None:
        return _file_of(loaded)
    if not _DOTTED.match(target):
        return None
    _put_first_on_path(os.getcwd())
    try:
        spec = importlib.util.find_spec(target)
    except Exception:  # a parent package that fails to import: importing it says so
        return None
    origin = getattr(spec, "origin", None)
    return os.path.abspath(origin) if origin and os.path.isfile(origin) else None


def load_reference(text: str, what: str, kind: str = "function") -> Any:
    """The object ``text`` names (``module:attr`` or ``file.py:attr``); ``what`` is the option
    it was given to, ``kind`` what it should be (for the message when the attribute is
    missing: the names of that kind the module defines)."""
    text = text.strip()
    target, attr = split_reference(text)
    if not target:
        raise InputError(f"{what} {text!r}: nothing before ':'. Fix: {_FORMS}")
    if is_file_reference(target):
        module = import_file(target, what)
    elif _DOTTED.match(target) and not any(keyword.iskeyword(p) for p in target.split(".")):
        module = import_module(target, what)
    else:
        raise InputError(f"{what} {text!r} names neither a module nor a .py file. Fix: {_FORMS}")
    shown = target
    if attr is None or not attr:
        found = _defined(module, kind)
        example = found[0] if found else ("train" if kind == "function" else "space")
        listed = f" (it defines {_some(found)})" if found else ""
        raise InputError(f"{what} {text!r} names a {'file' if is_file_reference(target) else 'module'}"
                         f", not a {kind} in it{listed}. Fix: {shown}:{example}")
    value: Any = module
    for index, part in enumerate(attr.split(".")):
        try:
            value = getattr(value, part)
        except AttributeError:
            owner = ".".join([shown, *attr.split(".")[:index]]) if index else shown
            options = _defined(module, kind) if index == 0 else []
            close = difflib.get_close_matches(part, options or dir(value), n=1)
            guess = f" Did you mean {close[0]!r}?" if close else ""
            listed = f" It defines {_some(options)}." if options else ""
            raise InputError(f"{what} {text!r}: {owner} has no attribute {part!r}.{guess}"
                             f"{listed}".rstrip()) from None
    return value


def _defined(module: ModuleType, kind: str) -> list[str]:
    """The public names ``module`` itself defines that look like a ``kind`` (a function, a
    dict)."""
    out = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if kind == "function" and callable(value) and not isinstance(value, type):
            if getattr(value, "__module__", None) == module.__name__:
                out.append(name)
        elif kind == "dict" and isinstance(value, Mapping):
            out.append(name)
    return out


def _some(names: list[str]) -> str:
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")


def import_module(name: str, what: str) -> ModuleType:
    """Import module ``name`` as ``python -m`` would find it (the current folder first)."""
    _put_first_on_path(os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise InputError(
                f"{what}: no module named {exc.name!r} (looked in {os.getcwd()} and the Python "
                f"path). Fix: run from the folder that holds it, or give its file: "
                f"path/to/{name.split('.')[-1]}.py:NAME"
            ) from None
        raise InputError(_failed_import(name, exc, what)) from None
    except Exception as exc:
        raise InputError(_failed_import(name, exc, what)) from None


def import_file(path: str, what: str) -> ModuleType:
    """Import the Python file ``path`` (see the module docstring)."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(full):
        raise InputError(f"{what}: no file {path!r} (looked for {full}). Fix: check the path "
                         "(relative to the current folder)")
    if os.path.isdir(full):
        raise InputError(f"{what}: {path!r} is a folder, not a Python file. Fix: "
                         f"{os.path.join(path, 'train.py')}:NAME")
    if not full.endswith(".py"):
        raise InputError(f"{what}: {path!r} is not a .py file. Fix: FILE.py:NAME")
    folder, base = os.path.split(full)
    stem = base[:-3]
    _put_first_on_path(folder)
    for module in list(sys.modules.values()):
        if _file_of(module) == full:
            return module  # imported already (the trainable and the space in one file)
    by_name = _free_module_name(stem, full)
    digest = hashlib.sha1(full.encode()).hexdigest()[:8]
    name = by_name or f"_ftnb_file_{re.sub(r'[^0-9A-Za-z_]', '_', stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise InputError(f"{what}: cannot import {path!r} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        del sys.modules[name]
        raise
    except SystemExit as exc:
        del sys.modules[name]
        raise InputError(
            f"{what}: importing {path} exited (SystemExit: {exc.code}): it runs as a script "
            "when imported. Fix: put its script part under `if __name__ == \"__main__\":`"
        ) from None
    except BaseException as exc:
        del sys.modules[name]
        raise InputError(_failed_import(path, exc, what)) from None
    if not by_name:
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    return module


def _free_module_name(stem: str, full: str) -> Optional[str]:
    """``stem`` if importing it by that name finds this very file (so that it is found again in
    other processes); None if that name means another module there."""
    if not stem.isidentifier() or keyword.iskeyword(stem) or stem in sys.builtin_module_names:
        return None
    if stem in getattr(sys, "stdlib_module_names", ()) or stem in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(stem)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return stem if origin and os.path.abspath(origin) == full else None


def _file_of(module: Any) -> Optional[str]:
    path = getattr(module, "__file__", None)
    return os.path.abspath(path) if isinstance(path, str) else None


def _put_first_on_path(folder: str) -> None:
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _failed_import(name: str, exc: BaseException, what: str) -> str:
    """One line for an import that raised: the error, and where in the user's code."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "importlib" not in frame.filename and not frame.filename.startswith("<frozen"):
            where = f" ({os.path.basename(frame.filename)}, line {frame.lineno})"
            break
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({os.path.basename(exc.filename)}, line {exc.lineno})"
    text = " ".join(str(exc).split())
    return (f"{what}: importing {name} failed: {type(exc).__name__}: {text}{where}. Fix: "
            "run it with python to see the traceback")


class ReferenceNames:
    """How the CLI finds what a command names (:class:`ftnb.run_options.Names`)."""

    def trainable(self, ref: str) -> Callable[..., Any]:
        value = load_reference(ref, "TRAINABLE", "function")
        if not callable(value):
            raise InputError(
                f"TRAINABLE {ref!r} is a {type(value).__name__}, not a function. Fix: name the "
                "function that trains, def train(config): ... ftnb.report(...)"
            )
        return value

    def space(self, ref: str) -> Mapping[str, Any]:
        text = ref.strip()
        target, attr = split_reference(text)
        if attr is None and text.endswith(".json"):
            return _json_space(text)
        if attr is None and not is_file_reference(text) and not _DOTTED.match(text):
            raise InputError(f"--param-space {ref!r} is not one of the accepted forms: "
                             f"{SPACE_FORMS}")
        value = load_reference(text, "--param-space", "dict")
        if not isinstance(value, Mapping):
            raise InputError(
                f"--param-space {ref!r} is a {type(value).__name__}, not a dict. Fix: name a "
                'dict such as space = {"lr": ftnb.grid_search([0.1, 0.01])}'
            )
        return value

    def value(self, ref: str, what: str) -> Any:
        kind = "function" if what == "--stop" else "object"
        if ":" not in ref:
            raise InputError(f"{what} {ref!r}: name an object as {_FORMS.replace('NAME', 'OBJ')}"
                             if what != "--stop" else
                             f"--stop {ref!r} is not METRIC=VALUE, a dict literal, or "
                             f"{_FORMS}. Fix: --stop training_iteration=10")
        return load_reference(ref, what, kind)


def _json_space(path: str) -> Mapping[str, Any]:
    full = os.path.abspath(os.path.expanduser(path))
    try:
        with open(full, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise InputError(f"--param-space: no file {path!r} (looked for {full})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"--param-space {path!r} is not readable JSON: "
                         f"{' '.join(str(exc).split())}") from None
    if not isinstance(value, dict):
        raise InputError(f"--param-space {path!r} holds a {type(value).__name__}, not a JSON "
                         'object. Fix: {"lr": 0.1, "x": {"grid_search": [1, 2]}}')
    return value
