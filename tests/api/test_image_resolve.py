"""Images resolved on the API node (hydra_node/api/images.py, image_decode.py; docs/vision.md):
decoded and checked with Pillow, converted where the host's decoder needs it, and http(s) URLs
fetched from a real local HTTP server under the SSRF, size, redirect and time rules."""

from __future__ import annotations

import http.server
import io
import os
import threading

import pytest
import trio
from PIL import Image

from hydra_node.api.errors import ApiError
from hydra_node.api.image_decode import LOW_DETAIL_SIZE, decode_image
from hydra_node.api.images import (
    TEXT_BODY_BYTES,
    ImagePolicy,
    check_body_size,
    fetch_image,
    is_public_address,
    resolve_images,
)
from hydra_node.inference import ChatMessage, GenerationRequest
from hydra_node.inference.images import (
    IMAGE_MARK,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_REQUEST_IMAGE_BYTES,
    ImageBlob,
    ImageInput,
    image_sha256,
)
from tests.fixtures.vision_model import IMAGE_A, IMAGE_B, bad_images, huge_png_header


def pillow_bytes(fmt: str, size=(40, 30), mode="RGB", **save) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, (200, 10, 30) if mode == "RGB" else 0).save(out, format=fmt, **save)
    return out.getvalue()


def _big_png() -> bytes:
    out = io.BytesIO()  # random pixels, stored without compression: about 7.2 MB
    Image.frombytes("RGB", (1500, 1600), os.urandom(1500 * 1600 * 3)).save(out, format="PNG", compress_level=0)
    return out.getvalue()


BIG_PNG = _big_png()


def refused(fn, *args, **kw) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args, **kw)
    assert info.value.status == 400
    return info.value


# ---- decoding -------------------------------------------------------------------------------


def test_png_jpeg_and_gif_are_sent_as_they_came():
    for data, mime in (
        (IMAGE_A, "image/png"),
        (pillow_bytes("JPEG"), "image/jpeg"),
        (pillow_bytes("GIF", mode="P"), "image/gif"),
    ):
        blob = decode_image(data, "messages[0].content[0]")
        assert (blob.data, blob.mime, blob.sha256) == (data, mime, image_sha256(data))
    assert (decode_image(IMAGE_A, "x").width, decode_image(IMAGE_A, "x").height) == (32, 32)


def test_a_multi_picture_jpeg_is_a_jpeg():
    out = io.BytesIO()  # what phones write: Pillow calls it MPO, and its first picture is a plain JPEG
    Image.new("RGB", (20, 10), (1, 2, 3)).save(out, "MPO", save_all=True, append_images=[Image.new("RGB", (20, 10))])
    blob = decode_image(out.getvalue(), "p", declared="image/jpeg")
    assert (blob.mime, blob.width, blob.data) == ("image/jpeg", 20, out.getvalue())


def test_webp_bmp_and_cmyk_jpeg_become_png():
    for data in (pillow_bytes("WEBP"), pillow_bytes("BMP"), pillow_bytes("JPEG", mode="CMYK")):
        blob = decode_image(data, "p")
        assert blob.mime == "image/png" and blob.data != data and (blob.width, blob.height) == (40, 30)
        with Image.open(io.BytesIO(blob.data)) as im:
            assert im.format == "PNG" and im.size == (40, 30)


def test_detail_low_scales_to_fit_512_and_auto_keeps_the_image():
    big = pillow_bytes("PNG", size=(1200, 600))
    low = decode_image(big, "p", detail="low")
    assert (low.width, low.height) == (LOW_DETAIL_SIZE, LOW_DETAIL_SIZE // 2) and low.mime == "image/png"
    assert decode_image(big, "p", detail="auto").data == big
    assert decode_image(big, "p", detail="high").data == big
    assert decode_image(IMAGE_A, "p", detail="low").data == IMAGE_A  # already small: untouched


def test_other_formats_are_refused_naming_the_format():
    err = refused(decode_image, pillow_bytes("TIFF"), "messages[1].content[2]")
    assert err.param == "messages[1].content[2]" and err.code == "unsupported_image_format"
    assert "unsupported image format TIFF" in err.message and "WebP" in err.message
    err = refused(decode_image, bad_images()["not_an_image"], "p")
    assert err.code == "unsupported_image_format"


def test_a_truncated_or_corrupt_file_could_not_be_decoded():
    for name in ("truncated_png", "png_signature_only"):
        err = refused(decode_image, bad_images()[name], "messages[0].content[1]")
        assert err.param == "messages[0].content[1]"
        assert err.code in ("invalid_image", "unsupported_image_format"), name
    err = refused(decode_image, bad_images()["truncated_png"], "p")
    assert "could not be decoded" in err.message


def test_a_declared_type_the_bytes_contradict_is_refused():
    err = refused(decode_image, IMAGE_A, "p", declared="image/jpeg")
    assert err.code == "image_type_mismatch" and "image/jpeg" in err.message and "PNG" in err.message
    assert decode_image(IMAGE_A, "p", declared="image/png").mime == "image/png"
    assert decode_image(pillow_bytes("WEBP"), "p", declared="image/webp").mime == "image/png"


def test_too_many_pixels_is_refused_from_the_header():
    for w, h in ((7000, 7000), (20_000, 20_000)):  # over our limit; and over Pillow's own bomb guard
        assert w * h > MAX_IMAGE_PIXELS
        err = refused(decode_image, huge_png_header(w, h), "messages[0].content[0]")
        assert err.code == "image_too_large" and str(MAX_IMAGE_PIXELS) in err.message


# ---- addresses and body size ----------------------------------------------------------------


@pytest.mark.parametrize(
    "ip, public",
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # shared (CGNAT)
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1%eth0", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:8.8.8.8", True),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("64:ff9b::a00:1", False),  # NAT64 of 10.0.0.1
        ("not an ip", False),
    ],
)
def test_public_addresses(ip, public):
    assert is_public_address(ip) is public


def test_the_text_of_a_body_stays_within_8_mib_besides_its_images():
    image = ImageInput("p", data=b"x" * 3_000_000)
    check_body_size(TEXT_BODY_BYTES + 4_000_000, [image])  # the base64 of the image is 4 MB
    with pytest.raises(ApiError) as info:
        check_body_size(TEXT_BODY_BYTES + 4_000_001, [image])
    assert info.value.status == 413 and info.value.code == "request_too_large"
    with pytest.raises(ApiError):
        check_body_size(TEXT_BODY_BYTES + 1, [])


# ---- fetching from a real local server ------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    release = threading.Event()

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, length: bool = True) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/a.png":
            self._send(200, IMAGE_A, {"Content-Type": "image/png"})
        elif self.path == "/big.png":
            self._send(200, BIG_PNG)
        elif self.path == "/redirect":
            self._send(302, headers={"Location": "/hop"})
        elif self.path == "/hop":
            self._send(307, headers={"Location": f"http://127.0.0.1:{self.server.server_address[1]}/a.png"})
        elif self.path == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif self.path == "/to-file":
            self._send(302, headers={"Location": "file:///etc/passwd"})
        elif self.path == "/declared-huge":
            self._send(200, headers={"Content-Length": str(MAX_IMAGE_BYTES + 1)}, length=False)
        elif self.path == "/endless":  # no length: an endless body, until the client hangs up
            self.send_response(200)
            self.end_headers()
            block = b"\x00" * 65536
            try:
                while True:
                    self.wfile.write(block)
            except OSError:
                return
        elif self.path == "/slow":
            self.release.wait(30)
        else:
            self._send(404, b"no")


@pytest.fixture
def image_server():
    http.server.HTTPServer.allow_reuse_address = True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    _Handler.release.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Handler.release.set()
    server.shutdown()
    server.server_close()


def fetch(url: str, **kw) -> bytes:
    return fetch_image(url, "messages[0].content[0]", allow_private=kw.pop("allow_private", True), **kw)


def fetch_refused(url: str, **kw) -> ApiError:
    err = refused(fetch, url, **kw)
    assert err.param == "messages[0].content[0]"
    return err


def test_a_url_is_fetched_and_redirects_are_followed(image_server):
    assert fetch(f"{image_server}/a.png") == IMAGE_A
    assert fetch(f"{image_server}/redirect") == IMAGE_A  # 302 then 307, absolute and relative


def test_loopback_is_refused_unless_image_fetch_private(image_server):
    err = fetch_refused(f"{image_server}/a.png", allow_private=False)
    assert err.code == "image_url_refused" and "'127.0.0.1'" in err.message
    assert "image_fetch_private" in err.message
    err = fetch_refused("http://localhost:9/a.png", allow_private=False)  # a name, resolved and checked
    assert err.code == "image_url_refused" and "localhost" in err.message


def test_a_redirect_to_another_scheme_is_refused(image_server):
    err = fetch_refused(f"{image_server}/to-file")
    assert err.code == "image_fetch_failed" and "file:" in err.message and "only http" in err.message


def test_a_redirect_loop_ends(image_server):
    assert "redirects" in fetch_refused(f"{image_server}/loop").message


def test_an_oversize_download_is_stopped(image_server):
    err = fetch_refused(f"{image_server}/endless")  # stopped while streaming, not by the deadline
    assert err.code == "image_too_large" and str(MAX_IMAGE_BYTES) in err.message
    err = fetch_refused(f"{image_server}/declared-huge")  # refused from Content-Length
    assert err.code == "image_too_large"


def test_status_errors_and_timeouts_name_the_host_and_why(image_server):
    err = fetch_refused(f"{image_server}/missing.png")
    assert err.code == "image_fetch_failed" and "HTTP 404" in err.message and "127.0.0.1" in err.message
    err = fetch_refused(f"{image_server}/slow", timeout_s=0.3)
    assert "took longer than 0.3 s" in err.message and "image_fetch_timeout_s" in err.message
    err = fetch_refused("http://127.0.0.1:1/a.png")  # nothing listens on port 1
    assert err.code == "image_fetch_failed"


def test_credentials_in_a_url_are_refused():
    assert "credentials" in fetch_refused("http://user:pw@127.0.0.1:9/a.png").message


# ---- resolve_images -------------------------------------------------------------------------


def chat(images, n_marks: int | None = None) -> GenerationRequest:
    marks = IMAGE_MARK * (len(images) if n_marks is None else n_marks)
    return GenerationRequest(
        model="m", kind="chat", messages=(ChatMessage("user", "look " + marks),), images=tuple(images)
    )


async def test_resolve_images_fetches_decodes_and_keeps_the_order(image_server):
    webp = pillow_bytes("WEBP")
    req = chat(
        [
            ImageInput("messages[0].content[0]", url=f"{image_server}/a.png"),
            ImageInput("messages[0].content[1]", data=IMAGE_B, media_type="image/png"),
            ImageInput("messages[0].content[2]", data=webp, media_type="image/webp"),
        ]
    )
    out = await resolve_images(req, ImagePolicy(fetch_private=True))
    assert out.images_resolved and all(isinstance(b, ImageBlob) for b in out.images)
    assert [b.data for b in out.images[:2]] == [IMAGE_A, IMAGE_B]  # type: ignore[union-attr]
    assert out.images[2].mime == "image/png"  # type: ignore[union-attr]
    assert out.to_wire()["images"][0]["sha256"] == image_sha256(IMAGE_A)
    assert await resolve_images(out, ImagePolicy()) is out  # nothing left to resolve


async def test_resolve_images_names_the_first_failing_part(image_server):
    req = chat(
        [
            ImageInput("messages[0].content[0]", data=IMAGE_A),
            ImageInput("messages[0].content[1]", url=f"{image_server}/a.png"),
            ImageInput("messages[0].content[2]", data=bad_images()["truncated_png"]),
        ]
    )
    with pytest.raises(ApiError) as info:
        await resolve_images(req, ImagePolicy())  # loopback refused (the default policy)
    assert info.value.param == "messages[0].content[1]" and info.value.code == "image_url_refused"
    with pytest.raises(ApiError) as info:
        await resolve_images(req, ImagePolicy(fetch_private=True))
    assert info.value.param == "messages[0].content[2]" and info.value.code == "invalid_image"


async def test_resolve_images_checks_the_request_total(image_server):
    """Two fetched images of 7 MiB each: each is under MAX_IMAGE_BYTES, together over the request's limit."""
    assert len(BIG_PNG) < MAX_IMAGE_BYTES < 2 * len(BIG_PNG) and 2 * len(BIG_PNG) > MAX_REQUEST_IMAGE_BYTES
    req = chat([ImageInput(f"messages[0].content[{i}]", url=f"{image_server}/big.png") for i in range(2)])
    with pytest.raises(ApiError) as info:
        await resolve_images(req, ImagePolicy(fetch_private=True))
    assert info.value.param == "messages[0].content[1]" and str(MAX_REQUEST_IMAGE_BYTES) in info.value.message
    one = await resolve_images(chat(req.images[:1]), ImagePolicy(fetch_private=True))
    assert one.images[0].data == BIG_PNG  # type: ignore[union-attr]


# ---- the inference port's body limits -------------------------------------------------------


async def test_only_the_image_routes_take_bodies_over_8_mib():
    from hydra_node.api.port import InferencePort
    from hydra_node.http.limits import INFERENCE_BODY_BYTES, HttpLimits
    from hydra_node.http.server import HttpServer, Response

    async def echo_size(request):
        return Response.json(200, {"bytes": len(request.body)})

    port = InferencePort([("/v1/embeddings", echo_size), ("/v1", echo_size)])
    server = HttpServer(port.handle, "127.0.0.1", 0, "test", limits=HttpLimits(max_body_bytes=INFERENCE_BODY_BYTES))

    async def post(path: str, size: int) -> int:
        async with await trio.open_tcp_stream("127.0.0.1", server.port) as s:
            head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {size}\r\n\r\n"
            await s.send_all(head.encode())
            try:
                await s.send_all(b" " * size)
            except trio.BrokenResourceError:
                pass  # refused before the body was read
            buf = bytearray()
            while b"\r\n" not in buf and (chunk := await s.receive_some(65536)):  # the status line is enough
                buf += chunk
        return int(bytes(buf).split()[1])

    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        big = TEXT_BODY_BYTES + 1024
        assert await post("/v1/chat/completions", big) == 200
        assert await post("/v1/messages", big) == 200
        assert await post("/v1/embeddings", big) == 413
        assert await post("/v1/completions", big) == 413
        assert await post("/v1/chat/completions", INFERENCE_BODY_BYTES + 1) == 413
        nursery.cancel_scope.cancel()


def test_the_api_section_sets_the_fetch_policy():
    from hydra_node.config import ConfigError, parse_config_text

    api = parse_config_text("[api]\nimage_fetch_private = true\nimage_fetch_timeout_s = 3\n").api
    assert (api.image_fetch_private, api.image_fetch_timeout_s) == (True, 3.0)  # node.py builds the ImagePolicy
    default = parse_config_text("").api
    assert (default.image_fetch_private, default.image_fetch_timeout_s) == (False, 10.0)
    for bad_value in ("image_fetch_timeout_s = 0", "image_fetch_timeout_s = 121", "image_fetch_private = 1"):
        with pytest.raises(ConfigError, match=bad_value.split()[0]):
            parse_config_text(f"[api]\n{bad_value}\n")
