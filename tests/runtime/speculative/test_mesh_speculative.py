"""Speculative decoding across two live nodes: the draft on node D, the target on node T.

D serves the bundled Q4_1 model as a draft server (tunnel service "draft"); T serves the F16
conversion with ``--speculative mesh``; R serves the same F16 model alone (no mesh); L serves it
with a local draft (``--draft``).  Greedy output through T and L must equal R's; killing D
mid-request must not change T's output.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness import NodeProcess, request  # noqa: E402

CONFIG = """
[defaults.model_fit]
prompt_cache = false
ctx_size = 1024
[defaults.throughput]
threads = 1
[defaults.hardware]
warmup = false
[defaults.speculative]
# keep speculating whatever the timings say: these tests are about exactness and failures
min_predicted_speedup = 0.01
"""
PROMPTS = ["def fibonacci(n):", "The three most important things about the ocean are"]
LONG_PROMPT = "Count from one: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
MAX_TOKENS = 24
LONG_MAX_TOKENS = 160
#: Bounds on one request and on a node's start (generous: the test machine is shared and often loaded).
WAIT_S = 120.0
START_S = 240.0


def _complete(node: NodeProcess, model: str, prompt: str, max_tokens: int) -> dict:
    code, body = request(
        "POST",
        node.api_port,
        "/v1/completions",
        {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=WAIT_S,
    )
    assert code == 200, body
    return json.loads(body)


def _spec(st: dict) -> dict | None:
    return st["models"][0].get("speculative") if st["models"] else None


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, target_path: Path):
    base = tmp_path_factory.mktemp("meshspec")
    cfg = base / "node.toml"
    cfg.write_text(CONFIG)
    common = ("--config", str(cfg), "--no-rpc-worker")
    started: list[NodeProcess] = []

    def launch(name: str, *args: str) -> NodeProcess:
        node = NodeProcess(base / name, *common, *args)
        started.append(node)  # killed at the end even if it never became ready
        return node.start(wait=False)

    try:
        d = launch("d", "--no-model", "--draft-server", "bundled")
        r = launch("r", "--model", str(target_path))
        local = launch("l", "--model", str(target_path), "--draft", "bundled")
        d.wait_ready(START_S)
        t = launch("t", "--model", str(target_path), "--speculative", "mesh", "--join", d.invite())
        for n in (r, local, t):
            n.wait_ready(START_S)
        t.wait_status(lambda s: s["speculation"]["draft_peers"], timeout=WAIT_S, what="T sees D's draft")
        model = t.status()["models"][0]["id"]
        yield SimpleNamespace(d=d, t=t, r=r, local=local, model=model)
    finally:
        for n in started:
            n.kill_all()


def test_greedy_output_through_a_mesh_draft_is_the_target_alone_output(nodes):
    d, t, r, model = nodes.d, nodes.t, nodes.r, nodes.model
    for prompt in PROMPTS:
        spec = _complete(t, model, prompt, MAX_TOKENS)
        alone = _complete(r, model, prompt, MAX_TOKENS)
        assert spec["choices"][0]["text"] == alone["choices"][0]["text"]
        assert spec["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"]
    figures = _spec(t.status())
    assert figures is not None and figures["draft"] == "remote"
    assert figures["last_request"]["draft_failure"] is None
    assert figures["rounds"] > 0 and figures["accepted_tokens"] > 0
    for key in ("acceptance_rate", "tokens_per_round", "k", "predicted_speedup", "measured_speedup"):
        assert isinstance(figures[key], (int, float)), key
    assert 0.0 < figures["acceptance_rate"] <= 1.0
    assert figures["remote"]["rtt_ms"] is not None
    served = d.status()["speculation"]
    assert served["serving_draft"]["state"] == "ready" and served["counters"]["tunnels_served"] >= len(PROMPTS)
    assert _spec(r.status()) is None  # R never speculates


def test_a_local_draft_gives_the_same_output(nodes):
    local, r, model = nodes.local, nodes.r, nodes.model
    for prompt in PROMPTS:
        assert (
            _complete(local, model, prompt, MAX_TOKENS)["choices"][0]["text"]
            == _complete(r, model, prompt, MAX_TOKENS)["choices"][0]["text"]
        )
    figures = _spec(local.status())
    assert figures["draft"] == "local" and figures["disabled"] is None and figures["rounds"] > 0
    assert local.status()["speculation"]["mode"] == "local"


def test_killing_the_draft_node_mid_request_keeps_the_output(nodes):
    d, t, r, model = nodes.d, nodes.t, nodes.r, nodes.model
    expected = _complete(r, model, LONG_PROMPT, LONG_MAX_TOKENS)["choices"][0]["text"]
    served_before = d.status()["speculation"]["counters"]["tunnels_served"]
    result: dict = {}

    def run() -> None:
        try:
            result["body"] = _complete(t, model, LONG_PROMPT, LONG_MAX_TOKENS)
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    try:  # the tunnel for this request is open: kill D (node and draft server) now
        d.wait_status(
            lambda s: s["speculation"]["counters"]["tunnels_served"] > served_before,
            timeout=WAIT_S,
            what="D serves T's request",
        )
    finally:
        d.kill_all()
        worker.join(WAIT_S)
    assert not worker.is_alive()
    assert "error" not in result, result.get("error")
    assert result["body"]["choices"][0]["text"] == expected
    last = _spec(t.status())["last_request"]
    assert last["draft_failure"] is not None  # the draft went away during the request
    # and the next request, with no draft peer left, is the target's alone
    again = _complete(t, model, PROMPTS[0], MAX_TOKENS)
    assert again["choices"][0]["text"] == _complete(r, model, PROMPTS[0], MAX_TOKENS)["choices"][0]["text"]
