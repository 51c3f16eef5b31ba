"""score(): each term on its own, then properties (dominance, monotonicity, finiteness)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.routing import Candidate, RequestFeatures, SchedulerConfig, Target, TargetView, score
from hydra_node.routing.scheduler import MAX_TERM_MS, cooldown_ms

PEER = Target("peer", "m")
LOCAL = Target("local", "m")
CONFIG = SchedulerConfig()
REQ = RequestFeatures("m", prompt_tokens=1000, max_tokens=200, expected_output_tokens=100)
VIEW = TargetView(
    rtt_ms=20,
    jitter_ms=5,
    tpot_ms=30,
    prefill_ms_per_token=0.5,
    service_ms=2000,
    success_rate=0.8,
    failure_ms=1000,
    queue_wait_ms=100,
    cache_hit_ratio=0.5,
    measured=True,
)


def test_every_term_of_a_measured_remote_target() -> None:
    s = score(Candidate(PEER, 8192, in_flight=3, slots=2), REQ, VIEW, CONFIG, 0.0)
    assert s.queue_ms == 2000  # 2 requests ahead x 2000 ms service / 2 slots
    assert s.network_ms == 25  # RTT + jitter
    assert s.prefill_ms == 500  # 1000 tokens x 0.5 ms
    assert s.decode_ms == 1500  # 100 tokens x 30 ms x decode_weight 0.5
    assert s.failure_ms == pytest.approx(300)  # 0.2 x (500 penalty + 1000 ms to fail)
    assert (s.cold_start_ms, s.kv_transfer_ms, s.cooldown_ms, s.unknown_ms) == (0, 0, 0, 0)
    assert s.predicted_ttft_ms == 2525 and s.predicted_tpot_ms == 30
    assert s.ttft_budget_ms == 450  # excess 2075 ms, saturating at one budget
    assert s.tpot_budget_ms == 0 and s.affinity_credit_ms == 0
    assert s.total_ms == pytest.approx(2000 + 25 + 500 + 1500 + 300 + 450)


def test_queue_uses_gossiped_depth_and_measured_wait() -> None:
    idle = Candidate(PEER, 8192, in_flight=0, slots=2)
    assert score(idle, REQ, VIEW, CONFIG, 0.0).queue_ms == 100  # unknown depth: measured wait
    known = dataclasses.replace(idle, queue_depth=0)
    assert score(known, REQ, VIEW, CONFIG, 0.0).queue_ms == 0
    deep = dataclasses.replace(idle, queue_depth=3)
    assert score(deep, REQ, VIEW, CONFIG, 0.0).queue_ms == 4 * 2000 / 2


def test_affinity_prefill_discount_and_credit() -> None:
    s = score(Candidate(PEER, 8192), REQ, VIEW, CONFIG, 0.0, affinity=True, affinity_tokens=800)
    assert s.cached_tokens == 800 and s.prefill_ms == 100
    assert s.affinity_credit_ms == 40  # 80 ms x measured cache hit ratio 0.5
    huge = score(Candidate(PEER, 8192), REQ, VIEW, CONFIG, 0.0, affinity=True, affinity_tokens=5000)
    assert huge.cached_tokens == 1000 and huge.prefill_ms == 0


def test_priors_unknown_penalty_and_hints() -> None:
    c = Candidate(PEER, 8192, advertised_decode_tps=50, advertised_prefill_tps=2000)
    s = score(c, REQ, TargetView(), CONFIG, 0.0)
    assert s.unknown_ms == 75 and s.network_ms == 0
    assert s.decode_ms == 100 * 20 * 0.5 and s.prefill_ms == 500
    assert score(c, REQ, TargetView(hinted=True, tpot_ms=10), CONFIG, 0.0).unknown_ms == 37.5
    bare = score(Candidate(PEER, 8192), REQ, TargetView(), CONFIG, 0.0)
    assert bare.decode_ms == 100 * CONFIG.default_tpot_ms * 0.5
    assert bare.prefill_ms == 1000 * CONFIG.default_prefill_ms_per_token
    local = score(Candidate(LOCAL, 8192), REQ, TargetView(rtt_ms=50), CONFIG, 0.0)
    assert local.unknown_ms == 0 and local.network_ms == 0


def test_cold_start_and_kv_transfer() -> None:
    cold = Candidate(PEER, 8192, model_loaded=False)
    assert score(cold, REQ, VIEW, CONFIG, 0.0).cold_start_ms == CONFIG.default_cold_start_ms
    assert score(cold, REQ, dataclasses.replace(VIEW, artifact_ms=3000), CONFIG, 0.0).cold_start_ms == 3000
    kv_req = dataclasses.replace(REQ, kv_transfer_bytes=10_000_000)
    c = Candidate(PEER, 8192)
    assert score(c, kv_req, dataclasses.replace(VIEW, bandwidth_bps=10e6), CONFIG, 0.0).kv_transfer_ms == 1000
    assert score(c, kv_req, dataclasses.replace(VIEW, kv_transfer_ms=300), CONFIG, 0.0).kv_transfer_ms == 300
    assert score(c, kv_req, VIEW, CONFIG, 0.0).kv_transfer_ms == 800  # default 100 Mbit/s
    assert score(c, REQ, dataclasses.replace(VIEW, bandwidth_bps=1.0), CONFIG, 0.0).kv_transfer_ms == 0


def test_cooldown_budget_and_retry_terms() -> None:
    cooling = dataclasses.replace(VIEW, consecutive_failures=3, last_failure_at=10.0)
    assert score(Candidate(PEER, 8192), REQ, cooling, CONFIG, 11.0).cooldown_ms == pytest.approx(7000)
    assert score(Candidate(PEER, 8192), REQ, cooling, CONFIG, 19.0).cooldown_ms == 0
    slow = dataclasses.replace(VIEW, tpot_ms=60)
    assert score(Candidate(PEER, 8192), REQ, slow, CONFIG, 0.0).tpot_budget_ms == 20 * 100
    retry = score(Candidate(PEER, 8192), REQ, VIEW, CONFIG, 0.0, retry_ttft_ms=1000)
    assert retry.failure_ms == pytest.approx(0.2 * (500 + 1000 + 1000))


# ---- properties ---------------------------------------------------------------------------
_ms = st.floats(0, 1e5, allow_nan=False)
_OPTIONAL = (
    "rtt_ms",
    "jitter_ms",
    "tpot_ms",
    "prefill_ms_per_token",
    "service_ms",
    "queue_wait_ms",
    "failure_ms",
    "artifact_ms",
    "kv_transfer_ms",
)


@st.composite
def dominated_pair(draw):
    """(better, worse) views and candidates: worse is no better in any measured input."""
    present = {name: draw(st.booleans()) for name in _OPTIONAL}
    good = {name: draw(_ms) if present[name] else None for name in _OPTIONAL}
    bad = {name: None if v is None else v + draw(_ms) for name, v in good.items()}
    ok = draw(st.floats(0, 1))
    bw = draw(st.floats(1, 1e9))
    hit = draw(st.floats(0, 1))
    fails = draw(st.integers(0, 5))
    at = draw(st.floats(0, 100))
    better = TargetView(
        **good,
        success_rate=ok,
        bandwidth_bps=bw,
        cache_hit_ratio=hit,
        consecutive_failures=fails,
        last_failure_at=at if fails else None,
        measured=True,
    )
    worse = TargetView(
        **bad,
        success_rate=ok * draw(st.floats(0, 1)),
        bandwidth_bps=bw / draw(st.floats(1, 10)),
        cache_hit_ratio=hit * draw(st.floats(0, 1)),
        consecutive_failures=fails + draw(st.integers(0, 3)),
        last_failure_at=at if fails else 50.0,
        measured=True,
    )
    remote = draw(st.booleans())
    target = PEER if remote else LOCAL
    in_flight = draw(st.integers(0, 20))
    depth = draw(st.none() | st.integers(0, 20))
    slots = draw(st.integers(1, 8))
    c_good = Candidate(target, 32768, in_flight=in_flight, queue_depth=depth, slots=slots + draw(st.integers(0, 4)))
    c_bad = Candidate(
        target,
        32768,
        in_flight=in_flight + draw(st.integers(0, 5)),
        queue_depth=None if depth is None else depth + draw(st.integers(0, 5)),
        slots=slots,
    )
    return better, worse, c_good, c_bad


_requests = st.builds(
    RequestFeatures,
    model=st.just("m"),
    prompt_tokens=st.integers(0, 20000),
    max_tokens=st.none() | st.integers(1, 4096),
    expected_output_tokens=st.none() | st.integers(1, 4096),
    kv_transfer_bytes=st.integers(0, 10**9),
)


@settings(max_examples=200, deadline=None)
@given(dominated_pair(), _requests, st.booleans(), st.integers(0, 20000), st.floats(0, 200))
def test_dominating_target_never_scores_worse(pair, request, affinity, cached, now) -> None:
    better, worse, c_good, c_bad = pair
    kw = dict(affinity=affinity, affinity_tokens=cached)
    assert (
        score(c_good, request, better, CONFIG, now, **kw).total_ms
        <= score(c_bad, request, worse, CONFIG, now, **kw).total_ms + 1e-6
    )


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.floats(0, 1e4), st.floats(0, 1e4), _requests)
def test_monotone_in_queue_depth_and_rtt(q1, q2, r1, r2, request) -> None:
    lo_q, hi_q = sorted((q1, q2))
    lo_r, hi_r = sorted((r1, r2))
    view = dataclasses.replace(VIEW, rtt_ms=lo_r)
    for field in ("in_flight", "queue_depth"):
        a = score(Candidate(PEER, 32768, **{field: lo_q}), request, view, CONFIG, 0.0)
        b = score(Candidate(PEER, 32768, **{field: hi_q}), request, view, CONFIG, 0.0)
        assert a.total_ms <= b.total_ms and a.queue_ms <= b.queue_ms
    near = score(Candidate(PEER, 32768), request, view, CONFIG, 0.0)
    far = score(Candidate(PEER, 32768), request, dataclasses.replace(VIEW, rtt_ms=hi_r), CONFIG, 0.0)
    assert near.total_ms <= far.total_ms


_any_ms = st.floats(0, 1e308, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    st.builds(
        TargetView,
        rtt_ms=_any_ms,
        jitter_ms=_any_ms,
        tpot_ms=st.none() | _any_ms,
        prefill_ms_per_token=st.none() | _any_ms,
        service_ms=st.none() | _any_ms,
        queue_wait_ms=st.none() | _any_ms,
        failure_ms=st.none() | _any_ms,
        success_rate=st.none() | st.floats(0, 1),
        bandwidth_bps=st.none() | _any_ms,
        artifact_ms=st.none() | _any_ms,
        consecutive_failures=st.integers(0, 10**6),
        last_failure_at=st.none() | st.floats(-1e300, 1e300),
        measured=st.booleans(),
    ),
    st.builds(
        Candidate,
        target=st.sampled_from((PEER, LOCAL)),
        context_length=st.integers(0, 10**9),
        in_flight=st.integers(0, 10**9),
        queue_depth=st.none() | st.integers(0, 10**9),
        slots=st.integers(1, 10**6),
        model_loaded=st.booleans(),
        advertised_decode_tps=st.none() | st.floats(1e-300, 1e300),
        advertised_prefill_tps=st.none() | st.floats(1e-300, 1e300),
    ),
    _requests,
    st.floats(-1e300, 1e300),
    _any_ms,
)
def test_scores_are_always_finite(view, candidate, request, now, retry) -> None:
    s = score(candidate, request, view, CONFIG, now, affinity=True, affinity_tokens=10, retry_ttft_ms=retry)
    for value in dataclasses.asdict(s).values():
        if isinstance(value, float):
            assert math.isfinite(value)
    assert s.total_ms <= 20 * MAX_TERM_MS


def test_cooldown_grows_exponentially_to_the_cap() -> None:
    config = SchedulerConfig(cooldown_base_ms=1000, cooldown_max_ms=60_000)
    values = [cooldown_ms(n, config) for n in range(0, 10)]
    assert values[:7] == [0, 1000, 2000, 4000, 8000, 16000, 32000]
    assert values[7:] == [60_000] * 3
    assert cooldown_ms(10**9, config) == 60_000


def test_invalid_inputs_are_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="TargetView.rtt_ms"):
        TargetView(rtt_ms=math.nan)
    with pytest.raises(ValueError, match="Candidate.slots"):
        Candidate(PEER, 10, slots=0)
    with pytest.raises(ValueError, match="Candidate.advertised_decode_tps"):
        Candidate(PEER, 10, advertised_decode_tps=math.inf)
    with pytest.raises(ValueError, match="RequestFeatures.prompt_tokens"):
        RequestFeatures("m", -1)
    with pytest.raises(ValueError, match="Target.node"):
        Target("", "m")
