"""The mesh and the client of the live continuation tests (``test_continuation_live.py``,
``test_handover_live.py``): A and C host the bundled model, B hosts nothing; a streaming greedy
chat long enough to be cut, and what the tests compare of its answer."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

from harness import NodeProcess

from hydra_node.models import BUNDLED_MODEL_ID

MODEL = BUNDLED_MODEL_ID
MESH_TIMEOUT_S = 90.0
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    "max_tokens": 48,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}
#: Content chunks a test lets through before it cuts the serving host.
CUT_AFTER_CHUNKS = 10


def two_hosts_and_a_front(tmp_path: Path, config: str) -> Iterator[dict]:
    """Start A, C (hosts, ``config`` as their hydra.toml) and B (no model), joined; yield
    ``{"a", "b", "c", "ids"}`` once B sees both hosts' model with its identity (what a
    continuation needs); every node is killed afterwards."""
    yield from hosts_and_a_front(tmp_path, config, ("a", "c"))


def hosts_and_a_front(tmp_path: Path, config: str, hosts: tuple[str, ...]) -> Iterator[dict]:
    """``hosts`` (named nodes hosting the bundled model, ``config`` as their hydra.toml) and B (no
    model), all joined to the first host; yield ``{name: node, ..., "b": B, "ids": {name: node id}}``
    once B sees every host's model with its identity; every node is killed afterwards."""
    cfg = tmp_path / "hydra.toml"
    cfg.write_text(config)
    common = ("--config", str(cfg), "--no-rpc-worker")
    nodes = {n: NodeProcess(tmp_path / n, *common, "--name", n) for n in hosts}
    b = NodeProcess(tmp_path / "b", *common, "--no-model", "--name", "b")
    first, *others = (nodes[n] for n in hosts)
    try:
        first.start()
        for p in (*others, b):
            p.args += ["--join", first.invite()]
        for p in others:
            p.start(wait=False)
        b.start()
        for p in others:
            p.wait_ready()
        ids = {n: p.status()["node_id"] for n, p in (*nodes.items(), ("b", b))}
        wait_hosts_seen(b, [ids[n] for n in hosts])
        yield {**nodes, "b": b, "ids": ids}
    finally:
        for p in (*nodes.values(), b):
            p.kill_all()


def wait_hosts_seen(viewer: NodeProcess, hosts: list[str]) -> None:
    """Until ``viewer`` sees every one of ``hosts`` alive with the model and its identity
    (``peers[].model_idents``: announced once the host hashed its model file)."""
    viewer.wait_status(
        lambda st: (
            sum(
                1
                for p in st["peers"]
                if p["id"] in hosts and p["state"] == "alive" and MODEL in p.get("model_idents", {})
            )
            == len(hosts)
        ),
        timeout=MESH_TIMEOUT_S,
        what="the hosts' model and its identity seen",
    )


def stream_chat(port: int, on_chunk=None) -> tuple[dict, list[dict]]:
    """POST the streaming chat; its response headers and every SSE data object, in order
    (``on_chunk(n, headers)`` after each content chunk)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(BODY), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    headers = {k.lower(): v for k, v in r.getheaders()}
    events, content_chunks = [], 0
    while line := r.readline():
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        events.append(ev)
        if any(c.get("delta", {}).get("content") for c in ev.get("choices", [])):
            content_chunks += 1
            if on_chunk is not None:
                on_chunk(content_chunks, headers)
    conn.close()
    return headers, events


def text_of(events: list[dict]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))


def reference_finish(events: list[dict]) -> str:
    (reason,) = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert re.fullmatch(r"stop|length", reason)
    return reason


def assert_one_uninterrupted_answer(events: list[dict], reference: list[dict], hosts: list[str]) -> None:
    """No error event, the reference's text, one ``finish_reason``, its usage, and every host named."""
    assert not [e for e in events if "error" in e], events
    assert text_of(events) == text_of(reference)  # greedy: identical to the uninterrupted run
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == [reference_finish(reference)]
    assert events[-1]["usage"]["prompt_tokens"] == reference[-1]["usage"]["prompt_tokens"]
    assert events[-1]["usage"]["completion_tokens"] == reference[-1]["usage"]["completion_tokens"]
    (fin,) = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert fin["hydra_served_by"] == hosts
