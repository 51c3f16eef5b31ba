"""Using relays (trio): hold a reservation, dial a peer through its relay, accept a relayed link.

A relayed link is an ordinary `PeerLink`: the same handshake (``link/endpoints.run_handshake``)
and secure channel, run end to end over a relayed stream (``transport.StreamTransport``) instead
of a websocket. The target checks that the peer it authenticated is the one the relay named.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import trio

from hydra_node.mesh.link.endpoints import run_handshake
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.relay.messages import (
    CONNECT_KIND,
    RELAY_VERSION,
    RESERVE_KIND,
    RelayProtocolError,
    encode_reply,
    parse_incoming,
)
from hydra_node.mesh.relay.server import RELAY_REPLY_TIMEOUT_S, read_reply
from hydra_node.mesh.relay.transport import StreamTransport
from hydra_node.mesh.wire.errors import HandshakeError, LinkClosed, StreamReset
from hydra_node.mesh.wire.handshake import Handshake

__all__ = ["Reservation", "accept_relayed", "connect_via_relay", "hold_reservation"]

log = logging.getLogger("hydra.mesh.relay")


@dataclass(frozen=True)
class Reservation:
    relay: str
    ttl_s: int
    bytes_per_s: int
    circuits: int


async def hold_reservation(
    relay_link: PeerLink, *, task_status: trio.TaskStatus[Reservation] = trio.TASK_STATUS_IGNORED
) -> None:
    """Reserve at ``relay_link``'s node; ``started(Reservation)``; return when the reservation ends
    (TTL, relay or link gone: never raises after ``started``). Before ``started``: LinkClosed (code
    relay_refused if the relay refuses)."""
    try:
        async with relay_link.open_stream({"kind": RESERVE_KIND, "v": RELAY_VERSION}) as stream:
            with trio.fail_after(RELAY_REPLY_TIMEOUT_S):
                reply, _ = await read_reply(stream, "reserved")
            if reply["op"] == "refused":
                raise LinkClosed(
                    f"relay {relay_link.peer_id[:12]} refused: {reply['code']} {reply['message']}", code="relay_refused"
                )
            task_status.started(
                Reservation(relay_link.peer_id, reply["ttl_s"], reply["bytes_per_s"], reply["circuits"])
            )
            try:
                while await stream.receive():
                    pass
            except (StreamReset, LinkClosed):
                return  # the relay or our link to it is gone: the reservation with it
    except (trio.TooSlowError, RelayProtocolError) as exc:
        raise LinkClosed(f"relay {relay_link.peer_id[:12]} did not reserve: {exc}", code="relay_refused") from None
    except StreamReset:
        return


async def connect_via_relay(
    relay_link: PeerLink,
    target: str,
    settings: LinkSettings,
    *,
    on_observed: Callable[[str | None], None] | None = None,
    on_peer_observed: Callable[[str | None], None] | None = None,
    task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Dial ``target`` through ``relay_link``'s node and run the link until it closes; ``started(link)``.
    Before that: LinkClosed (relay_refused, connect_failed) or a HandshakeError. ``on_observed``
    receives our public IP as the relay saw it (``connected.observed``; None if not given),
    ``on_peer_observed`` the target's (``connected.peer_observed``: where a hole punch may go)."""
    if settings.mesh is None:
        raise LinkClosed("a relayed link needs the mesh key", code="connect_failed")
    try:
        async with relay_link.open_stream({"kind": CONNECT_KIND, "v": RELAY_VERSION, "target": target}) as stream:
            with trio.fail_after(RELAY_REPLY_TIMEOUT_S * 2):
                reply, rest = await read_reply(stream, "connected")
            if reply["op"] == "refused":
                raise LinkClosed(
                    f"relay {relay_link.peer_id[:12]} refused: {reply['code']} {reply['message']}", code="relay_refused"
                )
            if on_observed is not None:
                on_observed(reply.get("observed"))
            if on_peer_observed is not None:
                on_peer_observed(reply.get("peer_observed"))
            transport = StreamTransport(stream, relay=relay_link.peer_id, initial=rest)
            handshake = Handshake(
                "initiator", settings.identity, settings.mesh, now=settings.wall_clock(), expected_peer_id=target
            )
            try:
                result = await run_handshake(transport, handshake, settings.handshake_timeout_s)
            except BaseException:
                await transport.aclose()
                raise
            await PeerLink(transport, result, settings).run(task_status=task_status)
    except (trio.TooSlowError, RelayProtocolError, StreamReset) as exc:
        raise LinkClosed(f"no relayed link to {target[:12]}: {exc}", code="connect_failed") from None


async def accept_relayed(
    relay_link: PeerLink, header: Mapping[str, Any], stream: LinkStream, settings: LinkSettings, *, allowed: bool
) -> PeerLink | None:
    """Answer a ``relay_incoming`` stream: the authenticated link (not yet running), or None when
    refused or the handshake failed (logged). ``allowed``: we hold a reservation at this relay."""
    try:
        source = parse_incoming(header).source
    except RelayProtocolError as exc:
        await stream.send(encode_reply("refused", code=exc.code, message=str(exc)))
        return None
    if not allowed or settings.mesh is None:
        await stream.send(encode_reply("refused", code="no_reservation", message="no reservation at this relay"))
        return None
    await stream.send(encode_reply("accepted"))
    transport = StreamTransport(stream, relay=relay_link.peer_id)
    handshake = Handshake(
        "responder",
        settings.identity,
        settings.mesh,
        now=settings.wall_clock(),
        trusted_issuer=settings.trusted_issuer,
        check_invite=settings.check_invite,
    )
    try:
        result = await run_handshake(transport, handshake, settings.handshake_timeout_s)
    except HandshakeError as exc:
        log.warning(
            "event=relayed_handshake_failed relay=%s reason=%s detail=%r", relay_link.peer_id[:16], exc.code, str(exc)
        )
        await transport.aclose()
        return None
    if result.peer_id != source:
        log.warning("event=relayed_handshake_failed relay=%s reason=wrong_peer", relay_link.peer_id[:16])
        await transport.aclose()
        return None
    return PeerLink(transport, result, settings)
