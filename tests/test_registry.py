"""One registry (ftnb/registry.py) for executors, launchers and elastic worker backends: names
imported lazily, unknown names refused with the known ones, a missing package named with how to
install it, and third parties' own names (register_*), with clobber rules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ftnb import registry
from ftnb.execution import available_executors, create_executor, executor_class
from ftnb.launchers import LAUNCHERS, LauncherError, LocalLauncher, launcher_for
from ftnb.registry import (
    ELASTIC_BACKENDS,
    EXECUTORS,
    Registry,
    RegistryEntry,
    register_elastic_backend,
    register_executor,
    register_launcher,
)

HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture
def scratch():
    """Registries as they are, whatever a test registers (a registration lives in the process)."""
    saved = {r: dict(r._entries) for r in (EXECUTORS, LAUNCHERS, ELASTIC_BACKENDS)}
    yield
    for r, entries in saved.items():
        r._entries.clear()
        r._entries.update(entries)


class MyExecutor:
    """A third party's executor (only built, never run, here)."""

    name = "mine"

    def __init__(self, **options):
        self.options = options


class MyLauncher(LocalLauncher):
    name = "mine"


class OtherExecutor(MyExecutor):
    pass


# ---- ftnb's own names --------------------------------------------------------------------------
def test_every_executor_launcher_and_backend_is_registered(monkeypatch):
    monkeypatch.setenv("FTNB_LAUNCHER_COMMAND", "setsid {command}")
    assert available_executors() == ["local", "inprocess", "ray"]
    assert list(LAUNCHERS) == ["local", "ray", "command"]
    assert ELASTIC_BACKENDS.names() == ["local", "ray"]
    for name in ["local", "inprocess"] + (["ray"] if HAS_RAY else []):
        assert executor_class(name).name == name
    for name in ("local", "ray", "command"):
        assert launcher_for(name).name == name
    assert ELASTIC_BACKENDS.load("local").__name__ == "LocalWorkers"
    assert "ray" in LAUNCHERS and "kubernetes" not in LAUNCHERS and 3 not in LAUNCHERS


def test_import_ftnb_imports_none_of_them():
    code = ("import sys, ftnb, ftnb.execution, ftnb.registry\n"
            "print(sorted(m for m in sys.modules if m.startswith(('ftnb.execution.', "
            "'ftnb.launchers', 'ftnb.elastic.', 'ray'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    loaded = eval(out.strip().splitlines()[-1])
    assert not [m for m in loaded if m.split(".")[-1] in (
        "local", "inprocess", "ray", "local_workers", "ray_workers", "command")], loaded
    assert "ray" not in loaded


# ---- unknown names -----------------------------------------------------------------------------
def test_an_unknown_executor_names_the_argument_the_known_ones_and_the_fix():
    with pytest.raises(ValueError) as info:
        create_executor("locale")
    assert str(info.value) == ("executor='locale' is not an executor ftnb knows (did you mean "
                               "'local'?). Fix: use one of 'local', 'inprocess', 'ray'.")
    with pytest.raises(ValueError, match=r"executor=42 is not an executor ftnb knows\. Fix"):
        create_executor(42)


def test_an_unknown_launcher_is_a_launcher_error_naming_where_it_came_from(monkeypatch):
    with pytest.raises(LauncherError, match=r"^launcher='Rya' is not a launcher ftnb knows "
                                            r"\(did you mean 'ray'\?\)\. Fix: use one of "
                                            r"'local', 'ray', 'command'\.$"):
        launcher_for("Rya")
    monkeypatch.setenv("FTNB_LAUNCHER", "kubernetes")
    with pytest.raises(LauncherError, match=r"^\$FTNB_LAUNCHER='kubernetes' is not a launcher"):
        launcher_for(None)


def test_an_unknown_worker_backend_names_the_known_ones_and_none():
    from ftnb.elastic import WorkerGroup

    with pytest.raises(ValueError) as info:
        WorkerGroup(dict, 1, executor="rey")
    assert str(info.value) == (
        "WorkerGroup(executor='rey') is not a worker backend ftnb knows (did you mean 'ray'?). "
        "Fix: use one of 'local', 'ray' (as in RunConfig(executor=...)), or None (Ray inside "
        "a Ray actor, else local).")


# ---- missing packages --------------------------------------------------------------------------
def test_a_missing_module_gives_the_install_hint(scratch):
    register_executor("fake", "no_such_module_for_ftnb.executors.FakeExecutor",
                      hint="pip install fake-executor")
    with pytest.raises(ImportError, match=r"^executor='fake' needs the 'no_such_module_for_ftnb' "
                                          r"package, which is not installed\. "
                                          r"Fix: pip install fake-executor\.$"):
        create_executor("fake")
    # without a hint: what to install, by the module's name
    register_launcher("fake", "no_such_module_for_ftnb.Launcher")
    with pytest.raises(LauncherError, match=r"launcher='fake' needs the "
                                            r"'no_such_module_for_ftnb' package.*Fix: install "
                                            r"the package that provides"):
        launcher_for("fake")


def test_a_required_module_is_checked_before_the_import(scratch):
    # ftnb.execution.ray imports without ray; its executor cannot run without it.
    register_executor("fake", "ftnb.execution.local.LocalProcessExecutor",
                      "pip install 'ftnb[fake]'", requires=("no_such_module_for_ftnb",))
    with pytest.raises(ImportError, match=r"executor='fake' needs the 'no_such_module_for_ftnb' "
                                          r"package, which is not installed. "
                                          r"Fix: pip install 'ftnb\[fake\]'"):
        create_executor("fake")
    register_elastic_backend("fake", "ftnb.elastic.local_workers.LocalWorkers",
                             "pip install 'ftnb[fake]'", requires=("no_such_module_for_ftnb",))
    from ftnb.elastic import WorkerGroup

    with pytest.raises(ImportError, match=r"WorkerGroup\(executor='fake'\) needs the "
                                          r"'no_such_module_for_ftnb' package"):
        WorkerGroup(dict, 1, executor="fake")


def test_a_module_without_the_class_says_so(scratch):
    register_executor("fake", "ftnb.execution.local.NoSuchExecutor")
    with pytest.raises(ImportError, match=r"executor='fake' is registered as "
                                          r"'ftnb.execution.local.NoSuchExecutor', but "
                                          r"ftnb.execution.local has no 'NoSuchExecutor'"):
        create_executor("fake")


# ---- third parties -----------------------------------------------------------------------------
def test_a_third_party_registers_an_executor_by_path_or_class(scratch):
    register_executor("mine", f"{__name__}.MyExecutor")
    made = create_executor("mine", pool=None, output_events=False)
    assert isinstance(made, MyExecutor) and made.options == {"pool": None,
                                                             "output_events": False}
    assert available_executors() == ["local", "inprocess", "ray", "mine"]
    register_executor("mine2", MyExecutor)
    assert executor_class("mine2") is MyExecutor
    # its name is among the known ones when another is mistyped
    with pytest.raises(ValueError, match=r"did you mean 'mine'.*'ray', 'mine', 'mine2'\."):
        create_executor("mina")


def test_a_third_party_registers_a_launcher_and_a_worker_backend(scratch, monkeypatch):
    register_launcher("mine", MyLauncher)
    assert isinstance(launcher_for("mine"), MyLauncher)
    assert isinstance(launcher_for(" MINE "), MyLauncher)  # as typed in an option
    monkeypatch.setenv("FTNB_LAUNCHER", "mine")
    assert isinstance(launcher_for(None), MyLauncher)

    made = []

    class Backend:
        name = "fake"

        def __init__(self, resources, custom):
            made.append((resources, custom))
            raise RuntimeError("built")

    register_elastic_backend("fake", Backend)
    from ftnb.elastic import WorkerGroup

    with pytest.raises(RuntimeError, match="built"):
        WorkerGroup(dict, 1, executor="fake")
    assert made and made[0][1] == {}


def test_clobber_rules(scratch):
    register_executor("mine", MyExecutor)
    register_executor("mine", MyExecutor)  # the same class again: nothing changes
    register_executor("mine", f"{__name__}.MyExecutor")  # its path is the same class
    with pytest.raises(ValueError) as info:
        register_executor("mine", OtherExecutor)
    assert str(info.value) == (
        f"register_executor('mine', '{__name__}.OtherExecutor'): 'mine' is already the "
        f"executor '{__name__}.MyExecutor'. Fix: choose another name, or pass clobber=True to "
        "replace it.")
    assert executor_class("mine") is MyExecutor
    register_executor("mine", OtherExecutor, clobber=True)
    assert executor_class("mine") is OtherExecutor
    # ftnb's own names too
    with pytest.raises(ValueError, match="'local' is already the executor "
                                         "'ftnb.execution.local.LocalProcessExecutor'"):
        register_executor("local", MyExecutor)
    with pytest.raises(ValueError, match="'ray' is already the launcher"):
        register_launcher("ray", MyLauncher)
    register_launcher("ray", MyLauncher, clobber=True)
    assert isinstance(launcher_for("ray"), MyLauncher)


@pytest.mark.parametrize("name, target, error", [
    ("My Executor", MyExecutor, r"register_executor\(name='My Executor'\): a name is lower case"),
    ("", MyExecutor, "a name is lower case"),
    (None, MyExecutor, "a name is lower case"),
    ("mine", "MyExecutor", r"the target must be a class or its dotted path.*Fix: "),
    ("mine", MyExecutor(), "the target must be a class"),
])
def test_a_bad_registration_is_refused(scratch, name, target, error):
    with pytest.raises(ValueError, match=error):
        register_executor(name, target)
    assert available_executors() == ["local", "inprocess", "ray"]


def test_a_registry_of_its_own():
    things = Registry("thing", "thing", {"a": RegistryEntry("ftnb.registry.Registry")})
    assert things.load("a") is Registry and things.entry("b") is None
    assert things.unknown("b") == "thing='b' is not a thing ftnb knows. Fix: use one of 'a'."
    things.unregister("a")
    assert things.names() == [] and repr(things) == "Registry('thing', [])"
    assert registry.__all__  # the module's names


def test_a_worker_backend_taken_names_its_register_function(scratch):
    with pytest.raises(ValueError, match=r"^register_elastic_backend\('ray', .*'ray' is already "
                                         r"the worker backend 'ftnb.elastic.ray_workers"):
        register_elastic_backend("ray", MyExecutor)
