"""The source lines of notebook-defined code, carried to the processes that run it, so that a
trial's traceback shows the lines of the cell that raised.

A Jupyter kernel compiles each cell under a file name that exists only in its own
``linecache`` (``/tmp/ipykernel_1234/3046.py``); a trial process formatting a traceback through
such code finds no file and prints the frames without their lines. :func:`carry_cell_source`
collects the kernel's lines for every cell the trainable's code comes from (its functions,
nested functions, and the notebook functions and classes it uses) and attaches them to the
trainable as a small :class:`CellSource`; cloudpickle, which carries a notebook function by
value with its ``__dict__``, carries them along, and unpickling registers them in the
receiving process's ``linecache`` (the supervisor's, then each trial's), before any code runs.

The lines are found by the code's file name, which must travel too: since cloudpickle 3.1.3 every
code object shipped by value is written under the file name ``<dynamic-code>`` (for payloads that
do not depend on where the code was defined), so a traceback through it names no file and shows
no line, a notebook cell's or a module's. :func:`dumps` (and :func:`pickler_class`, for a pickler
of one's own) pickles as cloudpickle does but keeps each code object's file name, as cloudpickle
did before 3.1.3; everything ftnb sends to run elsewhere goes through it.
"""

from __future__ import annotations

import linecache
import os
import types
from typing import Any, Iterator

__all__ = ["CellSource", "carry_cell_source", "cell_lines", "dumps", "pickler_class"]

ATTRIBUTE = "__ftnb_cell_source__"
_MAX_OBJECTS = 500  # a walk through a notebook's namespace stops there
_NO_FILE = "<dynamic-code>"  # what cloudpickle >= 3.1.3 writes for a code object's file name
_PICKLER: Any = None


def pickler_class() -> type:
    """``cloudpickle.Pickler`` that keeps each code object's file name (see the module
    docstring); made on first use, so importing this module does not import cloudpickle."""
    global _PICKLER
    if _PICKLER is None:
        from collections import ChainMap

        import cloudpickle

        reduce_code = cloudpickle.Pickler.dispatch_table[types.CodeType]

        def reduce_keeping_file(code: types.CodeType) -> tuple:
            constructor, args, *rest = reduce_code(code)
            if code.co_filename != _NO_FILE:
                args = tuple(code.co_filename if type(arg) is str and arg == _NO_FILE else arg
                             for arg in args)
            return (constructor, args, *rest)

        class KeepingFileNames(cloudpickle.Pickler):
            dispatch_table = ChainMap({types.CodeType: reduce_keeping_file},
                                      cloudpickle.Pickler.dispatch_table)

        _PICKLER = KeepingFileNames
    return _PICKLER


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names of the code it ships by value (read
    back with ``cloudpickle.loads``)."""
    import io

    out = io.BytesIO()
    pickler_class()(out).dump(obj)
    return out.getvalue()


class CellSource:
    """Lines of files that exist only in a ``linecache`` (notebook cells), by file name.
    Unpickling one registers them in this process's ``linecache``."""

    def __init__(self, lines: dict[str, list[str]]) -> None:
        self.lines = lines

    def __reduce__(self) -> tuple:
        return (register_cell_source, (self.lines,))


def register_cell_source(lines: dict[str, list[str]]) -> CellSource:
    """Put ``lines`` in this process's ``linecache`` (where a file of that name is missing), as
    IPython does for its cells: with no modification time, so ``checkcache`` keeps them."""
    for filename, text in lines.items():
        if filename not in linecache.cache or len(linecache.cache[filename]) == 1:
            linecache.cache[filename] = (sum(len(line) for line in text), None, text, filename)
    return CellSource(lines)


def _code_objects(obj: Any, seen: set) -> Iterator[types.CodeType]:
    """The code objects of ``obj`` (a function, a class, a callable object), nested code, and the
    ``__main__`` functions and classes it names in its globals."""
    stack = [obj]
    while stack and len(seen) < _MAX_OBJECTS:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, types.MethodType):
            stack.append(item.__func__)
        elif isinstance(item, types.FunctionType):
            stack.append(item.__code__)
            for cell in item.__closure__ or ():
                try:
                    stack.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            names = _names(item.__code__)
            for name in names:
                value = item.__globals__.get(name)
                if getattr(value, "__module__", None) == "__main__" and (
                        isinstance(value, (types.FunctionType, type))):
                    stack.append(value)
        elif isinstance(item, types.CodeType):
            yield item
            stack.extend(c for c in item.co_consts if isinstance(c, types.CodeType))
        elif isinstance(item, type):
            if item.__module__ == "__main__":
                stack.extend(v for v in vars(item).values()
                             if isinstance(v, (types.FunctionType, classmethod, staticmethod,
                                               property)))
        elif isinstance(item, (classmethod, staticmethod)):
            stack.append(item.__func__)
        elif isinstance(item, property):
            stack.extend(f for f in (item.fget, item.fset, item.fdel) if f is not None)
        elif callable(item):  # an object: its class's code, and functions it holds
            stack.append(type(item))
            stack.extend(v for v in getattr(item, "__dict__", {}).values()
                         if isinstance(v, types.FunctionType))


def _names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def cell_lines(obj: Any) -> dict[str, list[str]]:
    """``{file name: lines}`` of the files ``obj``'s code comes from that exist only in this
    process's ``linecache`` (notebook cells); empty outside a notebook."""
    out: dict[str, list[str]] = {}
    for code in _code_objects(obj, set()):
        filename = code.co_filename
        if filename in out:
            continue
        entry = linecache.cache.get(filename)
        if entry is None or len(entry) == 1 or not entry[2] or os.path.exists(filename):
            continue
        out[filename] = list(entry[2])
    return out


def carry_cell_source(trainable: Any) -> None:
    """Attach the source lines of the notebook cells ``trainable`` comes from (see the module
    docstring); nothing when there are none, or the object takes no attributes."""
    if getattr(trainable, ATTRIBUTE, None) is not None:
        return
    try:
        lines = cell_lines(trainable)
        if lines:
            setattr(trainable, ATTRIBUTE, CellSource(lines))
    except Exception:  # a traceback's lines must never stop a launch
        pass
