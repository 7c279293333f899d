"""The ``ftnb.put`` object file: its format, how an object is pickled into one, and how one is
loaded back by memory-mapping it.

File format (version 1), all integers little-endian::

    b"FTNBOBJ\\0"  u32 version  u32 header_length  header (UTF-8 JSON)  zero padding to 64
    data section: the pickle stream, then each out-of-band buffer, each starting at a multiple
    of 64 bytes from the start of the data section (which itself starts at a multiple of 64).

The header is ``{"pickle": [offset, length], "buffers": [[offset, length], ...], "type": ...,
"repr": ..., "owner": {"host": ..., "pid": ..., "start": ...}}`` with offsets relative to the
data section. The pickle stream is protocol 5 (cloudpickle, so notebook-defined classes work);
large contiguous buffers travel out of band and are handed back to ``pickle.loads`` as
memoryviews into the mapping. CPU torch tensors are reduced to a numpy view of their storage so
that they travel out of band too.
"""

from __future__ import annotations

import errno
import io
import json
import mmap
import os
import pickle
import struct
import sys
import warnings
from typing import Any, Optional

from .describe import type_name
from .folders import remove_if_present, temporary_path

__all__ = [
    "EncodedObject",
    "UnpicklableError",
    "encode_object",
    "load_object_file",
    "serialize",
    "write_object_file",
]

_MAGIC = b"FTNBOBJ\x00"
_FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, format version, header length
_ALIGN = 64  # cache-line alignment: every dtype, SIMD loads included, is aligned in the mapping
_WRITE_CHUNK = 1 << 30  # os.write moves at most ~2 GiB per call on Linux


class UnpicklableError(TypeError):
    """Raised by :func:`serialize` when the object cannot be pickled (``cause`` is the reason)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


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


def serialize(obj: Any) -> tuple[memoryview, list[memoryview]]:
    """The pickle stream of ``obj`` and its out-of-band buffers (views of ``obj``'s memory);
    :class:`UnpicklableError` when it cannot be pickled."""
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
        raise UnpicklableError(
            f"ftnb.put() cannot pickle the {type_name(type(obj))} it was given ({cause}). "
            "Fix: create the object inside the trainable instead, or make it picklable "
            "(e.g. define __getstate__/__setstate__ to leave out open files, locks and "
            "connections).",
            cause,
        ) from exc
    return stream.getbuffer(), views


# --------------------------------------------------------------------------- writing


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


class EncodedObject:
    """An object as its file holds it: the header, then each piece (the pickle stream, then
    each out-of-band buffer) at its offset in the data section."""

    __slots__ = ("header", "pieces", "offsets", "size")

    def __init__(self, header: bytes, pieces: list[memoryview], offsets: list[int]) -> None:
        self.header = header
        self.pieces = pieces
        self.offsets = offsets
        #: Bytes of the whole file.
        self.size = len(header) + offsets[-1] + pieces[-1].nbytes


def encode_object(
    pickle_view: memoryview, buffers: list[memoryview], description: dict[str, Any]
) -> EncodedObject:
    """Lay out what :func:`serialize` returned; ``description`` (``type``, ``repr``, ``owner``)
    completes the header."""
    offsets, lengths = _layout(pickle_view.nbytes, [b.nbytes for b in buffers])
    header = _encode_header(
        {
            "pickle": [offsets[0], lengths[0]],
            "buffers": [[o, n] for o, n in zip(offsets[1:], lengths[1:])],
            **description,
        }
    )
    return EncodedObject(header, [pickle_view] + buffers, offsets)


def write_object_file(path: str, encoded: EncodedObject) -> None:
    """Write the header and the pieces at their offsets into a temporary file, then rename it
    to ``path``: readers see the whole object or no file."""
    tmp = temporary_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        try:
            _write_all(fd, memoryview(encoded.header))
            written = 0
            for piece, offset in zip(encoded.pieces, encoded.offsets):
                _write_all(fd, memoryview(bytes(offset - written)))  # alignment padding
                _write_all(fd, piece)
                written = offset + piece.nbytes
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        remove_if_present(tmp)
        raise


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


def load_object_file(fd: int, path: str) -> Any:
    """The object in the object file open as ``fd`` (closed here), memory-mapped: its arrays
    and tensors point into the mapping. ValueError when ``path`` is not an object file."""
    try:
        mapping = _map_file(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)  # the mapping keeps the file's pages, even once it is deleted
    view = memoryview(mapping)
    header, data_start = _read_header(view, path)
    start, length = header["pickle"]
    stream = view[data_start + start : data_start + start + length]
    buffers = [view[data_start + o : data_start + o + n] for o, n in header["buffers"]]
    # Loaded arrays and tensors keep their buffer views, hence the mapping, alive.
    return pickle.loads(stream, buffers=buffers)
