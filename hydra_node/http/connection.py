"""One HTTP/1.1 connection of :class:`hydra_node.http.server.HttpServer` (h11 over a trio stream).

Per request: read the head within a deadline; screen it (``guard.screen``: Host, Origin,
Content-Type, API key, CORS preflight) before any body is read, so ``Expect: 100-continue``
gets ``100 Continue`` only when the request will be served and its final refusal at once
otherwise; read the bounded body; call the handler while watching the socket for EOF. What is
read but not yet processed (h11's buffer: pipelined requests) never exceeds
``HttpLimits.max_buffered_bytes``: at the bound the socket is not read (no ``recv``), so the
kernel's TCP window pushes back on the client.
The handler and the response run in a nursery of the request's own (``Request.nursery``), so
every task of a request is cancelled with it: client gone, response over, server stopped.
"""

from __future__ import annotations

import logging
from typing import Protocol
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from hydra_node.http.guard import OPEN_PATHS, GuardSettings, Verdict, response_headers, screen
from hydra_node.http.limits import HttpLimits
from hydra_node.http.messages import Handler, Request, Response, StreamResponse, error_body

log = logging.getLogger("hydra.http")

_READ_CHUNK = 65536


class ClientGone(Exception):
    pass


class Server(Protocol):
    """What a connection needs of its server (``HttpServer``)."""

    handler: Handler
    name: str
    guard: GuardSettings | None
    limits: HttpLimits
    draining: bool
    _idle: set[trio.CancelScope]

    def refused(self, client: str, head: Request | None, status: int, code: str) -> None: ...

    def stream_started(self, scope: trio.CancelScope) -> None: ...

    def stream_ended(self, scope: trio.CancelScope) -> None: ...


class Connection:
    def __init__(self, server: Server, stream: trio.SocketStream, client: str):
        self.server = server
        self.limits = server.limits
        self.stream = stream
        self.client = client
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        self._extra: list[tuple[str, str]] = []  # CORS headers for the current request's responses
        self._last = False
        # A head up to max_header_bytes must fit (an unfinished one at the bound gets 431).
        self._bound = max(self.limits.max_buffered_bytes, self.limits.max_header_bytes)

    async def _send(self, event) -> None:
        data = self.conn.send(event)
        if data:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ClientGone() from exc

    def _room(self) -> int:
        """How many more bytes may be read now: the bound less what h11 holds unprocessed."""
        return self._bound - len(self.conn.trailing_data[0])

    async def _next_event(self, head_scope: trio.CancelScope | None = None):
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            buffered = len(self.conn.trailing_data[0])
            if head_scope is not None and buffered:
                self._tighten(head_scope)  # a head has begun: it gets head_timeout_s, not the idle time
            if buffered >= self._bound:
                # h11 wants more, yet holds the bound of an unfinished event (a head or a chunk
                # line, as h11 emits body bytes as they come): too big, whatever follows (h11
                # itself answers 431 one byte later, past max_header_bytes).
                raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
            try:
                data = await self.stream.receive_some(min(_READ_CHUNK, self._bound - buffered))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if head_scope is not None and data:
                self._tighten(head_scope)
            self.conn.receive_data(data)

    def _tighten(self, scope: trio.CancelScope) -> None:
        scope.deadline = min(scope.deadline, trio.current_time() + self.limits.head_timeout_s)

    async def serve(self, overflow: bool = False) -> None:
        """Serve requests until the connection ends.  ``overflow``: the connection is over the
        caps: one request, answered only if it is ``/health``, else 429."""
        lim = self.limits
        self._last = overflow  # an over-cap connection serves one request, then closes
        timeout = lim.overflow_head_timeout_s if overflow else lim.head_timeout_s
        while not self.server.draining:
            self._extra = []
            event = await self._read_head(timeout)
            if event is None:
                return
            timeout = lim.keepalive_idle_s
            head_size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
            if head_size > lim.max_header_bytes:
                # h11 only bounds an *incomplete* head; a complete one can still be too big.
                await self._refuse(
                    None, 431, "request_header_fields_too_large", f"request headers exceed {lim.max_header_bytes} bytes"
                )
                return
            head = self._head(event)
            self._extra = response_headers(head.headers, self.server.guard) if self.server.guard else []
            if overflow and (head.path.rstrip("/") or "/") not in OPEN_PATHS:
                await self._refuse(
                    head,
                    429,
                    "too_many_connections",
                    "too many connections from this address; retry later",
                    retry_after=1,
                )
                return
            verdict = screen(head.method, head.path, head.headers, self.server.guard) if self.server.guard else None
            if verdict is not None and verdict.refusal:
                await self._refuse(head, verdict.status, verdict.code, verdict.message)
                return
            declared = head.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > lim.max_body_bytes:
                await self._refuse(head, 413, "request_too_large", f"request body exceeds {lim.max_body_bytes} bytes")
                return
            try:
                if self.conn.they_are_waiting_for_100_continue:  # the head passed every check
                    await self._send(h11.InformationalResponse(status_code=100, headers=[]))
                with trio.fail_after(lim.body_timeout_s):
                    request = await self._read_body(head)
            except ClientGone:
                return
            except trio.TooSlowError:
                self.server.refused(self.client, head, 408, "request_timeout")
                await self._simple(408, "request_timeout", "the request body did not arrive in time")
                return
            except h11.RemoteProtocolError as exc:
                await self._protocol_error(exc)
                return
            if request is None:
                return  # already answered (413)
            try:
                await self._respond(request, verdict)
            except ClientGone:
                return
            if overflow or not self._next_cycle():
                return

    def _next_cycle(self) -> bool:
        if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
            return False
        try:
            self.conn.start_next_cycle()
        except h11.LocalProtocolError:
            return False
        return True

    async def _read_head(self, timeout: float) -> h11.Request | None:
        """The next request head, or None when the connection is over (closed, idle, too slow)."""
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + timeout
            self.server._idle.add(scope)
            try:
                event = await self._next_event(head_scope=scope)
            except h11.RemoteProtocolError as exc:
                await self._protocol_error(exc)
                return None
            finally:
                self.server._idle.discard(scope)
        if scope.cancelled_caught:
            if self.conn.trailing_data[0] and not self.server.draining:
                await self._refuse(None, 408, "request_timeout", "the request head did not arrive in time")
            return None
        return event if isinstance(event, h11.Request) else None

    def _head(self, event: h11.Request) -> Request:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        parts = urlsplit(event.target.decode("latin-1"))
        return Request(
            event.method.decode("ascii", "replace").upper(),
            parts.path,
            {k: v[-1] for k, v in parse_qs(parts.query).items()},
            headers,
            b"",
            self.client,
        )

    async def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint or 400
        if status == 431:
            await self._refuse(
                None,
                431,
                "request_header_fields_too_large",
                f"request headers exceed {self.limits.max_header_bytes} bytes",
            )
        else:
            await self._refuse(None, status, "bad_request", f"malformed HTTP request: {exc}")

    async def _refuse(
        self, head: Request | None, status: int, code: str, message: str, retry_after: int | None = None
    ) -> None:
        """Answer a refusal and close; the unread body is drained (bounded) so the client sees it."""
        self.server.refused(self.client, head, status, code)
        body_pending = self._body_pending()
        extra = [("retry-after", str(retry_after))] if retry_after else []
        await self._simple(status, code, message, extra)
        if body_pending:
            await self._discard()

    def _body_pending(self) -> bool:
        """Whether the client is still sending a body we have not read (to drain after a refusal).

        A client waiting for 100 Continue sends no body after a final answer.  A request without a
        body ends in h11 without another read: waiting for its "body" would hold a client that
        sent ``Connection: close`` for the whole discard timeout (10 s per refused request)."""
        if self.conn.their_state is not h11.SEND_BODY or self.conn.they_are_waiting_for_100_continue:
            return False
        while True:  # only what h11 already holds: next_event() never reads the socket
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                return False
            if event is h11.NEED_DATA:
                return True
            if not isinstance(event, h11.Data):  # EndOfMessage (or PAUSED): the request is whole
                return False

    async def _simple(self, status: int, code: str, message: str, extra: list | None = None) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        kind = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
            status, "invalid_request_error"
        )
        body = error_body(message, code, kind)
        try:
            await self._send(
                h11.Response(
                    status_code=status,
                    headers=[
                        ("content-type", "application/json"),
                        ("content-length", str(len(body))),
                        ("connection", "close"),
                    ]
                    + (extra or [])
                    + self._extra,
                )
            )
            await self._send(h11.Data(data=body))
            await self._send(h11.EndOfMessage())
        except (ClientGone, h11.LocalProtocolError):
            pass

    async def _discard(self) -> None:
        discarded = 0
        with trio.move_on_after(self.limits.discard_timeout_s):
            while discarded < self.limits.discard_max_bytes:
                try:
                    data = await self.stream.receive_some(_READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                discarded += len(data)

    async def _read_body(self, head: Request) -> Request | None:
        chunks, size = [], 0
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limits.max_body_bytes:
                    await self._refuse(
                        head, 413, "request_too_large", f"request body exceeds {self.limits.max_body_bytes} bytes"
                    )
                    return None
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return None
        head.body = b"".join(chunks)
        return head

    async def _respond(self, request: Request, verdict: Verdict | None) -> None:
        # The request's nursery: the handler, the response's body and every task either starts in
        # ``request.nursery`` live in it. Watch the socket while we work: EOF means the client is
        # gone -> cancel the whole request. Once the response is over (body closed, finalizer
        # run) what is left is cancelled, and the next request waits until it has ended.
        gone = trio.Event()
        client_gone = False
        async with trio.open_nursery() as nursery:
            request.nursery = nursery
            nursery.start_soon(self._watch_disconnect, gone, nursery.cancel_scope)
            try:
                resp: Response | StreamResponse
                if verdict is not None:  # a CORS preflight, answered before the API key is looked at
                    resp = Response(verdict.status, headers=list(verdict.headers))
                    self._extra = []
                else:
                    resp = await self._call_handler(request)
                if isinstance(resp, StreamResponse):
                    try:
                        await self._write_stream(resp)
                    finally:
                        await resp.close()
                else:
                    await self._write_response(resp)
            except ClientGone:
                client_gone = True
            finally:
                nursery.cancel_scope.cancel()
        if client_gone or gone.is_set():
            raise ClientGone()

    async def _call_handler(self, request: Request) -> Response | StreamResponse:
        try:
            return await self.server.handler(request)
        except Exception:
            log.exception("event=handler_error server=%s path=%s", self.server.name, request.path)
            return Response.json(
                500,
                {
                    "error": {
                        "message": "internal server error",
                        "type": "server_error",
                        "param": None,
                        "code": "internal_error",
                    }
                },
            )

    async def _watch_disconnect(self, gone: trio.Event, scope: trio.CancelScope) -> None:
        # Bytes pipelined behind the request go to h11 (kept for the next cycle), but only while
        # what it holds is under the bound: the budget is the connection's, not the response's,
        # so answered requests (a few dozen bytes each) do not let in another chunk each.
        try:
            while True:
                room = self._room()
                if room <= 0:
                    # At the bound: stop reading; TCP pushes back on the client. (A client that
                    # leaves now is noticed when a write to it fails.)
                    await trio.sleep_forever()
                data = await self.stream.receive_some(min(_READ_CHUNK, room))
                if not data:
                    break
                self.conn.receive_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        gone.set()
        scope.cancel()

    async def _write_response(self, resp: Response) -> None:
        if resp.status in (204, 304):
            headers = list(resp.headers)
        else:
            headers = [("content-type", resp.content_type), ("content-length", str(len(resp.body)))] + resp.headers
        headers += self._extra
        if self.server.draining or self._last:
            headers.append(("connection", "close"))
        await self._send(h11.Response(status_code=resp.status, headers=headers))
        if resp.body and resp.status not in (204, 304):
            await self._send(h11.Data(data=resp.body))
        await self._send(h11.EndOfMessage())

    async def _write_stream(self, resp: StreamResponse) -> None:
        await self._send(
            h11.Response(
                status_code=resp.status,
                headers=[("content-type", resp.content_type), ("cache-control", "no-cache")]
                + resp.headers
                + self._extra,
            )
        )
        with trio.CancelScope() as scope:
            self.server.stream_started(scope)
            try:
                if self.server.draining:
                    scope.cancel()
                async for chunk in resp.body:
                    await self._send(h11.Data(data=chunk))
            finally:
                self.server.stream_ended(scope)
                await resp.close()
        if scope.cancelled_caught and resp.on_interrupt is not None:
            await self._send(h11.Data(data=resp.on_interrupt("the node is shutting down")))
        await self._send(h11.EndOfMessage())
