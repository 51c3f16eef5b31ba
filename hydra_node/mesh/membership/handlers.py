"""How `Membership` answers each message type (the `_on_<type>` handlers of the SWIM core).

A mixin of `membership_core.Membership`: records piggybacked on a message were merged before
its handler runs (`on_message`), so a handler only answers: acks, forwarded pings, the
anti-entropy push/pull of `Sync` and `Pull`, and a peer's own `Leave`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hydra_node.mesh.membership.changes import PeerEntry
from hydra_node.mesh.membership.config import MembershipConfig
from hydra_node.mesh.membership.messages import (
    Ack,
    DigestEntry,
    Gossip,
    Leave,
    Message,
    PeerRecord,
    Ping,
    PingReq,
    Pull,
    Sync,
)
from hydra_node.mesh.membership.health import LocalHealth
from hydra_node.mesh.membership.probes import NACK_FRACTION, ProbeTable
from hydra_node.mesh.membership.state import PeerState

__all__ = ["MessageHandlers"]


class MessageHandlers:
    """Per-type message handlers; the state they use is set up by `Membership.__init__`."""

    config: MembershipConfig
    node_id: str
    ignored: Counter[str]
    _peers: dict[str, PeerEntry]
    _probes: ProbeTable
    health: LocalHealth

    if TYPE_CHECKING:  # provided by `Membership` and the sibling mixins

        def self_record(self) -> PeerRecord: ...
        def record(self, peer_id: str) -> PeerRecord | None: ...
        def _all_records(self) -> list[PeerRecord]: ...
        def _piggyback(self) -> tuple[PeerRecord, ...]: ...
        def _send(self, to: str, msg: Message, *, piggyback: bool = True) -> None: ...
        def _send_records(self, to: str, records: list[PeerRecord]) -> None: ...
        def _note_rtt(self, peer: PeerEntry, rtt: float) -> None: ...
        def _apply(self, rec: PeerRecord, sender: str, now: float) -> None: ...

    def _on_ping(self, sender: str, msg: Ping, now: float) -> None:
        records = self._piggyback()
        view = msg.view
        me = self.self_record()
        stale = view is None or view.node_id != self.node_id or view.key < me.digest().key
        if stale and all(r.node_id != self.node_id for r in records):
            records = (me, *records[: self.config.max_piggyback - 1])
        self._send(sender, Ack(msg.probe_id, self.node_id, records), piggyback=False)
        if sender not in self._peers:
            self._send(sender, Pull((sender,)))

    def _on_ack(self, sender: str, msg: Ack, now: float) -> None:
        probe = self._probes.get(msg.probe_id)
        if probe is not None and msg.subject == probe.target and (sender == probe.target or sender in probe.helpers):
            self._probes.end(probe)
            peer = self._peers.get(probe.target)
            if peer is not None:
                peer.own_probe_failed = False
                peer.death_claim = None
                peer.last_seen = now
                if sender == probe.target:
                    self._note_rtt(peer, now - probe.sent_at)
            self.health.apply(-1)
            return
        fwd = self._probes.pop_forward(msg.probe_id, sender, msg.subject)
        if fwd is not None:
            self._send(fwd.requester, Ack(fwd.their_probe_id, fwd.target))
            return
        self.ignored["unmatched_ack"] += 1

    def _on_ping_req(self, sender: str, msg: PingReq, now: float) -> None:
        if msg.target == self.node_id:
            self._send(sender, Ack(msg.probe_id, self.node_id))
            return
        pid = (
            None
            if msg.target == sender
            else self._probes.add_forward(
                sender,
                msg.probe_id,
                msg.target,
                now + self.config.indirect_timeout,
                now + NACK_FRACTION * self.config.indirect_timeout,
            )
        )
        if pid is None:
            self.ignored["ping_req_refused"] += 1
            return
        rec = self.record(msg.target)
        view = (
            msg.view
            if msg.view is not None and msg.view.node_id == msg.target
            else (None if rec is None else rec.digest())
        )
        self._send(msg.target, Ping(pid, view))

    def _on_gossip(self, sender: str, msg: Gossip, now: float) -> None:
        pass  # records were applied already

    def _on_sync(self, sender: str, msg: Sync, now: float) -> None:
        self._push_pull(sender, self._all_records(), {d.node_id: d for d in msg.digest})

    def _push_pull(self, sender: str, mine: Iterable[PeerRecord], theirs: dict[str, DigestEntry]) -> None:
        """Anti-entropy with ``sender``: push our records in ``mine`` that are newer than its digest
        entries ``theirs`` (or missing there), pull those of ``theirs`` newer than ours."""
        push = [rec for rec in mine if (d := theirs.get(rec.node_id)) is None or rec.digest().key > d.key]
        pull = [
            d.node_id
            for d in theirs.values()
            if d.node_id != self.node_id and ((rec := self.record(d.node_id)) is None or d.key > rec.digest().key)
        ]
        self._send_records(sender, push)
        if pull:
            self._send(sender, Pull(tuple(pull)))

    def _on_pull(self, sender: str, msg: Pull, now: float) -> None:
        records = [r for r in map(self.record, dict.fromkeys(msg.ids)) if r is not None]
        self._send_records(sender, records)

    def _on_leave(self, sender: str, msg: Leave, now: float) -> None:
        peer = self._peers.get(sender)
        ann = None if peer is None else peer.record.announcement
        if ann is not None and ann.incarnation > msg.incarnation:
            self.ignored["stale_leave"] += 1
            return
        self._apply(PeerRecord(sender, msg.incarnation, PeerState.LEFT, ann), sender, now)
