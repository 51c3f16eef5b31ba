"""Blocking probe of a ggml RPC worker: protocol version and memory, with a deadline.

Used by the worker itself (readiness) and by a model runner before it hands an
endpoint to llama.cpp: llama.cpp's client calls ``abort()`` when a server is
unreachable or speaks another protocol version, so we ask first, in Python, where a
failure is a typed exception.  A worker serves one client at a time, so a probe of a
busy worker times out (:class:`WorkerUnreachable`) instead of hanging.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from hydra_node.runtime.rpc import proto as _proto
from hydra_node.runtime.rpc.proto import ProtoVersion, RpcProtocolError

#: Default bound on one whole probe (connect + three request/reply pairs).
PROBE_TIMEOUT_S = 3.0


class WorkerUnreachable(Exception):
    """Nothing answered the RPC handshake at the endpoint within the deadline."""


@dataclass(frozen=True)
class WorkerHello:
    endpoint: str
    proto: ProtoVersion
    n_devices: int
    free_bytes: int
    total_bytes: int


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split ``"host:port"``; raise ValueError for anything else."""
    if not isinstance(endpoint, str) or endpoint.count(":") != 1:
        raise ValueError(f"endpoint must be 'host:port', got {endpoint!r}")
    host, port_text = endpoint.split(":")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"endpoint must be 'host:port' with a port 1..65535, got {endpoint!r}")
    return host, int(port_text)


def _exchange(sock: socket.socket, request: bytes, reply_size: int, deadline: float) -> bytes:
    sock.sendall(request)
    reader = _proto.ResponseReader(reply_size)
    while (payload := reader.next_payload()) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("probe deadline passed")
        sock.settimeout(remaining)
        chunk = sock.recv(4096)
        if not chunk:
            raise RpcProtocolError("worker closed the connection mid-reply")
        reader.receive_data(chunk)
    return payload


def probe_worker(endpoint: str, *, timeout: float = PROBE_TIMEOUT_S) -> WorkerHello:
    """HELLO + DEVICE_COUNT + GET_DEVICE_MEMORY(0..n-1) against ``endpoint``.

    Raises :class:`WorkerUnreachable` (no answer in time: down, or busy with
    another coordinator) or :class:`~._proto.RpcProtocolError` (answered nonsense).
    The version is returned, not judged: call ``check_worker_proto`` on it.
    """
    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            proto = _proto.decode_hello(_exchange(sock, _proto.encode_hello(), _proto.HELLO_REPLY_SIZE, deadline))
            if proto.major != _proto.RPC_PROTO_MAJOR_VERSION:
                # Another major version may frame later commands differently: stop here.
                return WorkerHello(endpoint, proto, 0, 0, 0)
            n = _proto.decode_device_count(
                _exchange(sock, _proto.encode_device_count(), _proto.DEVICE_COUNT_REPLY_SIZE, deadline)
            )
            free = total = 0
            for dev in range(n):
                f, t = _proto.decode_device_memory(
                    _exchange(sock, _proto.encode_device_memory(dev), _proto.DEVICE_MEMORY_REPLY_SIZE, deadline)
                )
                free, total = free + f, total + t
            return WorkerHello(endpoint, proto, n, free, total)
    except (socket.timeout, TimeoutError) as exc:
        raise WorkerUnreachable(
            f"RPC worker {endpoint} did not answer within {timeout:.1f} s (down, or serving another coordinator)"
        ) from exc
    except OSError as exc:
        raise WorkerUnreachable(f"RPC worker {endpoint} unreachable: {exc}") from exc
