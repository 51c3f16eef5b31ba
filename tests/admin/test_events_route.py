"""``GET /api/events`` and ``GET /api/history`` through the real management API and HTTP server on a
loopback socket (the live node's wiring is tested in tests/node/test_events_live.py): resume by
``Last-Event-ID`` or ``?last_event_id``, ``?types`` filters, heartbeats, the API key, bad input,
the bound on streams, a client that goes away, a drain."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
from events_sse import SseStream

from hydra_node.admin.events import MAX_STREAMS_PER_CLIENT, EventsRoute
from hydra_node.admin.history import HistorySampler
from hydra_node.http.server import HttpServer
from hydra_node.http.guard import GuardSettings
from hydra_node.admin.management import ManagementApi
from hydra_node.eventlog import EventLog

KEY = "events-key-123"


class Wall:
    def __init__(self):
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


class Link:
    def __init__(self, peer_id, rtt_ms):
        self.peer_id, self.rtt_ms = peer_id, rtt_ms


class Load:
    queue_depth, in_flight = 2, 1


@asynccontextmanager
async def management(
    log: EventLog, *, api_key: str | None = None, heartbeat_s: float = 15.0, history: HistorySampler | None = None
):
    history = history or HistorySampler(5.0, runners=list, links=list)
    routes = {
        ("GET", "/api/events"): EventsRoute(log, heartbeat_s=heartbeat_s).handle,
        ("GET", "/api/history"): history.handle,
    }
    mgmt = ManagementApi(
        health=lambda: (200, {"status": "ok"}), status=dict, routes=routes, headless=False, api_key=api_key
    )
    server = HttpServer(
        mgmt.handle, "127.0.0.1", 0, "console", guard=GuardSettings(check_host=True, csrf=True, api_key=api_key)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


def sse(port: int, path: str = "/api/events", **headers) -> SseStream:
    return SseStream(port, path, headers={k.replace("_", "-"): v for k, v in headers.items()}, timeout=10)


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


async def test_last_event_id_replays_newer_events_then_live_ones_follow():
    log = EventLog(clock=Wall(), first_id=10)
    first = log.emit("model.loaded", {"model": "m", "node_id": "n"})
    log.emit("peer.joined", {"node_id": "p"})
    log.emit("peer.suspect", {"node_id": "p"})
    async with management(log) as server:
        stream = await in_thread(lambda: sse(server.port, Last_Event_ID=str(first.id)))
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        assert stream.headers["cache-control"] == "no-cache"
        assert await in_thread(stream.next) == "ping"  # the stream opens with a heartbeat
        replayed = [await in_thread(stream.next) for _ in range(2)]
        assert [(e["id"], e["event"]) for e in replayed] == [(11, "peer.joined"), (12, "peer.suspect")]
        assert replayed[0]["data"] == {"node_id": "p", "id": 11, "ts": replayed[0]["data"]["ts"], "type": "peer.joined"}
        log.emit("peer.dead", {"node_id": "p"})
        live = await in_thread(stream.next)
        assert (live["id"], live["event"], live["data"]["node_id"]) == (13, "peer.dead", "p")
        stream.close()


async def test_query_resume_and_type_filter():
    log = EventLog(clock=Wall())
    for kind in ("peer.joined", "model.loaded", "request.finished", "model.failed"):
        log.emit(kind, {})
    async with management(log) as server:
        stream = await in_thread(lambda: sse(server.port, "/api/events?last_event_id=0&types=model.,runner."))
        got = await in_thread(lambda: stream.events_until(lambda e: e["event"] == "model.failed", "model.failed"))
        assert [e["event"] for e in got] == ["model.loaded", "model.failed"]
        log.emit("request.finished", {})
        log.emit("runner.restarted", {"model": "m", "restarts": 1, "reason": "exit"})
        nxt = await in_thread(lambda: stream.events_until(lambda e: True, "an event"))
        assert [e["event"] for e in nxt] == ["runner.restarted"]
        stream.close()


async def test_a_quiet_stream_gets_heartbeats():
    log = EventLog(clock=Wall())
    async with management(log, heartbeat_s=0.05) as server:
        stream = await in_thread(lambda: sse(server.port))
        assert [await in_thread(stream.next) for _ in range(3)] == ["ping", "ping", "ping"]
        stream.close()


@pytest.mark.parametrize(
    "path,headers,param",
    [
        ("/api/events", {"Last-Event-ID": "12abc"}, "Last-Event-ID"),
        ("/api/events?last_event_id=-4", {}, "last_event_id"),
        ("/api/events?last_event_id=99999999999999999999", {}, "last_event_id"),
        ("/api/events?types=Peer.*", {}, "types"),
        ("/api/history?since=yesterday", {}, "since"),
        ("/api/history?since=nan", {}, "since"),
    ],
)
async def test_bad_parameters_are_a_400_naming_them(path, headers, param):
    async with management(EventLog(clock=Wall())) as server:
        stream = await in_thread(lambda: SseStream(server.port, path, headers=headers, timeout=10))
        body = stream.body()
        assert stream.status == 400 and stream.headers["content-type"] == "application/json"
        assert param in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"


async def test_with_an_api_key_the_stream_needs_the_bearer():
    log = EventLog(clock=Wall())
    log.emit("peer.joined", {"node_id": "p"})
    async with management(log, api_key=KEY) as server:
        refused = await in_thread(lambda: sse(server.port, "/api/events?last_event_id=0"))
        assert refused.status == 401 and refused.body()["error"]["code"] == "invalid_api_key"
        ok = await in_thread(lambda: sse(server.port, "/api/events?last_event_id=0", Authorization=f"Bearer {KEY}"))
        assert ok.status == 200
        got = await in_thread(lambda: ok.events_until(lambda e: True, "an event"))
        assert got[0]["event"] == "peer.joined"
        ok.close()


async def test_a_foreign_host_is_refused_before_the_stream_opens():
    async with management(EventLog(clock=Wall())) as server:
        stream = await in_thread(lambda: sse(server.port, Host="evil.example"))
        assert stream.status == 403 and stream.body()["error"]["code"] == "forbidden_host"


async def test_a_client_that_goes_away_frees_its_subscription_and_streams_are_bounded():
    log = EventLog(clock=Wall(), max_subscribers=1)
    async with management(log) as server:
        stream = await in_thread(lambda: sse(server.port))
        assert await in_thread(stream.next) == "ping"
        assert log.statistics().subscribers == 1
        busy = await in_thread(lambda: sse(server.port))
        assert busy.status == 503 and busy.body()["error"]["code"] == "too_many_event_streams"
        assert busy.headers["retry-after"] == "5"
        stream.close()
        with trio.fail_after(10):
            while log.statistics().subscribers:
                await trio.sleep(0.01)
        again = await in_thread(lambda: sse(server.port))
        assert again.status == 200
        again.close()


async def test_one_client_holds_a_share_of_the_streams_and_another_console_still_connects():
    """Issue 25 item 7: idle readers from one address take their share (4 of the 64 streams), not
    the whole table; a console on another address (127.0.0.2) still gets its live view."""
    log = EventLog(clock=Wall())  # the default table: 64 streams
    async with management(log) as server:
        mine = [await in_thread(lambda: sse(server.port)) for _ in range(MAX_STREAMS_PER_CLIENT)]
        assert [s.status for s in mine] == [200] * MAX_STREAMS_PER_CLIENT
        over = await in_thread(lambda: sse(server.port))
        assert over.status == 429 and over.headers["retry-after"] == "5"
        err = over.body()["error"]
        assert err["code"] == "too_many_event_streams_for_client" and "127.0.0.1" in err["message"]
        assert log.statistics().subscribers == MAX_STREAMS_PER_CLIENT
        other = await in_thread(lambda: SseStream(server.port, timeout=10, source="127.0.0.2"))
        assert other.status == 200 and await in_thread(other.next) == "ping"
        other.close()
        for s in mine:
            s.close()
        with trio.fail_after(10):
            while log.statistics().subscribers:
                await trio.sleep(0.01)
        again = [await in_thread(lambda: sse(server.port)) for _ in range(MAX_STREAMS_PER_CLIENT)]
        assert [s.status for s in again] == [200] * MAX_STREAMS_PER_CLIENT  # the share came back whole
        for s in again:
            s.close()


async def test_a_drain_ends_the_stream():
    log = EventLog(clock=Wall())
    async with management(log) as server:
        stream = await in_thread(lambda: sse(server.port))
        assert await in_thread(stream.next) == "ping"
        await server.drain(1.0)
        with pytest.raises(EOFError):
            await in_thread(stream.next)
        assert log.statistics().subscribers == 0


async def test_history_serves_the_ring_oldest_first_and_since_filters():
    wall = Wall()
    history = HistorySampler(
        5.0, runners=lambda: [Load(), Load()], links=lambda: [Link("p" * 64, 1.234), Link("q" * 64, None)], clock=wall
    )

    class Obs:
        def __init__(self, ttft_ms, completion_tokens):
            self.ttft_ms, self.completion_tokens = ttft_ms, completion_tokens

    history.sample(100.0)  # opens the first interval
    for ttft in (10.0, 20.0, 30.0, 40.0):
        history.observe(Obs(ttft, 25))
    history.sample(105.0)
    history.sample(110.0)
    async with management(EventLog(clock=wall), history=history) as server:
        resp = await in_thread(lambda: sse(server.port, "/api/history"))
        body = resp.body()
        assert (resp.status, body["interval_s"], body["capacity"]) == (200, 5.0, 720)
        assert [p["ts"] for p in body["series"]] == [100.0, 105.0, 110.0]
        point = body["series"][1]
        assert point == {
            "ts": 105.0,
            "tok_s": 20.0,
            "ttft_p50_ms": 20.0,
            "ttft_p95_ms": 40.0,
            "queue_depth": 4,
            "in_flight": 2,
            "requests": 4,
            "rtt_ms": {"p" * 64: 1.23},
        }
        assert body["series"][2]["requests"] == 0 and body["series"][2]["ttft_p50_ms"] is None
        newer = await in_thread(lambda: sse(server.port, "/api/history?since=105").body())
        assert [p["ts"] for p in newer["series"]] == [110.0]
