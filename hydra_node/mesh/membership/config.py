"""Membership timings and bounds, and the events the core emits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydra_node.mesh.membership.announcement import Announcement, LocalMembershipError

__all__ = [
    "MembershipConfig",
    "Send",
    "PeerJoined",
    "PeerUpdated",
    "PeerSuspected",
    "PeerRecovered",
    "PeerDied",
    "PeerLeft",
    "MembershipEvent",
    "Action",
]


@dataclass(frozen=True)
class MembershipConfig:
    """All timings (seconds) and bounds. Defaults detect a kill -9 on a LAN in about 5-8 s.

    Worst case, once views agree and the local health multiplier is 1 (see `detection_bound`):
    the dead node's ring predecessor probes it within one `probe_interval`, the probe fails after
    `probe_timeout` + `indirect_timeout`, every node hears the suspicion within the dissemination
    delay D, probes the suspect itself and tells `gossip_fanout` members its own probe failed;
    with `suspicion_confirmations` such confirmations a suspicion lasts its minimum,
    `suspicion_mult` x max(1, log10 n) x `probe_interval` (Lifeguard); a node that missed the
    suspicion verifies the death claim with its own probe (one more probe_timeout +
    indirect_timeout). Without confirmations a suspicion lasts up to `suspicion_max_mult` times
    the minimum, which is what keeps a slow-but-alive peer from being declared dead.
    """

    probe_interval: float = 1.0  # protocol period: one ring probe + one round-robin probe each
    probe_timeout: float = 0.5  # wait for a direct Ack before asking helpers
    indirect_timeout: float = 0.5  # wait for a forwarded Ack after the PingReqs
    indirect_probes: int = 3  # helpers asked per failed direct probe (SWIM's k)
    suspicion_mult: float = 2.0  # minimum suspicion = mult * max(1, log10 n) * probe_interval
    suspicion_max_mult: float = 6.0  # maximum suspicion (no confirmations) = this * minimum
    suspicion_confirmations: int = 2  # independent failed probes that shrink a suspicion to its minimum
    awareness_max_multiplier: int = 8  # local health stretches our probe timeouts at most this much
    lag_threshold: float = 0.25  # a timer wake this late (s) counts against our local health
    ring_monitors: int = 1  # ring successors probed every period: bounds time to first probe
    gossip_interval: float = 0.2  # dissemination round while changes are pending
    gossip_fanout: int = 3  # peers per dissemination round (also for the immediate push)
    retransmit_mult: int = 4  # each change rides retransmit_mult * ceil(log10(n + 1)) messages (memberlist)
    sync_interval: float = 5.0  # anti-entropy: bucket hashes of our digest to one random member
    sync_bucket_entries: int = 32  # digest entries per anti-entropy bucket (bounds a Sync reply)
    reconnect_interval: float = 5.0  # Sync to one random dead peer (heals partitions) or the seeds
    tombstone_ttl: float = 300.0  # dead/left entries kept this long (stops stale resurrection)
    max_peers: int = 1024  # entries, tombstones included; oldest tombstone evicted first
    max_piggyback: int = 8  # records riding on one Ping/Ack/PingReq/Gossip (message size bound)
    max_records_per_message: int = 16  # records per Gossip when answering a Sync or Pull
    max_forwarded_probes: int = 256  # PingReqs served for others at once

    def __post_init__(self) -> None:
        for name in (
            "probe_interval",
            "probe_timeout",
            "indirect_timeout",
            "suspicion_mult",
            "lag_threshold",
            "gossip_interval",
            "sync_interval",
            "reconnect_interval",
            "tombstone_ttl",
        ):
            if not getattr(self, name) > 0:
                raise LocalMembershipError(f"{name} must be > 0")
        if self.probe_timeout + self.indirect_timeout > self.probe_interval:
            raise LocalMembershipError("probe_timeout + indirect_timeout must fit in probe_interval")
        if not self.suspicion_max_mult >= 1:
            raise LocalMembershipError("suspicion_max_mult must be >= 1")
        for name in (
            "indirect_probes",
            "ring_monitors",
            "gossip_fanout",
            "retransmit_mult",
            "suspicion_confirmations",
            "awareness_max_multiplier",
            "sync_bucket_entries",
            "max_peers",
            "max_piggyback",
            "max_records_per_message",
            "max_forwarded_probes",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise LocalMembershipError(f"{name} must be a non-negative int")
        if self.awareness_max_multiplier < 1 or self.sync_bucket_entries < 1:
            raise LocalMembershipError("awareness_max_multiplier and sync_bucket_entries must be >= 1")
        if self.max_peers < 1 or self.max_piggyback > 64 or self.max_records_per_message > 64:
            raise LocalMembershipError("max_peers >= 1, max_piggyback and max_records_per_message <= 64")

    def retransmit_limit(self, members: int) -> int:
        """Sends of each queued change per node: every node relays it, so the mesh-wide copies
        are n times this; log10 (memberlist) instead of log2 keeps a change's cost per node at
        16 sends at 1,000 nodes (was 30), still e^-16 odds that a node misses it."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(members + 1)))

    def suspicion_bounds(self, members: int) -> tuple[float, float]:
        """(minimum, maximum) suspicion timeout in a mesh of `members` nodes (Lifeguard)."""
        low = self.suspicion_mult * max(1.0, math.log10(max(1, members))) * self.probe_interval
        return low, low * self.suspicion_max_mult

    def detection_bound(self, dissemination: float = 1.0, members: int = 30) -> float:
        """Seconds until every live node marks a killed peer dead, given a dissemination delay.

        = probe_interval + 2 * (probe_timeout + indirect_timeout) + minimum suspicion(n) + D
        (the second probe term covers a node that verifies the death claim itself). It holds
        while our local health multiplier is 1 and confirmations reach the suspecting nodes
        within the minimum suspicion; both are true on a calm LAN. At 30 nodes with D = 1 s it
        is 6.95 s, at 1,000 nodes 10 s.
        """
        probe = self.probe_timeout + self.indirect_timeout
        return self.probe_interval + 2 * probe + self.suspicion_bounds(members)[0] + dissemination


@dataclass(frozen=True)
class Send:
    """Action: deliver `message` (its `to_wire()` dict) to peer `to`."""

    to: str
    message: Any


@dataclass(frozen=True)
class PeerJoined:
    """A peer became a member (first seen, or back with a higher incarnation)."""

    peer_id: str
    incarnation: int
    announcement: Announcement


@dataclass(frozen=True)
class PeerUpdated:
    """A member published a newer announcement."""

    peer_id: str
    incarnation: int
    announcement: Announcement


@dataclass(frozen=True)
class PeerSuspected:
    peer_id: str
    incarnation: int


@dataclass(frozen=True)
class PeerRecovered:
    """A suspect refuted the suspicion (alive at a higher incarnation)."""

    peer_id: str
    incarnation: int


@dataclass(frozen=True)
class PeerDied:
    peer_id: str
    incarnation: int


@dataclass(frozen=True)
class PeerLeft:
    peer_id: str
    incarnation: int


MembershipEvent = PeerJoined | PeerUpdated | PeerSuspected | PeerRecovered | PeerDied | PeerLeft
Action = Send | MembershipEvent
