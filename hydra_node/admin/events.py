"""``GET /api/events`` on the management port: the node's event log as Server-Sent Events.

Each event is ``id: N``, ``event: TYPE``, ``data: {"id", "ts", "type", ...}`` and a blank line
(``hydra_node/eventlog.py``); a ``: ping`` comment goes out when the stream opens and every
``heartbeat_s`` (15 s) without events, so proxies and readers see a live connection.

* Resume: ``Last-Event-ID: N`` (what an ``EventSource`` sends when it reconnects) or
  ``?last_event_id=N`` (for readers that cannot set headers) replays the buffered events after
  N; an id older than the buffer first gets ``events.dropped``.  Without either: live events only.
* ``?types=peer.,model.``: only events whose type starts with one of the prefixes
  (``events.dropped`` always comes through).
* Each stream has a bounded queue; a reader that falls behind gets one ``events.dropped``
  ``{"dropped": n}`` when it catches up, and is closed if it keeps falling behind.  A reader
  that goes away frees its subscription at once (the HTTP server cancels the stream).

Authentication (Bearer with ``--api-key``) and the Host/Origin rules are the management API's,
applied before this handler runs.
"""

from __future__ import annotations

import trio

from hydra_node.http.messages import Request, Response, StreamResponse
from hydra_node.api.errors import ApiError
from hydra_node.eventlog import (
    EventLog,
    Subscription,
    TooManySubscribers,
    parse_prefixes,
)

__all__ = ["HEARTBEAT_S", "PING", "EventsRoute"]

#: Seconds between heartbeats on a quiet stream (the contract: 15 s).
HEARTBEAT_S = 15.0
#: The heartbeat: an SSE comment, ignored by every reader.
PING = b": ping\n\n"
#: Largest ``Last-Event-ID`` accepted (JavaScript numbers are exact below 2**53).
MAX_EVENT_ID = (1 << 53) - 1


def last_event_id(request: Request) -> int | None:
    """The id to resume after: the ``Last-Event-ID`` header, else ``?last_event_id``; ValueError if malformed."""
    raw = request.headers.get("last-event-id")
    name = "Last-Event-ID"
    if raw is None or not raw.strip():
        raw, name = request.query.get("last_event_id"), "last_event_id"
    if raw is None or not raw.strip():
        return None
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 16 or int(raw) > MAX_EVENT_ID:
        raise ValueError(f"{name} must be a non-negative integer event id, not {raw[:40]!r}")
    return int(raw)


class _Wakeup:
    """Set by the event log (in the trio thread) when the subscription has something to read."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def __call__(self) -> None:
        self.event.set()


class EventsRoute:
    """The handler of ``GET /api/events`` over ``log``."""

    def __init__(self, log: EventLog, *, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.log = log
        self.heartbeat_s = heartbeat_s

    async def handle(self, request: Request) -> Response | StreamResponse:
        try:
            after = last_event_id(request)
            prefixes = parse_prefixes(request.query.get("types"))
        except ValueError as exc:
            return ApiError(400, str(exc), "invalid_value").response()
        wakeup = _Wakeup()
        try:
            sub = self.log.subscribe(after_id=after, prefixes=prefixes, wake=wakeup)
        except TooManySubscribers as exc:
            return ApiError(503, f"{exc}; retry later", "too_many_event_streams", retry_after=5).response()

        async def release() -> None:
            sub.close()

        return StreamResponse(200, self._stream(sub, wakeup), headers=[("x-accel-buffering", "no")], finalizer=release)

    async def _stream(self, sub: Subscription, wakeup: _Wakeup):
        try:
            yield PING
            while True:
                batch = sub.take()
                if batch:
                    yield b"".join(ev.sse() for ev in batch)
                    continue
                if sub.closed:  # closed for falling behind: what it had is sent, now it ends
                    return
                wakeup.event = trio.Event()  # no checkpoint since take(): no wake-up can be missed
                with trio.move_on_after(self.heartbeat_s) as quiet:
                    await wakeup.event.wait()
                if quiet.cancelled_caught:
                    yield PING
        finally:
            sub.close()
