"""A deterministic in-memory network of `Membership` cores in virtual time.

For tests and bench/membership_sim.py: per-link latency (LAN, WAN with long tails), loss, NAT
(a NATed host is reached only over links it opened or through a relay), slow event loops,
join waves, kills (a node stops sending, receiving and ticking, like kill -9 with no TCP
reset), restarts, partitions. The link model is in `simlinks.py`. Every message crosses as its
wire dict, so decoding is exercised too; its size is its CBOR length plus an assumed envelope.
No trio, no clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, cast

from hydra_node.mesh.membership.announcement import Announcement
from hydra_node.mesh.membership.config import Action, MembershipConfig, MembershipEvent, Send
from hydra_node.mesh.membership.core import Membership
from hydra_node.mesh.membership.messages import Message
from hydra_node.mesh.membership.simlinks import HostProfile, LanDelay, WanDelay, cbor_size
from hydra_node.mesh.membership.state import PeerState

__all__ = ["HostProfile", "LanDelay", "SimNetwork", "WanDelay", "ENVELOPE_OVERHEAD_BYTES"]

ENVELOPE_OVERHEAD_BYTES = 100  # assumed link framing + AEAD tag + nonce per message
RELAY_HOP_S = 0.001  # a relay's own forwarding time, on top of both links' delays
MAX_EVENTS_PER_RUN = 50_000_000  # guards a run against a core that never goes quiet
MAX_CACHED_RECORD_SIZES = 200_000  # record sizes remembered before the cache starts afresh
CALM = HostProfile()


class SimNetwork:
    """N membership cores wired through a simulated network."""

    def __init__(
        self,
        *,
        seed: int = 0,
        config: MembershipConfig | None = None,
        delay: LanDelay = LanDelay(),
        loss: float = 0.0,
        wan: WanDelay = WanDelay(),
        measure_bytes: bool = False,
        decode: bool = True,
    ) -> None:
        """`decode=False` hands receivers the (immutable) message objects instead of their wire
        dicts: the same behaviour, several times faster, for the 1,000-node bench."""
        self.rng = random.Random(seed)
        self.config = config or MembershipConfig()
        self.delay = delay
        self.wan = wan
        self.loss = loss
        self.now = 0.0
        self.nodes: dict[str, Membership] = {}
        self.profiles: dict[str, HostProfile] = {}
        self.down: set[str] = set()
        self.groups: dict[str, int] | None = None
        self.log: list[tuple[float, str, MembershipEvent]] = []
        self.bytes_sent: Counter[str] = Counter()
        self.messages_sent: Counter[str] = Counter()
        self.relayed: Counter[str] = Counter()  # messages each relay forwarded
        self.relay_bytes: Counter[str] = Counter()  # and their bytes (not in bytes_sent)
        self.unreachable = 0  # messages to a NATed host with no open link and no live relay
        self.measure_bytes = measure_bytes
        self.decode = decode
        self._record_sizes: dict[int, tuple[object, int]] = {}  # id(record) -> (record, CBOR size)
        self._open: set[tuple[str, str]] = set()  # links a NATed host opened (either order)
        self._busy_until: dict[str, float] = {}
        self._queue: list[tuple[float, int, str, str, object]] = []
        self._counter = itertools.count()
        self._tick_at: dict[str, float] = {}

    # ------------------------------------------------------------- topology
    def add_node(
        self,
        node_id: str,
        *,
        seeds: Iterable[str] = (),
        incarnation: int = 0,
        announcement: Announcement | None = None,
        profile: HostProfile | None = None,
    ) -> Membership:
        ann = announcement or Announcement(
            node_id=node_id, incarnation=incarnation, addresses=(f"10.0.0.{len(self.nodes) % 250 + 1}:7946",)
        )
        core = Membership(ann, self.config, random.Random(self.rng.random()), now=self.now)
        self.nodes[node_id] = core
        if profile is not None or node_id not in self.profiles:
            self.profiles[node_id] = profile or CALM
        for relay in self.profiles[node_id].relays:  # a NATed host keeps links to its relays
            self._open.add((node_id, relay) if node_id < relay else (relay, node_id))
        self.down.discard(node_id)
        self._process(node_id, core.join(list(seeds)))
        self._schedule(node_id)
        return core

    def schedule(self, at: float, action: Callable[[], object]) -> None:
        """Run `action()` at virtual time `at` (a join in a wave, a change of conditions)."""
        heapq.heappush(self._queue, (at, next(self._counter), "call", "", action))

    def kill(self, node_id: str) -> None:
        """Silence a node: nothing in, nothing out, no timers (a crash without a TCP reset)."""
        self.down.add(node_id)

    def restart(self, node_id: str, *, incarnation: int, seeds: Iterable[str]) -> Membership:
        return self.add_node(node_id, seeds=seeds, incarnation=incarnation)

    def leave(self, node_id: str) -> None:
        self._process(node_id, self.nodes[node_id].leave())
        self.down.add(node_id)

    def partition(self, *groups: Iterable[str]) -> None:
        self.groups = {n: i for i, g in enumerate(groups) for n in g}

    def heal(self) -> None:
        self.groups = None

    def can_talk(self, a: str, b: str) -> bool:
        return a not in self.down and b not in self.down and not self._partitioned(a, b)

    def _partitioned(self, a: str, b: str) -> bool:
        return self.groups is not None and self.groups.get(a, -1) != self.groups.get(b, -1)

    def send_as(self, sender: str, to: str, message: Message) -> None:
        """Inject `message` as if `sender` sent it now (a forged, stale or buggy peer)."""
        self._transmit(sender, to, message)

    # ------------------------------------------------------------- views
    def live(self) -> list[str]:
        return [n for n in self.nodes if n not in self.down]

    def state(self, observer: str, peer: str) -> PeerState:
        return self.nodes[observer].state_of(peer)

    def full_view(self, nodes: Iterable[str] | None = None) -> bool:
        """Every given live node sees every other given node alive."""
        ids = list(self.live() if nodes is None else nodes)
        return all(self.state(a, b) is PeerState.ALIVE for a in ids for b in ids if a != b)

    def converged(self, nodes: Iterable[str] | None = None) -> bool:
        """Like `full_view`, faster at 1,000 nodes: one states map per observer."""
        ids = list(self.live() if nodes is None else nodes)
        for a in ids:
            states = self.nodes[a].peer_states()
            if any(states.get(b) != "alive" for b in ids if b != a):
                return False
        return True

    def all_see(self, peer: str, states: tuple[PeerState, ...], observers: Iterable[str] | None = None) -> bool:
        obs = [n for n in (self.live() if observers is None else observers) if n != peer]
        return all(self.state(o, peer) in states for o in obs)

    def events_of(self, kind: type, peer: str | None = None) -> list[tuple[float, str, MembershipEvent]]:
        return [e for e in self.log if isinstance(e[2], kind) and (peer is None or e[2].peer_id == peer)]

    # ------------------------------------------------------------- running
    def run_for(
        self, seconds: float, *, until: Callable[[], bool] | None = None, check_every: float = 0.05
    ) -> float | None:
        """Advance virtual time by `seconds`.

        With `until`, stop at the first check (every `check_every` virtual seconds) where it
        holds and return that time; None if it never held.
        """
        end = self.now + seconds
        if until is not None and until():
            return self.now
        next_check = self.now + check_every if until is not None else math.inf
        for _ in range(MAX_EVENTS_PER_RUN):
            horizon = min(end, next_check)
            if not self._queue or self._queue[0][0] > horizon:
                self.now = horizon
                if horizon == next_check:
                    if until():  # type: ignore[misc]
                        return self.now
                    next_check = self.now + check_every
                if self.now >= end:
                    return None
                continue
            at, _, kind, node, payload = heapq.heappop(self._queue)
            self.now = max(self.now, at)
            self._event(kind, node, payload, at)
        raise RuntimeError("simulation did not finish; a core keeps producing work")

    def _event(self, kind: str, node: str, payload: object, at: float) -> None:
        if kind == "call":
            payload()  # type: ignore[operator]
            return
        if node in self.down:
            return
        prof = self.profiles[node]
        if kind == "tick":
            if self._tick_at.get(node) != at:
                return  # superseded by an earlier deadline
            del self._tick_at[node]
            if prof.loaded:  # the loop wakes late: run the tick later and tell the core how late
                late = self._late(node, prof)
                heapq.heappush(self._queue, (late, next(self._counter), "late_tick", node, at))
                return
            self._tick(node)
        elif kind == "late_tick":
            self.nodes[node].note_local_lag(self.now - payload, self.now)  # type: ignore[operator]
            self._tick(node)
        else:  # "msg" (arrived) or "handle" (a loaded loop gets to it now)
            sender, wire = cast(
                "tuple[str, Message | dict[str, Any]]", payload
            )  # in flight: only the receiver and partitions matter
            if self._partitioned(sender, node):
                return
            if kind == "msg" and prof.loaded:
                heapq.heappush(self._queue, (self._late(node, prof), next(self._counter), "handle", node, payload))
                return
            self._process(node, self.nodes[node].on_message(sender, wire, self.now))
        self._schedule(node)

    def _late(self, node: str, prof: HostProfile) -> float:
        """When a loaded host's loop gets to an event due now (in order: it is one loop)."""
        at = max(self.now + prof.lateness(self.rng), self._busy_until.get(node, 0.0))
        self._busy_until[node] = at
        return at

    def _tick(self, node: str) -> None:
        core = self.nodes[node]
        self._process(node, core.tick(self.now))
        if core.next_deadline() <= self.now:
            raise RuntimeError(f"{node}: next_deadline did not advance past {self.now}")

    def _process(self, node: str, actions: list[Action]) -> None:
        for action in actions:
            if not isinstance(action, Send):
                self.log.append((self.now, node, action))
                continue
            if node in self.down:
                continue
            self._transmit(node, action.to, action.message)

    def _transmit(self, node: str, to: str, message: Message) -> None:
        wire = message.to_wire() if self.decode else message
        self.messages_sent[node] += 1
        size = self._size(message) + ENVELOPE_OVERHEAD_BYTES if self.measure_bytes else 0
        self.bytes_sent[node] += size
        if to not in self.nodes or not self.can_talk(node, to):
            return
        hops = self._route(node, to)
        if hops is None:
            self.unreachable += 1
            return
        delay = 0.0
        for a, b in hops:
            if self._lost(a, b):
                return
            delay += self._link_delay(a, b)
        if len(hops) > 1:
            relay = hops[0][1]
            self.relayed[relay] += 1
            self.relay_bytes[relay] += size
            delay += RELAY_HOP_S
        heapq.heappush(self._queue, (self.now + delay, next(self._counter), "msg", to, (node, wire)))

    def _size(self, message: Message) -> int:
        """CBOR length of the message's wire form; records' sizes cached (they are re-sent often)."""
        records = getattr(message, "records", ())
        if not records:
            return cbor_size(message.to_wire())
        # (mypy types replace() on a union of dataclasses as if each lacked `records`: only the ones
        # with records get here)
        total = cbor_size(replace(message, records=()).to_wire()) - 1  # type: ignore[arg-type]
        total += cbor_size([0] * len(records)) - len(records)  # the array head
        cache = self._record_sizes
        if len(cache) > MAX_CACHED_RECORD_SIZES:
            cache.clear()
        for rec in records:
            hit = cache.get(id(rec))
            if hit is None or hit[0] is not rec:
                hit = cache[id(rec)] = (rec, cbor_size(rec.to_wire()))
            total += hit[1]
        return total

    def _route(self, a: str, b: str) -> list[tuple[str, str]] | None:
        """The hops from a to b: direct if b can be dialled or a link is open, else via a relay."""
        pb = self.profiles.get(b, CALM)
        pair = (a, b) if a < b else (b, a)
        if not pb.nat or pair in self._open:
            if self.profiles.get(a, CALM).nat and not pb.nat:
                self._open.add(pair)  # a NATed host dialled out: the link works both ways now
            return [(a, b)]
        for relay in pb.relays:
            if relay != a and self.can_talk(a, relay) and self.can_talk(relay, b):
                return [(a, relay), (relay, b)]
        return None

    def _lost(self, a: str, b: str) -> bool:
        pa, pb = self.profiles.get(a, CALM), self.profiles.get(b, CALM)
        p = 1.0 - (1.0 - self.loss) * (1.0 - pa.loss) * (1.0 - pb.loss)
        return p > 0 and self.rng.random() < p

    def _link_delay(self, a: str, b: str) -> float:
        sa, sb = self.profiles.get(a, CALM).site, self.profiles.get(b, CALM).site
        if sa is None and sb is None:
            return self.delay.sample(self.rng)
        return self.wan.sample(self.rng, sa or 0.0, sb or 0.0)

    def _schedule(self, node: str) -> None:
        if node in self.down:
            return
        deadline = self.nodes[node].next_deadline()
        if deadline <= self.now and self._tick_at.get(node) is None:
            deadline = self.now
        current = self._tick_at.get(node)
        if current is None or deadline < current:
            self._tick_at[node] = deadline
            heapq.heappush(self._queue, (deadline, next(self._counter), "tick", node, None))
