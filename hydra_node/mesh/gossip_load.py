"""How the gossip driver sheds optional traffic when its own event loop runs late (pure).

On a host with too little CPU for the mesh (30 nodes started at once on 2 shared cores), every
membership message costs the sender an encoding and the receiver a strict decoding of a few kB
of announcements (about 1.5 ms of CPU for a full Gossip). A false suspicion makes its target
refute and the refutation is re-gossiped by every node, so the work feeds itself: the loops run
later, more probes time out, more suspicions follow. Lifeguard slows our probing when we are
late; this sheds the other bulk, the dissemination messages (``Gossip``), in proportion to how
late the loop runs. Probes, acks, nacks, suspicions, syncs and leaves are never shed, and
shed records still ride on probes (piggyback) and the periodic sync.

The lateness is a moving average of the timer's wake-up lag, so one late wake does not shed
and a calm loop sheds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GossipLoad", "SHEDDABLE"]

#: Message types that may be dropped under load (dissemination only).
SHEDDABLE = frozenset({"gossip"})


@dataclass
class GossipLoad:
    """``note_wake(lag)`` after each timer wake; ``shed(type, u)`` for each outgoing message."""

    #: Weight of the newest wake in the moving average of lag.
    alpha: float = 0.2
    #: Lag (s) at which half of the sheddable messages are dropped.
    half_lag_s: float = 0.2
    #: Never shed more than this fraction: some dissemination always flows.
    max_fraction: float = 0.8
    lag_avg_s: float = 0.0
    shed_count: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1 or self.half_lag_s <= 0 or not 0 <= self.max_fraction < 1:
            raise ValueError("alpha in (0, 1], half_lag_s > 0, max_fraction in [0, 1)")

    def note_wake(self, lag_s: float) -> None:
        lag = max(0.0, lag_s) if lag_s == lag_s else 0.0  # NaN counts as on time
        self.lag_avg_s += self.alpha * (lag - self.lag_avg_s)

    @property
    def fraction(self) -> float:
        """The share of sheddable messages dropped now."""
        lag = self.lag_avg_s
        return min(self.max_fraction, lag / (lag + self.half_lag_s))

    def shed(self, message_type: str, u: float) -> bool:
        """True if this outgoing message is to be dropped (``u`` uniform in [0, 1))."""
        if message_type in SHEDDABLE and u < self.fraction:
            self.shed_count += 1
            return True
        return False
