"""Open a websocket to a relay, owning the TCP/TLS stream so that it is always closed.

trio-websocket 0.12's ``open_websocket_url`` leaks the socket when its connect timeout
fires during the opening handshake (a relay that accepts TCP and then says nothing);
here we open the stream ourselves, hand it to ``wrap_client_stream`` and close it on
every exit path: gracefully (bounded) when we can, forcefully when cancelled.
"""

from __future__ import annotations

import ssl
from contextlib import asynccontextmanager
from typing import AsyncIterator
from urllib.parse import urlsplit

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from hydra_node.discovery.nostr.wire import MAX_RELAY_MESSAGE

WS_MESSAGE_QUEUE = 16  # trio-websocket's per-connection receive queue


@asynccontextmanager
async def open_relay_websocket(
    url: str, *, connect_timeout_s: float, disconnect_timeout_s: float
) -> AsyncIterator[WebSocketConnection]:
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"relay URL must be ws:// or wss:// with a host, not {url!r}")
    secure = parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    host_header = parts.hostname if port in (80, 443) else f"{parts.hostname}:{port}"
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    stream: trio.abc.Stream | None = None
    ws: WebSocketConnection | None = None
    async with trio.open_nursery() as nursery:
        try:
            with trio.fail_after(connect_timeout_s):
                if secure:
                    stream = await trio.open_ssl_over_tcp_stream(
                        parts.hostname, port, ssl_context=ssl.create_default_context(), https_compatible=True
                    )
                else:
                    stream = await trio.open_tcp_stream(parts.hostname, port)
                ws = await wrap_client_stream(
                    nursery,
                    stream,
                    host_header,
                    resource,
                    message_queue_size=WS_MESSAGE_QUEUE,
                    max_message_size=MAX_RELAY_MESSAGE,
                )
            yield ws
        finally:
            try:
                if ws is not None:  # a graceful close, unless we are being cancelled
                    with trio.move_on_after(disconnect_timeout_s):
                        await ws.aclose()
            finally:
                if stream is not None:
                    await trio.aclose_forcefully(stream)
                nursery.cancel_scope.cancel()
