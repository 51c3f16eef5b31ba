"""One measured quantity: an EWMA, a bounded recent window, and when it last changed."""

from __future__ import annotations

from typing import Any
import math
from collections import deque

#: Weight of the newest sample in the moving average (same as upstream's collector).
EWMA_ALPHA = 0.25
#: Samples kept per metric for p50/p95; 64 floats per metric keeps a target under ~10 KiB.
WINDOW_SAMPLES = 64


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 1]) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class Metric:
    """EWMA (alpha ``EWMA_ALPHA``; the first sample seeds it) plus the last ``WINDOW_SAMPLES`` samples.

    Non-finite and negative samples are ignored, so a bad measurement can never poison a score.
    """

    __slots__ = ("ewma", "count", "window", "updated_at")

    def __init__(self) -> None:
        self.ewma: float | None = None
        self.count = 0
        self.window: deque[float] = deque(maxlen=WINDOW_SAMPLES)
        self.updated_at: float | None = None

    def add(self, value: float, now: float) -> bool:
        """Record ``value`` observed at ``now``; False when the sample was rejected."""
        try:
            value = float(value)
        except (TypeError, ValueError):
            return False
        if not math.isfinite(value) or value < 0.0:
            return False
        self.ewma = value if self.ewma is None else EWMA_ALPHA * value + (1.0 - EWMA_ALPHA) * self.ewma
        self.count += 1
        self.window.append(value)
        self.updated_at = now
        return True

    def fresh(self, now: float, stale_after_s: float) -> float | None:
        """The EWMA if updated within ``stale_after_s`` of ``now``, else None."""
        if self.updated_at is None or now - self.updated_at > stale_after_s:
            return None
        return self.ewma

    def p50(self) -> float | None:
        return percentile(list(self.window), 0.50)

    def p95(self) -> float | None:
        return percentile(list(self.window), 0.95)

    def as_dict(self, now: float) -> dict[str, Any]:
        """Plain data for status: ``avg``, ``p50``, ``p95``, ``samples``, ``age_ms``."""
        return {
            "avg": _round(self.ewma),
            "p50": _round(self.p50()),
            "p95": _round(self.p95()),
            "samples": self.count,
            "age_ms": None if self.updated_at is None else int(max(0.0, now - self.updated_at) * 1000),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
