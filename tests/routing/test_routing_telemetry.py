"""TelemetryStore: metrics, staleness, caps and LRU, status snapshot, gossip hints."""

from __future__ import annotations

import math

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.routing import InvalidHint, Target, TargetView, TelemetryStore
from hydra_node.routing.metric import EWMA_ALPHA, WINDOW_SAMPLES, Metric, percentile
from hydra_node.routing.telemetry import MAX_HINT_SOURCES, MAX_HINT_TARGETS, MAX_TARGETS

LOCAL = Target("local", "m")
PEER = Target("peer-a", "m")


def test_metric_ewma_window_and_rejects() -> None:
    m = Metric()
    assert m.add(100.0, 1.0) and m.ewma == 100.0
    assert m.add(200.0, 2.0)
    assert m.ewma == pytest.approx(EWMA_ALPHA * 200 + (1 - EWMA_ALPHA) * 100)
    for bad in (math.nan, math.inf, -1.0, "x", None):
        assert not m.add(bad, 3.0)  # type: ignore[arg-type]
    assert m.count == 2 and m.updated_at == 2.0
    for i in range(WINDOW_SAMPLES * 3):
        m.add(float(i), 4.0)
    assert len(m.window) == WINDOW_SAMPLES
    assert m.fresh(4.0 + 9.9, 10.0) is not None and m.fresh(4.0 + 10.1, 10.0) is None


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.95) == 95.0
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0


def test_probe_rtt_and_jitter() -> None:
    store = TelemetryStore()
    for t, rtt in enumerate((20.0, 30.0, 25.0)):
        store.observe_probe(PEER, rtt, float(t))
    view = store.view(PEER, 2.0)
    assert view.rtt_ms == pytest.approx(0.25 * 25 + 0.75 * (0.25 * 30 + 0.75 * 20))
    assert view.jitter_ms == pytest.approx(0.25 * 5 + 0.75 * 10)  # |30-20|, then |25-30|
    assert view.measured and not view.hinted


def test_observe_request_derives_every_metric() -> None:
    store = TelemetryStore()
    store.observe_probe(PEER, 10.0, 0.0)
    store.observe_request(
        PEER,
        1.0,
        queue_wait_ms=40.0,
        ttft_ms=250.0,
        duration_ms=2250.0,
        prompt_tokens=500,
        cached_tokens=300,
        completion_tokens=101,
    )
    v = store.view(PEER, 1.0)
    assert v.queue_wait_ms == 40.0 and v.ttft_ms == 250.0
    assert v.prefill_ms_per_token == pytest.approx((250 - 40 - 10) / 200)
    assert v.tpot_ms == pytest.approx(2000 / 100)
    assert v.tokens_per_s == pytest.approx(101 * 1000 / 2250)
    assert v.service_ms == pytest.approx(2210.0)
    assert v.cache_hit_ratio == pytest.approx(0.6)
    assert v.success_rate == 1.0 and v.consecutive_failures == 0
    assert store.expected_output_tokens("m") == 101


def test_bandwidth_kv_artifact_and_failures() -> None:
    store = TelemetryStore()
    store.observe_transfer(PEER, 1_000_000, 100.0, 0.0)
    store.observe_kv_transfer(PEER, 50.0, 0.0, nbytes=1_000_000)
    store.observe_artifact(PEER, 4000.0, 0.0)
    store.observe_failure(PEER, 1.0, elapsed_ms=3000.0)
    store.observe_failure(PEER, 2.0, elapsed_ms=1000.0)
    v = store.view(PEER, 2.0)
    assert v.bandwidth_bps == pytest.approx(0.25 * 20e6 + 0.75 * 10e6)
    assert v.kv_transfer_ms == 50.0 and v.artifact_ms == 4000.0
    assert v.success_rate == 0.0 and v.consecutive_failures == 2 and v.last_failure_at == 2.0
    store.observe_success(PEER, 3.0)
    assert store.view(PEER, 3.0).consecutive_failures == 0


def test_stale_values_are_not_used_but_failures_are_kept() -> None:
    store = TelemetryStore(stale_after_secs=15.0)
    store.observe_probe(PEER, 10.0, 0.0)
    store.observe_failure(PEER, 0.0, 100.0)
    view = store.view(PEER, 16.0)
    assert view.rtt_ms is None and view.success_rate is None and not view.measured
    assert view.consecutive_failures == 1  # the back-off state outlives freshness
    assert store.view(PEER, 16.0, stale_after_ms=20_000).rtt_ms == 10.0


def test_bounded_targets_lru_and_per_node_cap() -> None:
    store = TelemetryStore()
    for i in range(10_000):
        store.observe_probe(Target(f"n{i}", "m"), 1.0, float(i) * 0.001)
    assert len(store) == MAX_TARGETS
    assert Target("n9999", "m") in store.targets() and Target("n0", "m") not in store.targets()

    small = TelemetryStore(max_targets=4, max_models_per_node=2)
    for i in range(10):
        small.observe_probe(Target("one", f"model{i}"), 1.0, float(i))
    assert small.targets() == [Target("one", "model8"), Target("one", "model9")]
    for node in "abcdef":
        small.observe_probe(Target(node, "m"), 1.0, 20.0)
    assert len(small) == 4


def test_ttl_prunes_old_targets() -> None:
    store = TelemetryStore(ttl_secs=100.0)
    store.observe_probe(PEER, 1.0, 0.0)
    store.observe_probe(LOCAL, 1.0, 50.0)
    store.observe_probe(Target("x", "m"), 1.0, 120.0)
    assert PEER not in store.targets() and LOCAL in store.targets()
    assert store.snapshot(151.0)["tracked_targets"] == 1


def test_snapshot_shape() -> None:
    store = TelemetryStore()
    store.observe_request(
        LOCAL, 1.0, queue_wait_ms=1, ttft_ms=50, duration_ms=500, prompt_tokens=100, completion_tokens=10
    )
    store.observe_probe(PEER, 5.0, 1.0)
    snap = store.snapshot(30.0)
    assert {"tracked_targets", "stale_targets", "max_targets", "ttl_secs", "advisory_hints", "targets"} <= snap.keys()
    assert snap["tracked_targets"] == 2 and snap["stale_targets"] == 2
    local = next(t for t in snap["targets"] if t["node"] == "local")
    assert local["kind"] == "local" and local["successes"] == 1
    assert local["metrics"]["ttft_ms"]["p50"] == 50.0 and local["metrics"]["ttft_ms"]["samples"] == 1
    cbor2.dumps(snap)  # plain data


def _peer_with_data(now: float) -> TelemetryStore:
    store = TelemetryStore(local_node_id="me")
    store.observe_request(
        LOCAL,
        now,
        queue_wait_ms=10,
        ttft_ms=110,
        duration_ms=2110,
        prompt_tokens=1000,
        cached_tokens=0,
        completion_tokens=101,
    )
    store.observe_request(
        Target("me", "m"),
        now,
        queue_wait_ms=0,
        ttft_ms=50,
        duration_ms=500,
        prompt_tokens=100,
        completion_tokens=10,
        network_ms=0,
    )
    store.observe_probe(Target("other", "m"), 30.0, now)  # RTT only: not exported
    return store


def test_summary_is_cbor_friendly_and_round_trips() -> None:
    summary = _peer_with_data(5.0).summary(5.0)
    assert summary["v"] == 1 and len(summary["entries"]) == 2
    raw = cbor2.dumps(summary, canonical=True)
    decoded = cbor2.loads(raw)
    for entry in decoded["entries"]:
        assert all(isinstance(k, str) for k in entry)
        assert all(isinstance(v, (int, str)) and not isinstance(v, float) for v in entry.values())
        assert "rtt_ms" not in entry
    mine = TelemetryStore(local_node_id="me")
    assert mine.merge_hint("peer-a", decoded, 6.0) == 1  # the entry about "me" is skipped
    view = mine.view(PEER, 6.0)  # "local" in peer-a's summary means peer-a
    assert view.hinted and not view.measured
    assert view.tpot_ms == pytest.approx(20.0) and view.success_rate == 1.0
    assert view.prefill_ms_per_token == pytest.approx(0.1)


def test_own_measurements_win_and_hints_expire() -> None:
    mine = TelemetryStore(hint_ttl_secs=60.0)
    mine.merge_hint("peer-a", _peer_with_data(0.0).summary(0.0), 0.0)
    mine.observe_tpot(PEER, 99.0, 1.0)
    view = mine.view(PEER, 1.0)
    assert view.tpot_ms == 99.0 and view.measured
    assert view.success_rate == 1.0 and view.hinted  # other fields still come from the hint
    assert not mine.view(PEER, 61.0).hinted


def test_hint_bounds() -> None:
    mine = TelemetryStore()
    for i in range(MAX_HINT_TARGETS + 50):
        entry = {"node": f"n{i}", "model": "m", "age_ms": 0, "n": 1, "ok_pm": 1000}
        mine.merge_hint("src", {"v": 1, "entries": [entry]}, 0.0)
    assert len(mine._hints) == MAX_HINT_TARGETS
    for i in range(MAX_HINT_SOURCES + 3):
        entry = {"node": "x", "model": "m", "age_ms": 0, "n": 1, "ok_pm": 1000}
        mine.merge_hint(f"src{i}", {"v": 1, "entries": [entry]}, 0.0)
    assert len(mine._hints[Target("x", "m")]) == MAX_HINT_SOURCES


@pytest.mark.parametrize(
    "summary, fault",
    [
        ([], "summary"),
        ({"v": 2, "entries": []}, "summary.v"),
        ({"v": 1}, "summary.entries"),
        ({"v": 1, "entries": [1]}, "entries[0]"),
        ({"v": 1, "entries": [{"node": "a", "model": "m", "age_ms": 0}]}, "entries[0].n"),
        ({"v": 1, "entries": [{"node": "", "model": "m", "age_ms": 0, "n": 0}]}, "entries[0].node"),
        ({"v": 1, "entries": [{"node": "a", "model": "m", "age_ms": -1, "n": 0}]}, "age_ms"),
        ({"v": 1, "entries": [{"node": "a", "model": "m", "age_ms": 0, "n": 0, "ttft_ms": 1.5}]}, "ttft_ms"),
        ({"v": 1, "entries": [{"node": "a", "model": "m", "age_ms": 0, "n": 0, "ok_pm": 1001}]}, "ok_pm"),
        ({"v": 1, "entries": [{"node": "a", "model": "m", "age_ms": 0, "n": True}]}, "entries[0].n"),
        ({"v": 1, "entries": [{"node": "a", "model": "m", "age_ms": 0, "n": 0}] * 33}, "33 entries"),
    ],
)
def test_invalid_hints_are_typed_errors(summary: object, fault: str) -> None:
    with pytest.raises(InvalidHint, match=fault.replace("[", r"\[").replace("]", r"\]")):
        TelemetryStore().merge_hint("peer", summary, 0.0)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=30,
)
_entry = st.fixed_dictionaries(
    {
        "node": st.text(max_size=3),
        "model": st.text(max_size=3),
        "age_ms": st.integers(-5, 10**10),
        "n": st.integers(-5, 10**10),
    },
    optional={"ok_pm": _json, "ttft_ms": st.integers(-5, 10**10), "tpot_us": _json, "zz": _json},
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(_json, st.fixed_dictionaries({"v": st.just(1), "entries": st.lists(_entry, max_size=5)})))
def test_merge_hint_never_crashes(summary: object) -> None:
    store = TelemetryStore()
    try:
        kept = store.merge_hint("peer", summary, 100.0)
    except InvalidHint:
        return
    assert 0 <= kept <= 32
    for target in list(store._hints):
        view = store.view(target, 100.0)
        assert isinstance(view, TargetView)


def test_observe_request_rejects_bad_durations() -> None:
    store = TelemetryStore()
    with pytest.raises(ValueError, match="observe_request"):
        store.observe_request(PEER, 0.0, queue_wait_ms=math.nan, ttft_ms=1, duration_ms=2, prompt_tokens=1)
    assert store.view(PEER, 0.0).ttft_ms is None
