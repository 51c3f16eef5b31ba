"""A runner's vision projector: libmtmd (``llama_cpp.mtmd_cpp``) beside the text model (docs/vision.md).

A runner started with ``--mmproj PATH`` loads the projector after its model (:meth:`Projector.load`)
and hands it to the engine (``BatchEngine.attach_media``). It does two things, both on the engine
thread (libmtmd is not thread-safe; nothing here locks):

* **Tokenize** (:meth:`Projector.tokenize`): the chat's rendered prompt, where every image stands
  as this process's media marker (:attr:`Projector.marker`, ``<__media_RANDOM__>`` as llama-server
  does, so a marker a user types stays text), and the request's images (wire maps with their
  bytes) become ONE token list: text chunks' token ids as they are, each image chunk's positions as
  ``engine.media.placeholder_ids(sha256, n_tokens)``. Each image chunk is kept, by its SHA-256,
  until it is encoded.
* **Rows** (:meth:`Projector.rows`, the engine's ``MediaRows``): the float32 embeddings of
  placeholder positions. An image is encoded the first time one of its rows is asked for
  (``mtmd_encode_chunk``); its embeddings are then kept in an LRU bounded in bytes
  (:data:`EMBEDDING_CACHE_BYTES`), so a multi-turn chat about one image encodes it once even when
  the prefix cache no longer holds it.

Refused at load (RuntimeError naming both files): a projector libmtmd cannot open or whose output
width differs from the model's (libmtmd's own message is quoted), and M-RoPE projectors (Qwen2-VL
family: the engine gives every position one scalar, M-RoPE needs three). An audio-only projector
loads (the runner reports ``audio``, not ``vision``) and refuses images; nothing sends audio yet. Refused per request
(:class:`InvalidPrompt`, 400 ``invalid_prompt``): an image that does not decode ("image 2 of 3
(sha256 …) could not be decoded"), one whose header says more than ``MAX_IMAGE_PIXELS`` (read with
Pillow before libmtmd decodes a pixel), an image without its bytes, a count of images that the rendered
prompt does not place, an image chunk that needs non-causal attention (gemma3-style projectors:
the engine decodes causally), and a prompt that would end with an image.
"""

from __future__ import annotations

import ctypes
import secrets
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from hydra_node.inference.images import MAX_IMAGE_PIXELS
from hydra_node.runtime.child.chat_prompt import InvalidPrompt
from hydra_node.runtime.child.engine.media import is_media, placeholder_ids

__all__ = ["EMBEDDING_CACHE_BYTES", "MAX_PENDING_IMAGES", "Projector", "new_marker"]

#: Bytes of image embeddings kept after encoding (float32 rows), least recently used dropped
#: first. 256 MiB holds about 190 images of a 576-token LLaVA-1.5 projector on a 576-wide model,
#: or ~116k image positions at n_embd 576 (~16k at n_embd 4096).
EMBEDDING_CACHE_BYTES = 256 * 1024 * 1024
#: Tokenized images kept while they wait to be encoded (each holds its preprocessed pixels),
#: oldest dropped first. More than the images of every request a runner holds queued at once
#: (8 per request); a request whose image was dropped before it ran fails with a 500 naming it.
MAX_PENDING_IMAGES = 256

_GGML_LOG_ERROR = 4
_GGML_LOG_CONT = 5
_CHUNK_TEXT = mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT
_CHUNK_IMAGE = mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE


def _check_header(data: bytes, name: str) -> None:
    """Refuse an image file Pillow does not recognise (from its header: no pixel is decoded here)
    or whose header says more than ``MAX_IMAGE_PIXELS``. Checked before libmtmd decodes it: a
    peer's request carries the width and height its API node read, but the bytes are what gets
    decoded, so a decompression bomb is refused here too, whoever sent it."""
    import io
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data), formats=("PNG", "JPEG", "GIF", "BMP")) as im:
                w, h = im.size
    except Image.DecompressionBombError:  # Pillow's own guard: far more than MAX_IMAGE_PIXELS
        w, h = -1, -1
    except Exception:  # unrecognised, truncated header
        raise InvalidPrompt(
            f"{name} could not be decoded (PNG, JPEG, GIF and BMP files are read)", "messages"
        ) from None
    if w < 0 or w * h > MAX_IMAGE_PIXELS:
        size = "" if w < 0 else f" ({w}x{h})"
        raise InvalidPrompt(
            f"{name}{size} has more than {MAX_IMAGE_PIXELS} pixels in all: send a smaller image", "messages"
        )


def new_marker() -> str:
    """A per-process media marker (llama-server's ``"<__media_" + random + "__>"``)."""
    return f"<__media_{secrets.token_hex(8)}__>"


class _Log:
    """libmtmd's log lines: kept while loading (to quote its reason when loading fails) and
    forwarded to stderr when the runner is ``--verbose``. The ctypes callback is kept alive here."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.lines: list[str] | None = None
        self._last_level = 0
        self.callback = llama_cpp.llama_log_callback(self._log)

    def _log(self, level: int, text: bytes | None, user_data: Any) -> None:
        if level != _GGML_LOG_CONT:
            self._last_level = level
        line = (text or b"").decode("utf-8", "replace")
        if self.lines is not None and self._last_level >= _GGML_LOG_ERROR:
            self.lines.append(line.strip())
        if self.verbose:
            sys.stderr.write(line)

    def install(self) -> None:
        mtmd.mtmd_log_set(self.callback, None)
        mtmd.mtmd_helper_log_set(self.callback, None)


@dataclass
class _Image:
    """One image known by hash: its pending chunk (until encoded) and where its placeholders point."""

    n_tokens: int
    placeholders: list[int]
    chunk: Any = None  # an owned mtmd_input_chunk copy, freed once encoded or dropped


class Projector:
    """The loaded projector (the engine's ``MediaRows``); build it with :meth:`load`."""

    def __init__(self, ctx: Any, n_embd: int, marker: str, log: _Log, path: str) -> None:
        self._ctx = ctx
        #: Width of one embedding row (the text model's ``n_embd_inp``).
        self.n_embd = n_embd
        #: What stands for an image in the rendered prompt (per process).
        self.marker = marker
        self.path = path
        self.vision = bool(mtmd.mtmd_support_vision(ctx))
        self.audio = bool(mtmd.mtmd_support_audio(ctx))
        self._log = log
        self._images: dict[str, _Image] = {}
        self._where: dict[int, tuple[str, int]] = {}  # placeholder -> (sha256, row)
        self._pending: OrderedDict[str, None] = OrderedDict()  # images with a chunk, oldest first
        self._embd: OrderedDict[str, np.ndarray] = OrderedDict()  # encoded images, least recent first
        self._embd_bytes = 0
        self.max_cache_bytes = EMBEDDING_CACHE_BYTES
        self.max_pending = MAX_PENDING_IMAGES
        self.encoded = 0  # images encoded so far (tests, stats)

    # ---- loading ------------------------------------------------------------------------
    @classmethod
    def load(
        cls, mmproj: str, model: Any, *, model_path: str, n_threads: int, use_gpu: bool, verbose: bool = False
    ) -> "Projector":
        """Open ``mmproj`` for the loaded text model ``model`` (a ``llama_model_p``)."""
        log = _Log(verbose)
        log.install()
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = max(1, n_threads)
        params.print_timings = False
        params.warmup = True
        marker = new_marker()
        marker_b = marker.encode("ascii")
        params.media_marker = marker_b  # kept alive by marker_b for the call
        n_embd = int(llama_cpp.llama_model_n_embd_inp(model))
        log.lines = []
        try:
            ctx = mtmd.mtmd_init_from_file(mmproj.encode("utf-8"), model, params)
        finally:
            reasons, log.lines = log.lines, None
        if not ctx:
            why = "; ".join(r for r in reasons if r)[-600:] or "see the runner's log (--verbose)"
            raise RuntimeError(
                f"cannot load the projector {mmproj} for the model {model_path} (the model's embedding width "
                f"is {n_embd}; a projector must produce rows of that width): libmtmd says: {why}"
            )
        if mtmd.mtmd_decode_use_mrope(ctx):
            mtmd.mtmd_free(ctx)
            raise RuntimeError(
                f"the projector {mmproj} (for {model_path}) uses M-RoPE positions (the Qwen2-VL family), which "
                "this runner's engine cannot decode yet: use a projector with plain positions (LLaVA-style, ...)"
            )
        return cls(ctx, n_embd, marker, log, mmproj)

    def close(self) -> None:
        for sha in list(self._images):
            self._forget(sha)
        self._embd.clear()
        self._embd_bytes = 0
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None

    # ---- tokenizing ---------------------------------------------------------------------
    def tokenize(
        self, text: str, images: Sequence[dict], *, add_special: bool, parse_special: bool = True
    ) -> list[int]:
        """``text`` (the rendered prompt, :attr:`marker` where each image stands) with ``images``
        (the request's wire maps, in marker order) as one token list (placeholders for images)."""
        n = len(images)
        if n and not self.vision:
            raise InvalidPrompt(
                f"the projector {self.path} reads no images (it has an audio encoder only): serve the model with "
                "a vision projector",
                "messages",
            )
        placed = text.count(self.marker)
        if placed != n:
            raise InvalidPrompt(
                f"the chat template placed {placed} of the request's {n} images in the prompt (it dropped or "
                "repeated a message holding one): send the images in messages the template renders",
                "messages",
            )
        bitmaps: list[Any] = []
        chunks = mtmd.mtmd_input_chunks_init()
        if not chunks:
            raise MemoryError("libmtmd could not allocate an input chunk list")
        try:
            for i, im in enumerate(images):
                bitmaps.append(self._bitmap(im, i, n))
            raw = text.encode("utf-8")
            inp = mtmd.mtmd_input_text(raw, len(raw), add_special, parse_special)
            arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, n))(*bitmaps)
            rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(inp), arr, n)
            if rc != 0:
                raise InvalidPrompt(
                    f"the request's images could not be prepared for the model (libmtmd error {rc})", "messages"
                )
            return self._tokens(chunks, images)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bm in bitmaps:
                mtmd.mtmd_bitmap_free(bm)

    def _bitmap(self, im: dict, i: int, n: int) -> Any:
        sha = str(im.get("sha256", ""))
        data = im.get("data") or b""
        name = f"image {i + 1} of {n} (sha256 {sha[:16]}…)"
        if not isinstance(data, bytes) or not data:
            raise InvalidPrompt(f"{name} came without its bytes", "messages")
        _check_header(data, name)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bm = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        if not bm:
            raise InvalidPrompt(f"{name} could not be decoded (PNG, JPEG, GIF and BMP files are read)", "messages")
        if mtmd.mtmd_bitmap_is_audio(bm):
            mtmd.mtmd_bitmap_free(bm)
            raise InvalidPrompt(f"{name} is an audio file, not an image", "messages")
        got = (mtmd.mtmd_bitmap_get_id(bm) or b"").decode("ascii", "replace")
        if got != sha:
            mtmd.mtmd_bitmap_free(bm)
            raise InvalidPrompt(f"{name}: its bytes do not match its sha256", "messages")
        return bm

    def _tokens(self, chunks: Any, images: Sequence[dict]) -> list[int]:
        out: list[int] = []
        seen: list[tuple[str, Any, int]] = []
        last_type = _CHUNK_TEXT
        for c in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, c)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            n_tok = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            if kind == _CHUNK_TEXT:
                size = ctypes.c_size_t(0)
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(size))
                out.extend(ptr[i] for i in range(size.value))
                if size.value:
                    last_type = kind
                continue
            k = len(seen)
            label = f"image {k + 1} of {len(images)}"
            if kind != _CHUNK_IMAGE:
                raise InvalidPrompt(f"{label} is not an image", "messages")
            if mtmd.mtmd_decode_use_non_causal(self._ctx, chunk):
                raise InvalidPrompt(
                    f"{label}: this model's projector needs non-causal attention over an image (gemma3-style), "
                    "which this runner's engine does not decode yet",
                    "messages",
                )
            sha = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode("ascii", "replace")
            if int(mtmd.mtmd_input_chunk_get_n_pos(chunk)) != n_tok:
                raise InvalidPrompt(f"{label}: its positions differ from its token count (M-RoPE)", "messages")
            seen.append((sha, chunk, n_tok))
            out.extend(placeholder_ids(sha, n_tok))
            last_type = kind
        if last_type != _CHUNK_TEXT or not out or is_media(out[-1]):
            raise InvalidPrompt(
                "the prompt ends with an image: the model needs text after the last image to answer", "messages"
            )
        for sha, chunk, n_tok in seen:  # only once the whole prompt is good
            self._register(sha, chunk, n_tok)
        return out

    def _register(self, sha: str, chunk: Any, n_tokens: int) -> None:
        known = self._images.get(sha)
        if known is not None and known.n_tokens != n_tokens:  # cannot happen for one projector; be safe
            self._forget(sha)
            known = None
        if known is None:
            known = _Image(n_tokens, placeholder_ids(sha, n_tokens))
            self._images[sha] = known
            for row, ph in enumerate(known.placeholders):
                self._where[ph] = (sha, row)
        if sha in self._embd:
            self._embd.move_to_end(sha)
            return
        if known.chunk is None:
            copy = mtmd.mtmd_input_chunk_copy(chunk)
            if not copy:
                raise MemoryError("libmtmd could not copy an image chunk")
            known.chunk = copy
        self._pending[sha] = None
        self._pending.move_to_end(sha)
        while len(self._pending) > self.max_pending:
            old, _ = self._pending.popitem(last=False)
            self._drop_chunk(old)

    # ---- rows (the engine's MediaRows) --------------------------------------------------
    def rows(self, placeholders: Sequence[int]) -> bytes:
        """The float32 embeddings of these placeholder positions, row by row (``KeyError`` for a
        placeholder no tokenized image holds)."""
        parts: list[np.ndarray] = []
        i = 0
        while i < len(placeholders):
            ph = placeholders[i]
            where = self._where.get(ph)
            if where is None:
                raise KeyError(f"placeholder {ph} belongs to no image this runner tokenized")
            sha, row = where
            j = i + 1
            while j < len(placeholders) and self._where.get(placeholders[j]) == (sha, row + (j - i)):
                j += 1
            parts.append(self._embeddings(sha)[row : row + (j - i)])
            i = j
        if not parts:
            return b""
        return b"".join(p.tobytes() for p in parts)

    def _embeddings(self, sha: str) -> np.ndarray:
        got = self._embd.get(sha)
        if got is not None:
            self._embd.move_to_end(sha)
            return got
        known = self._images[sha]
        if known.chunk is None:
            raise KeyError(
                f"image {sha[:16]}…: its embeddings left the cache and its chunk was dropped before it was encoded "
                f"(more than {self.max_pending} images waited at once)"
            )
        rc = mtmd.mtmd_encode_chunk(self._ctx, known.chunk)
        if rc != 0:
            raise RuntimeError(f"libmtmd could not encode image {sha[:16]}… (error {rc})")
        ptr = mtmd.mtmd_get_output_embd(self._ctx)
        if not ptr:
            raise RuntimeError(f"libmtmd gave no embeddings for image {sha[:16]}…")
        arr = np.ctypeslib.as_array(ptr, shape=(known.n_tokens * self.n_embd,)).copy()
        arr = arr.reshape(known.n_tokens, self.n_embd)
        if not np.isfinite(arr).all():
            raise RuntimeError(f"the projector produced non-finite embeddings for image {sha[:16]}…")
        self.encoded += 1
        self._embd[sha] = arr
        self._embd_bytes += arr.nbytes
        self._drop_chunk(sha)  # the embeddings stand for it now
        while self._embd_bytes > self.max_cache_bytes and len(self._embd) > 1:
            old, old_arr = self._embd.popitem(last=False)
            self._embd_bytes -= old_arr.nbytes
            self._maybe_forget(old)
        return arr

    # ---- bookkeeping --------------------------------------------------------------------
    def _drop_chunk(self, sha: str) -> None:
        self._pending.pop(sha, None)
        known = self._images.get(sha)
        if known is not None and known.chunk is not None:
            mtmd.mtmd_input_chunk_free(known.chunk)
            known.chunk = None
        if sha not in self._embd:
            self._maybe_forget(sha)

    def _maybe_forget(self, sha: str) -> None:
        known = self._images.get(sha)
        if known is not None and known.chunk is None and sha not in self._embd:
            self._forget(sha)

    def _forget(self, sha: str) -> None:
        known = self._images.pop(sha, None)
        self._pending.pop(sha, None)
        if known is None:
            return
        if known.chunk is not None:
            mtmd.mtmd_input_chunk_free(known.chunk)
            known.chunk = None
        for ph in known.placeholders:
            if self._where.get(ph, ("", 0))[0] == sha:
                del self._where[ph]

    def stats(self) -> dict[str, int]:
        """What the projector holds (tests; the runner's figures)."""
        return {
            "images_pending": len(self._pending),
            "images_cached": len(self._embd),
            "cache_bytes": self._embd_bytes,
            "encoded": self.encoded,
        }
