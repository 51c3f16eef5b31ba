"""Lifeguard's local health multiplier (LHM): how much to distrust our own view of timing.

A node whose event loop runs late, or whose links drop its messages, sees its probes fail
although the peers are fine. Lifeguard (Dadgar et al. 2018, arXiv 1707.00788) counts the
evidence of that and stretches the node's own probe timeouts (and so its protocol period) by
``score + 1``. Sans-IO: the caller passes the evidence; nothing here reads a clock.

Evidence (each +1, the score capped at ``max_multiplier - 1``):
* a helper asked to probe for us sent no `nack` (the helper or our link to it is slow, or we are);
* a probe failed while no helper could be asked (no nack peers: penalise the failure itself);
* we had to refute a suspicion of ourselves (others could not hear from us in time);
* our timers woke late by at least ``lag_threshold`` (counted at most once per ``lag_window``).
A successful probe is -1 (floor 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LocalHealth"]


@dataclass
class LocalHealth:
    """The score (0 = healthy) and the counters the status view shows."""

    max_multiplier: int = 8  # memberlist's AwarenessMaxMultiplier: timeouts stretch at most 8x
    lag_threshold: float = 0.25  # a timer wake this late (s) is evidence of a loaded host
    lag_window: float = 1.0  # at most one lag point per this many seconds
    score: int = 0
    raised: int = 0  # points added in total
    lowered: int = 0  # points removed in total
    worst_lag: float = 0.0  # the latest wake seen late, in seconds
    _last_lag_at: float = field(default=-1e300, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_multiplier, int) or self.max_multiplier < 1:
            raise ValueError("max_multiplier must be an int >= 1")
        if self.lag_threshold <= 0 or self.lag_window <= 0:
            raise ValueError("lag_threshold and lag_window must be > 0")

    @property
    def multiplier(self) -> int:
        """What probe timeouts and the protocol period are multiplied by (1 when healthy)."""
        return self.score + 1

    def scale(self, seconds: float) -> float:
        return seconds * (self.score + 1)

    def apply(self, delta: int) -> int:
        """Add `delta` (clamped to 0 .. max_multiplier - 1); returns the new score."""
        before = self.score
        self.score = min(self.max_multiplier - 1, max(0, self.score + delta))
        if self.score > before:
            self.raised += self.score - before
        elif self.score < before:
            self.lowered += before - self.score
        return self.score

    def note_lag(self, lag_s: float, now: float) -> bool:
        """A timer woke `lag_s` late at `now`; True if that counted as evidence (+1)."""
        if not lag_s >= self.lag_threshold:  # also false for NaN
            return False
        self.worst_lag = lag_s
        if now - self._last_lag_at < self.lag_window:
            return False
        self._last_lag_at = now
        self.apply(1)
        return True
