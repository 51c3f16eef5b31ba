"""What the runner child does with the model's vocabulary alone: fill-in-the-middle prompts and the
``tokenize`` op (llama-server's ``/tokenize`` and ``/detokenize``).

* FIM: a model whose vocabulary has the prefix, suffix and middle tokens (``llama_vocab_fim_pre``,
  ``_suf``, ``_mid``; llama.cpp finds them in the GGUF's ``tokenizer.ggml.fim_*_token_id`` keys or
  by their usual texts) takes a completion with a ``suffix`` in llama-server's infill layout, PSM
  (``format_prompt_infill``): ``[BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID``; generation then
  writes the middle. :func:`infill_layout` is that layout (pure). A model without the three tokens
  refuses a ``suffix`` with a 400 ``invalid_prompt`` (:func:`fim_tokens` is None).
* ``tokenize``: ``{"op": "tokenize", "id", "req": TokenizeRequest wire}`` is answered
  ``{"op": "tokenized", "id", **TokenizeResult wire}`` or an error frame (400 for a malformed
  request or a token outside the vocabulary, 413 for an answer larger than a channel frame). It
  runs on its own thread (:class:`TokenizerThread`), never the engine's: llama.cpp's vocabulary
  calls only read (llama-server tokenizes on its HTTP threads too), so a long text neither stalls
  generation nor the channel's reader.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra_node.codec.errors import EncodeError
from hydra_node.inference import InvalidRequest, TokenizeRequest, TokenizeResult

__all__ = ["FimTokens", "TokenizerThread", "fim_tokens", "infill_layout", "tokenize_answer"]

#: Tokenize requests queued in the child (the node holds at most TOKENIZE_IN_FLIGHT: runner/tokenize_call.py).
TOKENIZE_QUEUE = 8
#: Longest piece one token's text may be (llama.cpp's pieces are a few bytes; TokenizeResult's bound).
MAX_PIECE_BYTES = 256


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int


def fim_tokens(ll, vocab) -> FimTokens | None:
    """The vocabulary's FIM prefix/suffix/middle tokens; None unless it has all three."""
    pre, suf, mid = (int(f(vocab)) for f in (ll.llama_vocab_fim_pre, ll.llama_vocab_fim_suf, ll.llama_vocab_fim_mid))
    return FimTokens(pre, suf, mid) if min(pre, suf, mid) >= 0 else None


def infill_layout(prefix: Sequence[int], suffix: Sequence[int], fim: FimTokens, bos: Sequence[int] = ()) -> list[int]:
    """llama-server's PSM infill prompt: ``bos FIM_PRE prefix FIM_SUF suffix FIM_MID`` (pure)."""
    return [*bos, fim.pre, *prefix, fim.suf, *suffix, fim.mid]


def _piece(ll, vocab, tok: int) -> str | bytes:
    """One token's text (special tokens as their text); bytes when it is not whole UTF-8 (llama-server
    gives those as a list of bytes)."""
    buf = ctypes.create_string_buffer(MAX_PIECE_BYTES)
    n = int(ll.llama_token_to_piece(vocab, tok, buf, MAX_PIECE_BYTES, 0, True))
    raw = buf.raw[: max(0, n)]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _detokenize(ll, vocab, tokens: Sequence[int]) -> str:
    """``llama_detokenize`` with special tokens as their text (llama-server's ``/detokenize``)."""
    arr = (ll.llama_token * len(tokens))(*tokens)
    size = max(64, 8 * len(tokens))
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = int(ll.llama_detokenize(vocab, arr, len(tokens), buf, size, False, True))
        if n >= 0:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = -n  # the size it needs
    raise RuntimeError("llama_detokenize kept asking for a larger buffer")


def tokenize_answer(
    ll,
    vocab,
    n_vocab: int,
    tokenize: Callable[[bytes, bool, bool], list[int]],
    rid: int,
    wire: Any,
    served_by: str = "",
) -> dict[str, Any]:
    """The reply frame to one ``tokenize`` op (``tokenize(text, add_special, parse_special)``: the
    model's tokenizer); errors are frames too, never raised."""
    try:
        req = TokenizeRequest.from_wire(wire)
        if req.op == "tokenize":
            toks = tokenize(req.content.encode("utf-8"), req.add_special, req.parse_special)
            pieces = tuple(_piece(ll, vocab, t) for t in toks) if req.with_pieces else ()
            result = TokenizeResult(tokens=tuple(toks), pieces=pieces, served_by=served_by)
        else:
            bad = next((t for t in req.tokens if t >= n_vocab), None)
            if bad is not None:
                raise InvalidRequest(f"token {bad} is outside this model's vocabulary (0 to {n_vocab - 1})", "tokens")
            result = TokenizeResult(content=_detokenize(ll, vocab, req.tokens), served_by=served_by)
    except InvalidRequest as exc:
        return {"op": "error", "id": rid, "code": "invalid_request_error", "status": 400, "message": exc.message}
    except Exception as exc:  # our bug or llama.cpp's: this request fails, the runner goes on
        return {
            "op": "error",
            "id": rid,
            "code": "runner_error",
            "status": 500,
            "message": f"{type(exc).__name__}: {exc}",
        }
    return {"op": "tokenized", "id": rid, **result.to_wire()}


class TokenizerThread:
    """Answers ``tokenize`` ops in order on one daemon thread: ``put(msg)`` from the channel reader."""

    def __init__(self, answer: Callable[[int, Any], dict[str, Any]], send: Callable[[dict[str, Any]], None]) -> None:
        self._answer, self._send = answer, send
        self._q: queue.Queue = queue.Queue(TOKENIZE_QUEUE)
        threading.Thread(target=self._run, name="tokenizer", daemon=True).start()

    def put(self, msg: dict[str, Any]) -> bool:
        """Queue ``msg``; False (and a 503 frame sent) when the queue is full."""
        try:
            self._q.put_nowait(msg)
            return True
        except queue.Full:
            self._send(
                {
                    "op": "error",
                    "id": msg["id"],
                    "code": "busy",
                    "status": 503,
                    "message": "the runner's tokenizer is busy",
                }
            )
            return False

    def _run(self) -> None:
        while True:
            msg = self._q.get()
            reply = self._answer(msg["id"], msg.get("req"))
            try:
                self._send(reply)
            except EncodeError:  # more than one channel frame holds
                self._send(
                    {
                        "op": "error",
                        "id": msg["id"],
                        "code": "request_too_large",
                        "status": 413,
                        "message": "the tokenizer's answer is larger than a runner frame (16 MiB): send less text",
                    }
                )
            except OSError:
                return  # the channel is gone: the runner is exiting
