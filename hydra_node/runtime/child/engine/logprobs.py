"""Per-token log-probabilities for requests that ask for ``logprobs`` (runs inside the runner child).

What is reported is the MODEL's distribution at that position: a log-softmax over the raw
logits of the row the token was sampled from (``llama_get_logits_ith``), before the
sampler chain's logit bias, penalties, grammar, top-k/top-p and temperature.  So a token a
grammar or a ``logit_bias`` of +100 forced can carry a low log-probability, and the
alternatives may include tokens the chain would never have allowed (OpenAI reports the model's
distribution too).  Computed only for requests that ask (one numpy pass over the vocabulary
per sampled token); nothing runs for the others.

Wire (the ``logprobs`` of a runner ``delta`` frame, one entry per generated token)::

    [token_text, logprob, token_bytes, [[alt_text, alt_logprob, alt_bytes], ...]]

the same shape as :class:`hydra_node.inference.TokenLogprob`; alternatives are sorted by
log-probability, most likely first (ties: lower token id first), ``top_logprobs`` of them.
Token text is the token's bytes (``llama_token_to_piece``, special tokens rendered) decoded
as UTF-8 with replacement characters where a token holds part of a character.
"""

from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np

__all__ = ["MAX_PIECE_BYTES", "log_softmax", "top_alternatives", "TokenPieces", "LogprobReporter", "row_logits"]

#: Longest token bytes / text reported (the wire's bound, ``MAX_TOKEN_CHARS``).
MAX_PIECE_BYTES = 256


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities of ``logits`` (float64, stable: shifted by the maximum)."""
    x = logits.astype(np.float64, copy=True)
    x -= x.max()
    x -= np.log(np.exp(x).sum())
    return x


def top_alternatives(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens as ``(token, logprob)``, most likely first, ties by token id."""
    if n <= 0:
        return []
    n = min(n, logprobs.shape[0])
    cand = np.argpartition(-logprobs, n - 1)[:n]
    order = sorted(cand.tolist(), key=lambda t: (-logprobs[t], t))
    return [(t, clamp(float(logprobs[t]))) for t in order]


#: The floor of a reported logprob: a token the model masks (a logit of -inf) reports this, as
#: OpenAI does, so the value stays a finite JSON number.
MIN_LOGPROB = -9999.0


def clamp(v: float) -> float:
    """A log-probability within [MIN_LOGPROB, 0] (rounding can put a near-certain token above 0)."""
    return max(MIN_LOGPROB, min(0.0, v))


class TokenPieces:
    """Token id -> (text, bytes) through ``llama_token_to_piece`` (special tokens rendered), cached."""

    def __init__(self, vocab) -> None:
        import llama_cpp

        self._ll, self._vocab = llama_cpp, vocab
        self._buf = ctypes.create_string_buffer(MAX_PIECE_BYTES)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, tok: int) -> tuple[str, bytes]:
        hit = self._cache.get(tok)
        if hit is None:
            n = int(self._ll.llama_token_to_piece(self._vocab, tok, self._buf, MAX_PIECE_BYTES, 0, True))
            raw = self._buf.raw[:n] if n > 0 else b""  # negative: longer than the bound; reported empty
            hit = self._cache[tok] = (raw.decode("utf-8", errors="replace")[:MAX_PIECE_BYTES], raw)
        return hit


class LogprobReporter:
    """Builds one wire entry per sampled token from a row of logits (see the module docstring)."""

    def __init__(self, top_n: int, pieces: Callable[[int], tuple[str, bytes]]) -> None:
        self.top_n = top_n
        self.pieces = pieces

    def entry(self, logits: np.ndarray, token: int) -> list:
        lp = log_softmax(logits)
        text, raw = self.pieces(token)
        top = []
        for t, v in top_alternatives(lp, self.top_n):
            alt_text, alt_raw = self.pieces(t)
            top.append([alt_text, v, alt_raw])
        return [text, clamp(float(lp[token])), raw, top]


def row_logits(ctx, row: int, n_vocab: int) -> np.ndarray:
    """A numpy view of batch row ``row``'s logits of the last decode (no copy: read it before the next)."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row), shape=(n_vocab,))
