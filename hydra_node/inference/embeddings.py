"""What an embedding request asks for and what it returns, and the strict reading of a reply.

:class:`EmbeddingRequest` crosses the runner channel and peer links unchanged (``to_wire`` /
``from_wire``, CBOR types only); so does :class:`EmbeddingResult`. A vector travels as CBOR bytes
of little-endian float32 (4 bytes a dimension: 16 KiB for 4096 floats, a third of the same list
of CBOR floats), L2-normalised by the runner that computed it (unit length, as OpenAI's).

A reply is a sequence of small messages, so that no frame grows with the number of inputs:

  ``{"op": "vectors", "v": [bytes, ...]}``                 some vectors, in input order (each
                                                          message at most MAX_EMBED_FRAME_BYTES)
  ``{"op": "embedded", "prompt_tokens": n, "served_by": s}``  the end: every vector was sent
  ``{"op": "error", "message", "code", "status", "retryable", "retry_after"}``  the end: failed

:class:`EmbeddingAssembler` reads those messages (from a peer, or from our own runner child,
where they also carry the request ``id``) and returns the :class:`EmbeddingResult` or raises a
typed :class:`GenerationError` — a :class:`MalformedRemoteEvent` (502) for anything malformed,
whatever the message holds. Nothing else is ever raised.
"""

from __future__ import annotations

import math
import sys
from array import array
from dataclasses import dataclass
from typing import Any, Iterable

from hydra_node.inference.errors import GenerationError, InvalidRequest, MalformedRemoteEvent
from hydra_node.inference.events import MAX_SERVED_BY_CHARS, MAX_TOKEN_COUNT, remote_error_from_wire
from hydra_node.inference.request import MAX_PROMPT_TOKENS

__all__ = [
    "MAX_EMBEDDING_DIM",
    "MAX_EMBEDDING_INPUTS",
    "MAX_EMBED_FRAME_BYTES",
    "EmbeddingAssembler",
    "EmbeddingRequest",
    "EmbeddingResult",
    "error_message",
    "reply_messages",
    "vector_bytes",
    "vector_floats",
]

#: Most inputs one request may embed (OpenAI's limit).
MAX_EMBEDDING_INPUTS = 2048
#: Largest vector accepted from a runner or a peer (dimensions; 256 KiB as float32).
MAX_EMBEDDING_DIM = 65536
#: Bytes of vectors packed into one ``vectors`` message (a single vector may reach 256 KiB).
VECTORS_PER_MESSAGE_BYTES = 512 * 1024
#: Largest frame of a reply (one ``vectors`` message and its framing).
MAX_EMBED_FRAME_BYTES = 1024 * 1024
#: Longest request id carried.
MAX_REQUEST_ID_CHARS = 128

_WIRE_KEYS = frozenset({"model", "inputs", "request_id"})


def _check_input(i: int, v: Any) -> str | tuple[int, ...]:
    if isinstance(v, str):
        if not v:
            raise InvalidRequest(f"input[{i}] is empty: every input must be a non-empty string", "input")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(
                f"input[{i}] holds text that is not valid Unicode (a lone surrogate?)", "input"
            ) from None
        return v
    if isinstance(v, (list, tuple)):
        if not v:
            raise InvalidRequest(f"input[{i}] is an empty token array", "input")
        if len(v) > MAX_PROMPT_TOKENS or any(type(t) is not int or not 0 <= t < 2**31 for t in v):
            raise InvalidRequest(f"input[{i}]: token ids must be integers from 0 to 2^31-1", "input")
        return tuple(v)
    raise InvalidRequest(f"input[{i}] must be a string or an array of token ids", "input")


@dataclass(frozen=True)
class EmbeddingRequest:
    """Embed each of ``inputs`` (text, tokenised by the host with BOS; or token ids, used as they are)."""

    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    request_id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidRequest("'model' must be a non-empty string", "model")
        if not isinstance(self.request_id, str) or len(self.request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequest(f"'request_id' must be text of at most {MAX_REQUEST_ID_CHARS} characters")
        if not isinstance(self.inputs, (list, tuple)) or not 1 <= len(self.inputs) <= MAX_EMBEDDING_INPUTS:
            raise InvalidRequest(f"'input' must hold 1 to {MAX_EMBEDDING_INPUTS} inputs", "input")
        object.__setattr__(self, "inputs", tuple(_check_input(i, v) for i, v in enumerate(self.inputs)))

    def to_wire(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "inputs": [v if isinstance(v, str) else list(v) for v in self.inputs],
            "request_id": self.request_id,
        }

    @classmethod
    def from_wire(cls, d: Any) -> EmbeddingRequest:
        """Strict: a map of exactly ``model``, ``inputs`` and ``request_id`` (an unknown key is refused,
        never ignored); :class:`InvalidRequest` for anything else."""
        if not isinstance(d, dict):
            raise InvalidRequest("embedding request must be a map")
        if set(d) != _WIRE_KEYS:
            raise InvalidRequest(
                f"embedding request must have exactly the keys {sorted(_WIRE_KEYS)}, not {sorted(map(str, d))!r:.120}"
            )
        if not isinstance(d["inputs"], list):
            raise InvalidRequest("'inputs' must be a list", "input")
        return cls(d["model"], tuple(d["inputs"]), d["request_id"])


def vector_bytes(values: Iterable[float]) -> bytes:
    """``values`` (floats) as little-endian float32 bytes."""
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def vector_floats(data: bytes) -> list[float]:
    """A vector's little-endian float32 bytes as floats."""
    a = array("f")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


@dataclass(frozen=True)
class EmbeddingResult:
    """One vector per input, in input order; ``prompt_tokens`` the tokens embedded; ``served_by``
    the node id of the host whose runner computed them."""

    vectors: tuple[bytes, ...]
    prompt_tokens: int
    served_by: str = ""

    @property
    def dimensions(self) -> int:
        return len(self.vectors[0]) // 4 if self.vectors else 0

    def to_wire(self) -> dict[str, Any]:
        return {"vectors": list(self.vectors), "prompt_tokens": self.prompt_tokens, "served_by": self.served_by}

    @classmethod
    def from_wire(cls, d: Any, *, expected: int) -> EmbeddingResult:
        """Strict reading of :meth:`to_wire`'s map holding ``expected`` vectors; :class:`MalformedRemoteEvent`."""
        if not isinstance(d, dict) or set(d) != {"vectors", "prompt_tokens", "served_by"}:
            raise MalformedRemoteEvent("embedding result must be a map of vectors, prompt_tokens and served_by")
        asm = EmbeddingAssembler(expected)
        asm.feed({"op": "vectors", "v": d["vectors"]})
        result = asm.feed({"op": "embedded", "prompt_tokens": d["prompt_tokens"], "served_by": d["served_by"]})
        assert result is not None
        return result


def reply_messages(result: EmbeddingResult) -> list[dict[str, Any]]:
    """The messages of a successful reply: ``vectors`` messages (bounded) then ``embedded``."""
    out: list[dict[str, Any]] = []
    group: list[bytes] = []
    size = 0
    for v in result.vectors:
        if group and size + len(v) > VECTORS_PER_MESSAGE_BYTES:
            out.append({"op": "vectors", "v": group})
            group, size = [], 0
        group.append(v)
        size += len(v)
    if group:
        out.append({"op": "vectors", "v": group})
    out.append({"op": "embedded", "prompt_tokens": result.prompt_tokens, "served_by": result.served_by})
    return out


def error_message(err: GenerationError) -> dict[str, Any]:
    """The message of a failed reply."""
    return {"op": "error", **err.to_wire()}


class EmbeddingAssembler:
    """The requester's side of a reply (sans-IO): messages in, one :class:`EmbeddingResult` out.

    ``relay_status``: the replies come from our own runner child, whose error keeps its status
    (a 400 ``context_length_exceeded`` stays a 400); a peer's error becomes 502/503.
    ``served_by``: set on the result instead of the message's (our child does not know our id)."""

    def __init__(self, expected: int, *, relay_status: bool = False, served_by: str | None = None) -> None:
        self.expected = expected
        self.relay_status = relay_status
        self.served_by = served_by
        self.vectors: list[bytes] = []
        self.done = False

    def feed(self, msg: Any) -> EmbeddingResult | None:
        """The result once ``embedded`` arrives, None before; raises :class:`GenerationError`."""
        op = msg.get("op") if isinstance(msg, dict) else None
        if self.done:
            raise MalformedRemoteEvent(f"embedding reply: {op!r:.40} after the end")
        if op == "error":
            self.done = True
            raise remote_error_from_wire(msg, relay_status=self.relay_status)
        if op == "vectors":
            self._take(msg.get("v"))
            return None
        if op == "embedded":
            self.done = True
            return self._finish(msg)
        raise MalformedRemoteEvent(f"malformed embedding reply {op!r:.40}")

    def _take(self, vs: Any) -> None:
        if not isinstance(vs, list) or not vs or len(self.vectors) + len(vs) > self.expected:
            raise MalformedRemoteEvent(
                f"embedding reply: 'v' must be a non-empty list of at most {self.expected - len(self.vectors)} vectors"
            )
        size = len(self.vectors[0]) if self.vectors else None
        for v in vs:
            if not isinstance(v, bytes) or not 4 <= len(v) <= 4 * MAX_EMBEDDING_DIM or len(v) % 4:
                raise MalformedRemoteEvent(
                    f"embedding reply: a vector must be 1 to {MAX_EMBEDDING_DIM} "
                    f"float32 as bytes, not {type(v).__name__} of {_len(v)}"
                )
            if size is not None and len(v) != size:
                raise MalformedRemoteEvent(f"embedding reply: vectors of {size // 4} and {len(v) // 4} dimensions")
            size = len(v)
            if not math.isfinite(sum(vector_floats(v))):  # float32 sums cannot overflow a double here
                raise MalformedRemoteEvent("embedding reply: a vector holds NaN or infinity")
            self.vectors.append(v)

    def _finish(self, msg: dict[str, Any]) -> EmbeddingResult:
        n = msg.get("prompt_tokens")
        if type(n) is not int or not 0 <= n <= MAX_TOKEN_COUNT:
            raise MalformedRemoteEvent(f"embedding reply: 'prompt_tokens' must be a token count, not {n!r:.40}")
        by = msg.get("served_by", "")
        if not isinstance(by, str) or len(by) > MAX_SERVED_BY_CHARS:
            raise MalformedRemoteEvent(
                f"embedding reply: 'served_by' must be text of at most {MAX_SERVED_BY_CHARS} characters"
            )
        if len(self.vectors) != self.expected:
            raise MalformedRemoteEvent(
                f"embedding reply ended with {len(self.vectors)} vectors for {self.expected} inputs"
            )
        return EmbeddingResult(tuple(self.vectors), n, by if self.served_by is None else self.served_by)


def _len(v: Any) -> str:
    return f"{len(v)} bytes" if isinstance(v, (bytes, str, list)) else "?"
