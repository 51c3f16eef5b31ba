"""The mesh's statistics for ``/api/status`` (pure): one typed row per peer, and the mesh section.

Frozen dataclasses; the API renders them (``hydra_node/admin/status_json.py``), field order is the
JSON's key order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from hydra_node.mesh.gossip import GossipServiceStatistics
from hydra_node.mesh.link.peer_link import LinkStatistics, PeerLink
from hydra_node.mesh.membership import Announcement, MembershipStatistics
from hydra_node.mesh.relay.agent import RelayStatus
from hydra_node.mesh.relay.reachability import ReachabilityView

__all__ = ["MembershipCounters", "MeshStatus", "PeerRow", "mesh_section", "peer_rows"]


@dataclass(frozen=True)
class PeerRow:
    """A peer we know (``/api/status`` ``peers``)."""

    id: str
    state: str
    role: str | None  # None: no announcement of it known (a tombstone)
    addresses: tuple[str, ...]
    models: tuple[str, ...]
    model_states: Mapping[str, str]
    rtt_ms: float | None
    last_seen: float | None
    incarnation: int
    api_port: int | None
    queue_depth: int | None
    linked: bool
    relay: str | None = None
    """The relay our link to this peer runs through (None: a direct link, or no link)."""
    path: str | None = None
    """How our link to this peer runs: "direct", "relayed" or "punched" (hole punching); None: no link."""
    model_idents: Mapping[str, str] = field(default_factory=dict)
    """Each model's announced identity (``ident``: its GGUF digest, docs/scheduler.md "Continuing a
    stream"); a model missing here cannot take over this node's streams of it."""


@dataclass(frozen=True)
class MembershipCounters:
    """The gossip driver's and the membership core's counters."""

    incarnation: int
    sent: Mapping[str, int]
    received: Mapping[str, int]
    rejected: Mapping[str, int]
    refutations: int
    failed_sends: int
    dropped_sends: int
    local_health: int = 0  # Lifeguard's score, 0 (healthy) .. 7: our probe timeouts are x (score + 1)


@dataclass(frozen=True)
class MeshStatus:
    """The ``mesh`` section of ``/api/status``."""

    mesh_id: str | None
    port: int | None
    addresses: tuple[str, ...]
    role: str
    links: int
    frames_rejected: Mapping[str, int]
    link_bytes_in: int
    link_bytes_out: int
    handshake_failures: Mapping[str, int]
    membership: MembershipCounters | None
    counters: Mapping[str, int]
    reachability: ReachabilityView | None = None
    """Can peers dial us (``reachable``: true, false or "unknown"), and how we learned it."""
    relays: RelayStatus | None = None
    """Relaying for others (``offering``, limits, circuits) and our reservations at relays."""


def peer_rows(
    statistics: MembershipStatistics,
    members: Mapping[str, Announcement | None],
    link_of: Callable[[str], PeerLink | None],
) -> list[PeerRow]:
    """One row per peer we know."""
    out = []
    for p in statistics.peers:
        ann = members.get(p.peer_id)
        link = link_of(p.peer_id)
        out.append(
            PeerRow(
                id=p.peer_id,
                state=p.state,
                role=p.role,
                addresses=tuple(p.addresses),
                models=tuple(m for m, _ in p.models),
                model_states=dict(p.models),
                rtt_ms=None if link is None or link.rtt_ms is None else round(link.rtt_ms, 2),
                last_seen=None if p.last_seen_s is None else round(p.last_seen_s, 2),
                incarnation=p.incarnation,
                api_port=ann.api_port if ann else None,
                queue_depth=ann.queue_depth if ann else None,
                linked=link is not None,
                relay=link.relay if link is not None else None,
                path=link.path if link is not None else None,
                model_idents={m.id: m.ident for m in ann.models if m.ident} if ann else {},
            )
        )
    return out


def mesh_section(
    *,
    mesh_id: str | None,
    port: int | None,
    addresses: list[str],
    role: str,
    links: Mapping[str, LinkStatistics],
    handshake_failures: Mapping[str, int],
    gossip: GossipServiceStatistics | None,
    counters: Mapping[str, int],
    reachability: ReachabilityView | None = None,
    relays: RelayStatus | None = None,
) -> MeshStatus:
    """The mesh section (``links``: statistics by short peer id)."""
    rejected: dict[str, int] = {}
    for s in links.values():
        for k, v in (s.rejected or {}).items():
            rejected[k] = rejected.get(k, 0) + v
    membership = (
        None
        if gossip is None
        else MembershipCounters(
            incarnation=gossip.membership.incarnation,
            sent=gossip.membership.sent,
            received=gossip.membership.received,
            rejected=gossip.membership.rejected,
            refutations=gossip.membership.refutations,
            failed_sends=gossip.failed_sends,
            dropped_sends=gossip.dropped_sends,
            local_health=gossip.membership.local_health,
        )
    )
    return MeshStatus(
        mesh_id=mesh_id,
        port=port,
        addresses=tuple(addresses),
        role=role,
        links=len(links),
        frames_rejected=rejected,
        link_bytes_in=sum(s.bytes_in for s in links.values()),
        link_bytes_out=sum(s.bytes_out for s in links.values()),
        handshake_failures=dict(handshake_failures),
        membership=membership,
        counters=dict(counters),
        reachability=reachability,
        relays=relays,
    )
