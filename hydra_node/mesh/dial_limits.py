"""How often this node dials peers by their announced addresses (sans-IO, time injected).

A member's gossip can introduce any number of peers with addresses of its choosing; without a
bound, every node would dial whatever hosts those announcements name. Two rules:

* **Per peer**: after a failed dial, the next dial of that peer waits ``base_backoff_s`` doubling
  with each further failure up to ``max_backoff_s``; a link resets it.
* **Never-linked peers**: dials of peers we never had a link with draw from a token bucket
  (``new_peer_burst`` dials, refilled at ``new_peer_rate_per_s``), so a flood of introduced
  peers costs at most that many dials per second, mesh-wide for this node.

Deferred dials are counted; the caller treats a deferred dial as an unreachable peer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DialLimits", "DialLimiter"]


@dataclass(frozen=True)
class DialLimits:
    base_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    new_peer_burst: float = 64.0
    new_peer_rate_per_s: float = 2.0
    max_tracked: int = 4096  # peers remembered (failures, linked); the oldest are forgotten first


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
            self._refill(now)
            if self._tokens < 1.0:
                self.deferred += 1
                return False
            self._tokens -= 1.0
        return True

    def failed(self, peer_id: str, now: float) -> None:
        n = self._failures.pop(peer_id, 0) + 1
        self._failures[peer_id] = n
        self._next_ok[peer_id] = now + min(self.limits.max_backoff_s, self.limits.base_backoff_s * 2 ** (n - 1))
        self._trim(self._failures)
        self._trim(self._next_ok)

    def linked(self, peer_id: str) -> None:
        self._failures.pop(peer_id, None)
        self._next_ok.pop(peer_id, None)
        self._linked.pop(peer_id, None)
        self._linked[peer_id] = None
        self._trim(self._linked)

    def _refill(self, now: float) -> None:
        lim = self.limits
        if self._tokens is None:
            self._tokens, self._refilled_at = lim.new_peer_burst, now
            return
        self._tokens = min(lim.new_peer_burst, self._tokens + (now - self._refilled_at) * lim.new_peer_rate_per_s)
        self._refilled_at = now

    def _trim(self, table: dict) -> None:
        while len(table) > self.limits.max_tracked:
            del table[next(iter(table))]
