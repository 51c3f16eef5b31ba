"""Lifeguard's dynamic suspicion timeout: long when we alone suspect, short when others confirm.

A suspicion starts at its maximum and shrinks log-wise toward its minimum as independent
confirmations arrive (memberlist `suspicion.go`, Lifeguard section IV-B):

    timeout(c) = max(minimum, maximum - (maximum - minimum) * log(c + 1) / log(k + 1))

with c the confirmations so far and k those expected (`suspicion_confirmations`; 0 in a mesh
too small to have k other nodes, which makes every suspicion last its minimum). A confirmation
is a peer other than the one we first heard the suspicion from telling us that its *own* probe
of the suspect failed (a `suspect` message), or our own failed probe. Pure; times are arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Suspicion", "suspicion_timeout"]


def suspicion_timeout(confirmations: int, expected: int, low: float, high: float) -> float:
    """The suspicion timeout after `confirmations` of `expected` (seconds)."""
    if expected < 1 or confirmations >= expected:
        return low
    frac = math.log(confirmations + 1) / math.log(expected + 1)
    return max(low, high - frac * (high - low))


@dataclass
class Suspicion:
    """One suspicion of one peer: when it started, by whom, and who confirmed it since."""

    start: float
    low: float
    high: float
    expected: int  # k
    origin: str  # who we first heard it from (ourselves when our own probe failed)
    confirmers: set[str] = field(default_factory=set)

    def confirm(self, node: str) -> bool:
        """Count `node`'s independent confirmation; False if it is the origin or already counted."""
        if node == self.origin or node in self.confirmers or len(self.confirmers) >= self.expected:
            return False
        self.confirmers.add(node)
        return True

    @property
    def deadline(self) -> float:
        return self.start + suspicion_timeout(len(self.confirmers), self.expected, self.low, self.high)

    def deadline_for(self, health_multiplier: int) -> float:
        """The deadline for a node whose local health multiplier is this: a node that knows it
        runs late gives suspects as much longer to refute as it gives peers to answer probes."""
        return self.start + (self.deadline - self.start) * health_multiplier
