"""The documentation site builds with no warning (warnings are errors, every cross-reference and
internal link must resolve), and every Python and shell block in the README and the docs is
either run by a named test (or by .ci/run) or marked as not runnable, with why.

Build it by hand: ``.venv/bin/sphinx-build -W --keep-going -n -b html docs docs/_build/html``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# The line right above a ```python or ```bash block says what happens to it: run by a test
# (<!-- run: tests/test_readme.py -->, or <!-- run: .ci/run --> for the README's two commands) or
# not run, and why (<!-- not run: needs a Ray cluster -->). A Python block that starts processes
# is run in a subprocess: <!-- run: tests/test_docs.py, alone -->.
_MARK = re.compile(
    r"<!-- (run: (?P<test>tests/\S+\.py|\.ci/run)(, alone)?|not run: (?P<why>.{10,})) -->")
_BLOCKS = ("```python", "```bash")


def _pages() -> list[pathlib.Path]:
    pages = [ROOT / "README.md"]
    pages += sorted(p for p in DOCS.rglob("*.md")
                    if "_build" not in p.parts and "api" not in p.relative_to(DOCS).parts)
    return pages


def test_every_python_and_shell_block_is_run_or_says_why_not():
    unmarked, missing = [], []
    for page in _pages():
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() not in _BLOCKS:
                continue
            mark = _MARK.search(lines[number - 1]) if number else None
            where = f"{page.relative_to(ROOT)}:{number + 1}"
            if mark is None:
                unmarked.append(where)
            elif mark["test"] and not (ROOT / mark["test"]).is_file():
                missing.append(f"{where} names {mark['test']}, which does not exist")
    assert not unmarked, (
        "Python and shell blocks with no mark on the line above: add <!-- run: tests/test_x.py --> (and "
        "run it there) or <!-- not run: why -->:\n" + "\n".join(unmarked))
    assert not missing, "\n".join(missing)


@pytest.mark.slow
def test_the_docs_build_with_no_warning(tmp_path):
    needed = ["sphinx", "myst_nb", "myst_parser", "pydata_sphinx_theme"]
    absent = [name for name in needed if importlib.util.find_spec(name) is None]
    if absent:
        pytest.skip(f"the docs extra is not installed ({', '.join(absent)}): "
                    "pip install -c constraints.txt -e '.[docs]'")
    out = tmp_path / "html"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stdout + proc.stderr
    # The generated reference is there: every public name, every command, every variable.
    import ftnb

    api = out / "reference" / "api"
    missing = [name for name in ftnb.__all__
               if not name.startswith("__") and not (api / f"ftnb.{name}.html").is_file()]
    assert not missing, f"no API page for {missing}"
    cli = (out / "reference" / "cli.html").read_text()
    assert all(f"ftnb {command}" in cli
               for command in ("run", "resume", "stop", "watch", "logs", "status", "ls", "rm"))
    assert "FTNB_STORAGE_PATH" in (out / "reference" / "environment.html").read_text()
    assert "%ftrun" in (out / "reference" / "magics.html").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (out / "tutorials" / f"{notebook.stem}.html").is_file(), notebook.name


def test_the_readmes_docs_build_command_is_the_one_this_module_runs():
    """The README's shell block marked for this module builds the docs as
    test_the_docs_build_with_no_warning does: warnings are errors, nitpicky, every page."""
    blocks = re.findall(r"<!-- run: tests/test_docs\.py -->\n```bash\n(.*?)```",
                        (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1, blocks
    assert "sphinx-build -W --keep-going -n -b html docs docs/_build/html" in blocks[0]


def test_the_blocks_marked_for_this_module_run(tmp_path, monkeypatch):
    """The blocks marked ``<!-- run: tests/test_docs.py -->`` run as written (in this process:
    they build configurations, nothing starts)."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for page in _pages():
        text = page.read_text()
        for block in re.findall(r"<!-- run: tests/test_docs\.py -->\n```python\n(.*?)```", text,
                                flags=re.S):
            exec(compile(block, f"{page.name} block", "exec"), {"__name__": "__docs__"})
            ran += 1
    assert ran >= 2


def _docs_extension():
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -c "
                        "constraints.txt -e '.[docs]'")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import ftnb_docs
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return ftnb_docs


def test_the_reference_tables_name_exactly_what_the_code_has():
    """What the build checks, without a build: the API page lists every public name, the
    environment page every FTNB_ variable the code names, the directory page every file name
    constant (and none that are gone)."""
    import ftnb

    ext = _docs_extension()
    reference = DOCS / "reference"
    assert ext.api_page_names((reference / "api.md").read_text()) == \
        {name for name in ftnb.__all__ if not name.startswith("__")}
    variables = ext.table_names((reference / "environment.md").read_text(), "ftnb-env-vars")
    assert variables == ext.environment_variables()
    assert "FTNB_STORAGE_PATH" in variables
    files = ext.table_names((reference / "experiment-directory.md").read_text(), "ftnb-files")
    assert files == set(ext.file_name_constants())
    assert ext.file_name_constants()["STATE_FILE"] == "experiment_state.json"


@pytest.mark.slow
def test_the_blocks_marked_to_run_alone_run(tmp_path):
    """The blocks marked ``<!-- run: tests/test_docs.py, alone -->`` (they start trials) run as
    written, each as a script in a fresh folder and storage."""
    pytest.importorskip("torch", reason="the data-parallel example uses torch (ftnb[torch])")
    blocks = [(page, block) for page in _pages() for block in re.findall(
        r"<!-- run: tests/test_docs\.py, alone -->\n```python\n(.*?)```", page.read_text(),
        flags=re.S)]
    assert blocks
    for number, (page, block) in enumerate(blocks):
        folder = tmp_path / str(number)
        folder.mkdir()
        (folder / "snippet.py").write_text(block)
        env = dict(os.environ, FTNB_STORAGE_PATH=str(folder / "results"),
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [
                       os.environ.get("PYTHONPATH")])]))
        proc = subprocess.run([sys.executable, "snippet.py"], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{page.name}:\n{proc.stdout}\n{proc.stderr}"
        assert list((folder / "results").iterdir()), f"{page.name}: no experiment was written"
