"""A lazy stand-in for the ``rfc3987_syntax`` package, first on the PYTHONPATH of the test Ray
cluster's processes (tests/conftest.py, Ray section).

``import ray`` imports jsonschema, whose format checkers import ``rfc3987_syntax`` when it is
installed (jupyter_events pulls it in through ``jsonschema[format-nongpl]``); that package compiles
about 25 Earley grammars at import: 1.2 of the 1.7 CPU seconds ``import ray`` takes here. Every
Ray process pays it (the dashboard and runtime env agents, each worker), and a raylet whose
dashboard agent has not written its port within 15 s aborts: on two loaded cores, that was most
of a node's start. This stand-in is the real package, loaded on first use: ``__path__`` points
at the installed one, and ``is_valid_syntax`` (all jsonschema takes) imports it when called.
"""

import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _installed_package_dir() -> str:
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == _HERE:
            continue
        spec = importlib.machinery.PathFinder.find_spec(__name__, [entry or os.curdir])
        if spec is not None and spec.submodule_search_locations:
            return next(iter(spec.submodule_search_locations))
    raise ImportError(f"{__name__} is not installed outside the stand-in at {_HERE}")


__path__ = [_installed_package_dir()]


def is_valid_syntax(term: str, value: str) -> bool:
    from .syntax_helpers import is_valid_syntax as real

    return real(term, value)


def __getattr__(name: str):
    from . import syntax_helpers

    return getattr(syntax_helpers, name)
