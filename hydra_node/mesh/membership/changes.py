"""How `Membership` merges what it hears into its peer table, and the state changes that follow.

A mixin of `membership_core.Membership`: merging a record (`_apply`), learning a new peer,
taking a newer announcement, suspecting, tombstoning (dead or left), forgetting an expired
tombstone, and refuting claims about ourselves. Every state change goes through the
`membership_state` transition table and queues the changed record for dissemination.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hydra_node.mesh.membership.announcement import Announcement
from hydra_node.mesh.membership.broadcast import BroadcastQueue
from hydra_node.mesh.membership.config import (
    Action,
    MembershipConfig,
    PeerDied,
    PeerJoined,
    PeerLeft,
    PeerRecovered,
    PeerSuspected,
    PeerUpdated,
)
from hydra_node.mesh.membership.health import LocalHealth
from hydra_node.mesh.membership.messages import PeerRecord, merge_records
from hydra_node.mesh.membership.probes import ProbeTable
from hydra_node.mesh.membership.state import PeerState, Trigger, transition
from hydra_node.mesh.membership.suspicion import Suspicion

__all__ = ["MAX_CLAIMED_INCARNATION", "MAX_INCARNATION_LEAD", "PeerChanges", "PeerEntry"]

#: Highest incarnation any record may claim. Incarnations start at the Unix time of a node's start
#: and grow by one per refutation, so real ones are near 2^31; the cap leaves room for a
#: refutation (+1) far inside the wire's 2^63-1, so refuting always succeeds.
MAX_CLAIMED_INCARNATION = 2**62
#: How far a third party's claim may run ahead of the subject's own highest signed announcement
#: that we know: more is a claim about a life the subject never announced (a lie, or news so
#: stale-ahead that dropping it is safe: the subject's next announcement carries it).
MAX_INCARNATION_LEAD = 16


@dataclass
class PeerEntry:
    """One row of the peer table: the merged record and what our own probes found."""

    record: PeerRecord
    last_seen: float | None = None
    own_probe_failed: bool = False  # our latest probe of this incarnation got no ack
    death_claim: PeerRecord | None = None  # a dead/left claim waiting for our own probe
    srtt: float | None = None  # smoothed round trip of our direct probes (s), None until measured


class PeerChanges:
    """Merge and state changes; the state they use is set up by `Membership.__init__`."""

    config: MembershipConfig
    node_id: str
    rejected: Counter[str]
    ignored: Counter[str]
    refutations: int
    _ann: Announcement
    _sign: Callable[[Announcement], Announcement]
    _verify: Callable[[Announcement], bool] | None
    _peers: dict[str, PeerEntry]
    _suspicions: dict[str, Suspicion]
    health: LocalHealth
    _tomb_deadlines: dict[str, float]
    _probes: ProbeTable
    _broadcasts: BroadcastQueue
    _ring: list[str] | None
    _member_ids: list[str] | None
    _told: dict[str, int]
    _out: list[Action]

    if TYPE_CHECKING:  # provided by `Membership` and the sibling mixins

        @property
        def incarnation(self) -> int: ...
        def _members_sorted(self) -> list[str]: ...
        def _start_probe(self, target: str, now: float) -> None: ...
        def _enqueue(self, peer_id: str) -> None: ...

    def _apply(self, rec: PeerRecord, sender: str, now: float) -> None:
        if rec.incarnation > MAX_CLAIMED_INCARNATION:
            self.rejected["incarnation_over_cap"] += 1
            return
        if rec.node_id == self.node_id:
            self._about_me(rec.incarnation, rec.state)
            return
        if self._verify is not None and rec.announcement is not None and not self._verify(rec.announcement):
            self.rejected["bad_announcement_signature"] += 1
            return
        peer = self._peers.get(rec.node_id)
        if sender != rec.node_id and self._beyond_announced(rec, peer):
            self.rejected["incarnation_beyond_announced"] += 1
            return
        if peer is None:
            self._learn(rec, sender, now)
            return
        cur = peer.record
        merged = merge_records(cur, rec)
        if merged == cur:
            self.ignored["stale_record"] += 1
            return
        ann = merged.announcement
        if ann is not None and ann != cur.announcement:
            self._new_announcement(peer, ann, now)
        cur = peer.record
        if rec.status > cur.status:
            if rec.state is PeerState.SUSPECT:
                self._suspect(peer, now, origin=sender)
            elif cur.state.is_tombstone:
                trig = Trigger.LEAVE if rec.state is PeerState.LEFT else Trigger.CONFIRM
                new_state = transition(cur.state, trig) if rec.state is not cur.state else cur.state
                peer.record = PeerRecord(rec.node_id, rec.incarnation, new_state, cur.announcement)
                self._enqueue(rec.node_id)
            elif (rec.state is PeerState.LEFT and sender == rec.node_id) or (
                cur.state is PeerState.SUSPECT and peer.own_probe_failed
            ):
                self._tombstone(rec.node_id, rec.incarnation, rec.state, now)
            else:  # an unverified death claim: suspect, and let our own probe decide
                peer.death_claim = rec
                if cur.state is PeerState.ALIVE:
                    self._suspect(peer, now, origin=sender)
                else:
                    self._start_probe(rec.node_id, now)

    @staticmethod
    def _beyond_announced(rec: PeerRecord, peer: PeerEntry | None) -> bool:
        """True if a third party's claim names an incarnation far above the highest the subject
        itself has signed (in the record, or in what we hold); unknown subjects are only capped."""
        said = [a.incarnation for a in (rec.announcement, peer.record.announcement if peer else None) if a is not None]
        return bool(said) and rec.incarnation > max(said) + MAX_INCARNATION_LEAD

    def _learn(self, rec: PeerRecord, sender: str, now: float) -> None:
        if len(self._peers) >= self.config.max_peers and not self._evict_tombstone():
            self.rejected["over_max_peers"] += 1
            return
        if rec.state.is_member:
            alive = PeerRecord(
                rec.node_id, rec.incarnation, transition(PeerState.UNKNOWN, Trigger.ALIVE), rec.announcement
            )
            peer = self._peers[rec.node_id] = PeerEntry(alive, last_seen=now if sender == rec.node_id else None)
            self._ring = self._member_ids = None
            assert rec.announcement is not None  # a member's record carries it (PeerRecord.__post_init__)
            self._out.append(PeerJoined(rec.node_id, rec.incarnation, rec.announcement))
            self._enqueue(rec.node_id)
            if rec.state is PeerState.SUSPECT:
                self._suspect(peer, now, origin=sender)
            return
        trig = Trigger.LEAVE if rec.state is PeerState.LEFT else Trigger.CONFIRM
        transition(PeerState.UNKNOWN, trig)
        self._peers[rec.node_id] = PeerEntry(rec)
        self._tomb_deadlines[rec.node_id] = now + self.config.tombstone_ttl
        self._enqueue(rec.node_id)

    def _new_announcement(self, peer: PeerEntry, ann: Announcement, now: float) -> None:
        cur = peer.record
        pid = cur.node_id
        if ann.incarnation > cur.incarnation or (ann.incarnation == cur.incarnation and cur.state.is_member):
            was = cur.state
            state = transition(was, Trigger.ALIVE) if ann.incarnation > cur.incarnation else was
            peer.record = PeerRecord(pid, ann.incarnation, state, ann)
            if ann.incarnation > cur.incarnation:
                peer.own_probe_failed = False
                peer.death_claim = None
                self._suspicions.pop(pid, None)
                self._tomb_deadlines.pop(pid, None)
                self._told.pop(pid, None)
            if was.is_tombstone:
                self._ring = self._member_ids = None
                self._out.append(PeerJoined(pid, ann.incarnation, ann))
            elif was is PeerState.SUSPECT and state is PeerState.ALIVE:
                self._out.append(PeerRecovered(pid, ann.incarnation))
                self._out.append(PeerUpdated(pid, ann.incarnation, ann))
            else:
                self._out.append(PeerUpdated(pid, ann.incarnation, ann))
        else:  # an older life's announcement on a tombstone: keep it for the status view
            peer.record = PeerRecord(pid, cur.incarnation, cur.state, ann)
        self._enqueue(pid)

    def _suspect(self, peer: PeerEntry, now: float, *, origin: str) -> None:
        """Suspect a member; `origin` is whom we heard it from (ourselves after our own probe)."""
        rec = peer.record
        peer.record = PeerRecord(rec.node_id, rec.incarnation, transition(rec.state, Trigger.SUSPECT), rec.announcement)
        if rec.node_id not in self._suspicions:
            n = len(self._members_sorted()) + 1
            low, high = self.config.suspicion_bounds(n)
            k = self.config.suspicion_confirmations
            self._suspicions[rec.node_id] = Suspicion(now, low, high, k if n - 2 >= k else 0, origin)
            self._out.append(PeerSuspected(rec.node_id, rec.incarnation))
        self._enqueue(rec.node_id)
        self._start_probe(rec.node_id, now)

    def _tombstone(self, peer_id: str, incarnation: int | None, state: PeerState, now: float) -> None:
        peer = self._peers[peer_id]
        rec = peer.record
        inc = rec.incarnation if incarnation is None else max(incarnation, rec.incarnation)
        new = transition(rec.state, Trigger.LEAVE if state is PeerState.LEFT else Trigger.CONFIRM)
        peer.record = PeerRecord(peer_id, inc, new, rec.announcement)
        peer.death_claim = None
        self._suspicions.pop(peer_id, None)
        self._tomb_deadlines[peer_id] = now + self.config.tombstone_ttl
        self._probes.end_target(peer_id)
        self._ring = self._member_ids = None
        self._out.append((PeerLeft if new is PeerState.LEFT else PeerDied)(peer_id, inc))
        self._enqueue(peer_id)

    def _forget(self, peer_id: str) -> None:
        transition(self._peers[peer_id].record.state, Trigger.EXPIRE)
        del self._peers[peer_id]
        self._tomb_deadlines.pop(peer_id, None)
        self._told.pop(peer_id, None)
        self._broadcasts.discard(peer_id)

    def _evict_tombstone(self) -> bool:
        if not self._tomb_deadlines:
            return False
        self._forget(min(self._tomb_deadlines, key=self._tomb_deadlines.__getitem__))
        return True

    def _about_me(self, incarnation: int, state: PeerState) -> None:
        """Refute a suspicion/death of us, or a claim of a newer life of ours, by out-incarnating it."""
        if incarnation < self.incarnation or (state is PeerState.ALIVE and incarnation == self.incarnation):
            return
        self.refutations += 1
        if state is not PeerState.ALIVE:
            self.health.apply(1)  # Lifeguard: others could not hear from us in time
        self._ann = self._sign(replace(self._ann, incarnation=incarnation + 1, seq=self._ann.seq + 1))
        self._enqueue(self.node_id)
