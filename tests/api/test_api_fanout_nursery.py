"""Streamed fan-out (hydra_node/api/fanout.py, ``StreamFanOut``) runs its generations in the request's
nursery, never in trio system tasks: through the real HTTP server on loopback, with each dialect that
streams through it (OpenAI ``n`` > 1, /v1/responses, /v1/messages) and a router whose generations
never end, a client that disconnects mid-stream closes every generation (its runner slot freed), and
each generation's task is a descendant of the server's task. A routing error while opening closes
the generations already open and answers with its status."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from api_serving import serving
from hydra_node.anthropic.routes import MessagesApi
from hydra_node.inference import GenerationError, TextDelta
from hydra_node.openai.routes import OpenAIApi
from hydra_node.responses.routes import ResponsesApi

TICK_S = 0.01
WAIT_S = 5


@dataclass
class _Model:
    id: str
    hosts: list = field(default_factory=list)
    states: dict = field(default_factory=dict)


class EndlessRouter:
    """A router whose generations yield text until they are closed; ``fail_at``: the generation (in
    order of opening) that fails to open with a routing error."""

    def __init__(self, expect: int, fail_at: int | None = None):
        self.expect, self.fail_at = expect, fail_at
        self.opened = 0
        self.open_now = 0
        self.tasks: list[trio.lowlevel.Task] = []
        self.all_open = trio.Event()
        self.all_closed = trio.Event()

    def models(self):
        return [_Model("m")]

    def recently_seen(self, model: str) -> bool:
        return False

    @asynccontextmanager
    async def generate(self, req):
        k = self.opened
        self.opened += 1
        if k == self.fail_at:
            await trio.sleep(TICK_S)  # the others are open by now
            raise GenerationError("no target can take the request", code="no_capacity", status=503)
        self.tasks.append(trio.lowlevel.current_task())
        self.open_now += 1
        if self.open_now == self.expect:
            self.all_open.set()
        try:
            yield self._events()
        finally:
            self.open_now -= 1  # the runner slot is freed
            if self.open_now == 0:
                self.all_closed.set()

    async def _events(self):
        while True:
            yield TextDelta("tok ")
            await trio.sleep(TICK_S)


DIALECTS = {
    "chat_n2": (
        OpenAIApi,
        "/v1/chat/completions",
        2,
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 2},
    ),
    "completions_2x2": (OpenAIApi, "/v1/completions", 4, {"model": "m", "prompt": ["a", "b"], "stream": True, "n": 2}),
    "responses": (ResponsesApi, "/v1/responses", 1, {"model": "m", "input": "hi", "stream": True}),
    "messages": (
        MessagesApi,
        "/v1/messages",
        1,
        {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    ),
}


@pytest.fixture
def no_system_tasks(monkeypatch):
    """Any trio system task spawned on the request path fails the test."""
    spawned: list[str] = []

    def refuse(fn, *args, name=None, **kw):
        spawned.append(str(name or fn))
        raise AssertionError(f"system task spawned: {name or fn}")

    monkeypatch.setattr(trio.lowlevel, "spawn_system_task", refuse)
    return spawned


async def _post(port: int, path: str, body: dict) -> tuple[trio.SocketStream, bytearray]:
    s = await trio.open_tcp_stream("127.0.0.1", port)
    raw = json.dumps(body).encode()
    await s.send_all(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    return s, bytearray()


async def _until(stream: trio.SocketStream, buf: bytearray, marker: bytes) -> None:
    while marker not in buf:
        data = await stream.receive_some(65536)
        assert data, f"connection closed before {marker!r}: {bytes(buf)!r}"
        buf += data


def _ancestors(task: trio.lowlevel.Task) -> list[trio.lowlevel.Task]:
    out = []
    nursery = task.parent_nursery
    while nursery is not None:
        out.append(nursery.parent_task)
        nursery = nursery.parent_task.parent_nursery
    return out


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
async def test_a_client_that_leaves_mid_stream_closes_every_generation(dialect, no_system_tasks):
    cls, path, expect, body = DIALECTS[dialect]
    router = EndlessRouter(expect)
    async with serving(cls(router)) as server:
        s, buf = await _post(server.port, path, body)
        with trio.fail_after(WAIT_S):
            await _until(s, buf, b"\r\n\r\n")
            assert buf.startswith(b"HTTP/1.1 200 "), bytes(buf)
            await router.all_open.wait()
            while buf.count(b"tok ") < 2 * expect:  # text is streaming
                data = await s.receive_some(65536)
                assert data, bytes(buf)
                buf += data
        assert router.open_now == expect
        me = trio.lowlevel.current_task()
        assert all(me in _ancestors(t) for t in router.tasks), "a generation ran outside the request's tree"
        await s.aclose()  # the client goes away mid-stream
        with trio.fail_after(WAIT_S):
            await router.all_closed.wait()
        assert router.open_now == 0 and no_system_tasks == []


async def test_a_routing_error_while_opening_closes_the_others_and_is_the_status(no_system_tasks):
    router = EndlessRouter(expect=2, fail_at=1)
    _, path, _, body = DIALECTS["chat_n2"]
    body = dict(body, n=3)
    async with serving(OpenAIApi(router)) as server:
        s, buf = await _post(server.port, path, body)
        with trio.fail_after(WAIT_S):
            await _until(s, buf, b'"code":"no_capacity"')
            await router.all_closed.wait()
        assert buf.startswith(b"HTTP/1.1 503 "), bytes(buf)
        assert router.open_now == 0 and no_system_tasks == []
        await s.aclose()
