"""The responses store is bounded by the bytes it holds (issue 25 item 7): a response whose
``text.format`` schema carries a large ``examples`` annotation is held as its serialised JSON,
so the bound on ``store.bytes`` is a bound on memory; one too large to store is refused up front
(``store: true`` asked) or answered ``store: false`` (the default), over a real loopback server."""

from __future__ import annotations

import gc
import json
import tracemalloc
from contextlib import asynccontextmanager

import trio

from api_serving import serving
from hydra_node.inference import NO_CAPS, ChatMessage, Finished, ModelCaps, TextDelta
from hydra_node.responses.routes import ResponsesApi
from hydra_node.responses.store import ResponsesStore

MiB = 1024 * 1024


def _schema(n_examples: int) -> dict:
    """A JSON schema whose ``examples`` annotation is many small objects (the costly shape in memory)."""
    return {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
        "examples": [{"city": f"c{i}", "n": i} for i in range(n_examples)],
    }


def _body(resp_id: str, schema: dict) -> dict:
    return {
        "id": resp_id,
        "object": "response",
        "output": [],
        "text": {"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}},
    }


def test_the_store_holds_what_it_counts():
    """Six responses echoing a ~0.3 MB annotation into a 1 MiB store: the store's accounting stays
    under its bound and the memory it holds (traced) stays near that accounting, not 10-20x it."""
    bound = MiB
    tracemalloc.start()
    try:
        store = ResponsesStore(100, bound)
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        for k in range(6):
            body = _body(f"resp_{k}", _schema(10_000))  # ~0.3 MB serialised each
            store.put(f"resp_{k}", (ChatMessage("user", "hi"),), body)
            del body
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < len(store) < 6 and store.evicted == 6 - len(store)
    assert held <= 1.25 * bound, f"the store holds {held} bytes against a bound of {bound}"
    assert store.bytes <= bound
    kept = store.lookup("resp_5")
    assert kept is not None and json.loads(kept.body_json)["text"]["format"]["schema"]["examples"][-1]["n"] == 9_999


def test_the_store_counts_bytes_and_refuses_one_response_over_its_limit():
    store = ResponsesStore(max_responses=100, max_bytes=500, max_response_bytes=300)
    big = (ChatMessage("user", "é" * 30),)  # 30 characters, 180 bytes of JSON (\u00e9 each)
    assert store.size_of(big, {"id": "a"}) > 180
    assert store.put("a", big) and store.put("b", big) and store.put("c", big)
    assert store.get("a") is None and store.evicted == 1  # the oldest went first
    assert store.bytes <= 500 and store.bytes == sum(store.lookup(r).size for r in ("b", "c"))
    assert not store.put("huge", (ChatMessage("user", "x" * 300),)) and store.get("huge") is None
    assert store.get("b") == big  # conversations come back as they went in


class OneWordRouter:
    def models(self):
        return [type("M", (), {"id": "m"})()]

    def recently_seen(self, model: str) -> bool:
        return False

    def capabilities(self, model: str) -> ModelCaps:
        return NO_CAPS

    @asynccontextmanager
    async def generate(self, req):
        async def events():
            yield TextDelta('{"city":"Paris"}')
            yield Finished("stop", 3, 1)

        yield events()


async def _call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    raw = b"" if body is None else json.dumps(body).encode()
    async with await trio.open_tcp_stream("127.0.0.1", port) as s:
        await s.send_all(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        buf = bytearray()
        while chunk := await s.receive_some(65536):
            buf += chunk
    head, _, payload = bytes(buf).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


async def test_a_response_too_large_to_store_is_refused_or_answered_unstored():
    store = ResponsesStore(100, 2 * MiB, MiB)
    api = ResponsesApi(OneWordRouter(), store=store)  # type: ignore[arg-type]
    fmt = {"type": "json_schema", "name": "w", "schema": _schema(60_000), "strict": True}  # ~1.5 MB
    ask = {"model": "m", "input": "Where?", "text": {"format": fmt}}
    async with serving(api) as server:
        status, err = await _call(server.port, "POST", "/v1/responses", {**ask, "store": True})
        assert status == 400 and err["error"]["code"] == "response_too_large_to_store"
        assert err["error"]["param"] == "store" and str(MiB) in err["error"]["message"]
        status, body = await _call(server.port, "POST", "/v1/responses", ask)  # store left to its default
        assert status == 200 and body["store"] is False and len(store) == 0
        assert body["text"]["format"]["schema"]["examples"][-1]["n"] == 59_999  # echoed as sent
        small = {**ask, "text": {"format": {**fmt, "schema": _schema(10)}}}
        status, body = await _call(server.port, "POST", "/v1/responses", small)
        assert status == 200 and body["store"] is True and len(store) == 1
        status, got = await _call(server.port, "GET", f"/v1/responses/{body['id']}")
        assert status == 200 and got == body
    assert store.bytes <= store.max_bytes
