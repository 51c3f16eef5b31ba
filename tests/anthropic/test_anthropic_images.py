"""Image blocks on /v1/messages (hydra_node/anthropic/request.py; docs/vision.md): base64 and url
sources in user messages and in tool_result content; errors Anthropic-shaped."""

from __future__ import annotations

import base64
import json
from contextlib import asynccontextmanager

import pytest
import trio

from api_serving import serving
from hydra_node.anthropic.request import parse_count_tokens_body, parse_messages_body
from hydra_node.anthropic.routes import MessagesApi
from hydra_node.api.errors import ApiError
from hydra_node.inference import NO_CAPS, Finished, GenerationRequest, ModelCaps, TextDelta
from hydra_node.inference.images import IMAGE_MARK, ImageBlob, ImageInput, image_sha256
from tests.fixtures.vision_model import IMAGE_A, IMAGE_B

A64 = base64.b64encode(IMAGE_A).decode()
B64 = base64.b64encode(IMAGE_B).decode()


def image(data: str = A64, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def url_image(url: str) -> dict:
    return {"type": "image", "source": {"type": "url", "url": url}}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def body(messages: list, **kw) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 8, "messages": messages, **kw}).encode()


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_messages_body(raw)
    assert info.value.status == 400
    return info.value


def test_image_blocks_become_marks_and_images():
    call = parse_messages_body(
        body(
            [
                {"role": "user", "content": [image(), text("What is \ufffc this?")]},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [text("screen: "), image(B64)]},
                        url_image("https://example.com/c.jpg"),
                    ],
                },
            ],
            system="odd \ufffc system",
        )
    )
    assert [m.content for m in call.messages] == [
        "odd \ufffd system",
        f"{IMAGE_MARK}What is \ufffd this?",
        "",
        f"screen: {IMAGE_MARK}",
        IMAGE_MARK,
    ]
    assert call.images == (
        ImageInput("messages[0].content[0]", data=IMAGE_A, media_type="image/png"),
        ImageInput("messages[2].content[0].content[1]", data=IMAGE_B, media_type="image/png"),
        ImageInput("messages[2].content[1]", url="https://example.com/c.jpg"),
    )


def test_count_tokens_takes_images_too():
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": [image()]}]}).encode()
    assert len(parse_count_tokens_body(raw).images) == 1


def test_a_request_without_images_is_never_touched():
    call = parse_messages_body(body([{"role": "user", "content": "keep \ufffc"}], system="and \ufffc"))
    assert [m.content for m in call.messages] == ["and \ufffc", "keep \ufffc"] and call.images == ()


@pytest.mark.parametrize(
    "content, param, words",
    [
        ([image(data="***")], "messages[0].content[0].source.data", "base64"),
        ([image(media_type="image/tiff")], "messages[0].content[0].source.media_type", "unsupported image type"),
        (
            [{"type": "image", "source": {"type": "base64", "data": A64}}],
            "messages[0].content[0].source.media_type",
            "required",
        ),
        ([{"type": "image", "source": {}}], "messages[0].content[0].source.type", "'base64' or 'url'"),
        ([{"type": "image"}], "messages[0].content[0].source", "object"),
        ([{"type": "image", "source": {"type": "file", "file_id": "f"}}], "messages[0].content[0].source.type", "file"),
        ([url_image("data:image/png;base64," + A64)], "messages[0].content[0].source.url", "http(s)"),
        ([url_image("file:///etc/passwd")], "messages[0].content[0].source.url", "http(s)"),
        (
            [{"type": "image", "source": {"type": "url", "url": "https://x/a.png", "x": 1}}],
            "messages[0].content[0].source.x",
            "",
        ),
        ([{"type": "document", "source": {}}], "messages[0].content[0].type", "document"),
    ],
)
def test_bad_image_blocks_are_refused_naming_them(content, param, words):
    err = refused(body([{"role": "user", "content": content}]))
    assert err.param == param and words in err.message


def test_images_are_refused_in_assistant_messages_and_system():
    err = refused(body([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [image()]}]))
    assert err.param == "messages[1].content[0].type" and "only in user messages" in err.message
    err = refused(body([{"role": "user", "content": "hi"}], system=[image()]))
    assert err.param == "system[0].type"


# ---- the route ------------------------------------------------------------------------------


class RecordingRouter:
    def __init__(self) -> None:
        self.seen: list[GenerationRequest] = []

    def models(self):
        return [type("M", (), {"id": "m"})()]

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


async def post(port: int, raw: bytes) -> tuple[int, dict]:
    async with await trio.open_tcp_stream("127.0.0.1", port) as s:
        await s.send_all(
            f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        buf = bytearray()
        while chunk := await s.receive_some(65536):
            buf += chunk
    head, _, payload = bytes(buf).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


class MeshOnly:
    def handles(self, model: str) -> bool:
        return model == "mesh"


async def test_the_route_resolves_images_and_answers_errors_anthropic_shaped():
    router = RecordingRouter()
    async with serving(MessagesApi(router, moa=MeshOnly())) as server:  # type: ignore[arg-type]
        status, got = await post(server.port, body([{"role": "user", "content": [image(), image(B64)]}]))
        assert status == 200 and got["content"][0]["text"] == "Square."
        (req,) = router.seen
        assert all(isinstance(im, ImageBlob) for im in req.images)
        assert [im.sha256 for im in req.images] == [image_sha256(IMAGE_A), image_sha256(IMAGE_B)]
        status, got = await post(server.port, body([{"role": "user", "content": [image(media_type="image/jpeg")]}]))
        assert status == 400 and got["type"] == "error" and got["error"]["type"] == "invalid_request_error"
        assert "declared image/jpeg" in got["error"]["message"]
        status, got = await post(server.port, body([{"role": "user", "content": [url_image("http://127.0.0.1:9/a")]}]))
        assert status == 400 and got["type"] == "error" and "non-public" in got["error"]["message"]
        status, got = await post(server.port, body([{"role": "user", "content": [image()]}], model="mesh"))
        assert status == 400 and got["type"] == "error" and "mesh" in got["error"]["message"]
    assert len(router.seen) == 1
