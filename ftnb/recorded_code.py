"""The Python files an experiment was started with, as its state records them, and whether such
a file may be trusted.

``ftnb run`` records, beside the references it was given (``FILE.py:NAME``, ``MODULE:NAME``),
the file each one is imported from and the sha256 of its content, in the state's
``settings["origin"]["code"]``::

    {"trainable": {"file": "/home/u/proj/train.py", "sha256": "9f86d0...",
                   "imports": [{"file": "/home/u/proj/helpers.py", "sha256": "..."}]},
     "param_space": {"file": "/home/u/proj/space.py", "sha256": "..."}}

``imports``: the modules of the file's own folder it imports (:func:`local_imports`), which
are checked as it is.

A state is data that anyone who can write the experiment's folder can change, so what it names
is never imported on its word alone. ``ftnb resume`` (a user's own command) says which file it
imports and warns when the file's content is not what was recorded. The Jupyter server's resume
(:mod:`ftnb.lab.actions`) imports nothing that :func:`untrusted_file` or
:func:`untrusted_path` objects to: a file outside the server's own folders, one that belongs
to another user, or one whose content is not the recorded one. A state written by an older ftnb
records no hashes: the server refuses it, ``ftnb resume`` warns.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

__all__ = ["CODE", "TRUSTED_CODE_VARIABLE", "RecordedFile", "file_sha256", "files_run_by",
           "import_root", "is_code_reference", "is_file_reference", "local_imports",
           "record_of", "recorded_file", "recorded_imports", "split_reference",
           "trusted_by_caller", "untrusted_file", "untrusted_imports", "untrusted_path"]

#: The key of the recorded files in ``settings["origin"]``.
CODE = "code"

#: Set by the Jupyter server for the ``ftnb resume`` it runs: the files it checked, as a JSON
#: list of ``{"file", "sha256"}``. That command then imports no file that is not one of them
#: with that content: the state could have been changed between the check and its reading.
TRUSTED_CODE_VARIABLE = "FTNB_TRUSTED_CODE"


@dataclass(frozen=True)
class RecordedFile:
    """A Python file an experiment imports: its absolute ``file`` and the ``sha256`` (hex) of
    its content when the experiment started (or was last resumed by ``ftnb resume``)."""

    file: str
    sha256: str

    @classmethod
    def of(cls, file: str) -> "RecordedFile":
        """``file`` as it is now."""
        full = os.path.abspath(file)
        return cls(full, file_sha256(full))

    def to_json(self) -> dict:
        return {"file": self.file, "sha256": self.sha256}


def trusted_by_caller() -> Optional[list[RecordedFile]]:
    """The files the caller checked (:data:`TRUSTED_CODE_VARIABLE`), or None when it did not
    say (a user's own command: it imports what it is told)."""
    text = os.environ.get(TRUSTED_CODE_VARIABLE)
    if text is None:
        return None
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    found = [recorded_file({CODE: {"f": e}}, "f") for e in entries] if isinstance(
        entries, list) else []
    return [f for f in found if f is not None]


def file_sha256(path: str) -> str:
    """The sha256 (hex) of the content of the file ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recorded_file(origin: Any, role: str) -> Optional[RecordedFile]:
    """The file recorded for ``role`` (``"trainable"``, ``"param_space"``) in a state's
    ``origin``; None when none is (an older ftnb's state) or what is there is not one."""
    code = origin.get(CODE) if isinstance(origin, Mapping) else None
    entry = code.get(role) if isinstance(code, Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    file, sha256 = entry.get("file"), entry.get("sha256")
    if not (isinstance(file, str) and os.path.isabs(file) and isinstance(sha256, str)
            and len(sha256) == 64):
        return None
    return RecordedFile(file, sha256.lower())


def is_file_reference(target: str) -> bool:
    """Whether the part before ``:`` names a file (``x.py``, ``dir/x``) rather than a module."""
    return target.endswith(".py") or "/" in target or os.sep in target


def is_code_reference(text: str) -> bool:
    """Whether ``text`` names Python code to import (``MODULE:NAME``, ``FILE.py:NAME``), not a
    dict literal or a JSON file (what ``--param-space`` also takes)."""
    stripped = text.strip()
    if stripped.startswith("{") or (stripped.endswith(".json") and ":" not in stripped):
        return False
    return split_reference(stripped)[1] is not None


def split_reference(text: str) -> tuple[str, Optional[str]]:
    """``(module or file, attribute)``; the attribute is None when none is given."""
    target, sep, attr = text.rpartition(":")
    if not sep:
        return text, None
    if os.name == "nt" and len(target) == 1:  # C:\path\file.py with no attribute
        return text, None
    return target, attr


def files_run_by(reference: str, cwd: Optional[str]) -> Optional[list[str]]:
    """The files importing ``reference`` runs when nothing else is on the path before ``cwd``,
    found without running them: a ``FILE.py:NAME``'s file (its path must be absolute); for
    ``MODULE:NAME``, the module in ``cwd`` after the ``__init__.py`` of each package above it.
    The last one is the module's own. None when there is no such file (a module found
    elsewhere than in ``cwd``, a relative file, no attribute)."""
    target, attr = split_reference(reference.strip())
    if not attr or not target:
        return None
    if is_file_reference(target):
        return [target] if os.path.isabs(target) and target.endswith(".py") else None
    parts = target.split(".")
    if not cwd or not os.path.isabs(cwd) or not all(p.isidentifier() for p in parts):
        return None
    files = [os.path.join(cwd, *parts[:n], "__init__.py") for n in range(1, len(parts))]
    for own in (os.path.join(cwd, *parts) + ".py", os.path.join(cwd, *parts, "__init__.py")):
        if os.path.isfile(own):
            return [*files, own] if all(os.path.isfile(f) for f in files) else None
    return None


def _inside(resolved: str, folders: Sequence[str]) -> bool:
    for folder in folders:
        base = os.path.realpath(folder)
        if resolved == base or resolved.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def untrusted_path(path: str, folders: Sequence[str], uid: Optional[int] = None
                   ) -> Optional[str]:
    """Why the file or folder ``path`` is not to be imported from (None when it may be):
    outside every one of ``folders`` once its symlinks are resolved, missing, or belonging to
    another user than ``uid`` (default: this process's)."""
    uid = os.geteuid() if uid is None else uid
    resolved = os.path.realpath(path)
    if not _inside(resolved, folders):
        return f"{path} is outside the folders this server imports code from ({_listed(folders)})"
    try:
        info = os.stat(resolved)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if info.st_uid != uid:
        return f"{path} belongs to user id {info.st_uid}, not to this server's ({uid})"
    return None


def untrusted_file(recorded: RecordedFile, folders: Sequence[str], uid: Optional[int] = None
                   ) -> Optional[str]:
    """Why the recorded file is not to be imported (None when it may be): outside every one of
    ``folders`` once its symlinks are resolved, not a regular file, belonging to another user
    than ``uid`` (default: this process's), or with content whose sha256 is not the recorded
    one."""
    why = untrusted_path(recorded.file, folders, uid)
    if why is not None:
        return why
    resolved = os.path.realpath(recorded.file)
    if not os.path.isfile(resolved):
        return f"{recorded.file} is not a regular file"
    try:
        now = file_sha256(resolved)
    except OSError as exc:
        return f"{recorded.file} cannot be read ({exc.strerror or exc})"
    if now != recorded.sha256:
        return (f"{recorded.file} changed since the experiment recorded it (sha256 "
                f"{recorded.sha256[:12]}... then, {now[:12]}... now)")
    return None


#: The most modules of its own folder an experiment's file is followed into.
_MAX_LOCAL_IMPORTS = 500


def local_imports(file: str, root: str) -> list[str]:
    """The Python files of the folder ``root`` (where the file's imports are looked up first:
    a ``FILE.py``'s own folder, the folder ``ftnb run`` ran in for ``MODULE:NAME``) that
    ``file`` imports, and those they import in turn, found by reading their ``import``
    statements without running them (a sibling ``helpers.py``, a package ``utils/`` of the
    folder with its ``__init__.py``). ``file`` itself is left out; a file that cannot be
    parsed is not followed (importing it fails). Dynamic imports (``importlib``) are not
    seen."""
    import ast

    root = os.path.abspath(root)
    start = os.path.abspath(file)
    found: list[str] = []
    todo = [start]
    seen = {start}
    while todo and len(found) < _MAX_LOCAL_IMPORTS:
        current = todo.pop(0)
        try:
            with open(current, "rb") as f:
                tree = ast.parse(f.read(), current)
        except (OSError, SyntaxError, ValueError):
            continue
        for path in _files_named(tree, current, root):
            if path not in seen:
                seen.add(path)
                found.append(path)
                todo.append(path)
    return found


def _files_named(tree: Any, current: str, root: str) -> list[str]:
    """The files of ``root`` that the import statements of ``tree`` (the file ``current``)
    would load: each package on a dotted name's way, and the module itself."""
    import ast

    names: list[tuple[str, list[str]]] = []  # (folder it is looked up in, dotted parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(root, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = root
            if node.level:  # relative: from the importing module's package
                base = os.path.dirname(current)
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
            parts = node.module.split(".") if node.module else []
            names += [(base, parts + [alias.name]) for alias in node.names if alias.name != "*"]
            if parts:
                names.append((base, parts))
    out: list[str] = []
    for base, parts in names:
        folder = base
        for part in parts:
            package = os.path.join(folder, part, "__init__.py")
            module = os.path.join(folder, part + ".py")
            if os.path.isfile(package):
                out.append(package)
                folder = os.path.join(folder, part)
            else:
                if os.path.isfile(module):
                    out.append(module)
                break  # (a module, or a name in one: nothing below it is a file here)
    return out


def recorded_imports(origin: Any, role: str) -> list[RecordedFile]:
    """The files of its own folder that the file recorded for ``role`` imports, as recorded
    (``settings["origin"]["code"][role]["imports"]``; none recorded: an empty list)."""
    code = origin.get(CODE) if isinstance(origin, Mapping) else None
    entry = code.get(role) if isinstance(code, Mapping) else None
    imports = entry.get("imports") if isinstance(entry, Mapping) else None
    if not isinstance(imports, list):
        return []
    found = [recorded_file({CODE: {"f": item}}, "f") for item in imports]
    return [item for item in found if item is not None]


def record_of(file: str, root: str) -> dict:
    """What an experiment records of ``file`` (its path and sha256) and, when it imports
    modules of its folder ``root``, of each of them (``imports``)."""
    entry = RecordedFile.of(file).to_json()
    imports = [RecordedFile.of(path).to_json() for path in local_imports(file, root)]
    if imports:
        entry["imports"] = imports
    return entry


def untrusted_imports(origin: Any, role: str, file: str, root: str,
                      folders: Sequence[str], uid: Optional[int] = None) -> Optional[str]:
    """Why the modules of its folder that ``file`` (checked already: it has its recorded
    content, so it imports what it imported then) imports are not to be imported: one whose
    sha256 was not recorded, or one that :func:`untrusted_file` objects to. None when all may
    be."""
    recorded = {os.path.realpath(item.file): item for item in recorded_imports(origin, role)}
    for path in local_imports(file, root):
        item = recorded.get(os.path.realpath(path))
        if item is None:
            return (f"{file} imports {path}, whose sha256 the experiment did not record (it "
                    "was started by an older ftnb, or its state was edited)")
        why = untrusted_file(item, folders, uid)
        if why is not None:
            return f"{file} imports {why}"
    return None


def import_root(reference: str, file: str, cwd: Optional[str]) -> str:
    """Where the imports of ``file``, the file ``reference`` imports, are looked up first: a
    ``FILE.py``'s own folder, else the folder it runs in (``cwd``, default the current)."""
    target, _ = split_reference(reference.strip())
    if is_file_reference(target):
        return os.path.dirname(os.path.abspath(file))
    return cwd or os.getcwd()


def _listed(folders: Sequence[str]) -> str:
    return ", ".join(folders) if folders else "none"
