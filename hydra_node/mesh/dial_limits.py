"""How often, how many at once and in which direction this node dials peers (sans-IO: time and
randomness injected).

A member's gossip can introduce any number of peers with addresses of its choosing, and a mass
start introduces every node to every other at the same instant; without bounds, every node
would dial whatever hosts those announcements name, all at once. The rules:

* **Per peer**: after a failed dial, the next dial of that peer waits a jittered exponential
  back-off (``hydra_node.backoff.Backoff``: ``base_backoff_s`` doubling per further failure up
  to ``max_backoff_s``, ± ``backoff_jitter``), so peers that failed together do not retry
  together; a link resets it.
* **Never-linked peers**: dials of peers we never had a link with draw from a token bucket
  (``new_peer_burst`` dials, refilled at ``new_peer_rate_per_s``), so a flood of introduced
  peers costs at most that many dials per second, mesh-wide for this node.
* **At once**: at most ``max_concurrent`` dials (connect + handshake) run at the same time; the
  rest queue (the link table holds the slots).
* **Direction**: the node with the smaller id of a pair is the one to dial. When a new member
  appears, it links to it ahead of need after a random delay of up to ``predial_spread_s`` (a
  mass join spreads its handshakes over time). The other side, needing a link to a peer it was
  never linked with, first gives that peer ``inbound_grace_s`` (+ up to as much again, random)
  to dial in, and dials itself only if no link came (the peer may not know us yet). So a pair
  rarely opens two links at once, and a mass join costs about one handshake per pair. A peer
  we were linked with before is redialled at once (a lost link is a failure signal).

Deferred dials are counted; the caller treats a deferred dial as an unreachable peer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra_node.backoff import Backoff

__all__ = ["DialLimits", "DialLimiter", "inbound_wait", "predial_delay"]


@dataclass(frozen=True)
class DialLimits:
    base_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    backoff_jitter: float = 0.25  # each back-off is drawn from ±25 % of its nominal value
    new_peer_burst: float = 64.0
    new_peer_rate_per_s: float = 2.0
    max_tracked: int = 4096  # peers remembered (failures, linked); the oldest are forgotten first
    #: Dials in progress at once: a handshake costs a few ms of CPU on an idle host but far more
    #: under load, and dozens at once starve the event loop that must answer probes in time.
    max_concurrent: int = 4
    #: Longest random delay before linking a newly learned member ahead of need (seconds).
    predial_spread_s: float = 2.0
    #: How long the larger id waits (at least; up to twice, random) for a never-linked peer to
    #: dial it before dialling itself: covers the peer's predial spread.
    inbound_grace_s: float = 2.0

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.predial_spread_s < 0 or self.inbound_grace_s < 0:
            raise ValueError(
                f"predial_spread_s and inbound_grace_s must be >= 0, got "
                f"{self.predial_spread_s}, {self.inbound_grace_s}"
            )

    @property
    def backoff(self) -> Backoff:
        return Backoff(initial_s=self.base_backoff_s, factor=2.0, max_s=self.max_backoff_s, jitter=self.backoff_jitter)


def predial_delay(our_id: str, peer_id: str, u: float, limits: DialLimits) -> float | None:
    """Seconds to wait before linking a newly learned member ahead of need, or None when the
    member is the one to dial (the smaller id dials; both sides compute the same answer).
    ``u`` is uniform in [0, 1)."""
    if peer_id == our_id or peer_id < our_id:
        return None
    return u * limits.predial_spread_s


def inbound_wait(our_id: str, peer_id: str, u: float, limits: DialLimits) -> float:
    """Seconds to wait for ``peer_id`` to link to us before dialling it on demand: 0 when we are
    the side to dial, else ``inbound_grace_s * (1 + u)`` (``u`` uniform in [0, 1)). Only for
    peers never linked with (the caller checks :meth:`DialLimiter.was_linked`)."""
    if predial_delay(our_id, peer_id, u, limits) is not None or peer_id == our_id:
        return 0.0
    return limits.inbound_grace_s * (1.0 + u)


@dataclass
class DialLimiter:
    limits: DialLimits = field(default_factory=DialLimits)
    deferred: int = 0
    _next_ok: dict[str, float] = field(default_factory=dict)  # peer -> earliest next dial (after failures)
    _failures: dict[str, int] = field(default_factory=dict)
    _linked: dict[str, None] = field(default_factory=dict)  # peers we had a link with (insertion-ordered)
    _tokens: float | None = None
    _refilled_at: float = 0.0

    def allow(self, peer_id: str, now: float) -> bool:
        """True (and the dial is charged) if ``peer_id`` may be dialled now; else counted as deferred."""
        if now < self._next_ok.get(peer_id, float("-inf")):
            self.deferred += 1
            return False
        if peer_id not in self._linked:
            tokens = self._refill(now)
            if tokens < 1.0:
                self.deferred += 1
                return False
            self._tokens = tokens - 1.0
        return True

    def failed(self, peer_id: str, now: float, u: float = 0.5) -> float:
        """A dial of ``peer_id`` failed at ``now``; returns the back-off before the next one
        (``u`` uniform in [0, 1) draws the jitter; 0.5 gives the nominal delay)."""
        n = self._failures.pop(peer_id, 0) + 1
        self._failures[peer_id] = n
        delay = self.limits.backoff.delay(n - 1, u)
        self._next_ok[peer_id] = now + delay
        self._trim(self._failures)
        self._trim(self._next_ok)
        return delay

    def was_linked(self, peer_id: str) -> bool:
        """True if we had a link with ``peer_id`` (among the last ``max_tracked`` peers)."""
        return peer_id in self._linked

    def linked(self, peer_id: str) -> None:
        self._failures.pop(peer_id, None)
        self._next_ok.pop(peer_id, None)
        self._linked.pop(peer_id, None)
        self._linked[peer_id] = None
        self._trim(self._linked)

    def _refill(self, now: float) -> float:
        """Top up the new-peer bucket to ``now``; returns the tokens it holds."""
        lim = self.limits
        if self._tokens is None:
            self._tokens, self._refilled_at = lim.new_peer_burst, now
            return self._tokens
        self._tokens = min(lim.new_peer_burst, self._tokens + (now - self._refilled_at) * lim.new_peer_rate_per_s)
        self._refilled_at = now
        return self._tokens

    def _trim(self, table: dict) -> None:
        while len(table) > self.limits.max_tracked:
            del table[next(iter(table))]
