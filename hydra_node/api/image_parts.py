"""Image parts of a chat body, as the parsers meet them (pure; docs/vision.md).

Each dialect's parser walks its messages with one :class:`ImageParts`: an image part becomes
:data:`IMAGE_MARK` in the message's text (:meth:`ImageParts.image`) and one :class:`ImageInput` in
:attr:`ImageParts.images` (the order of the marks); every piece of client text goes through
:meth:`ImageParts.text`, which turns the text's own U+FFFC into U+FFFD so marks and images pair up.
:func:`with_image_parts` runs a parser so that a request *without* images is never touched (its
U+FFFC stay). :func:`data_url` and :func:`url_image` read the URL forms (``data:<mime>;base64,…``
or http(s)); :func:`base64_image` reads Anthropic's base64 source. Errors are 400s naming the part.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from hydra_node.api.errors import bad
from hydra_node.inference.images import (
    IMAGE_DETAILS,
    IMAGE_MARK,
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    MAX_REQUEST_IMAGE_BYTES,
    ImageInput,
)

__all__ = [
    "ESCAPED_MARK",
    "IMAGE_MEDIA_TYPES",
    "ImageParts",
    "base64_image",
    "data_url",
    "media_type",
    "url_image",
    "with_image_parts",
]

#: What a text part's own U+FFFC becomes in a request that has images (U+FFFD REPLACEMENT CHARACTER).
ESCAPED_MARK = "\ufffd"
#: Media types a client may declare (WebP is converted to PNG on this node; ``image/jpg`` means JPEG).
IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/bmp", "image/webp")
_ALIASES = {"image/jpg": "image/jpeg", "image/x-ms-bmp": "image/bmp", "image/x-bmp": "image/bmp"}
_B64_SPACE = re.compile(r"[ \t\r\n]+")
_T = TypeVar("_T")


def media_type(value: object, where: str, *, required: bool = False) -> str:
    """A declared media type, normalised (``image/jpg`` -> ``image/jpeg``); "" when absent."""
    if value is None or value == "":
        if required:
            raise bad(
                f"'{where}' is required: one of {', '.join(IMAGE_MEDIA_TYPES)}", where, "missing_required_parameter"
            )
        return ""
    if not isinstance(value, str):
        raise bad(f"'{where}' must be a string", where, "invalid_type")
    mime = value.strip().lower()
    mime = _ALIASES.get(mime, mime)
    if mime not in IMAGE_MEDIA_TYPES:
        raise bad(
            f"'{where}': unsupported image type {value!r:.60}: send {', '.join(IMAGE_MEDIA_TYPES)}",
            where,
            "invalid_value",
        )
    return mime


def _decode_base64(text: str, where: str) -> bytes:
    text = _B64_SPACE.sub("", text)
    if not text:
        raise bad(f"{where}: the image data is empty", where, "invalid_value")
    if len(text) // 4 * 3 > MAX_IMAGE_BYTES + 2:  # before decoding: never hold more than the limit
        raise bad(
            f"{where}: the image is more than {MAX_IMAGE_BYTES} bytes (the largest image file accepted)",
            where,
            "image_too_large",
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{where}: the image data is not valid base64", where, "invalid_value") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise bad(
            f"{where}: the image is {len(data)} bytes, more than {MAX_IMAGE_BYTES} (the largest image file accepted)",
            where,
            "image_too_large",
        )
    return data


def data_url(url: str, where: str) -> tuple[bytes, str]:
    """``data:<image type>;base64,<data>`` -> (bytes, declared type)."""
    head, comma, payload = url.partition(",")
    params = head[5:].split(";")
    if not comma or len(params) < 2 or params[-1].strip().lower() != "base64":
        raise bad(
            f"{where}: a data URL must be 'data:<image type>;base64,<data>' (e.g. data:image/png;base64,...)",
            where,
            "invalid_value",
        )
    return _decode_base64(payload, where), media_type(params[0], where, required=True)


def url_image(url: object, where: str, detail: object = None) -> ImageInput:
    """An image given as a URL string: a ``data:`` URL (decoded here) or http(s) (fetched later)."""
    if not isinstance(url, str) or not url:
        raise bad(f"'{where}' must be a data: or http(s) URL string", where, "invalid_type")
    d = _detail(detail, where)
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    if scheme == "data":
        data, mime = data_url(url, where)
        return ImageInput(where, data=data, detail=d, media_type=mime)
    if scheme in ("http", "https"):
        if len(url) > 8192:
            raise bad(f"{where}: the image URL is longer than 8192 characters", where, "invalid_value")
        try:
            parts = urlsplit(url)
            valid = bool(parts.hostname) and (parts.port is None or parts.port > 0)
        except ValueError:
            valid = False
        if not valid:
            raise bad(f"{where}: the image URL {url!r:.120} has no valid host and port", where, "invalid_value")
        return ImageInput(where, url=url, detail=d)
    raise bad(
        f"{where}: an image URL must be a data: URL (data:image/png;base64,...) or http(s)://, not {scheme or url!r:.40}",
        where,
        "invalid_value",
    )


def base64_image(data: object, declared: object, where: str, source: str) -> ImageInput:
    """Anthropic's ``{"type": "base64", "media_type", "data"}`` at ``source`` (the image part ``where``)."""
    if not isinstance(data, str):
        raise bad(f"'{source}.data' must be a base64 string", f"{source}.data", "invalid_type")
    mime = media_type(declared, f"{source}.media_type", required=True)
    return ImageInput(where, data=_decode_base64(data, f"{source}.data"), media_type=mime)


def _detail(detail: object, where: str) -> str:
    if detail is None:
        return "auto"
    if detail not in IMAGE_DETAILS:
        raise bad(
            f"'{where}.detail' must be one of {', '.join(IMAGE_DETAILS)}, not {detail!r:.40}",
            f"{where}.detail",
            "invalid_value",
        )
    return str(detail)


class ImageParts:
    """The images of one request as its parser meets them (module doc)."""

    def __init__(self, escape: bool = True):
        self.escape = escape
        self.escaped = False  # a text had a U+FFFC of its own (turned into U+FFFD)
        self.images: list[ImageInput] = []
        self._bytes = 0

    def text(self, s: str) -> str:
        """Client text, with its own U+FFFC turned into U+FFFD (only while ``escape``)."""
        if self.escape and IMAGE_MARK in s:
            self.escaped = True
            return s.replace(IMAGE_MARK, ESCAPED_MARK)
        return s

    def image(self, image: ImageInput) -> str:
        """Take one image part; returns the mark that stands for it in the message's text."""
        if len(self.images) >= MAX_IMAGES:
            raise bad(f"{image.where}: a request may carry at most {MAX_IMAGES} images", image.where, "too_many_images")
        self._bytes += len(image.data)
        if self._bytes > MAX_REQUEST_IMAGE_BYTES:
            raise bad(
                f"{image.where}: the request's images are more than {MAX_REQUEST_IMAGE_BYTES} bytes in all",
                image.where,
                "image_too_large",
            )
        self.images.append(image)
        return IMAGE_MARK


def with_image_parts(parse: Callable[[ImageParts], _T]) -> tuple[_T, tuple[ImageInput, ...]]:
    """Run ``parse(parts)``; returns its result and the images. A request that has no images but
    whose text holds U+FFFC is parsed again without escaping (a request without images is never
    touched)."""
    parts = ImageParts()
    out = parse(parts)
    if parts.images or not parts.escaped:
        return out, tuple(parts.images)
    return parse(ImageParts(escape=False)), ()
