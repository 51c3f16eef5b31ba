"""Mesh membership: who is in the mesh, what each peer announces, and who has failed.

Public surface of the sans-IO SWIM core (`Membership`), its messages and events. The trio
driver is `hydra_node.mesh.gossip.GossipService`; docs/membership.md explains the algorithm.
"""

from __future__ import annotations

from hydra_node.mesh.membership.announcement import (
    ROLES,
    Announcement,
    Hardware,
    InvalidMessage,
    LocalMembershipError,
    MembershipError,
    ModelEntry,
    RpcCapacity,
)
from hydra_node.mesh.membership.config import (
    Action,
    MembershipConfig,
    MembershipEvent,
    PeerDied,
    PeerJoined,
    PeerLeft,
    PeerRecovered,
    PeerSuspected,
    PeerUpdated,
    Send,
)
from hydra_node.mesh.membership.core import Membership
from hydra_node.mesh.membership.messages import (
    Ack,
    DigestEntry,
    DigestSync,
    Gossip,
    Leave,
    Message,
    Nack,
    PeerRecord,
    Ping,
    PingReq,
    Pull,
    Suspect,
    Sync,
    decode_message,
    merge_records,
)
from hydra_node.mesh.membership.state import TRANSITIONS, PeerState, Trigger, transition
from hydra_node.mesh.membership.stats import MembershipStatistics, PeerStatus

__all__ = [
    "ROLES",
    "Ack",
    "Action",
    "Announcement",
    "DigestEntry",
    "DigestSync",
    "Gossip",
    "Hardware",
    "InvalidMessage",
    "Nack",
    "Suspect",
    "Leave",
    "LocalMembershipError",
    "Membership",
    "MembershipConfig",
    "MembershipError",
    "MembershipEvent",
    "MembershipStatistics",
    "Message",
    "ModelEntry",
    "PeerDied",
    "PeerJoined",
    "PeerLeft",
    "PeerRecord",
    "PeerRecovered",
    "PeerState",
    "PeerStatus",
    "PeerSuspected",
    "PeerUpdated",
    "Ping",
    "PingReq",
    "Pull",
    "RpcCapacity",
    "Send",
    "Sync",
    "TRANSITIONS",
    "Trigger",
    "decode_message",
    "merge_records",
    "transition",
]
