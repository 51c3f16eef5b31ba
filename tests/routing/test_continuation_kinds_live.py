"""A stream cut mid-way goes on for the outputs that are not plain greedy text (issue 26 item 5), on
real nodes on loopback: A, C and D host the bundled model, B hosts nothing; the hosts sleep 40 ms
per token so the answer is still being generated when its host is killed with SIGKILL.

* a forced tool call cut in the middle of its arguments: the continuation advances the grammar
  over the emitted prefix, so the assembled arguments still parse, and (greedy) equal those of an
  uninterrupted run;
* a sampled stream (temperature 0.9, a seed) cut mid-way: one clean answer of the full length,
  with no error and one ``finish_reason`` (the continuation's seed is derived from the request's
  seed and the position: docs/scheduler.md "Continuing a stream", not bit-identical to a run
  without the cut)."""

from __future__ import annotations

import http.client
import json

import pytest
from continuation_mesh import MODEL, hosts_and_a_front

#: Tool-call argument fragments a test lets through before it cuts the serving host.
CUT_AFTER_FRAGMENTS = 3
#: Content chunks the sampled test lets through before it cuts.
CUT_AFTER_CHUNKS = 10

NOTE = {
    "type": "function",
    "function": {
        "name": "save_note",
        "description": "Save a note about a city for later",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
            "required": ["city", "note"],
            "additionalProperties": False,
        },
    },
}
TOOL_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Save a one-line note about Paris."}],
    "tools": [NOTE],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "temperature": 0,
    "max_tokens": 160,
    "stream": True,
}
SAMPLED_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    "max_tokens": 48,
    "temperature": 0.9,
    "seed": 7,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture
def mesh(tmp_path):
    yield from hosts_and_a_front(tmp_path, "[runner]\ninject_token_delay_ms = 40\n", ("a", "c", "d"))


def stream(port: int, body: dict, on_event=None) -> tuple[dict, list[dict]]:
    """POST ``body``; its response headers and every SSE data object in order
    (``on_event(event, headers)`` after each one)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    headers = {k.lower(): v for k, v in r.getheaders()}
    events = []
    while line := r.readline():
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        events.append(json.loads(line[6:]))
        if on_event is not None:
            on_event(events[-1], headers)
    conn.close()
    return headers, events


def fragments(events: list[dict]) -> list[str]:
    return [
        tc["function"]["arguments"]
        for e in events
        for c in e.get("choices", [])
        for tc in c.get("delta", {}).get("tool_calls", [])
        if tc.get("function", {}).get("arguments")
    ]


def finishes(events: list[dict]) -> list[str]:
    return [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]


def killer(by_id: dict, enough) -> tuple[list[str], object]:
    """A callback that kills the serving host (its process group) once ``enough(events)`` holds."""
    killed: list[str] = []
    seen: list[dict] = []

    def on_event(ev: dict, headers: dict) -> None:
        seen.append(ev)
        if not killed and enough(seen):
            killed.append(headers["x-hydra-served-by"])
            by_id[killed[0]].kill_all()

    return killed, on_event


def test_a_tool_call_and_a_sampled_stream_cut_mid_way_still_complete(mesh):
    b, ids = mesh["b"], mesh["ids"]
    by_id = {ids[n]: mesh[n] for n in ("a", "c", "d")}

    # a forced tool call, cut inside its arguments
    _, reference = stream(b.api_port, TOOL_BODY)
    ref_args = "".join(fragments(reference))
    assert finishes(reference) == ["tool_calls"], ref_args  # a complete call: its arguments parse
    assert len(fragments(reference)) > CUT_AFTER_FRAGMENTS + 2, ref_args  # long enough to cut inside
    killed, on_event = killer(by_id, lambda seen: len(fragments(seen)) == CUT_AFTER_FRAGMENTS)
    _, events = stream(b.api_port, TOOL_BODY, on_event)
    assert killed, "the call ended before its host could be cut"
    assert not [e for e in events if "error" in e], events
    args = "".join(fragments(events))
    assert json.loads(args) == json.loads(ref_args) and args == ref_args
    assert finishes(events) == finishes(reference) == ["tool_calls"]
    (fin,) = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert fin["hydra_served_by"][0] == killed[0] and len(fin["hydra_served_by"]) == 2

    # a sampled stream, cut after some content
    del by_id[killed[0]]

    def content_chunks(seen: list[dict]) -> int:
        return sum(1 for e in seen for c in e.get("choices", []) if c.get("delta", {}).get("content"))

    killed2, on_event = killer(by_id, lambda seen: content_chunks(seen) == CUT_AFTER_CHUNKS)
    _, events = stream(b.api_port, SAMPLED_BODY, on_event)
    assert killed2, "the stream ended before its host could be cut"
    assert not [e for e in events if "error" in e], events
    assert len(finishes(events)) == 1 and finishes(events)[0] in ("stop", "length")
    usage = events[-1]["usage"]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
    assert text and usage["completion_tokens"] > CUT_AFTER_CHUNKS
    if finishes(events) == ["length"]:
        assert usage["completion_tokens"] == SAMPLED_BODY["max_tokens"]  # the remaining budget, no more
    (fin,) = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert fin["hydra_served_by"][0] == killed2[0] and len(fin["hydra_served_by"]) == 2
    status = b.status()["routing"]
    assert status["continuations"] == 2 and status["continuation_failures"] == 0
