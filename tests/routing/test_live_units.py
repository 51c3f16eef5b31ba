"""LiveScheduling without processes: ordering per mode, measured attempts, blame, gossip summary
bounds and hint merging, and the node config's [scheduler] / [runner] keys. Virtual time."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from hydra_node.config import ConfigError, parse_config_text
from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta, event_from_wire
from hydra_node.mesh.membership.announcement import Announcement, Hardware, ModelEntry
from hydra_node.routing.router import Router
from hydra_node.routing.router import RouteTarget as RouterTarget
from hydra_node.routing import SchedulerConfig, SchedulerMode, Target
from hydra_node.routing.live import ANNOUNCE_KEY, ANNOUNCED_ENTRIES, LiveScheduling

MODEL = "m"
FAST, SLOW = "a" * 64, "b" * 64


def _req(text: str = "hello", session: str = "") -> GenerationRequest:
    return GenerationRequest(model=MODEL, kind="chat", messages=(("user", text),), max_tokens=4, session=session)


@dataclass
class FakeHost:
    """A target whose generation sleeps ``token_s`` per token (virtual time), or fails."""

    token_s: float
    fail: GenerationError | None = None
    opened: int = 0

    @asynccontextmanager
    async def open(self, req: GenerationRequest):
        self.opened += 1
        if self.fail is not None:
            raise self.fail

        async def events():
            for _ in range(3):
                await trio.sleep(self.token_s)
                yield TextDelta("x")
            yield Finished("length", prompt_tokens=10, completion_tokens=3, queue_wait_ms=1.0, cached_tokens=4)

        yield events()


@dataclass
class Source:
    targets_: list = field(default_factory=list)

    def targets(self):
        return self.targets_


def _router(mode: str, hosts: dict[str, FakeHost], rtt: dict[str, float]) -> Router:
    live = LiveScheduling(SchedulerConfig.from_mapping({"mode": mode}), "me")
    router = Router("me", live)
    router.add_source(Source([RouterTarget(MODEL, node, False, h.open, 0, rtt[node]) for node, h in hosts.items()]))
    return router


async def _run(router: Router, req: GenerationRequest) -> Finished:
    async with router.generate(req) as events:
        async for ev in events:
            if isinstance(ev, Finished):
                return ev
    raise AssertionError("no Finished")


async def _teach(router: Router, hosts: dict[str, FakeHost]) -> None:
    """Measure both hosts once (through the scheduler's own telemetry)."""
    live = router.scheduling
    for node, host in hosts.items():
        rt = RouterTarget(MODEL, node, False, host.open, 0, 1.0)
        async with live.attempt(rt, _req(f"teach {node}")) as events:
            async for _ in events:
                pass


@pytest.mark.parametrize("mode", ["off", "shadow", "active"])
async def test_modes_route_rule_or_scheduler(mode, autojump_clock):
    hosts = {FAST: FakeHost(0.01), SLOW: FakeHost(1.0)}
    router = _router(mode, hosts, {FAST: 5.0, SLOW: 1.0})  # the fixed rule prefers SLOW (lower RTT)
    await _teach(router, hosts)
    before = {n: h.opened for n, h in hosts.items()}
    for i in range(3):
        await _run(router, _req(f"q{i}"))
    used = {n: h.opened - before[n] for n, h in hosts.items()}
    st = router.scheduling.status()
    assert st["mode"] == mode and st["decisions"] == 3
    if mode == "active":
        assert used == {FAST: 3, SLOW: 0} and st["overrides"] == 3
    else:
        assert used == {FAST: 0, SLOW: 3} and st["overrides"] == 0
        for d in st["recent_decisions"]:
            assert d["target"] == d["baseline"] == f"{SLOW}/{MODEL}" and d["scheduled"] == f"{FAST}/{MODEL}"
    assert st["shadow_disagreements"] == (3 if mode == "shadow" else 0)


async def test_attempt_feeds_telemetry_and_listeners(autojump_clock):
    hosts = {FAST: FakeHost(0.05)}
    router = _router("active", hosts, {FAST: 1.0})
    seen = []
    router.scheduling.listeners.append(seen.append)
    fin = await _run(router, _req())
    assert fin.cached_tokens == 4 and len(seen) == 1
    obs = seen[0]
    assert obs.target == Target(FAST, MODEL) and obs.completion_tokens == 3 and obs.cached_tokens == 4
    assert obs.ttft_ms == pytest.approx(50, abs=1) and obs.duration_ms == pytest.approx(150, abs=1)
    snap = router.scheduling.network_costs()
    (entry,) = snap["targets"]
    assert entry["successes"] == 1 and entry["cache_hit_rate"] == 0.4
    assert entry["metrics"]["tpot_ms"]["avg"] == pytest.approx(50, abs=1)
    assert router.scheduling.in_flight == {}


@pytest.mark.parametrize("status, blamed", [(503, True), (502, True), (429, False), (400, False)])
async def test_failures_are_recorded_only_when_the_target_is_to_blame(status, blamed, autojump_clock):
    err = GenerationError("boom", status=status, retryable=True)
    hosts = {FAST: FakeHost(0.01, fail=err), SLOW: FakeHost(0.01)}
    router = _router("off", hosts, {FAST: 1.0, SLOW: 2.0})
    await _run(router, _req())  # fails on FAST, retried on SLOW
    assert hosts[SLOW].opened == 1 and router.retries == 1
    live = router.scheduling
    assert live.counters["failures_blamed"] == int(blamed)
    view = live.telemetry.view(Target(FAST, MODEL), trio.current_time())
    assert view.consecutive_failures == int(blamed)


async def test_session_affinity_follows_the_session(autojump_clock):
    hosts = {FAST: FakeHost(0.01), SLOW: FakeHost(0.012)}
    router = _router("active", hosts, {FAST: 1.0, SLOW: 1.0})
    await _teach(router, hosts)
    await _run(router, _req("first turn", session="s-1"))
    first = router.scheduling.status()["recent_decisions"][0]["target"]
    await _run(router, _req("another first message", session="s-1"))
    d = router.scheduling.status()["recent_decisions"][0]
    assert d["affinity_target"] == first == d["target"]


async def test_announced_summary_is_bounded_and_valid(autojump_clock):
    live = LiveScheduling(SchedulerConfig(), "me")
    now = trio.current_time()
    for i in range(40):
        live.telemetry.observe_request(
            Target(f"{i:064x}", MODEL),
            now,
            queue_wait_ms=1,
            ttft_ms=20,
            duration_ms=80,
            prompt_tokens=10,
            completion_tokens=4,
        )
    extra = live.announce_extra()
    assert len(extra[ANNOUNCE_KEY]["entries"]) == ANNOUNCED_ENTRIES
    assert live.announce_extra() is extra  # unchanged until ANNOUNCE_REFRESH_S: no new announcement
    ann = Announcement(
        node_id="c" * 64,
        incarnation=1,
        seq=1,
        version="x",
        role="host",
        addresses=(),
        models=(ModelEntry(MODEL, "ready"),),
        hardware=Hardware(1, 1, 0, 1),
        queue_depth=0,
        extra={"name": "n", **extra},
    )  # validates extra's item and depth bounds
    for v in ann.extra[ANNOUNCE_KEY]["entries"][0].values():
        assert isinstance(v, (int, str)) and not isinstance(v, float)


@dataclass
class FakeLink:
    rtt_ms: float | None
    peer_id: str = ""


@dataclass
class FakeMesh:
    links: dict
    members_: dict

    def members(self):
        return self.members_

    def open_links(self):
        return [FakeLink(link.rtt_ms, peer_id) for peer_id, link in self.links.items()]


async def test_sample_records_rtt_and_merges_peer_hints(autojump_clock):
    peer = LiveScheduling(SchedulerConfig(), FAST)
    now = trio.current_time()
    peer.telemetry.observe_request(
        Target("local", MODEL), now, queue_wait_ms=1, ttft_ms=20, duration_ms=80, prompt_tokens=10, completion_tokens=4
    )
    ann = Announcement(
        node_id=FAST,
        incarnation=1,
        seq=3,
        version="x",
        role="host",
        addresses=(),
        models=(ModelEntry(MODEL, "ready"),),
        hardware=Hardware(1, 1, 0, 1),
        queue_depth=0,
        extra={"name": "a", **peer.announce_extra()},
    )
    live = LiveScheduling(SchedulerConfig(), "me")
    mesh = FakeMesh({FAST: FakeLink(3.0)}, {FAST: ann})
    live.sample(mesh, now)
    live.sample(mesh, now + 0.5)  # same RTT, same announcement: nothing new
    view = live.telemetry.view(Target(FAST, MODEL), now + 0.5)
    assert view.rtt_ms == 3.0 and view.hinted and view.tpot_ms == pytest.approx(20.0)
    assert live.counters["rtt_samples"] == 1 and live.counters["hint_summaries_merged"] == 1
    bad = Announcement(
        node_id=FAST,
        incarnation=1,
        seq=4,
        version="x",
        role="host",
        addresses=(),
        models=(),
        hardware=Hardware(1, 1, 0, 1),
        queue_depth=0,
        extra={ANNOUNCE_KEY: {"v": 1, "entries": [{"node": "local"}]}},
    )
    live.sample(FakeMesh({}, {FAST: bad}), now + 1)
    assert live.counters["hint_summaries_rejected"] == 1


def test_node_config_scheduler_section_is_the_routing_config():
    cfg = parse_config_text(
        '[scheduler]\nmode = "active"\ndecode_weight = 0.25\nttft_budget_ms = 300\n'
        '[runner]\ninject_token_delay_ms = 5\n'
    )
    assert cfg.scheduler.mode is SchedulerMode.ACTIVE and cfg.scheduler.decode_weight == 0.25
    assert cfg.runner.inject_token_delay_ms == 5.0
    assert parse_config_text("").runner.inject_token_delay_ms == 0.0


@pytest.mark.parametrize(
    "text, key",
    [
        ("[scheduler]\nmode = 'fast'\n", "[scheduler].mode"),
        ("[scheduler]\nbalance_margin = 2\n", "[scheduler].balance_margin"),
        ("[scheduler]\nnope = 1\n", "[scheduler].nope"),
        ("[runner]\ninject_token_delay_ms = -1\n", "[runner].inject_token_delay_ms"),
        ("[runner]\ninject_token_delay_ms = 1e9\n", "[runner].inject_token_delay_ms"),
    ],
)
def test_node_config_errors_name_the_key(text, key):
    with pytest.raises(ConfigError) as e:
        parse_config_text(text)
    assert key in str(e.value)


def test_session_comes_from_the_body_and_is_bounded():
    from hydra_node.openai.parse import parse_request

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "user": "u" * 1000}
    req, _, _ = parse_request(json.dumps(body).encode(), "chat")
    assert req.session == "u" * 256
    assert GenerationRequest.from_wire(req.to_wire()).session == req.session


@pytest.mark.parametrize(
    "wire",
    [
        {"type": "finished"},
        {"type": "finished", "finish_reason": "stop", "prompt_tokens": float("inf"), "completion_tokens": 1},
        {"type": "finished", "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": "x"},
    ],
)
def test_a_peers_malformed_finished_event_is_a_typed_error(wire):
    with pytest.raises(GenerationError) as e:
        event_from_wire(wire)
    assert e.value.code == "bad_event" and e.value.status == 502


def test_fixed_rule_prefers_a_host_with_free_slots_over_a_busy_one():
    """A host whose engine has free slots is not busy, however many requests it already serves."""
    busy = RouterTarget(MODEL, SLOW, False, FakeHost(0.1).open, queue_depth=1, rtt_ms=1.0, slots=1, free_slots=0)
    roomy = RouterTarget(MODEL, FAST, False, FakeHost(0.1).open, queue_depth=3, rtt_ms=5.0, slots=8, free_slots=5)
    router = Router("me", LiveScheduling(SchedulerConfig(), "me"))
    router.add_source(Source([busy, roomy]))
    assert [t.node_id for t in router.candidates(MODEL)] == [FAST, SLOW]
    # without slot figures (a peer that does not announce them) the queue decides, as before
    old_busy = RouterTarget(MODEL, SLOW, False, FakeHost(0.1).open, queue_depth=1, rtt_ms=1.0)
    old_roomy = RouterTarget(MODEL, FAST, False, FakeHost(0.1).open, queue_depth=3, rtt_ms=5.0)
    router2 = Router("me", LiveScheduling(SchedulerConfig(), "me"))
    router2.add_source(Source([old_busy, old_roomy]))
    assert [t.node_id for t in router2.candidates(MODEL)] == [SLOW, FAST]


async def test_scheduler_sees_slots_so_a_parallel_host_has_no_queue_wait(autojump_clock):
    """The scheduler's expected queue wait uses the target's slots: 3 in flight on 8 slots wait for nothing."""
    hosts = {FAST: FakeHost(0.01), SLOW: FakeHost(0.01)}
    live = LiveScheduling(SchedulerConfig.from_mapping({"mode": "active"}), "me")
    router = Router("me", live)
    wide = RouterTarget(MODEL, FAST, False, hosts[FAST].open, queue_depth=3, rtt_ms=1.0, slots=8, free_slots=5)
    narrow = RouterTarget(MODEL, SLOW, False, hosts[SLOW].open, queue_depth=3, rtt_ms=1.0, slots=1, free_slots=0)
    router.add_source(Source([narrow, wide]))
    await _teach(router, hosts)
    _, decision = live.order(router.candidates(MODEL), _req("which?"))
    scores = {s.target.node: s for s in decision.scores}
    assert decision.target.node == FAST
    assert scores[FAST].queue_ms == 0 < scores[SLOW].queue_ms


def test_prompt_size_counts_token_prompts_and_tool_definitions():
    live = LiveScheduling(SchedulerConfig(), "me")
    toks = GenerationRequest(model=MODEL, kind="completion", prompt_tokens=tuple(range(800)), max_tokens=4)
    assert live.features(toks).prompt_tokens == 800
    from hydra_node.inference import ToolSpec

    plain = GenerationRequest(model=MODEL, kind="chat", messages=(("user", "hi"),), max_tokens=4)
    tooled = GenerationRequest(
        model=MODEL,
        kind="chat",
        messages=(("user", "hi"),),
        max_tokens=4,
        tools=(ToolSpec("f", "x" * 400, '{"type": "object", "properties": {}}'),),
    )
    assert live.features(tooled).prompt_tokens > live.features(plain).prompt_tokens + 90


async def test_materialised_artifacts_and_kv_transfers_feed_the_telemetry():
    """Placement (issue 15 item 7): a peer's transfer is that peer's bandwidth, model weights are the
    model's cold start here, a KV export/import is its KV transfer time; unusable ids are counted."""
    live = LiveScheduling(SchedulerConfig(), "me")
    peer = "ab" * 32
    live.observe_materialised("model_weights", "m1", f"peer:{peer}", 4_000_000, 2.0)
    live.observe_materialised("kv_state", "k1", "posix:/mnt/root", 1000, 0.5)
    live.observe_kv("m1", "import", 2_000_000, 40.0)
    now = trio.current_time()
    assert live.telemetry.view(Target(peer, "m1"), now).bandwidth_bps == pytest.approx(2_000_000)
    local = live.telemetry.view(Target("local", "m1"), now)
    assert local.artifact_ms == pytest.approx(2000.0) and local.kv_transfer_ms == pytest.approx(40.0)
    assert live.telemetry.view(Target("local", "k1"), now).artifact_ms is None  # KV state is no cold start
    live.observe_materialised("model_weights", "", "peer:x", 1, 1.0)
    assert live.counters["observations_dropped"] == 1
