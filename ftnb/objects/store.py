"""``ftnb.put`` and ``ftnb.get``: an :class:`ObjectRef` names an object stored once on this
machine, and every process of the machine maps the same file.

Lifetime: the process that called :func:`put` owns the file; it is deleted when the
:class:`ObjectRef` that ``put`` returned is garbage-collected there, or when that process exits.
:func:`adopt` makes another process an owner too. Files of owners that died without cleaning up
(SIGKILL) are removed by the next ``put`` on the machine
(:func:`~ftnb.objects.folders.sweep_orphans`).
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import threading
import weakref
from typing import Any

from ..search.messages import short_repr
from .describe import format_size, summarize, type_name
from .file_format import encode_object, load_object_file, serialize, write_object_file
from .folders import (
    OBJECT_STORE_ENV,
    choose_store_dir,
    ensure_store_dir,
    object_file_path,
    process_is_alive,
    remove_if_present,
    sweep_orphans,
    this_process_identity,
)

__all__ = [
    "PLACEHOLDER_KEY",
    "ObjectRef",
    "ObjectUnavailableError",
    "adopt",
    "get",
    "is_placeholder",
    "put",
    "supply",
]

#: Marker key of :meth:`ObjectRef.placeholder` dicts in experiment state files.
PLACEHOLDER_KEY = "__ftnb_ref__"


class ObjectUnavailableError(RuntimeError):
    """:func:`get` was given a ref whose file no longer exists (its owner exited or dropped it)."""


# --------------------------------------------------------------------------- ObjectRef


class ObjectRef:
    """A handle to an object stored by :func:`put`: pass it to trials, load it with :func:`get`.

    Small and picklable (it holds the file's path, never the object), hashable and equal by
    ``id``. The object's file lives as long as the ref that ``put`` returned is referenced in
    the process that called ``put``: keep it (in a variable or the param space) while trials
    use it.

    Attributes:
        id: random hex id of the object.
        type_name: the object's type, e.g. ``"pandas.DataFrame"``.
        size: bytes of the object's file.
        summary: short description of the object (at most 80 characters).
        path: the object's file.
    """

    __slots__ = ("id", "path", "size", "type_name", "summary", "_owner", "__weakref__")

    def __init__(
        self,
        id: str,
        path: str,
        size: int,
        type_name: str,
        summary: str,
        owner: tuple[str, int, int],
    ) -> None:
        self.id = id
        self.path = path
        self.size = size
        self.type_name = type_name
        self.summary = summary
        self._owner = owner  # (hostname, pid, start time) of the process that called put

    def placeholder(self) -> dict[str, Any]:
        """The JSON stand-in for experiment state files.

        >>> ref.placeholder()  # doctest: +SKIP
        {'__ftnb_ref__': '3fa2c1...', 'type': 'numpy.ndarray', 'size': 8000128, 'repr': '...'}
        """
        return {
            PLACEHOLDER_KEY: self.id,
            "type": self.type_name,
            "size": self.size,
            "repr": self.summary,
        }

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _restore_ref, (
            self.id,
            self.path,
            self.size,
            self.type_name,
            self.summary,
            self._owner,
        )

    def __copy__(self) -> "ObjectRef":
        return self  # immutable; a copy must not outlive or shorten the owner's file

    def __deepcopy__(self, memo: dict[int, Any]) -> "ObjectRef":
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("ftnb.ObjectRef", self.id))

    def __repr__(self) -> str:
        return f"ObjectRef({self.type_name}, {format_size(self.size)}, id={self.id[:6]})"


# Refs this process created (and whose file it owns), by id: unpickling a ref in its owner
# gives back the owner's object, so a round trip through pickle cannot shorten its life.
_owned: "weakref.WeakValueDictionary[str, ObjectRef]" = weakref.WeakValueDictionary()
# Objects loaded by get(), by ref id: a process maps each object once.
_loaded: dict[str, Any] = {}
# Reentrant: a ref's finalizer (which drops its entry) may run inside get() when the cyclic
# garbage collector happens to run there.
_loaded_lock = threading.RLock()


def _restore_ref(
    id: str, path: str, size: int, type_name: str, summary: str, owner: tuple[str, int, int]
) -> ObjectRef:
    """Unpickle an :class:`ObjectRef`. A ref unpickled outside its owner never deletes anything."""
    mine = _owned.get(id)
    if mine is not None:
        return mine
    return ObjectRef(id, path, size, type_name, summary, tuple(owner))  # type: ignore[arg-type]


def _release(path: str, ref_id: str, owner_pid: int) -> None:
    """Finalizer of an owned ref: delete its file (in the owner only; forked children share
    the finalizer but not the ownership)."""
    if os.getpid() != owner_pid:
        return
    with _loaded_lock:
        _loaded.pop(ref_id, None)  # unmapped once the caller drops what get() returned
    remove_if_present(path)


def is_placeholder(value: Any) -> bool:
    """True if ``value`` is an :meth:`ObjectRef.placeholder` dict.

    >>> is_placeholder({"__ftnb_ref__": "3fa2c1", "type": "numpy.ndarray", "size": 1, "repr": ""})
    True
    """
    return isinstance(value, dict) and isinstance(value.get(PLACEHOLDER_KEY), str)


# --------------------------------------------------------------------------- storing


def put(obj: Any) -> ObjectRef:
    """Store ``obj`` once on this machine and return a small :class:`ObjectRef` to it.

    Every process of this machine (trials included) loads it with :func:`get` from a
    memory-mapped file, without a copy per process: numpy arrays, pandas DataFrames, CPU
    torch tensors and ``nn.Module`` parameters point into pages shared by all of them. Any
    picklable object works (classes defined in a notebook too); a ref is returned as is.

    The file is deleted when the returned ref is garbage-collected in this process, or when
    this process exits.

    >>> ref = put(list(range(5)))
    >>> get(ref)
    [0, 1, 2, 3, 4]
    """
    if isinstance(obj, ObjectRef):
        return obj
    pickle_view, buffers = serialize(obj)
    host = socket.gethostname()
    pid, start = this_process_identity()
    obj_type, summary = type_name(type(obj)), summarize(obj)
    encoded = encode_object(
        pickle_view,
        buffers,
        {"type": obj_type, "repr": summary, "owner": {"host": host, "pid": pid, "start": start}},
    )
    size = encoded.size
    sweep_orphans()
    folder = choose_store_dir(size)
    ensure_store_dir(folder)
    ref_id = secrets.token_hex(8)
    path = object_file_path(folder, pid, start, ref_id)
    try:
        write_object_file(path, encoded)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise OSError(
            exc.errno,
            f"ftnb.put(): no room for a {format_size(size)} {obj_type} in {folder!r} "
            f"({exc.strerror}). Fix: free space there, or set {OBJECT_STORE_ENV} to a folder "
            "on a local disk with room for it.",
        ) from exc
    ref = ObjectRef(ref_id, path, size, obj_type, summary, (host, pid, start))
    _owned[ref_id] = ref
    weakref.finalize(ref, _release, path, ref_id, pid)
    return ref


def adopt(ref: ObjectRef) -> ObjectRef:
    """Become an owner of ``ref``'s object too, so that it outlives the process that created it:
    the detached supervisor behind ``ftnb.launch`` adopts the kernel's refs, and a restarted or
    culled kernel then takes nothing from the trials.

    A second name for the same file (a hard link, no copy; a copy where links are refused),
    owned by this process like a ref of its own: each owner deletes only its own name, and the
    data lives until both are gone. Returns the ref owned here (the same id).
    """
    mine = _owned.get(ref.id)
    if mine is not None:
        return mine
    host = socket.gethostname()
    pid, start = this_process_identity()
    path = object_file_path(os.path.dirname(ref.path), pid, start, ref.id)
    try:
        os.link(ref.path, path)
    except FileNotFoundError:
        raise ObjectUnavailableError(_unavailable_message(ref)) from None
    except FileExistsError:
        pass  # adopted before by this process, whose ref was dropped since: the name is ours
    except OSError:
        import shutil

        shutil.copyfile(ref.path, path)
    new = ObjectRef(ref.id, path, ref.size, ref.type_name, ref.summary, (host, pid, start))
    _owned[ref.id] = new
    weakref.finalize(new, _release, path, ref.id, pid)
    return new


# --------------------------------------------------------------------------- loading


def _unavailable_message(ref: ObjectRef) -> str:
    host, pid, start = ref._owner
    what = f"ftnb object {ref.id} ({ref.type_name}, {format_size(ref.size)})"
    if host != socket.gethostname():
        return (
            f"{what} is not available on this machine: it was created on {host!r}, and ftnb "
            "objects live on the machine that created them. Fix: create it with ftnb.put(...) "
            "on this machine, or run the trials there."
        )
    if process_is_alive(pid, start):
        return (
            f"{what} is no longer available: its file {ref.path!r} was deleted, although the "
            f"process that created it ({pid}) is still running. It deletes the file when the "
            "ObjectRef that ftnb.put returned is garbage-collected. Fix: keep that ref in a "
            "variable (or in the param_space) for as long as trials use it, and re-create it "
            "with ftnb.put(...)."
        )
    return (
        f"{what} is no longer available: it was created by process {pid}, which has exited. "
        "Re-create it with ftnb.put(...) in the running process and pass the new ref (when "
        "restoring an experiment, pass the objects of its param_space again)."
    )


def _load(ref: ObjectRef) -> Any:
    try:
        fd = os.open(ref.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise ObjectUnavailableError(_unavailable_message(ref)) from None
    return load_object_file(fd, ref.path)


def get(ref: ObjectRef) -> Any:
    """The object behind ``ref``, memory-mapped from its file without a copy.

    Memoized per process: calling ``get`` twice with the same ref returns the same object.
    Arrays and tensors are writable; writes stay private to the process (copy-on-write).
    Raises :class:`ObjectUnavailableError` when the file is gone (its owner exited).

    A trial's config holds objects, not refs (its refs are resolved before the trainable
    runs), so ``get`` of an object this process got from a ref returns that object: a Ray
    script's ``ray.get(config["model_ref"])`` works as ``ftnb.get(config["model_ref"])``.
    Anything else that is not a ref is refused (by identity: an equal copy is refused too).
    """
    if not isinstance(ref, ObjectRef):
        with _loaded_lock:
            if any(obj is ref for obj in _loaded.values()):
                return ref
        hint = " (a placeholder from a state file)" if is_placeholder(ref) else ""
        raise TypeError(
            f"ftnb.get() needs the ObjectRef returned by ftnb.put(); got "
            f"{type(ref).__name__}{hint}: {short_repr(ref)}. Fix: pass the ref itself, e.g. "
            "ftnb.get(config['data'])."
        )
    with _loaded_lock:
        if ref.id in _loaded:
            return _loaded[ref.id]
        obj = _load(ref)
        _loaded[ref.id] = obj
        return obj


def supply(ref_id: str, obj: Any) -> None:
    """Make :func:`get` of the ref with id ``ref_id`` return ``obj`` in this process, without
    its file: for an executor that brought the object to another machine by its own means (the
    Ray executor, through Ray's object store), where the file of the machine that put it is
    not."""
    with _loaded_lock:
        _loaded[ref_id] = obj
