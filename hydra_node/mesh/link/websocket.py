"""Websocket helpers shared by links and their endpoints: one structured log line, a bounded close."""

from __future__ import annotations

import logging

import trio
from trio_websocket import WebSocketConnection

from hydra_node.mesh.link.settings import CLOSE_TIMEOUT_S
from hydra_node.mesh.link.transport import MessageTransport

__all__ = ["close_websocket", "log_event", "set_message_limit"]

log = logging.getLogger("hydra_node.mesh.link.peer_link")


def log_event(level: int, event: str, **fields: object) -> None:
    """One structured key=value log line."""
    parts = [f"event={event}"]
    for key, value in fields.items():
        text = str(value)
        parts.append(f"{key}={text!r}" if (" " in text or not text) else f"{key}={text}")
    log.log(level, " ".join(parts))


async def close_websocket(ws: WebSocketConnection | MessageTransport) -> None:
    """Close handshake (bounded, shielded), then the TCP stream itself.

    trio-websocket 0.12 leaves the socket open when the peer started the close
    (its aclose() returns early), so the transport is closed here as well.
    """
    with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
        scope.shield = True
        await ws.aclose()
        stream = getattr(ws, "_stream", None)
        if stream is not None:
            try:
                await stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


def set_message_limit(ws: WebSocketConnection | MessageTransport, max_bytes: int) -> None:
    """Largest websocket message ``ws`` assembles from now on (bigger: closed with 1009).

    trio-websocket takes the limit once, at connection set-up; before authentication a link only
    needs handshake-sized messages, so the endpoints lower it for the handshake and raise it to
    the frame bound after. The attribute is trio-websocket 0.12's (pinned in pyproject.toml).
    """
    if not hasattr(ws, "_max_message_size"):
        raise RuntimeError("trio-websocket changed: WebSocketConnection has no _max_message_size")
    ws._max_message_size = max_bytes
