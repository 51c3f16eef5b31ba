"""Fault injection for links under test (tc netem is not available here)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

FAULT_DELAY_QUEUE_FRAMES = 1024
"""Frames held in the delay line at once; the writer waits when it is full."""


@dataclass(frozen=True)
class FaultInjection:
    """Applied by a link's send path.

    latency_s/jitter_s delay every frame (order is kept, throughput is not
    limited: a delay line, like netem delay). message_loss drops priority-lane
    messages before encryption (lost gossip). frame_loss drops whole encrypted
    frames, which the peer detects as a gap and answers by closing the link.
    """

    latency_s: float = 0.0
    jitter_s: float = 0.0
    message_loss: float = 0.0
    frame_loss: float = 0.0
    seed: int = 0
    _rng: random.Random = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.jitter_s < 0:
            raise ValueError("latency and jitter must be >= 0")
        if not (0.0 <= self.message_loss <= 1.0 and 0.0 <= self.frame_loss <= 1.0):
            raise ValueError("loss probabilities must be within 0..1")
        object.__setattr__(self, "_rng", random.Random(self.seed))

    @property
    def delays(self) -> bool:
        return self.latency_s > 0 or self.jitter_s > 0

    def delay(self) -> float:
        return self.latency_s + (self._rng.uniform(0, self.jitter_s) if self.jitter_s else 0.0)

    def drop_message(self) -> bool:
        return self.message_loss > 0 and self._rng.random() < self.message_loss

    def describe(self) -> str:
        """``latency_ms=10 jitter_ms=0 message_loss=0 frame_loss=0`` (the start-up warning's words)."""
        return (
            f"latency_ms={self.latency_s * 1000:g} jitter_ms={self.jitter_s * 1000:g} "
            f"message_loss={self.message_loss:g} frame_loss={self.frame_loss:g}"
        )

    def drop_frame(self) -> bool:
        return self.frame_loss > 0 and self._rng.random() < self.frame_loss
