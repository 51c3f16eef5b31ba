"""Typed download failures: each has a stable ``code`` and one line of text for the CLI that says
what went wrong and whose side it is on (our network, the server, the file)."""

from __future__ import annotations

__all__ = [
    "BadRedirect",
    "ChecksumMismatch",
    "DiskError",
    "DownloadError",
    "NoNetwork",
    "NotFound",
    "NotInMesh",
    "PeerFetchError",
    "RemoteStatusError",
    "SizeMismatch",
    "TransferTimeout",
    "Unauthorized",
]


class DownloadError(Exception):
    """A model could not be fetched; ``code`` is stable (docs/models.md lists them)."""

    code = "download_failed"

    def __init__(self, message: str, *, partial_kept: bool = False) -> None:
        super().__init__(message)
        self.message = message
        #: True when the bytes received so far were kept for a resumed download.
        self.partial_kept = partial_kept

    def __str__(self) -> str:
        tail = " (partial file kept: run the same command again to resume)" if self.partial_kept else ""
        return f"{self.message}{tail}"


class NoNetwork(DownloadError):
    code = "no_network"


class NotFound(DownloadError):
    code = "not_found"


class Unauthorized(DownloadError):
    code = "unauthorized"


class RemoteStatusError(DownloadError):
    code = "http_error"


class BadRedirect(DownloadError):
    """The server redirected to a scheme other than http or https (``ftp://``, ``file://``)."""

    code = "bad_redirect"


class TransferTimeout(DownloadError):
    code = "timeout"


class ChecksumMismatch(DownloadError):
    code = "checksum_mismatch"


class SizeMismatch(DownloadError):
    code = "size_mismatch"


class DiskError(DownloadError):
    code = "disk"


class PeerFetchError(DownloadError):
    """A peer could not send the file (it does not hold it, it is busy, the link broke)."""

    code = "peer_fetch_failed"


class NotInMesh(PeerFetchError):
    """No alive peer announces the model."""

    code = "not_in_mesh"
