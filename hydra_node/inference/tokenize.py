"""``/tokenize`` and ``/detokenize`` (llama-server's routes): what is asked and what comes back.

Only a host of the model has its vocabulary, so a node that does not host it asks one (a peer
op, or its own runner); both objects cross the runner channel and peer links unchanged
(``to_wire``/``from_wire``, CBOR types only, checked strictly on the way in).

* tokenize: ``content`` (text) -> ``tokens``; ``add_special`` adds the model's BOS as its
  tokenizer does, ``parse_special`` reads special-token text (``<|im_start|>``) as those tokens;
  ``with_pieces`` also returns each token's text (``pieces``; a piece that is not whole UTF-8 is
  given as its bytes, as llama-server does);
* detokenize: ``tokens`` -> ``content``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hydra_node.inference.errors import InvalidRequest, MalformedRemoteEvent
from hydra_node.inference.request import MAX_PROMPT_TOKENS

__all__ = ["MAX_TOKENIZE_CHARS", "TokenizeRequest", "TokenizeResult"]

#: Longest text one tokenize request may carry (characters).
MAX_TOKENIZE_CHARS = 4 * 1024 * 1024


@dataclass(frozen=True)
class TokenizeRequest:
    model: str
    op: Literal["tokenize", "detokenize"]
    content: str = ""  # tokenize
    tokens: tuple[int, ...] = ()  # detokenize
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False
    request_id: str = ""

    def __post_init__(self) -> None:
        if self.op not in ("tokenize", "detokenize"):
            raise InvalidRequest(f"unknown tokenizer op {self.op!r:.40}")
        if not isinstance(self.content, str) or len(self.content) > MAX_TOKENIZE_CHARS:
            raise InvalidRequest(f"'content' must be text of at most {MAX_TOKENIZE_CHARS} characters", "content")
        try:
            self.content.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("'content' holds text that is not valid Unicode", "content") from None
        if len(self.tokens) > MAX_PROMPT_TOKENS or any(type(t) is not int or not 0 <= t < 2**31 for t in self.tokens):
            raise InvalidRequest("'tokens' must be token ids from 0 to 2^31-1", "tokens")
        for key in ("add_special", "parse_special", "with_pieces"):
            if type(getattr(self, key)) is not bool:
                raise InvalidRequest(f"'{key}' must be a boolean", key)

    def to_wire(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "op": self.op,
            "content": self.content,
            "tokens": list(self.tokens),
            "add_special": self.add_special,
            "parse_special": self.parse_special,
            "with_pieces": self.with_pieces,
            "request_id": self.request_id,
        }

    @classmethod
    def from_wire(cls, d: Any) -> "TokenizeRequest":
        if not isinstance(d, dict) or not isinstance(d.get("model"), str) or not isinstance(d.get("tokens", []), list):
            raise InvalidRequest("a tokenize request must be a map with a model")
        op = d.get("op")
        if op not in ("tokenize", "detokenize"):
            raise InvalidRequest(f"unknown tokenizer op {op!r:.40}")
        try:
            return cls(
                d["model"],
                op,
                d.get("content", ""),
                tuple(d.get("tokens", ())),
                d.get("add_special", False),
                d.get("parse_special", True),
                d.get("with_pieces", False),
                str(d.get("request_id") or ""),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidRequest):
                raise
            raise InvalidRequest(f"malformed tokenize request: {exc}") from None


@dataclass(frozen=True)
class TokenizeResult:
    tokens: tuple[int, ...] = ()  # tokenize
    pieces: tuple[str | bytes, ...] = ()  # tokenize with_pieces: one per token
    content: str = ""  # detokenize
    served_by: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "pieces": list(self.pieces),
            "content": self.content,
            "served_by": self.served_by,
        }

    @classmethod
    def from_wire(cls, d: Any) -> "TokenizeResult":
        """A host's reply, strictly: anything malformed is a :class:`MalformedRemoteEvent` (502)."""
        if not isinstance(d, dict):
            raise MalformedRemoteEvent("tokenize reply must be a map")
        toks, pieces, content, served = (
            d.get("tokens", []),
            d.get("pieces", []),
            d.get("content", ""),
            d.get("served_by", ""),
        )
        if (
            not isinstance(toks, list)
            or len(toks) > MAX_PROMPT_TOKENS
            or not all(type(t) is int and 0 <= t < 2**31 for t in toks)
            or not isinstance(pieces, list)
            or (pieces and len(pieces) != len(toks))
            or not all(isinstance(p, (str, bytes)) and len(p) <= 256 for p in pieces)
            or not isinstance(content, str)
            or len(content) > MAX_TOKENIZE_CHARS
            or not isinstance(served, str)
            or len(served) > 128
        ):
            raise MalformedRemoteEvent("malformed tokenize reply")
        return cls(tuple(toks), tuple(pieces), content, served)
