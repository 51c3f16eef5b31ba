"""Dialling and accepting links: the handshake over trio-websocket, then a running PeerLink."""

from __future__ import annotations

import collections
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import trio
import trio_websocket
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, WebSocketServer, open_websocket_url

from hydra_node.mesh.link.dialback import answer_dialback, nonce_from_path
from hydra_node.mesh.link.transport import MessageTransport
from hydra_node.mesh.link.websocket import set_message_limit
from hydra_node.mesh.wire.constants import MAX_HANDSHAKE_MESSAGE_BYTES, MAX_LINK_FRAME_BYTES
from hydra_node.mesh.wire.errors import HandshakeError, LinkClosed, LocalProtocolError
from hydra_node.mesh.wire.handshake import Handshake, HandshakeResult, Reject
from hydra_node.mesh.link.peer_link import CLOSE_TIMEOUT_S, LinkSettings, PeerLink, close_websocket, log_event
from hydra_node.mesh.wire.token import InviteToken

WS_MESSAGE_QUEUE = 4
"""Whole websocket messages trio-websocket buffers per connection before it stops reading."""
WS_RECEIVE_BUFFER = 64 * 1024
MAX_CONCURRENT_HANDSHAKES = 64
"""Handshakes a listener runs at once; further connections are closed at once (counted as busy)."""
MAX_HANDSHAKES_PER_ADDRESS = 8
"""Handshakes one remote address may hold at once, so stalled hellos from one host cannot take
every slot (further ones from it are refused as busy)."""
ACCEPT_HANDSHAKE_TIMEOUT_S = 5.0
"""Bound on a handshake a listener answers (at most the link setting): a stalled hello frees its
slot quickly."""
HANDSHAKE_WS_MESSAGE_BYTES = MAX_HANDSHAKE_MESSAGE_BYTES + 1024
"""Largest websocket message before authentication: a handshake message and some slack."""

LinkHandler = Callable[[PeerLink], Awaitable[None]]


async def _run_handshake(
    ws: WebSocketConnection | MessageTransport, handshake: Handshake, timeout_s: float
) -> HandshakeResult:
    """Run ``handshake`` over ``ws``: messages are limited to handshake size until it completes."""
    set_message_limit(ws, HANDSHAKE_WS_MESSAGE_BYTES)
    result = await _exchange(ws, handshake, timeout_s)
    set_message_limit(ws, MAX_LINK_FRAME_BYTES)
    return result


#: The same handshake over any message transport (a relayed stream: mesh/relay/transport.py).
run_handshake = _run_handshake


async def _exchange(
    ws: WebSocketConnection | MessageTransport, handshake: Handshake, timeout_s: float
) -> HandshakeResult:
    try:
        with trio.fail_after(timeout_s):
            if handshake.role == "initiator":
                await ws.send_message(handshake.initiate())
            while not handshake.complete:
                data = await ws.get_message()
                if isinstance(data, str):
                    raise HandshakeError("text websocket message during the handshake", code="bad_handshake")
                reply = handshake.receive(data)
                if reply is not None:
                    await ws.send_message(reply)
            return handshake.result
    except HandshakeError as exc:
        if exc.reply is not None:
            with trio.move_on_after(CLOSE_TIMEOUT_S) as scope:
                scope.shield = True
                try:
                    await ws.send_message(exc.reply)
                except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        raise
    except trio.TooSlowError:
        raise HandshakeError(f"handshake not finished within {timeout_s} s", code="handshake_timeout") from None
    except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise HandshakeError(f"connection lost during the handshake: {exc}", code="peer_closed") from None


async def connect_link(
    url: str,
    settings: LinkSettings,
    *,
    invite: InviteToken | None = None,
    expected_peer_id: str | None = None,
    task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Dial `url`, authenticate, then run the link until it closes.

    Use as ``link = await nursery.start(connect_link, url, settings)``. A member
    proves the mesh key from `settings.mesh`; a joiner passes `invite` instead and
    finds the mesh key in ``link.mesh`` afterwards. Raises LinkClosed (code
    connect_failed) or a HandshakeError subclass before `started`.
    """
    credential = invite if invite is not None else settings.mesh
    if credential is None:
        raise LocalProtocolError("connect_link needs settings.mesh or an invite")
    handshake = Handshake(
        "initiator", settings.identity, credential, now=settings.wall_clock(), expected_peer_id=expected_peer_id
    )
    try:
        async with open_websocket_url(
            url,
            max_message_size=MAX_LINK_FRAME_BYTES,
            message_queue_size=WS_MESSAGE_QUEUE,
            receive_buffer_size=WS_RECEIVE_BUFFER,
            connect_timeout=settings.handshake_timeout_s,
            disconnect_timeout=CLOSE_TIMEOUT_S,
        ) as ws:
            try:
                result = await _run_handshake(ws, handshake, settings.handshake_timeout_s)
            except BaseException:
                await close_websocket(ws)
                raise
            await PeerLink(ws, result, settings).run(task_status=task_status)
    except (OSError, trio_websocket.HandshakeError) as exc:
        raise LinkClosed(f"cannot open a websocket to {url}: {exc}", code="connect_failed") from exc


@asynccontextmanager
async def open_link(
    url: str, settings: LinkSettings, *, invite: InviteToken | None = None, expected_peer_id: str | None = None
) -> AsyncIterator[PeerLink]:
    """``async with open_link(url, settings) as link:`` for short-lived links (tests, CLI)."""
    async with trio.open_nursery() as nursery:
        link = await nursery.start(
            partial(connect_link, url, settings, invite=invite, expected_peer_id=expected_peer_id)
        )
        try:
            yield link
        finally:
            with trio.CancelScope(shield=True):
                await link.aclose()


@dataclass(frozen=True)
class ListenerStatistics:
    port: int | None
    connections: int
    links_opened: int
    links_open: int
    handshake_failures: Mapping[str, int]


class LinkListener:
    """Accepts links on a websocket port; `on_link(link)` runs for each admitted peer
    and is cancelled when that link closes."""

    def __init__(self, settings: LinkSettings, on_link: LinkHandler | None = None) -> None:
        if settings.mesh is None:
            raise LocalProtocolError("only a mesh member (settings.mesh) can accept links")
        self._settings = settings
        self._on_link = on_link
        self.port: int | None = None
        self._connections = 0
        self._links_opened = 0
        self.links: set[PeerLink] = set()
        self._failures: collections.Counter[str] = collections.Counter()
        self._handshaking = 0
        self._handshaking_from: collections.Counter[str] = collections.Counter()

    def statistics(self) -> ListenerStatistics:
        return ListenerStatistics(
            port=self.port,
            connections=self._connections,
            links_opened=self._links_opened,
            links_open=len(self.links),
            handshake_failures=dict(self._failures),
        )

    async def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        listeners: list[trio.SocketListener] | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen until cancelled; `started(bound_port)` once accepting.  ``listeners``: already bound
        (on ``host``), served (and closed when done) instead of binding ``host:port`` here."""
        if listeners is None:
            listeners = await trio.open_tcp_listeners(port, host=host)
        server = WebSocketServer(
            self._handle,
            listeners,
            max_message_size=MAX_LINK_FRAME_BYTES,
            message_queue_size=WS_MESSAGE_QUEUE,
            receive_buffer_size=WS_RECEIVE_BUFFER,
            connect_timeout=self._settings.handshake_timeout_s,
            disconnect_timeout=CLOSE_TIMEOUT_S,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            self.port = server.port
            log_event(logging.INFO, "link_listener_up", host=host, port=self.port)
            task_status.started(self.port)

    async def _handle(self, request: WebSocketRequest) -> None:
        self._connections += 1
        try:
            await self._handle_connection(request)
        except Exception as exc:  # never let one connection take the listener down
            self._failures["internal_error"] += 1
            log_event(logging.ERROR, "link_connection_failed", error=repr(exc))

    async def _handle_connection(self, request: WebSocketRequest) -> None:
        nonce = nonce_from_path(request.path)
        if nonce is not None:  # a peer checking that we can be dialled here (link/dialback.py)
            with trio.move_on_after(CLOSE_TIMEOUT_S * 2):
                await answer_dialback(request, self._settings.identity, nonce)
            return
        source = _source_address(request)
        if (
            self._handshaking >= MAX_CONCURRENT_HANDSHAKES
            or self._handshaking_from[source] >= MAX_HANDSHAKES_PER_ADDRESS
        ):
            self._failures["busy"] += 1
            await self._refuse_busy(request)
            return
        self._handshaking += 1
        self._handshaking_from[source] += 1
        try:
            link = await self._admit(request)
        finally:
            self._handshaking -= 1
            self._handshaking_from[source] -= 1
            if self._handshaking_from[source] <= 0:
                del self._handshaking_from[source]
        if link is None:
            return
        self._links_opened += 1
        self.links.add(link)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(link.run)
                if self._on_link is not None:
                    nursery.start_soon(self._call_on_link, link)
                await link.wait_closed()
                nursery.cancel_scope.cancel()  # on_link ends with its link
        finally:
            self.links.discard(link)

    async def _refuse_busy(self, request: WebSocketRequest) -> None:
        try:
            ws = await request.accept()
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                await ws.send_message(
                    Reject(code="busy", message="too many handshakes in progress; retry later").encode()
                )
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await close_websocket(ws)

    async def _admit(self, request: WebSocketRequest) -> PeerLink | None:
        try:
            ws = await request.accept()
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._failures["websocket"] += 1
            log_event(logging.INFO, "link_accept_failed", error=repr(exc))
            return None
        settings = self._settings
        handshake = Handshake(
            "responder",
            settings.identity,
            settings.mesh,  # type: ignore[arg-type]
            now=settings.wall_clock(),
            trusted_issuer=settings.trusted_issuer,
            check_invite=settings.check_invite,
        )
        try:
            result = await _run_handshake(ws, handshake, min(settings.handshake_timeout_s, ACCEPT_HANDSHAKE_TIMEOUT_S))
        except HandshakeError as exc:
            self._failures[exc.code] += 1
            log_event(logging.WARNING, "handshake_failed", remote=_remote(ws), reason=exc.code, detail=str(exc))
            await close_websocket(ws)
            return None
        return PeerLink(ws, result, settings)

    async def _call_on_link(self, link: PeerLink) -> None:
        try:
            await self._on_link(link)  # type: ignore[misc]
        except Exception as exc:
            log_event(logging.ERROR, "on_link_failed", peer=link.peer_id, error=repr(exc))


def _source_address(request: WebSocketRequest) -> str:
    """The remote IP of a connection being accepted ("?" if unknown): handshake slots are per address."""
    try:
        remote: Any = request.remote  # an Endpoint (typed Endpoint | str); anything else raises here
        return str(remote.address)
    except Exception:
        return "?"


def _remote(ws: WebSocketConnection) -> str:
    try:
        remote: Any = ws.remote  # an Endpoint (typed Endpoint | str); anything else raises here
        return f"{remote.address}:{remote.port}"
    except Exception:
        return "?"


async def serve_links(
    on_link: LinkHandler | None,
    host: str,
    port: int,
    settings: LinkSettings,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Convenience: ``port = await nursery.start(serve_links, on_link, host, 0, settings)``."""
    await LinkListener(settings, on_link).serve(host, port, task_status=task_status)
