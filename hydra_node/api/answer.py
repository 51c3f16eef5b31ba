"""One streamed answer for every dialect: a chat's events through the dialect's formatter, as a :class:`StreamResponse`.

Every streamed answer (``/v1/chat/completions`` and ``/v1/completions``, ``model: "mesh"`` on
them, ``/v1/responses``, ``/v1/messages``) is the same loop: the formatter's opening chunks, then
per ``(choice index, chat event)`` of the source the formatter's chunks for that event, then its
closing chunks. What may go wrong is handled here, once:

* the generation fails part-way (:class:`GenerationError` from the source): the formatter's
  :meth:`~StreamFormatter.error` chunks end the body (the status, 200, is sent already);
* the node drains: the HTTP server closes the body and writes :meth:`~StreamFormatter.interrupted`
  as the last chunk (``StreamResponse.on_interrupt``);
* however the body ends (done, failed, client gone, drained), ``close`` is awaited: the body's
  ``finally`` and, for a body that never started, the response's finalizer (``close`` must be
  idempotent, as :meth:`StreamFanOut.close` is).

A dialect keeps only its :class:`StreamFormatter`: what bytes each event becomes. Each method
returns the chunks to write, each written as one piece (so ``[]``: nothing for that event). The
source is opened before the 200 (routing errors get a proper status); ``events`` is called when the
body starts.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from contextlib import aclosing
from typing import Protocol

from hydra_node.api.chat import (
    ChatDone,
    ChatEvent,
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallDelta,
    ToolCallStart,
)
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.http.server import StreamResponse
from hydra_node.inference import GenerationError

__all__ = [
    "Chunks",
    "EventSource",
    "StreamFormatter",
    "format_event",
    "nothing_to_close",
    "stream_answer",
    "stream_body",
]

#: What a formatter writes for one step: each item one piece of the body, in order.
Chunks = Iterable[bytes]
#: The ``(choice index, event)`` pairs of an answer (:meth:`StreamFanOut.events`, or a replay).
EventSource = Callable[[], AsyncGenerator[tuple[int, ChatEvent], None]]


class StreamFormatter(Protocol):
    """A dialect's streamed answer: the bytes of each step (``k``: the choice, 0 with one)."""

    def start(self) -> Chunks:
        """Before any event (OpenAI's role chunks, ``response.created``, ``message_start``)."""
        ...

    def reasoning(self, k: int, delta: ReasoningDelta) -> Chunks:
        """A reasoning model's thoughts (they come before the answer's text and calls)."""
        ...

    def text(self, k: int, delta: ContentDelta) -> Chunks: ...

    def tool_call_start(self, k: int, start: ToolCallStart) -> Chunks:
        """A streamed call begins (its name is complete)."""
        ...

    def tool_call_arguments(self, k: int, fragment: ToolCallArguments) -> Chunks:
        """A fragment of the streamed call's arguments."""
        ...

    def tool_call(self, k: int, call: ParsedToolCall) -> Chunks:
        """A call parsed whole, or the end of the streamed one (``call.streamed``)."""
        ...

    def finish(self, k: int, done: ChatDone) -> Chunks:
        """Choice ``k`` ended."""
        ...

    def end(self) -> Chunks:
        """After every choice ended (OpenAI's usage chunk and ``[DONE]``)."""
        ...

    def error(self, exc: GenerationError) -> Chunks:
        """The generation failed part-way: the last chunks."""
        ...

    def interrupted(self, reason: str) -> bytes:
        """The node drains (``reason`` says so): the last bytes of the stream."""
        ...


def format_event(fmt: StreamFormatter, k: int, ev: ChatEvent) -> Chunks:
    """The chunks of one chat event."""
    if isinstance(ev, ContentDelta):
        return fmt.text(k, ev)
    if isinstance(ev, ReasoningDelta):
        return fmt.reasoning(k, ev)
    if isinstance(ev, ToolCallStart):
        return fmt.tool_call_start(k, ev)
    if isinstance(ev, ToolCallArguments):
        return fmt.tool_call_arguments(k, ev)
    if isinstance(ev, ToolCallDelta):
        return fmt.tool_call(k, ev.call)
    return fmt.finish(k, ev)


async def stream_body(
    events: EventSource, fmt: StreamFormatter, close: Callable[[], Awaitable[None]]
) -> AsyncGenerator[bytes, None]:
    """The body: ``fmt``'s chunks for ``events()``; a :class:`GenerationError` ends it with
    ``fmt.error``; ``close`` is awaited however it ends."""
    try:
        for chunk in fmt.start():
            yield chunk
        async with aclosing(events()) as stream:
            async for k, ev in stream:
                for chunk in format_event(fmt, k, ev):
                    yield chunk
        for chunk in fmt.end():
            yield chunk
    except GenerationError as exc:
        for chunk in fmt.error(exc):
            yield chunk
    finally:
        await close()


def stream_answer(
    events: EventSource, fmt: StreamFormatter, *, close: Callable[[], Awaitable[None]], headers: list[tuple[str, str]]
) -> StreamResponse:
    """The 200 streaming ``events()`` through ``fmt`` (see the module doc)."""
    return StreamResponse(
        200, stream_body(events, fmt, close), on_interrupt=fmt.interrupted, finalizer=close, headers=headers
    )


async def nothing_to_close() -> None:
    """``close`` for a source that holds nothing open (a finished answer replayed)."""
