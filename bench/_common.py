"""Shared bits for benchmarks: start a node, stream a completion and time it."""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import NodeProcess  # noqa: E402,F401 - re-exported for the benches

from hydra_node.routing.metric import percentile as nearest_rank  # noqa: E402


def stream_completion(port: int, body: dict, path: str = "/v1/completions") -> tuple[float, float, int]:
    """POST a streaming request on a raw socket. Returns (ttft_s, decode_s, tokens)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: 127.0.0.1:"
            + str(port).encode()
            + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        buf = b""
        t_first = t_last = None
        tokens = 0
        while b"data: [DONE]" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"connection closed early: {buf[-500:]!r}")
            now = time.perf_counter()
            if t_first is None and b'"text":"' in chunk and b'"text":""' not in chunk.split(b"data: ")[-1][:0]:
                t_first = now
            t_last = now
            buf += chunk
        for line in buf.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return (t_first - t0), (t_last - t_first), tokens


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def sse_events(port: int, body: dict, timeout_s: float, path: str = "/v1/chat/completions"):
    """POST ``body`` to 127.0.0.1 and yield ``(arrival time, event)`` for each SSE data event until
    ``[DONE]``. Raises on a non-200 reply, an error event, a stream that ends without [DONE], or
    past ``timeout_s`` in all."""
    import http.client

    deadline = time.perf_counter() + timeout_s
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(2000)!r}")
        while True:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"stream ran past {timeout_s} s")
            line = resp.readline(1 << 20)
            if not line:
                raise RuntimeError("stream ended without data: [DONE]")
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"error event: {event['error']}")
            yield time.perf_counter(), event
    finally:
        conn.close()


def stream_chat(
    port: int, body: dict, timeout_s: float, path: str = "/v1/chat/completions"
) -> tuple[float, float, int]:
    """POST a streaming chat request to 127.0.0.1 (any server: chunked or not). Returns
    (ttft_s, latency_s, completion_tokens): TTFT at the first non-empty content delta; tokens
    from the final `usage` chunk, else the number of content deltas. Raises as :func:`sse_events`."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    t0 = time.perf_counter()
    t_first, deltas, usage = None, 0, None
    for t, event in sse_events(port, body, timeout_s, path):
        if event.get("usage"):
            usage = event["usage"].get("completion_tokens")
        for choice in event.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                deltas += 1
                if t_first is None:
                    t_first = t
    t_end = time.perf_counter()
    if t_first is None:
        raise RuntimeError("no content in the stream")
    return t_first - t0, t_end - t0, usage if usage is not None else deltas


def process_tree_rss(pid: int) -> int:
    """Resident set size in bytes of ``pid`` and all its descendants (Linux /proc)."""
    from harness import pids_with_parent

    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
        todo.extend(pids_with_parent(p))
    return total


def percentile(xs, q: float) -> float:
    """Nearest-rank percentile (q in 0..100, the routing telemetry's rule); nan for no samples."""
    value = nearest_rank(list(xs), q / 100)
    return float("nan") if value is None else value
