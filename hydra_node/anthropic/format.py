"""Anthropic's shapes for ``/v1/messages`` (pure): the message object, errors, stop reasons, and
the typed server-sent events of a streamed message.

Stream order (the Anthropic SDKs dispatch on the ``event:`` name, which equals the ``type``)::

    message_start (the message shell, content [], usage.input_tokens 0: not known yet), ping,
    thinking:   content_block_start {"type": "thinking", "thinking": "", "signature": ""},
                content_block_delta (thinking_delta)..., content_block_delta (signature_delta),
                content_block_stop
    per block:  content_block_start, content_block_delta (text_delta | input_json_delta)..., content_block_stop
    then        message_delta {stop_reason, stop_sequence; usage: input_tokens, output_tokens, cache_read}
                message_stop
    or          error {"type": "error", "error": {"type", "message"}}

``usage.input_tokens`` is known only when the generation ends (the host renders and tokenises the
prompt), so ``message_start`` carries 0 and ``message_delta`` the real count; the SDKs take the
``message_delta`` figures as the final ones. :class:`MessageStreamFormatter` is the builder as the
streamed answer's formatter (:mod:`hydra_node.api.answer`).

A reasoning model's thoughts are a ``thinking`` block before the answer's blocks. Its
``signature`` is :data:`THINKING_SIGNATURE`: nothing here signs thoughts, but Anthropic's clients
expect a non-empty one (Claude Code drops a thinking block without it), so every block carries the
same placeholder, and a signature sent back is never checked. Thinking counts in
``output_tokens`` (Anthropic has no separate count).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence

from hydra_node.http.server import Response
from hydra_node.api.answer import Chunks
from hydra_node.api.chat import ChatDone, ContentDelta, ReasoningDelta, ToolCallArguments, served_by_field
from hydra_node.api.errors import ApiError
from hydra_node.grammar.toolcalls import ParsedToolCall, ToolCallStart
from hydra_node.inference import GenerationError, TokenLogprob

__all__ = [
    "ERROR_TYPES",
    "THINKING_SIGNATURE",
    "MessageEventStream",
    "MessageStreamFormatter",
    "error_body",
    "error_response",
    "matched_stop",
    "message_body",
    "new_id",
    "sse",
    "stop_reason",
    "stop_sequence",
    "thinking_block",
    "usage_body",
]

#: Anthropic's error ``type`` by HTTP status (anything else >= 500: ``api_error``).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


#: The ``signature`` of every thinking block (module doc): a placeholder, not a signature.
THINKING_SIGNATURE = "hydra-unsigned"


def new_id(prefix: str, token: Callable[[int], str] = secrets.token_hex) -> str:
    return f"{prefix}_{token(12)}"


def error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(exc: ApiError) -> Response:
    """An :class:`ApiError` in Anthropic's shape (same status, ``retry-after`` kept); the OpenAI
    ``param`` is named in the message."""
    resp = exc.response()
    message = exc.message if not exc.param or exc.param in exc.message else f"{exc.param}: {exc.message}"
    return Response.json(exc.status, error_body(exc.status, message), resp.headers)


def matched_stop(generated: str, stops: tuple[str, ...]) -> str | None:
    """The stop sequence that ended ``generated`` (all the text the model produced, the stop
    included): the one that occurs first (ties: the first listed), as the runner cuts; None
    when none occurs (the model ended its turn)."""
    best: tuple[int, int] | None = None
    for k, s in enumerate(stops):
        i = generated.find(s)
        if i != -1 and (best is None or i < best[0]):
            best = (i, k)
    return None if best is None else stops[best[1]]


def stop_sequence(finish_reason: str, entries: list[TokenLogprob], stops: tuple[str, ...]) -> str | None:
    """The stop sequence that ended an answer: ``entries``, every token generated (the stop's own
    included), tell which one (None: the answer did not end at a stop sequence)."""
    if finish_reason != "stop" or not stops:
        return None
    return matched_stop(b"".join(e.bytes for e in entries).decode("utf-8", "replace"), stops)


def stop_reason(finish_reason: str, stop_sequence: str | None) -> str:
    """The chat finish reason as Anthropic's ``stop_reason``."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_body(usage: dict) -> dict:
    """Anthropic's ``usage`` from the chat's (OpenAI-shaped) usage."""
    return {
        "input_tokens": usage.get("prompt_tokens", 0),
        "output_tokens": usage.get("completion_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
    }


def _tool_use(call: ParsedToolCall | ToolCallStart, arguments: str | None) -> dict:
    try:
        inp = json.loads(arguments) if arguments else {}
    except ValueError:  # a call cut by max_tokens inside its arguments
        inp = {}
    return {
        "type": "tool_use",
        "id": _tool_id(call.id),
        "name": call.name,
        "input": inp if isinstance(inp, dict) else {},
    }


def _tool_id(call_id: str) -> str:
    """Anthropic's ids look like ``toolu_...``; the chat layer's ``call_...`` are renamed."""
    return "toolu_" + call_id.removeprefix("call_")


def message_body(
    msg_id: str,
    model: str,
    text: str | None,
    calls: list[ParsedToolCall],
    reason: str | None,
    stop_sequence: str | None,
    usage: dict,
    served_by: Sequence[str] = (),
    reasoning: str = "",
    show_thinking: bool = True,
) -> dict:
    """The message object; ``served_by``: every host that served a part, named as
    ``hydra_served_by`` when more than one did (a continuation, docs/api.md); ``reasoning``: the
    thoughts, a thinking block first (with no text when ``show_thinking`` is False)."""
    content = [thinking_block(reasoning if show_thinking else "")] if reasoning else []
    content += [{"type": "text", "text": text}] if text else []
    content += [_tool_use(c, c.arguments) for c in calls]
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
        **served_by_field(served_by),
    }


def thinking_block(thinking: str) -> dict:
    return {"type": "thinking", "thinking": thinking, "signature": THINKING_SIGNATURE}


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


class MessageEventStream:
    """One streamed message's events, as dicts (frame each with :func:`sse`)."""

    def __init__(self, msg_id: str, model: str, show_thinking: bool = True):
        self.msg_id, self.model, self.show_thinking = msg_id, model, show_thinking
        self._index = -1  # the open block's index, or of the last one closed
        self._open: str | None = None  # "thinking" | "text" | "tool_use" | None
        self.text: list[str] = []  # every text delta sent (the whole answer's text)
        self.done = False

    def start(self) -> list[dict]:
        shell = message_body(self.msg_id, self.model, None, [], None, None, {"input_tokens": 0, "output_tokens": 0})
        return [{"type": "message_start", "message": shell}, {"type": "ping"}]

    def _close(self) -> list[dict]:
        if self._open is None:
            return []
        out = []
        if self._open == "thinking":  # the signature comes just before the block's stop
            delta = {"type": "signature_delta", "signature": THINKING_SIGNATURE}
            out.append({"type": "content_block_delta", "index": self._index, "delta": delta})
        self._open = None
        return out + [{"type": "content_block_stop", "index": self._index}]

    def thinking_delta(self, thinking: str) -> list[dict]:
        """A piece of the thoughts (the block opens with the first; no text is sent when the
        request asked for ``display: "omitted"``)."""
        if not thinking:
            return []
        out = []
        if self._open != "thinking":
            out = self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        if not self.show_thinking:
            return out
        delta = {"type": "thinking_delta", "thinking": thinking}
        return out + [{"type": "content_block_delta", "index": self._index, "delta": delta}]

    def _begin(self, kind: str, block: dict) -> list[dict]:
        out = self._close()
        self._index += 1
        self._open = kind
        return out + [{"type": "content_block_start", "index": self._index, "content_block": block}]

    def text_delta(self, text: str) -> list[dict]:
        if not text:
            return []
        out = [] if self._open == "text" else self._begin("text", {"type": "text", "text": ""})
        self.text.append(text)
        return out + [
            {"type": "content_block_delta", "index": self._index, "delta": {"type": "text_delta", "text": text}}
        ]

    def call_start(self, ev: ToolCallStart) -> list[dict]:
        return self._begin("tool_use", _tool_use(ev, None))

    def call_arguments(self, fragment: str) -> list[dict]:
        if self._open != "tool_use" or not fragment:
            return []
        return [
            {
                "type": "content_block_delta",
                "index": self._index,
                "delta": {"type": "input_json_delta", "partial_json": fragment},
            }
        ]

    def tool_call(self, call: ParsedToolCall) -> list[dict]:
        """A call's end: after streamed arguments, the block's stop; a call parsed whole comes as a
        start, its arguments in one delta, and a stop."""
        if call.streamed:
            return self._close()
        out = self._begin("tool_use", _tool_use(call, None))
        out += self.call_arguments(call.arguments)
        return out + self._close()

    def finish(self, reason: str, stop_sequence: str | None, usage: dict, served_by: Sequence[str] = ()) -> list[dict]:
        """The end: ``message_delta`` carries the final usage and, when more than one host served
        the message, ``hydra_served_by``; then ``message_stop``."""
        self.done = True
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence}
        return self._close() + [
            {"type": "message_delta", "delta": delta, "usage": usage, **served_by_field(served_by)},
            {"type": "message_stop"},
        ]

    def fail(self, message: str, status: int) -> list[dict]:
        self.done = True
        return [error_body(status, message)]


class MessageStreamFormatter:
    """A streamed message (:class:`hydra_node.api.answer.StreamFormatter`): ``builder``'s events
    per chat event, each framed on its own; the text's token entries tell which of
    ``stop_sequences`` ended it. A failure or a drain is an ``error`` event."""

    def __init__(self, builder: MessageEventStream, stop_sequences: tuple[str, ...]):
        self.builder, self.stop_sequences = builder, stop_sequences
        self.entries: list[TokenLogprob] = []

    def start(self) -> Chunks:
        return [sse(e) for e in self.builder.start()]

    def reasoning(self, k: int, delta: ReasoningDelta) -> Chunks:
        return [sse(e) for e in self.builder.thinking_delta(delta.text)]

    def text(self, k: int, delta: ContentDelta) -> Chunks:
        self.entries.extend(delta.logprobs)
        return [sse(e) for e in self.builder.text_delta(delta.text)]

    def tool_call_start(self, k: int, start: ToolCallStart) -> Chunks:
        return [sse(e) for e in self.builder.call_start(start)]

    def tool_call_arguments(self, k: int, fragment: ToolCallArguments) -> Chunks:
        return [sse(e) for e in self.builder.call_arguments(fragment.text)]

    def tool_call(self, k: int, call: ParsedToolCall) -> Chunks:
        return [sse(e) for e in self.builder.tool_call(call)]

    def finish(self, k: int, done: ChatDone) -> Chunks:
        stop = stop_sequence(done.finish_reason, self.entries, self.stop_sequences)
        return [
            sse(e)
            for e in self.builder.finish(
                stop_reason(done.finish_reason, stop), stop, usage_body(done.usage), done.served_by_all
            )
        ]

    def end(self) -> Chunks:
        return []

    def error(self, exc: GenerationError) -> Chunks:
        return [sse(e) for e in self.builder.fail(exc.message, exc.status)]

    def interrupted(self, reason: str) -> bytes:
        return b"".join(sse(e) for e in self.builder.fail(f"stream ended: {reason}", 503))
