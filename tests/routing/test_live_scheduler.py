"""The scheduler in a live loopback mesh of three nodes: an entry without a model (mode
``active``) and two hosts of the bundled model. One host is slowed down with ``[runner]
inject_token_delay_ms`` and runs in mode ``shadow``: its fixed rule keeps every request on its
own (slow) runner, and it records that the scheduler would have sent them to the fast peer.
Also ``/metrics`` parses as Prometheus text.

Assertions are about routing outcomes, never about timings: the slow host is made 1 s per
token slower, far beyond the load noise of a shared test machine.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import NodeProcess, request

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct-Q4_1"
SLOW_TOKEN_DELAY_MS = 1000
#: Tokens per routed request: few, so the slowed host answers within a few seconds.
MAX_TOKENS = 3
#: Bound on every wait for gossip (announcements, hints); the mesh converges in about a second.
GOSSIP_WAIT_S = 20.0


def _chat(port: int, text: str, max_tokens: int = MAX_TOKENS, **extra) -> dict:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    code, raw = request("POST", port, "/v1/chat/completions", body, timeout=60)
    assert code == 200, raw
    return json.loads(raw)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    base = tmp_path_factory.mktemp("live-scheduler")
    (base / "slow.toml").write_text(
        f'[runner]\ninject_token_delay_ms = {SLOW_TOKEN_DELAY_MS}\n[scheduler]\nmode = "shadow"\n'
    )
    (base / "active.toml").write_text('[scheduler]\nmode = "active"\n')
    nodes: list[NodeProcess] = []
    try:
        fast = NodeProcess(base / "fast", "--name", "fast")
        nodes.append(fast)
        fast.start()
        token = fast.invite()
        slow = NodeProcess(base / "slow", "--name", "slow", "--config", str(base / "slow.toml"), "--join", token)
        active = NodeProcess(
            base / "active", "--no-model", "--name", "active", "--config", str(base / "active.toml"), "--join", token
        )
        for n in (slow, active):
            nodes.append(n)
            n.start(wait=False)
        for n in (slow, active):
            n.wait_ready()
        ids = {"fast": fast.status()["node_id"], "slow": slow.status()["node_id"]}
        active.wait_status(
            lambda st: sum(1 for p in st["peers"] if p["state"] == "alive" and MODEL in p["models"]) == 2,
            GOSSIP_WAIT_S,
            "both hosts alive",
        )
        # Warm-up straight at each host: each measures itself and gossips a telemetry summary,
        # which the other nodes merge as hints before they route anything.
        _chat(fast.api_port, "Warm up, please.")
        _chat(slow.api_port, "Warm up, please.")
        active.wait_status(lambda st: st["network_costs"]["hinted_targets"] >= 2, GOSSIP_WAIT_S, "hints of both hosts")
        slow.wait_status(lambda st: st["network_costs"]["hinted_targets"] >= 1, GOSSIP_WAIT_S, "hints of the fast host")
        yield {"fast": fast, "slow": slow, "active": active, "ids": ids}
    finally:
        for n in nodes:
            n.kill_all()


def test_active_mode_steers_traffic_away_from_the_slow_host(mesh):
    active, ids = mesh["active"], mesh["ids"]
    served = [_chat(active.api_port, f"Question {i}: name a colour.")["system_fingerprint"] for i in range(4)]
    assert served == [ids["fast"]] * 4, {"served": served, "ids": ids}
    st = active.status()["scheduler"]
    assert st["mode"] == "active" and st["decisions"] >= 4
    for d in st["recent_decisions"][:4]:
        assert d["target"] == d["scheduled"] == f"{ids['fast']}/{MODEL}"
        assert d["override"] == (d["baseline"] != d["target"])
        assert len(d["scores"]) == 2  # both hosts were scored
    assert st["overrides"] == sum(d["override"] for d in st["recent_decisions"])
    costs = active.status()["network_costs"]
    fast_entry = next(t for t in costs["targets"] if t["node"] == ids["fast"])
    assert fast_entry["successes"] >= 4 and fast_entry["metrics"]["ttft_ms"]["samples"] >= 4
    assert "rtt_ms" in fast_entry["metrics"] and costs["counters"]["hint_summaries_merged"] >= 2


def test_shadow_mode_routes_the_fixed_rule_and_records_disagreements(mesh):
    slow, ids = mesh["slow"], mesh["ids"]
    local, fast_target = f"local/{MODEL}", f"{ids['fast']}/{MODEL}"
    served = []
    for i in range(3):  # the first may find its own (warm-up) measurements stale: it then knows only priors
        served.append(_chat(slow.api_port, f"Shadow {i}: say hi.")["system_fingerprint"])
        if i >= 1 and slow.status()["scheduler"]["shadow_disagreements"] >= 1:
            break
    assert set(served) == {ids["slow"]}  # off's rule: local first
    st = slow.status()["scheduler"]
    assert st["mode"] == "shadow" and st["overrides"] == 0
    for d in st["recent_decisions"]:
        assert d["target"] == d["baseline"] == local and not d["override"]
        assert d["disagreement"] == (d["scheduled"] != d["baseline"])
    assert st["shadow_disagreements"] >= 1, st["recent_decisions"][:2]
    # Where the scheduler would have sent it: the fast peer (its hints and RTT against a local
    # runner that needs a second per token).
    assert any(d["disagreement"] and d["scheduled"] == fast_target for d in st["recent_decisions"])


def test_metrics_are_prometheus_text(mesh):
    families = {}
    for name in ("active", "fast"):
        code, text = request("GET", mesh[name].console_port, "/metrics")
        assert code == 200
        families[name] = {f.name: f for f in text_string_to_metric_families(text)}
    entry, host = families["active"], families["fast"]
    for name in (
        "hydra_http_requests",
        "hydra_request_ttft_seconds",
        "hydra_request_itl_seconds",
        "hydra_request_duration_seconds",
        "hydra_generated_tokens",
        "hydra_gossip_messages",
        "hydra_peers",
        "hydra_link_frames_rejected",
        "hydra_scheduler_events",
        "hydra_scheduler_mode",
    ):
        assert name in entry, name
    for name in ("hydra_queue_depth", "hydra_runner_tokens_per_second", "hydra_runner_restarts"):
        assert name in host, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in entry.values() for s in f.samples}
    assert samples[("hydra_peers", (("state", "alive"),))] >= 2
    assert samples[("hydra_scheduler_mode", (("mode", "active"),))] == 1.0
    assert samples[("hydra_http_requests_total", (("path", "/v1/chat/completions"), ("status", "200")))] >= 4
    assert samples[("hydra_request_ttft_seconds_count", (("model", MODEL), ("target", "remote")))] >= 4
    assert any(n == "hydra_gossip_messages_total" and v > 0 for (n, _), v in samples.items())
