"""The node's live event log: what happened, numbered, for ``GET /api/events`` (docs/console.md).

Services report what happens (a peer joined, a model loaded, a request finished) through an
``on_event(type, fields)`` callable the composition root hands them (:meth:`EventLog.emit`);
they never see the log itself.  The log keeps the last :data:`DEFAULT_CAPACITY` events for
replay and copies each new one into every subscriber's bounded queue; a subscriber that falls
behind loses the newest events, counted, and is told so with one ``events.dropped`` event when
it reads again (and is closed once it has lost :data:`DROP_CLOSE_FACTOR` queues' worth).

Pure: no trio, no sockets; the wall clock is injected (``clock``) and a subscriber's reader is
woken through an injected ``wake`` callable.  ``emit`` never raises: an event that cannot be
encoded is counted (``emit_errors``) and logged, so reporting can never fail the caller.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_QUEUE",
    "DROPPED",
    "DROP_CLOSE_FACTOR",
    "MAX_PREFIXES",
    "MAX_SUBSCRIBERS",
    "EmitFn",
    "Event",
    "EventLog",
    "EventLogStatistics",
    "RateGate",
    "Subscription",
    "TooManySubscribers",
    "parse_prefixes",
]

log = logging.getLogger("hydra.events")

#: Events kept for replay (``Last-Event-ID``): a few minutes of a busy node, ~0.5 MB at most.
DEFAULT_CAPACITY = 1000
#: Events waiting for one subscriber; a reader this far behind is not keeping up.
DEFAULT_QUEUE = 256
#: A subscriber that has lost this many queues' worth of events without reading is closed.
DROP_CLOSE_FACTOR = 4
#: Subscribers at once (each an open HTTP stream); more are refused (503), not queued.
MAX_SUBSCRIBERS = 64
#: Type prefixes one subscriber may filter on (``?types=peer.,model.``).
MAX_PREFIXES = 16
#: The event a subscriber gets after losing events: ``{"dropped": n}``.
DROPPED = "events.dropped"
#: Event types: dotted lower-case words (``peer.joined``, ``route.decision``).
_TYPE = re.compile(r"^[a-z][a-z_]*(\.[a-z][a-z_]*)+$")
_PREFIX = re.compile(r"^[a-z][a-z_.]{0,63}$")
#: Nesting followed when replacing non-finite floats in fields (events are shallow).
_MAX_DEPTH = 8

EmitFn = Callable[[str, Mapping[str, Any]], Any]


class TooManySubscribers(Exception):
    """:data:`MAX_SUBSCRIBERS` are reading already."""


@dataclass(frozen=True)
class Event:
    """One event: ``id`` grows by one per event, ``ts`` is unix seconds, ``data`` its JSON line."""

    id: int
    ts: float
    type: str
    data: str  # ``{"id", "ts", "type", ...fields}`` on one line

    def sse(self) -> bytes:
        """The Server-Sent Events frame: ``id``, ``event`` and ``data`` lines, then a blank line."""
        return f"id: {self.id}\nevent: {self.type}\ndata: {self.data}\n\n".encode()

    def as_dict(self) -> dict:
        return json.loads(self.data)


def _finite(value: Any, depth: int = 0) -> Any:
    """``value`` with NaN and infinities replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, depth + 1) for v in value]
    return value


def _encode(event_id: int, ts: float, type_: str, fields: Mapping[str, Any]) -> str:
    body = {**fields, "id": event_id, "ts": round(ts, 3), "type": type_}
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:  # a NaN somewhere: JSON cannot say it
        return json.dumps(_finite(body), separators=(",", ":"), allow_nan=False, default=str)


def parse_prefixes(text: str | None) -> tuple[str, ...]:
    """``"peer.,model."`` → ``("peer.", "model.")``; ValueError naming what is wrong."""
    if text is None or not text.strip():
        return ()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) > MAX_PREFIXES:
        raise ValueError(f"types: at most {MAX_PREFIXES} prefixes, got {len(parts)}")
    for p in parts:
        if not _PREFIX.match(p):
            raise ValueError(f"types: {p[:64]!r} is not an event type prefix (lower-case words and dots)")
    return tuple(parts)


@dataclass(frozen=True)
class EventLogStatistics:
    emitted: int
    buffered: int
    last_id: int
    subscribers: int
    dropped: int  # events lost by subscribers that fell behind, all together
    closed_slow: int  # subscribers closed for falling behind
    emit_errors: int


class Subscription:
    """One reader's view: replayed events first, then live ones through a bounded queue."""

    def __init__(
        self,
        owner: EventLog,
        prefixes: tuple[str, ...],
        capacity: int,
        backlog: Iterable[Event],
        wake: Callable[[], None] | None,
    ) -> None:
        self._owner = owner
        self.prefixes = prefixes
        self.capacity = capacity
        self._backlog: deque[Event] = deque(backlog)  # the replay: bounded by the ring, not by capacity
        self._queue: deque[Event] = deque()  # live events, at most capacity
        self._wake = wake
        self.dropped = 0  # lost since the last take
        self._lost_since_read = 0
        self._last_dropped_id = 0
        self.closed = False

    def wants(self, type_: str) -> bool:
        return not self.prefixes or type_.startswith(self.prefixes)

    @property
    def pending(self) -> int:
        return len(self._backlog) + len(self._queue) + (1 if self.dropped else 0)

    def offer(self, ev: Event) -> None:
        """Called by the log for each new event."""
        if self.closed or not self.wants(ev.type):
            return
        if len(self._queue) >= self.capacity:
            self.dropped += 1
            self._lost_since_read += 1
            self._last_dropped_id = ev.id
            self._owner._count_drop()
            if self._lost_since_read >= DROP_CLOSE_FACTOR * self.capacity:
                self._owner._close_slow(self)
        else:
            self._queue.append(ev)
        if self._wake is not None:
            self._wake()

    def take(self) -> list[Event]:
        """Everything waiting, oldest first, then ``events.dropped`` if events were lost."""
        out = [*self._backlog, *self._queue]
        self._backlog.clear()
        self._queue.clear()
        self._lost_since_read = 0
        if self.dropped:
            out.append(self._owner._dropped_event(self._last_dropped_id, self.dropped))
            self.dropped = 0
        return out

    def close(self) -> None:
        self._owner.unsubscribe(self)


class EventLog:
    """The ring of recent events and the subscribers reading new ones.

    ``first_id``: the first event's id (the node passes its start time in milliseconds, so ids
    keep growing across restarts and a reader's ``Last-Event-ID`` from an earlier run replays
    the whole buffer of this one)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        capacity: int = DEFAULT_CAPACITY,
        queue_size: int = DEFAULT_QUEUE,
        first_id: int = 1,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        if capacity < 1 or queue_size < 1 or first_id < 1:
            raise ValueError("capacity, queue_size and first_id must be >= 1")
        self._clock = clock
        self.capacity = capacity
        self.queue_size = queue_size
        self.first_id = first_id
        self.max_subscribers = max_subscribers
        self._ring: deque[Event] = deque(maxlen=capacity)
        self._next_id = first_id
        self._subs: list[Subscription] = []
        self.emitted = self.dropped = self.closed_slow = self.emit_errors = 0

    @property
    def last_id(self) -> int:
        """The newest event's id (``first_id - 1`` before any)."""
        return self._next_id - 1

    def emit(self, type_: str, fields: Mapping[str, Any] | None = None) -> Event | None:
        """Record an event and hand it to the subscribers; never raises (None when refused)."""
        try:
            if not isinstance(type_, str) or not _TYPE.match(type_):
                raise ValueError(f"bad event type {type_!r}")
            ts = float(self._clock())
            ev = Event(self._next_id, ts, type_, _encode(self._next_id, ts, type_, fields or {}))
        except Exception as exc:  # noqa: BLE001 -- a reporting bug must never fail the service that reports
            self.emit_errors += 1
            if self.emit_errors & (self.emit_errors - 1) == 0:  # 1st, 2nd, 4th, 8th...: bounded logging
                log.warning("event=event_emit_failed type=%.64r error=%r count=%d", type_, exc, self.emit_errors)
            return None
        self._next_id += 1
        self.emitted += 1
        self._ring.append(ev)
        for sub in list(self._subs):
            sub.offer(ev)
        return ev

    __call__ = emit

    def recent(self, after_id: int | None = None, prefixes: tuple[str, ...] = ()) -> list[Event]:
        """Buffered events with id > ``after_id`` whose type starts with one of ``prefixes``."""
        return [
            e
            for e in self._ring
            if (after_id is None or e.id > after_id) and (not prefixes or e.type.startswith(prefixes))
        ]

    def subscribe(
        self, *, after_id: int | None = None, prefixes: tuple[str, ...] = (), wake: Callable[[], None] | None = None
    ) -> Subscription:
        """A new reader.  ``after_id`` (``Last-Event-ID``): replay the buffered events after it; None:
        live events only.  A reader whose id is older than the buffer first gets ``events.dropped``
        counting the events it can no longer see; an id from an earlier run (below ``first_id``) or
        from the future replays the whole buffer."""
        if len(self._subs) >= self.max_subscribers:
            raise TooManySubscribers(f"{self.max_subscribers} event streams are open already")
        backlog: list[Event] = []
        gap = 0
        if after_id is not None:
            if after_id < self.first_id - 1 or after_id > self.last_id:
                after_id = self.first_id - 1
            oldest = self._ring[0].id if self._ring else self._next_id
            gap = max(0, oldest - after_id - 1)
            backlog = self.recent(after_id, prefixes)
            if gap:  # what it asked for is no longer buffered: say so first
                backlog.insert(0, self._dropped_event(oldest - 1, gap))
        sub = Subscription(self, prefixes, self.queue_size, backlog, wake)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub.closed = True
        if sub in self._subs:
            self._subs.remove(sub)

    def statistics(self) -> EventLogStatistics:
        return EventLogStatistics(
            emitted=self.emitted,
            buffered=len(self._ring),
            last_id=self.last_id,
            subscribers=len(self._subs),
            dropped=self.dropped,
            closed_slow=self.closed_slow,
            emit_errors=self.emit_errors,
        )

    # ---- called by subscriptions -------------------------------------------------------------
    def _count_drop(self) -> None:
        self.dropped += 1

    def _close_slow(self, sub: Subscription) -> None:
        self.closed_slow += 1
        log.warning("event=event_stream_closed reason=too_slow lost=%d", sub.dropped)
        self.unsubscribe(sub)

    def _dropped_event(self, last_dropped_id: int, count: int) -> Event:
        """Not buffered: it is one reader's news.  Its id is the last lost event's, so a reader
        resuming from it goes on after what it lost (and the lost ones are not replayed twice)."""
        ts = float(self._clock())
        return Event(last_dropped_id, ts, DROPPED, _encode(last_dropped_id, ts, DROPPED, {"dropped": count}))


class RateGate:
    """At most one event per ``interval_s`` (``route.decision`` is sampled); ``now`` is injected."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: float | None = None
        self.skipped = 0

    def allow(self, now: float) -> bool:
        if self._last is not None and now - self._last < self.interval_s:
            self.skipped += 1
            return False
        self._last = now
        return True
