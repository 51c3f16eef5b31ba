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
* Shares: one client (its remote address) holds at most ``max_per_client`` streams (4) of the
  event log's 64; one more is 429 ``too_many_event_streams_for_client``, so idle readers from one
  place cannot lock every other console out (the table full is 503 ``too_many_event_streams``).
  The API key, when there is one, is the same for every console: it does not tell clients apart.

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

__all__ = ["HEARTBEAT_S", "MAX_STREAMS_PER_CLIENT", "PING", "EventsRoute", "client_of"]

#: Seconds between heartbeats on a quiet stream (the contract: 15 s).
HEARTBEAT_S = 15.0
#: The heartbeat: an SSE comment, ignored by every reader.
PING = b": ping\n\n"
#: Event streams one client (remote address) may hold at once.
MAX_STREAMS_PER_CLIENT = 4
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


def client_of(request: Request) -> str:
    """Who holds a share of the streams: the remote address without its port (``""`` outside the server)."""
    return request.client.rpartition(":")[0] if ":" in request.client else request.client


class _Wakeup:
    """Set by the event log (in the trio thread) when the subscription has something to read."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def __call__(self) -> None:
        self.event.set()


class EventsRoute:
    """The handler of ``GET /api/events`` over ``log``."""

    def __init__(
        self, log: EventLog, *, heartbeat_s: float = HEARTBEAT_S, max_per_client: int = MAX_STREAMS_PER_CLIENT
    ) -> None:
        if max_per_client < 1:
            raise ValueError("max_per_client must be >= 1")
        self.log = log
        self.heartbeat_s = heartbeat_s
        self.max_per_client = max_per_client
        self.streams_by_client: dict[str, int] = {}  # open streams per client (absent: none)

    async def handle(self, request: Request) -> Response | StreamResponse:
        try:
            after = last_event_id(request)
            prefixes = parse_prefixes(request.query.get("types"))
        except ValueError as exc:
            return ApiError(400, str(exc), "invalid_value").response()
        client = client_of(request)
        held = self.streams_by_client.get(client, 0)
        if held >= self.max_per_client:
            return ApiError(
                429,
                f"this client ({client or 'local'}) holds {held} event streams already, the most one client "
                f"may hold ({self.max_per_client}); close one (one live view per console tab is enough)",
                "too_many_event_streams_for_client",
                retry_after=5,
            ).response()
        wakeup = _Wakeup()
        try:
            sub = self.log.subscribe(after_id=after, prefixes=prefixes, wake=wakeup)
        except TooManySubscribers as exc:
            return ApiError(503, f"{exc}; retry later", "too_many_event_streams", retry_after=5).response()
        self.streams_by_client[client] = held + 1

        async def release() -> None:  # awaited once, however the stream ended
            sub.close()
            left = self.streams_by_client.pop(client, 1) - 1
            if left:
                self.streams_by_client[client] = left

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
