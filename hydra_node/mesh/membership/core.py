"""`Membership`: the sans-IO SWIM core (probe, ping-req, suspect, refute, gossip, anti-entropy).

Inputs take `now` (seconds, any monotonic origin); every input returns a list of actions:
`Send(to, message)` for the driver to deliver and membership events for the node. The core
never reads a clock, never sleeps and draws randomness only from the injected `random.Random`.
See docs/membership.md for the algorithm and the detection bound.

The class is split by job over sibling modules (see the class docstring); this module holds
its public inputs and views, the timers and probing.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from hydra_node.mesh.membership.announcement import Announcement, InvalidMessage, LocalMembershipError
from hydra_node.mesh.membership.antientropy import AntiEntropy
from hydra_node.mesh.membership.broadcast import BroadcastQueue
from hydra_node.mesh.membership.changes import PeerChanges, PeerEntry
from hydra_node.mesh.membership.config import Action, MembershipConfig
from hydra_node.mesh.membership.dissemination import Dissemination
from hydra_node.mesh.membership.handlers import MessageHandlers
from hydra_node.mesh.membership.health import LocalHealth
from hydra_node.mesh.membership.lifeguard import Lifeguard
from hydra_node.mesh.membership.messages import (
    DigestSync,
    Gossip,
    Leave,
    Message,
    PeerRecord,
    Ping,
    PingReq,
    Sync,
    decode_message,
)
from hydra_node.mesh.membership.probes import Probe, ProbeTable
from hydra_node.mesh.membership.state import PeerState
from hydra_node.mesh.membership.stats import MembershipStatistics, PeerStatus
from hydra_node.mesh.membership.suspicion import Suspicion

__all__ = ["Membership"]

INF = math.inf


class Membership(MessageHandlers, PeerChanges, Dissemination, Lifeguard, AntiEntropy):
    """Sans-IO membership of one node. Drive it with `tick(now)` at `next_deadline()`.

    This module holds the inputs, views and timers; the message handlers, the merge and state
    changes, the dissemination, Lifeguard (local health, nacks, confirmations) and the bounded
    anti-entropy live in the `handlers`, `changes`, `dissemination`, `lifeguard` and
    `antientropy` mixins, which share the state set up here.
    """

    def __init__(
        self,
        announcement: Announcement,
        config: MembershipConfig | None = None,
        rng: random.Random | None = None,
        *,
        now: float = 0.0,
        verify: Callable[[Announcement], bool] | None = None,
        sign: Callable[[Announcement], Announcement] | None = None,
    ) -> None:
        if not isinstance(announcement, Announcement):
            raise LocalMembershipError("announcement must be an Announcement")
        self.config = config or MembershipConfig()
        self.node_id = announcement.node_id
        self._rng = rng or random.Random()
        self._verify = verify  # checks the originator's signature on relayed announcements
        self._sign = sign or (lambda a: a)  # re-signs our announcement whenever the core re-stamps it
        self._ann = self._sign(announcement)
        self._left = False
        self._peers: dict[str, PeerEntry] = {}
        self._suspicions: dict[str, Suspicion] = {}
        self._hash_cache: dict[str, tuple[tuple[int, str, int], int, int]] = {}
        self.health = LocalHealth(
            self.config.awareness_max_multiplier, self.config.lag_threshold, self.config.probe_interval
        )
        self._tomb_deadlines: dict[str, float] = {}
        self._probes = ProbeTable(self.config.max_forwarded_probes)
        self._broadcasts = BroadcastQueue()
        self._rr: list[str] = []
        self._ring: list[str] | None = None
        self._member_ids: list[str] | None = None  # sorted member ids; None when membership changed
        self._member_set: frozenset[str] = frozenset()
        self._seeds: tuple[str, ...] = ()
        self._told: dict[str, int] = {}  # tombstoned peers told about their tombstone, at incarnation
        self._out: list[Action] = []
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.refutations = 0
        c = self.config
        self._next_probe_at = now + c.probe_interval * self._rng.random()
        self._next_gossip_at = now + c.gossip_interval
        self._next_sync_at = now + c.sync_interval * (0.5 + self._rng.random())
        self._next_reconnect_at = now + c.reconnect_interval
        self._enqueue(self.node_id)

    # ---------------------------------------------------------------- views
    @property
    def incarnation(self) -> int:
        return self._ann.incarnation

    @property
    def announcement(self) -> Announcement:
        return self._ann

    def self_record(self) -> PeerRecord:
        state = PeerState.LEFT if self._left else PeerState.ALIVE
        return PeerRecord(self.node_id, self._ann.incarnation, state, self._ann)

    def record(self, peer_id: str) -> PeerRecord | None:
        if peer_id == self.node_id:
            return self.self_record()
        peer = self._peers.get(peer_id)
        return None if peer is None else peer.record

    def state_of(self, peer_id: str) -> PeerState:
        rec = self.record(peer_id)
        return PeerState.UNKNOWN if rec is None else rec.state

    def members(self) -> dict[str, Announcement]:
        """Alive and suspect peers (not us) and their announcements."""
        # (a member's record always carries its announcement: PeerRecord.__post_init__)
        return {
            i: ann
            for i, p in self._peers.items()
            if p.record.state.is_member and (ann := p.record.announcement) is not None
        }

    def _members_sorted(self) -> list[str]:
        """Member ids, sorted; cached until the member set changes (reset with `_ring`)."""
        if self._member_ids is None:
            self._member_ids = sorted(i for i, p in self._peers.items() if p.record.state.is_member)
            self._member_set = frozenset(self._member_ids)
        return self._member_ids

    def peer_states(self) -> dict[str, str]:
        """Peer id → state name ("alive", "suspect", ...) of every peer we know (not us)."""
        return {i: p.record.state.value for i, p in self._peers.items()}

    def statistics(self, now: float) -> MembershipStatistics:
        peers = tuple(
            PeerStatus.of(i, p.record, None if p.last_seen is None else max(0.0, now - p.last_seen))
            for i, p in sorted(self._peers.items())
        )
        return MembershipStatistics(
            node_id=self.node_id,
            incarnation=self.incarnation,
            left=self._left,
            peers=peers,
            sent=dict(self.sent),
            received=dict(self.received),
            rejected=dict(self.rejected),
            ignored=dict(self.ignored),
            refutations=self.refutations,
            local_health=self.health.score,
        )

    def next_deadline(self) -> float:
        """When `tick` must next be called (math.inf after leaving)."""
        if self._left:
            return INF
        times = [self._next_probe_at, self._next_sync_at]
        if self._broadcasts:
            times.append(self._next_gossip_at)
        if self._seeds or any(p.record.state is PeerState.DEAD for p in self._tomb_peers()):
            times.append(self._next_reconnect_at)
        times.extend(self._probes.deadlines())
        times.extend(s.deadline_for(self.health.multiplier) for s in self._suspicions.values())
        times.extend(self._tomb_deadlines.values())
        return min(times)

    # ---------------------------------------------------------------- inputs
    def join(self, seed_ids: Iterable[str]) -> list[Action]:
        """Contact seeds with our record and digest; retried every reconnect_interval until a peer answers."""
        self._require_not_left()
        self._seeds = tuple(s for s in dict.fromkeys(seed_ids) if s != self.node_id)
        for seed in self._seeds:
            self._send(seed, self._sync_message())
        return self._take()

    def leave(self) -> list[Action]:
        """Clean shutdown: tell every member; afterwards the core ignores all input."""
        if self._left:
            return []
        self._left = True
        for peer_id in self.members():
            self._send(peer_id, Leave(self.incarnation))
        self._probes.clear()
        return self._take()

    def local_update(self, announcement: Announcement) -> list[Action]:
        """Publish a new self-description; the core stamps our incarnation and the next seq."""
        self._require_not_left()
        if announcement.node_id != self.node_id:
            raise LocalMembershipError(f"announcement is for {announcement.node_id!r}, we are {self.node_id!r}")
        self._ann = self._sign(replace(announcement, incarnation=self._ann.incarnation, seq=self._ann.seq + 1))
        self._enqueue(self.node_id)
        self._flush()
        return self._take()

    def link_up(self, peer_id: str, now: float) -> list[Action]:
        """Transport hint: a link to the peer came up. A dead or unknown peer gets our digest."""
        if not self._left and peer_id != self.node_id and not self.state_of(peer_id).is_member:
            self._send(peer_id, self._link_sync())
        return self._take()

    def link_down(self, peer_id: str, now: float) -> list[Action]:
        """Transport hint: a link broke. Probe the peer now instead of waiting for its turn."""
        peer = self._peers.get(peer_id)
        if not self._left and peer is not None and peer.record.state.is_member:
            self._start_probe(peer_id, now)
        return self._take()

    def on_message(self, sender_id: str, msg: Message | Mapping[str, Any], now: float) -> list[Action]:
        """Handle one message from `sender_id` (a message object or its wire dict)."""
        if self._left:
            self.ignored["after_leave"] += 1
            return []
        if sender_id == self.node_id or not isinstance(sender_id, str) or not sender_id:
            self.rejected["bad_sender"] += 1
            return []
        if not hasattr(msg, "TYPE"):
            try:
                msg = decode_message(msg)
            except InvalidMessage:
                self.rejected["invalid"] += 1
                return []
        self.received[msg.TYPE] += 1
        peer = self._peers.get(sender_id)
        if peer is not None and peer.record.state.is_member:
            peer.last_seen = now
        if isinstance(msg, Leave):
            self._on_leave(sender_id, msg, now)
            self._flush()
            return self._take()
        if isinstance(msg, Ping) and msg.view is not None and msg.view.node_id == self.node_id:
            self._about_me(msg.view.incarnation, msg.view.state)
        if isinstance(msg, (Sync, DigestSync)):
            for entry in msg.digest:
                if entry.node_id == self.node_id:
                    self._about_me(entry.incarnation, entry.state)
        for rec in getattr(msg, "records", ()):
            self._apply(rec, sender_id, now)
        handler = getattr(self, f"_on_{msg.TYPE}")
        handler(sender_id, msg, now)
        return self._finish(sender_id)

    def tick(self, now: float) -> list[Action]:
        """Run every timer that is due at `now`."""
        if self._left:
            return []
        c = self.config
        for probe in self._probes.due(now):
            self._probe_timer(probe, now)
        for peer_id, suspicion in list(self._suspicions.items()):  # after probes: they confirm
            if suspicion.deadline_for(self.health.multiplier) <= now:
                self._tombstone(peer_id, None, PeerState.DEAD, now)
        self._send_nacks(now)
        self._probes.expire_forwards(now)
        for peer_id, deadline in list(self._tomb_deadlines.items()):
            if deadline <= now:
                self._forget(peer_id)
        if now >= self._next_probe_at:
            self._next_probe_at = _advance(self._next_probe_at, self.health.scale(c.probe_interval), now)
            for target in self._period_targets():
                self._start_probe(target, now)
        if now >= self._next_gossip_at:
            self._next_gossip_at = _advance(self._next_gossip_at, c.gossip_interval, now)
            self._gossip_round()
        if now >= self._next_sync_at:
            self._next_sync_at = _advance(self._next_sync_at, c.sync_interval, now)
            members = self._members_sorted()
            if members:
                self._send(self._rng.choice(members), self._digest_sync())
        if now >= self._next_reconnect_at:
            self._next_reconnect_at = _advance(self._next_reconnect_at, c.reconnect_interval, now)
            self._reconnect()
        self._flush()
        return self._take()

    # ---------------------------------------------------------------- probing and reconnecting
    def _period_targets(self) -> list[str]:
        ids = self._members_sorted()
        members = self._member_set
        if not ids:
            return []
        if self._ring is None:
            self._ring = sorted([*members, self.node_id])
        ring = self._ring
        at = ring.index(self.node_id)
        targets = [ring[(at + k) % len(ring)] for k in range(1, min(self.config.ring_monitors, len(ring) - 1) + 1)]
        for _ in range(len(members) + 1):
            if not self._rr:
                self._rr = [i for i, p in self._peers.items() if p.record.state.is_member]
                self._rng.shuffle(self._rr)
            candidate = self._rr.pop()
            if candidate in members and candidate not in targets:
                targets.append(candidate)
                break
        return targets

    def _start_probe(self, target: str, now: float) -> None:
        probe = self._probes.start(target, now + self._direct_timeout(target))
        if probe is not None:
            probe.sent_at = now
            self._send(target, Ping(probe.probe_id, self._peers[target].record.digest()))

    def _probe_timer(self, probe: Probe, now: float) -> None:
        if probe.target not in self._peers or not self._peers[probe.target].record.state.is_member:
            self._probes.end(probe)
            return
        if not probe.indirect:
            candidates = [i for i in self._members_sorted() if i != probe.target]
            helpers = tuple(self._rng.sample(candidates, min(self.config.indirect_probes, len(candidates))))
            probe.indirect, probe.helpers = True, helpers
            probe.deadline = now + self._indirect_timeout(probe.target, helpers)
            view = self._peers[probe.target].record.digest()
            for helper in helpers:
                self._send(helper, PingReq(probe.probe_id, probe.target, view))
            return
        self._probes.end(probe)
        self._probe_failed_health(probe)
        peer = self._peers.get(probe.target)
        if peer is None or not peer.record.state.is_member:
            return
        if not peer.own_probe_failed:  # once per failing streak: repeats add no new evidence
            self._tell_confirmations(probe.target, peer.record.incarnation)
        peer.own_probe_failed = True
        claim = peer.death_claim
        if claim is not None and peer.record.state is PeerState.SUSPECT:
            self._tombstone(probe.target, claim.incarnation, claim.state, now)
        elif peer.record.state is PeerState.ALIVE:
            self._suspect(peer, now, origin=self.node_id)
        else:
            self._confirm(probe.target, self.node_id)

    def _tomb_peers(self) -> list[PeerEntry]:
        return [self._peers[i] for i in self._tomb_deadlines if i in self._peers]

    def _reconnect(self) -> None:
        if not self._members_sorted() and self._seeds:
            for seed in self._seeds:
                self._send(seed, self._sync_message())
            return
        self._seeds = ()
        dead = sorted(i for i in self._tomb_deadlines if self._peers[i].record.state is PeerState.DEAD)
        if dead:
            self._send(self._rng.choice(dead), self._digest_sync())

    # ---------------------------------------------------------------- output
    def _finish(self, sender: str) -> list[Action]:
        peer = self._peers.get(sender)
        if peer is not None and peer.record.state.is_tombstone and self._told.get(sender) != peer.record.incarnation:
            self._told[sender] = peer.record.incarnation  # tell it: it refutes if it is in fact alive
            self._send(sender, Gossip((peer.record,)), piggyback=False)
        self._flush()
        return self._take()

    def _take(self) -> list[Action]:
        out, self._out = self._out, []
        return out

    def _require_not_left(self) -> None:
        if self._left:
            raise LocalMembershipError("this membership has left the mesh")


def _advance(at: float, interval: float, now: float) -> float:
    at += interval
    return at if at > now else now + interval
