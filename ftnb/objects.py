"""Shared objects for trials: ``ftnb.put`` stores a large object once, every trial maps it.

A dataset, a DataFrame or a model passed in a ``param_space`` would otherwise be pickled into
every trial's launch message and unpickled into every trial's own memory. :func:`put` writes it
once to a file on this machine, :func:`get` memory-maps that file, so numpy arrays, DataFrame
blocks and CPU tensors of all trials point at the same physical pages (the page cache, or
``/dev/shm``)::

    ref = ftnb.put(big_dataframe)          # ObjectRef(pandas.DataFrame, 1.2 GB, id=3fa2c1)
    df = ftnb.get(ref)                     # in any process of this machine: no copy

File format (version 1), all integers little-endian::

    b"FTNBOBJ\\0"  u32 version  u32 header_length  header (UTF-8 JSON)  zero padding to 64
    data section: the pickle stream, then each out-of-band buffer, each starting at a multiple
    of 64 bytes from the start of the data section (which itself starts at a multiple of 64).

The header is ``{"pickle": [offset, length], "buffers": [[offset, length], ...], "type": ...,
"repr": ..., "owner": {"host": ..., "pid": ..., "start": ...}}`` with offsets relative to the
data section. The pickle stream is protocol 5 (cloudpickle, so notebook-defined classes work);
large contiguous buffers travel out of band and are handed back to ``pickle.loads`` as
memoryviews into the mapping.

Lifetime: the process that called :func:`put` owns the file; it is deleted when the
:class:`ObjectRef` that ``put`` returned is garbage-collected there, or when that process exits.
Files of owners that died without cleaning up (SIGKILL) are removed by the next ``put`` on the
machine. Only the standard library (and cloudpickle, when writing) is imported here.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import json
import mmap
import os
import pickle
import re
import reprlib
import secrets
import socket
import struct
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Optional

from .search import Categorical, Domain, _fmt_path, _make_seq, _short_repr, is_grid_search

__all__ = [
    "OBJECT_STORE_ENV",
    "PLACEHOLDER_KEY",
    "ObjectRef",
    "ObjectUnavailableError",
    "adopt",
    "bind_objects",
    "choose_store_dir",
    "get",
    "is_placeholder",
    "put",
    "resolve_refs",
    "sweep_orphans",
    "walk_placeholders",
]

#: Environment variable naming the folder for object files (default: /dev/shm, else the tempdir).
OBJECT_STORE_ENV = "FTNB_OBJECT_STORE"
#: Marker key of :meth:`ObjectRef.placeholder` dicts in experiment state files.
PLACEHOLDER_KEY = "__ftnb_ref__"

_MAGIC = b"FTNBOBJ\x00"
_FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, format version, header length
_ALIGN = 64  # cache-line alignment: every dtype, SIMD loads included, is aligned in the mapping
_WRITE_CHUNK = 1 << 30  # os.write moves at most ~2 GiB per call on Linux
_SUFFIX = ".obj"
# {pid scope tag}-{owner pid}-{owner start time}-{object id}.obj, temporary files with a "." prefix
# and a ".tmp" suffix.
_FILE_NAME = re.compile(r"^\.?([0-9a-f]{8})-(\d+)-(\d+)-([0-9a-f]+)\.obj(?:\.tmp)?$")

# /dev/shm is RAM and also carries PyTorch DataLoader and NCCL traffic: only use it when the
# object leaves max(256 MiB, 20% of it) free.
_SHM_ROOT = "/dev/shm"
_SHM_RESERVE_MIN = 256 << 20
_SHM_RESERVE_FRACTION = 0.2


class ObjectUnavailableError(RuntimeError):
    """:func:`get` was given a ref whose file no longer exists (its owner exited or dropped it)."""


class _UnpicklableError(TypeError):
    """Raised by :func:`put` when the object cannot be pickled (``cause`` is the reason)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


# --------------------------------------------------------------------------- processes


def _start_time(pid: int) -> Optional[int]:
    """The start time of ``pid`` in clock ticks since boot; None when the process does not
    exist, is a zombie, or /proc cannot be read."""
    from .storage.lease import pid_start_time

    start = pid_start_time(pid)
    return None if start is None or start < 0 else start


def _has_proc() -> bool:
    return os.path.isdir("/proc/self")


def _is_alive(pid: int, start: int) -> bool:
    """Whether the process that wrote an object file (``pid`` started at ``start``) still runs.

    ``start`` 0 means unknown (no /proc when it was written): the pid alone decides.
    """
    if _has_proc():
        actual = _start_time(pid)
        return actual is not None and (start == 0 or actual == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


_identity_lock = threading.Lock()
_identity: tuple[int, int] = (0, 0)


def _this_process() -> tuple[int, int]:
    """``(pid, start time)`` of this process; recomputed after a fork."""
    global _identity
    pid = os.getpid()
    with _identity_lock:
        if _identity[0] != pid:
            _identity = (pid, _start_time(pid) or 0)
        return _identity


def _pid_scope_tag() -> str:
    """8 hex digits naming where this process's pids mean something: the machine and its pid
    namespace.

    Object folders may be shared between machines (FTNB_OBJECT_STORE on NFS) or containers
    (a mounted /tmp): a sweep only judges files whose owner's pid it can look up.
    """
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    scope = f"{socket.gethostname()}\0{namespace}"
    return hashlib.blake2b(scope.encode("utf-8"), digest_size=4).hexdigest()


# --------------------------------------------------------------------------- where files live


def _user_folder_name() -> str:
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return f"ftnb-objects-{getuid()}"
    import getpass  # only off POSIX

    return f"ftnb-objects-{getpass.getuser()}"


def _fs_space(path: str) -> tuple[int, int]:
    """``(free, total)`` bytes of the filesystem holding ``path`` for an unprivileged user."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def choose_store_dir(
    nbytes: int,
    *,
    shm_root: str = _SHM_ROOT,
    shm_free: Optional[int] = None,
    shm_total: Optional[int] = None,
) -> str:
    """The folder for an object file of ``nbytes`` bytes (not created here).

    ``$FTNB_OBJECT_STORE`` when set; else a per-user folder in ``shm_root`` (``/dev/shm``) when
    it exists and keeps ``max(256 MiB, 20%)`` free after the object; else a per-user folder
    under ``tempfile.gettempdir()``. ``shm_free`` and ``shm_total`` override the measured
    space of ``shm_root`` (for tests). For example, without ``$FTNB_OBJECT_STORE``, a 10 GB
    object goes to /dev/shm when 20 GB of a 24 GB /dev/shm are free, to the tempdir when 12 GB
    are (2 GB would be left, less than the 20% reserve).
    """
    configured = os.environ.get(OBJECT_STORE_ENV)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    if os.path.isdir(shm_root):
        if shm_free is None or shm_total is None:
            try:
                measured_free, measured_total = _fs_space(shm_root)
            except OSError:
                measured_free, measured_total = 0, 0
            shm_free = measured_free if shm_free is None else shm_free
            shm_total = measured_total if shm_total is None else shm_total
        reserve = max(_SHM_RESERVE_MIN, int(shm_total * _SHM_RESERVE_FRACTION))
        if shm_free - nbytes >= reserve:
            return os.path.join(shm_root, _user_folder_name())
    return os.path.join(tempfile.gettempdir(), _user_folder_name())


def _candidate_dirs() -> list[str]:
    """Every folder where this user's object files may be, for sweeps."""
    dirs = [os.path.join(root, _user_folder_name()) for root in (_SHM_ROOT, tempfile.gettempdir())]
    configured = os.environ.get(OBJECT_STORE_ENV)
    if configured:
        dirs.insert(0, os.path.abspath(os.path.expanduser(configured)))
    return [d for d in dirs if os.path.isdir(d)]


def _ensure_dir(path: str) -> None:
    """Create ``path``; a default (shared-root) folder must be a real folder owned by us."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.environ.get(OBJECT_STORE_ENV) or not hasattr(os, "getuid"):
        return  # the user chose this folder
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
        raise PermissionError(
            f"ftnb.put(): the object folder {path!r} is not a folder owned by this user "
            f"(uid {os.getuid()}), so objects written there could be read or replaced by "
            f"others. Fix: remove it, or set {OBJECT_STORE_ENV} to a private folder."
        )


def sweep_orphans() -> None:
    """Remove object files whose owner died without cleaning up (SIGKILL, os._exit). Every
    :func:`put` does it, and so does the controller when a trial process was killed.

    An owner is dead when its pid is gone or now belongs to a process with another start
    time. Races with other sweepers are harmless: a file already removed is skipped.
    """
    me = _this_process()
    tag = _pid_scope_tag()
    verdicts: dict[tuple[int, int], bool] = {}
    for folder in _candidate_dirs():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            match = _FILE_NAME.match(name)
            if match is None or match.group(1) != tag:
                continue
            owner = (int(match.group(2)), int(match.group(3)))
            if owner == me:
                continue
            if owner not in verdicts:
                verdicts[owner] = _is_alive(*owner)
            if not verdicts[owner]:
                _remove_quietly(os.path.join(folder, name))


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- describing objects


def _type_name(cls: type) -> str:
    """The shortest public dotted name of ``cls``: ``pandas.DataFrame``, ``torch.nn.Linear``."""
    module, qualname = cls.__module__, cls.__qualname__
    if module == "builtins":
        return qualname
    parts = module.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if getattr(sys.modules.get(prefix), qualname, None) is cls:
            return f"{prefix}.{qualname}"
    return f"{module}.{qualname}"


def _format_size(nbytes: int) -> str:
    """``1.2 GB``, ``200 MB``, ``512 B`` (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{nbytes} B"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 2, 4, 4, 4
_REPR.maxstring, _REPR.maxother = 30, 60


def _summary(obj: Any) -> str:
    """A one-line description of ``obj`` of at most 80 characters, cheap for huge objects."""
    name = type(obj).__name__
    try:
        shape = getattr(obj, "shape", None)
        torch = sys.modules.get("torch")
        if isinstance(shape, tuple):  # ndarray, DataFrame, Series, Tensor (torch.Size)
            dtype = getattr(obj, "dtype", None)
            text = f"{name}(shape={tuple(shape)}" + ("" if dtype is None else f", dtype={dtype}")
            text += ")"
        elif torch is not None and isinstance(obj, torch.nn.Module):
            count = sum(p.numel() for p in obj.parameters())
            text = f"{name}({count:,} parameters)"
        else:
            # reprlib bounds the work on big builtin containers; other types use their repr.
            text = _REPR.repr(obj)
    except Exception:  # a broken __repr__ or property must not fail put()
        text = f"<{name} object>"
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."


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
        return f"ObjectRef({self.type_name}, {_format_size(self.size)}, id={self.id[:6]})"


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
    _remove_quietly(path)


def is_placeholder(value: Any) -> bool:
    """True if ``value`` is an :meth:`ObjectRef.placeholder` dict.

    >>> is_placeholder({"__ftnb_ref__": "3fa2c1", "type": "numpy.ndarray", "size": 1, "repr": ""})
    True
    """
    return isinstance(value, dict) and isinstance(value.get(PLACEHOLDER_KEY), str)


# --------------------------------------------------------------------------- serialization


def _tensor_types() -> tuple[type, ...]:
    # Only when the caller already uses torch: importing it just to check costs seconds.
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    return (torch.Tensor, torch.nn.Parameter)


def _reduce_tensor(tensor: Any, storages: dict[tuple[int, int], Any]) -> Any:
    """Reduce a CPU tensor to a uint8 numpy view of its storage (pickled out of band) plus
    its dtype, offset, shape, stride and flags; None for tensors pickled the default way.

    Tensors sharing a storage (views, tied weights) share one numpy array, which pickle
    memoizes, so they still share memory after loading.
    """
    import torch

    if (
        tensor.device.type != "cpu"
        or tensor.layout is not torch.strided
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
    ):
        return None
    storage = tensor.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())
    if key not in storages:
        raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
        storages[key] = (raw.numpy(), storage)  # the storage is kept alive while pickling
    dtype_name = str(tensor.dtype).rpartition(".")[2]
    return _rebuild_tensor, (
        storages[key][0],
        dtype_name,
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.requires_grad,
        type(tensor) is torch.nn.Parameter,
    )


def _rebuild_tensor(
    raw: Any,
    dtype_name: str,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    is_parameter: bool,
) -> Any:
    """Inverse of :func:`_reduce_tensor`: a tensor over ``raw``'s memory, without a copy."""
    import torch

    with warnings.catch_warnings():
        # A read-only mapping (see _map_file) gives read-only arrays; torch warns once per
        # tensor about writing to them, which loading a model would turn into noise.
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.from_numpy(raw).untyped_storage()
    dtype = getattr(torch, dtype_name)
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    if is_parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _refuse_open_file(obj: Any) -> None:
    """An open file is a handle to data, not data: cloudpickle would send a file open for
    reading as a StringIO of what it holds now (and refuses one open for writing). Refuse both
    alike, so that the trial never gets a silent copy."""
    name = getattr(obj, "name", None)
    mode = getattr(obj, "mode", None)
    what = "an open file" + (f" ({name!r}, mode {mode!r})" if name is not None else "")
    raise pickle.PicklingError(f"{what} is a handle, not data; pass its path instead")


def _make_pickler_class() -> type:
    import cloudpickle

    class ObjectPickler(cloudpickle.CloudPickler):
        """cloudpickle with protocol 5 buffers and out-of-band CPU tensors."""

        def __init__(self, file: Any, buffer_callback: Any) -> None:
            super().__init__(file, protocol=5, buffer_callback=buffer_callback)
            self._tensors = _tensor_types()
            self._storages: dict[tuple[int, int], Any] = {}

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)):
                _refuse_open_file(obj)
            if self._tensors and type(obj) in self._tensors:
                try:
                    reduced = _reduce_tensor(obj, self._storages)
                except Exception:  # exotic tensors (inference, functorch): torch's own way
                    reduced = None
                if reduced is not None:
                    return reduced
            return super().reducer_override(obj)

    return ObjectPickler


_pickler_class: Optional[type] = None


def _serialize(obj: Any) -> tuple[memoryview, list[memoryview]]:
    """The pickle stream of ``obj`` and its out-of-band buffers (views of ``obj``'s memory)."""
    global _pickler_class
    if _pickler_class is None:
        _pickler_class = _make_pickler_class()
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    try:
        _pickler_class(stream, buffer_callback=buffers.append).dump(obj)
        views = [b.raw() for b in buffers]
    except Exception as exc:
        cause = f"{type(exc).__name__}: {exc}"
        raise _UnpicklableError(
            f"ftnb.put() cannot pickle the {_type_name(type(obj))} it was given ({cause}). "
            "Fix: create the object inside the trainable instead, or make it picklable "
            "(e.g. define __getstate__/__setstate__ to leave out open files, locks and "
            "connections).",
            cause,
        ) from exc
    return stream.getbuffer(), views


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(pickle_len: int, buffer_lens: list[int]) -> tuple[list[int], list[int]]:
    """Offsets (relative to the data section) and lengths of the pickle stream and of each
    buffer, every offset a multiple of 64."""
    offsets, position = [], 0
    for length in [pickle_len] + buffer_lens:
        offsets.append(position)
        position = _align(position + length)
    return offsets, [pickle_len] + buffer_lens


def _encode_header(meta: dict[str, Any]) -> bytes:
    body = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    head = _PREFIX.pack(_MAGIC, _FORMAT_VERSION, len(body)) + body
    return head + bytes(_align(len(head)) - len(head))


def _write_all(fd: int, data: memoryview) -> None:
    """Write all of ``data`` from its own memory (slices of a memoryview copy nothing)."""
    data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    position = 0
    while position < len(data):
        position += os.write(fd, data[position : position + _WRITE_CHUNK])


def _object_file_path(folder: str, pid: int, start: int, ref_id: str) -> str:
    """The file of the object ``ref_id`` owned by the process ``pid`` (started at ``start``) in
    ``folder``: ``{pid scope tag}-{pid}-{start}-{ref_id}.obj`` (parsed by :data:`_FILE_NAME`)."""
    return os.path.join(folder, f"{_pid_scope_tag()}-{pid}-{start}-{ref_id}{_SUFFIX}")


def _temporary_path(path: str) -> str:
    """Where the object file ``path`` is written before it is renamed into place."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.tmp")


def _write_object_file(
    path: str, header: bytes, pieces: list[memoryview], offsets: list[int]
) -> None:
    """Write header + pieces at their offsets into a temporary file, then rename it to
    ``path``: readers see the whole object or no file."""
    tmp = _temporary_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        try:
            _write_all(fd, memoryview(header))
            written = 0
            for piece, offset in zip(pieces, offsets):
                _write_all(fd, memoryview(bytes(offset - written)))  # alignment padding
                _write_all(fd, piece)
                written = offset + piece.nbytes
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


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
    pickle_view, buffers = _serialize(obj)
    offsets, lengths = _layout(pickle_view.nbytes, [b.nbytes for b in buffers])
    host = socket.gethostname()
    pid, start = _this_process()
    type_name, summary = _type_name(type(obj)), _summary(obj)
    header = _encode_header(
        {
            "pickle": [offsets[0], lengths[0]],
            "buffers": [[o, n] for o, n in zip(offsets[1:], lengths[1:])],
            "type": type_name,
            "repr": summary,
            "owner": {"host": host, "pid": pid, "start": start},
        }
    )
    size = len(header) + offsets[-1] + lengths[-1]
    sweep_orphans()
    folder = choose_store_dir(size)
    _ensure_dir(folder)
    ref_id = secrets.token_hex(8)
    path = _object_file_path(folder, pid, start, ref_id)
    try:
        _write_object_file(path, header, [pickle_view] + buffers, offsets)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise OSError(
            exc.errno,
            f"ftnb.put(): no room for a {_format_size(size)} {type_name} in {folder!r} "
            f"({exc.strerror}). Fix: free space there, or set {OBJECT_STORE_ENV} to a folder "
            "on a local disk with room for it.",
        ) from exc
    ref = ObjectRef(ref_id, path, size, type_name, summary, (host, pid, start))
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
    pid, start = _this_process()
    path = _object_file_path(os.path.dirname(ref.path), pid, start, ref.id)
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


def _map_file(fd: int, size: int) -> mmap.mmap:
    """A private copy-on-write mapping (arrays are writable, untouched pages stay shared);
    read-only where the kernel will not commit that much private memory."""
    try:
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)


def _read_header(view: memoryview, path: str) -> tuple[dict[str, Any], int]:
    """The header dict and where the data section starts; ValueError for a foreign file."""
    if len(view) >= _PREFIX.size:
        magic, version, length = _PREFIX.unpack(view[: _PREFIX.size])
        if magic == _MAGIC and version == _FORMAT_VERSION:
            end = _PREFIX.size + length
            return json.loads(bytes(view[_PREFIX.size : end])), _align(end)
        if magic == _MAGIC:
            raise ValueError(
                f"ftnb object file {path!r} has format version {version}, but this ftnb reads "
                f"version {_FORMAT_VERSION}. Fix: use the same ftnb version in every process "
                "of the experiment."
            )
    raise ValueError(f"{path!r} is not an ftnb object file (bad magic bytes).")


def _unavailable_message(ref: ObjectRef) -> str:
    host, pid, start = ref._owner
    what = f"ftnb object {ref.id} ({ref.type_name}, {_format_size(ref.size)})"
    if host != socket.gethostname():
        return (
            f"{what} is not available on this machine: it was created on {host!r}, and ftnb "
            "objects live on the machine that created them. Fix: create it with ftnb.put(...) "
            "on this machine, or run the trials there."
        )
    if _is_alive(pid, start):
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
    try:
        mapping = _map_file(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)  # the mapping keeps the file's pages, even once it is deleted
    view = memoryview(mapping)
    header, data_start = _read_header(view, ref.path)
    start, length = header["pickle"]
    stream = view[data_start + start : data_start + start + length]
    buffers = [view[data_start + o : data_start + o + n] for o, n in header["buffers"]]
    # Loaded arrays and tensors keep their buffer views, hence the mapping, alive.
    return pickle.loads(stream, buffers=buffers)


def get(ref: ObjectRef) -> Any:
    """The object behind ``ref``, memory-mapped from its file without a copy.

    Memoized per process: calling ``get`` twice with the same ref returns the same object.
    Arrays and tensors are writable; writes stay private to the process (copy-on-write).
    Raises :class:`ObjectUnavailableError` when the file is gone (its owner exited).
    """
    if not isinstance(ref, ObjectRef):
        hint = " (a placeholder from a state file)" if is_placeholder(ref) else ""
        raise TypeError(
            f"ftnb.get() needs the ObjectRef returned by ftnb.put(); got "
            f"{type(ref).__name__}{hint}: {_short_repr(ref)}. Fix: pass the ref itself, e.g. "
            "ftnb.get(config['data'])."
        )
    with _loaded_lock:
        if ref.id in _loaded:
            return _loaded[ref.id]
        obj = _load(ref)
        _loaded[ref.id] = obj
        return obj


# --------------------------------------------------------------------------- configs and spaces


def _rebuild_dict(value: dict, new: dict[Any, Any]) -> dict:
    """``value`` itself when no item changed, else a copy (of the same dict type) with ``new``."""
    if all(new[k] is v for k, v in value.items()):
        return value
    if type(value) is dict:
        return new
    out = copy.copy(value)  # keeps a defaultdict's factory, an OrderedDict's type
    out.update(new)
    return out


def _rebuild_seq(value: Any, items: list[Any]) -> Any:
    """``value`` itself when no item changed, else a list/tuple/namedtuple of ``items``."""
    if all(a is b for a, b in zip(items, value)):
        return value
    return _make_seq(type(value), items)


def resolve_refs(config: Any) -> Any:
    """``config`` with every :class:`ObjectRef` (in nested dicts, lists, tuples) replaced by
    :func:`get` of it. Containers holding no ref are returned as they are, not copied.

    >>> cfg = {"lr": 0.1, "layers": [64, 64]}
    >>> resolve_refs(cfg) is cfg
    True
    """
    if isinstance(config, ObjectRef):
        return get(config)
    if isinstance(config, dict):
        return _rebuild_dict(config, {k: resolve_refs(v) for k, v in config.items()})
    if isinstance(config, (list, tuple)):
        return _rebuild_seq(config, [resolve_refs(v) for v in config])
    return config


# Exact types that are JSON leaves; skipping them keeps walks of long number lists cheap.
_ATOMS = frozenset({int, float, str, bool, type(None)})


def _is_json_leaf(value: Any) -> bool:
    """JSON scalars, and numpy/torch 0-d scalars (state files store them as numbers)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    try:
        shape = getattr(value, "shape", None)
        return shape is not None and tuple(shape) == () and callable(getattr(value, "item", None))
    except Exception:
        return False


def _holds(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a search domain, grid axis or ref (``kinds``) occurs in nested dicts/lists."""
    if isinstance(value, kinds) or is_grid_search(value):
        return True
    if isinstance(value, Mapping):
        return any(_holds(v, kinds) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(type(v) not in _ATOMS and _holds(v, kinds) for v in value)
    return False


def _holds_object(value: Any) -> bool:
    """Whether a non-JSON leaf occurs in nested dicts/lists/tuples."""
    if isinstance(value, dict):
        return any(_holds_object(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(type(v) not in _ATOMS and _holds_object(v) for v in value)
    return not _is_json_leaf(value)



_SEARCH_OR_REF = (Domain, ObjectRef)


class _Binder:
    """State of one :func:`bind_objects` walk: refs by ``id(object)``, and what was put."""

    def __init__(self, adopt_refs: bool = False) -> None:
        self.refs: dict[int, ObjectRef] = {}
        self.bound: list[tuple[str, ObjectRef]] = []
        self.adopt_refs = adopt_refs

    def bind(self, value: Any, path: tuple[str | int, ...]) -> Any:
        if isinstance(value, ObjectRef):
            return adopt(value) if self.adopt_refs else value
        if _is_json_leaf(value):
            return value
        if isinstance(value, Categorical):
            categories = self.bind_items(value.categories, path + ("categories",))
            if categories is value.categories:
                return value
            domain = copy.copy(value)  # the caller's domain keeps its objects
            domain.categories = categories
            return domain
        if isinstance(value, Domain):
            return value
        if isinstance(value, dict):
            if is_grid_search(value):
                key = next(iter(value))
                return _rebuild_dict(value, {key: self.bind_items(value[key], path + (key,))})
            return _rebuild_dict(value, {k: self.bind(v, path + (k,)) for k, v in value.items()})
        if isinstance(value, (list, tuple)) and _holds(value, _SEARCH_OR_REF):
            return self.bind_items(value, path)
        if isinstance(value, (list, tuple)) and not _holds_object(value):
            return value
        if isinstance(value, Mapping) and _holds(value, _SEARCH_OR_REF):
            return value  # a user Mapping type that search resolves as a dict: left alone
        # Any other object, and a whole search-free list holding objects (one file for a list
        # of 10 000 tensors, not 10 000 files and mappings per trial).
        return self.put(value, path)

    def bind_items(self, items: Any, path: tuple[str | int, ...]) -> Any:
        """Bind each element of a list/tuple (grid options, choice categories, mixed lists)."""
        return _rebuild_seq(items, [self.bind(v, path + (i,)) for i, v in enumerate(items)])

    def put(self, value: Any, path: tuple[str | int, ...]) -> ObjectRef:
        ref = self.refs.get(id(value))
        if ref is None:
            try:
                ref = put(value)
            except _UnpicklableError as exc:
                raise TypeError(
                    f"param_space[{_fmt_path(path)!r}] holds a {_type_name(type(value))} that "
                    f"cannot be pickled ({exc.cause}), so trials cannot receive it. Fix: create "
                    "it inside the trainable (pass a path or settings in the config instead), "
                    "or make it picklable (define __getstate__/__setstate__)."
                ) from exc
            self.refs[id(value)] = ref
            self.bound.append((_fmt_path(path), ref))
        return ref


def bind_objects(space: Any, adopt_refs: bool = False) -> tuple[Any, list[tuple[str, ObjectRef]]]:
    """Replace every non-JSON leaf of a search space by ``put(leaf)``.

    Walks nested dicts, lists and tuples, grid axes (``{"grid_search": [...]}``, each option
    separately) and :func:`~ftnb.search.choice` categories; leaves JSON scalars, numpy/torch
    0-d scalars, other domains and existing refs alone. The same object used twice becomes
    one ref. A list or tuple without domains, grid axes or refs inside is stored whole, as one
    object. Returns the new space (the caller's is not modified; unchanged containers are
    shared) and ``(key_path, ref)`` for each object stored, with key paths like ``"model"``,
    ``"data/train"``, ``"opt/grid_search[1]"`` or ``"act/categories[0]"``.

    ``adopt_refs=True`` also :func:`adopt` the refs found (a detached supervisor does, so the
    objects outlive the kernel that put them).

    Raises TypeError naming the key path when an object cannot be pickled.
    """
    binder = _Binder(adopt_refs)
    return binder.bind(space, ()), binder.bound


def walk_placeholders(encoded: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(key_path, placeholder)`` for every :meth:`ObjectRef.placeholder` in an encoded
    (JSON) space or config, with the key paths of :func:`bind_objects`.

    >>> walk_placeholders({"data": {"train": {"__ftnb_ref__": "3fa2c1", "type": "t"}}})
    [('data/train', {'__ftnb_ref__': '3fa2c1', 'type': 't'})]
    """
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if is_placeholder(node):
            found.append((_fmt_path(path), node))
        elif isinstance(node, dict):
            for key, child in node.items():
                walk(child, path + (str(key),))
        elif isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, path + (i,))

    walk(encoded, ())
    return found
