"""Images inside the token stream of the batching engine (pure; docs/vision.md).

A prompt with images is one token list, as a text prompt is: each image chunk (libmtmd's
``mtmd_tokenize``) takes ``n_tokens`` positions, and those positions hold *placeholder ids*:
negative numbers derived from the image's SHA-256 and the position inside the image
(:func:`placeholder_ids`). Real token ids are never negative, so:

* the slot scheduler, the prefix cache and the prompt cache's tiers compare prompts as they always
  did: two prompts share a prefix through an image exactly when they hold the same image (same
  hash) at the same place, so a multi-turn chat about one image does not evaluate it again;
* ``usage.prompt_tokens`` counts the image's positions (as llama-server does);
* the engine sees where an image is (:func:`is_media`) and, instead of putting those rows into the
  token batch, asks the runner's :class:`MediaRows` for their embeddings and decodes them in an
  embeddings batch (a ``llama_batch`` with ``embd``) in the same step. A prefill chunk never mixes
  text and image positions (the scheduler cuts it at the boundary), so a sequence's positions are
  always decoded in order.

Ids are 31-bit (they fit the int32 arrays of llama.cpp and the prompt store): each one is a
hash of (image hash, position), so two different images share no placeholder by more than a
2^-31 chance per position.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, Sequence

__all__ = ["MediaRows", "is_media", "placeholder_ids", "media_runs"]


def is_media(tok: int) -> bool:
    """True for a placeholder (an image position), False for a real token id."""
    return tok < 0


def placeholder_ids(sha256: str, n_tokens: int) -> list[int]:
    """The ``n_tokens`` placeholder ids of the image whose SHA-256 (hex) is ``sha256``: each in
    -2^31 .. -1, a function of (``sha256``, position) only."""
    out = []
    for i in range(n_tokens):
        h = hashlib.blake2b(f"{sha256}:{i}".encode("ascii"), digest_size=4).digest()
        out.append(-1 - (int.from_bytes(h, "little") & 0x7FFFFFFE))
    return out


def media_runs(tokens: Sequence[int]) -> list[tuple[int, int, bool]]:
    """``tokens`` as maximal runs ``(start, end, is_media)`` (end exclusive), in order."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or is_media(tokens[i]) != is_media(tokens[start]):
            runs.append((start, i, is_media(tokens[start])))
            start = i
    return runs


class MediaRows(Protocol):
    """The runner's image embeddings, as the engine asks for them (runtime/child/vision.py)."""

    #: Width of one embedding row (the text model's ``n_embd_inp``).
    n_embd: int

    def rows(self, placeholders: Sequence[int]) -> bytes:
        """The embeddings of these placeholder positions (consecutive positions of one or more
        images registered by the runner's tokenizer), float32, ``len(placeholders) * n_embd``
        values, row by row. Encodes an image the first time one of its rows is asked for and keeps
        its embeddings cached by hash. Raises ``KeyError`` for a placeholder nobody registered."""
        ...
