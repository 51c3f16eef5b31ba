"""Retry policies: exponential back-off and crash-loop detection.

The node's one back-off policy, for child restarts (``runtime.supervise``), relay
reconnects (``discovery``), mesh admission retries and placement retries.  It sits at the
bottom of the package and imports nothing, so every layer may use it.

Pure objects over plain numbers: they never read a clock or draw random numbers.  The caller
passes ``now`` (``trio.current_time()``) and ``u`` (uniform in [0, 1)), so tests step through
them without sleeping.

    schedule = Backoff(initial_s=0.5, max_s=30.0).schedule()
    loop = CrashLoop(max_crashes=5, window_s=60.0)
    ...
    schedule.healthy(now)                  # it came up
    ...
    if loop.record(now): give up           # it went down
    await trio.sleep(schedule.next_delay(now, rng.random()))
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

__all__ = ["Backoff", "BackoffSchedule", "CrashLoop"]

#: Exponents above this add nothing (any sane ``max_s`` caps far below) and would overflow a float.
MAX_EXPONENT = 64


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with jitter.

    Attempt ``n`` (0-based) waits ``min(max_s, initial_s * factor**n)`` times a factor drawn
    from ``[1 - jitter, 1 + jitter]``.  A run that stayed up for ``reset_after_s`` starts the
    sequence over (see :class:`BackoffSchedule`).
    """

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.25
    reset_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.initial_s < 0 or self.max_s < 0:
            raise ValueError(f"back-off delays must be >= 0, got {self.initial_s}, {self.max_s}")
        if self.factor < 1:
            raise ValueError(f"back-off factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"back-off jitter must be in [0, 1), got {self.jitter}")
        if self.reset_after_s < 0:
            raise ValueError(f"back-off reset_after_s must be >= 0, got {self.reset_after_s}")

    def delay(self, attempt: int, u: float) -> float:
        """Delay before retry number ``attempt`` (0-based); ``u`` uniform in [0, 1)."""
        base = min(self.max_s, self.initial_s * self.factor ** min(max(attempt, 0), MAX_EXPONENT))
        return base * (1.0 - self.jitter + 2.0 * self.jitter * u)

    def schedule(self) -> BackoffSchedule:
        """A fresh sequence of delays under this policy (one per child or connection)."""
        return BackoffSchedule(self)


class BackoffSchedule:
    """Where one child (or connection) stands in its back-off sequence."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy
        self.attempt = 0
        self._up_since: float | None = None

    def healthy(self, now: float) -> None:
        """It came up (ready, connected) at ``now``."""
        self._up_since = now

    def next_delay(self, now: float, u: float) -> float:
        """It went down at ``now``: how long to wait before the next try.

        A run that was up for at least ``reset_after_s`` restarts the sequence at
        ``initial_s``; otherwise every call waits ``factor`` times longer, up to ``max_s``.
        """
        if self._up_since is not None and now - self._up_since >= self.policy.reset_after_s:
            self.attempt = 0
        self._up_since = None
        delay = self.policy.delay(self.attempt, u)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0
        self._up_since = None


class CrashLoop:
    """Give up after ``max_crashes`` crashes within ``window_s`` seconds.

    With ``window_s = math.inf`` it counts crashes in a row, until :meth:`reset` (e.g. a
    worker that keeps failing before it ever becomes ready).
    """

    def __init__(self, max_crashes: int, window_s: float = math.inf) -> None:
        if max_crashes < 1:
            raise ValueError(f"max_crashes must be >= 1, got {max_crashes}")
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.max_crashes = max_crashes
        self.window_s = window_s
        # Bounded by the only number that matters: the oldest of the last ``max_crashes``.
        self._times: collections.deque[float] = collections.deque(maxlen=max_crashes)

    def record(self, now: float) -> bool:
        """A crash at ``now``.  True when that makes it a crash loop: stop restarting."""
        self._times.append(now)
        return len(self._times) == self.max_crashes and now - self._times[0] <= self.window_s

    def count(self, now: float) -> int:
        """Crashes inside the window ending at ``now``."""
        return sum(1 for t in self._times if now - t <= self.window_s)

    def reset(self) -> None:
        self._times.clear()
