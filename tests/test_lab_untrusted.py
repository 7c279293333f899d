"""Untrusted storage: what an experiment's folder says is data, never code to run on its word.

On a real Jupyter server (pytest-jupyter), over experiments made by real ``ftnb run`` commands:
a state tampered with in every way that would make the server import other code (a changed
trainable file, a file or folder outside the server's own folders, a reference and a record
that disagree, a search space that is code, an older ftnb's state with no hash) is refused with
a 409 that names the file and the ``ftnb resume`` to run by hand, and the code it names is never
imported (it would leave a marker file); an untampered one still resumes. Every POST route
answers a malformed body with a 400 naming the field. ``ftnb resume``, a real process, says
which file it imports and warns when the file changed since the experiment recorded it."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
from clirun import FTNB, Cli, literal

from ftnb.recorded_code import CODE, TRUSTED_CODE_VARIABLE, RecordedFile

pytest.importorskip("jupyter_server", reason="needs ftnb[lab] (jupyter_server)")
pytest.importorskip("pytest_jupyter", reason="needs pytest-jupyter[server] (ftnb[dev])")
# pytest-jupyter's fixtures, imported here rather than declared in `pytest_plugins` (see
# test_lab_server.py, whose helpers these tests share).
from pytest_jupyter.jupyter_server import *  # noqa: E402,F403
from test_lab_server import _get, _message, _post, _until, on_server_loop  # noqa: E402

pytestmark = pytest.mark.timeout(120)

#: The experiment's trainable: trial x=2 fails, so that a run ends ERRORED at once, resumable.
JOBS = '''
import ftnb

def broken(config):
    ftnb.report({"loss": 1.0})
    if config["x"] == 2:
        raise ValueError("x=2 is broken")
'''

SPACE = literal({"x": {"grid_search": [1, 2]}})


def _evil(marker) -> str:
    """A Python file that, imported, leaves ``marker``: the proof that code ran."""
    return textwrap.dedent(f'''
        import pathlib
        pathlib.Path({str(marker)!r}).write_text("imported")

        def broken(config):
            pass

        space = {{"x": 1}}
    ''')


@pytest.fixture
def cli(tmp_path):
    """``jobs.py`` in ``work``, the storage in ``store``; ``outside``: a folder that is neither
    a storage root nor the server's own."""
    cli = Cli(tmp_path / "work", tmp_path / "store")
    cli.cwd.mkdir()
    (cli.cwd / "jobs.py").write_text(JOBS)
    (tmp_path / "outside").mkdir()
    return cli


@pytest.fixture
def lab_roots(cli):
    # The work folder is served too: its code is the server's own.
    return [str(cli.storage), str(cli.cwd)]


@pytest.fixture
def jp_server_config(lab_roots):
    return {"ServerApp": {"jpserver_extensions": {"ftnb.lab": True}},
            "Ftnb": {"storage_roots": lab_roots}}


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "outside" / "code-ran"


def _errored(cli, name, trainable="jobs.py:broken", *more):
    """An experiment ``ftnb run`` left ERRORED (resumable), and its folder."""
    done = cli("run", trainable, "-p", SPACE, "-n", name, "--verbose", "0", *more)
    assert done.returncode == 1, done.stderr
    return cli.storage / name


def _edit_origin(folder, edit):
    """Change the recorded origin in the experiment's state as someone who can write the
    folder could."""
    state_file = folder / "experiment_state.json"
    state = json.loads(state_file.read_text())
    edit(state["settings"]["origin"])
    state_file.write_text(json.dumps(state))


def _tamper(how, folder, cli, marker):
    """Tamper with the experiment in ``folder`` the way ``how`` says; any code it then names
    leaves ``marker`` when imported."""
    outside = marker.parent
    evil = outside / "evil.py"
    evil.write_text(_evil(marker))
    jobs = cli.cwd / "jobs.py"
    if how == "changed file":
        jobs.write_text(_evil(marker) + JOBS)
    elif how == "file outside":
        def edit(origin):
            origin["trainable"] = f"{evil}:broken"
            origin.setdefault(CODE, {})["trainable"] = RecordedFile.of(str(evil)).to_json()
        _edit_origin(folder, edit)
    elif how == "record of another file":
        _edit_origin(folder, lambda origin: origin.update(trainable=f"{evil}:broken"))
    elif how == "folder outside":
        # python -m ftnb run there would import this package first.
        (outside / "ftnb").mkdir()
        (outside / "ftnb" / "__init__.py").write_text(_evil(marker))
        _edit_origin(folder, lambda origin: origin.update(cwd=str(outside)))
    elif how == "space is code":
        def edit(origin):
            origin["param_space"] = f"{evil}:space"
            origin.setdefault(CODE, {})["param_space"] = RecordedFile.of(str(evil)).to_json()
        _edit_origin(folder, edit)
    elif how == "older ftnb":
        jobs.write_text(_evil(marker) + JOBS)
        _edit_origin(folder, lambda origin: origin.pop(CODE, None))
    else:
        raise AssertionError(how)
    return {"changed file": "changed since the experiment recorded it",
            "file outside": "outside the folders this server imports code from",
            "record of another file": "but the sha256 its state records is of",
            "folder outside": "the folder it ran in",
            "space is code": "its search space's file",
            "older ftnb": "records no sha256"}[how]


# -- the server ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["changed file", "file outside", "record of another file",
                                 "folder outside", "space is code", "older ftnb"])
@on_server_loop
async def test_a_tampered_experiment_is_not_resumed_and_no_code_runs(jp_fetch, cli, marker,
                                                                    how):
    folder = _errored(cli, "tampered")
    said = _tamper(how, folder, cli, marker)
    path = str(folder)

    response = await _post(jp_fetch, "resume", {"path": path}, request_timeout=110)
    assert not marker.exists(), "the server imported the code the tampered state names"
    assert response.code == 409, response.body
    message = _message(response)
    assert said in message and f"ftnb resume {path}" in message, message
    assert "Traceback" not in message
    assert not (folder / "supervisor.json").exists()
    page = await _get(jp_fetch, "experiment", path=path)
    plan = page["actions"]["resume"]
    assert plan["available"] is False and said in plan["reason"], plan
    # A takeover is refused as well (its driver is not silent, and the code is not trusted).
    response = await _post(jp_fetch, "resume", {"path": path, "takeover": True})
    assert response.code == 409
    assert not marker.exists()


@pytest.mark.parametrize("trainable", ["jobs.py:broken", "jobs:broken"])
@on_server_loop
async def test_an_untampered_experiment_still_resumes_through_the_server(jp_fetch, cli,
                                                                        trainable):
    folder = _errored(cli, "clean", trainable)
    path = str(folder)
    page = await _get(jp_fetch, "experiment", path=path)
    assert page["actions"]["resume"]["available"] is True, page["actions"]

    response = await _post(jp_fetch, "resume", {"path": path}, request_timeout=110)
    assert response.code == 200, response.body
    outcome = json.loads(response.body)
    assert outcome["ok"] is True and outcome["supervisor"]["pid"] > 0

    async def ended_again():  # its errored trial ran a second attempt, and failed again
        page = await _get(jp_fetch, "experiment", path=path)
        rows = page["experiment"]["rows"]
        return (page["experiment"]["status"] == "ERRORED" and not page["actions"]["stop"]
                and max(len(page["trials"][r["trial_id"]]["attempts"]) for r in rows) == 2)

    await _until(ended_again, "the resumed experiment to end again", timeout=90)


_MALFORMED = [
    ("stop", {"path": 3}, "'path'"),
    ("stop", {"path": ["/a"]}, "'path'"),
    ("stop", {"path": {"p": "/a"}}, "'path'"),
    ("stop", {"path": None}, "'path'"),
    ("stop", {}, "'path'"),
    ("stop", {"path": "PATH", "force": True}, "'force'"),
    ("stop_trial", {"path": "PATH"}, "'trial_id'"),
    ("stop_trial", {"path": 1.5, "trial_id": "t"}, "'path'"),
    ("stop_trial", {"path": "PATH", "trial_id": ["t"]}, "'trial_id'"),
    ("stop_trial", {"path": "PATH", "trial_id": "t", "x": 1}, "'x'"),
    ("resume", {"path": 3}, "'path'"),
    ("resume", {"path": ["PATH"]}, "'path'"),
    ("resume", {"path": {}}, "'path'"),
    ("resume", {"takeover": True}, "'path'"),
    ("resume", {"path": "PATH", "takeover": "yes"}, "'takeover'"),
    ("resume", {"path": "PATH", "takeover": 1}, "'takeover'"),
    ("resume", {"path": "PATH", "cwd": "/tmp"}, "'cwd'"),
    ("resume", ["PATH"], "JSON object"),
]


@on_server_loop
async def test_a_malformed_body_is_a_400_that_names_the_field(jp_fetch, cli, marker):
    path = str(_errored(cli, "target"))
    for route, body, named in _MALFORMED:
        body = json.loads(json.dumps(body).replace("PATH", path))
        response = await _post(jp_fetch, route, body)
        assert response.code == 400, (route, body, response.code, response.body)
        message = _message(response)
        assert named in message and "Fix:" in message, (route, body, message)
        assert "Traceback" not in response.body.decode()
    # Well-formed, the same routes answer as before: nothing runs, nothing to stop.
    response = await _post(jp_fetch, "stop", {"path": path})
    assert response.code == 409 and "not running" in _message(response)


# -- the check itself --------------------------------------------------------------------------
def test_code_of_another_user_or_outside_the_folders_is_refused(tmp_path):
    from ftnb.lab.actions import code_refusal

    work = tmp_path / "work"
    work.mkdir()
    (work / "jobs.py").write_text(JOBS)
    origin = {"via": "cli", "trainable": f"{work}/jobs.py:broken", "cwd": str(work),
              CODE: {"trainable": RecordedFile.of(str(work / "jobs.py")).to_json()}}
    assert code_refusal(origin, [str(tmp_path)]) is None
    other = os.geteuid() + 1
    assert f"belongs to user id {os.geteuid()}, not to this server's ({other})" in \
        code_refusal(origin, [str(tmp_path)], uid=other)
    assert "outside the folders" in code_refusal(origin, [str(tmp_path / "elsewhere")])
    # A symlink in the folders that leads out of them is outside too.
    (tmp_path / "served").mkdir()
    os.symlink(work, tmp_path / "served" / "link")
    linked = dict(origin, cwd=str(tmp_path / "served" / "link"))
    assert "outside the folders" in code_refusal(linked, [str(tmp_path / "served")])
    for junk in (3, None, ["x"], "relative/jobs.py:broken"):
        assert code_refusal(dict(origin, trainable=junk), [str(tmp_path)]) is not None


# -- ftnb resume ---------------------------------------------------------------------------------
def test_ftnb_resume_names_the_file_it_imports_and_warns_when_it_changed(cli):
    _errored(cli, "e1")
    jobs = cli.cwd / "jobs.py"

    done = cli("resume", "e1", "--verbose", "0")
    assert done.returncode == 1, done.stderr
    assert f"resuming with the trainable {jobs}:broken: importing {jobs}" in done.stdout
    assert "warning" not in done.stderr, done.stderr

    jobs.write_text(JOBS + "\n# changed\n")
    done = cli("resume", "e1", "--verbose", "0", "--json")
    assert done.returncode == 1, done.stderr
    assert f"importing {jobs}" in done.stderr
    assert f"ftnb: warning: {jobs} changed since the experiment recorded it" in done.stderr
    json.loads(done.stdout)  # the warning stays off stdout
    # Resumed as it is now, the file's new hash is recorded: no warning the next time.
    done = cli("resume", "e1", "--verbose", "0")
    assert "warning" not in done.stderr, done.stderr

    # An older ftnb's state records no hash: said, not silently trusted.
    _edit_origin(cli.storage / "e1", lambda origin: origin.pop(CODE))
    done = cli("resume", "e1", "--verbose", "0")
    assert f"importing {jobs}" in done.stdout
    assert "recorded no hash of its trainable's file" in done.stderr, done.stderr


def test_ftnb_run_records_the_files_it_imports(cli):
    space = cli.cwd / "space.py"
    space.write_text("space = {'x': 2}\n")
    _errored(cli, "e2", "jobs:broken")
    state = json.loads((cli.storage / "e2" / "experiment_state.json").read_text())
    code = state["settings"]["origin"][CODE]
    assert code == {"trainable": RecordedFile.of(str(cli.cwd / "jobs.py")).to_json()}
    done = cli("run", "jobs.py:broken", "-p", "space.py:space", "-n", "e3", "--verbose", "0")
    assert done.returncode == 1, done.stderr
    state = json.loads((cli.storage / "e3" / "experiment_state.json").read_text())
    assert state["settings"]["origin"][CODE]["param_space"] == RecordedFile.of(
        str(space)).to_json()



def test_the_resume_the_server_runs_imports_only_the_files_it_checked(cli, marker):
    """The command the server runs reads the state again: a state changed after the server's
    check (to name other code) is refused there, before any import."""
    folder = _errored(cli, "raced")
    jobs = cli.cwd / "jobs.py"
    checked = [RecordedFile.of(str(jobs)).to_json()]
    _tamper("file outside", folder, cli, marker)
    env = dict(cli.env, **{TRUSTED_CODE_VARIABLE: json.dumps(checked)})
    done = subprocess.run([FTNB, "resume", str(folder), "--detach", "--json"], cwd=cli.cwd,
                          env=env, text=True, capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and not marker.exists(), done.stderr
    assert "is not one of the files checked before this command ran" in done.stderr
    # Its own checked file still resumes (the space is a dict literal: data).
    _edit_origin(folder, lambda origin: origin.update(
        trainable=f"{jobs}:broken", code={"trainable": checked[0]}))
    done = subprocess.run([FTNB, "resume", str(folder), "--verbose", "0"], cwd=cli.cwd,
                          env=env, text=True, capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "x=2 is broken" in done.stdout, done.stdout + done.stderr


# -- modules of the trainable's own folder --------------------------------------------------------
#: A trainable that imports a sibling module, which imports a package of the same folder.
JOBS_WITH_HELPERS = '''
import ftnb
import helpers

def broken(config):
    ftnb.report({"loss": helpers.loss()})
    if config["x"] == 2:
        raise ValueError("x=2 is broken")
'''
HELPERS = "from tools import scale\n\ndef loss():\n    return scale(1.0)\n"
TOOLS = "def scale(x):\n    return 2 * x\n"


def _with_helpers(cli, name):
    (cli.cwd / "jobs.py").write_text(JOBS_WITH_HELPERS)
    (cli.cwd / "helpers.py").write_text(HELPERS)
    (cli.cwd / "tools").mkdir(exist_ok=True)
    (cli.cwd / "tools" / "__init__.py").write_text(TOOLS)
    return _errored(cli, name)


def test_ftnb_run_records_the_modules_of_its_folder_that_the_trainable_imports(cli):
    folder = _with_helpers(cli, "h1")
    state = json.loads((folder / "experiment_state.json").read_text())
    recorded = state["settings"]["origin"][CODE]["trainable"]
    assert recorded["file"] == str(cli.cwd / "jobs.py")
    assert recorded["imports"] == [RecordedFile.of(str(cli.cwd / "helpers.py")).to_json(),
                                   RecordedFile.of(str(cli.cwd / "tools" / "__init__.py")
                                                   ).to_json()]


@pytest.mark.parametrize("how", ["changed", "changed further down", "not recorded"])
@on_server_loop
async def test_a_changed_module_of_the_trainables_folder_is_not_resumed(jp_fetch, cli, marker,
                                                                       how):
    folder = _with_helpers(cli, "helped")
    path = str(folder)
    page = await _get(jp_fetch, "experiment", path=path)
    assert page["actions"]["resume"]["available"] is True, page["actions"]  # as it was
    changed = cli.cwd / ("tools/__init__.py" if how == "changed further down" else "helpers.py")
    if how == "not recorded":  # an older ftnb's record, or an edited one
        _edit_origin(folder, lambda origin: origin[CODE]["trainable"].pop("imports"))
        (cli.cwd / "helpers.py").write_text(_evil(marker) + HELPERS)
        said = f"imports {changed}, whose sha256 the experiment did not record"
    else:
        changed.write_text(_evil(marker) + changed.read_text())
        said = f"imports {changed} changed since the experiment recorded it"

    response = await _post(jp_fetch, "resume", {"path": path}, request_timeout=110)
    assert not marker.exists(), "the server imported the changed module"
    assert response.code == 409, response.body
    message = _message(response)
    assert said in message and f"ftnb resume {path}" in message, message
    page = await _get(jp_fetch, "experiment", path=path)
    assert page["actions"]["resume"]["available"] is False


def test_ftnb_resume_warns_when_a_module_of_the_trainables_folder_changed(cli, marker):
    folder = _with_helpers(cli, "h2")
    helpers = cli.cwd / "helpers.py"
    # The command the server runs, given the files it checked, refuses a module changed since.
    checked = [RecordedFile.of(str(cli.cwd / "jobs.py")).to_json()]
    helpers.write_text(_evil(marker) + HELPERS)
    env = dict(cli.env, **{TRUSTED_CODE_VARIABLE: json.dumps(checked)})
    done = subprocess.run([FTNB, "resume", str(folder), "--detach", "--json"], cwd=cli.cwd,
                          env=env, text=True, capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and not marker.exists(), done.stderr
    assert f"imports {helpers}, which is not one of the files checked" in done.stderr
    # By hand: resumed with the module as it is now, with a warning naming it.
    done = cli("resume", "h2", "--verbose", "0")
    assert done.returncode == 1, done.stderr
    assert f"ftnb: warning: {helpers} changed since the experiment recorded it" in done.stderr
    assert marker.exists()
    # Its new content is recorded: no warning the next time.
    done = cli("resume", "h2", "--verbose", "0")
    assert "warning" not in done.stderr, done.stderr


def test_local_imports_follow_the_folders_modules_only(tmp_path):
    from ftnb.recorded_code import local_imports

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from . import inner\nfrom .deep import x\n")
    (tmp_path / "pkg" / "inner.py").write_text("import os\n")
    (tmp_path / "pkg" / "deep.py").write_text("x = 1\n")
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("import a\nimport json, pkg.inner\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "main.py").write_text(
        "import os, sys\nfrom a import thing\nimport broken\nimport missing\n"
        "def f():\n    import pkg\n")
    found = local_imports(str(tmp_path / "main.py"), str(tmp_path))
    assert found == [str(tmp_path / n) for n in (
        "a.py", "broken.py", "pkg/__init__.py", "b.py", "pkg/inner.py", "pkg/deep.py")]
