"""``input_image`` parts on /v1/responses (hydra_node/responses/items.py, request.py; docs/vision.md)."""

from __future__ import annotations

import base64
import json
from contextlib import asynccontextmanager

import pytest
import trio

from api_serving import serving
from hydra_node.api.errors import ApiError
from hydra_node.inference import NO_CAPS, ChatMessage, Finished, GenerationRequest, ModelCaps, TextDelta
from hydra_node.inference.images import IMAGE_MARK, ImageBlob, ImageInput, image_sha256
from hydra_node.responses.request import parse_responses_body
from hydra_node.responses.routes import ResponsesApi
from tests.fixtures.vision_model import IMAGE_A, IMAGE_B

A_URL = "data:image/png;base64," + base64.b64encode(IMAGE_A).decode()
B_URL = "data:image/png;base64," + base64.b64encode(IMAGE_B).decode()


def image(url: str = A_URL, **extra) -> dict:
    return {"type": "input_image", "image_url": url, **extra}


def text(t: str) -> dict:
    return {"type": "input_text", "text": t}


def parse(body: dict, previous=lambda rid: None):
    return parse_responses_body(json.dumps({"model": "m", **body}).encode(), previous)


def refused(body: dict, previous=lambda rid: None) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, previous)
    assert info.value.status == 400
    return info.value


def test_input_images_become_marks_and_images():
    call = parse(
        {
            "instructions": "odd \ufffc rules",
            "input": [
                {"role": "user", "content": [text("What is "), image(detail="low"), text("?")]},
                {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": [text("here: "), image(B_URL)]},
            ],
        }
    )
    assert [m.content for m in call.history] == [f"What is {IMAGE_MARK}?", "", f"here: {IMAGE_MARK}"]
    assert call.instructions == "odd \ufffd rules"  # marks and images pair up in the whole prompt
    assert [(im.where, im.data, im.detail) for im in call.images] == [  # type: ignore[union-attr]
        ("input[0].content[1]", IMAGE_A, "low"),
        ("input[2].output[1]", IMAGE_B, "auto"),
    ]


def test_an_http_url_is_kept_for_the_api_node_to_fetch():
    call = parse({"input": [{"role": "user", "content": [image("https://example.com/a.jpg")]}]})
    assert call.images == (ImageInput("input[0].content[0]", url="https://example.com/a.jpg"),)


def test_a_request_without_images_is_never_touched():
    call = parse({"input": "keep \ufffc this", "instructions": "and \ufffc this"})
    assert call.history[0].content == "keep \ufffc this" and call.instructions == "and \ufffc this"
    assert call.images == ()


@pytest.mark.parametrize(
    "item, param, words",
    [
        ({"role": "user", "content": [image(file_id="file_1")]}, "input[0].content[0].file_id", "file ids"),
        (
            {"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]},
            "input[0].content[0].file_id",
            "send image_url",
        ),
        ({"role": "user", "content": [{"type": "input_image"}]}, "input[0].content[0].image_url", "required"),
        ({"role": "user", "content": [image(detail="max")]}, "input[0].content[0].detail", "detail"),
        ({"role": "user", "content": [image("data:image/png;base64,@@@")]}, "input[0].content[0]", "base64"),
        ({"role": "user", "content": [image("file:///etc/passwd")]}, "input[0].content[0]", "http"),
        (
            {"role": "user", "content": [{"type": "input_file", "file_data": "x"}]},
            "input[0].content[0].type",
            "file parts",
        ),
        ({"role": "assistant", "content": [image()]}, "input[0].content[0].type", "only in user messages"),
        ({"role": "system", "content": [image()]}, "input[0].content[0].type", "only in user messages"),
    ],
)
def test_bad_image_parts_are_refused_naming_them(item, param, words):
    err = refused({"input": [item]})
    assert err.param == param and words in err.message


def test_a_previous_response_with_images_cannot_be_continued():
    history = (ChatMessage("user", f"look {IMAGE_MARK}"), ChatMessage("assistant", "A square."))
    err = refused({"input": "and now?", "previous_response_id": "resp_1"}, lambda rid: history)
    assert err.param == "previous_response_id" and "send the conversation again" in err.message
    plain = (ChatMessage("user", "hi"), ChatMessage("assistant", "Hello."))
    call = parse({"input": [{"role": "user", "content": [image()]}], "previous_response_id": "r"}, lambda rid: plain)
    assert len(call.images) == 1 and call.history[-1].content == IMAGE_MARK


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


async def post(port: int, body: dict) -> tuple[int, dict]:
    raw = json.dumps(body).encode()
    async with await trio.open_tcp_stream("127.0.0.1", port) as s:
        await s.send_all(
            f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
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


async def test_the_route_resolves_images_before_routing():
    router = RecordingRouter()
    async with serving(ResponsesApi(router, moa=MeshOnly())) as server:  # type: ignore[arg-type]
        ask = {"model": "m", "input": [{"role": "user", "content": [text("What?"), image(), image(B_URL)]}]}
        status, body = await post(server.port, ask)
        assert status == 200 and body["output"][0]["content"][0]["text"] == "Square."
        (req,) = router.seen
        assert all(isinstance(im, ImageBlob) for im in req.images)
        assert [im.sha256 for im in req.images] == [image_sha256(IMAGE_A), image_sha256(IMAGE_B)]
        status, body = await post(server.port, {"model": "m", "input": "and?", "previous_response_id": body["id"]})
        assert status == 400 and body["error"]["param"] == "previous_response_id"
        bad = {"model": "m", "input": [{"role": "user", "content": [image("data:image/png;base64,AAAA")]}]}
        status, body = await post(server.port, bad)
        assert status == 400 and body["error"]["param"] == "input[0].content[0]"
        assert body["error"]["code"] == "unsupported_image_format"
        status, body = await post(server.port, {**ask, "model": "mesh"})
        assert status == 400 and body["error"]["param"] == "model" and "mesh" in body["error"]["message"]
    assert len(router.seen) == 1
