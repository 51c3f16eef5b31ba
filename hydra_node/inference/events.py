"""Generation events (deltas, the finished record) and their strict wire decoding."""

from __future__ import annotations

import builtins
import re
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncContextManager, AsyncIterator, Protocol

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.inference.errors import UNAVAILABLE_STATUSES, GenerationError, MalformedRemoteEvent, RemoteError
from hydra_node.inference.request import GenerationRequest

#: Largest frame of a remote generate stream: one event (a delta is a few tokens of text).
MAX_EVENT_FRAME_BYTES = 1024 * 1024
#: Characters of a remote error's message kept (the rest is cut).
MAX_REMOTE_MESSAGE_CHARS = 1000
#: Longest ``finish_reason`` and ``served_by`` accepted from a peer.
MAX_FINISH_REASON_CHARS = 32
MAX_SERVED_BY_CHARS = 128
#: Largest token count in a finished event, and largest duration (ms) or retry-after (s).
MAX_TOKEN_COUNT = 2**31 - 1
MAX_EVENT_MILLIS = 1e12
MAX_RETRY_AFTER_S = 3600.0

_CODE = re.compile(r"[a-z0-9_]{1,40}")
#: Most token entries one delta may carry, and alternatives per token (OpenAI allows 20).
MAX_DELTA_LOGPROBS = 4096
MAX_TOP_LOGPROBS = 20
#: Longest token text / bytes in a logprob entry.
MAX_TOKEN_CHARS = 256

__all__ = [
    "MAX_EVENT_FRAME_BYTES",
    "MAX_REMOTE_MESSAGE_CHARS",
    "MAX_FINISH_REASON_CHARS",
    "MAX_SERVED_BY_CHARS",
    "MAX_TOKEN_COUNT",
    "MAX_EVENT_MILLIS",
    "MAX_RETRY_AFTER_S",
    "MAX_TOP_LOGPROBS",
    "TokenLogprob",
    "TextDelta",
    "Finished",
    "GenerationEvent",
    "remote_error_from_wire",
    "event_from_wire",
    "event_frame",
    "EventStreamDecoder",
    "InferenceTarget",
]


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability (natural log, from the model's raw distribution)
    and, when asked (``top_logprobs``), the most likely alternatives at that position.

    Wire: ``[token, logprob, bytes, [[token, logprob, bytes], ...]]``."""

    token: str
    logprob: float
    bytes: bytes
    top: tuple[tuple[str, float, builtins.bytes], ...] = ()  # (``bytes`` here is the field above)

    def to_wire(self) -> list[Any]:
        return [self.token, self.logprob, self.bytes, [list(t) for t in self.top]]

    @classmethod
    def from_wire(cls, v: Any) -> "TokenLogprob":
        if not (isinstance(v, list) and len(v) == 4 and isinstance(v[3], list) and len(v[3]) <= MAX_TOP_LOGPROBS):
            raise MalformedRemoteEvent("delta event: a logprobs entry must be [token, logprob, bytes, top]")
        return cls(*_logprob_triple(v[:3]), tuple(_logprob_triple(t) for t in v[3]))


def _logprob_triple(v: Any) -> tuple[str, float, bytes]:
    if not (
        isinstance(v, list)
        and len(v) == 3
        and isinstance(v[0], str)
        and len(v[0]) <= MAX_TOKEN_CHARS
        and type(v[1]) in (int, float)
        and v[1] <= 0.0
        and isinstance(v[2], bytes)
        and len(v[2]) <= MAX_TOKEN_CHARS
    ):
        raise MalformedRemoteEvent(f"delta event: malformed logprob entry {v!r:.60}")
    return v[0], float(v[1]), v[2]


@dataclass(frozen=True)
class TextDelta:
    """Generated text; ``logprobs`` holds one entry per token behind it when the request asked
    for logprobs (entries may run ahead of or behind the text by a few tokens, where text is
    held back for a stop sequence or an incomplete UTF-8 character)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    #: The token ids generated since the previous delta, in order: their text is this delta's
    #: text plus whatever is still held back. What a continuation resumes from
    #: (:attr:`GenerationRequest.resume_tokens`); empty from a host that does not send them.
    tokens: tuple[int, ...] = ()
    #: Reasoning text generated since the previous delta (a reasoning model's thoughts, split from
    #: the answer by the host: docs/reasoning.md); ``text`` is only ever the answer.
    reasoning: str = ""
    type: str = field(default="delta", init=False)

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": "delta", "text": self.text}
        if self.logprobs:
            d["logprobs"] = [e.to_wire() for e in self.logprobs]
        if self.tokens:
            d["tokens"] = list(self.tokens)
        if self.reasoning:
            d["reasoning"] = self.reasoning
        return d


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    queue_wait_ms: float = 0.0
    ttft_ms: float = 0.0
    itl_ms: float = 0.0  # mean inter-token latency
    served_by: str = ""  # node id of the host that generated
    cached_tokens: int = 0  # prompt tokens reused from the runner's prefix cache
    reasoning_tokens: int = 0  # of completion_tokens, those inside the reasoning (think) block
    type: str = field(default="finished", init=False)

    def to_wire(self) -> dict[str, Any]:
        d = asdict(self)
        d["type"] = "finished"
        if not self.reasoning_tokens:  # sent only by a reasoning model: other frames stay as they were
            del d["reasoning_tokens"]
        return d


GenerationEvent = TextDelta | Finished


def _text(d: dict[str, Any], key: str, limit: int, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or len(v) > limit:
        raise MalformedRemoteEvent(
            f"{d.get('type', 'event')!s:.20} event: {key!r} must be text of at most {limit} characters, not {v!r:.40}"
        )
    return v


def _count(d: dict[str, Any], key: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if type(v) is not int or not 0 <= v <= MAX_TOKEN_COUNT:
        raise MalformedRemoteEvent(f"finished event: {key!r} must be a token count, not {v!r:.40}")
    return v


def _millis(d: dict[str, Any], key: str) -> float:
    v = d.get(key, 0.0)
    if type(v) not in (int, float) or not 0.0 <= v <= MAX_EVENT_MILLIS:
        raise MalformedRemoteEvent(f"finished event: {key!r} must be a duration in ms, not {v!r:.40}")
    return float(v)


def remote_error_from_wire(d: Any, *, relay_status: bool = False) -> GenerationError:
    """The error a remote reports (``{"message", "code", "status", "retryable", "retry_after"}``).

    A peer's (``relay_status=False``) becomes a :class:`RemoteError` with status 503 when the
    peer is busy or unavailable (it said 429 or 503), else 502. Our own child's
    (``relay_status=True``) keeps its 4xx/5xx status. A status that is not an error (below
    400, or not a status at all) is a :class:`MalformedRemoteEvent`: 502. Returned, not raised."""
    if not isinstance(d, dict):
        return MalformedRemoteEvent("remote error is not a map")
    message = d.get("message")
    message = message[:MAX_REMOTE_MESSAGE_CHARS] if isinstance(message, str) and message else "remote error"
    code = d.get("code")
    code = code if isinstance(code, str) and _CODE.fullmatch(code) else "remote_error"
    status = d.get("status")
    if type(status) is not int or not 100 <= status <= 599:
        return MalformedRemoteEvent(f"remote error with an invalid status {status!r:.20}: {message}", code="bad_status")
    if status < 400:
        return MalformedRemoteEvent(
            f"remote error claiming status {status}: {message}", code="bad_status", remote_status=status
        )
    retryable = d.get("retryable") is True
    retry_after: object = d.get("retry_after")
    if not (type(retry_after) is int or type(retry_after) is float) or not 0.0 <= retry_after <= MAX_RETRY_AFTER_S:
        retry_after = None
    if relay_status:
        return GenerationError(
            message,
            code=code,
            status=status,
            retryable=retryable,
            retry_after=None if retry_after is None else float(retry_after),
        )
    return RemoteError(
        message,
        code=code,
        status=503 if status in UNAVAILABLE_STATUSES else 502,
        retryable=retryable,
        retry_after=None if retry_after is None else float(retry_after),
        remote_status=status,
    )


def event_from_wire(d: Any) -> GenerationEvent:
    """A peer's event as a typed event; its error event, or anything malformed, raised as a
    :class:`RemoteError` (502/503). Nothing else is ever raised, whatever `d` holds."""
    t = d.get("type") if isinstance(d, dict) else None
    if t == "delta":
        lps = d.get("logprobs", [])
        if not isinstance(lps, list) or len(lps) > MAX_DELTA_LOGPROBS:
            raise MalformedRemoteEvent("delta event: 'logprobs' must be a list of token entries")
        toks = d.get("tokens", [])
        if (
            not isinstance(toks, list)
            or len(toks) > MAX_DELTA_LOGPROBS
            or not all(type(t) is int and 0 <= t < 2**31 for t in toks)
        ):
            raise MalformedRemoteEvent("delta event: 'tokens' must be a list of token ids")
        return TextDelta(
            _text(d, "text", MAX_EVENT_FRAME_BYTES),
            tuple(TokenLogprob.from_wire(e) for e in lps),
            tuple(toks),
            _text(d, "reasoning", MAX_EVENT_FRAME_BYTES, ""),
        )
    if t == "finished":
        reason = _text(d, "finish_reason", MAX_FINISH_REASON_CHARS)
        if not reason:
            raise MalformedRemoteEvent("finished event: empty finish_reason")
        return Finished(
            reason,
            _count(d, "prompt_tokens"),
            _count(d, "completion_tokens"),
            _millis(d, "queue_wait_ms"),
            _millis(d, "ttft_ms"),
            _millis(d, "itl_ms"),
            _text(d, "served_by", MAX_SERVED_BY_CHARS, ""),
            _count(d, "cached_tokens", 0),
            _count(d, "reasoning_tokens", 0),
        )
    if t == "error":
        raise remote_error_from_wire(d)
    raise MalformedRemoteEvent(f"malformed generation event {t!r:.40}")


def event_frame(event: GenerationEvent | GenerationError) -> bytes:
    """The frame a host sends on a generate stream for `event` (an error ends the stream)."""
    ev = {"type": "error", **event.to_wire()} if isinstance(event, GenerationError) else event.to_wire()
    return encode_message({"op": "event", "ev": ev}, limit=MAX_EVENT_FRAME_BYTES)


class EventStreamDecoder:
    """The requester's side of a generate stream (sans-IO): bytes in, typed events out.

    :meth:`next_event` returns the next event, None until more bytes arrive, or raises a
    :class:`RemoteError` — for a bad frame, a malformed event or the host's error event."""

    def __init__(self) -> None:
        self._frames = MessageDecoder(MAX_EVENT_FRAME_BYTES)

    def receive_data(self, data: bytes) -> None:
        self._frames.receive_data(data)

    def next_event(self) -> GenerationEvent | None:
        try:
            msg = self._frames.next_message()
        except DecodeError as exc:
            raise MalformedRemoteEvent(f"bad frame ({exc.code}): {exc}", code="bad_frame") from None
        if msg is None:
            return None
        if msg["op"] != "event":
            raise MalformedRemoteEvent(f"unexpected {msg['op']!r:.40} on a generate stream")
        return event_from_wire(msg.get("ev"))


class InferenceTarget(Protocol):
    """Something that can run a generation: a local runner or a remote peer.

    ``generate`` is an async context manager so that leaving it (client gone,
    cancellation) always cancels the generation where it runs.
    """

    def generate(self, req: GenerationRequest) -> AsyncContextManager[AsyncIterator[GenerationEvent]]: ...
