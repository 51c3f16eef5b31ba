"""Typed generation errors: what the API answers with, what crosses a stream as an error event."""

from __future__ import annotations

from typing import Any

#: Remote statuses that mean "the peer cannot serve this now" (relayed as 503); any other
#: remote failure is relayed as 502.
UNAVAILABLE_STATUSES = frozenset({429, 503})

__all__ = [
    "UNAVAILABLE_STATUSES",
    "GenerationError",
    "QueueFull",
    "ModelUnavailable",
    "RemoteError",
    "MalformedRemoteEvent",
    "InvalidRequest",
]


#: Codes of failures that took a runner down (it crashed, or stopped answering): the request
#: itself may be what killed it, so it is never retried on another target (it would kill that
#: one too), whatever ``retryable`` says. A peer relays these codes as a :class:`RemoteError`.
#: ``runner_killed`` (a SIGKILL the node did not send: the OOM killer, ``kill -9``) is not among them:
#: a lost head is not the request's fault (hydra_node/runtime/runner/records.py ``RunnerKilled``).
POISONOUS_CODES = frozenset({"runner_crashed", "runner_stalled"})


class GenerationError(Exception):
    """A generation failed.  ``code`` is stable and machine-readable.

    ``status`` is the HTTP status the API should answer with when nothing has been
    streamed yet; ``retryable`` tells the router it may try another target (only
    sensible before the first byte reached the client).
    """

    #: True once the generation that failed had already yielded events to its caller: too late to
    #: retry it elsewhere, whatever ``retryable`` says (the router sets it; it never crosses the wire).
    streamed: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str = "generation_failed",
        status: int = 500,
        retryable: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after

    @property
    def poisonous(self) -> bool:
        """The request may be what crashed or stalled the runner (see :data:`POISONOUS_CODES`)."""
        return self.code in POISONOUS_CODES

    @property
    def retry_elsewhere(self) -> bool:
        """Whether the router may try another target: retryable, nothing streamed, not poisonous."""
        return self.retryable and not self.streamed and not self.poisonous

    def to_wire(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "code": self.code,
            "status": self.status,
            "retryable": self.retryable,
            "retry_after": self.retry_after,
        }


class QueueFull(GenerationError):
    def __init__(self, model: str, retry_after: float = 1.0):
        super().__init__(
            f"model {model!r} is busy: its request queue is full",
            code="queue_full",
            status=429,
            retryable=True,
            retry_after=retry_after,
        )


class ModelUnavailable(GenerationError):
    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message, code="model_unavailable", status=503, retryable=retryable, retry_after=2.0)


class RemoteError(GenerationError):
    """A generation failed on the other side of a stream (a peer, or a child's channel).

    ``status`` is ours to answer with: 502 or 503, never a success; ``remote_status`` is
    what the remote claimed (None when it sent something malformed)."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int,
        retryable: bool = False,
        retry_after: float | None = None,
        remote_status: int | None = None,
    ):
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
