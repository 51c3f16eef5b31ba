"""Lifeguard in the SWIM core: local health, nacks, and suspicions that need confirmations.

A mixin of `core.Membership` (Dadgar et al. 2018, arXiv 1707.00788; memberlist's awareness.go
and suspicion.go). Three parts:

* **Local health** (`health.LocalHealth`): evidence that *we* are slow (missed nacks, failed
  probes with nobody to ask, refuting a suspicion of ourselves, timers waking late as reported
  by the driver through `note_local_lag`) stretches our probe timeouts and protocol period by
  the multiplier; each successful probe lowers it.
* **Nacks**: a helper serving our PingReq sends `Nack` when the target has not acked after
  `NACK_FRACTION` of its indirect timeout, so a failed probe with nacks is the target's fault
  and one without is ours.
* **Suspicion confirmations**: when our own probe fails we tell `gossip_fanout` members with a
  `Suspect` message; each such first-hand report shortens that suspicion toward its minimum
  (`suspicion.Suspicion`).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING

from hydra_node.mesh.membership.changes import PeerEntry
from hydra_node.mesh.membership.config import MembershipConfig
from hydra_node.mesh.membership.health import LocalHealth
from hydra_node.mesh.membership.messages import Message, Nack, Suspect
from hydra_node.mesh.membership.probes import Probe, ProbeTable
from hydra_node.mesh.membership.state import PeerState
from hydra_node.mesh.membership.suspicion import Suspicion

__all__ = ["Lifeguard", "RTT_TIMEOUT_MULT", "MAX_PROBE_TIMEOUT_S"]

#: A direct probe waits at least this many smoothed round trips to its target (a far or relayed
#: peer gets longer than the LAN default); an indirect one this many (helper + target) trips.
RTT_TIMEOUT_MULT = 3.0
#: The round-trip part of a probe timeout is capped: a stall measured once must not make a
#: peer's failure take minutes to notice (local health still multiplies the result).
MAX_PROBE_TIMEOUT_S = 3.0
RTT_GAIN = 0.2  # weight of a new round-trip sample (TCP's SRTT uses 1/8; membership samples less often)


class Lifeguard:
    """Local health, nacks and confirmations; the state is set up by `Membership.__init__`."""

    config: MembershipConfig
    node_id: str
    ignored: Counter[str]
    health: LocalHealth
    _rng: random.Random
    _peers: dict[str, PeerEntry]
    _probes: ProbeTable
    _suspicions: dict[str, Suspicion]

    if TYPE_CHECKING:  # provided by `Membership` and the sibling mixins

        def _members_sorted(self) -> list[str]: ...
        def _send(self, to: str, msg: Message, *, piggyback: bool = True) -> None: ...
        def _about_me(self, incarnation: int, state: PeerState) -> None: ...
        def _suspect(self, peer: PeerEntry, now: float, *, origin: str) -> None: ...

    def note_local_lag(self, lag_s: float, now: float) -> None:
        """The driver's timer woke `lag_s` seconds after the deadline it slept for.

        A wake at least `lag_threshold` late is evidence of a loaded host: it raises the local
        health multiplier (at most once per `probe_interval`), so we give peers longer to
        answer before suspecting them. Call it after every timer wake; cheap.
        """
        self.health.note_lag(lag_s, now)

    def _note_rtt(self, peer: PeerEntry, rtt: float) -> None:
        if rtt >= 0:
            peer.srtt = rtt if peer.srtt is None else peer.srtt + RTT_GAIN * (rtt - peer.srtt)

    def _rtt(self, peer_id: str) -> float:
        peer = self._peers.get(peer_id)
        return 0.0 if peer is None or peer.srtt is None else peer.srtt

    def _direct_timeout(self, target: str) -> float:
        """Wait for a direct ack: the configured timeout, or longer for a far peer; times health."""
        rtt_part = min(MAX_PROBE_TIMEOUT_S, RTT_TIMEOUT_MULT * self._rtt(target))
        return self.health.scale(max(self.config.probe_timeout, rtt_part))

    def _indirect_timeout(self, target: str, helpers: tuple[str, ...]) -> float:
        """Wait for a forwarded ack: our trip to the slowest helper plus its trip to the target."""
        trip = max((self._rtt(h) for h in helpers), default=0.0) + self._rtt(target)
        rtt_part = min(MAX_PROBE_TIMEOUT_S, RTT_TIMEOUT_MULT * trip)
        return self.health.scale(max(self.config.indirect_timeout, rtt_part))

    def _probe_failed_health(self, probe: Probe) -> None:
        """Lifeguard's score change for a failed probe: one per missing nack; one if there was
        no helper to ask, but only for the first failure (a suspect probed again and again says
        nothing new about us)."""
        expected = len(probe.helpers)
        if expected:
            self.health.apply(expected - len(probe.nacks & set(probe.helpers)))
        elif (peer := self._peers.get(probe.target)) is not None and peer.record.state is PeerState.ALIVE:
            self.health.apply(1)

    def _on_nack(self, sender: str, msg: Nack, now: float) -> None:
        probe = self._probes.get(msg.probe_id)
        if probe is None or not probe.indirect or sender not in probe.helpers:
            self.ignored["unmatched_nack"] += 1
            return
        probe.nacks.add(sender)

    def _send_nacks(self, now: float) -> None:
        for fwd in self._probes.due_nacks(now):
            self._send(fwd.requester, Nack(fwd.their_probe_id), piggyback=False)

    def _tell_confirmations(self, target: str, incarnation: int) -> None:
        """Our own probe of `target` failed: tell a few members (first-hand, never relayed),
        first whoever told us of the suspicion (likely its origin, whose timer runs first)."""
        members = [i for i in self._members_sorted() if i != target]
        told = self._suspicions.get(target)
        first = () if told is None or told.origin in (self.node_id, target) else (told.origin,)
        rest = [i for i in members if i not in first]
        for to in (*first, *self._rng.sample(rest, min(self.config.gossip_fanout, len(rest)))):
            self._send(to, Suspect(target, incarnation), piggyback=False)

    def _on_suspect(self, sender: str, msg: Suspect, now: float) -> None:
        if msg.target == self.node_id:
            self._about_me(msg.incarnation, PeerState.SUSPECT)
            return
        peer = self._peers.get(msg.target)
        if peer is None or not peer.record.state.is_member or msg.incarnation != peer.record.incarnation:
            self.ignored["stale_suspect"] += 1
            return
        if peer.record.state is PeerState.ALIVE:
            self._suspect(peer, now, origin=sender)
            return
        self._confirm(msg.target, sender)

    def _confirm(self, peer_id: str, node: str) -> None:
        suspicion = self._suspicions.get(peer_id)
        if suspicion is not None:
            suspicion.confirm(node)
