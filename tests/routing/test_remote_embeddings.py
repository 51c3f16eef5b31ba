"""Remote embeddings over real mesh links in one process: the request frame, vectors and errors across
an ``embed`` stream, a peer's failure or a malformed reply never relayed as success, and the router's
choice of an embedding target."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from waiting import wait_until

from inproc_mesh import mesh_member
from hydra_node.codec.framing import encode_message
from hydra_node.inference import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationError,
    MalformedRemoteEvent,
    ModelUnavailable,
    QueueFull,
    RemoteError,
    vector_bytes,
)
from hydra_node.mesh.joining import JoinPlan
from hydra_node.routing.remote import RemoteGeneration
from hydra_node.routing.remote_embed import RemoteEmbeddings
from hydra_node.routing.router import Router, RouteTarget

JOIN_S = 20.0
DIM = 3000  # 12 000 bytes a vector: 300 of them span several frames and the stream window


def unit(i: int) -> bytes:
    return vector_bytes([1.0 if j == i % DIM else 0.0 for j in range(DIM)])


async def host_model(req: EmbeddingRequest) -> EmbeddingResult:
    """The host's runner, as the host sees it (the runner child is tested live)."""
    if req.model == "busy":
        raise QueueFull("busy")
    if req.model == "bad":
        raise GenerationError("input too long", code="context_length_exceeded", status=400)
    return EmbeddingResult(
        tuple(unit(i) for i in range(len(req.inputs))), prompt_tokens=7 * len(req.inputs), served_by="host-id"
    )


def mesh_node(home: Path, name: str, models: tuple[str, ...], local_embed):
    mesh = mesh_member(home, name, models)
    embeddings = RemoteEmbeddings(mesh, node_id=mesh.node_id, local_embed=local_embed)
    remote = RemoteGeneration(
        mesh, node_id=mesh.node_id, local_open=lambda m: None, embed_remote=embeddings.embed_remote
    )
    mesh.handle_stream("embed", embeddings.serve)  # as the root does
    return mesh, embeddings, remote


async def joined(nursery, tmp_path, host_embed, models=("m1", "bad", "busy", "evil")):
    host, host_emb, _ = mesh_node(tmp_path / "h", "host", models, host_embed)
    user, user_emb, user_remote = mesh_node(tmp_path / "u", "user", (), lambda m: None)
    await nursery.start(host.run, JoinPlan())
    await nursery.start(user.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: user_remote.targets())
        await wait_until(lambda: user.node_id in host.members())  # the host serves members only
    return host, host_emb, user, user_emb, user_remote


async def test_vectors_and_errors_cross_an_embed_stream(nursery, tmp_path, autojump_clock):
    host, host_emb, _, user_emb, user_remote = await joined(
        nursery, tmp_path, lambda m: host_model if m in ("m1", "bad", "busy") else None
    )
    targets = {t.model: t for t in user_remote.targets()}
    assert targets["m1"].embed is not None and targets["m1"].node_id == host.node_id
    with trio.fail_after(JOIN_S):
        big = EmbeddingRequest("m1", tuple(f"text {i}" for i in range(300)) + ((1, 2, 3),) + ("x" * 20000,))
        result = await targets["m1"].embed(big)
        assert result.vectors == tuple(unit(i) for i in range(302)) and result.prompt_tokens == 7 * 302
        assert result.served_by == "host-id"
        with pytest.raises(RemoteError) as info:  # the host's 400 is a peer's failure here: 502, message kept
            await user_emb.embed_remote(host.node_id, EmbeddingRequest("bad", ("x",)))
        assert info.value.status == 502 and info.value.code == "context_length_exceeded"
        assert info.value.remote_status == 400 and "input too long" in info.value.message
        with pytest.raises(RemoteError) as info:  # busy (429) there: 503, retryable
            await user_emb.embed_remote(host.node_id, EmbeddingRequest("busy", ("x",)))
        assert info.value.status == 503 and info.value.retryable
        with pytest.raises(GenerationError) as info:  # a model the host does not have
            await user_emb.embed_remote(host.node_id, EmbeddingRequest("zz", ("x",)))
        assert info.value.status == 503
    assert host_emb.served == 3 and user_emb.opened == 4 and user_emb.errors == 3


async def test_a_malformed_reply_is_a_502_never_a_result(nursery, tmp_path, autojump_clock):
    replies = {
        "nan": [{"op": "vectors", "v": [vector_bytes([float("nan")] * 4)]}],
        "short": [{"op": "vectors", "v": [unit(0)]}, {"op": "embedded", "prompt_tokens": 1, "served_by": "h"}],
        "ragged": [{"op": "vectors", "v": [unit(0), b"\x00" * 8]}],
        "floats": [{"op": "vectors", "v": [[0.5, 0.5]]}],
        "status": [{"op": "error", "message": "fine really", "code": "ok", "status": 200}],
        "unknown": [{"op": "delta", "text": "hi"}],
        "garbage": [],  # bytes that are no frame at all
    }

    async def evil_host(link, header, stream) -> None:
        data = b""
        while not data:
            data = await stream.receive()
        model = data[data.index(b"emodel") + 6 :]  # crude: the model name follows its key
        name = next(k for k in replies if model.startswith(bytes([0x60 + len(k)]) + k.encode()))
        for msg in replies[name]:
            await stream.send(encode_message(msg, limit=1 << 20))
        if name == "garbage":
            await stream.send(b"\xff\xff\xff\xff")
        await stream.send_eof()

    host, _, _, user_emb, _ = await joined(nursery, tmp_path, lambda m: None, models=tuple(replies))
    host.handle_stream("embed", evil_host)  # a peer that breaks the protocol
    with trio.fail_after(JOIN_S):
        for name in replies:
            with pytest.raises(MalformedRemoteEvent) as info:
                await user_emb.embed_remote(host.node_id, EmbeddingRequest(name, ("a", "b")))
            assert info.value.status == 502, name


async def test_the_router_embeds_on_a_target_that_can_and_retries_once(autojump_clock):
    calls: list[str] = []

    def target(node: str, outcome, local=False, embed=True) -> RouteTarget:
        async def run(req: EmbeddingRequest) -> EmbeddingResult:
            calls.append(node)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        return RouteTarget(model="m", node_id=node, local=local, open=None, embed=run if embed else None)

    ok = EmbeddingResult((unit(0),), 1, "b")

    class Source:
        def __init__(self, ts):
            self.ts = ts

        def targets(self):
            return self.ts

    router = Router("me")
    router.add_source(Source([target("a", ModelUnavailable("a is gone")), target("b", ok)]))
    assert await router.embed(EmbeddingRequest("m", ("x",))) == ok and calls == ["a", "b"]
    calls.clear()
    router = Router("me")
    router.add_source(Source([target("a", GenerationError("bad input", status=400)), target("b", ok)]))
    with pytest.raises(GenerationError):  # not retryable: the client's fault, answered at once
        await router.embed(EmbeddingRequest("m", ("x",)))
    assert calls == ["a"]
    router = Router("me")
    router.add_source(Source([target("a", ok, embed=False)]))
    with pytest.raises(ModelUnavailable):  # a target that cannot embed (an older peer) is never tried
        await router.embed(EmbeddingRequest("m", ("x",)))
