"""The history ring and sampler of ``GET /api/history`` (hydra_node/admin/history.py): bounds,
percentiles, and the trio loop in virtual time."""

from __future__ import annotations

import itertools

import pytest
import trio

from hydra_node.routing.metric import percentile
from hydra_node.admin.history import (
    MAX_RTT_PEERS,
    MAX_TTFT_SAMPLES,
    HistoryPoint,
    HistoryRing,
    HistorySampler,
    IntervalStats,
)


def point(ts: float) -> HistoryPoint:
    return HistoryPoint(ts=ts, tok_s=0.0, ttft_p50_ms=None, ttft_p95_ms=None, queue_depth=0, in_flight=0, requests=0)


def test_ring_keeps_the_newest_capacity_points_oldest_first():
    ring = HistoryRing(3)
    for ts in range(7):
        ring.append(point(float(ts)))
    assert [p.ts for p in ring.since()] == [4.0, 5.0, 6.0] and len(ring) == 3
    assert [p.ts for p in ring.since(4.5)] == [5.0, 6.0]
    with pytest.raises(ValueError):
        HistoryRing(0)


@pytest.mark.parametrize(
    "values,q,expected",
    [
        ([], 50, None),
        ([7.0], 95, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([4.0, 3.0, 2.0, 1.0], 95, 4.0),
        (list(range(1, 101)), 95, 95),
        (list(range(1, 101)), 50, 50),
    ],
)
def test_percentile_is_nearest_rank(values, q, expected):  # the history uses the routing's percentile
    assert percentile([float(v) for v in values], q / 100) == expected


def test_interval_bounds_ttft_samples_and_rtt_peers():
    stats = IntervalStats()
    for i in range(MAX_TTFT_SAMPLES + 10):
        stats.observe(float(i), 1)
    stats.observe(float("nan"), 1)
    assert len(stats.ttfts) == MAX_TTFT_SAMPLES and stats.requests == MAX_TTFT_SAMPLES + 11
    rtts = {f"{i:064x}": float(i) for i in range(MAX_RTT_PEERS + 20)}
    p = stats.point(10.0, 2.0, queue_depth=1, in_flight=0, rtt_ms=rtts)
    assert len(p.rtt_ms) == MAX_RTT_PEERS and max(p.rtt_ms.values()) == MAX_RTT_PEERS - 1  # the nearest kept
    assert p.tok_s == (MAX_TTFT_SAMPLES + 11) / 2.0


def test_sampler_refuses_a_bad_interval():
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            HistorySampler(bad, runners=list, links=list)


async def test_run_records_a_point_every_interval(autojump_clock):
    history = HistorySampler(5.0, runners=list, links=list, clock=trio.current_time)

    class Obs:
        ttft_ms, completion_tokens = 12.0, 50

    async with trio.open_nursery() as nursery:
        await nursery.start(history.run)
        assert len(history.ring) == 0  # ready at once, the first point after one interval
        await trio.sleep(2.0)
        history.observe(Obs())
        await trio.sleep(3.5)
        assert len(history.ring) == 1
        await trio.sleep(5.0 * 3)
        nursery.cancel_scope.cancel()
    series = history.ring.since()
    assert len(series) == 4
    assert [round(b.ts - a.ts, 6) for a, b in itertools.pairwise(series)] == [5.0, 5.0, 5.0]
    assert (series[0].requests, series[0].tok_s, series[0].ttft_p50_ms) == (1, 10.0, 12.0)
    assert series[1].requests == 0
