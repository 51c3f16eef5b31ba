"""An image file's bytes -> :class:`ImageBlob`, checked with Pillow (blocking, no IO; docs/vision.md).

:func:`decode_image` runs in a worker thread (:func:`hydra_node.api.images.resolve_images`). What a
host's decoder (stb_image in libmtmd) reads is sent as it came: PNG, JPEG (grey or RGB) and GIF
(the host reads its first frame only). Everything else Pillow reads is re-encoded as PNG: WebP, BMP
(stb_image lacks BMP's compressed forms), a JPEG in CMYK or another colour model stb_image
cannot read. ``detail: "low"`` scales the image to fit 512x512 (re-encoded as PNG: the first frame
of a GIF); ``auto`` and ``high`` keep it as it is. Any other format is refused, naming it; so are a
declared type that the bytes contradict, a file that does not decode to its end, and an image over
:data:`MAX_IMAGE_PIXELS` (checked from the header, before any pixel is decoded).
"""

from __future__ import annotations

import io
import warnings

from hydra_node.api.errors import bad
from hydra_node.inference.images import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, ImageBlob, image_sha256

__all__ = ["LOW_DETAIL_SIZE", "decode_image"]

#: ``detail: "low"``: the image is scaled to fit this many pixels square.
LOW_DETAIL_SIZE = 512
#: Pillow format name -> the MIME type a client may declare for it.
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp", "WEBP": "image/webp"}
_ACCEPTED = tuple(_MIME)
#: JPEG colour models stb_image reads (others are re-encoded as PNG).
_JPEG_MODES = ("L", "RGB")
#: Modes PNG can hold as they are (others go through RGB or RGBA first).
_PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16")


def _open(data: bytes, where: str):
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=_ACCEPTED)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_many_pixels(where, None) from None
    except UnidentifiedImageError:
        pass
    except Exception as exc:  # a header Pillow recognised and could not read
        raise bad(f"{where}: the image could not be decoded ({_why(exc)})", where, "invalid_image") from None
    name = _format_name(data)
    raise bad(
        f"{where}: unsupported image format {name}: send PNG, JPEG, GIF, BMP or WebP",
        where,
        "unsupported_image_format",
    )


def _format_name(data: bytes) -> str:
    """The format Pillow would call these bytes (header only, never decoded), or 'unknown'."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return str(im.format or "unknown")
    except Exception:
        return "(not an image file)"


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:120]


def _too_many_pixels(where: str, size: tuple[int, int] | None):
    shown = f" ({size[0]}x{size[1]})" if size else ""
    return bad(
        f"{where}: the image has more than {MAX_IMAGE_PIXELS} pixels{shown}, the most accepted",
        where,
        "image_too_large",
    )


def _png(im) -> bytes:
    if im.mode not in _PNG_MODES:
        im = im.convert("RGBA" if "A" in im.mode or "transparency" in im.info else "RGB")
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def decode_image(data: bytes, where: str, *, declared: str = "", detail: str = "auto") -> ImageBlob:
    """Check ``data`` (module doc) and return the image the host is sent. Raises ApiError (400)."""
    from PIL import Image

    im = _open(data, where)
    with im:
        fmt = "JPEG" if im.format == "MPO" else str(im.format)  # a phone's multi-picture JPEG: its first picture
        if fmt not in _MIME:
            raise bad(
                f"{where}: unsupported image format {fmt}: send PNG, JPEG, GIF, BMP or WebP",
                where,
                "unsupported_image_format",
            )
        mime = _MIME[fmt]
        if declared and declared != mime:
            raise bad(
                f"{where}: the image was declared {declared} but its bytes are {fmt}", where, "image_type_mismatch"
            )
        w, h = im.size
        if w * h > MAX_IMAGE_PIXELS:
            raise _too_many_pixels(where, (w, h))
        if w < 1 or h < 1:
            raise bad(f"{where}: the image has no pixels", where, "invalid_image")
        try:
            im.load()  # the whole file (the first frame of a GIF) must decode
        except Exception as exc:
            raise bad(f"{where}: the image could not be decoded ({_why(exc)})", where, "invalid_image") from None
        small = detail == "low" and (w > LOW_DETAIL_SIZE or h > LOW_DETAIL_SIZE)
        keep = not small and (fmt in ("PNG", "GIF") or (fmt == "JPEG" and im.mode in _JPEG_MODES))
        if keep:
            out, out_mime = data, mime
        else:
            frame = im.copy()
            if small:
                frame.thumbnail((LOW_DETAIL_SIZE, LOW_DETAIL_SIZE), Image.Resampling.LANCZOS)
            out, out_mime = _png(frame), "image/png"
            w, h = frame.size
    if len(out) > MAX_IMAGE_BYTES:  # a BMP or WebP whose PNG is larger than the limit
        raise bad(
            f"{where}: the image is {len(out)} bytes as PNG, more than {MAX_IMAGE_BYTES}", where, "image_too_large"
        )
    return ImageBlob(image_sha256(out), out, out_mime, w, h)
