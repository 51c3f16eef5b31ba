"""A small HTTP/1.1 server on h11 and trio: keep-alive, size limits, streaming bodies.

Routes are plain async functions ``handler(Request) -> Response | StreamResponse``.
The server enforces the limits (headers 64 KiB -> 431, body 8 MiB -> 413), turns a
client that goes away into cancellation of its response (so a streaming
generation stops in the runner), and supports a drain: stop accepting, end idle
keep-alive connections, and cancel in-flight streams so they can write a final
error event.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

import h11
import trio

log = logging.getLogger("hydra.http")

#: Largest request head (request line + headers) accepted; more gets 431.
MAX_HEADER_BYTES = 64 * 1024
#: Largest request body accepted; more gets 413.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: How long a keep-alive connection may sit idle between requests.
KEEPALIVE_IDLE_S = 75.0
#: How long a client may take to send a complete request once it started.
REQUEST_READ_TIMEOUT_S = 60.0
#: Most connections served at once per listener; more wait in the accept backlog.
MAX_CONNECTIONS = 512
_READ_CHUNK = 65536
#: After a 413, how much of the rejected body we read and drop before closing, and for how long.
DISCARD_MAX_BYTES = 64 * 1024 * 1024
DISCARD_TIMEOUT_S = 10.0


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case name -> value (last wins)
    body: bytes
    client: str = ""

    def json(self):
        return json.loads(self.body)

    def bearer_matches(self, key: str | None) -> bool:
        """True when no key is required, or ``Authorization: Bearer KEY`` carries it."""
        if key is None:
            return True
        auth = self.headers.get("authorization", "")
        return auth.startswith("Bearer ") and secrets.compare_digest(auth[7:].strip(), key)


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list = field(default_factory=list)

    @classmethod
    def json(cls, status: int, obj, headers: list | None = None) -> "Response":
        return cls(status, json.dumps(obj, separators=(",", ":")).encode(), "application/json", headers or [])


@dataclass
class StreamResponse:
    """A streamed body.  ``body`` is an async generator of byte chunks.

    If the client disconnects or the server drains, the generator is closed
    (``GeneratorExit``/``Cancelled`` inside it).  ``on_drain`` bytes, if given,
    are written as the last chunk when a drain interrupts the stream.
    """

    status: int
    body: AsyncIterator[bytes]
    content_type: str = "text/event-stream"
    headers: list = field(default_factory=list)
    on_interrupt: Callable[[str], bytes] | None = None
    #: Always awaited once the response is over, however it ended (even if never started).
    finalizer: Callable[[], Awaitable[None]] | None = None

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            await self.body.aclose()
            if self.finalizer is not None:
                fin, self.finalizer = self.finalizer, None
                await fin()


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


class HttpServer:
    """Serves one handler on one address.  Start with ``await nursery.start(server.run)``."""

    def __init__(self, handler: Handler, host: str, port: int, name: str = "http"):
        self.handler = handler
        self.host = host
        self.port = port
        self.name = name
        self.draining = False
        self._conn_limit = trio.Semaphore(MAX_CONNECTIONS)
        self._idle: set[trio.CancelScope] = set()
        self._streams: set[trio.CancelScope] = set()
        self._listener_scope: trio.CancelScope | None = None
        self._active = 0
        self._all_done = trio.Event()
        self._all_done.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen, and serve connections in a nursery of our own; reports the bound port."""
        async with trio.open_nursery() as conns:
            with trio.CancelScope() as self._listener_scope:
                listeners = await trio.open_tcp_listeners(self.port, host=self.host)
                self.port = listeners[0].socket.getsockname()[1]
                task_status.started(self.port)
                await trio.serve_listeners(self._connection, listeners, handler_nursery=conns)
            # listeners closed: let connections finish (drain() bounds this)
            await self._all_done.wait()
            conns.cancel_scope.cancel()

    async def drain(self, grace_s: float = 5.0) -> None:
        """Stop accepting; end idle connections; interrupt streams; wait (bounded)."""
        self.draining = True
        if self._listener_scope is not None:
            self._listener_scope.cancel()
        for scope in list(self._idle):
            scope.cancel()
        for scope in list(self._streams):
            scope.cancel()
        with trio.move_on_after(grace_s):
            await self._all_done.wait()

    def _enter(self) -> None:
        self._active += 1
        if self._active == 1:
            self._all_done = trio.Event()

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._all_done.set()

    async def _connection(self, stream: trio.SocketStream) -> None:
        self._enter()
        try:
            async with self._conn_limit:
                await _Connection(self, stream).serve()
        except Exception:
            log.exception("event=connection_error server=%s", self.name)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            self._leave()


class _ClientGone(Exception):
    pass


class _Connection:
    def __init__(self, server: HttpServer, stream: trio.SocketStream):
        self.server = server
        self.stream = stream
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        try:
            peer = stream.socket.getpeername()
            self.client = f"{peer[0]}:{peer[1]}"
        except OSError:
            self.client = ""

    async def _send(self, event) -> None:
        data = self.conn.send(event)
        if data:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise _ClientGone() from exc

    async def _next_event(self):
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive_some(_READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            self.conn.receive_data(data)

    async def serve(self) -> None:
        while not self.server.draining:
            # Wait for the next request head; idle connections can be ended by a drain.
            with trio.CancelScope() as idle:
                idle.deadline = trio.current_time() + KEEPALIVE_IDLE_S
                self.server._idle.add(idle)
                try:
                    try:
                        event = await self._next_event()
                    except h11.RemoteProtocolError as exc:
                        await self._protocol_error(exc)
                        return
                finally:
                    self.server._idle.discard(idle)
            if idle.cancelled_caught or isinstance(event, h11.ConnectionClosed):
                return
            if not isinstance(event, h11.Request):
                return
            head_size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
            if head_size > MAX_HEADER_BYTES:
                # h11 only bounds an *incomplete* head; a complete one can still be too big.
                await self._simple(431, "request_header_fields_too_large",
                                   f"request headers exceed {MAX_HEADER_BYTES} bytes")
                return
            try:
                with trio.fail_after(REQUEST_READ_TIMEOUT_S):
                    request = await self._read_request(event)
            except trio.TooSlowError:
                await self._simple(408, "request_timeout", "the request body did not arrive in time")
                return
            except h11.RemoteProtocolError as exc:
                await self._protocol_error(exc)
                return
            if request is None:
                return  # already answered (413)
            try:
                await self._respond(request)
            except _ClientGone:
                return
            if self.conn.our_state is h11.MUST_CLOSE or self.conn.their_state is h11.MUST_CLOSE:
                return
            if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                return
            try:
                self.conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint or 400
        if status == 431:
            await self._simple(431, "request_header_fields_too_large",
                               f"request headers exceed {MAX_HEADER_BYTES} bytes")
        else:
            await self._simple(status, "bad_request", f"malformed HTTP request: {exc}")

    async def _simple(self, status: int, code: str, message: str) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": code}}).encode()
        try:
            await self._send(h11.Response(status_code=status, headers=[
                ("content-type", "application/json"), ("content-length", str(len(body))),
                ("connection", "close")]))
            await self._send(h11.Data(data=body))
            await self._send(h11.EndOfMessage())
        except (_ClientGone, h11.LocalProtocolError):
            pass

    async def _reject_body(self) -> None:
        """Answer 413, then read and discard (bounded) what the client is still sending,
        so it sees the answer instead of a connection reset."""
        await self._simple(413, "request_too_large", f"request body exceeds {MAX_BODY_BYTES} bytes")
        discarded = 0
        with trio.move_on_after(DISCARD_TIMEOUT_S):
            while discarded < DISCARD_MAX_BYTES:
                try:
                    data = await self.stream.receive_some(_READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                discarded += len(data)

    async def _read_request(self, head: h11.Request) -> Request | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await self._reject_body()
            return None
        chunks, size = [], 0
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_BODY_BYTES:
                    await self._reject_body()
                    return None
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return None
        target = head.target.decode("latin-1")
        parts = urlsplit(target)
        return Request(head.method.decode("ascii", "replace").upper(), parts.path,
                       {k: v[-1] for k, v in parse_qs(parts.query).items()}, headers, b"".join(chunks), self.client)

    async def _respond(self, request: Request) -> None:
        # Watch the socket while we work: EOF means the client is gone -> cancel the work.
        gone = trio.Event()
        client_gone = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect, gone, nursery.cancel_scope)
            try:
                resp = await self._call_handler(request)
                if isinstance(resp, StreamResponse):
                    try:
                        await self._write_stream(resp)
                    finally:
                        await resp.close()
                else:
                    await self._write_response(resp)
            except _ClientGone:
                client_gone = True
            finally:
                nursery.cancel_scope.cancel()
        if client_gone or gone.is_set():
            raise _ClientGone()

    async def _call_handler(self, request: Request) -> Response | StreamResponse:
        try:
            return await self.server.handler(request)
        except Exception:
            log.exception("event=handler_error server=%s path=%s", self.server.name, request.path)
            return Response.json(500, {"error": {"message": "internal server error", "type": "server_error",
                                                 "param": None, "code": "internal_error"}})

    async def _watch_disconnect(self, gone: trio.Event, scope: trio.CancelScope) -> None:
        try:
            while True:
                data = await self.stream.receive_some(_READ_CHUNK)
                if not data:
                    break
                self.conn.receive_data(data)  # pipelined bytes: h11 keeps them for the next cycle
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except h11.RemoteProtocolError:
            return
        gone.set()
        scope.cancel()

    async def _write_response(self, resp: Response) -> None:
        headers = [("content-type", resp.content_type), ("content-length", str(len(resp.body)))] + resp.headers
        if self.server.draining:
            headers.append(("connection", "close"))
        await self._send(h11.Response(status_code=resp.status, headers=headers))
        if resp.body:
            await self._send(h11.Data(data=resp.body))
        await self._send(h11.EndOfMessage())

    async def _write_stream(self, resp: StreamResponse) -> None:
        await self._send(h11.Response(status_code=resp.status, headers=[
            ("content-type", resp.content_type), ("cache-control", "no-cache")] + resp.headers))
        interrupted = None
        with trio.CancelScope() as scope:
            self.server._streams.add(scope)
            try:
                if self.server.draining:
                    scope.cancel()
                async for chunk in resp.body:
                    await self._send(h11.Data(data=chunk))
            finally:
                self.server._streams.discard(scope)
                await resp.close()
        if scope.cancelled_caught:
            interrupted = "the node is shutting down"
        if interrupted and resp.on_interrupt is not None:
            await self._send(h11.Data(data=resp.on_interrupt(interrupted)))
        await self._send(h11.EndOfMessage())


def serve_http(handler: Handler, host: str, port: int, name: str = "http") -> HttpServer:
    return HttpServer(handler, host, port, name)
