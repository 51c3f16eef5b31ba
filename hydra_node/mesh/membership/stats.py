"""The status view of membership, for the console and the management API."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra_node.mesh.membership.messages import PeerRecord

__all__ = ["MembershipStatistics", "PeerStatus"]


@dataclass(frozen=True)
class PeerStatus:
    """One peer as we see it; `last_seen_s` is seconds since we last heard from it directly."""

    peer_id: str
    state: str
    incarnation: int
    role: str | None
    addresses: tuple[str, ...]
    models: tuple[tuple[str, str], ...]  # (model id, model state)
    last_seen_s: float | None

    @classmethod
    def of(cls, peer_id: str, record: PeerRecord, last_seen_s: float | None) -> PeerStatus:
        ann = record.announcement
        return cls(
            peer_id=peer_id,
            state=record.state.value,
            incarnation=record.incarnation,
            role=None if ann is None else ann.role,
            addresses=() if ann is None else ann.addresses,
            models=() if ann is None else tuple((m.id, m.state) for m in ann.models),
            last_seen_s=last_seen_s,
        )


@dataclass(frozen=True)
class MembershipStatistics:
    """Peers and message counters (by message type; rejected/ignored by reason)."""

    node_id: str
    incarnation: int
    left: bool
    peers: tuple[PeerStatus, ...]
    sent: dict[str, int] = field(default_factory=dict, hash=False)
    received: dict[str, int] = field(default_factory=dict, hash=False)
    rejected: dict[str, int] = field(default_factory=dict, hash=False)
    ignored: dict[str, int] = field(default_factory=dict, hash=False)
    refutations: int = 0
    local_health: int = 0  # Lifeguard's score: probe timeouts are stretched by (local_health + 1)

    def count(self, state: str) -> int:
        """How many peers are in `state` ("alive", "suspect", "dead", "left")."""
        return sum(1 for p in self.peers if p.state == state)
