"""Splicing a local TCP connection to a tunnel: a mesh stream or a direct data connection.

Bytes are pumped both ways; backpressure is the link's per-stream credit window
(``STREAM_WINDOW_BYTES``): a pump ``send`` waits until the peer has credit.  The pump
reading llama.cpp's side cuts its bytes into link frames where ggml RPC messages end
(``framing.RpcFramer``): one frame per awaited request or reply instead of one per TCP
read, which is what makes a tunnel nearly as fast as a direct connection.  When either
side of a spliced connection ends or fails, both are closed: llama.cpp then sees its
socket close and aborts its runner, which the node restarts with a new plan.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Awaitable, Callable

import trio

from hydra_node.mesh.wire.constants import DATA_CHUNK_BYTES
from hydra_node.mesh.wire.errors import FrameRejected, LinkClosed, StreamReset

from hydra_node.runtime.rpc import native_pump
from hydra_node.runtime.rpc.dataconn import DataConnection
from hydra_node.runtime.rpc.framing import HOLD_S, PARTIAL_HOLD_S, Direction, RpcFramer

__all__ = ["PUMP_CHUNK_BYTES", "STREAM_ERRORS", "TCP_ERRORS", "splice", "splice_data"]

log = logging.getLogger("hydra.rpc.tunnel")

#: Bytes read from a TCP socket per send on the stream (one DATA frame).
PUMP_CHUNK_BYTES = DATA_CHUNK_BYTES

#: How a tunnel's mesh stream fails (the stream or its link went away).
STREAM_ERRORS = (StreamReset, LinkClosed)
#: How a local TCP connection fails.
TCP_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


async def _pump_framed(tcp: trio.SocketStream, send, framer: RpcFramer) -> None:
    """TCP -> ``send``, cutting where ``framer`` says (held bytes go after a quiet spell).

    The socket's receive low-water mark follows ``framer.wanted``, so epoll reports it
    readable once the part of a message being read is complete (llama.cpp writes a
    request in three ``send()`` calls): one wake-up per part, not per ``send()``.  A
    non-blocking read still returns whatever is there, and end-of-stream always wakes.
    """
    lowat, relaxed = 1, False
    while True:
        want = 1 if relaxed else framer.wanted
        if want != lowat:
            lowat = want
            with contextlib.suppress(OSError):
                tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        if framer.held or lowat > 1:
            data = None
            with trio.move_on_after(HOLD_S if framer.between_messages else PARTIAL_HOLD_S):
                data = await tcp.receive_some(PUMP_CHUNK_BYTES)
            if data is None:  # quiet: send what is held, and take any bytes that come next
                if framer.held:
                    await send(framer.flush())
                relaxed = True
                continue
        else:
            data = await tcp.receive_some(PUMP_CHUNK_BYTES)
        relaxed = False
        if not data:
            if framer.held:
                await send(framer.flush())
            return
        if ready := framer.feed(data):
            await send(ready)


async def _first_to_end(*pumps: Callable[[], Awaitable[str]]) -> str:
    """Run ``pumps`` until the first one returns (how its side ended); cancel the rest.

    ggml RPC is request/response: once one direction ends, the other is of no use.
    """
    ended = "cancelled"
    async with trio.open_nursery() as nursery:

        async def run(pump: Callable[[], Awaitable[str]]) -> None:
            nonlocal ended
            ended = await pump()
            nursery.cancel_scope.cancel()

        for pump in pumps:
            nursery.start_soon(run, pump)
    return ended


def _how(exc: BaseException) -> str:
    if isinstance(exc, FrameRejected):
        log.warning("event=tunnel_data_frame_rejected reason=%s detail=%r", exc.code, str(exc))
        return f"data: {exc.code}"
    if isinstance(exc, STREAM_ERRORS):
        return f"stream: {exc}"
    return f"tcp: {type(exc).__name__}"


async def splice(tcp: trio.SocketStream, stream, direction: Direction | None = None, initial: bytes = b"") -> str:
    """Pump bytes both ways until either side ends or fails; return how it ended.

    ``direction`` names what the TCP side sends (``"request"``: llama.cpp's client,
    ``"response"``: a worker) so that its bytes cross the link in whole ggml RPC messages;
    None pumps every read as it comes.  On a clean end of one direction the other is cut
    too and the stream is reset by the caller's context.  ``initial`` is stream data
    already read (it goes to the TCP side first).
    """

    async def tcp_to_stream() -> str:
        try:
            if direction is None:
                while data := await tcp.receive_some(PUMP_CHUNK_BYTES):
                    await stream.send(data)
            else:
                await _pump_framed(tcp, stream.send, RpcFramer(direction, PUMP_CHUNK_BYTES))
            await stream.send_eof()
            return "eof"
        except TCP_ERRORS + STREAM_ERRORS as exc:
            return _how(exc)

    async def stream_to_tcp() -> str:
        try:
            if initial:
                await tcp.send_all(initial)
            while data := await stream.receive():
                await tcp.send_all(data)
            return "eof"
        except TCP_ERRORS + STREAM_ERRORS as exc:
            return _how(exc)

    try:
        return await _first_to_end(tcp_to_stream, stream_to_tcp)
    finally:
        # Also when cancelled (the tunnel or lease went away): llama.cpp must see its socket
        # close, or it waits for a reply forever.
        with trio.CancelScope(shield=True):
            await tcp.aclose()


async def splice_data(tcp: trio.SocketStream, conn: DataConnection, control, direction: Direction) -> str:
    """Pump between ``tcp`` and a data connection until either ends or fails, or the
    ``control`` stream (the connection's link stream) ends; return how it ended.

    The native pump (``native_pump.py``) does it when built; else this Python one.
    """

    async def tcp_to_data() -> str:
        try:
            await _pump_framed(tcp, conn.send, RpcFramer(direction, PUMP_CHUNK_BYTES))
            return "eof"
        except TCP_ERRORS as exc:
            return _how(exc)

    async def data_to_tcp() -> str:
        try:
            while data := await conn.receive():
                await tcp.send_all(data)
            return "data connection closed"
        except (FrameRejected,) + TCP_ERRORS as exc:
            return _how(exc)

    async def watch_control() -> str:
        try:
            while await control.receive():
                pass  # nothing is expected after the path choice
            return "control stream ended"
        except STREAM_ERRORS as exc:
            return f"control: {exc}"

    try:
        if conn.idle and native_pump.native() is not None:
            return await native_pump.pump(tcp, conn, control)
        return await _first_to_end(tcp_to_data, data_to_tcp, watch_control)
    finally:
        with trio.CancelScope(shield=True):
            await tcp.aclose()
            await conn.aclose()
