"""The h11 server (hydra_node/http/server.py) on real loopback sockets: Expect: 100-continue, the
request-head deadline, per-address connection caps with /health still answered, pipelined bytes
bounded while a response streams, CORS on streams and errors, refusals logged at a bounded rate.

The server is the real one; the routes are small handlers of this file (the live node's own
routes are exercised in tests/security/)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from contextlib import asynccontextmanager

import h11
import pytest
import trio

from hydra_node.http.server import HttpServer, Request, Response, StreamResponse
from hydra_node.http.guard import GuardSettings
from hydra_node.http.limits import HttpLimits

KEY = "secret-key-123"
TICK_S = 0.01


async def _handler(request: Request):
    path = request.path.rstrip("/") or "/"
    if path == "/health":
        return Response.json(200, {"status": "ok"})
    if path == "/echo":
        return Response.json(200, {"bytes": len(request.body)})
    if path == "/stream":

        async def body():
            n = 0
            while True:  # until the client goes or the server drains
                yield f"data: {n}\n\n".encode()
                n += 1
                await trio.sleep(TICK_S)

        return StreamResponse(200, body())
    return Response.json(
        404, {"error": {"message": "no route", "type": "invalid_request_error", "param": None, "code": "not_found"}}
    )


@asynccontextmanager
async def serving(guard: GuardSettings | None = None, limits: HttpLimits = HttpLimits(), refused=None):
    server = HttpServer(_handler, "127.0.0.1", 0, "test", guard=guard, limits=limits, on_refused=refused)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


async def connect(port: int, source: str = "127.0.0.1") -> trio.SocketStream:
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


class Reader:
    """Reads HTTP/1.1 responses (Content-Length or chunked) from a stream."""

    def __init__(self, stream: trio.SocketStream):
        self.stream, self.buf = stream, b""

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buf += data
        return bool(data)

    async def head(self) -> tuple[int, dict] | None:
        while b"\r\n\r\n" not in self.buf:
            if not await self._fill():
                return None
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(lines[0].split()[1]), headers

    async def response(self) -> tuple[int, dict, bytes] | None:
        got = await self.head()
        if got is None:
            return None
        status, headers = got
        if status == 204:
            return status, headers, b""
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            assert await self._fill(), "connection closed inside a body"
        body, self.buf = self.buf[:n], self.buf[n:]
        return status, headers, body

    async def until(self, marker: bytes) -> None:
        while marker not in self.buf:
            assert await self._fill(), f"connection closed before {marker!r}"

    async def closed(self) -> bool:
        """Reads to EOF; True when the peer closed (raises on reset, which also counts as closed)."""
        try:
            while await self._fill():
                pass
        except trio.BrokenResourceError:
            pass
        return True


def _req(method: str, path: str, body: bytes = b"", host: str = "127.0.0.1", **headers) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body and "content_length" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def test_expect_100_continue_is_answered_before_the_body_is_sent():
    async with serving() as server:
        s = await connect(server.port)
        r = Reader(s)
        body = b"x" * (2 << 20)
        await s.send_all(_req("POST", "/echo", expect="100-continue", content_length=str(len(body))))
        with trio.fail_after(10):  # a hang guard: without 100 Continue the client would wait here
            status, _ = await r.head()
        assert status == 100
        await s.send_all(body)
        status, _, out = await r.response()
        assert status == 200 and json.loads(out) == {"bytes": len(body)}


async def test_expect_100_continue_gets_the_final_refusal_at_once():
    limits = HttpLimits(max_body_bytes=1024)
    async with serving(GuardSettings(check_host=True, api_key=KEY), limits) as server:
        for headers, status, code in (
            ({"authorization": f"Bearer {KEY}"}, 413, "request_too_large"),
            ({}, 401, "invalid_api_key"),
            ({"authorization": f"Bearer {KEY}", "host": "evil.example"}, 403, "forbidden_host"),
        ):
            s = await connect(server.port)
            host = headers.pop("host", "127.0.0.1")
            await s.send_all(_req("POST", "/echo", host=host, expect="100-continue", content_length="4096", **headers))
            r = Reader(s)
            with trio.fail_after(10):
                got, headers_, body = await r.response()  # no body was sent: the answer comes anyway
            assert got == status and json.loads(body)["error"]["code"] == code
            assert headers_["connection"] == "close"
            await s.aclose()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_sends_a_big_body_without_waiting_for_expect(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"y" * (3 << 20))  # > 1 MiB: curl sends Expect: 100-continue
    async with serving() as server:
        res = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                ["curl", "-sv", "--data-binary", f"@{big}", f"http://127.0.0.1:{server.port}/echo"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
    assert "Expect: 100-continue" in res.stderr and "HTTP/1.1 100" in res.stderr
    assert "Done waiting for 100-continue" not in res.stderr  # curl's 1 s fallback never ran
    assert json.loads(res.stdout) == {"bytes": 3 << 20}


async def test_a_slowloris_head_is_closed_at_the_head_deadline_not_the_keepalive():
    limits = HttpLimits(head_timeout_s=0.5, keepalive_idle_s=3600)
    async with serving(limits=limits) as server:
        s = await connect(server.port)
        r = Reader(s)
        await s.send_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with trio.fail_after(30):  # hang guard only: the keep-alive time is an hour
            try:
                while True:
                    await s.send_all(b"X-Drip: a\r\n")  # a header line at a time, never the blank line
                    with trio.move_on_after(0.05):
                        if not await r._fill():
                            break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        assert r.buf.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in r.buf
        assert server.refusals == {408: 1}


async def test_a_fresh_connection_that_sends_nothing_is_closed_at_the_head_deadline():
    async with serving(limits=HttpLimits(head_timeout_s=0.3, keepalive_idle_s=3600)) as server:
        s = await connect(server.port)
        with trio.fail_after(30):
            assert await Reader(s).closed()
        assert server.table.total == 0


async def test_a_keepalive_connection_gets_the_idle_time_between_requests():
    async with serving(limits=HttpLimits(head_timeout_s=0.3, keepalive_idle_s=3600)) as server:
        s = await connect(server.port)
        r = Reader(s)
        await s.send_all(_req("GET", "/health"))
        assert (await r.response())[0] == 200
        await trio.sleep(0.6)  # past the head deadline, within the keep-alive idle time
        await s.send_all(_req("GET", "/health"))
        assert (await r.response())[0] == 200


async def _idle_keepalive(port: int, source: str, n: int) -> list[trio.SocketStream]:
    """``n`` connections from ``source`` that each finished a request and now sit idle (keep-alive)."""
    conns = []
    for _ in range(n):
        s = await connect(port, source)
        await s.send_all(_req("GET", "/health"))
        r = Reader(s)
        got = await r.response()
        conns.append(s)
        if got is None or got[1].get("connection") == "close":
            break
    return conns


async def test_200_idle_connections_from_one_address_do_not_lock_out_health():
    async with serving() as server:  # default limits
        with trio.fail_after(120):
            idle = await _idle_keepalive(server.port, "127.0.0.2", 220)
            assert server.table.count("127.0.0.2") == HttpLimits().max_per_address
            # the same address: over its cap, /health is still answered, anything else is 429
            s = await connect(server.port, "127.0.0.2")
            await s.send_all(_req("GET", "/health"))
            status, headers, _ = await Reader(s).response()
            assert status == 200 and headers["connection"] == "close"
            s = await connect(server.port, "127.0.0.2")
            await s.send_all(_req("GET", "/echo"))
            status, headers, body = await Reader(s).response()
            assert status == 429 and json.loads(body)["error"]["code"] == "too_many_connections"
            assert headers["retry-after"] == "1"
            # another address is not affected at all
            s = await connect(server.port, "127.0.0.1")
            r = Reader(s)
            for _ in range(2):
                await s.send_all(_req("GET", "/echo"))
                assert (await r.response())[0] == 200
        for c in idle:
            await c.aclose()


async def test_health_is_answered_when_the_whole_table_is_full():
    limits = HttpLimits(max_connections=16, max_per_address=16)
    async with serving(limits=limits) as server:
        with trio.fail_after(60):
            await _idle_keepalive(server.port, "127.0.0.2", 16)
            assert server.table.total == 16
            s = await connect(server.port, "127.0.0.3")
            await s.send_all(_req("GET", "/health"))
            assert (await Reader(s).response())[0] == 200


async def test_pipelined_junk_during_a_stream_is_read_only_up_to_a_bound():
    async with serving() as server:
        s = await connect(server.port)
        r = Reader(s)
        await s.send_all(_req("GET", "/stream"))
        await r.until(b"data: 1\n\n")
        junk = b"J" * (1 << 20)
        sent = 0
        with trio.move_on_after(5):  # stop when the server pushes back (nothing is read any more)
            while sent < (128 << 20):
                await s.send_all(junk)
                sent += len(junk)
        # kernel socket buffers on loopback hold some tens of MiB at most; the server stopped reading
        assert sent < (64 << 20), sent
        r.buf = b""
        await r.until(b"data: ")  # and the stream itself goes on
        await s.aclose()


async def test_pipelined_health_never_read_is_buffered_only_up_to_the_bound(monkeypatch):
    # Issue 25 item 1: each answered 40-byte request used to let another 64 KiB in, so a client
    # pipelining GET /health without reading the answers grew the node by ~1.7 GB per 1 GB sent.
    most = 0
    receive_data = h11.Connection.receive_data

    def counting(self, data):
        nonlocal most
        receive_data(self, data)
        most = max(most, len(self._receive_buffer))

    monkeypatch.setattr(h11.Connection, "receive_data", counting)
    limits = HttpLimits()
    async with serving(limits=limits) as server:
        s = await connect(server.port)  # the answers are never read
        one = _req("GET", "/health")
        chunk, sent = one * ((64 << 10) // len(one)), 0
        with trio.move_on_after(20):  # stop at 300 MB, 20 s, or when a send stalls (TCP pushed back)
            while sent < (300 << 20):
                with trio.move_on_after(3) as stalled:
                    sent += await s.socket.send(chunk[sent % len(chunk) :])  # what the kernel took
                if stalled.cancelled_caught:
                    break
        await s.aclose()
    assert most <= limits.max_buffered_bytes, most
    # the kernel's socket buffers (both ways) and the answered requests took what was sent
    assert sent < (64 << 20), sent


async def test_cors_headers_on_streams_errors_and_preflight_before_the_key():
    guard = GuardSettings(check_host=True, cors_origins=("https://app.example",), api_key=KEY)
    async with serving(guard) as server:
        s = await connect(server.port)
        r = Reader(s)
        await s.send_all(
            _req(
                "OPTIONS",
                "/stream",
                origin="https://app.example",
                access_control_request_method="GET",
                access_control_request_headers="authorization",
            )
        )
        status, headers, _ = await r.response()
        assert status == 204 and headers["access-control-allow-origin"] == "https://app.example"
        assert headers["access-control-allow-headers"] == "authorization"
        await s.send_all(_req("GET", "/stream", origin="https://app.example", authorization=f"Bearer {KEY}"))
        status, headers = await r.head()
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
        assert headers["vary"] == "Origin" and headers["content-type"] == "text/event-stream"
        await s.aclose()
        for origin, expect in (("https://app.example", "https://app.example"), ("https://evil.example", None)):
            s = await connect(server.port)
            await s.send_all(_req("GET", "/echo", origin=origin))
            status, headers, body = await Reader(s).response()
            assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
            assert headers.get("access-control-allow-origin") == expect


async def test_non_ascii_authorization_is_401_and_refusals_are_logged_at_a_bounded_rate(caplog):
    counted = []
    async with serving(GuardSettings(check_host=True, api_key=KEY), refused=lambda p, st: counted.append(st)) as server:
        with caplog.at_level(logging.WARNING, logger="hydra.http"):
            for i in range(40):
                s = await connect(server.port)
                auth = "Bearer \u00e9\u00e8\u00ff".encode("latin-1") if i % 2 else "Bearer \u4e2d".encode()
                await s.send_all(b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + auth + b"\r\n\r\n")
                status, _, body = await Reader(s).response()
                assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
                await s.aclose()
    lines = [rec.getMessage() for rec in caplog.records if "event=http_refused" in rec.getMessage()]
    assert counted == [401] * 40 and server.refusals == {401: 40}
    assert 1 <= len(lines) <= 10 and "status=401" in lines[0]  # the default burst, nothing more


async def test_a_text_plain_post_from_a_foreign_origin_never_reaches_the_handler():
    body = b'{"model": "m", "prompt": "hi"}'
    async with serving(GuardSettings(check_host=True, cors_origins=("https://app.example",))) as server:
        for headers, expect in (
            ({"origin": "https://evil.example", "content_type": "text/plain"}, 403),
            ({"origin": "https://evil.example"}, 403),  # no Content-Type at all: also a simple request
            ({"content_type": "text/plain"}, 200),  # no Origin: a client that is not a browser, as before
            ({"origin": "https://app.example", "content_type": "text/plain"}, 200),  # allowed by CORS
            ({"origin": "https://evil.example", "content_type": "application/json"}, 200),  # needs a preflight
        ):
            s = await connect(server.port)
            await s.send_all(_req("POST", "/echo", body, **headers))
            status, _, got = await Reader(s).response()
            assert status == expect, headers
            answer = json.loads(got)
            if expect == 200:
                assert answer == {"bytes": len(body)}
            else:
                assert (
                    answer["error"]["code"] == "cross_origin_request" and "Content-Type" in answer["error"]["message"]
                )
            await s.aclose()


def _has_ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


@needs_ipv6
async def test_a_loopback_server_answers_on_ipv6_loopback_too():
    """docs/security.md lists ``[::1]``: a server bound on 127.0.0.1 is reachable at http://[::1]:PORT."""
    from hydra_node.listen import ListenPurpose

    server = HttpServer(_handler, "127.0.0.1", 0, "test", guard=GuardSettings(check_host=True))
    port = await server.bind(ListenPurpose("the test API", "--port"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        for family, addr, host in (
            (trio.socket.AF_INET6, "::1", f"[::1]:{port}"),
            (trio.socket.AF_INET, "127.0.0.1", f"127.0.0.1:{port}"),
        ):
            sock = trio.socket.socket(family)
            await sock.connect((addr, port))
            stream = trio.SocketStream(sock)
            await stream.send_all(_req("GET", "/health", host=host))
            status, _, body = await Reader(stream).response()
            assert (status, json.loads(body)) == (200, {"status": "ok"}), addr
            await stream.aclose()
        nursery.cancel_scope.cancel()


@needs_ipv6
async def test_ipv6_loopback_port_held_elsewhere_names_the_port_and_the_flag():
    from hydra_node.listen import ListenPurpose, PortInUse

    holder = trio.socket.socket(trio.socket.AF_INET6)
    holder.setsockopt(trio.socket.IPPROTO_IPV6, trio.socket.IPV6_V6ONLY, 1)
    await holder.bind(("::1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        server = HttpServer(_handler, "127.0.0.1", port, "test")
        with pytest.raises(PortInUse) as e:
            await server.bind(ListenPurpose("the OpenAI API", "--port"))
        assert f"port {port} on ::1" in str(e.value) and "--port" in str(e.value) and "in use" in str(e.value)
        # the IPv4 half it had bound is closed again: the port is free on 127.0.0.1
        probe = trio.socket.socket()
        await probe.bind(("127.0.0.1", port))
        probe.close()
    finally:
        holder.close()
