"""S3's conditional writes, what :meth:`ftnb.storage.backend.Storage.write_if` and
:meth:`~ftnb.storage.backend.Storage.read_versioned` use in place of a lock on an object store:
one GET that pairs an object with its ETag, and a PUT that the server refuses (412 Precondition
Failed) unless the object is unchanged (``If-Match``) or absent (``If-None-Match: *``)."""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["is_s3", "precondition_failed", "s3_get_with_etag", "s3_put_if", "s3_status"]


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs's filesystem (s3fs is imported already if it is)."""
    s3fs = sys.modules.get("s3fs")
    return s3fs is not None and isinstance(fs, s3fs.S3FileSystem)


async def s3_get_with_etag(fs: Any, path: str) -> tuple[bytes, str]:
    """The object ``path`` and its ETag, from one GET (a HEAD then a GET could pair the
    contents of one version with the ETag of the next)."""
    bucket, key, version_id = fs.split_path(path)
    extra = {"VersionId": version_id} if version_id else {}
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
    try:
        return await response["Body"].read(), response["ETag"]
    finally:
        response["Body"].close()


def s3_put_if(fs: Any, path: str, data: bytes, version: Optional[str], deadline: dict) -> bool:
    """PUT ``data`` at ``path`` if the object's ETag is ``version`` (None: if there is no
    object); False when the server refuses because it is not (412 Precondition Failed, or no
    object to match)."""
    condition = {"mode": "create"} if version is None else {"IfMatch": version}
    try:
        fs.pipe_file(path, data, **condition, **deadline)
    except FileNotFoundError:
        if version is None:
            raise  # no bucket: not a lost race
        return False
    except Exception as exc:
        if precondition_failed(exc):
            return False
        raise
    return True


def precondition_failed(exc: BaseException) -> bool:
    """Whether a storage error is S3's 412 Precondition Failed."""
    return s3_status(exc) == 412


def s3_status(exc: BaseException) -> Optional[int]:
    """The HTTP status of the S3 answer behind a storage error (s3fs keeps botocore's error as
    the cause of its own); None when no answer came (a network error)."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        seen = seen.__cause__
    return None
