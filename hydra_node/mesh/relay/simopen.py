"""TCP simultaneous open and the link run on it (trio): the socket side of hole punching (``punch.py``).

Each end binds a fresh TCP socket (:func:`bind_punch_socket`), tells the other its public IP and that
socket's port, and, at the agreed moment, connects it to the other's public address
(:func:`simultaneous_open`). Each end's outgoing SYN opens its own NAT for the other's SYN; when both
cross, TCP's simultaneous open yields ONE connection that both ends dialled. On it, the smaller node id
is the websocket client and handshake initiator (``punch.websocket_client``), and the link is the
ordinary authenticated, encrypted `PeerLink` (:func:`run_punched_link`), marked ``punched``.
"""

from __future__ import annotations

import errno
import socket

import trio
import trio_websocket
from trio_websocket import ConnectionClosed, wrap_client_stream, wrap_server_stream

from hydra_node.mesh.link.endpoints import WS_MESSAGE_QUEUE, WS_RECEIVE_BUFFER, run_handshake
from hydra_node.mesh.link.peer_link import CLOSE_TIMEOUT_S, LinkSettings, PeerLink, close_websocket
from hydra_node.mesh.relay.punch import PunchAddress, websocket_client
from hydra_node.mesh.wire.constants import MAX_LINK_FRAME_BYTES
from hydra_node.mesh.wire.errors import HandshakeError, LinkClosed
from hydra_node.mesh.wire.handshake import Handshake
from hydra_node.mesh.wire.ids import node_id_from_public_key

__all__ = [
    "CONNECT_TIMEOUT_S",
    "PUNCH_RESOURCE",
    "PunchFailed",
    "bind_punch_socket",
    "run_punched_link",
    "simultaneous_open",
]

CONNECT_TIMEOUT_S = 3.5
"""Bound on one simultaneous open: the first SYN and Linux's retransmissions at 1 s and 3 s."""
REFUSED_RETRY_S = 0.2
"""Pause before connecting again after a reset (see :func:`simultaneous_open`)."""
PUNCH_RESOURCE = "/hydra/punch"
"""The websocket path on a punched connection (the server end accepts only this one connection)."""


class PunchFailed(LinkClosed):
    """A hole-punch attempt that did not give a link; ``reason`` is a short word for logs and counters
    (timeout, refused, unreachable, websocket, handshake, wrong_peer)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, code="punch_failed")
        self.reason = reason


async def bind_punch_socket(v6: bool = False) -> tuple[trio.socket.SocketType, int]:
    """A fresh TCP socket bound to an ephemeral port (on every address), and that port."""
    sock = await _bind(v6, 0)
    return sock, sock.getsockname()[1]


async def _bind(v6: bool, port: int) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(("::" if v6 else "0.0.0.0", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def simultaneous_open(
    sock: trio.socket.SocketType, addr: PunchAddress, timeout_s: float = CONNECT_TIMEOUT_S
) -> trio.SocketStream:
    """Connect ``sock`` to ``addr`` within ``timeout_s``; PunchFailed otherwise (the socket is closed).

    A SYN that reaches the other NAT before the other end's own SYN has left may be answered with a
    reset (a router with nothing on that port) instead of being dropped: then we connect again from
    the same port (a fresh socket bound to it) every ``REFUSED_RETRY_S`` until the other end's SYN
    has opened its NAT, or the time is up."""
    port, v6 = sock.getsockname()[1], sock.family == socket.AF_INET6
    refusals = 0
    try:
        with trio.fail_after(timeout_s):
            while True:
                try:
                    await sock.connect((addr.host, addr.port))
                    return trio.SocketStream(sock)
                except OSError as exc:
                    if exc.errno != errno.ECONNREFUSED:
                        raise
                    refusals += 1
                    sock.close()
                    await trio.sleep(REFUSED_RETRY_S)
                    sock = await _bind(v6, port)
    except trio.TooSlowError:
        sock.close()
        reason = "refused" if refusals else "timeout"
        raise PunchFailed(
            reason, f"no connection with {addr.host}:{addr.port} within {timeout_s} s ({refusals} resets)"
        ) from None
    except OSError as exc:
        sock.close()
        raise PunchFailed("unreachable", f"connect to {addr.host}:{addr.port}: {exc}") from None
    except BaseException:
        sock.close()
        raise


async def run_punched_link(
    stream: trio.SocketStream,
    peer_id: str,
    settings: LinkSettings,
    *,
    task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Authenticate ``peer_id`` on the punched connection and run the link until it closes;
    ``started(link)``. Before that: PunchFailed (the connection is closed)."""
    failure: PunchFailed | None = None
    try:
        async with trio.open_nursery() as nursery:  # the websocket's reader task
            try:
                ws, result = await _authenticate(nursery, stream, peer_id, settings)
            except PunchFailed as exc:
                failure = exc
            else:
                await PeerLink(ws, result, settings, punched=True).run(task_status=task_status)
            nursery.cancel_scope.cancel()
    except Exception as exc:  # trio-websocket's reader fails on a peer that breaks HTTP (both ends clients)
        await stream.aclose()
        failure = failure or PunchFailed("websocket", f"the punched connection failed: {exc!r}")
    if failure is not None:
        raise failure


async def _authenticate(nursery: trio.Nursery, stream: trio.SocketStream, peer_id: str, settings: LinkSettings):
    """The websocket (client or server end by node id) and the link handshake on it; PunchFailed otherwise."""
    if settings.mesh is None:
        await stream.aclose()
        raise PunchFailed("handshake", "a punched link needs the mesh key")
    client = websocket_client(node_id_from_public_key(bytes(settings.identity.verify_key)), peer_id)
    try:
        with trio.fail_after(settings.handshake_timeout_s):
            if client:
                ws = await wrap_client_stream(
                    nursery,
                    stream,
                    "hydra-punch",
                    PUNCH_RESOURCE,
                    message_queue_size=WS_MESSAGE_QUEUE,
                    max_message_size=MAX_LINK_FRAME_BYTES,
                    receive_buffer_size=WS_RECEIVE_BUFFER,
                )
            else:
                request = await wrap_server_stream(
                    nursery,
                    stream,
                    message_queue_size=WS_MESSAGE_QUEUE,
                    max_message_size=MAX_LINK_FRAME_BYTES,
                    receive_buffer_size=WS_RECEIVE_BUFFER,
                )
                if request.path != PUNCH_RESOURCE:
                    await request.reject(404)
                    raise PunchFailed("websocket", f"unexpected websocket path {request.path!r}")
                ws = await request.accept()
    except (
        trio.TooSlowError,
        trio_websocket.HandshakeError,
        ConnectionClosed,
        trio.BrokenResourceError,
        trio.ClosedResourceError,
        PunchFailed,
    ) as exc:
        with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
            scope.shield = True
            await stream.aclose()
        if isinstance(exc, PunchFailed):
            raise
        raise PunchFailed("websocket", f"no websocket on the punched connection: {exc!r}") from None
    if client:
        handshake = Handshake(
            "initiator", settings.identity, settings.mesh, now=settings.wall_clock(), expected_peer_id=peer_id
        )
    else:
        handshake = Handshake(
            "responder",
            settings.identity,
            settings.mesh,
            now=settings.wall_clock(),
            trusted_issuer=settings.trusted_issuer,
            check_invite=settings.check_invite,
        )
    try:
        result = await run_handshake(ws, handshake, settings.handshake_timeout_s)
    except HandshakeError as exc:
        await close_websocket(ws)
        raise PunchFailed("handshake", f"handshake on the punched connection: {exc}") from None
    except BaseException:
        await close_websocket(ws)
        raise
    if result.peer_id != peer_id:
        await close_websocket(ws)
        raise PunchFailed("wrong_peer", f"the punched connection reached {result.peer_id[:12]}, not {peer_id[:12]}")
    return ws, result
