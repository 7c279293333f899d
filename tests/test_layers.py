"""The layers of ftnb (ARCHITECTURE.md): front-ends (notebook, cli) -> the public API (its front
doors -> the lifecycle -> the parts it uses) -> the read side (ui) and the core -> storage and
the executor contract. A lower layer never imports a higher one, not even lazily inside a
function: every import statement of every module is checked."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "ftnb"

API_PARTS = "public API parts"  # what the lifecycle uses of the public API (below)

# Layer of a module: the first prefix that matches (longest prefixes first where they nest).
LAYERS = [
    ("ftnb.notebook", "front-end"),
    ("ftnb.cli", "front-end"),
    ("ftnb.lab", "front-end"),
    ("ftnb.__main__", "front-end"),
    ("ftnb.ui", "read side"),
    ("ftnb.core", "core"),
    # Resources as bundles (Ray's PlacementGroupFactory, under Ray's path): plain data that the
    # schedulers build and the resource requests read, with no machine in it.
    ("ftnb.execution.placement_groups", "base"),
    ("ftnb.execution", "execution"),
    ("ftnb.storage", "storage"),
    # What the operating system tells of processes and this machine (/proc): below everything.
    ("ftnb.system", "os"),
    ("ftnb.session", "trainable API"),
    # What a running trial knows of itself (get_context()): the trainable API's.
    ("ftnb.train.context", "trainable API"),
    # Asynchronous validation: what report(validation=...) starts and records, for the session.
    ("ftnb.train.validation", "trainable API"),
    # What a trainable's reports must hold (the ranked metric, the stop criterion's keys).
    ("ftnb.train.metric_checks", "trainable API"),
    ("ftnb.checkpoint", "base"),
    ("ftnb.config", "base"),
    ("ftnb.wording", "base"),
    ("ftnb.lazy_names", "base"),  # the __getattr__ of modules that import names on first use
    # Names -> dotted class paths (executors, launchers, worker backends), imported on first use:
    # it names higher modules as strings only, so every layer that picks by name may use it.
    ("ftnb.registry", "base"),
    ("ftnb.search", "base"),
    # Trial schedulers: policy over results, with no machine in it (docs/schedulers.md).
    ("ftnb.schedulers", "base"),
    ("ftnb.objects", "base"),
    # How a dataset is split between ranks: plain data handling that a trainable calls.
    ("ftnb.train.shards", "base"),
    # ScalingConfig: a configuration object like those of ftnb.config, which re-exports it.
    ("ftnb.train.scaling", "base"),
    # Starting, owning and resuming an experiment: below its front doors (Tuner, TorchTrainer,
    # ftnb.run), which it is given as arguments, never imports.
    ("ftnb.lifecycle", "lifecycle"),
    # What the lifecycle uses of the public API: results, checks of user input, resources by
    # config, stoppers and callbacks. They import no front door either.
    ("ftnb.result", API_PARTS),
    ("ftnb.input_checks", API_PARTS),
    ("ftnb.parameters", API_PARTS),
    ("ftnb.stopper", API_PARTS),
    ("ftnb.callback", API_PARTS),
]
API = "public API"  # everything else: ftnb/__init__, tuner, handle, ...

# What each layer may import, besides itself.
ALLOWED = {
    "os": set(),
    "storage": {"base", "os"},
    "execution contract": {"os", "base", "storage"},
    "base": {"os", "base", "storage"},
    "execution": {"os", "base", "storage", "trainable API"},
    "trainable API": {"os", "base", "storage", "core"},
    "core": {"os", "base", "storage", "execution contract"},
    "read side": {"os", "base", "storage", "core", "execution contract"},
    API_PARTS: {"os", "base", "storage", "core", "execution contract", "trainable API",
                "read side"},
    "lifecycle": {"os", "base", "storage", "core", "execution contract", "execution",
                  "trainable API", "read side", API_PARTS},
    API: {"os", "base", "storage", "core", "execution contract", "execution", "trainable API",
          "read side", API_PARTS, "lifecycle", API},
    "front-end": {"os", "base", "storage", "core", "execution contract", "execution",
                  "trainable API", "read side", API_PARTS, "lifecycle", API},
}
# The executor contract and the resource requests it names are what the core may know of
# execution; a concrete executor (local, inprocess, ...) is chosen by the API through the
# registry, never by the core.
CONTRACT = {"ftnb.execution.contract", "ftnb.execution.resources"}

# Known exceptions, each with its reason.
EXCEPTIONS = {
    # handle.widget()/display() build the notebook widget, lazily, for the notebook user.
    ("ftnb.handle", "ftnb.notebook.widget"),
    # `%load_ext ftnb` looks for load_ipython_extension in the package itself.
    ("ftnb", "ftnb.notebook.magics"),
    # ScalingConfig checks resources_per_worker with the one parser of resource requests.
    ("ftnb.train.scaling", "ftnb.execution.resources"),
}


def layer(module: str) -> str:
    if module in CONTRACT:
        return "execution contract"
    for prefix, name in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return name
    return API


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) for every ftnb module that ``path`` imports, at any depth."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from . import policy` imports a module
                candidate = f"{target}.{alias.name}"
                is_module = (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists() or \
                    (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
                found.append((node.lineno, candidate if is_module else target))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, target) for line, target in found if target.split(".")[0] == "ftnb"]


def _violations() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        mine = layer(module)
        for line, target in _imports(path):
            theirs = layer(target)
            if theirs == mine or (module, target) in EXCEPTIONS:
                continue
            if theirs == "execution contract" and mine == "execution":
                continue
            if theirs not in ALLOWED[mine]:
                out.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} ({mine}) "
                           f"imports {target} ({theirs})")
    return out


def test_no_layer_imports_a_higher_one():
    assert _violations() == []


@pytest.mark.parametrize("module, expected", [
    ("ftnb.core.controller", "core"),
    ("ftnb.execution.local", "execution"),
    ("ftnb.execution.contract", "execution contract"),
    ("ftnb.storage.lease", "storage"),
    ("ftnb.ui.read_model", "read side"),
    ("ftnb.tuner", API),
    ("ftnb.handle", API),
    ("ftnb.lifecycle.plan_restore", "lifecycle"),
    ("ftnb.result", "public API parts"),
    ("ftnb.registry", "base"),
    ("ftnb.testing.executor_contract", API),
    ("ftnb.notebook.magics", "front-end"),
    ("ftnb.train.context", "trainable API"),
    ("ftnb.train.torch_trainer", API),
])
def test_modules_are_placed_in_their_layer(module, expected):
    assert layer(module) == expected


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path, monkeypatch):
    # The scan must catch `def f(): from ..execution.local import X` in the core.
    fake = tmp_path / "ftnb" / "core"
    fake.mkdir(parents=True)
    (tmp_path / "ftnb" / "execution").mkdir()
    (tmp_path / "ftnb" / "execution" / "local.py").write_text("")
    (fake / "bad.py").write_text("def f():\n    from ..execution.local import LocalProcessExecutor\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "ftnb")
    assert _violations() == [
        "ftnb/core/bad.py:2: ftnb.core.bad (core) imports ftnb.execution.local (execution)"]


def _package(module: str) -> str:
    """What "inside one package" means for private names: a subpackage (``ftnb.execution``), or
    a module at the package root on its own (``ftnb.tuner``)."""
    parts = module.split(".")
    if len(parts) > 2 or (PACKAGE.parent / module.replace(".", "/")).is_dir():
        return ".".join(parts[:2])
    return module


def _private_imports() -> list[str]:
    """Every private name (``_x``) of an ftnb module used from another package: imported
    (``from ..execution.attempt import _x``) or read off an imported module (``attempt._x``)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        tree = ast.parse(path.read_text())
        modules_bound = {}  # local name -> the ftnb module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    target = ".".join(package[: len(package) - (node.level - 1)]
                                      + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "ftnb":
                    continue
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists():
                        modules_bound[alias.asname or alias.name] = candidate
                    elif alias.name.startswith("_") and not alias.name.startswith("__") and \
                            _package(target) != _package(module):
                        out.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                                   f"{module} imports {target}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.split(".")[0] == "ftnb":
                        modules_bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in modules_bound and node.attr.startswith("_") and \
                    not node.attr.startswith("__"):
                target = modules_bound[node.value.id]
                if _package(target) != _package(module):
                    out.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: "
                               f"{module} uses {target}.{node.attr}")
    return out


def test_no_private_name_is_used_across_packages():
    # A name another package needs is part of its module's interface: make it public.
    assert _private_imports() == []


def test_the_private_name_check_sees_both_forms(tmp_path, monkeypatch):
    for part in ("core", "execution"):
        (tmp_path / "ftnb" / part).mkdir(parents=True)
    (tmp_path / "ftnb" / "execution" / "attempt.py").write_text("def _x(): pass\n")
    (tmp_path / "ftnb" / "execution" / "ok.py").write_text(
        "from .attempt import _x\nfrom . import attempt\nattempt._x()\n")
    (tmp_path / "ftnb" / "core" / "bad.py").write_text(
        "from ..execution.attempt import _x\nfrom ..execution import attempt as a\na._x()\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "ftnb")
    assert _private_imports() == [
        "ftnb/core/bad.py:1: ftnb.core.bad imports ftnb.execution.attempt._x",
        "ftnb/core/bad.py:3: ftnb.core.bad uses ftnb.execution.attempt._x",
    ]
