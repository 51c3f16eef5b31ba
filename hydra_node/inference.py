"""The contract between the API, the router, local runners and remote peers.

A generation is described by a :class:`GenerationRequest` and produces a stream of
events: zero or more :class:`TextDelta` then exactly one :class:`Finished`, or a
:class:`GenerationError` raised part-way.  Everything here is plain data with a
``to_wire()``/``from_wire()`` pair made of CBOR-friendly types (dict, list, str,
int, float, bool, None), so the same objects cross the runner channel and the
peer links unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Literal, Protocol, AsyncContextManager

Kind = Literal["chat", "completion"]

#: Upper bound on generated tokens a single request may ask for.
MAX_TOKENS_LIMIT = 32768
#: Upper bound on stop sequences (OpenAI allows 4).
MAX_STOP_SEQUENCES = 4
#: Characters of a session id kept for routing affinity (``X-Session-Id`` header or body ``user``).
MAX_SESSION_CHARS = 256


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

    @classmethod
    def from_wire(cls, d: dict) -> "GenerationError":
        return cls(str(d.get("message", "remote error")), code=str(d.get("code", "generation_failed")),
                   status=int(d.get("status", 502)), retryable=bool(d.get("retryable", False)),
                   retry_after=d.get("retry_after"))


class QueueFull(GenerationError):
    def __init__(self, model: str, retry_after: float = 1.0):
        super().__init__(f"model {model!r} is busy: its request queue is full", code="queue_full",
                         status=429, retryable=True, retry_after=retry_after)


class ModelUnavailable(GenerationError):
    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message, code="model_unavailable", status=503, retryable=retryable, retry_after=2.0)


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


def event_from_wire(d: dict) -> GenerationEvent:
    t = d.get("type") if isinstance(d, dict) else None
    if t == "delta":
        return TextDelta(str(d["text"]))
    if t == "finished":
        try:
            return Finished(str(d["finish_reason"]), int(d["prompt_tokens"]), int(d["completion_tokens"]),
                            float(d.get("queue_wait_ms", 0.0)), float(d.get("ttft_ms", 0.0)),
                            float(d.get("itl_ms", 0.0)), str(d.get("served_by", "")),
                            int(d.get("cached_tokens", 0)))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # a peer's malformed event
            raise GenerationError(f"malformed finished event: {exc!r}", code="bad_event", status=502) from None
    if t == "error":
        raise GenerationError.from_wire(d)
    raise GenerationError(f"malformed generation event {t!r}", code="bad_event", status=502)


class InferenceTarget(Protocol):
    """Something that can run a generation: a local runner or a remote peer.

    ``generate`` is an async context manager so that leaving it (client gone,
    cancellation) always cancels the generation where it runs.
    """

    def generate(self, req: GenerationRequest) -> AsyncContextManager[AsyncIterator[GenerationEvent]]: ...
