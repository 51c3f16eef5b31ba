"""What a link is configured with and what it reports: its bounds, `LinkSettings`, `LinkStatistics`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

import nacl.signing

from hydra_node.mesh.link.faults import FaultInjection
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.link.stream import LinkStream

__all__ = [
    "CLOSE_TIMEOUT_S",
    "HANDSHAKE_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "MAX_OUTSTANDING_PINGS",
    "MESSAGE_QUEUE_SIZE",
    "PING_INTERVAL_S",
    "LinkSettings",
    "LinkStatistics",
    "MessageHandler",
    "StreamHandler",
]

HANDSHAKE_TIMEOUT_S = 10.0
PING_INTERVAL_S = 5.0
IDLE_TIMEOUT_S = 30.0
"""A link that receives nothing (not even a PONG) for this long is closed."""
CLOSE_TIMEOUT_S = 2.0
MESSAGE_QUEUE_SIZE = 64
"""Received priority-lane messages waiting for the handler; beyond this they are dropped and counted."""
MAX_OUTSTANDING_PINGS = 8

#: ``handler(link, header, stream)`` for a stream the peer opened (the link is a ``PeerLink``).
StreamHandler = Callable[[Any, dict[str, Any], LinkStream], Awaitable[None]]
#: ``handler(link, body)`` for a priority-lane message.
MessageHandler = Callable[[Any, dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class LinkSettings:
    """Everything a link needs from the node. `mesh` is None only for a joiner with an invite."""

    identity: nacl.signing.SigningKey
    mesh: MeshSecret | None = None
    trusted_issuer: Callable[[str], bool] | None = None
    check_invite: Callable[[Any], None] | None = None  # (InviteToken) -> None or a TokenError: see Handshake
    on_stream: StreamHandler | None = None
    on_message: MessageHandler | None = None
    fault: FaultInjection | None = None
    ping_interval_s: float = PING_INTERVAL_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    wall_clock: Callable[[], float] = field(default=time.time, repr=False)


@dataclass(frozen=True)
class LinkStatistics:
    """Counters of one link. `messages_dropped` counts messages lost to fault injection
    (sending) or to a full handler queue (receiving); `rejected` counts frames by code."""

    peer_id: str
    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int
    messages_in: int
    messages_out: int
    messages_dropped: int
    streams_open: int
    rtt_ms: float | None
    rejected: Mapping[str, int]
    closed: str | None
