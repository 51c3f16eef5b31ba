"""What a relay allows (sans-IO, time injected): reservations with a TTL, circuits, a byte-rate cap.

:class:`RelayLimits` names every bound; :class:`RelayBook` decides reservations and circuits and
counts refusals. No one member can take the whole relay: reservations are capped per remote
address (sybil node ids from one host), circuits per source node and per source address (a
member holding every circuit idle), and the server closes a circuit idle for ``circuit_idle_s``; :class:`TokenBucket` paces the relay's bytes (one bucket per relay: the cap is on
what this node gives away in total, whatever the number of circuits).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["DEFAULT_RELAY_BYTES_PER_S", "Circuit", "RelayBook", "RelayLimits", "RelayRefused", "TokenBucket"]

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
    max_reservations_per_address: int = 16
    """Reservations from links that come from one IP address (sybil node ids on one host)."""
    max_circuits_per_source: int = 4
    """Relayed streams one dialling node has open at once (a quarter of ``max_circuits``)."""
    max_circuits_per_address: int = 8
    """Relayed streams open at once from dialling links that come from one IP address."""
    circuit_idle_s: float = 120.0
    """A circuit with no byte either way for this long is closed (a live relayed link pings every
    few seconds, so only a circuit held open for nothing is)."""
    reservation_ttl_s: float = 3600.0
    """A reservation ends after this long; the client reserves again (go-libp2p: 1 h)."""
    bytes_per_s: int = DEFAULT_RELAY_BYTES_PER_S
    burst_bytes: int = 1024 * 1024
    """Token-bucket depth: bytes that may pass at once before pacing starts."""

    def __post_init__(self) -> None:
        counts = (
            self.max_reservations,
            self.max_circuits,
            self.max_circuits_per_target,
            self.max_reservations_per_address,
            self.max_circuits_per_source,
            self.max_circuits_per_address,
        )
        if min(counts) < 1:
            raise ValueError("relay limits must allow at least one reservation and one circuit")
        if self.bytes_per_s < 1 or self.burst_bytes < 1 or self.reservation_ttl_s <= 0 or self.circuit_idle_s <= 0:
            raise ValueError("relay byte rate, burst, TTL and circuit idle time must be positive")


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


@dataclass(frozen=True)
class Circuit:
    """One admitted circuit (what :meth:`RelayBook.close_circuit` takes back)."""

    source: str
    target: str
    address: str | None = None
    """The IP address the dialler's link comes from (None: unknown, e.g. a relayed link)."""


class RelayBook:
    """Reservations by node id (each with its expiry and the address it came from) and the circuits
    open through this relay, counted per target, per source node and per source address."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._reservations: dict[str, tuple[float, str | None]] = {}  # node id -> (expires at, address)
        self._circuits: collections.Counter[str] = collections.Counter()  # target -> open circuits
        self._by_source: collections.Counter[str] = collections.Counter()  # dialling node -> open circuits
        self._by_address: collections.Counter[str] = collections.Counter()  # dialling address -> open circuits
        self.refused: collections.Counter[str] = collections.Counter()
        self.circuits_opened = 0
        self.circuits_idle_closed = 0

    @property
    def reservations(self) -> int:
        return len(self._reservations)

    @property
    def circuits(self) -> int:
        return sum(self._circuits.values())

    def _refuse(self, code: str, message: str) -> RelayRefused:
        self.refused[code] += 1
        return RelayRefused(code, message)

    def reserve(self, node_id: str, now: float, address: str | None = None) -> float:
        """Reserve (or renew) for ``node_id``, whose link comes from ``address``; its expiry time.
        RelayRefused when full, or when ``address`` already holds its share of reservations."""
        self._expire(now)
        lim = self.limits
        current = self._reservations.get(node_id)
        if current is None and len(self._reservations) >= lim.max_reservations:
            raise self._refuse("relay_full", f"{lim.max_reservations} reservations held")
        if address is not None and (current is None or current[1] != address):  # new here, or moved
            held = sum(1 for _, a in self._reservations.values() if a == address)
            if held >= lim.max_reservations_per_address:
                raise self._refuse(
                    "address_share_exceeded",
                    f"{held} reservations held from {address} (at most {lim.max_reservations_per_address})",
                )
        expires = now + lim.reservation_ttl_s
        self._reservations[node_id] = (expires, address)
        return expires

    def release(self, node_id: str, expires: float) -> None:
        """End the reservation that expires at ``expires`` (a newer one from the same node stays)."""
        held = self._reservations.get(node_id)
        if held is not None and held[0] == expires:
            del self._reservations[node_id]

    def reserved(self, node_id: str, now: float) -> bool:
        self._expire(now)
        return node_id in self._reservations

    def open_circuit(self, source: str, target: str, now: float, address: str | None = None) -> Circuit:
        """Admit a circuit from ``source`` (its link from ``address``) to ``target``; RelayRefused
        (no reservation, or limits: the relay's, the target's, the source's or its address's share)."""
        lim = self.limits
        if source == target:
            raise self._refuse("bad_target", "a node cannot relay to itself")
        if not self.reserved(target, now):
            raise self._refuse("no_reservation", "the target holds no reservation at this relay")
        if self.circuits >= lim.max_circuits:
            raise self._refuse("circuits_full", f"{lim.max_circuits} relayed streams open")
        if self._circuits[target] >= lim.max_circuits_per_target:
            raise self._refuse("target_busy", f"{lim.max_circuits_per_target} relayed streams to this node")
        if self._by_source[source] >= lim.max_circuits_per_source:
            raise self._refuse(
                "circuits_share_exceeded",
                f"this node has {lim.max_circuits_per_source} relayed streams open here (its share)",
            )
        if address is not None and self._by_address[address] >= lim.max_circuits_per_address:
            raise self._refuse(
                "circuits_share_exceeded",
                f"{lim.max_circuits_per_address} relayed streams open from {address} (its share)",
            )
        circuit = Circuit(source, target, address)
        self._circuits[target] += 1
        self._by_source[source] += 1
        if address is not None:
            self._by_address[address] += 1
        self.circuits_opened += 1
        return circuit

    def close_circuit(self, circuit: Circuit, *, idle: bool = False) -> None:
        """Give back ``circuit``'s place; ``idle``: the server closed it for carrying nothing."""
        _decrement(self._circuits, circuit.target)
        _decrement(self._by_source, circuit.source)
        if circuit.address is not None:
            _decrement(self._by_address, circuit.address)
        if idle:
            self.circuits_idle_closed += 1

    def _expire(self, now: float) -> None:
        for node_id in [n for n, (t, _) in self._reservations.items() if t <= now]:
            del self._reservations[node_id]


def _decrement(counter: collections.Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
