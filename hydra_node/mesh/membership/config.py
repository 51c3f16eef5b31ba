"""Membership timings and bounds, and the events the core emits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydra_node.mesh.membership.announcement import Announcement, LocalMembershipError

__all__ = [
    "MembershipConfig", "Send", "PeerJoined", "PeerUpdated", "PeerSuspected", "PeerRecovered",
    "PeerDied", "PeerLeft", "MembershipEvent", "Action",
]


@dataclass(frozen=True)
class MembershipConfig:
    """All timings (seconds) and bounds. Defaults detect a kill -9 on a LAN in about 5-7 s.

    Worst case, once views agree (see `detection_bound`): the dead node's ring predecessor
    probes it within one `probe_interval`, the probe fails after `probe_timeout` +
    `indirect_timeout`, every node hears the suspicion within the dissemination delay D and
    declares death `suspicion_timeout` later; a node that missed the suspicion verifies the
    death claim with its own probe (one more probe_timeout + indirect_timeout).
    """

    probe_interval: float = 1.0  # protocol period: one ring probe + one round-robin probe each
    probe_timeout: float = 0.5  # wait for a direct Ack before asking helpers
    indirect_timeout: float = 0.5  # wait for a forwarded Ack after the PingReqs
    indirect_probes: int = 3  # helpers asked per failed direct probe (SWIM's k)
    suspicion_timeout: float = 3.0  # time a suspect has to refute before it is declared dead
    ring_monitors: int = 1  # ring successors probed every period: bounds time to first probe
    gossip_interval: float = 0.2  # dissemination round while changes are pending
    gossip_fanout: int = 3  # peers per dissemination round (also for the immediate push)
    retransmit_mult: int = 3  # each change rides retransmit_mult * ceil(log2(n + 2)) messages
    sync_interval: float = 5.0  # push-pull of the full digest with one random member
    reconnect_interval: float = 5.0  # Sync to one random dead peer (heals partitions) or the seeds
    tombstone_ttl: float = 300.0  # dead/left entries kept this long (stops stale resurrection)
    max_peers: int = 1024  # entries, tombstones included; oldest tombstone evicted first
    max_piggyback: int = 8  # records riding on one Ping/Ack/PingReq/Gossip (message size bound)
    max_records_per_message: int = 16  # records per Gossip when answering a Sync or Pull
    max_forwarded_probes: int = 256  # PingReqs served for others at once

    def __post_init__(self) -> None:
        for name in ("probe_interval", "probe_timeout", "indirect_timeout", "suspicion_timeout",
                     "gossip_interval", "sync_interval", "reconnect_interval", "tombstone_ttl"):
            if not getattr(self, name) > 0:
                raise LocalMembershipError(f"{name} must be > 0")
        if self.probe_timeout + self.indirect_timeout > self.probe_interval:
            raise LocalMembershipError("probe_timeout + indirect_timeout must fit in probe_interval")
        for name in ("indirect_probes", "ring_monitors", "gossip_fanout", "retransmit_mult",
                     "max_peers", "max_piggyback", "max_records_per_message", "max_forwarded_probes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise LocalMembershipError(f"{name} must be a non-negative int")
        if self.max_peers < 1 or self.max_piggyback > 64 or self.max_records_per_message > 64:
            raise LocalMembershipError("max_peers >= 1, max_piggyback and max_records_per_message <= 64")

    def retransmit_limit(self, members: int) -> int:
        return self.retransmit_mult * max(1, math.ceil(math.log2(members + 2)))

    def detection_bound(self, dissemination: float = 1.0) -> float:
        """Seconds until every live node marks a killed peer dead, given a dissemination delay.

        = probe_interval + 2 * (probe_timeout + indirect_timeout) + suspicion_timeout + D
        (the second probe term covers a node that verifies the death claim itself).
        """
        probe = self.probe_timeout + self.indirect_timeout
        return self.probe_interval + 2 * probe + self.suspicion_timeout + dissemination


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
