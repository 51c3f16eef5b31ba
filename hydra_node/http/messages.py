"""The request and response types of the HTTP server (``http/server.py``), and its error body."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import AsyncGenerator, Awaitable, Callable

import trio

from hydra_node.http.guard import bearer_matches

__all__ = ["Handler", "Request", "Response", "StreamResponse", "error_body", "served_by_header"]


def served_by_header(host: str | None) -> list[tuple[str, str]]:
    """``x-hydra-served-by``: the host that generated an answer (none when unknown)."""
    return [("x-hydra-served-by", host)] if host else []


def error_body(message: str, code: str, kind: str = "invalid_request_error") -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` as bytes (the OpenAI error shape)."""
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case name -> value (last wins)
    body: bytes
    client: str = ""
    #: The request's own nursery, opened by the connection around the handler and the whole
    #: response (None outside the HTTP server). A task the handler or a streamed body starts here
    #: is part of the request: it is cancelled when the client goes away, and when the response is
    #: over (after the body is closed and its finalizer ran), and the connection waits for it to
    #: end before it reads the next request. A task that raises ends the response and the connection.
    nursery: trio.Nursery | None = field(default=None, repr=False, compare=False)

    def json(self):
        """The body as JSON; ``ValueError`` for anything that is not (nesting past the decoder's own
        bound included: a 400 for the caller, never a RecursionError reaching the server)."""
        try:
            return json.loads(self.body)
        except RecursionError:
            raise ValueError("the JSON body nests too deeply") from None

    def bearer_matches(self, key: str | None) -> bool:
        """True when no key is required, or ``Authorization: Bearer KEY`` carries it (scheme in any case)."""
        return bearer_matches(self.headers.get("authorization"), key)


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list = field(default_factory=list)

    @classmethod
    def json(cls, status: int, obj, headers: list | None = None) -> "Response":
        return cls(status, json.dumps(obj, separators=(",", ":")).encode(), "application/json", headers or [])


@dataclass
class StreamResponse:
    """A streamed body.  ``body`` is an async generator of byte chunks.

    If the client disconnects or the server drains, the generator is closed
    (``GeneratorExit``/``Cancelled`` inside it).  ``on_interrupt`` bytes, if given,
    are written as the last chunk when a drain interrupts the stream.  A body that needs
    tasks of its own (a generator cannot hold a nursery open across ``yield``) starts them in
    the request's nursery (:attr:`Request.nursery`), which outlives the body.
    """

    status: int
    body: AsyncGenerator[bytes, None]  # an async generator: closed (aclose) when the response ends
    content_type: str = "text/event-stream"
    headers: list = field(default_factory=list)
    on_interrupt: Callable[[str], bytes] | None = None
    #: Always awaited once the response is over, however it ended (even if never started).
    finalizer: Callable[[], Awaitable[None]] | None = None

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            await self.body.aclose()
            if self.finalizer is not None:
                fin, self.finalizer = self.finalizer, None
                await fin()


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]
