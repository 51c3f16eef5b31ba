"""The worker's one JSON line on stdout, parsed into typed events (sans-IO).

The line is decoded by the one strict decoder (:func:`hydra_node.codec.decode_object_line`:
bounded, no duplicate keys, no NaN) and then checked field by field: any bytes give a
:class:`Readiness`, a :class:`StartFailure` or :class:`BadReadiness`, nothing else.

This is also how a coordinator learns a worker's RPC protocol version: the worker
reports what its own server answered to a HELLO (``"proto": "7.0.0"``); the node
gossips that value with the worker's advertisement, planners refuse incompatible
versions, and the runner probes the endpoint once more before llama.cpp sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.jsonline import decode_object_line

from hydra_node.runtime.rpc.proto import ProtoVersion

#: Longest readiness line we read from a worker; a real one is about 200 bytes.
MAX_READINESS_LINE = 4096


class BadReadiness(Exception):
    """The worker printed something that is not a readiness line (the worker's fault)."""


@dataclass(frozen=True)
class Readiness:
    endpoint: str
    proto: ProtoVersion
    free_bytes: int
    total_bytes: int
    device: str
    description: str = ""
    pid: int = 0

    def to_wire(self) -> dict:
        return {
            "ready": True,
            "endpoint": self.endpoint,
            "proto": str(self.proto),
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "device": self.device,
            "description": self.description,
            "pid": self.pid,
        }


@dataclass(frozen=True)
class StartFailure:
    error: str
    permanent: bool  # True: restarting with the same arguments cannot help


def _int(d: dict, key: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadReadiness(f"readiness field {key!r} must be a non-negative integer, got {v!r}")
    return v


def _str(d: dict, key: str, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or len(v) > 256:
        raise BadReadiness(f"readiness field {key!r} must be a short string, got {v!r}")
    return v


def parse_readiness(line: bytes) -> Readiness | StartFailure:
    """Parse one line (with or without its newline); raise :class:`BadReadiness`."""
    if len(line) > MAX_READINESS_LINE:
        raise BadReadiness(f"readiness line longer than {MAX_READINESS_LINE} bytes")
    try:
        d = decode_object_line(line, max_bytes=MAX_READINESS_LINE)
    except DecodeError as exc:
        raise BadReadiness(f"readiness line is not a JSON object ({exc.code}): {line[:80]!r}") from None
    if not isinstance(d.get("ready"), bool):
        raise BadReadiness("readiness line must be an object with a boolean 'ready'")
    if not d["ready"]:
        return StartFailure(_str(d, "error", "worker failed to start")[:256], d.get("permanent") is True)
    try:
        proto = ProtoVersion.parse(d.get("proto"))
    except ValueError as exc:
        raise BadReadiness(str(exc)) from None
    free, total = _int(d, "free_bytes"), _int(d, "total_bytes")
    if free > total:
        raise BadReadiness(f"free_bytes {free} above total_bytes {total}")
    return Readiness(
        _str(d, "endpoint"),
        proto,
        free,
        total,
        _str(d, "device"),
        _str(d, "description", ""),
        _int(d, "pid") if "pid" in d else 0,
    )
