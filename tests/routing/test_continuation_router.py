"""The router continues a generation whose host fails mid-stream on another target of the same
model identity (docs/scheduler.md "Continuing a stream"): one event stream for the API, the text
of an uninterrupted run, usage counting every part, each host named. In-process targets that
generate a deterministic token sequence (token i is letter i), virtual time."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import json

import pytest
import trio

from api_serving import serving
from hydra_node.openai.routes import OpenAIApi

from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta
from hydra_node.inference.errors import RemoteError
from hydra_node.routing.router import RouteTarget, Router

MODEL = "m"
A, B, C = "a" * 64, "b" * 64, "c" * 64
N = 12  # tokens of a whole answer
REQ = GenerationRequest(model=MODEL, kind="completion", prompt="hi", max_tokens=N, temperature=0.0)
REFERENCE = "".join(chr(ord("a") + i) for i in range(N))


def lost() -> GenerationError:
    return GenerationError("peer gone", code="peer_lost", status=502, retryable=True)


@dataclass
class Host:
    """Generates tokens ``len(resume_tokens)`` … ``N-1`` (a delta per token, letter i for token i),
    skipping ``resume_skip`` characters; fails with ``fail()`` after ``fail_after`` deltas, or
    before its first event (``fail_at_open``). ``got``: every request it was opened with."""

    name: str = "?"
    fail_after: int | None = None
    fail_at_open: bool = False
    fail: object = lost
    got: list[GenerationRequest] = field(default_factory=list)
    closed: int = 0  # generations whose context was left (what it held freed)
    failures_seen: list = field(default_factory=list)  # what its context was left with
    others: list["Host"] = field(default_factory=list)  # hosts whose `closed` it records when opened
    closed_when_opened: list[int] = field(default_factory=list)

    @asynccontextmanager
    async def open(self, req: GenerationRequest):
        self.got.append(req)
        self.closed_when_opened.append(sum(h.closed for h in self.others))
        try:
            async with self._open(req) as events:
                yield events
        except GenerationError as exc:
            self.failures_seen.append(exc.code)
            raise
        finally:
            self.closed += 1

    @asynccontextmanager
    async def _open(self, req: GenerationRequest):
        if self.fail_at_open:
            raise self.fail()  # type: ignore[operator]

        async def events():
            start = len(req.resume_tokens)
            assert req.max_tokens is None or start + req.max_tokens == N
            skip = req.resume_skip - len("".join(chr(ord("a") + i) for i in range(start)))
            assert skip <= 0  # the planner never claims more text than its tokens have
            for n, i in enumerate(range(start, N)):
                if n == self.fail_after:
                    raise self.fail()  # type: ignore[operator]
                await trio.sleep(0.01)
                yield TextDelta(chr(ord("a") + i), tokens=(i,))
            yield Finished("length", prompt_tokens=1, completion_tokens=N - start, served_by=self.name)

        yield events()


@dataclass
class Source:
    targets_: list[RouteTarget]

    def targets(self) -> list[RouteTarget]:
        return self.targets_


def router_of(*hosts: tuple[str, Host, str | None], max_continuations: int = 2) -> tuple[Router, list]:
    emitted: list = []
    router = Router(
        "me", on_event=lambda kind, fields: emitted.append((kind, fields)), max_continuations=max_continuations
    )
    router.add_source(
        Source(
            [
                RouteTarget(MODEL, node, False, h.open, rtt_ms=float(i), identity=ident)
                for i, (node, h, ident) in enumerate(hosts)
            ]
        )
    )
    return router, emitted


async def run(router: Router, req: GenerationRequest = REQ):
    async with router.generate(req) as events:
        got = [ev async for ev in events]
        return got, events.served_by, events.served_by_all


def text_of(events: list) -> str:
    return "".join(ev.text for ev in events if isinstance(ev, TextDelta))


async def test_a_stream_cut_mid_way_continues_on_a_host_of_the_same_identity(autojump_clock):
    a, b = Host(fail_after=5), Host()
    router, emitted = router_of((A, a, "i1"), (B, b, "i1"))
    events, first, everyone = await run(router)
    assert text_of(events) == REFERENCE  # nothing duplicated, nothing lost
    fins = [ev for ev in events if isinstance(ev, Finished)]
    assert len(fins) == 1 and events[-1] is fins[0] and fins[0].finish_reason == "length"
    assert (fins[0].prompt_tokens, fins[0].completion_tokens) == (1, N)
    (resumed,) = b.got
    assert (resumed.resume_tokens, resumed.resume_skip, resumed.max_tokens) == ((0, 1, 2, 3, 4), 5, N - 5)
    assert (first, everyone) == (A, (A, B))
    stats = router.statistics()
    assert (stats.continuations, stats.continuation_failures, stats.retries) == (1, 0, 0)
    (cont,) = [f for k, f in emitted if k == "request.continued"]
    assert (cont["from"], cont["to"], cont["tokens"], cont["after"]) == (A, B, 5, "peer_lost")
    (done,) = [f for k, f in emitted if k == "request.finished"]
    assert (done["status"], done["target"], done["completion_tokens"]) == ("ok", B, N)


async def test_a_failed_part_is_closed_with_its_failure_before_the_continuation_opens(autojump_clock):
    a = Host(fail_after=5)
    b = Host(others=[a])
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    await run(router)
    assert b.closed_when_opened == [1]  # a's stream (and the runner slot behind it) was already left
    assert a.failures_seen == ["peer_lost"]  # ... with the failure, so its attempt is measured as one


async def test_a_continuation_whose_host_dies_too_goes_on_to_a_third(autojump_clock):
    a, b, c = Host(fail_after=3), Host(fail_after=4), Host()
    router, _ = router_of((A, a, "i1"), (B, b, "i1"), (C, c, "i1"))
    events, _, everyone = await run(router)
    assert text_of(events) == REFERENCE and everyone == (A, B, C)
    assert events[-1].completion_tokens == N
    assert c.got[0].resume_tokens == tuple(range(7)) and c.got[0].resume_skip == 7
    assert router.statistics().continuations == 2


async def test_with_two_hosts_a_second_death_is_one_clean_error(autojump_clock):
    a, b = Host(fail_after=3), Host(fail_after=4)
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    with pytest.raises(GenerationError) as info:
        await run(router)
    assert info.value.code == "peer_lost" and info.value.streamed
    assert len(a.got) == 1 and len(b.got) == 1  # the failed host is never asked again
    assert (router.statistics().continuations, router.statistics().continuation_failures) == (1, 1)


async def test_a_continuation_target_that_fails_before_its_first_event_is_skipped(autojump_clock):
    a, b, c = Host(fail_after=2), Host(fail_at_open=True), Host()
    router, _ = router_of((A, a, "i1"), (B, b, "i1"), (C, c, "i1"))
    events, _, everyone = await run(router)
    assert text_of(events) == REFERENCE and everyone == (A, B, C)
    assert c.got[0].resume_tokens == (0, 1)


@pytest.mark.parametrize("ident_b", [None, "i2"])
async def test_only_a_target_of_the_same_known_identity_continues(autojump_clock, ident_b):
    a, b = Host(fail_after=3), Host()
    router, _ = router_of((A, a, "i1"), (B, b, ident_b))
    with pytest.raises(GenerationError) as info:
        await run(router)
    assert info.value.code == "peer_lost" and b.got == []
    assert router.statistics().continuation_failures == 1


async def test_a_generation_of_unknown_identity_never_continues(autojump_clock):
    a, b = Host(fail_after=3), Host()
    router, _ = router_of((A, a, None), (B, b, None))
    with pytest.raises(GenerationError):
        await run(router)
    assert b.got == []


@pytest.mark.parametrize("code", ["runner_crashed", "runner_stalled"])
async def test_a_poisonous_failure_is_not_continued(autojump_clock, code):
    a = Host(fail_after=3, fail=lambda: RemoteError("died", code=code, status=502, retryable=True))
    b = Host()
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    with pytest.raises(GenerationError) as info:
        await run(router)
    assert info.value.code == code and b.got == []


async def test_max_continuations_zero_disables_continuation(autojump_clock):
    a, b = Host(fail_after=3), Host()
    router, _ = router_of((A, a, "i1"), (B, b, "i1"), max_continuations=0)
    with pytest.raises(GenerationError):
        await run(router)
    assert b.got == []


async def test_no_continuation_starts_after_the_client_went_away(autojump_clock):
    """The client leaves (its scope is cancelled) while the host's stream tears down with a
    continuable error: nothing is opened elsewhere."""

    @dataclass
    class Hangs(Host):
        @asynccontextmanager
        async def open(self, req: GenerationRequest):
            self.got.append(req)

            async def events():
                yield TextDelta("a", tokens=(0,))
                try:
                    await trio.sleep_forever()
                finally:  # e.g. a stream whose teardown reads as a lost peer
                    raise lost()

            yield events()

    a, b = Hangs(), Host()
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    with trio.move_on_after(1):
        await run(router)
    assert len(a.got) == 1 and b.got == []
    assert router.statistics().continuations == 0


async def test_a_stream_that_never_fails_is_relayed_as_it_came(autojump_clock):
    a, b = Host(), Host()
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    events, first, everyone = await run(router)
    assert text_of(events) == REFERENCE and everyone == (A,) and b.got == []
    assert events[-1].served_by == "?"  # the host's own Finished, untouched


async def test_a_host_that_sends_no_token_ids_is_never_continued(autojump_clock):
    @dataclass
    class Old(Host):
        @asynccontextmanager
        async def open(self, req: GenerationRequest):
            async def events():
                yield TextDelta("a")  # an older node: text, no ids
                raise lost()

            yield events()

    b = Host()
    router, _ = router_of((A, Old(), "i1"), (B, b, "i1"))
    with pytest.raises(GenerationError):
        await run(router)
    assert b.got == [] and router.statistics().continuation_failures == 1


async def post(port: int, body: dict) -> tuple[str, bytes]:
    """POST /v1/chat/completions; the head and the body (the connection closes after)."""
    s = await trio.open_tcp_stream("127.0.0.1", port)
    raw = json.dumps(body).encode()
    await s.send_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw
    )
    buf = bytearray()
    while chunk := await s.receive_some(65536):
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    return head.decode().lower(), rest


def unchunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if not n:
            break
        out += data[:n]
        data = data[n + 2 :]
    return bytes(out)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_chat_api_answers_once_and_names_every_host(stream):
    a, b = Host(name=A, fail_after=5), Host(name=B)
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": N, "temperature": 0}
    async with serving(OpenAIApi(router)) as server:
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        head, rest = await post(server.port, dict(body, **extra))
    # the header: the host that finished the answer (unstreamed), the one that started it (streamed:
    # sent before the first token)
    assert head.startswith("http/1.1 200") and f"x-hydra-served-by: {B if not stream else A}" in head
    if not stream:
        answer = json.loads(rest)
        assert answer["choices"][0]["message"]["content"] == REFERENCE
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == N and answer["usage"]["prompt_tokens"] == 1
        assert answer["hydra_served_by"] == [A, B] and answer["system_fingerprint"] == B
        return
    events = [json.loads(line[6:]) for line in unchunk(rest).decode().splitlines() if line.startswith("data: {")]
    assert not [e for e in events if "error" in e]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == REFERENCE
    finishes = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0]["hydra_served_by"] == [A, B]
    assert events[-1]["usage"]["completion_tokens"] == N


async def test_a_request_too_large_for_a_stream_header_is_a_clean_413_and_never_continues(autojump_clock):
    """A request larger than a generate stream's body bound (MAX_GENERATE_BODY_BYTES; one too large
    for the 16 KiB OPEN header travels as the body): refused before dialling, as the request's 413,
    so the original failure stands."""
    from hydra_node.routing.remote import MAX_GENERATE_BODY_BYTES, RemoteGeneration

    class Mesh:
        async def link_to(self, peer_id):  # pragma: no cover - never dialled
            raise AssertionError("dialled")

    remote = RemoteGeneration(Mesh(), node_id="me", local_open=lambda m: None)  # type: ignore[arg-type]
    big = GenerationRequest(
        model=MODEL, kind="completion", prompt="x" * MAX_GENERATE_BODY_BYTES, resume_tokens=tuple(range(100, 5000))
    )
    with pytest.raises(GenerationError) as info:
        async with remote.open_remote(B, big):
            pass
    assert (info.value.code, info.value.status, info.value.retryable) == ("request_too_large", 413, False)

    a = Host(fail_after=5)
    router, _ = router_of((A, a, "i1"), (B, Host(), "i1"))
    router._sources[0].targets_[1].open = lambda req: remote.open_remote(B, big)  # type: ignore[attr-defined]
    with pytest.raises(GenerationError) as info:
        await run(router)
    assert info.value.code == "peer_lost"  # the failure the client sees is the host's, not the 413


# ---- the other APIs: /v1/responses and /v1/messages name every host too (docs/api.md) ------------
async def post_to(port: int, path: str, body: dict) -> tuple[str, bytes]:
    """POST ``body`` to ``path``; the head and the body (the connection closes after)."""
    s = await trio.open_tcp_stream("127.0.0.1", port)
    raw = json.dumps(body).encode()
    await s.send_all(
        b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" % path.encode()
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw)
        + raw
    )
    buf = bytearray()
    while chunk := await s.receive_some(65536):
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    return head.decode().lower(), rest


def sse_events(rest: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in unchunk(rest).decode().splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("stream", [False, True])
async def test_the_responses_api_answers_once_and_names_every_host(stream):
    from hydra_node.responses.routes import ResponsesApi

    a, b = Host(name=A, fail_after=5), Host(name=B)
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    body = {"model": MODEL, "input": "hi", "max_output_tokens": N, "temperature": 0, "stream": stream}
    async with serving(ResponsesApi(router)) as server:
        head, rest = await post_to(server.port, "/v1/responses", body)
    assert head.startswith("http/1.1 200")
    if not stream:
        answer = json.loads(rest)
        assert answer["output"][0]["content"][0]["text"] == REFERENCE
        assert answer["usage"]["output_tokens"] == N and answer["usage"]["input_tokens"] == 1
        assert answer["hydra_served_by"] == [A, B]
        return
    events = sse_events(rest)
    assert not [e for e in events if e["type"] in ("error", "response.failed")]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == REFERENCE
    (done,) = [e for e in events if e["type"] == "response.completed"]
    assert done["response"]["hydra_served_by"] == [A, B] and done["response"]["usage"]["output_tokens"] == N
    assert "hydra_served_by" not in events[0]["response"]  # not known before the end


async def test_a_response_served_by_one_host_has_no_served_by_list():
    from hydra_node.responses.routes import ResponsesApi

    router, _ = router_of((A, Host(name=A), "i1"), (B, Host(name=B), "i1"))
    body = {"model": MODEL, "input": "hi", "max_output_tokens": N, "temperature": 0}
    async with serving(ResponsesApi(router)) as server:
        _, rest = await post_to(server.port, "/v1/responses", body)
    assert "hydra_served_by" not in json.loads(rest)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_messages_api_answers_once_and_names_every_host(stream):
    from hydra_node.anthropic.routes import MessagesApi

    a, b = Host(name=A, fail_after=5), Host(name=B)
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    body = {
        "model": MODEL,
        "max_tokens": N,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0,
        "stream": stream,
    }
    async with serving(MessagesApi(router)) as server:
        head, rest = await post_to(server.port, "/v1/messages", body)
    assert head.startswith("http/1.1 200")
    if not stream:
        answer = json.loads(rest)
        assert answer["content"] == [{"type": "text", "text": REFERENCE}]
        assert answer["usage"]["output_tokens"] == N and answer["usage"]["input_tokens"] == 1
        assert answer["hydra_served_by"] == [A, B]
        return
    events = sse_events(rest)
    assert not [e for e in events if e["type"] == "error"]
    assert "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta") == REFERENCE
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["hydra_served_by"] == [A, B] and delta["usage"]["output_tokens"] == N
    assert events[-1]["type"] == "message_stop"


# ---- n > 1: each choice is its own routed generation and continues on its own ---------------------
@dataclass
class FirstStreamFails(Host):
    """Fails its first stream after ``fail_after`` deltas; later streams run to the end."""

    @asynccontextmanager
    async def _open(self, req: GenerationRequest):
        fail_after = self.fail_after if len(self.got) == 1 else None

        async def events():
            start = len(req.resume_tokens)
            for n, i in enumerate(range(start, N)):
                if n == fail_after:
                    raise self.fail()  # type: ignore[operator]
                await trio.sleep(0.01)
                yield TextDelta(chr(ord("a") + i), tokens=(i,))
            yield Finished("length", prompt_tokens=1, completion_tokens=N - start, served_by=self.name)

        yield events()


async def test_with_n_2_a_choice_whose_host_dies_continues_and_the_other_is_untouched():
    a, b = FirstStreamFails(name=A, fail_after=5), Host(name=B)
    router, _ = router_of((A, a, "i1"), (B, b, "i1"))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": N,
        "temperature": 0,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with serving(OpenAIApi(router)) as server:
        head, rest = await post_to(server.port, "/v1/chat/completions", body)
    assert head.startswith("http/1.1 200")
    events = sse_events(rest)
    assert not [e for e in events if "error" in e]
    for k in (0, 1):
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"] if c["index"] == k)
        assert text == REFERENCE  # both choices whole: nothing duplicated, nothing lost
    finishes = {e["choices"][0]["index"]: e for e in events if e["choices"] and e["choices"][0]["finish_reason"]}
    assert sorted(finishes) == [0, 1]
    # each choice's own hosts: the one cut on A went on on B; the other never left its host
    (resumed,) = [r for r in b.got if r.resume_tokens]
    assert resumed.resume_tokens == (0, 1, 2, 3, 4)
    # the choices started one on A (the nearer), one on B (A's one slot held by the first: the router
    # counts its own open parts there); the one on A went on on B
    assert (len(a.got), len(b.got)) == (1, 2)
    assert resumed.request_id == a.got[0].request_id  # A's first stream, the one cut, went on on B
    cut = 1 if resumed.request_id.endswith("-1") else 0  # (choice k > 0 has request id "<id>-k")
    assert finishes[cut]["hydra_served_by"] == [A, B]
    assert "hydra_served_by" not in finishes[1 - cut]  # the other choice: served by A alone
    assert events[-1]["usage"]["completion_tokens"] == 2 * N
    assert router.statistics().continuations == 1


# ---- MoA: each member's generation goes through Router.generate, so it continues too ---------------
async def test_a_moa_member_whose_host_dies_continues_and_the_mixture_answers(autojump_clock):
    from hydra_node.inference import ChatMessage
    from hydra_node.moa.answers import MoaApi
    from hydra_node.moa.config import MESH_MODEL, MoaSettings
    from hydra_node.moa.mixture import MixtureOfAgents

    a, b, c = Host(name=A, fail_after=5), Host(name=B), Host(name=C)
    router = Router("me", max_continuations=2)
    router.add_source(
        Source(
            [
                RouteTarget(MODEL, A, False, a.open, rtt_ms=0.0, identity="i1"),
                RouteTarget(MODEL, B, False, b.open, rtt_ms=1.0, identity="i1"),
                RouteTarget("m2", C, False, c.open, rtt_ms=0.0, identity="i2"),
            ]
        )
    )
    api = MoaApi(MixtureOfAgents(router, MoaSettings(members=(MODEL, "m2")), own_node="me"))
    req = GenerationRequest(
        model=MESH_MODEL,
        kind="chat",
        messages=(ChatMessage("user", "hi"),),
        max_tokens=N,
        temperature=0.0,
        request_id="r",
    )
    out, info, _ = await api.answer(req)
    assert [m["status"] for m in info["members"]] == ["ok", "ok"] and info["majority"]
    (member,) = [m for m in info["members"] if m["model"] == MODEL]
    assert member["served_by"] == B  # the host that finished that member's answer
    assert member["usage"]["completion_tokens"] == N  # every part counted once
    assert out.content == REFERENCE and out.usage["completion_tokens"] == 2 * N
    assert b.got[0].resume_tokens == (0, 1, 2, 3, 4)  # continued from the tokens A had generated
    assert router.statistics().continuations == 1
