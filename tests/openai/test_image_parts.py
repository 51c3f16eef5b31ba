"""Image parts on /v1/chat/completions (hydra_node/openai/chat_parse.py; docs/vision.md): each becomes
IMAGE_MARK in the message's text and one image of the request, resolved on the receiving node
before routing; completions take text only."""

from __future__ import annotations

import base64
import json
from contextlib import asynccontextmanager

import pytest
import trio

from api_serving import serving
from hydra_node.api.errors import ApiError
from hydra_node.inference import NO_CAPS, Finished, GenerationRequest, ModelCaps, TextDelta
from hydra_node.inference.images import IMAGE_MARK, MAX_IMAGES, ImageBlob, ImageInput, image_sha256
from hydra_node.openai.parse import TEXT_ONLY, parse_body
from hydra_node.openai.routes import OpenAIApi
from tests.fixtures.vision_model import IMAGE_A, IMAGE_B

A_URL = "data:image/png;base64," + base64.b64encode(IMAGE_A).decode()
B_URL = "data:image/png;base64," + base64.b64encode(IMAGE_B).decode()


def image(url: str = A_URL, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def chat(messages: list, **kw) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **kw}).encode()


def parsed(messages: list, **kw) -> GenerationRequest:
    return parse_body(chat(messages, **kw), "chat").request


def refused(raw: bytes, kind: str = "chat") -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_body(raw, kind)
    assert info.value.status == 400
    return info.value


def test_image_parts_become_marks_and_images_in_order():
    req = parsed(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [text("Compare "), image(detail="low"), text(" and "), image(B_URL)]},
            {"role": "assistant", "content": "Two squares."},
            {"role": "user", "content": [{"type": "image_url", "image_url": A_URL}, text("again?")]},  # bare string
        ]
    )
    assert [m.content for m in req.messages] == [
        "Be brief.",
        f"Compare {IMAGE_MARK} and {IMAGE_MARK}",
        "Two squares.",
        f"{IMAGE_MARK}again?",
    ]
    assert [(im.where, im.data, im.detail, im.media_type) for im in req.images] == [  # type: ignore[union-attr]
        ("messages[1].content[1]", IMAGE_A, "low", "image/png"),
        ("messages[1].content[3]", IMAGE_B, "auto", "image/png"),
        ("messages[3].content[0]", IMAGE_A, "auto", "image/png"),
    ]


def test_an_http_url_is_kept_for_the_api_node_to_fetch():
    req = parsed([{"role": "user", "content": [image("https://example.com/cat.png", detail="high")]}])
    assert req.images == (ImageInput("messages[0].content[0]", url="https://example.com/cat.png", detail="high"),)


def test_text_marks_become_replacement_characters_only_in_a_request_with_images():
    with_image = parsed(
        [
            {"role": "system", "content": "odd \ufffc system"},
            {"role": "user", "content": [text("a \ufffc b"), image()]},
        ]
    )
    assert [m.content for m in with_image.messages] == ["odd \ufffd system", f"a \ufffd b{IMAGE_MARK}"]
    assert len(with_image.images) == 1
    without = parsed([{"role": "user", "content": [text("a \ufffc b")]}])
    assert without.messages[0].content == "a \ufffc b" and without.images == ()  # never touched


@pytest.mark.parametrize("role", ["system", "developer", "assistant"])
def test_images_only_in_user_messages(role):
    err = refused(chat([{"role": role, "content": [image()]}, {"role": "user", "content": "hi"}]))
    assert err.param == "messages[0].content[0].type" and "only in user messages" in err.message


@pytest.mark.parametrize(
    "part, param, words",
    [
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "messages[0].content[1]", "audio"),
        ({"type": "file", "file": {"file_id": "f"}}, "messages[0].content[1]", "file"),
        (image("data:image/png;base64,!!!notbase64"), "messages[0].content[1]", "base64"),
        (image("data:image/png," + "A" * 8), "messages[0].content[1]", "data:<image type>;base64"),
        (image("data:text/plain;base64,QUFB"), "messages[0].content[1]", "unsupported image type"),
        (image("data:;base64,QUFB"), "messages[0].content[1]", "required"),
        (image("ftp://example.com/a.png"), "messages[0].content[1]", "data: URL"),
        (image("x"), "messages[0].content[1]", "data: URL"),
        (image("http://[::1/a.png"), "messages[0].content[1]", "no valid host"),
        (image("https://example.com:0/a.png"), "messages[0].content[1]", "no valid host"),
        (image(detail="medium"), "messages[0].content[1].detail", "detail"),
        ({"type": "image_url", "image_url": 5}, "messages[0].content[1].image_url", "object"),
        ({"type": "image_url", "image_url": {"url": A_URL, "size": 1}}, "messages[0].content[1].image_url.size", ""),
        ({"type": "video", "video": {}}, "messages[0].content[1]", "text and image_url"),
    ],
)
def test_bad_parts_are_refused_naming_them(part, param, words):
    err = refused(chat([{"role": "user", "content": [text("see"), part]}]))
    assert err.param == param and words in err.message


def test_too_many_images_are_refused_naming_the_part():
    err = refused(chat([{"role": "user", "content": [image()] * (MAX_IMAGES + 1)}]))
    assert err.param == f"messages[0].content[{MAX_IMAGES}]" and err.code == "too_many_images"
    assert len(parsed([{"role": "user", "content": [image()] * MAX_IMAGES}]).images) == MAX_IMAGES


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "hi", "multimodal_data": ["AAAA"]}, "multimodal_data"),
        ({"prompt": "hi", "image_data": [{"data": "AAAA", "id": 1}]}, "image_data"),
        ({"prompt": {"prompt_string": "hi <__media__>", "multimodal_data": ["AAAA"]}}, "prompt"),
        ({"prompt": ["hi", {"prompt_string": "x", "multimodal_data": []}]}, "prompt"),
    ],
)
def test_completions_take_text_only(body, param):
    err = refused(json.dumps({"model": "m", **body}).encode(), "completion")
    assert err.param == param and err.message == TEXT_ONLY


# ---- the route: resolved before routing -----------------------------------------------------


class RecordingRouter:
    """A router that answers one word and keeps every request it was asked to route."""

    def __init__(self) -> None:
        self.seen: list[GenerationRequest] = []

    def models(self):
        return [type("M", (), {"id": "m", "hosts": [], "states": {}, "caps": NO_CAPS})()]

    def recently_seen(self, model: str) -> bool:
        return False

    def capabilities(self, model: str) -> ModelCaps:
        return NO_CAPS

    @asynccontextmanager
    async def generate(self, req):
        self.seen.append(req)

        async def events():
            yield TextDelta("Square.")
            yield Finished("stop", 3, 1)

        yield events()


class MeshOnly:
    moa = None

    def handles(self, model: str) -> bool:
        return model == "mesh"


async def post(port: int, path: str, raw: bytes) -> tuple[int, dict]:
    async with await trio.open_tcp_stream("127.0.0.1", port) as s:
        await s.send_all(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        buf = bytearray()
        while chunk := await s.receive_some(65536):
            buf += chunk
    head, _, payload = bytes(buf).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


async def test_the_route_resolves_images_before_routing_and_refuses_bad_ones():
    router = RecordingRouter()
    api = OpenAIApi(router, moa=MeshOnly())  # type: ignore[arg-type]
    ask = [{"role": "user", "content": [text("What is this?"), image(detail="low"), image(B_URL)]}]
    async with serving(api) as server:
        status, body = await post(server.port, "/v1/chat/completions", chat(ask, n=2))
        assert status == 200 and body["choices"][0]["message"]["content"] == "Square."
        assert len(router.seen) == 2  # n=2: both choices carry the resolved images
        for req in router.seen:
            assert all(isinstance(im, ImageBlob) for im in req.images)
            assert [im.sha256 for im in req.images] == [image_sha256(IMAGE_A), image_sha256(IMAGE_B)]
        corrupt = "data:image/png;base64," + base64.b64encode(IMAGE_A[: len(IMAGE_A) // 2]).decode()
        bad = [{"role": "user", "content": [image(), text("and"), image(corrupt)]}]
        status, body = await post(server.port, "/v1/chat/completions", chat(bad))
        assert status == 400 and body["error"]["param"] == "messages[0].content[2]"
        assert "could not be decoded" in body["error"]["message"]
        status, body = await post(
            server.port, "/v1/chat/completions", json.dumps({**json.loads(chat(ask)), "model": "mesh"}).encode()
        )
        assert status == 400 and body["error"]["param"] == "model" and "mesh" in body["error"]["message"]
        local = [{"role": "user", "content": [image("http://127.0.0.1:9/a.png")]}]
        status, body = await post(server.port, "/v1/chat/completions", chat(local))
        assert status == 400 and body["error"]["code"] == "image_url_refused"  # the default policy
    assert len(router.seen) == 2  # no refused request was routed


# ---- live: a real node ----------------------------------------------------------------------


def test_a_real_node_takes_an_image_body_over_8_mib_and_routes_it_by_vision(shared_node):
    """Through a real node's port: a body of about 10 MB (a 7 MB image as base64) is read (not 413),
    the image is checked there, and the router refuses it naming the model, which has no projector;
    a corrupt image is refused naming the part before routing."""
    import io
    import os

    import httpx
    from PIL import Image

    from hydra_node.models import BUNDLED_MODEL_ID

    out = io.BytesIO()
    Image.frombytes("RGB", (1500, 1600), os.urandom(1500 * 1600 * 3)).save(out, format="PNG", compress_level=0)
    big = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    ask = {
        "model": BUNDLED_MODEL_ID,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [text("What?"), image(big)]}],
    }
    raw = json.dumps(ask).encode()
    assert len(raw) > 8 * 1024 * 1024
    url = shared_node.base_url + "/chat/completions"
    r = httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and BUNDLED_MODEL_ID in err["message"] and "images" in err["message"]
    corrupt = "data:image/png;base64," + base64.b64encode(IMAGE_A[:100]).decode()
    ask["messages"] = [{"role": "user", "content": [text("What?"), image(corrupt)]}]
    r = httpx.post(url, json=ask, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1]", r.text
    text_only = httpx.post(
        url.replace("/chat/completions", "/completions"), content=b" " * (8 * 1024 * 1024 + 1), timeout=120
    )
    assert text_only.status_code == 413  # only the chat routes take bodies over 8 MiB
