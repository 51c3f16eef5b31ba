"""If one head is cut off, the request goes on (docs/scheduler.md "Continuing a stream"), on real
nodes on loopback: A and C host the bundled model, B hosts nothing. A streaming greedy chat sent to
B is served by A or C; after 10 chunks that host's node and its runner are killed with SIGKILL.
The client gets one uninterrupted stream, no error event, the text of an uninterrupted run, one
``finish_reason``, usage counting the prompt once and every completion token, and
``hydra_served_by`` naming both hosts. The hosts sleep 40 ms per token
(``[runner].inject_token_delay_ms``) so the answer is still being generated when its host dies."""

from __future__ import annotations

import http.client
import json
import re

import pytest
from harness import NodeProcess
from waiting import poll_until

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
CUT_AFTER_CHUNKS = 10


@pytest.fixture
def mesh(tmp_path):
    cfg = tmp_path / "hydra.toml"
    cfg.write_text("[runner]\ninject_token_delay_ms = 40\n")
    common = ("--config", str(cfg), "--no-rpc-worker")
    a = NodeProcess(tmp_path / "a", *common, "--name", "a")
    c = NodeProcess(tmp_path / "c", *common, "--name", "c")
    b = NodeProcess(tmp_path / "b", *common, "--no-model", "--name", "b")
    try:
        a.start()
        c.args += ["--join", a.invite()]
        b.args += ["--join", a.invite()]
        c.start(wait=False)
        b.start()
        c.wait_ready()
        ids = {n: p.status()["node_id"] for n, p in (("a", a), ("b", b), ("c", c))}
        b.wait_status(
            lambda st: (
                sum(
                    1
                    for p in st["peers"]
                    if p["id"] in (ids["a"], ids["c"]) and p["state"] == "alive" and MODEL in p["models"]
                )
                == 2
            ),
            timeout=MESH_TIMEOUT_S,
            what="B sees A's and C's model",
        )
        for host in (a, c):  # each hashed its model file (its identity, announced: routing/identity.py)
            poll_until(lambda host=host: "event=model_identity" in host.log(), timeout_s=60, what="model identity")
        yield {"a": a, "b": b, "c": c, "ids": ids}
    finally:
        for p in (a, b, c):
            p.kill_all()


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


def test_a_stream_whose_host_is_killed_goes_on_on_the_other_host(mesh):
    b, ids = mesh["b"], mesh["ids"]
    by_id = {ids["a"]: mesh["a"], ids["c"]: mesh["c"]}
    _, reference = stream_chat(b.api_port)  # uninterrupted
    ref_usage = reference[-1]["usage"]
    assert ref_usage["completion_tokens"] >= CUT_AFTER_CHUNKS + 10, ref_usage  # long enough to cut
    killed: list[str] = []

    def cut(n: int, headers: dict) -> None:
        if n == CUT_AFTER_CHUNKS and not killed:
            killed.append(headers["x-hydra-served-by"])
            by_id[killed[0]].kill_all()  # kill -9 of its process group: the node and its runner

    headers, events = stream_chat(b.api_port, cut)
    assert killed, "the stream ended before the host could be cut"
    assert not [e for e in events if "error" in e], events
    assert text_of(events) == text_of(reference)  # greedy: identical to the uninterrupted run
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == [reference_finish(reference)]
    assert events[-1]["usage"]["prompt_tokens"] == ref_usage["prompt_tokens"]
    assert events[-1]["usage"]["completion_tokens"] == ref_usage["completion_tokens"]
    (fin,) = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    other = next(i for i in by_id if i != killed[0])
    assert fin["hydra_served_by"] == [killed[0], other]
    status = b.status()["routing"]
    assert status["continuations"] == 1 and status["continuation_failures"] == 0


def reference_finish(events: list[dict]) -> str:
    (reason,) = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert re.fullmatch(r"stop|length", reason)
    return reason
