"""decide(): eligibility, mode semantics, affinity, cooldown, bounded state, request features."""

from __future__ import annotations

import json

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.routing import (
    Candidate,
    RequestFeatures,
    Scheduler,
    SchedulerConfig,
    SchedulerMode,
    SchedulerState,
    Target,
    TelemetryStore,
    affinity_keys,
    decide,
    request_features,
)
from hydra_node.routing._affinity import AffinityTable
from hydra_node.routing.scheduler import DECISION_LOG_SIZE

X, Y, Z = Target("x", "m"), Target("y", "m"), Target("z", "m")
ACTIVE = SchedulerConfig(mode=SchedulerMode.ACTIVE)


def _measured(store: TelemetryStore, target: Target, now: float, *, rtt: float, tpot: float) -> None:
    """One finished request (prefill 0.02 ms/token, ``tpot`` ms/token) and one RTT probe."""
    store.observe_probe(target, rtt, now)
    store.observe_request(
        target,
        now,
        queue_wait_ms=0,
        ttft_ms=20 + rtt,
        duration_ms=20 + rtt + 100 * tpot,
        prompt_tokens=1000,
        completion_tokens=101,
        network_ms=rtt,
    )


def test_eligibility_reasons_and_no_target() -> None:
    state = SchedulerState()
    req = RequestFeatures("m", prompt_tokens=3000, max_tokens=1000)
    cands = [
        Candidate(Target("a", "other"), 8192),
        Candidate(Target("b", "m"), 8192, healthy=False),
        Candidate(Target("c", "m"), 8192, hosts_model=False),
        Candidate(Target("d", "m"), 2048),
    ]
    d = decide(cands, req, TelemetryStore(), ACTIVE, 0.0, state)
    assert d.target is None and state.counters["no_target"] == 1
    assert [r for _, r in d.excluded] == ["other model", "unhealthy", "model not hosted", "context 2048 < 4000"]
    d = decide(
        [*cands, Candidate(Target("e", "m"), 8192), Candidate(Target("e", "m"), 8192)],
        req,
        TelemetryStore(),
        ACTIVE,
        0.0,
        state,
    )
    assert d.target == Target("e", "m") and d.excluded[-1][1] == "duplicate candidate"


def test_modes_off_shadow_active() -> None:
    store = TelemetryStore()
    _measured(store, X, 0.0, rtt=10, tpot=80)  # close but slow
    _measured(store, Y, 0.0, rtt=50, tpot=10)  # further but fast
    cands = [Candidate(X, 8192), Candidate(Y, 8192)]
    req = RequestFeatures("m", 500, 200)
    results = {}
    for mode in SchedulerMode:
        state = SchedulerState()
        d = decide(cands, req, store, SchedulerConfig(mode=mode), 1.0, state)
        results[mode] = (d, state.counters)
    off, shadow, active = (results[m] for m in (SchedulerMode.OFF, SchedulerMode.SHADOW, SchedulerMode.ACTIVE))
    assert off[0].target == X and off[0].baseline == X  # lowest queue, then lowest RTT
    assert shadow[0].target == X and shadow[0].scheduled == Y and shadow[0].disagreement
    assert shadow[1]["shadow_disagreements"] == 1 and shadow[1]["overrides"] == 0
    assert active[0].target == Y and active[0].override and active[1]["overrides"] == 1
    assert active[0].scores[0].target == Y and active[0].scores[0].total_ms < active[0].scores[1].total_ms


def test_affinity_kept_within_threshold_then_overridden() -> None:
    store = TelemetryStore()
    _measured(store, X, 0.0, rtt=100, tpot=10)
    _measured(store, Y, 0.0, rtt=40, tpot=10)
    state = SchedulerState()
    req = RequestFeatures("m", 1000, 200, session_key="s1")
    first = decide([Candidate(X, 8192)], req, store, ACTIVE, 1.0, state)
    assert first.target == X
    second = decide([Candidate(X, 8192), Candidate(Y, 8192)], req, store, ACTIVE, 2.0, state)
    by = {s.target: s for s in second.scores}
    assert second.affinity_target == X and by[X].cached_tokens == 1000
    assert 0 < by[X].total_ms - by[Y].total_ms <= ACTIVE.affinity_override_threshold_ms
    assert second.target == X and "affinity kept" in second.reason
    _measured(store, X, 3.0, rtt=400, tpot=10)  # X's link got much worse
    third = decide([Candidate(X, 8192), Candidate(Y, 8192)], req, store, ACTIVE, 3.0, state)
    assert third.target == Y and "affinity beaten" in third.reason
    assert state.counters["affinity_hits"] == 1 and state.counters["affinity_overrides"] == 1
    assert state.affinity.get("s1", 4.0).target == Y  # the session follows the routed target
    assert state.affinity.get("s1", 4.0 + ACTIVE.affinity_ttl_ms / 1000) is None  # TTL


def test_cooldown_grows_exponentially_and_resets_after_success() -> None:
    store = TelemetryStore()
    _measured(store, X, 0.0, rtt=10, tpot=10)
    _measured(store, Y, 0.0, rtt=10, tpot=30)
    cands = [Candidate(X, 8192), Candidate(Y, 8192)]
    req = RequestFeatures("m", 100, 50)
    remaining = []
    for n in range(1, 5):
        store.observe_failure(X, float(n), elapsed_ms=10)
        d = decide(cands, req, store, ACTIVE, float(n), SchedulerState())
        remaining.append({s.target: s for s in d.scores}[X].cooldown_ms)
        assert d.target == Y
    base = ACTIVE.cooldown_base_ms
    assert remaining == [base, 2 * base, 4 * base, 8 * base]
    store.observe_success(X, 5.0)
    d = decide(cands, req, store, ACTIVE, 5.0, SchedulerState())
    assert {s.target: s for s in d.scores}[X].cooldown_ms == 0


def test_bounded_log_affinity_and_status() -> None:
    sched = Scheduler(ACTIVE)
    for i in range(DECISION_LOG_SIZE * 3):
        sched.decide([Candidate(X, 8192), Candidate(Y, 8192)], RequestFeatures("m", 10, session_key=f"s{i}"), float(i))
    assert len(sched.state.log) == DECISION_LOG_SIZE
    status = sched.status()
    assert status["mode"] == "active" and status["decisions"] == DECISION_LOG_SIZE * 3
    assert len(status["recent_decisions"]) == 16 and status["config"]["ttft_budget_ms"] == 450
    json.dumps(status)
    cbor2.dumps(status)
    table = AffinityTable(max_entries=100)
    for i in range(10_000):
        table.put(f"k{i}", X, 1, 0.0, 60.0)
    assert len(table) == 100 and table.get("k9999", 1.0) is not None and table.get("k0", 1.0) is None
    assert table.forget_target(X) == 100 and len(table) == 0


def test_expected_output_comes_from_telemetry() -> None:
    store = TelemetryStore()
    _measured(store, X, 0.0, rtt=10, tpot=10)
    d = decide([Candidate(X, 8192)], RequestFeatures("m", 10, max_tokens=4000), store, ACTIVE, 0.0, SchedulerState())
    assert d.scores[0].decode_ms == 101 * 10 * ACTIVE.decode_weight


# ---- properties ---------------------------------------------------------------------------
_targets = st.sampled_from([Target(n, mdl) for n in ("local", "a", "b", "c") for mdl in ("m", "q")])
_candidates = st.lists(
    st.builds(
        Candidate,
        target=_targets,
        context_length=st.integers(0, 8192),
        healthy=st.booleans(),
        hosts_model=st.booleans(),
        in_flight=st.integers(0, 8),
        queue_depth=st.none() | st.integers(0, 8),
        slots=st.integers(1, 4),
    ),
    max_size=8,
)
_observations = st.lists(
    st.tuples(_targets, st.sampled_from(["ok", "fail", "probe"]), st.floats(0, 500), st.integers(1, 200)), max_size=12
)
_requests = st.lists(
    st.tuples(st.integers(0, 6000), st.sampled_from([None, "s1", "s2"]), st.sampled_from([None, "p1"])),
    min_size=1,
    max_size=6,
)


def _feed(store: TelemetryStore, observations) -> None:
    for i, (target, kind, ms, tokens) in enumerate(observations):
        now = i * 0.1
        if kind == "ok":
            store.observe_request(
                target,
                now,
                queue_wait_ms=ms / 10,
                ttft_ms=ms,
                duration_ms=ms * 3,
                prompt_tokens=tokens * 5,
                completion_tokens=tokens,
            )
        elif kind == "fail":
            store.observe_failure(target, now, ms)
        else:
            store.observe_probe(target, ms, now)


def _eligible(c: Candidate, req: RequestFeatures) -> bool:
    return c.target.model == req.model and c.healthy and c.hosts_model and c.context_length >= req.context_needed()


@settings(max_examples=150, deadline=None)
@given(_candidates, _observations, _requests, st.sampled_from(list(SchedulerMode)))
def test_routed_target_is_always_eligible(cands, observations, requests, mode) -> None:
    store = TelemetryStore()
    _feed(store, observations)
    state = SchedulerState()
    for i, (prompt, session, prefix) in enumerate(requests):
        req = RequestFeatures("m", prompt, 64, session_key=session, prefix_key=prefix)
        d = decide(cands, req, store, SchedulerConfig(mode=mode), 2.0 + i, state)
        ok = [c.target for c in cands if _eligible(c, req)]
        assert (d.target is None) == (not ok)
        if d.target is not None:
            assert d.target in ok and d.scheduled in ok and d.baseline in ok


@settings(max_examples=150, deadline=None)
@given(_candidates, _observations, _requests)
def test_shadow_never_changes_the_routed_choice(cands, observations, requests) -> None:
    store = TelemetryStore()
    _feed(store, observations)
    off_state, shadow_state = SchedulerState(), SchedulerState()
    for i, (prompt, session, prefix) in enumerate(requests):
        req = RequestFeatures("m", prompt, 64, session_key=session, prefix_key=prefix)
        off = decide(cands, req, store, SchedulerConfig(mode=SchedulerMode.OFF), 2.0 + i, off_state)
        shadow = decide(cands, req, store, SchedulerConfig(mode=SchedulerMode.SHADOW), 2.0 + i, shadow_state)
        assert shadow.target == off.target == shadow.baseline
        assert not shadow.override and shadow.disagreement == (shadow.scheduled != shadow.target)
    assert shadow_state.counters["overrides"] == 0


# ---- request features ---------------------------------------------------------------------
def test_affinity_keys_from_openai_bodies() -> None:
    cfg = SchedulerConfig()
    turn1 = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    turn2 = {
        "messages": [
            *turn1["messages"],
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ],
        "user": "alice",
        "max_tokens": 64,
    }
    s1, p1, n1 = affinity_keys(turn1, "m", cfg)
    s2, p2, _ = affinity_keys(turn2, "m", cfg)
    assert s1 is None and s2 is not None and p1 == p2 and n1 == len("be brief\nhi") // 4
    assert affinity_keys(turn2, "other", cfg)[0] != s2  # keys are per model
    assert (
        affinity_keys(turn1, "m", cfg, session_header="abc")[0]
        == affinity_keys({"prompt_cache_key": "abc", **turn1}, "m", cfg)[0]
    )
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert (
        affinity_keys(parts, "m", cfg)[1]
        == affinity_keys({"messages": [{"role": "user", "content": "hi"}]}, "m", cfg)[1]
    )
    feats = request_features(turn2, "m", 40, cfg)
    assert feats.max_tokens == 64 and feats.session_key == s2 and feats.prefix_tokens == 2


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "messages",
                    "role",
                    "content",
                    "user",
                    "tools",
                    "prompt",
                    "max_tokens",
                    "text",
                    "type",
                    "session_id",
                    "prompt_cache_key",
                ]
            )
            | st.text(max_size=4),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(-5, 10**6))
def test_request_features_never_crash_on_untrusted_bodies(body, prompt_tokens) -> None:
    feats = request_features(body, "m", prompt_tokens, SchedulerConfig())
    assert feats.prompt_tokens >= 0 and 0 <= feats.prefix_tokens <= feats.prompt_tokens
