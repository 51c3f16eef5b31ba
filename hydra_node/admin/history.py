"""``GET /api/history``: a bounded time series of the node's load, for the console's charts.

Every ``interval_s`` (5 s; ``[api].history_interval_s``) the sampler records one point from what
the node already measures: the generations this node routed that finished in the interval
(``requests``, their completion tokens per second of the interval as ``tok_s``, their TTFT
p50/p95 as the router measured it: ``hydra_node/routing/live.py`` ``RequestObservation``), the
local runners' queue (``queue_depth`` waiting, ``in_flight`` being generated) and each linked
peer's ping RTT (``rtt_ms``).  The ring keeps :data:`CAPACITY` points (an hour at 5 s).

The ring and the interval accumulator are pure (time is passed in); :meth:`HistorySampler.run`
is the thin trio loop, started with ``nursery.start``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from hydra_node.http.messages import Request, Response
from hydra_node.api.errors import ApiError
from hydra_node.routing.metric import percentile

__all__ = [
    "CAPACITY",
    "DEFAULT_INTERVAL_S",
    "MAX_RTT_PEERS",
    "HistoryPoint",
    "HistoryRing",
    "HistorySampler",
    "IntervalStats",
]

#: Default seconds between points (the contract's ``interval_s``).
DEFAULT_INTERVAL_S = 5.0
#: Points kept: one hour at 5 s.
CAPACITY = 720
#: TTFT samples kept per interval for the percentiles (a busier interval samples the first ones).
MAX_TTFT_SAMPLES = 4096
#: Peers whose RTT one point records (the nearest), so 720 points stay small with hundreds of peers.
MAX_RTT_PEERS = 64


@dataclass(frozen=True)
class HistoryPoint:
    ts: float
    tok_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    queue_depth: int
    in_flight: int
    requests: int
    rtt_ms: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "ts": self.ts,
            "tok_s": self.tok_s,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
            "queue_depth": self.queue_depth,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "rtt_ms": dict(self.rtt_ms),
        }


class HistoryRing:
    """The last ``capacity`` points, oldest first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._points: deque[HistoryPoint] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._points)

    def append(self, point: HistoryPoint) -> None:
        self._points.append(point)

    def since(self, ts: float | None = None) -> list[HistoryPoint]:
        """Points newer than ``ts`` (all when None)."""
        return [p for p in self._points if ts is None or p.ts > ts]


class IntervalStats:
    """What finished since the last point: request count, completion tokens, TTFT samples."""

    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.ttfts: list[float] = []

    def observe(self, ttft_ms: float, completion_tokens: int) -> None:
        self.requests += 1
        self.tokens += max(0, int(completion_tokens))
        if len(self.ttfts) < MAX_TTFT_SAMPLES and math.isfinite(ttft_ms):
            self.ttfts.append(max(0.0, float(ttft_ms)))

    def point(
        self, ts: float, elapsed_s: float, *, queue_depth: int, in_flight: int, rtt_ms: Mapping[str, float]
    ) -> HistoryPoint:
        """The point closing this interval (``elapsed_s`` long); the caller starts a new interval."""
        nearest = sorted((v, k) for k, v in rtt_ms.items() if isinstance(v, (int, float)) and math.isfinite(v))
        p50, p95 = percentile(self.ttfts, 0.50), percentile(self.ttfts, 0.95)
        return HistoryPoint(
            ts=round(ts, 3),
            tok_s=round(self.tokens / elapsed_s, 3) if elapsed_s > 0 else 0.0,
            ttft_p50_ms=None if p50 is None else round(p50, 1),
            ttft_p95_ms=None if p95 is None else round(p95, 1),
            queue_depth=queue_depth,
            in_flight=in_flight,
            requests=self.requests,
            rtt_ms={k: round(float(v), 2) for v, k in nearest[:MAX_RTT_PEERS]},
        )


class RunnerLoad(Protocol):
    """What a point reads of a local runner (``RunnerSupervisor`` has both)."""

    @property
    def queue_depth(self) -> int: ...
    @property
    def in_flight(self) -> int: ...


class Linked(Protocol):
    """What a point reads of a peer link (``PeerLink`` has both)."""

    @property
    def peer_id(self) -> str: ...
    @property
    def rtt_ms(self) -> float | None: ...


class HistorySampler:
    """Samples the node every ``interval_s`` into a :class:`HistoryRing`; serves ``/api/history``.

    ``observe`` is a ``LiveScheduling.listeners`` callable (one call per routed generation that
    finished); ``runners`` and ``links`` return the local runners and the open peer links."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        runners: Callable[[], Iterable[RunnerLoad]],
        links: Callable[[], Iterable[Linked]],
        capacity: int = CAPACITY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be > 0, not {interval_s!r}")
        self.interval_s = interval_s
        self.ring = HistoryRing(capacity)
        self._runners = runners
        self._links = links
        self._clock = clock
        self._current = IntervalStats()
        self._since: float | None = None  # when the current interval began

    def observe(self, obs: Any) -> None:
        """A routed generation finished (a ``RequestObservation``: ``ttft_ms``, ``completion_tokens``)."""
        self._current.observe(obs.ttft_ms, obs.completion_tokens)

    def sample(self, now: float) -> HistoryPoint:
        """Close the current interval at ``now`` and record its point."""
        elapsed = now - self._since if self._since is not None else self.interval_s
        runners = list(self._runners())
        point = self._current.point(
            now,
            elapsed,
            queue_depth=sum(r.queue_depth for r in runners),
            in_flight=sum(r.in_flight for r in runners),
            rtt_ms={link.peer_id: link.rtt_ms for link in self._links() if link.rtt_ms is not None},
        )
        self.ring.append(point)
        self._current = IntervalStats()
        self._since = now
        return point

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A point every ``interval_s`` until cancelled; ready at once (the first point comes after one interval)."""
        self._since = self._clock()
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            self.sample(self._clock())

    async def handle(self, request: Request) -> Response:
        """``GET /api/history[?since=TS]``: ``{"interval_s", "capacity", "series": [...]}``, oldest first."""
        raw = request.query.get("since")
        since = None
        if raw is not None and raw.strip():
            try:
                since = float(raw)
                if not math.isfinite(since):
                    raise ValueError
            except ValueError:
                return ApiError(
                    400, f"since must be a unix time in seconds, not {raw[:40]!r}", "invalid_value", "since"
                ).response()
        return Response.json(
            200,
            {
                "interval_s": self.interval_s,
                "capacity": self.ring.capacity,
                "series": [p.as_dict() for p in self.ring.since(since)],
            },
        )
