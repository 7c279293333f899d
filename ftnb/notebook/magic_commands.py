"""What a magic's line asks for, resolved in the notebook's namespace, without a shell.

:class:`RunCommand` (``%ftrun``'s line and cell) and :class:`ResumeCommand` (``%ftresume``'s)
parse a line with the option tables of :mod:`ftnb.notebook.magic_options` and find the names it
gives in a namespace (:func:`lookup`, :class:`NamespaceNames`); :class:`CellDefinitions` reads
what a ``%%ftrun`` cell defines. None of it needs IPython, so it is tested without a shell;
:class:`ftnb.notebook.magics.FtnbMagics` only runs cells, calls the API and shows the result.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import keyword
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ..run_options import is_trainer, launch_arguments, space_from
from .magic_options import FTRESUME, FTRUN, NOTEBOOK, MagicDefaults, MagicInputError

__all__ = [
    "SPACE_NAMES",
    "CellDefinitions",
    "LaunchPlan",
    "NamespaceNames",
    "ResumeCommand",
    "RunCommand",
    "check_space_not_needed",
    "lookup",
    "recorded_origin",
]


# -- names in the user's namespace --------------------------------------------------------------
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

# A `%%ftrun` cell that assigns one of these names defines the search space.
SPACE_NAMES = ("param_space", "space")


def lookup(namespace: Mapping[str, Any], name: str, what: str) -> Any:
    """The value of ``name`` (``a`` or ``a.b.c``) in ``namespace``, or a one-line error that
    names ``what`` it was meant to be and the closest name that exists."""
    if not _DOTTED.match(name) or keyword.iskeyword(name.split(".")[0]):
        fix = ""
        if "(" in name:
            fix = " Fix: give the name alone, without parentheses or arguments"
        raise MagicInputError(f"{what} {name!r} is not a Python name.{fix}".rstrip("."))
    first, *rest = name.split(".")
    if first not in namespace:
        visible = [k for k in namespace if not k.startswith("_")]
        close = difflib.get_close_matches(first, visible, n=1)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        raise MagicInputError(
            f"{what} {first!r} is not defined in this notebook.{guess} Fix: run the cell that "
            "defines it first, or check the spelling"
        )
    value = namespace[first]
    for index, attr in enumerate(rest):
        try:
            value = getattr(value, attr)
        except AttributeError:
            owner = ".".join([first, *rest[:index]])
            raise MagicInputError(f"{what} {name!r}: {owner} has no attribute {attr!r}") from None
    return value


def _trainable_from(namespace: Mapping[str, Any], name: str, what: str = "trainable") -> Any:
    value = lookup(namespace, name, what)
    if not callable(value) and not is_trainer(value):
        raise MagicInputError(
            f"{what} {name!r} is a {type(value).__name__}, not a function. Fix: name the "
            "function that trains, def train(config): ... ftnb.report(...)"
        )
    return value


def _space_from(namespace: Mapping[str, Any], text: str) -> Mapping[str, Any]:
    """The search space ``--param-space`` gives: a dict literal, or the dict of that name."""
    return space_from(text, NamespaceNames(namespace), NOTEBOOK.space_forms)


def _space_named(namespace: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    if not _DOTTED.match(name.strip()):
        raise MagicInputError(
            f"--param-space {name!r} is neither a name nor a dict literal. Accepted: "
            f"{NOTEBOOK.space_forms}"
        )
    value = lookup(namespace, name.strip(), "param space")
    if not isinstance(value, Mapping):
        raise MagicInputError(
            f"param space {name!r} is a {type(value).__name__}, not a dict. Fix: name a dict "
            'such as {"lr": ftnb.grid_search([0.1, 0.01])}'
        )
    return value


@dataclass(frozen=True)
class NamespaceNames:
    """How the magics find what a line names: in the notebook's namespace (the
    :class:`ftnb.run_options.Names` of the notebook)."""

    namespace: Mapping[str, Any]

    def trainable(self, ref: str) -> Callable[..., Any]:
        return _trainable_from(self.namespace, ref)

    def space(self, ref: str) -> Mapping[str, Any]:
        return _space_named(self.namespace, ref)

    def value(self, ref: str, what: str) -> Any:
        return lookup(self.namespace, ref, what)


@dataclass(frozen=True)
class CellDefinitions:
    """What a cell defines at its top level: functions and search-space variables."""

    functions: tuple[str, ...] = ()
    spaces: tuple[str, ...] = ()

    @classmethod
    def of(cls, source: str) -> "CellDefinitions":
        """Read ``source`` (plain Python, after IPython's transformations) without running it.
        A syntax error gives nothing: running the cell then shows the error itself."""
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return cls()
        functions: list[str] = []
        spaces: list[str] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append(node.name)
                continue
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            spaces += [t.id for t in targets if isinstance(t, ast.Name) and t.id in SPACE_NAMES]
        return cls(tuple(dict.fromkeys(functions)), tuple(dict.fromkeys(spaces)))


# -- %ftrun -------------------------------------------------------------------------------------
@dataclass
class LaunchPlan:
    """What ``%ftrun`` does: ``ftnb.launch(trainable, **kwargs)``, then shows the result."""

    trainable: Callable[..., Any]
    kwargs: dict
    output: Optional[str] = None
    widget: bool = True
    wait: bool = False
    metric: Optional[str] = None


@dataclass
class RunCommand:
    """``%ftrun``'s line (and cell), parsed; :meth:`resolve` finds its names in a namespace.

    Example:
        >>> cmd = RunCommand.parse("train -p space --max-failures 3 --concurrency 4")
        >>> plan = cmd.resolve({"train": lambda config: None, "space": {"x": 1}})
        >>> plan.kwargs["run_config"].failure_config.max_failures
        3
    """

    args: argparse.Namespace
    trainable_name: str
    param_space_name: Optional[str]
    source: str
    defaults: MagicDefaults = field(default_factory=MagicDefaults)

    @classmethod
    def parse(cls, line: str, defaults: Optional[MagicDefaults] = None,
              cell: Optional[str] = None) -> "RunCommand":
        """Parse ``line``; ``cell`` is the body of a ``%%ftrun`` cell (plain Python), which
        may supply the trainable and the space. Raises :class:`MagicInputError`."""
        args = FTRUN.parse(line)
        FTRUN.check_output_name(args.output)
        trainable, space = args.trainable, args.param_space
        if cell is not None:
            found = CellDefinitions.of(cell)
            if trainable is None:
                trainable = _the_one_function(found.functions)
            if space is None and found.spaces:
                if len(found.spaces) > 1:
                    raise MagicInputError(
                        f"%%ftrun: the cell assigns both {' and '.join(found.spaces)}. Fix: "
                        f"say which is the search space: --param-space {found.spaces[0]}"
                    )
                space = found.spaces[0]
        if trainable is None:
            raise MagicInputError(
                "%ftrun needs the trainable: %ftrun train [--param-space space] [--name NAME] "
                "... (`%ftrun?` shows the options)"
            )
        prefix = "%%ftrun" if cell is not None else "%ftrun"
        return cls(args, trainable, space, f"{prefix} {line.strip()}".strip(),
                   defaults or MagicDefaults())

    def resolve(self, namespace: Mapping[str, Any]) -> LaunchPlan:
        """Find the named objects in ``namespace`` and build the arguments of ``ftnb.launch``.
        Raises :class:`MagicInputError` for a missing or wrong name or an invalid value."""
        a = self.args
        origin = {"trainable": self.trainable_name, "source": self.source}
        if self.param_space_name:
            origin["param_space"] = self.param_space_name
        built = launch_arguments(a, NamespaceNames(namespace), trainable=self.trainable_name,
                                 param_space=self.param_space_name,
                                 space_forms=NOTEBOOK.space_forms, defaults=self.defaults,
                                 origin=origin)
        kwargs = dict(built.kwargs, quiet=a.quiet)
        return LaunchPlan(built.trainable, kwargs, a.output, self.defaults.show_widget(a.widget),
                          a.wait, a.metric)


def _the_one_function(functions: Sequence[str]) -> str:
    if len(functions) == 1:
        return functions[0]
    if not functions:
        raise MagicInputError(
            "%%ftrun: the cell defines no function to run. Fix: define it in the cell "
            "(def train(config): ...) or name it: %%ftrun train"
        )
    raise MagicInputError(
        f"%%ftrun: the cell defines {len(functions)} functions ({', '.join(functions)}). "
        f"Fix: name the one to run: %%ftrun {functions[0]}"
    )


# -- %ftresume ----------------------------------------------------------------------------------
@dataclass
class ResumeCommand:
    """``%ftresume``'s line, parsed; :meth:`resolve` finds the trainable and the space.

    The names default to those ``%ftrun`` stored in the experiment (``origin``), then to the
    name of the trainable the state records.
    """

    args: argparse.Namespace
    defaults: MagicDefaults = field(default_factory=MagicDefaults)

    @classmethod
    def parse(cls, line: str, defaults: Optional[MagicDefaults] = None) -> "ResumeCommand":
        """Parse ``line``. Raises :class:`MagicInputError`."""
        args = FTRESUME.parse(line)
        FTRESUME.check_output_name(args.output)
        return cls(args, defaults or MagicDefaults())

    @property
    def widget(self) -> bool:
        return self.defaults.show_widget(self.args.widget)

    def resolve(self, namespace: Mapping[str, Any], origin: Optional[Mapping[str, Any]] = None,
                stored_trainable: Optional[str] = None,
                needed: Sequence[tuple[str, str]] = ()) -> tuple[Callable, Optional[Mapping]]:
        """``(trainable, param_space)`` for ``handle.resume``; the space is None when neither
        ``--param-space`` nor a defined variable of the original name gives one. ``needed``:
        the objects (key, type) that the trials to resume need from the space, which is then
        required (the error names the variable to define)."""
        origin = origin or {}
        target = self.args.target
        name = self.args.trainable
        if name is None:
            name = origin.get("trainable") or stored_trainable
            if not isinstance(name, str) or not _DOTTED.match(name):
                raise MagicInputError(
                    f"%ftresume {target}: the experiment does not say which notebook name its "
                    "trainable had. Fix: pass it: --trainable NAME"
                )
            if name.split(".")[0] not in namespace:
                raise MagicInputError(
                    f"%ftresume {target} needs the trainable {name!r} (the name it was started "
                    "with), which is not defined in this notebook. Fix: run the cell that "
                    "defines it first, or pass --trainable NAME"
                )
        trainable = _trainable_from(namespace, name)
        space = None
        if self.args.param_space:
            space = _space_from(namespace, self.args.param_space)
        else:
            original = origin.get("param_space")
            # Only if defined: a space of plain values is stored with the experiment, and a
            # space with objects that is missing gets restore's own message naming them.
            if isinstance(original, str) and original.split(".")[0] in namespace:
                space = _space_from(namespace, original)
            elif needed:
                raise MagicInputError(_space_needed(f"%ftresume {target}", original, needed))
        return trainable, space


# -- what an existing experiment needs to resume -------------------------------------------------
def recorded_origin(handle: Any) -> tuple[dict, Optional[str], list[tuple[str, str]]]:
    """The names ``%ftrun`` recorded (``settings["origin"]``), the trainable's own name, and
    the objects (key, type) that the trials to resume need from the search space."""
    from ..core.records import ExperimentState

    state = ExperimentState.load(handle.paths)
    origin = state.settings.get("origin")
    origin = dict(origin) if isinstance(origin, Mapping) else {}
    return origin, state.trainable, handle.objects_needed_to_resume()


def check_space_not_needed(plan: LaunchPlan) -> None:
    """``%ftrun`` of an existing experiment without ``--param-space``: if resuming it needs
    objects of its space, say so in the magic's words (not ``Tuner.restore``'s)."""
    from ..handle import ExperimentHandle
    from ..storage import ExperimentPaths, Storage, default_storage_path

    kw = plan.kwargs
    storage = Storage(kw["storage_path"] or default_storage_path(),
                      kw["run_config"].storage_filesystem)
    handle = ExperimentHandle(ExperimentPaths.of(storage, kw["name"]))
    try:
        if not handle.paths.has_state() or handle.is_live():
            return  # a new experiment, or a running one (attached to)
        origin, _, needed = recorded_origin(handle)
    except Exception:
        return  # launch says what is wrong with it
    if needed:
        raise MagicInputError(_space_needed(f"%ftrun: resuming experiment {kw['name']!r}",
                                            origin.get("param_space"), needed))


def _space_needed(what: str, name: Any, needed: Sequence[tuple[str, str]]) -> str:
    """The line that says a resume needs the search space, and which name to define."""
    keys = ", ".join(f"{key} ({kind})" for key, kind in needed)
    if isinstance(name, str) and _DOTTED.match(name):
        fix = (f"run the cell that defines {name.split('.')[0]!r} (the search space it was "
               f"started with, {name}), or pass another: --param-space NAME")
    else:
        fix = ("define the search space it was started with, those objects re-created, and "
               "pass it: --param-space NAME")
    return (f"{what} needs its search space again: its trials hold objects that are not saved "
            f"with the experiment ({keys}). Fix: {fix}")
