"""The contract between the API, the router, local runners and remote peers.

A generation is described by a :class:`GenerationRequest` and produces a stream of
events: zero or more :class:`TextDelta` then exactly one :class:`Finished`, or a
:class:`GenerationError` raised part-way.  Everything here is plain data with a
``to_wire()``/``from_wire()`` pair made of CBOR-friendly types (dict, list, str,
int, float, bool, None), so the same objects cross the runner channel and the
peer links unchanged.

Bytes from a peer or a child are decoded strictly (:mod:`hydra_node.codec`) and turned
into typed events here: :func:`event_from_wire` returns a :class:`TextDelta` or a
:class:`Finished`, or raises a :class:`RemoteError` — never another exception. A remote
failure is never relayed as success: it becomes 502 (the peer failed, or broke the
protocol: :class:`MalformedRemoteEvent`) or 503 (the peer is busy or unavailable), with
the peer's message and code.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Literal, Protocol, AsyncContextManager

from hydra_node.codec.errors import DecodeError
from hydra_node.codec.framing import MessageDecoder, encode_message

Kind = Literal["chat", "completion"]

#: Upper bound on generated tokens a single request may ask for.
MAX_TOKENS_LIMIT = 32768
#: Upper bound on stop sequences (OpenAI allows 4).
MAX_STOP_SEQUENCES = 4
#: Characters of a session id kept for routing affinity (``X-Session-Id`` header or body ``user``).
MAX_SESSION_CHARS = 256
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
#: Remote statuses that mean "the peer cannot serve this now" (relayed as 503); any other
#: remote failure is relayed as 502.
UNAVAILABLE_STATUSES = frozenset({429, 503})

_CODE = re.compile(r"[a-z0-9_]{1,40}")


class GenerationError(Exception):
    """A generation failed.  ``code`` is stable and machine-readable.

    ``status`` is the HTTP status the API should answer with when nothing has been
    streamed yet; ``retryable`` tells the router it may try another target (only
    sensible before the first byte reached the client).
    """

    def __init__(self, message: str, *, code: str = "generation_failed", status: int = 500,
                 retryable: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after

    def to_wire(self) -> dict:
        return {"message": self.message, "code": self.code, "status": self.status,
                "retryable": self.retryable, "retry_after": self.retry_after}


class QueueFull(GenerationError):
    def __init__(self, model: str, retry_after: float = 1.0):
        super().__init__(f"model {model!r} is busy: its request queue is full", code="queue_full",
                         status=429, retryable=True, retry_after=retry_after)


class ModelUnavailable(GenerationError):
    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message, code="model_unavailable", status=503, retryable=retryable, retry_after=2.0)


class RemoteError(GenerationError):
    """A generation failed on the other side of a stream (a peer, or a child's channel).

    ``status`` is ours to answer with: 502 or 503, never a success; ``remote_status`` is
    what the remote claimed (None when it sent something malformed)."""

    def __init__(self, message: str, *, code: str, status: int, retryable: bool = False,
                 retry_after: float | None = None, remote_status: int | None = None):
        super().__init__(message, code=code, status=status, retryable=retryable, retry_after=retry_after)
        self.remote_status = remote_status


class MalformedRemoteEvent(RemoteError):
    """The remote sent bytes or an event that break the protocol (its fault): 502."""

    def __init__(self, message: str, *, code: str = "bad_event", remote_status: int | None = None):
        super().__init__(message, code=code, status=502, remote_status=remote_status)


class InvalidRequest(ValueError):
    """A request field is malformed; ``param`` names it (OpenAI's ``error.param``)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    kind: Kind
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs, for kind == "chat"
    prompt: str = ""  # for kind == "completion"
    max_tokens: int | None = None
    temperature: float = 0.8
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    seed: int | None = None
    request_id: str = ""
    session: str = ""  # routing affinity key (X-Session-Id, or the body's user/session_id); may be empty

    def __post_init__(self) -> None:
        if len(self.session) > MAX_SESSION_CHARS:
            object.__setattr__(self, "session", self.session[:MAX_SESSION_CHARS])
        if isinstance(self.seed, int) and not -(2**63) <= self.seed < 2**64:
            # keep the wire inside the CBOR data model; runners use the low 32 bits anyway
            object.__setattr__(self, "seed", self.seed & (2**64 - 1))
        if self.kind not in ("chat", "completion"):
            raise InvalidRequest(f"unknown request kind {self.kind!r}")
        if self.kind == "chat" and not self.messages:
            raise InvalidRequest("'messages' must be a non-empty array", "messages")
        if self.max_tokens is not None and not (1 <= self.max_tokens <= MAX_TOKENS_LIMIT):
            raise InvalidRequest(f"'max_tokens' must be between 1 and {MAX_TOKENS_LIMIT}", "max_tokens")
        if not (0.0 <= self.temperature <= 2.0) or math.isnan(self.temperature):
            raise InvalidRequest("'temperature' must be between 0 and 2", "temperature")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequest("'top_p' must be greater than 0 and at most 1", "top_p")
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"'stop' allows at most {MAX_STOP_SEQUENCES} sequences", "stop")

    def to_wire(self) -> dict:
        d = asdict(self)
        d["messages"] = [list(m) for m in self.messages]
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_wire(cls, d: dict) -> "GenerationRequest":
        if not isinstance(d, dict):
            raise InvalidRequest("generation request must be a map")
        for key in ("max_tokens", "seed"):
            v = d.get(key)
            if v is not None and (type(v) is not int or not -(2**63) <= v < 2**64):
                raise InvalidRequest(f"'{key}' must be an integer or null", key)
        try:
            return cls(
                model=str(d["model"]), kind=d["kind"],
                messages=tuple((str(r), str(c)) for r, c in d.get("messages") or ()),
                prompt=str(d.get("prompt") or ""), max_tokens=d.get("max_tokens"),
                temperature=float(d.get("temperature", 0.8)), top_p=float(d.get("top_p", 0.95)),
                stop=tuple(str(s) for s in d.get("stop") or ()), seed=d.get("seed"),
                request_id=str(d.get("request_id") or ""), session=str(d.get("session") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidRequest):
                raise
            raise InvalidRequest(f"malformed generation request: {exc}") from None


@dataclass(frozen=True)
class TextDelta:
    text: str
    type: str = field(default="delta", init=False)

    def to_wire(self) -> dict:
        return {"type": "delta", "text": self.text}


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
    type: str = field(default="finished", init=False)

    def to_wire(self) -> dict:
        d = asdict(self)
        d["type"] = "finished"
        return d


GenerationEvent = TextDelta | Finished


def _text(d: dict, key: str, limit: int, default: str | None = None) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or len(v) > limit:
        raise MalformedRemoteEvent(f"{d.get('type', 'event')!s:.20} event: {key!r} must be text of at most "
                                  f"{limit} characters, not {v!r:.40}")
    return v


def _count(d: dict, key: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if type(v) is not int or not 0 <= v <= MAX_TOKEN_COUNT:
        raise MalformedRemoteEvent(f"finished event: {key!r} must be a token count, not {v!r:.40}")
    return v


def _millis(d: dict, key: str) -> float:
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
        return MalformedRemoteEvent(f"remote error claiming status {status}: {message}", code="bad_status",
                                   remote_status=status)
    retryable = d.get("retryable") is True
    retry_after = d.get("retry_after")
    if type(retry_after) not in (int, float) or not 0.0 <= retry_after <= MAX_RETRY_AFTER_S:
        retry_after = None
    if relay_status:
        return GenerationError(message, code=code, status=status, retryable=retryable,
                               retry_after=None if retry_after is None else float(retry_after))
    return RemoteError(message, code=code, status=503 if status in UNAVAILABLE_STATUSES else 502,
                       retryable=retryable, retry_after=None if retry_after is None else float(retry_after),
                       remote_status=status)


def event_from_wire(d: Any) -> GenerationEvent:
    """A peer's event as a typed event; its error event, or anything malformed, raised as a
    :class:`RemoteError` (502/503). Nothing else is ever raised, whatever `d` holds."""
    t = d.get("type") if isinstance(d, dict) else None
    if t == "delta":
        return TextDelta(_text(d, "text", MAX_EVENT_FRAME_BYTES))
    if t == "finished":
        reason = _text(d, "finish_reason", MAX_FINISH_REASON_CHARS)
        if not reason:
            raise MalformedRemoteEvent("finished event: empty finish_reason")
        return Finished(reason, _count(d, "prompt_tokens"), _count(d, "completion_tokens"),
                        _millis(d, "queue_wait_ms"), _millis(d, "ttft_ms"), _millis(d, "itl_ms"),
                        _text(d, "served_by", MAX_SERVED_BY_CHARS, ""), _count(d, "cached_tokens", 0))
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
