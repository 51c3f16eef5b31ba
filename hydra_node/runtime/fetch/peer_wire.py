"""The ``model_fetch`` stream's messages (protocol/README.md section 11.3), pure and strict.

OPEN header ``{"kind": "model_fetch", "sha256": HEX64, "offset": N}``. The holder answers with
frames (section 2.1, at most :data:`MAX_FETCH_FRAME_BYTES`): ``{"op": "file", "size": S}``, then
``{"op": "data", "b": BYTES}`` (1 … :data:`DATA_FRAME_BYTES` bytes each) until byte S, then
``{"op": "end"}`` and half-closes; or one ``{"op": "error", "code", "message"}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Transfers a node sends at once (each to a different peer), on either file stream.
MAX_UPLOADS = 4
#: Bytes read from or written to disk in one worker-thread call (16 data frames): fewer thread hops.
DISK_IO_BYTES = 1 << 20

__all__ = [
    "DATA_FRAME_BYTES",
    "DISK_IO_BYTES",
    "MAX_UPLOADS",
    "FETCH_KIND",
    "HELD_KEY",
    "MAX_ANNOUNCED_MODELS",
    "MAX_FETCH_FRAME_BYTES",
    "MAX_SHARED_FILE_BYTES",
    "FetchRequest",
    "ReplyChecker",
    "WireError",
    "held_from_extra",
]

FETCH_KIND = "model_fetch"
#: Payload bytes in one data frame (a quarter of a stream's 256 KiB window).
DATA_FRAME_BYTES = 64 * 1024
#: Largest frame on the stream (a data frame plus its CBOR envelope).
MAX_FETCH_FRAME_BYTES = DATA_FRAME_BYTES + 1024
#: Largest file a holder offers or a requester accepts (1 TiB: more than any GGUF in use).
MAX_SHARED_FILE_BYTES = 1 << 40
#: Announcement ``extra`` key listing the models a node shares: ``[[model id, sha256 hex], ...]``.
HELD_KEY = "models_held"
#: Most models one announcement lists (each costs 3 of the 256 ``extra`` items).
MAX_ANNOUNCED_MODELS = 16
#: Error codes a holder may send.
ERROR_CODES = ("not_held", "busy", "bad_request", "read_failed")

_HEX64 = re.compile(r"[0-9a-f]{64}")


class WireError(ValueError):
    """A malformed header or reply (who is to blame is the side that sent it)."""


@dataclass(frozen=True)
class FetchRequest:
    sha256: str
    offset: int

    def __post_init__(self) -> None:
        if not isinstance(self.sha256, str) or not _HEX64.fullmatch(self.sha256):
            raise WireError("sha256 must be 64 lower-case hex digits")
        if (
            isinstance(self.offset, bool)
            or not isinstance(self.offset, int)
            or not 0 <= self.offset <= MAX_SHARED_FILE_BYTES
        ):
            raise WireError(f"offset must be an integer 0 … {MAX_SHARED_FILE_BYTES}")

    def header(self) -> dict[str, Any]:
        return {"kind": FETCH_KIND, "sha256": self.sha256, "offset": self.offset}

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> FetchRequest:
        if set(header) != {"kind", "sha256", "offset"} or header.get("kind") != FETCH_KIND:
            raise WireError("a model_fetch header is exactly {kind, sha256, offset}")
        return cls(header["sha256"], header["offset"])


class ReplyChecker:
    """Checks a holder's frames in order; :meth:`feed` returns the data bytes of a data frame (b"" for
    the others) and raises :class:`WireError` for anything out of place, or a ``RemoteRefused`` tuple
    via :attr:`error` for the holder's error message."""

    def __init__(self, offset: int, expected_size: int | None) -> None:
        self.offset = offset
        self.expected_size = expected_size
        self.size: int | None = None
        self.received = offset
        self.ended = False
        self.error: tuple[str, str] | None = None

    def feed(self, msg: Mapping[str, Any]) -> bytes:
        op = msg.get("op")
        if self.ended or self.error is not None:
            raise WireError(f"{op!r:.20} after the end of the reply")
        if op == "error" and self.size is None:
            code, message = msg.get("code"), msg.get("message")
            if set(msg) != {"op", "code", "message"} or code not in ERROR_CODES or not isinstance(message, str):
                raise WireError("a malformed error message")
            self.error = (code, message[:500])
            return b""
        if self.size is None:
            size = msg.get("size")
            if op != "file" or set(msg) != {"op", "size"} or isinstance(size, bool) or not isinstance(size, int):
                raise WireError("the reply must start with {op: file, size}")
            if not self.offset <= size <= MAX_SHARED_FILE_BYTES:
                raise WireError(f"file size {size} is below the offset {self.offset} or above the cap")
            if self.expected_size is not None and size != self.expected_size:
                raise WireError(f"the holder offers {size} bytes; {self.expected_size} were expected")
            self.size = size
            return b""
        if op == "data":
            data = msg.get("b")
            if set(msg) != {"op", "b"} or not isinstance(data, bytes) or not 0 < len(data) <= DATA_FRAME_BYTES:
                raise WireError("a data frame carries 1 … 64 KiB of bytes")
            if self.received + len(data) > self.size:
                raise WireError("the holder sent more bytes than the file holds")
            self.received += len(data)
            return data
        if op == "end" and set(msg) == {"op"}:
            if self.received != self.size:
                raise WireError(f"end after {self.received} of {self.size} bytes")
            self.ended = True
            return b""
        raise WireError(f"unexpected {op!r:.20} in a model_fetch reply")


def held_from_extra(extra: Mapping[str, Any]) -> dict[str, str]:
    """model id → sha256 from a peer's announcement ``extra`` (malformed entries are skipped)."""
    raw = extra.get(HELD_KEY)
    out: dict[str, str] = {}
    if isinstance(raw, list):
        for item in raw[:MAX_ANNOUNCED_MODELS]:
            if (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], str)
                and _HEX64.fullmatch(item[1])
            ):
                out[item[0]] = item[1]
    return out
