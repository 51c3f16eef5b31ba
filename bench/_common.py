"""Shared bits for benchmarks: start a node, stream a completion and time it."""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import NodeProcess  # noqa: E402


def stream_completion(port: int, body: dict, path: str = "/v1/completions") -> tuple[float, float, int]:
    """POST a streaming request on a raw socket. Returns (ttft_s, decode_s, tokens)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        buf = b""
        t_first = t_last = None
        tokens = 0
        while b"data: [DONE]" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"connection closed early: {buf[-500:]!r}")
            now = time.perf_counter()
            if t_first is None and b'"text":"' in chunk and b'"text":""' not in chunk.split(b"data: ")[-1][:0] :
                t_first = now
            t_last = now
            buf += chunk
        for line in buf.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return (t_first - t0), (t_last - t_first), tokens


def median(xs):
    return statistics.median(xs) if xs else float("nan")
