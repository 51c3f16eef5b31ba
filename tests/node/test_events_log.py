"""The pure event log (hydra_node/eventlog.py): ring bounds, ids, replay, filters, slow readers."""

from __future__ import annotations

import json
import math

import pytest

from hydra_node.eventlog import (
    DROPPED,
    EventLog,
    RateGate,
    TooManySubscribers,
    parse_prefixes,
)


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


def make(**kw) -> EventLog:
    return EventLog(clock=Clock(), **kw)


def test_ids_grow_by_one_and_the_json_carries_id_ts_type_and_fields():
    log = make(first_id=41)
    a = log.emit("peer.joined", {"node_id": "n1", "addrs": ["ws://a"]})
    b = log.emit("model.loaded", {"model": "m", "node_id": "n1"})
    assert (a.id, b.id, log.last_id) == (41, 42, 42)
    assert b.ts > a.ts
    body = json.loads(a.data)
    assert body == {"node_id": "n1", "addrs": ["ws://a"], "id": 41, "ts": a.ts, "type": "peer.joined"}


def test_sse_frame_is_id_event_data_blank_line_with_one_line_json():
    log = make()
    ev = log.emit("runner.restarted", {"model": "m", "restarts": 2, "reason": "exit 1\nsegfault"})
    frame = ev.sse().decode()
    assert frame.endswith("\n\n")
    lines = frame[:-2].split("\n")
    assert lines[0] == f"id: {ev.id}" and lines[1] == "event: runner.restarted"
    assert len(lines) == 3 and lines[2].startswith("data: ")
    assert json.loads(lines[2][6:])["reason"] == "exit 1\nsegfault"


def test_the_ring_keeps_only_the_newest_capacity_events():
    log = make(capacity=5)
    for i in range(12):
        log.emit("request.finished", {"i": i})
    kept = log.recent()
    assert [json.loads(e.data)["i"] for e in kept] == [7, 8, 9, 10, 11]
    assert log.statistics().buffered == 5 and log.statistics().emitted == 12


def test_emit_never_raises_and_counts_what_it_refuses():
    log = make()
    assert log.emit("Not A Type", {}) is None
    assert log.emit("peer", {}) is None  # one word: not a dotted type
    ev = log.emit("route.decision", {"score": math.nan, "terms": {"x": math.inf}, "obj": object()})
    assert ev is not None  # NaN/inf become null, unknown objects their str()
    body = json.loads(ev.data)
    assert body["score"] is None and body["terms"]["x"] is None and isinstance(body["obj"], str)
    assert log.statistics().emit_errors == 2
    assert log.last_id == ev.id  # refused ones take no id


def test_fields_cannot_overwrite_id_ts_or_type():
    ev = make().emit("peer.dead", {"id": "spoof", "type": "x", "ts": -1})
    body = json.loads(ev.data)
    assert body["id"] == ev.id and body["type"] == "peer.dead" and body["ts"] == ev.ts


def test_subscribe_without_an_id_gets_only_new_events():
    log = make()
    log.emit("peer.joined", {})
    sub = log.subscribe()
    assert sub.take() == []
    ev = log.emit("peer.dead", {})
    assert sub.take() == [ev]


def test_replay_after_an_id_returns_the_newer_buffered_events_then_live_ones():
    log = make()
    evs = [log.emit("model.loaded", {"n": i}) for i in range(5)]
    sub = log.subscribe(after_id=evs[2].id)
    assert sub.take() == evs[3:]
    new = log.emit("model.unloaded", {})
    assert sub.take() == [new]


def test_replay_of_an_id_older_than_the_buffer_starts_with_events_dropped():
    log = make(capacity=3, first_id=100)
    evs = [log.emit("peer.alive", {"n": i}) for i in range(6)]  # ids 100..105, 103..105 kept
    got = log.subscribe(after_id=100).take()
    assert got[0].type == DROPPED and json.loads(got[0].data)["dropped"] == 2  # 101, 102 are gone
    assert got[0].id == 102  # the last lost id: resuming from it never replays anything twice
    assert got[1:] == evs[3:]
    assert [e.id for e in got] == sorted(e.id for e in got)


def test_an_id_from_an_earlier_run_or_the_future_replays_the_whole_buffer():
    log = make(first_id=5000)
    evs = [log.emit("peer.joined", {}) for _ in range(3)]
    assert log.subscribe(after_id=17).take() == evs  # below first_id: an earlier run of the node
    assert log.subscribe(after_id=10**9).take() == evs  # never issued here
    assert log.subscribe(after_id=evs[-1].id).take() == []  # up to date


def test_type_prefix_filter_applies_to_replay_and_live_events():
    log = make()
    log.emit("peer.joined", {})
    m = log.emit("model.loaded", {})
    sub = log.subscribe(after_id=0, prefixes=("model.", "runner."))
    assert sub.take() == [m]
    log.emit("request.finished", {})
    r = log.emit("runner.restarted", {})
    assert sub.take() == [r]


def test_a_reader_that_falls_behind_gets_one_dropped_event_and_continues():
    log = make(queue_size=4)
    sub = log.subscribe()
    evs = [log.emit("request.finished", {"n": i}) for i in range(10)]
    got = sub.take()
    assert got[:4] == evs[:4]
    assert got[4].type == DROPPED and json.loads(got[4].data) == {
        "dropped": 6,
        "id": evs[-1].id,
        "ts": got[4].ts,
        "type": DROPPED,
    }
    assert not sub.closed
    later = log.emit("peer.joined", {})
    assert sub.take() == [later]
    assert log.statistics().dropped == 6


def test_a_reader_that_keeps_falling_behind_is_closed_and_unsubscribed():
    log = make(queue_size=2)
    sub = log.subscribe()
    for i in range(2 + 4 * 2):  # a full queue, then DROP_CLOSE_FACTOR queues' worth lost
        log.emit("request.finished", {"n": i})
    assert sub.closed and log.statistics().subscribers == 0 and log.statistics().closed_slow == 1
    got = sub.take()
    assert len(got) == 3 and got[-1].type == DROPPED  # what it had, then the count
    log.emit("peer.joined", {})
    assert sub.take() == []


def test_wake_is_called_for_each_event_the_subscriber_wants():
    log = make()
    woken = []
    log.subscribe(prefixes=("peer.",), wake=lambda: woken.append(1))
    log.emit("model.loaded", {})
    log.emit("peer.dead", {})
    assert woken == [1]


def test_subscribers_are_bounded_and_closing_frees_a_place():
    log = make(max_subscribers=2)
    a = log.subscribe()
    log.subscribe()
    with pytest.raises(TooManySubscribers):
        log.subscribe()
    a.close()
    log.subscribe()
    log.emit("peer.joined", {})
    assert a.take() == []  # closed: no longer fed


@pytest.mark.parametrize(
    "text,expected",
    [
        (None, ()),
        ("", ()),
        ("peer.,model.", ("peer.", "model.")),
        (" peer. , ,runner", ("peer.", "runner")),
    ],
)
def test_parse_prefixes(text, expected):
    assert parse_prefixes(text) == expected


@pytest.mark.parametrize("text", ["PEER.", "peer.*", "a" * 65, ",".join(["x"] * 17), "peer joined"])
def test_parse_prefixes_refuses_what_is_not_a_type_prefix(text):
    with pytest.raises(ValueError, match="types"):
        parse_prefixes(text)


def test_rate_gate_lets_one_through_per_interval():
    gate = RateGate(0.5)
    assert [gate.allow(t) for t in (0.0, 0.1, 0.49, 0.5, 0.6, 1.2)] == [True, False, False, True, False, True]
    assert gate.skipped == 3


def test_a_long_replay_does_not_crowd_out_live_events():
    log = make(capacity=50, queue_size=4)
    old = [log.emit("peer.alive", {}) for _ in range(20)]
    sub = log.subscribe(after_id=0)
    live = [log.emit("peer.dead", {}) for _ in range(4)]
    assert sub.pending == 24
    assert sub.take() == old + live  # all of it, in id order, nothing dropped
