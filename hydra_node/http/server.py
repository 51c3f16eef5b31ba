"""A small HTTP/1.1 server on h11 and trio: keep-alive, size limits, streaming bodies.

Routes are plain async functions ``handler(Request) -> Response | StreamResponse``.
The server enforces the limits (:class:`~hydra_node.http.limits.HttpLimits`: headers
64 KiB -> 431, body 8 MiB -> 413, a request head within a few seconds, connections per client
address, pipelined bytes while a response is produced), screens every request head with its
:class:`~hydra_node.http.guard.GuardSettings` (Host, Origin, Content-Type, API key, CORS)
before reading the body, answers ``Expect: 100-continue``, turns a client that goes away into
cancellation of its response (so a streaming generation stops in the runner), and supports a
drain: stop accepting, end idle keep-alive connections, and cancel in-flight streams so they
can write a final error event.  One connection's protocol is ``http/connection.py``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import trio

from hydra_node.http.connection import Connection
from hydra_node.http.guard import GuardSettings
from hydra_node.http.limits import ConnectionTable, HttpLimits, RateLimitedLog
from hydra_node.http.messages import Handler, Request, Response, StreamResponse
from hydra_node.listen import ListenPurpose, bind_tcp, close_listeners

__all__ = [
    "Handler",
    "HttpServer",
    "Request",
    "Response",
    "StreamResponse",
    "serve_http",
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
]

log = logging.getLogger("hydra.http")

_DEFAULTS = HttpLimits()
MAX_HEADER_BYTES = _DEFAULTS.max_header_bytes
MAX_BODY_BYTES = _DEFAULTS.max_body_bytes


class HttpServer:
    """Serves one handler on one address.  Start with ``await nursery.start(server.run)``.

    ``guard``: what the listener enforces on each request head (None: nothing).  ``on_refused``:
    called ``(path, status)`` for each request refused before its handler (for counters)."""

    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int,
        name: str = "http",
        *,
        guard: GuardSettings | None = None,
        limits: HttpLimits = _DEFAULTS,
        on_refused: Callable[[str, int], None] | None = None,
    ):
        self.handler = handler
        self.host = host
        self.port = port
        self.name = name
        self.guard = guard
        self.limits = limits
        self.on_refused = on_refused
        self.draining = False
        self.table = ConnectionTable(limits.max_connections, limits.max_per_address)
        self.overflow = ConnectionTable(limits.max_overflow, limits.max_overflow_per_address)
        self.refusals: dict[int, int] = {}  # status → count of requests refused before their handler
        self._refusal_log = RateLimitedLog()
        self._idle: set[trio.CancelScope] = set()
        self._streams: set[trio.CancelScope] = set()  # response bodies being streamed
        self._no_streams = trio.Event()
        self._no_streams.set()
        self._listener_scope: trio.CancelScope | None = None
        self._bound: list[trio.SocketListener] | None = None  # bind() before run(): served by run()
        self._active = 0
        self._all_done = trio.Event()
        self._all_done.set()

    async def bind(self, purpose: ListenPurpose) -> int:
        """Bind the port now and serve it later (:meth:`run`), so a port in use fails the start before
        anything else happens: :class:`~hydra_node.listen.PortInUse` naming ``purpose``.  Returns the port."""
        self._bound = await bind_tcp(self.host, self.port, purpose, dual_loopback=True)
        self.port = self._bound[0].socket.getsockname()[1]
        return self.port

    def close_unserved(self) -> None:
        """Close what :meth:`bind` bound if :meth:`run` never took it (a start that failed in between)."""
        close_listeners(self._bound)
        self._bound = None

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen (on what :meth:`bind` bound, else bind now), and serve connections in a nursery of
        our own; reports the bound port."""
        async with trio.open_nursery() as conns:
            with trio.CancelScope() as self._listener_scope:
                listeners = self._bound or await trio.open_tcp_listeners(self.port, host=self.host)
                self._bound = None  # serve_listeners owns them now (and closes them)
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

    def refused(self, client: str, head: Request | None, status: int, code: str) -> None:
        """Count a request refused before its handler, and log it at a bounded rate."""
        self.refusals[status] = self.refusals.get(status, 0) + 1
        if head is not None and self.on_refused is not None:
            self.on_refused(head.path, status)
        if self._refusal_log.allow(time.monotonic()):
            suppressed = self._refusal_log.take_suppressed()
            log.warning(
                "event=http_refused server=%s status=%s code=%s client=%s method=%s path=%.200r%s",
                self.name,
                status,
                code,
                client,
                head.method if head else "-",
                head.path if head else "-",
                f" suppressed={suppressed}" if suppressed else "",
            )

    def stream_started(self, scope: trio.CancelScope) -> None:
        """A response body starts streaming under ``scope`` (what :meth:`drain` interrupts)."""
        self._streams.add(scope)
        if len(self._streams) == 1:
            self._no_streams = trio.Event()

    def stream_ended(self, scope: trio.CancelScope) -> None:
        self._streams.discard(scope)
        if not self._streams:
            self._no_streams.set()

    async def wait_streams_done(self) -> None:
        """Until no response body is streaming: a stop lets the streams it handed over to other
        hosts write their last bytes before :meth:`drain` interrupts what is left (bound it)."""
        await self._no_streams.wait()

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
            peer = stream.socket.getpeername()
            address, client = str(peer[0]), f"{peer[0]}:{peer[1]}"
        except OSError:
            address = client = ""
        admitted = self.table.admit(address)
        overflow = not admitted and self.overflow.admit(address)
        try:
            if admitted or overflow:
                # Over the caps: still read one request head, so /health is answered (else 429).
                await Connection(self, stream, client).serve(overflow=overflow)
            else:
                self.refused(client, None, 503, "connection_table_full")
        except Exception:
            log.exception("event=connection_error server=%s", self.name)
        finally:
            if admitted:
                self.table.release(address)
            if overflow:
                self.overflow.release(address)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            self._leave()


def serve_http(handler: Handler, host: str, port: int, name: str = "http") -> HttpServer:
    return HttpServer(handler, host, port, name)
