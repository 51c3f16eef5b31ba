"""A chat's images across the mesh (protocol/README.md section 11.3, docs/vision.md), over real mesh
links in one process: the host's runner gets every image's bytes; a second turn about the same image
through the same peer does not carry the image again (the host fills it from its cache); a host that
no longer holds it answers ``images_missing`` and gets the request again with the bytes, unseen by
the caller; a request with images goes only to a host whose model reports ``vision`` (400 naming the
model when none does, 503 while a host's capabilities are unknown), and ``/v1/models`` and
``/api/status`` show ``vision``."""

from __future__ import annotations

import dataclasses
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from waiting import wait_until

from inproc_mesh import mesh_member
from hydra_node.admin.status_json import to_json
from hydra_node.inference import (
    ChatMessage,
    EventStreamDecoder,
    Finished,
    GenerationError,
    GenerationRequest,
    ModelCaps,
    RemoteError,
    TextDelta,
)
from hydra_node.inference.images import IMAGE_MARK, ImageBlob, image_sha256
from hydra_node.mesh.joining import JoinPlan
from hydra_node.mesh.service import MeshService
from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.errors import MeshError
from hydra_node.openai.routes import OpenAIApi
from hydra_node.routing.capable import capability_refusal
from hydra_node.routing.image_cache import ImageCache, SentImages
from hydra_node.routing.remote import MAX_GENERATE_BODY_BYTES, RemoteGeneration, generate_header
from hydra_node.routing.router import Router, RouteTarget, TargetState
from tests.fixtures.vision_model import IMAGE_A, IMAGE_B, png_bytes

JOIN_S = 20.0
VISION = ModelCaps(vision=True)


def blob(data: bytes, size: int = 32) -> ImageBlob:
    return ImageBlob(image_sha256(data), data, "image/png", size, size)


def chat(*images: ImageBlob, text: str = "What is in this picture?", model: str = "m1") -> GenerationRequest:
    content = text + "".join(f" {IMAGE_MARK}" for _ in images)
    return GenerationRequest(
        model=model, kind="chat", messages=(ChatMessage("user", content),), images=images, max_tokens=4
    )


#: A photo-sized image (random pixels barely compress: about 200 KB, far past a 16 KiB header).
BIG_IMAGE = blob(png_bytes(256, 256, 7), 256)


# ---- over real links ----------------------------------------------------------------------------------


def node(home: Path, name: str, models: tuple[str, ...], local_open, **kw: Any) -> tuple[MeshService, RemoteGeneration]:
    mesh = mesh_member(home, name, models)
    remote = RemoteGeneration(mesh, node_id=mesh.node_id, local_open=local_open, **kw)
    mesh.handle_stream("generate", remote.serve)  # as the root does
    return mesh, remote


def recording_model(seen: list[GenerationRequest]):
    """A model that records the request it got and answers with its images' hashes."""

    @asynccontextmanager
    async def open_local(req: GenerationRequest):
        seen.append(req)

        async def events():
            yield TextDelta(",".join(im.sha256[:8] for im in req.images))
            yield Finished("stop", 1, 1, served_by="host")

        yield events()

    return open_local


async def pair(nursery, tmp_path, host_kw: dict[str, Any] | None = None):
    seen: list[GenerationRequest] = []
    host, host_remote = node(tmp_path / "h", "host", ("m1",), lambda m: recording_model(seen), **(host_kw or {}))
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


def with_all_bytes(req: GenerationRequest) -> bool:
    return all(isinstance(im, ImageBlob) and not im.elided for im in req.images)


async def test_a_second_turn_about_the_same_image_does_not_send_it_again(nursery, tmp_path, autojump_clock):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path)
    first = chat(BIG_IMAGE)
    second = dataclasses.replace(
        first,
        messages=(
            *first.messages,
            ChatMessage("assistant", "A noisy square."),
            ChatMessage("user", "And its colours?"),
        ),
    )
    with trio.fail_after(JOIN_S):
        one = await collect(user_remote, host.node_id, first)
        sent_once = user_remote.statistics()
        two = await collect(user_remote, host.node_id, second)
    assert [type(e) for e in one] == [type(e) for e in two] == [TextDelta, Finished]
    assert one[0].text == two[0].text == BIG_IMAGE.sha256[:8]
    assert seen == [first, second] and all(with_all_bytes(r) for r in seen)  # the runner gets the bytes
    st = user_remote.statistics()
    assert (sent_once.images_sent, sent_once.image_bytes_sent) == (1, len(BIG_IMAGE.data))
    # the second turn: the image left out (its bytes not sent again), filled by the host
    assert (st.images_sent, st.images_elided, st.image_bytes_sent) == (1, 1, len(BIG_IMAGE.data))
    assert st.images_missing_retries == 0
    hs = host_remote.statistics()
    assert (hs.image_cache.entries, hs.image_cache.stored, hs.image_cache.filled) == (1, 1, 1)
    assert hs.counters()["image_cache_bytes"] == len(BIG_IMAGE.data) and hs.served == 2


async def test_a_host_that_lost_the_image_gets_it_again_unseen_by_the_caller(nursery, tmp_path, autojump_clock):
    # a host that keeps no image (as one that restarted, or evicted it): every elided image is missing
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path, {"image_cache": ImageCache(0)})
    req = chat(blob(IMAGE_A), blob(IMAGE_B), blob(IMAGE_A))  # A twice: its bytes go once per request
    with trio.fail_after(JOIN_S):
        for _ in range(2):
            events = await collect(user_remote, host.node_id, req)
            assert [type(e) for e in events] == [TextDelta, Finished]
    assert seen == [req, req] and all(with_all_bytes(r) for r in seen)
    st, hs = user_remote.statistics(), host_remote.statistics()
    assert hs.images_missing_answers == 1 and st.images_missing_retries == 1
    # turn 1: A, B with bytes, A again elided; turn 2: all elided, then A, B with bytes, A elided
    assert (st.images_sent, st.images_elided) == (4, 5)
    assert st.image_bytes_sent == 2 * (len(IMAGE_A) + len(IMAGE_B)) and st.errors == 0
    assert hs.bad_requests == 0 and hs.served == 2


async def test_an_elided_image_the_host_never_got_is_a_409_images_missing_naming_it(nursery, tmp_path, autojump_clock):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path)
    img = blob(IMAGE_A)
    wire = chat(img.without_data()).to_wire()
    with trio.fail_after(JOIN_S):
        link = await user.link_to(host.node_id)
        async with link.open_stream({"kind": "generate", "req": wire}) as stream:
            decoder = EventStreamDecoder()
            err = None
            while err is None and (data := await stream.receive()):
                decoder.receive_data(data)
                try:
                    assert decoder.next_event() is None
                except RemoteError as exc:
                    err = exc
    assert err is not None and (err.code, err.remote_status, err.retryable) == ("images_missing", 409, True)
    assert img.sha256 in err.message
    assert not seen and host_remote.statistics().images_missing_answers == 1  # nothing ran


async def test_a_peer_cannot_use_an_image_another_peer_sent(nursery, tmp_path, autojump_clock):
    host, host_remote, user, user_remote, seen = await pair(nursery, tmp_path)
    other, other_remote = node(tmp_path / "o", "other", (), lambda m: None, sent_images=SentImages())
    await nursery.start(other.run, JoinPlan.from_tokens([host.invite(600)], time.time()))
    img = blob(IMAGE_B)
    with trio.fail_after(JOIN_S):
        await wait_until(lambda: other_remote.targets() and other.node_id in host.members())
        await collect(user_remote, host.node_id, chat(img))  # the user's image, now held for the user
        # the other member claims to have sent it: the host answers images_missing, it sends the bytes
        other_remote._sent.sent(host.node_id, [img])
        events = await collect(other_remote, host.node_id, chat(img))
    assert [type(e) for e in events] == [TextDelta, Finished] and len(seen) == 2
    assert other_remote.statistics().images_missing_retries == 1


# ---- without links: sizes, the router -------------------------------------------------------------------


class NoLinks:
    """A mesh no peer is reachable in (``open_remote`` gets as far as dialling)."""

    async def link_to(self, peer_id: str):
        raise MeshError("no route")

    def link(self, peer_id: str):
        return None

    def members(self):
        return {}

    def member_states(self, now: float):
        return {}


def _padded(img: ImageBlob, total: int) -> GenerationRequest:
    """A chat with ``img`` whose full CBOR (the image's bytes included) is exactly ``total`` bytes."""
    req = chat(img, text="x" * 70_000)
    size = len(cbor.encode(req.to_wire()))
    return chat(img, text="x" * (70_000 + total - size))


@pytest.mark.parametrize("over", [0, 1])
async def test_the_413_of_an_elided_request_is_that_of_the_full_one(over):
    """A request is as large as it is whatever the peer holds: with its image left out it is a few
    KiB, but one byte past the bound with the bytes is refused (413) before dialling; at the bound, sent."""
    img = blob(b"\x89PNG" + bytes(range(256)) * 4096)  # 1 MiB
    req = _padded(img, MAX_GENERATE_BODY_BYTES + over)
    assert len(cbor.encode(req.to_wire())) == MAX_GENERATE_BODY_BYTES + over
    sent = SentImages()
    sent.sent("peer", [img])  # the peer holds it: the image goes without its bytes
    remote = RemoteGeneration(NoLinks(), node_id="me", local_open=lambda m: None, sent_images=sent)
    with pytest.raises(GenerationError) as info:
        async with remote.open_remote("peer", req):
            pass
    if over:
        assert (info.value.status, info.value.code) == (413, "request_too_large")
    else:
        assert info.value.code == "model_unavailable"  # it got as far as dialling
    if over:  # and the same without the elision (sent as a body, were it small enough)
        with pytest.raises(GenerationError) as again:
            generate_header(req)
        assert again.value.status == 413


def test_a_request_with_images_travels_as_a_body_of_up_to_16_mib():
    header, body = generate_header(chat(BIG_IMAGE))
    assert body is not None and header == {"kind": "generate", "body": len(body)}
    assert cbor.decode(body)["images"][0]["data"] == BIG_IMAGE.data
    assert MAX_GENERATE_BODY_BYTES == 16 * 1024 * 1024 - 64 * 1024


def target(node: str, caps: ModelCaps | None, served: list[GenerationRequest], local=False, state=TargetState.READY):
    @asynccontextmanager
    async def open_(r: GenerationRequest):
        served.append(r)

        async def events():
            yield Finished("stop", 1, 1, served_by=node)

        yield events()

    return RouteTarget(model="m1", node_id=node, local=local, open=open_, caps=caps, state=state, rtt_ms=len(node))


class Source:
    def __init__(self, ts):
        self.ts = ts

    def targets(self):
        return self.ts


async def route(router: Router, r: GenerationRequest) -> str:
    async with router.generate(r) as events:
        last = [ev async for ev in events][-1]
    assert isinstance(last, Finished)
    return last.served_by


async def test_a_request_with_images_goes_to_the_host_with_a_projector_and_keeps_its_bytes():
    served: list[GenerationRequest] = []
    router = Router("me")
    # the local runner is first by the fixed rule, but has no projector; an older peer reports nothing
    router.add_source(
        Source(
            [target("me", ModelCaps(), served, local=True), target("old", None, served), target("eyes", VISION, served)]
        )
    )
    req = chat(blob(IMAGE_A))
    assert await route(router, req) == "eyes"
    assert await route(router, chat()) == "me"  # a plain chat: the fixed rule
    assert served[0] is req  # passed as is: the image with its bytes
    # the model can see when any host can (/v1/models, /api/status, the API's checks)
    assert router.capabilities("m1").vision and router.models()[0].caps == VISION
    entry = OpenAIApi._model_obj(router.models()[0], 0)
    assert entry["caps"] == {"vision": True}
    assert to_json(router.models()[0].caps)["vision"] is True and to_json(ModelCaps())["audio"] is False


async def test_the_local_runner_with_a_projector_gets_the_request_as_is():
    served: list[GenerationRequest] = []
    router = Router("me")
    router.add_source(Source([target("me", VISION, served, local=True), target("eyes", VISION, served)]))
    req = chat(blob(IMAGE_A), blob(IMAGE_B))
    assert await route(router, req) == "me"
    assert served == [req] and with_all_bytes(served[0])


async def test_no_host_with_a_projector_is_a_400_naming_images_and_the_model():
    served: list[GenerationRequest] = []
    router = Router("me")
    router.add_source(Source([target("me", ModelCaps(), served, local=True), target("b", ModelCaps(fim=True), served)]))
    with pytest.raises(GenerationError) as info:
        await route(router, chat(blob(IMAGE_A)))
    err = info.value
    assert (err.status, err.code) == (400, "unsupported_parameter") and not served
    assert "images in 'messages' need a model served with an image projector" in err.message
    assert "and 'm1' is not one" in err.message


async def test_a_host_whose_capabilities_are_unknown_is_a_503_not_a_400():
    served: list[GenerationRequest] = []
    listed = [target("me", ModelCaps(), served, local=True), target("old", None, served)]
    err = capability_refusal(chat(blob(IMAGE_A)), listed)
    assert err is not None and (err.status, err.code, err.retryable) == (503, "capability_unknown", True)
    assert "images in 'messages' need" in err.message
    router = Router("me")
    router.add_source(Source(listed))
    with pytest.raises(GenerationError) as info:
        await route(router, chat(blob(IMAGE_A)))
    assert (info.value.status, info.value.code) == (503, "capability_unknown") and not served
