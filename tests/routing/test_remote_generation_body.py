"""A generate request too large for a stream header (16 KiB) travels as the stream's body
(protocol/README.md section 11.3), over real mesh links in one process: the host reads exactly the
announced bytes before it answers; a truncated, junk, over-long or stalled body is a typed error event,
counted, and the host serves the next request; an older host's refusal is a clean 502, never a success."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from waiting import wait_until

from inproc_mesh import mesh_member
from hydra_node.inference import (
    ChatMessage,
    EventStreamDecoder,
    Finished,
    GenerationError,
    GenerationRequest,
    RemoteError,
    TextDelta,
    event_frame,
)
from hydra_node.mesh.joining import JoinPlan
from hydra_node.mesh.link.peer_link import PeerLink
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.service import MeshService
from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import MAX_OPEN_HEADER_BYTES
from hydra_node.routing.remote import RemoteGeneration, generate_header

JOIN_S = 20.0
BODY_TIMEOUT_S = 5.0  # the host's deadline for a body (the clock jumps: no test waits for it)
SMALL = GenerationRequest(model="m1", kind="completion", prompt="hi", max_tokens=4)
#: An agent's conversation: ~100 KB of system prompt and turns, plus a continuation's ids.
BIG = GenerationRequest(
    model="m1",
    kind="chat",
    messages=(
        ChatMessage("system", "You are a coding agent. " + "Follow the tool schema exactly. " * 2000),
        ChatMessage("user", "Here is the file:\n" + "def f(x):\n    return x + 1\n" * 1500),
    ),
    max_tokens=4,
    resume_tokens=tuple(range(1000, 3000)),
)


def test_the_big_request_needs_a_body_and_the_small_one_keeps_its_header():
    header, body = generate_header(BIG)
    assert len(cbor.encode({"kind": "generate", "req": BIG.to_wire()})) > 5 * MAX_OPEN_HEADER_BYTES
    assert body is not None and header == {"kind": "generate", "body": len(body)}
    assert cbor.decode(body) == BIG.to_wire()
    assert generate_header(SMALL) == ({"kind": "generate", "req": SMALL.to_wire()}, None)


def node(home: Path, name: str, models: tuple[str, ...], local_open, **kw: Any) -> tuple[MeshService, RemoteGeneration]:
    mesh = mesh_member(home, name, models)
    remote = RemoteGeneration(mesh, node_id=mesh.node_id, local_open=local_open, **kw)
    mesh.handle_stream("generate", remote.serve)  # as the root does
    return mesh, remote


def echo_model(seen: list[GenerationRequest]):
    """A model that records the request it got and answers with its size."""

    @asynccontextmanager
    async def open_local(req: GenerationRequest):
        seen.append(req)

        async def events():
            yield TextDelta(str(len(req.messages) or len(req.prompt)))
            yield Finished("stop", 1, 1, served_by="host")

        yield events()

    return open_local


async def pair(nursery, tmp_path, host_kw: Mapping[str, Any] | None = None, *, serve=None):
    seen: list[GenerationRequest] = []
    host, host_remote = node(tmp_path / "h", "host", ("m1",), lambda m: echo_model(seen), **(host_kw or {}))
    if serve is not None:
        host.handle_stream("generate", serve)
    user, user_remote = node(tmp_path / "u", "user", (), lambda m: None)
    await nursery.start(host.run, JoinPlan())
    await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: user_remote.targets())
        await wait_until(lambda: user.node_id in host.members())  # the host serves members only
    return host, host_remote, user, user_remote, seen


async def collect(remote: RemoteGeneration, peer_id: str, req: GenerationRequest) -> list:
    async with remote.open_remote(peer_id, req) as events:
        return [ev async for ev in events]


async def raw_answer(user: MeshService, host_id: str, header: dict[str, Any], body: bytes, *, eof: bool) -> RemoteError:
    """Open a generate stream by hand, send ``body`` (then half-close if ``eof``), and return the
    host's error event (the test fails on any other answer)."""
    link = await user.link_to(host_id)
    async with link.open_stream(header) as stream:
        await stream.send(body)
        if eof:
            await stream.send_eof()
        decoder = EventStreamDecoder()
        while data := await stream.receive():
            decoder.receive_data(data)
            try:
                ev = decoder.next_event()
            except RemoteError as exc:
                return exc
            assert ev is None, ev
    raise AssertionError("the host ended the stream without an error event")


async def test_a_request_larger_than_a_header_is_served_through_its_body(nursery, tmp_path, autojump_clock):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path)
    with trio.fail_after(JOIN_S):
        events = await collect(user_remote, host.node_id, BIG)  # before the body form: a 413
        assert [type(e) for e in events] == [TextDelta, Finished] and events[0].text == "2"
        assert seen == [BIG]  # exactly the request, every message and resume id
        assert [type(e) for e in await collect(user_remote, host.node_id, SMALL)] == [TextDelta, Finished]
    assert seen[1] == SMALL
    assert host_remote.statistics().served == 2 and host_remote.statistics().bad_requests == 0


def sized(b: bytes, delta: int = 0) -> dict[str, Any]:
    return {"kind": "generate", "body": len(b) + delta}


@pytest.mark.parametrize(
    "name, header_of, body_of, fragment",
    [
        ("a truncated body", sized, lambda b: b[: len(b) // 2], "the stream ended after"),
        ("junk", sized, lambda b: b"\xff" * len(b), "not canonical CBOR"),
        ("an over-long body", lambda b: sized(b, -8), lambda b: b, "longer than"),
        (
            "a body that is not a request",
            lambda b: {"kind": "generate", "body": 4},
            lambda b: b"\x83\x01\x02\x03",
            "invalid request",
        ),
        ("too large a body", lambda b: {"kind": "generate", "body": 1 << 30}, lambda b: b"", "'body' must be"),
        (
            "a body count that is no integer",
            lambda b: {"kind": "generate", "body": True},
            lambda b: b"",
            "'body' must be",
        ),
        ("both req and body", lambda b: {"kind": "generate", "body": 1, "req": {}}, lambda b: b"", "not both"),
    ],
)
async def test_a_bad_body_is_a_typed_error_and_the_host_serves_on(
    nursery, tmp_path, autojump_clock, name, header_of, body_of, fragment
):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path, {"body_timeout_s": BODY_TIMEOUT_S})
    small_body = cbor.encode(SMALL.to_wire())  # one DATA frame: an over-long body arrives in one chunk
    with trio.fail_after(JOIN_S):
        err = await raw_answer(user, host.node_id, header_of(small_body), body_of(small_body), eof=True)
        assert (err.code, err.remote_status, err.status) == ("invalid_request", 400, 502), err.message
        assert fragment in err.message
        assert host_remote.statistics().bad_requests == 1 and not seen
        assert [type(e) for e in await collect(user_remote, host.node_id, BIG)] == [TextDelta, Finished]
    assert seen == [BIG]


async def test_a_stalled_body_times_out_with_a_typed_error_and_the_host_serves_on(nursery, tmp_path, autojump_clock):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path, {"body_timeout_s": BODY_TIMEOUT_S})
    header, body = generate_header(BIG)
    assert body is not None
    with trio.fail_after(JOIN_S):
        err = await raw_answer(user, host.node_id, header, body[:1000], eof=False)  # then nothing
        assert (err.code, err.remote_status) == ("request_timeout", 408) and "1000 of" in err.message
        assert host_remote.statistics().bad_requests == 1 and not seen
        assert [type(e) for e in await collect(user_remote, host.node_id, BIG)] == [TextDelta, Finished]
    assert seen == [BIG]


async def older_host_serve(link: PeerLink, header: Mapping[str, Any], stream: LinkStream) -> None:
    """A node that predates the body form (remote.py before it): no ``req`` is an invalid request."""
    from hydra_node.inference import InvalidRequest

    try:
        GenerationRequest.from_wire(header.get("req"))
    except InvalidRequest as exc:
        await stream.send(
            event_frame(GenerationError(f"invalid request: {exc.message}", code="invalid_request", status=400))
        )
        await stream.send_eof()
        return
    raise AssertionError("the older host got a request it could read")  # pragma: no cover


async def test_an_older_host_refusing_the_body_is_a_clean_retryable_502(nursery, tmp_path, autojump_clock):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path, serve=older_host_serve)
    with trio.fail_after(JOIN_S):
        with pytest.raises(GenerationError) as info:
            await collect(user_remote, host.node_id, BIG)
    assert (info.value.code, info.value.status, info.value.retryable) == ("peer_too_old", 502, True)
    assert "invalid request" in info.value.message and user_remote.statistics().errors == 1


async def test_bodies_past_the_hosts_reading_budget_are_a_retryable_503(nursery, tmp_path, autojump_clock):
    """A member opening many streams that each announce a large body cannot make the host buffer
    more than its budget: the next body is refused (503 busy, tried on another host), not read."""
    header, body = generate_header(BIG)
    assert body is not None
    kw = {"body_timeout_s": BODY_TIMEOUT_S, "body_bytes_reading": len(body) + 10}
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path, kw)
    stalled: list[RemoteError] = []
    timed_out = trio.Event()

    async def stall() -> None:
        stalled.append(await raw_answer(user, host.node_id, header, body[:10], eof=False))
        timed_out.set()

    with trio.fail_after(JOIN_S):
        nursery.start_soon(stall)
        await wait_until(lambda: host_remote._body_reading == len(body))
        with pytest.raises(GenerationError) as info:
            await collect(user_remote, host.node_id, BIG)
        assert (info.value.code, info.value.status, info.value.retryable) == ("busy", 503, True)
        await timed_out.wait()  # the stalled body times out and frees the budget
        assert stalled[0].code == "request_timeout" and host_remote._body_reading == 0
        assert [type(e) for e in await collect(user_remote, host.node_id, BIG)] == [TextDelta, Finished]
    assert seen == [BIG] and host_remote.statistics().bad_requests == 1  # the stall; busy is no bad request
