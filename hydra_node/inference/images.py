"""Images in a chat request (docs/vision.md): what the API node hands the host (pure).

An image part of a message (OpenAI ``image_url``, Responses ``input_image``, Anthropic ``image``)
becomes :data:`IMAGE_MARK` in the message's ``content`` at the place of the part, and one entry of
:attr:`GenerationRequest.images <hydra_node.inference.request.GenerationRequest.images>`: the
request's images in the order of their marks (message by message, left to right). A text part of
a request that has images keeps no :data:`IMAGE_MARK` of its own (the parsers replace one with
U+FFFD), so marks and images always pair up; a request without images is never touched.

* :class:`ImageInput`: what a parser found, before the API node resolved it (a ``data:`` URL's or a
  base64 block's bytes, or an http(s) URL to fetch); never on the wire.
* :class:`ImageBlob`: a resolved image: its file's bytes (PNG, JPEG, GIF or BMP: what the host's
  decoder reads; other formats are converted by the API node), their SHA-256 (the image's identity:
  caches on the host and the prefix cache key by it), the MIME type and size in pixels. On the wire
  (``images`` of a generate request, protocol/README.md) the bytes may be left out (``data`` absent)
  when the sender knows the host holds that hash; a host that does not hold it answers
  ``images_missing`` and the sender sends the request again with the bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from hydra_node.inference.errors import InvalidRequest

__all__ = [
    "IMAGE_MARK",
    "IMAGE_MIME_TYPES",
    "IMAGE_DETAILS",
    "MAX_IMAGES",
    "MAX_IMAGE_BYTES",
    "MAX_REQUEST_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "ImageInput",
    "ImageBlob",
    "image_sha256",
]

#: Where an image stands in a message's content (U+FFFC OBJECT REPLACEMENT CHARACTER).
IMAGE_MARK = "\ufffc"
#: The formats a host decodes (stb_image in libmtmd); the API node converts others (WebP) to PNG.
IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/gif", "image/bmp")
#: OpenAI's ``detail``: "low" = the API node scales the image to fit 512x512 first; "high"/"auto" = as sent.
IMAGE_DETAILS = ("auto", "low", "high")
#: Most images one request may carry.
MAX_IMAGES = 8
#: Largest image file (bytes, after base64 decoding or download).
MAX_IMAGE_BYTES = 8 * 1024 * 1024
#: Most image bytes one request may carry in all (a generate request's body and the runner
#: channel's 16 MiB frame must hold them with the rest of the request).
MAX_REQUEST_IMAGE_BYTES = 12 * 1024 * 1024
#: Most pixels (width x height) an image may have (a decompression bomb is refused, not decoded).
MAX_IMAGE_PIXELS = 40_000_000

_HEX = frozenset("0123456789abcdef")


def image_sha256(data: bytes) -> str:
    """The image's identity: the SHA-256 of its file's bytes, lowercase hex (as libmtmd's bitmap id)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ImageInput:
    """An image part as a parser found it (API side only; :func:`hydra_node.api.images.resolve_images`
    turns it into an :class:`ImageBlob`). ``where`` names the part for errors
    (``messages[0].content[1]``); exactly one of ``data`` (decoded bytes) and ``url`` (http or https)."""

    where: str
    data: bytes = b""
    url: str = ""
    detail: str = "auto"
    media_type: str = ""  # what the client declared ("" = not declared): checked against the bytes

    def __post_init__(self) -> None:
        if bool(self.data) == bool(self.url):
            raise InvalidRequest(f"{self.where}: an image is its bytes or a URL", self.where)
        if self.detail not in IMAGE_DETAILS:
            raise InvalidRequest(
                f"{self.where}: 'detail' must be one of {', '.join(IMAGE_DETAILS)}, not {self.detail!r:.40}", self.where
            )
        if len(self.data) > MAX_IMAGE_BYTES:
            raise InvalidRequest(
                f"{self.where}: the image is {len(self.data)} bytes, more than {MAX_IMAGE_BYTES}", self.where
            )


@dataclass(frozen=True)
class ImageBlob:
    """A resolved image. ``data`` may be empty only on the wire between peers (left out: the
    receiving host fills it from its cache by ``sha256`` or answers ``images_missing``)."""

    sha256: str
    data: bytes
    mime: str
    width: int
    height: int

    def __post_init__(self) -> None:
        if len(self.sha256) != 64 or not set(self.sha256) <= _HEX:
            raise InvalidRequest("an image's 'sha256' must be 64 lowercase hex digits", "images")
        if self.mime not in IMAGE_MIME_TYPES:
            raise InvalidRequest(f"an image's type must be one of {', '.join(IMAGE_MIME_TYPES)}", "images")
        for v in (self.width, self.height):
            if type(v) is not int or not 1 <= v <= MAX_IMAGE_PIXELS:
                raise InvalidRequest("an image's width and height must be positive pixel counts", "images")
        if self.width * self.height > MAX_IMAGE_PIXELS:
            raise InvalidRequest(f"an image may have at most {MAX_IMAGE_PIXELS} pixels", "images")
        if len(self.data) > MAX_IMAGE_BYTES:
            raise InvalidRequest(f"an image may be at most {MAX_IMAGE_BYTES} bytes", "images")
        if self.data and image_sha256(self.data) != self.sha256:
            raise InvalidRequest("an image's bytes do not match its 'sha256'", "images")

    @property
    def elided(self) -> bool:
        """True when the bytes were left out (the host must hold them)."""
        return not self.data

    def without_data(self) -> "ImageBlob":
        return ImageBlob(self.sha256, b"", self.mime, self.width, self.height)

    def with_data(self, data: bytes) -> "ImageBlob":
        """This image with its bytes (checked against ``sha256``)."""
        return ImageBlob(self.sha256, data, self.mime, self.width, self.height)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"sha256": self.sha256, "mime": self.mime, "width": self.width, "height": self.height}
        if self.data:
            d["data"] = self.data
        return d

    @classmethod
    def from_wire(cls, d: Any) -> "ImageBlob":
        if not isinstance(d, dict):
            raise InvalidRequest("an image must be a map", "images")
        sha, mime, data = d.get("sha256"), d.get("mime"), d.get("data", b"")
        w, h = d.get("width"), d.get("height")
        if not isinstance(sha, str) or not isinstance(mime, str) or not isinstance(data, bytes):
            raise InvalidRequest("an image is {sha256: text, mime: text, width, height, data?: bytes}", "images")
        if type(w) is not int or type(h) is not int:
            raise InvalidRequest("an image's width and height must be integers", "images")
        return cls(sha, data, mime, w, h)
