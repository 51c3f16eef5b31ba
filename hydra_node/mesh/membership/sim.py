"""A deterministic in-memory network of `Membership` cores in virtual time.

For tests and bench/membership_sim.py: message delay and loss, kills (a node stops sending,
receiving and ticking, like kill -9 with no TCP reset), restarts, partitions. Every message
crosses as its wire dict, so decoding is exercised too. No trio, no clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hydra_node.mesh.membership.announcement import Announcement
from hydra_node.mesh.membership.config import MembershipConfig, MembershipEvent, Send
from hydra_node.mesh.membership.core import Membership
from hydra_node.mesh.membership.state import PeerState

__all__ = ["LanDelay", "SimNetwork", "ENVELOPE_OVERHEAD_BYTES"]

ENVELOPE_OVERHEAD_BYTES = 100  # assumed link framing + AEAD tag + nonce per message
MAX_EVENTS_PER_RUN = 50_000_000  # guards a run against a core that never goes quiet


@dataclass(frozen=True)
class LanDelay:
    """One-way delay: `base` plus exponential jitter with mean `jitter` (seconds)."""

    base: float = 0.0003
    jitter: float = 0.0003

    def sample(self, rng: random.Random) -> float:
        return self.base + (rng.expovariate(1 / self.jitter) if self.jitter > 0 else 0.0)


class SimNetwork:
    """N membership cores wired through a simulated network."""

    def __init__(self, *, seed: int = 0, config: MembershipConfig | None = None,
                 delay: LanDelay = LanDelay(), loss: float = 0.0,
                 measure_bytes: bool = False) -> None:
        self.rng = random.Random(seed)
        self.config = config or MembershipConfig()
        self.delay = delay
        self.loss = loss
        self.now = 0.0
        self.nodes: dict[str, Membership] = {}
        self.down: set[str] = set()
        self.groups: dict[str, int] | None = None
        self.log: list[tuple[float, str, MembershipEvent]] = []
        self.bytes_sent: Counter[str] = Counter()
        self.messages_sent: Counter[str] = Counter()
        self._encode = None
        if measure_bytes:
            import cbor2

            self._encode = lambda wire: cbor2.dumps(wire, canonical=True)
        self._queue: list[tuple[float, int, str, str, object]] = []
        self._counter = itertools.count()
        self._tick_at: dict[str, float] = {}

    # ------------------------------------------------------------- topology
    def add_node(self, node_id: str, *, seeds: Iterable[str] = (), incarnation: int = 0,
                 announcement: Announcement | None = None) -> Membership:
        ann = announcement or Announcement(node_id=node_id, incarnation=incarnation,
                                           addresses=(f"10.0.0.{len(self.nodes) % 250 + 1}:7946",))
        core = Membership(ann, self.config, random.Random(self.rng.random()), now=self.now)
        self.nodes[node_id] = core
        self.down.discard(node_id)
        self._process(node_id, core.join(list(seeds)))
        self._schedule(node_id)
        return core

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

    def send_as(self, sender: str, to: str, message: object) -> None:
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

    def all_see(self, peer: str, states: tuple[PeerState, ...], observers: Iterable[str] | None = None) -> bool:
        obs = [n for n in (self.live() if observers is None else observers) if n != peer]
        return all(self.state(o, peer) in states for o in obs)

    def events_of(self, kind: type, peer: str | None = None) -> list[tuple[float, str, MembershipEvent]]:
        return [e for e in self.log if isinstance(e[2], kind) and (peer is None or e[2].peer_id == peer)]

    # ------------------------------------------------------------- running
    def run_for(self, seconds: float, *, until: Callable[[], bool] | None = None,
                check_every: float = 0.05) -> float | None:
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
            if kind == "tick":
                if node in self.down or self._tick_at.get(node) != at:
                    continue
                del self._tick_at[node]
                core = self.nodes[node]
                self._process(node, core.tick(self.now))
                if core.next_deadline() <= self.now:
                    raise RuntimeError(f"{node}: next_deadline did not advance past {self.now}")
            else:
                sender, wire = payload  # already in flight: only the receiver and partitions matter
                if node in self.down or self._partitioned(sender, node):
                    continue
                self._process(node, self.nodes[node].on_message(sender, wire, self.now))
            self._schedule(node)
        raise RuntimeError("simulation did not finish; a core keeps producing work")

    def _process(self, node: str, actions: list) -> None:
        for action in actions:
            if not isinstance(action, Send):
                self.log.append((self.now, node, action))
                continue
            if node in self.down:
                continue
            self._transmit(node, action.to, action.message)

    def _transmit(self, node: str, to: str, message: object) -> None:
        wire = message.to_wire()
        self.messages_sent[node] += 1
        if self._encode is not None:
            self.bytes_sent[node] += len(self._encode(wire)) + ENVELOPE_OVERHEAD_BYTES
        if to not in self.nodes or not self.can_talk(node, to):
            return
        if self.loss and self.rng.random() < self.loss:
            return
        at = self.now + self.delay.sample(self.rng)
        heapq.heappush(self._queue, (at, next(self._counter), "msg", to, (node, wire)))

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
