"""How `Membership` spreads changes: the broadcast queue, piggybacking, gossip rounds and sync digests.

A mixin of `membership_core.Membership`. A changed record is queued once per peer
(`_enqueue`), rides on pings, acks and ping-reqs (`_send` piggybacks) and on gossip rounds to
`gossip_fanout` random members, and is pushed at once after a change (`_flush`). `Sync`
carries a digest of every record for anti-entropy; full records go out in `Gossip` messages
of at most `max_records_per_message`.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from hydra_node.mesh.membership.broadcast import BroadcastQueue
from hydra_node.mesh.membership.changes import PeerEntry
from hydra_node.mesh.membership.config import Action, MembershipConfig, Send
from hydra_node.mesh.membership.messages import Ack, Gossip, Message, PeerRecord, Ping, PingReq, Sync

__all__ = ["Dissemination"]


class Dissemination:
    """Dissemination and sending; the state it uses is set up by `Membership.__init__`."""

    config: MembershipConfig
    node_id: str
    sent: Counter[str]
    _rng: random.Random
    _peers: dict[str, PeerEntry]
    _broadcasts: BroadcastQueue
    _out: list[Action]

    if TYPE_CHECKING:  # provided by `Membership`

        def self_record(self) -> PeerRecord: ...
        def record(self, peer_id: str) -> PeerRecord | None: ...
        def _members_sorted(self) -> list[str]: ...

    def _enqueue(self, peer_id: str) -> None:
        self._broadcasts.push(peer_id)

    def _piggyback(self) -> tuple[PeerRecord, ...]:
        """Up to max_piggyback queued changes to ride on the next message."""
        limit = self.config.retransmit_limit(len(self._peers))
        return tuple(self._broadcasts.take(self.config.max_piggyback, limit, self.record))

    def _gossip_round(self) -> None:
        members = self._members_sorted()
        for target in self._rng.sample(members, min(self.config.gossip_fanout, len(members))):
            records = self._piggyback()
            if not records:
                break
            self._send(target, Gossip(records), piggyback=False)

    def _flush(self) -> None:
        """Push fresh changes at once instead of waiting for the next gossip round."""
        if self._broadcasts.fresh:
            self._broadcasts.fresh = False
            self._gossip_round()

    def _send_records(self, to: str, records: list[PeerRecord]) -> None:
        size = max(1, self.config.max_records_per_message)
        for i in range(0, len(records), size):
            self._send(to, Gossip(tuple(records[i : i + size])), piggyback=False)

    def _sync_message(self) -> Sync:
        return Sync(tuple(r.digest() for r in self._all_records()), (self.self_record(),))

    def _all_records(self) -> list[PeerRecord]:
        return [self.self_record(), *(p.record for p in self._peers.values())]

    def _send(self, to: str, msg: Message, *, piggyback: bool = True) -> None:
        if piggyback and isinstance(msg, (Ping, PingReq, Ack)) and not msg.records:
            msg = replace(msg, records=self._piggyback())
        self.sent[msg.TYPE] += 1
        self._out.append(Send(to, msg))
