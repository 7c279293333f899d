"""What kind of storage an fsspec filesystem or a storage URL is, by its protocols: this
machine's disk (:func:`is_local_fs`), an object store whose folders are implicit
(:func:`is_object_store`), or anything else fsspec reaches (an SSH or HDFS folder, an NFS share
reached through fsspec, ...). An NFS mount used as a plain path is this machine's disk here.
:class:`~ftnb.storage.backend.Storage` branches on these answers, and nothing else asks.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LOCAL_PROTOCOLS",
    "OBJECT_STORE_PROTOCOLS",
    "is_local_fs",
    "is_local_path_with_colons",
    "is_object_store",
    "protocols",
]

#: The protocols of this machine's disk (fsspec's ``LocalFileSystem``).
LOCAL_PROTOCOLS = frozenset({"file", "local"})

#: The protocols of object stores: S3, Google Cloud Storage, Azure (Blob, Data Lake).
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})


def protocols(fs: Any) -> set[str]:
    """The protocols an fsspec filesystem answers to (``fs.protocol`` is a string or a tuple)."""
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


def is_local_fs(fs: Any) -> bool:
    """Whether an fsspec filesystem is this machine's disk."""
    return bool(protocols(fs) & LOCAL_PROTOCOLS)


def is_object_store(fs: Any) -> bool:
    """Whether an fsspec filesystem is an object store (:data:`OBJECT_STORE_PROTOCOLS`)."""
    return bool(protocols(fs) & OBJECT_STORE_PROTOCOLS)


def is_local_path_with_colons(url: str) -> bool:
    """Whether ``url`` is a local path with ``::`` in it, not a chain of fsspec filesystems
    (``simplecache::s3://bucket/runs``): no protocol before its first ``::``."""
    from fsspec.core import split_protocol
    from fsspec.registry import known_implementations

    if "::" not in url:
        return False
    head = url.split("::", 1)[0]
    return split_protocol(head)[0] is None and head not in known_implementations
