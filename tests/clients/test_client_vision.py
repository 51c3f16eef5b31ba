"""Images in chats through a node that does not host the model, with the real clients (issue 29).

The session's ``vision_mesh`` (tests/conftest.py): ``host`` serves the bundled SmolLM2 with the
synthetic ``mlp`` projector fixture (tests/fixtures/vision_model.py: random weights, so what the
model "says" about a picture means nothing; an image does change the greedy output, and two
images change it differently), ``front`` hosts nothing, joined it, and may fetch image URLs from
loopback (``[api] image_fetch_private = true``); the host keeps the default (refused). Every
request goes to the front, which resolves the image (decodes, checks, fetches URLs), routes the
request to the host that has the ``vision`` capability, and the image travels with it.

Checked: the openai SDK (a data URL, an http URL from a local ``http.server``, the Responses API,
streaming), LangChain's multimodal ``HumanMessage``, the anthropic SDK's base64 ``image`` block;
greedy answers are the same for the same image and differ for another; an image adds its
positions to ``usage``; two images keep their order, and one image twice travels once; bad images
are a 400 naming the part and the node keeps answering; a loopback URL is refused where private
fetching is off; a second turn about the same image reuses the host's prompt cache through the
image, and its bytes are not sent again (the host fills them from its image cache).
"""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator

import anthropic
import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI

from hydra_node.inference.images import MAX_IMAGE_BYTES, MAX_IMAGES
from tests.fixtures.vision_model import IMAGE_A, IMAGE_B, N_IMAGE_TOKENS, bad_images, png_bytes

pytestmark = pytest.mark.live

MODEL = "smollm2-vision"  # the id the session's vision_mesh serves the fixture under (tests/conftest.py)
QUESTION = "Describe the picture in a few words."
MAX_TOKENS = 10
GREEDY = dict(model=MODEL, temperature=0, max_tokens=MAX_TOKENS)
#: Where the image part of :func:`ask_messages` stands (what a 400 must name).
IMAGE_PART = "messages[0].content[1]"


def data_url(image: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(image).decode()}"


def ask_messages(image_url: str | None, question: str = QUESTION) -> list[dict]:
    """One user message: the question, then the image (when given) as an ``image_url`` part."""
    if image_url is None:
        return [{"role": "user", "content": question}]
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": image_url}},
            ],
        }
    ]


@pytest.fixture(scope="module")
def front(vision_mesh):
    return vision_mesh.front


@pytest.fixture(scope="module")
def host(vision_mesh):
    return vision_mesh.host


@pytest.fixture(scope="module")
def client(front) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=front.base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


class ImageServer:
    """A local ``http.server`` on 127.0.0.1 serving ``files`` by path; counts the requests it got."""

    def __init__(self, files: dict[str, tuple[str, bytes]]):
        self.files = files
        self.hits: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits.append(self.path)
                found = server.files.get(self.path)
                if found is None:
                    self.send_error(404)
                    return
                mime, body = found
                self.send_response(200)
                self.send_header("Content-Type", mime)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def images() -> Iterator[ImageServer]:
    server = ImageServer({"/a.png": ("image/png", IMAGE_A), "/b.png": ("image/png", IMAGE_B)})
    yield server
    server.close()


@pytest.fixture(scope="module")
def answer_a(client) -> openai.types.chat.ChatCompletion:
    """The greedy answer about image A (sent as a data URL), the module's reference."""
    return client.chat.completions.create(**GREEDY, messages=ask_messages(data_url(IMAGE_A)))


def text_of(r) -> str:
    return r.choices[0].message.content or ""


def mesh_counters(node) -> dict:
    """A node's ``/api/status`` ``mesh.counters`` (images sent, elided, filled: routing/remote.py)."""
    return node.status()["mesh"]["counters"]


# ---- the openai SDK --------------------------------------------------------------------------


def test_openai_sdk_greedy_answer_depends_on_the_image_and_counts_its_positions(client, answer_a):
    again = client.chat.completions.create(**GREEDY, messages=ask_messages(data_url(IMAGE_A)))
    other = client.chat.completions.create(**GREEDY, messages=ask_messages(data_url(IMAGE_B)))
    plain = client.chat.completions.create(**GREEDY, messages=ask_messages(None))
    assert text_of(answer_a), answer_a
    assert text_of(again) == text_of(answer_a)  # greedy: the same image, the same answer
    assert text_of(other) != text_of(answer_a)  # another image, another answer
    assert text_of(plain) != text_of(answer_a)  # the image was seen, not dropped
    # the image's positions are prompt tokens: the projector fixture gives N_IMAGE_TOKENS per image
    assert answer_a.usage.prompt_tokens == plain.usage.prompt_tokens + N_IMAGE_TOKENS, (answer_a.usage, plain.usage)


def test_openai_sdk_stream_gives_the_same_answer(client, answer_a):
    chunks = list(
        client.chat.completions.create(
            **GREEDY, messages=ask_messages(data_url(IMAGE_A)), stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == text_of(answer_a)
    usage = next(c.usage for c in chunks if c.usage)
    assert usage.prompt_tokens == answer_a.usage.prompt_tokens


def test_an_http_url_is_fetched_by_the_front_and_gives_the_data_urls_answer(client, answer_a, images):
    before = len(images.hits)
    r = client.chat.completions.create(**GREEDY, messages=ask_messages(images.url("/a.png")))
    assert images.hits[before:] == ["/a.png"]  # fetched once, by the front (the host got the bytes)
    assert text_of(r) == text_of(answer_a)  # the same bytes: the same image (same sha256, same answer)
    assert r.usage.prompt_tokens == answer_a.usage.prompt_tokens


def test_an_http_url_that_fails_is_a_400_naming_the_url(client, images):
    url = images.url("/missing.png")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**GREEDY, messages=ask_messages(url))
    err = info.value
    assert err.body.get("param") == IMAGE_PART, err.body
    assert "404" in err.message and "127.0.0.1" in err.message, err.message  # the URL's host and why


def test_a_loopback_url_is_refused_where_private_fetching_is_off(host, images, answer_a):
    """The host's own API keeps ``image_fetch_private`` off (the default): it never connects."""
    direct = openai.OpenAI(base_url=host.base_url, api_key="unused", max_retries=0, timeout=120)
    before = len(images.hits)
    with pytest.raises(openai.BadRequestError) as info:
        direct.chat.completions.create(**GREEDY, messages=ask_messages(images.url("/a.png")))
    err = info.value
    assert err.body.get("param") == IMAGE_PART, err.body
    assert "127.0.0.1" in err.message, err.message
    assert images.hits[before:] == []  # refused before any connection
    # the same image as bytes is served there (the refusal was the URL's address, nothing else), on
    # the host's own runner (the local path: no peer between), with the answer it gave through the front
    ok = direct.chat.completions.create(**GREEDY, messages=ask_messages(data_url(IMAGE_A)))
    assert text_of(ok) == text_of(answer_a)


def test_responses_api_input_image(client, answer_a):
    r = client.responses.create(
        model=MODEL,
        temperature=0,
        max_output_tokens=MAX_TOKENS,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": QUESTION},
                    {"type": "input_image", "image_url": data_url(IMAGE_A), "detail": "auto"},
                ],
            }
        ],
    )
    assert r.status in ("completed", "incomplete") and r.output_text  # incomplete: max_output_tokens reached
    assert r.usage.input_tokens == answer_a.usage.prompt_tokens  # the same prompt, image included


def two_images(first: bytes, second: bytes) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare the two pictures."},
                {"type": "image_url", "image_url": {"url": data_url(first)}},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": data_url(second)}},
            ],
        }
    ]


def test_two_images_in_one_message_keep_their_order_and_one_image_twice_travels_once(client, front):
    ab = client.chat.completions.create(**GREEDY, messages=two_images(IMAGE_A, IMAGE_B))
    ba = client.chat.completions.create(**GREEDY, messages=two_images(IMAGE_B, IMAGE_A))
    assert text_of(ab) != text_of(ba)  # each image stands where its part stood
    assert ab.usage.prompt_tokens == ba.usage.prompt_tokens
    twice = png_bytes(32, 32, 78)  # an image no other test sends
    before = mesh_counters(front)
    r = client.chat.completions.create(**GREEDY, messages=two_images(twice, twice))
    after = mesh_counters(front)
    assert text_of(r) and r.usage.prompt_tokens == ab.usage.prompt_tokens  # both occurrences have their positions
    # its bytes went to the host once, with the first occurrence; the second was elided
    assert after["images_sent"] - before["images_sent"] == 1
    assert after["image_bytes_sent"] - before["image_bytes_sent"] == len(twice)
    assert after["images_elided"] - before["images_elided"] == 1


# ---- LangChain and the anthropic SDK ---------------------------------------------------------


def test_langchain_multimodal_human_message(front, answer_a):
    chat = ChatOpenAI(
        model=MODEL,
        base_url=front.base_url,
        api_key="x",
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        timeout=120,
    )
    msg = chat.invoke(
        [
            HumanMessage(
                content=[
                    {"type": "text", "text": QUESTION},
                    {"type": "image_url", "image_url": {"url": data_url(IMAGE_A)}},
                ]
            )
        ]
    )
    assert msg.content == text_of(answer_a)  # the same request as the SDK's: the same greedy answer
    assert msg.usage_metadata["input_tokens"] == answer_a.usage.prompt_tokens


def test_anthropic_sdk_base64_image_block(front):
    claude = anthropic.Anthropic(base_url=front.base_url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)

    def ask(image: bytes | None):
        content: list[dict] = [{"type": "text", "text": QUESTION}]
        if image is not None:
            b64 = base64.b64encode(image).decode()
            content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}})
        return claude.messages.create(  # (this SDK's create() takes no temperature argument)
            model=MODEL,
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": content}],
            extra_body={"temperature": 0},
        )

    with_a, with_b, plain = ask(IMAGE_A), ask(IMAGE_B), ask(None)
    text = "".join(b.text for b in with_a.content if b.type == "text")
    assert text and with_a.stop_reason in ("max_tokens", "end_turn")
    assert text != "".join(b.text for b in with_b.content if b.type == "text")
    assert with_a.usage.input_tokens == plain.usage.input_tokens + N_IMAGE_TOKENS


def test_anthropic_sdk_bad_image_is_an_anthropic_shaped_400(front):
    claude = anthropic.Anthropic(base_url=front.base_url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)
    b64 = base64.b64encode(bad_images()["truncated_png"]).decode()
    content = [
        {"type": "text", "text": QUESTION},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
    ]
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": content}])
    body = info.value.body
    assert isinstance(body, dict) and body.get("type") == "error", body
    assert body["error"]["type"] == "invalid_request_error" and IMAGE_PART in body["error"]["message"], body


# ---- bad images ------------------------------------------------------------------------------


def _tiff() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, "TIFF")
    return out.getvalue()


def _bad_requests() -> dict[str, tuple[list[dict], str]]:
    """name -> (messages, what the 400 must name)."""
    bad = bad_images()
    many = [{"type": "text", "text": QUESTION}] + [
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(8, 8, i))}} for i in range(MAX_IMAGES + 1)
    ]
    return {
        "not an image": (ask_messages(data_url(bad["not_an_image"])), IMAGE_PART),
        "truncated PNG": (ask_messages(data_url(bad["truncated_png"])), IMAGE_PART),
        "too large": (ask_messages(data_url(IMAGE_A + b"\0" * MAX_IMAGE_BYTES)), IMAGE_PART),
        "bad base64": (ask_messages("data:image/png;base64,@@not*base64@@"), IMAGE_PART),
        "not a base64 data URL": (ask_messages("data:image/png,rawbytes"), IMAGE_PART),
        "declared type differs": (ask_messages(data_url(IMAGE_A, "image/jpeg")), IMAGE_PART),
        "unsupported format": (ask_messages(data_url(_tiff(), "image/tiff")), IMAGE_PART),
        # the first part beyond MAX_IMAGES (the text part is content[0])
        "too many": ([{"role": "user", "content": many}], f"messages[0].content[{MAX_IMAGES + 1}]"),
    }


BAD = _bad_requests()


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_image_is_a_400_naming_the_part_and_the_node_answers_on(client, answer_a, case):
    messages, where = BAD[case]
    with pytest.raises(openai.BadRequestError) as info:  # 400
        client.chat.completions.create(**GREEDY, messages=messages)
    err = info.value
    assert isinstance(err.body, dict) and err.body.get("param") == where, err.body
    assert where in err.message, err.message
    # no crash, no stall: the node answers the next request, image and all
    assert text_of(client.chat.completions.create(**GREEDY, messages=ask_messages(data_url(IMAGE_A)))) == text_of(
        answer_a
    )


# ---- the second turn -------------------------------------------------------------------------


def test_a_second_turn_about_the_same_image_reuses_the_hosts_caches(client, front, host):
    """The host's prompt cache holds the first turn's cells, image positions included, and the front
    does not send the image's bytes again (the host fills them from its image cache by hash)."""
    image = png_bytes(32, 32, 77)  # an image no other test sends
    first_messages = ask_messages(data_url(image), "Look closely at this picture.")
    sent0 = mesh_counters(front)
    first = client.chat.completions.create(**GREEDY, messages=first_messages)
    sent1, filled1 = mesh_counters(front), mesh_counters(host)["image_cache_filled"]
    second = client.chat.completions.create(
        **GREEDY,
        messages=[
            *first_messages,
            {"role": "assistant", "content": text_of(first)},
            {"role": "user", "content": "Say that again in other words."},
        ],
    )
    sent2, filled2 = mesh_counters(front), mesh_counters(host)["image_cache_filled"]
    assert text_of(second)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # the host reused the first turn's cells through the image (its positions and the text after it)
    assert cached >= first.usage.prompt_tokens - 1, (first.usage, second.usage)
    model = next(m for m in host.status()["models"] if m["id"] == MODEL)
    assert model["requests"]["prefix_cache_hit_rate"] > 0, model
    # the first turn carried the image's bytes; the second sent it elided and the host filled it
    assert sent1["images_sent"] - sent0["images_sent"] == 1
    assert sent1["image_bytes_sent"] - sent0["image_bytes_sent"] == len(image)
    assert sent2["images_sent"] == sent1["images_sent"] and sent2["image_bytes_sent"] == sent1["image_bytes_sent"]
    assert sent2["images_elided"] - sent1["images_elided"] == 1
    assert filled2 - filled1 == 1
