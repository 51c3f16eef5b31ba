"""Byte plumbing and error mapping for the S3 store (``s3.py``): blocking, no trio.

:class:`HashingReader` hands a file to boto3's transfer manager and computes its sha256 while the
manager reads it (one pass over the bytes); :class:`HashingWriter` receives a download in order and
hashes it while it writes. Both say they cannot seek, so s3transfer reads (and writes) each byte
exactly once, in order (its non-seekable input and output managers). :func:`store_error` maps
botocore's and s3transfer's exceptions to the artifact errors once, at this boundary.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

import boto3.exceptions
import botocore.exceptions as bce
import s3transfer.exceptions

from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    ChecksumMismatch,
    StoreUnavailable,
)

__all__ = ["S3_ERRORS", "HashingReader", "HashingWriter", "error_code", "store_error"]

#: Longest server message kept in an error (an HTML error page from a proxy can be long).
MAX_REASON_CHARS = 300

#: What a boto3 call, an upload or a download raises for a failure of the store, the network or the
#: local disk (:func:`store_error` maps each); anything else is a bug and propagates.
S3_ERRORS = (
    bce.BotoCoreError,
    bce.ClientError,
    boto3.exceptions.Boto3Error,
    s3transfer.exceptions.RetriesExceededError,
    OSError,
)

#: S3 error codes that mean the credentials are missing, wrong or not allowed.
_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "403",
        "AllAccessDisabled",
    }
)


class HashingReader:
    """A read-only, non-seekable view of ``f`` that hashes what is read and counts it."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        block = self._f.read(n)
        self._sha.update(block)
        self.size += len(block)
        return block

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class HashingWriter:
    """A write-only, non-seekable sink into ``f`` that hashes what is written and counts it; more than
    ``limit`` bytes (the size the manifest promises) is :class:`ChecksumMismatch` at once."""

    def __init__(self, f: BinaryIO, *, limit: int) -> None:
        self._f = f
        self._sha = hashlib.sha256()
        self._limit = limit
        self.size = 0

    def write(self, block: bytes) -> int:
        self.size += len(block)
        if self.size > self._limit:
            raise ChecksumMismatch(f"the object is larger than the {self._limit} bytes its manifest lists")
        self._sha.update(block)
        return self._f.write(block)

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ``ClientError`` ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def store_error(exc: Exception, *, what: str, bucket: str, endpoint: str) -> ArtifactError:
    """The artifact error for a failed S3 call ``what`` (e.g. "upload kv_state/x/a.bin")."""
    where = f"s3://{bucket} at {endpoint}"
    if isinstance(exc, ArtifactError):
        return exc
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError, bce.ProfileNotFound)):
        return StoreUnavailable(
            f"{what}: no usable S3 credentials ({exc}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or another source boto3 reads"
        )
    if isinstance(
        exc,
        (
            bce.EndpointConnectionError,
            bce.ConnectTimeoutError,
            bce.ConnectionClosedError,
            bce.ReadTimeoutError,
            bce.HTTPClientError,
        ),
    ):
        return StoreUnavailable(f"{what}: cannot reach the S3 endpoint {endpoint} ({_short(exc)})")
    if isinstance(exc, bce.ClientError):
        code = error_code(exc)
        if code in ("NoSuchBucket",):
            return StoreUnavailable(f"{what}: the bucket {bucket!r} does not exist at {endpoint}")
        if code in ("NoSuchKey", "404"):
            return ArtifactNotFound(f"{what}: no such object in {where}")
        if code in _ACCESS_CODES:
            return StoreUnavailable(f"{what}: {where} refused the credentials ({code}: {_short(exc)})")
        return StoreUnavailable(f"{what}: {where} answered {code or 'an error'} ({_short(exc)})")
    if isinstance(exc, boto3.exceptions.S3UploadFailedError):
        text = str(exc)
        if "NoSuchBucket" in text:
            return StoreUnavailable(f"{what}: the bucket {bucket!r} does not exist at {endpoint}")
        return StoreUnavailable(f"{what}: the upload to {where} failed ({text[:MAX_REASON_CHARS]})")
    if isinstance(exc, (s3transfer.exceptions.RetriesExceededError, bce.BotoCoreError)):
        return StoreUnavailable(f"{what}: {where} failed ({_short(exc)})")
    if isinstance(exc, OSError):
        return StoreUnavailable(f"{what}: local I/O failed ({exc.strerror or exc})")
    return StoreUnavailable(f"{what}: {where} failed ({type(exc).__name__}: {_short(exc)})")


def _short(exc: BaseException) -> str:
    return str(exc)[:MAX_REASON_CHARS]
