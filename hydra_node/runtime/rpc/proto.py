"""ggml RPC protocol facts and a sans-IO codec for the handshake subset we speak.

Values come from ``ggml/include/ggml-rpc.h`` and ``ggml/src/ggml-rpc/ggml-rpc.cpp`` as
vendored by llama-cpp-python 0.3.36 (``RPC_PROTO_MAJOR_VERSION 7``, ``MINOR 0``,
``PATCH 0``, ``RPC_CMD_HELLO == 14``, ``RPC_CONN_CAPS_SIZE == 24``).

Framing (both directions little-endian, as the C code sends raw integers):
request ``| cmd: u8 | size: u64 | data |``, response ``| size: u64 | data |``.
We only build HELLO, DEVICE_COUNT and GET_DEVICE_MEMORY requests: enough to learn a
worker's protocol version and memory without handing control to llama.cpp, whose
client aborts the whole process on a version mismatch or a dead server.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: Protocol version of the ggml RPC code bundled with llama-cpp-python 0.3.36.
RPC_PROTO_MAJOR_VERSION = 7
RPC_PROTO_MINOR_VERSION = 0
RPC_PROTO_PATCH_VERSION = 0
#: Most RPC servers one llama.cpp process may register (``GGML_RPC_MAX_SERVERS``).
GGML_RPC_MAX_SERVERS = 16

CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24
_HELLO_RSP_SIZE = 4 + CONN_CAPS_SIZE
_DEVICE_COUNT_RSP_SIZE = 4
_DEVICE_MEMORY_RSP_SIZE = 16
#: Largest response we accept from a worker; every reply we ask for is tiny.
MAX_RESPONSE_BYTES = 64


class RpcProtocolError(Exception):
    """The remote worker sent bytes that are not a valid reply (the worker's fault)."""


class IncompatibleWorker(Exception):
    """A worker speaks a ggml RPC protocol version our llama.cpp cannot use."""

    def __init__(self, worker: "ProtoVersion", ours: "ProtoVersion", who: str = "worker"):
        super().__init__(
            f"{who} speaks ggml RPC protocol {worker}, this node's llama.cpp speaks {ours}: "
            f"the major version must be equal and the worker's minor version at most ours; "
            f"upgrade the older side's llama-cpp-python"
        )
        self.worker = worker
        self.ours = ours


@dataclass(frozen=True, order=True)
class ProtoVersion:
    major: int
    minor: int
    patch: int

    def __post_init__(self) -> None:
        for v in (self.major, self.minor, self.patch):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 255:
                raise ValueError(f"protocol version parts are integers 0..255, got {v!r}")

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @classmethod
    def parse(cls, text: object) -> "ProtoVersion":
        """Parse ``"7.0.0"`` (the form used in readiness lines and gossip)."""
        if not isinstance(text, str):
            raise ValueError(f"protocol version must be a string like '7.0.0', got {text!r}")
        parts = text.split(".")
        if len(parts) != 3 or not all(p.isdigit() and len(p) <= 3 for p in parts):
            raise ValueError(f"protocol version must look like '7.0.0', got {text!r}")
        return cls(*(int(p) for p in parts))

    def accepts_worker(self, worker: "ProtoVersion") -> bool:
        """llama.cpp's client rule (``negotiate_hello``): same major, worker minor <= ours."""
        return worker.major == self.major and worker.minor <= self.minor


RPC_PROTO = ProtoVersion(RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION, RPC_PROTO_PATCH_VERSION)


def check_worker_proto(worker: ProtoVersion, *, ours: ProtoVersion = RPC_PROTO, who: str = "worker") -> None:
    """Raise :class:`IncompatibleWorker` unless ``worker`` can serve ``ours``."""
    if not ours.accepts_worker(worker):
        raise IncompatibleWorker(worker, ours, who)


def _request(cmd: int, data: bytes) -> bytes:
    return struct.pack("<BQ", cmd, len(data)) + data


def encode_hello() -> bytes:
    """HELLO with all-zero connection capabilities (plain TCP, no RDMA upgrade)."""
    return _request(CMD_HELLO, bytes(CONN_CAPS_SIZE))


def encode_device_count() -> bytes:
    return _request(CMD_DEVICE_COUNT, b"")


def encode_device_memory(device: int) -> bytes:
    return _request(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device))


class ResponseReader:
    """Sans-IO reader for one ``| size: u64 | data |`` response of a known size.

    Feed bytes with :meth:`receive_data`; :meth:`next_payload` returns the payload
    once complete, else ``None``.  Any size other than the expected one is a
    :class:`RpcProtocolError` (the C client applies the same rule).
    """

    def __init__(self, expected_size: int):
        if not 0 < expected_size <= MAX_RESPONSE_BYTES:
            raise ValueError(f"expected_size must be 1..{MAX_RESPONSE_BYTES}")
        self._expected = expected_size
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> None:
        if len(self._buf) + len(data) > 8 + self._expected:
            self._buf += data[: 8 + self._expected - len(self._buf)]
            self._check_size()
            raise RpcProtocolError("worker sent more bytes than the reply we asked for")
        self._buf += data
        self._check_size()

    def _check_size(self) -> None:
        if len(self._buf) >= 8:
            (size,) = struct.unpack_from("<Q", self._buf)
            if size != self._expected:
                raise RpcProtocolError(f"worker replied with {size} bytes where {self._expected} were expected")

    def next_payload(self) -> bytes | None:
        if len(self._buf) < 8 + self._expected:
            return None
        return bytes(self._buf[8 : 8 + self._expected])


def decode_hello(payload: bytes) -> ProtoVersion:
    if len(payload) != _HELLO_RSP_SIZE:
        raise RpcProtocolError(f"HELLO reply must be {_HELLO_RSP_SIZE} bytes, got {len(payload)}")
    return ProtoVersion(payload[0], payload[1], payload[2])


def decode_device_count(payload: bytes) -> int:
    if len(payload) != _DEVICE_COUNT_RSP_SIZE:
        raise RpcProtocolError("DEVICE_COUNT reply must be 4 bytes")
    (n,) = struct.unpack("<I", payload)
    if not 1 <= n <= 64:
        raise RpcProtocolError(f"worker reports {n} devices")
    return n


def decode_device_memory(payload: bytes) -> tuple[int, int]:
    """Return ``(free_bytes, total_bytes)``."""
    if len(payload) != _DEVICE_MEMORY_RSP_SIZE:
        raise RpcProtocolError("GET_DEVICE_MEMORY reply must be 16 bytes")
    free, total = struct.unpack("<QQ", payload)
    if free > total:
        raise RpcProtocolError(f"worker reports free memory {free} above total {total}")
    return free, total


HELLO_REPLY_SIZE = _HELLO_RSP_SIZE
DEVICE_COUNT_REPLY_SIZE = _DEVICE_COUNT_RSP_SIZE
DEVICE_MEMORY_REPLY_SIZE = _DEVICE_MEMORY_RSP_SIZE
