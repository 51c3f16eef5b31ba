"""What a relay allows (sans-IO, time injected): reservations with a TTL, circuits, a byte-rate cap.

:class:`RelayLimits` names every bound; :class:`RelayBook` decides reservations and circuits and
counts refusals; :class:`TokenBucket` paces the relay's bytes (one bucket per relay: the cap is on
what this node gives away in total, whatever the number of circuits).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["DEFAULT_RELAY_BYTES_PER_S", "RelayBook", "RelayLimits", "RelayRefused", "TokenBucket"]

DEFAULT_RELAY_BYTES_PER_S = 4 * 1024 * 1024
"""Bytes per second a relay forwards by default, all circuits together (4 MiB/s: token streams are
small; a layer-split activation stream is not meant to go through someone else's relay)."""


@dataclass(frozen=True)
class RelayLimits:
    max_reservations: int = 64
    """Nodes that may hold a reservation here at once (go-libp2p: 128)."""
    max_circuits: int = 16
    """Relayed streams in flight at once, all reservations together (go-libp2p: 16)."""
    max_circuits_per_target: int = 8
    """Relayed streams to one reserved node at once."""
    reservation_ttl_s: float = 3600.0
    """A reservation ends after this long; the client reserves again (go-libp2p: 1 h)."""
    bytes_per_s: int = DEFAULT_RELAY_BYTES_PER_S
    burst_bytes: int = 1024 * 1024
    """Token-bucket depth: bytes that may pass at once before pacing starts."""

    def __post_init__(self) -> None:
        if min(self.max_reservations, self.max_circuits, self.max_circuits_per_target) < 1:
            raise ValueError("relay limits must allow at least one reservation and one circuit")
        if self.bytes_per_s < 1 or self.burst_bytes < 1 or self.reservation_ttl_s <= 0:
            raise ValueError("relay byte rate, burst and TTL must be positive")


class RelayRefused(Exception):
    """A reservation or circuit this relay will not take; ``code`` goes into the ``refused`` reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; :meth:`take` says how long to wait before sending."""

    def __init__(self, rate: float, burst: float, now: float | None = None) -> None:
        """Full at ``now`` (None: full at the first :meth:`take`)."""
        self.rate, self.burst = float(rate), float(burst)
        self._tokens, self._at = float(burst), now

    def take(self, amount: int, now: float) -> float:
        """Spend ``amount`` tokens (may go negative); the seconds to wait before the bytes may go."""
        if self._at is None:
            self._at = now
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class RelayBook:
    """Reservations by node id (each with its expiry) and the circuits open through this relay."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._reservations: dict[str, float] = {}  # node id -> expires at
        self._circuits: collections.Counter[str] = collections.Counter()  # target -> open circuits
        self.refused: collections.Counter[str] = collections.Counter()
        self.circuits_opened = 0

    @property
    def reservations(self) -> int:
        return len(self._reservations)

    @property
    def circuits(self) -> int:
        return sum(self._circuits.values())

    def _refuse(self, code: str, message: str) -> RelayRefused:
        self.refused[code] += 1
        return RelayRefused(code, message)

    def reserve(self, node_id: str, now: float) -> float:
        """Reserve (or renew) for ``node_id``; its expiry time. RelayRefused when full."""
        self._expire(now)
        if node_id not in self._reservations and len(self._reservations) >= self.limits.max_reservations:
            raise self._refuse("relay_full", f"{self.limits.max_reservations} reservations held")
        expires = now + self.limits.reservation_ttl_s
        self._reservations[node_id] = expires
        return expires

    def release(self, node_id: str, expires: float) -> None:
        """End the reservation that expires at ``expires`` (a newer one from the same node stays)."""
        if self._reservations.get(node_id) == expires:
            del self._reservations[node_id]

    def reserved(self, node_id: str, now: float) -> bool:
        self._expire(now)
        return node_id in self._reservations

    def open_circuit(self, source: str, target: str, now: float) -> None:
        """Admit a circuit to ``target``; RelayRefused (no reservation, or limits) otherwise."""
        if source == target:
            raise self._refuse("bad_target", "a node cannot relay to itself")
        if not self.reserved(target, now):
            raise self._refuse("no_reservation", "the target holds no reservation at this relay")
        if self.circuits >= self.limits.max_circuits:
            raise self._refuse("circuits_full", f"{self.limits.max_circuits} relayed streams open")
        if self._circuits[target] >= self.limits.max_circuits_per_target:
            raise self._refuse("target_busy", f"{self.limits.max_circuits_per_target} relayed streams to this node")
        self._circuits[target] += 1
        self.circuits_opened += 1

    def close_circuit(self, target: str) -> None:
        self._circuits[target] -= 1
        if self._circuits[target] <= 0:
            del self._circuits[target]

    def _expire(self, now: float) -> None:
        for node_id in [n for n, t in self._reservations.items() if t <= now]:
            del self._reservations[node_id]
