"""The simulator's link model: per-link latency, loss, NAT and relays, slow hosts.

Pure data and sampling for `sim.SimNetwork` (tests and bench/membership_sim.py); every draw
comes from the `random.Random` passed in, so a seeded run is reproducible.

* `LanDelay`: one-way base + exponential jitter (a switched LAN).
* `WanDelay`: one-way delay between two sites: a base that grows with their distance (sites sit
  on a ring of circumference 1), a log-normal multiplicative jitter, and rare Pareto spikes
  (alpha 1.5: a long tail, the bufferbloat and rerouting of real paths), capped.
* `HostProfile`: per node: its site (None: the LAN), whether it is behind NAT (cannot be dialled:
  it is reached only over a link it opened, or through one of its `relays` with the relay's
  extra hop), its own loss rate, and how loaded its event loop is (`slow`: every tick and
  message runs late by an exponential delay of this mean, plus rare `stall`s), like a busy host.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["HostProfile", "LanDelay", "WanDelay", "MAX_SPIKE_S", "cbor_size"]

MAX_SPIKE_S = 3.0  # a Pareto spike is capped here: longer is a partition, modelled apart


@dataclass(frozen=True)
class LanDelay:
    """One-way delay: `base` plus exponential jitter with mean `jitter` (seconds)."""

    base: float = 0.0003
    jitter: float = 0.0003

    def sample(self, rng: random.Random) -> float:
        return self.base + (rng.expovariate(1 / self.jitter) if self.jitter > 0 else 0.0)


@dataclass(frozen=True)
class WanDelay:
    """One-way delay between sites `a` and `b` (positions in [0, 1) on a ring)."""

    near: float = 0.005  # one-way base between neighbouring sites
    far: float = 0.120  # one-way base between antipodal sites
    sigma: float = 0.3  # log-normal sigma of the multiplicative jitter
    spike_p: float = 0.01  # share of messages that hit a spike
    spike_scale: float = 0.05  # Pareto scale of a spike (s)
    spike_alpha: float = 1.5

    def base(self, a: float, b: float) -> float:
        d = abs(a - b) % 1.0
        return self.near + 2 * min(d, 1.0 - d) * (self.far - self.near)

    def sample(self, rng: random.Random, a: float, b: float) -> float:
        delay = self.base(a, b) * rng.lognormvariate(0.0, self.sigma)
        if self.spike_p and rng.random() < self.spike_p:
            delay += min(MAX_SPIKE_S, self.spike_scale * rng.paretovariate(self.spike_alpha))
        return delay


@dataclass
class HostProfile:
    """How one simulated host is connected and how loaded it is."""

    site: float | None = None  # None: on the LAN; else a WAN site position in [0, 1)
    nat: bool = False  # cannot be dialled
    relays: tuple[str, ...] = ()  # reachable peers that relay for it (when nat)
    loss: float = 0.0  # extra loss on every message to or from this host
    slow: float = 0.0  # mean lateness (s) of each tick and message handling; 0 = calm
    stall_p: float = 0.0  # share of events that hit a stall instead
    stall_s: float = 0.0  # mean length of a stall (s)

    def lateness(self, rng: random.Random) -> float:
        if self.stall_p and rng.random() < self.stall_p:
            return rng.expovariate(1 / self.stall_s) if self.stall_s > 0 else 0.0
        return rng.expovariate(1 / self.slow) if self.slow > 0 else 0.0

    @property
    def loaded(self) -> bool:
        return self.slow > 0 or self.stall_p > 0


def _head(n: int) -> int:
    return 1 if n < 24 else 2 if n < 256 else 3 if n < 65536 else 5 if n < 2**32 else 9


def cbor_size(value: object) -> int:
    """Bytes of `value` in CBOR (canonical or not: same length), without encoding it.

    The simulator measures every message, and encoding each one with cbor2 costs ~100x more.
    Covers the wire data model (None, bool, int, text, bytes, lists, maps); checked against
    cbor2 in tests/mesh/membership/test_membership_simlinks.py.
    """
    if value is None or value is True or value is False:
        return 1
    # exact types (``type(value) is``, which also narrows for the checker): a subclass is refused
    if type(value) is int:
        return _head(value if value >= 0 else -1 - value)
    if type(value) is str:
        n = len(value) if value.isascii() else len(value.encode())
        return _head(n) + n
    if type(value) is list or type(value) is tuple:
        return _head(len(value)) + sum(map(cbor_size, value))
    if type(value) is dict:
        return _head(len(value)) + sum(cbor_size(k) + cbor_size(v) for k, v in value.items())
    if type(value) is bytes:
        return _head(len(value)) + len(value)
    raise TypeError(f"cbor_size: unsupported {type(value).__name__}")
