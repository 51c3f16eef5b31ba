"""The mesh's part of ``/api/status`` (pure): peer rows and the mesh section, as JSON-ready dicts."""

from __future__ import annotations

from typing import Callable, Mapping

from hydra_node.mesh.gossip import GossipServiceStatistics
from hydra_node.mesh.link.peer_link import LinkStatistics, PeerLink
from hydra_node.mesh.membership import Announcement, MembershipStatistics

__all__ = ["mesh_section", "peer_rows"]


def peer_rows(statistics: MembershipStatistics, members: Mapping[str, Announcement | None],
              link_of: Callable[[str], PeerLink | None]) -> list[dict]:
    """One row per peer we know (``/api/status`` ``peers``)."""
    out = []
    for p in statistics.peers:
        ann = members.get(p.peer_id)
        link = link_of(p.peer_id)
        out.append({"id": p.peer_id, "state": p.state, "role": p.role, "addresses": list(p.addresses),
                    "models": [m for m, _ in p.models], "model_states": dict(p.models),
                    "rtt_ms": None if link is None or link.rtt_ms is None else round(link.rtt_ms, 2),
                    "last_seen": None if p.last_seen_s is None else round(p.last_seen_s, 2),
                    "incarnation": p.incarnation, "api_port": ann.api_port if ann else None,
                    "queue_depth": ann.queue_depth if ann else None, "linked": link is not None})
    return out


def mesh_section(*, mesh_id: str | None, port: int | None, addresses: list[str], role: str,
                 links: Mapping[str, LinkStatistics], handshake_failures: Mapping[str, int],
                 gossip: GossipServiceStatistics | None, counters: Mapping[str, int]) -> dict:
    """The ``mesh`` section of ``/api/status`` (``links``: statistics by short peer id)."""
    rejected: dict[str, int] = {}
    for s in links.values():
        for k, v in (s.rejected or {}).items():
            rejected[k] = rejected.get(k, 0) + v
    return {"mesh_id": mesh_id, "port": port, "addresses": list(addresses), "role": role, "links": len(links),
            "frames_rejected": rejected, "link_bytes_in": sum(s.bytes_in for s in links.values()),
            "link_bytes_out": sum(s.bytes_out for s in links.values()),
            "handshake_failures": dict(handshake_failures),
            "membership": None if gossip is None else {
                "incarnation": gossip.membership.incarnation, "sent": gossip.membership.sent,
                "received": gossip.membership.received, "rejected": gossip.membership.rejected,
                "refutations": gossip.membership.refutations, "failed_sends": gossip.failed_sends,
                "dropped_sends": gossip.dropped_sends},
            "counters": dict(counters)}
