"""`PingTracker`: RTT from ping/pong payloads, with a bounded table of outstanding pings."""

from __future__ import annotations

from hydra_node.mesh.link.pings import PingTracker


def test_a_pong_for_an_outstanding_ping_sets_the_rtt() -> None:
    pings = PingTracker()
    opaque = pings.ping(10.0)
    assert pings.rtt_ms is None
    pings.pong(opaque, 10.025)
    assert abs(pings.rtt_ms - 25.0) < 1e-9


def test_payloads_are_distinct_eight_byte_counters() -> None:
    pings = PingTracker()
    assert [pings.ping(0.0) for _ in range(3)] == [i.to_bytes(8, "big") for i in range(3)]


def test_unknown_or_repeated_pongs_are_ignored() -> None:
    pings = PingTracker()
    opaque = pings.ping(1.0)
    pings.pong(b"\xff" * 8, 1.5)
    assert pings.rtt_ms is None
    pings.pong(opaque, 1.010)
    pings.pong(opaque, 3.0)  # the same pong again: already answered
    assert abs(pings.rtt_ms - 10.0) < 1e-9


def test_only_the_newest_pings_are_remembered() -> None:
    pings = PingTracker(max_outstanding=2)
    first, second, third = (pings.ping(t) for t in (0.0, 1.0, 2.0))
    pings.pong(first, 5.0)  # forgotten: a peer that never answers cannot grow the table
    assert pings.rtt_ms is None
    pings.pong(second, 1.5)
    assert abs(pings.rtt_ms - 500.0) < 1e-9
    pings.pong(third, 2.25)
    assert abs(pings.rtt_ms - 250.0) < 1e-9
