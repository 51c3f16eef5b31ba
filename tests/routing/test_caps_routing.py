"""Routing by model capability and the tokenizer's routing: a request that needs reasoning or
fill-in-the-middle goes only to a target that reports it (400 when every host says the model
cannot, 503 when a host's capabilities are unknown); ``Router.capabilities``; ``Router.tokenize``
local first, retried once; and the ``tokenize`` stream over real mesh links in one process
(a peer's error or a malformed reply is a 502/503, never a result)."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from waiting import wait_until

from inproc_mesh import mesh_member
from hydra_node.codec.framing import encode_message
from hydra_node.inference import (
    NO_CAPS,
    Finished,
    GenerationError,
    GenerationRequest,
    MalformedRemoteEvent,
    ModelCaps,
    ModelUnavailable,
    QueueFull,
    TokenizeRequest,
    TokenizeResult,
)
from hydra_node.mesh.joining import JoinPlan
from hydra_node.routing.capable import capability_refusal, needed, serves
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.routing.remote_tokenize import TOKENIZE_KIND, RemoteTokenizer
from hydra_node.routing.router import Router, RouteTarget, TargetState
from hydra_node.runtime.child.vocab_ops import FimTokens, infill_layout

FIM = ModelCaps(fim=True)
THINK = ModelCaps("think", thinks=True, switch=True)
JOIN_S = 20.0


def req(**kw) -> GenerationRequest:
    return GenerationRequest(model="m", kind="completion", prompt="x", max_tokens=1, **kw)


class Source:
    def __init__(self, ts):
        self.ts = ts

    def targets(self):
        return self.ts


def target(node: str, caps: ModelCaps | None, served: list[str], local=False, state=TargetState.READY) -> RouteTarget:
    @asynccontextmanager
    async def open_(r: GenerationRequest):
        served.append(node)

        async def events():
            yield Finished("stop", 1, 1, served_by=node)

        yield events()

    async def tokenize(r: TokenizeRequest) -> TokenizeResult:
        served.append(node)
        if node == "busy":
            raise QueueFull("m")
        return TokenizeResult(tokens=(1,), served_by=node)

    return RouteTarget(
        model="m", node_id=node, local=local, open=open_, caps=caps, tokenize=tokenize, state=state, rtt_ms=len(node)
    )


async def route(router: Router, r: GenerationRequest) -> None:
    async with router.generate(r) as events:
        async for _ in events:
            pass


# ---- pure rules -------------------------------------------------------------------------------------


def test_what_a_request_needs_and_which_caps_serve_it():
    assert needed(req()) == () and serves(None, req())  # a plain request goes anywhere, an older host too
    assert needed(req(reasoning_effort="low", thinking=True)) == (("reasoning", "reasoning_effort"),)
    assert needed(req(thinking_budget=0)) == (("reasoning", "thinking_budget"),)
    assert needed(req(suffix="y")) == (("fim", "suffix"),)
    assert serves(FIM, req(suffix="y")) and not serves(NO_CAPS, req(suffix="y")) and not serves(None, req(suffix="y"))
    assert serves(THINK, req(thinking=False)) and not serves(FIM, req(thinking=False))


def test_the_refusal_is_a_400_when_every_host_reports_and_a_503_when_one_is_unknown():
    served: list[str] = []
    known = [target("a", NO_CAPS, served), target("b", THINK, served)]
    err = capability_refusal(req(suffix="y"), known)
    assert err is not None and (err.status, err.code) == (400, "unsupported_parameter")
    assert "'suffix'" in err.message and "'m'" in err.message
    err = capability_refusal(req(suffix="y"), [*known, target("old", None, served)])
    assert err is not None and (err.status, err.code) == (503, "capability_unknown") and err.retryable
    assert capability_refusal(req(suffix="y"), [*known, target("c", FIM, served)]) is None
    assert capability_refusal(req(suffix="y"), []) is None  # no target at all: the router's own 404/503
    assert capability_refusal(req(), known) is None


def test_the_infill_layout_is_llama_servers_psm_order():
    fim = FimTokens(pre=8, suf=9, mid=10)
    assert infill_layout([1, 2], [3], fim) == [8, 1, 2, 9, 3, 10]
    assert infill_layout([], [], fim, bos=[0]) == [0, 8, 9, 10]


# ---- the router ---------------------------------------------------------------------------------------


async def test_a_request_needing_a_capability_goes_only_to_a_host_that_reports_it():
    served: list[str] = []
    router = Router("me")
    # the local runner is first by the fixed rule, but lacks FIM; an older peer reports nothing
    router.add_source(
        Source([target("me", NO_CAPS, served, local=True), target("old", None, served), target("fimhost", FIM, served)])
    )
    await route(router, req(suffix="y"))
    await route(router, req())
    assert served == ["fimhost", "me"]
    served.clear()
    with pytest.raises(GenerationError) as err:  # no one reasons: the older peer's caps are unknown
        await route(router, req(reasoning_effort="high"))
    assert (err.value.status, err.value.code) == (503, "capability_unknown") and served == []


async def test_capabilities_come_from_the_local_runner_first_then_the_ready_hosts():
    served: list[str] = []
    router = Router("me")
    assert router.capabilities("m") == NO_CAPS  # no such model
    router.add_source(Source([target("old", None, served), target("p", THINK, served, state=TargetState.LOADING)]))
    assert router.capabilities("m") == THINK  # a loading host's report beats nothing
    router.add_source(Source([target("q", FIM, served)]))
    assert router.capabilities("m") == FIM  # a ready host first
    router.add_source(Source([target("me", NO_CAPS, served, local=True)]))
    assert router.capabilities("m") == NO_CAPS  # this node's own runner
    assert router.capabilities("other") == NO_CAPS


async def test_tokenize_runs_on_the_first_target_that_can_and_retries_once():
    served: list[str] = []
    router = Router("me")
    router.add_source(Source([target("busy", NO_CAPS, served), target("farther", NO_CAPS, served)]))
    res = await router.tokenize(TokenizeRequest("m", "tokenize", content="x"))  # nearest first (rtt: the name's length)
    assert res.served_by == "farther" and served == ["busy", "farther"]
    router = Router("me")
    old = target("old", None, served)
    old.tokenize = None  # an older peer: no tokenize stream
    router.add_source(Source([old]))
    with pytest.raises(ModelUnavailable):
        await router.tokenize(TokenizeRequest("m", "tokenize", content="x"))


# ---- the tokenize stream --------------------------------------------------------------------------------


async def host_tokenize(r: TokenizeRequest) -> TokenizeResult:
    if r.model == "busy":
        raise QueueFull("busy")
    return TokenizeResult(tokens=tuple(range(len(r.content))), pieces=tuple(r.content), served_by="host-id")


def mesh_node(home: Path, name: str, models: tuple[str, ...], local_tokenize):
    mesh = mesh_member(home, name, models)
    tok = RemoteTokenizer(mesh, node_id=mesh.node_id, local_tokenize=local_tokenize)
    mesh.handle_stream(TOKENIZE_KIND, tok.serve)
    return mesh, tok


async def test_results_and_errors_cross_a_tokenize_stream(nursery, tmp_path, autojump_clock):
    host, host_tok = mesh_node(tmp_path / "h", "host", ("m", "busy"), lambda m: host_tokenize if m != "gone" else None)
    user, user_tok = mesh_node(tmp_path / "u", "user", (), lambda m: None)
    user_remote = RemoteGeneration(user, node_id=user.node_id, local_open=lambda m: None)
    await nursery.start(host.run, JoinPlan())
    await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: user_remote.targets())
        await wait_until(lambda: user.node_id in host.members())
        res = await user_tok.tokenize_remote(host.node_id, TokenizeRequest("m", "tokenize", content="abc" * 1000))
        assert res.tokens == tuple(range(3000)) and "".join(map(str, res.pieces)) == "abc" * 1000
        with pytest.raises(GenerationError) as err:  # the host's 429: a busy peer is a 503
            await user_tok.tokenize_remote(host.node_id, TokenizeRequest("busy", "tokenize", content="x"))
        assert err.value.status == 503
        with pytest.raises(GenerationError) as err:  # not hosted there
            await user_tok.tokenize_remote(host.node_id, TokenizeRequest("gone", "tokenize", content="x"))
        assert err.value.status == 503
        assert host_tok.served == 2


async def test_a_malformed_tokenize_reply_is_a_502_never_a_result(nursery, tmp_path, autojump_clock):
    async def evil(link, header, stream):
        await stream.receive()
        await stream.send(encode_message({"op": "tokenized", "tokens": [1, 2], "pieces": ["only one"]}, limit=1024))
        await stream.send_eof()

    host = mesh_member(tmp_path / "h", "host", ("m",))
    host.handle_stream(TOKENIZE_KIND, evil)
    user, user_tok = mesh_node(tmp_path / "u", "user", (), lambda m: None)
    user_remote = RemoteGeneration(user, node_id=user.node_id, local_open=lambda m: None)
    await nursery.start(host.run, JoinPlan())
    await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: user_remote.targets())
        await wait_until(lambda: user.node_id in host.members())
        with pytest.raises(MalformedRemoteEvent) as err:
            await user_tok.tokenize_remote(host.node_id, TokenizeRequest("m", "tokenize", content="x"))
        assert err.value.status == 502 and user_tok.errors == 1


async def test_a_sampling_extension_goes_only_to_a_host_that_reports_capabilities():
    served: list[str] = []
    router = Router("me")
    router.add_source(Source([target("old", None, served), target("newer", NO_CAPS, served)]))
    await route(router, req(top_k=5))
    await route(router, req(repeat_penalty=1.2))
    assert served == ["newer", "newer"]
    router = Router("me")
    router.add_source(Source([target("old", None, served)]))
    with pytest.raises(GenerationError) as err:  # only an older host: it would sample without min_p
        await route(router, req(min_p=0.1))
    assert (err.value.status, err.value.code) == (503, "capability_unknown") and "'min_p'" in err.value.message


def test_a_loading_host_whose_caps_are_unknown_yet_is_waited_for_not_refused():
    served: list[str] = []
    loading = target("me", None, served, local=True, state=TargetState.LOADING)
    assert capability_refusal(req(suffix="y"), [loading, target("a", NO_CAPS, served)]) is None
