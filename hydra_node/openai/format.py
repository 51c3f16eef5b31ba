"""OpenAI's response shapes (pure): chat and completion bodies, stream chunks, logprobs, usage.

Chat logprobs: ``{"content": [{"token", "logprob", "bytes": [ints], "top_logprobs": [{"token",
"logprob", "bytes"}]}], "refusal": null}``. Completion logprobs (legacy): ``{"tokens",
"token_logprobs", "top_logprobs": [{token: logprob}] (null when 0 alternatives were asked),
"text_offset"}``, offsets counted in characters from the start of the choice's text.

Reasoning (docs/api.md): a chat's thoughts are ``message.reasoning_content`` (only when there are
some) and ``delta.reasoning_content`` chunks before the answer's; with ``reasoning_format: "none"``,
and always in completions' ``text``, they are written into the text between the model's tags
(:mod:`hydra_node.openai.thinking`). Usage carries ``completion_tokens_details`` as OpenAI sends it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Iterable

from hydra_node.api.answer import Chunks
from hydra_node.api.chat import (
    ChatDone,
    ChatOutcome,
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
    sum_usage,
)
from hydra_node.api.errors import ApiError
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import GenerationError, TokenLogprob
from hydra_node.openai.thinking import THINK_TAGS, InlineThoughts, Tags, inline

__all__ = [
    "sse",
    "DONE",
    "chat_logprobs",
    "completion_logprobs",
    "tool_call_json",
    "chat_choice",
    "completion_choice",
    "openai_usage",
    "ChunkMaker",
    "ChunkStream",
]

DONE = b"data: [DONE]\n\n"


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _entry(token: str, logprob: float, raw: bytes) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(entries: Iterable[TokenLogprob]) -> dict:
    return {
        "content": [
            {**_entry(e.token, e.logprob, e.bytes), "top_logprobs": [_entry(*t) for t in e.top]} for e in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries: Iterable[TokenLogprob], top: int, offset: int = 0) -> dict:
    """Legacy shape; ``offset`` is where the first token starts in the choice's text."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if top else None, "text_offset": []}
    for e in entries:
        out["tokens"].append(e.token)
        out["token_logprobs"].append(e.logprob)
        out["text_offset"].append(offset)
        offset += len(e.token)
        if top:
            alts: dict[str, float] = {}
            for tok, lp, _raw in e.top[:top]:
                alts.setdefault(tok, lp)
            out["top_logprobs"].append(alts)
    return out


def tool_call_json(call) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def openai_usage(usage: dict) -> dict:
    """``usage`` (:func:`hydra_node.api.chat.usage_of`, summed) as OpenAI sends it: every member of
    ``completion_tokens_details`` the SDK types define that OpenAI fills (no predictions or audio
    here, so those are 0)."""
    details = usage.get("completion_tokens_details", {})
    return {
        **usage,
        "completion_tokens_details": {
            "reasoning_tokens": details.get("reasoning_tokens", 0),
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
            "audio_tokens": 0,
        },
    }


def chat_choice(index: int, out: ChatOutcome, logprobs: bool, inline_tags: Tags | None = None) -> dict:
    """``inline_tags``: ``reasoning_format: "none"``, the thoughts go into ``content`` between them."""
    content = out.content if inline_tags is None else inline(out.reasoning, out.content, inline_tags)
    message: dict = {"role": "assistant", "content": content, "refusal": None}
    if out.reasoning and inline_tags is None:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [tool_call_json(c) for c in out.tool_calls]
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(out.logprobs) if logprobs else None,
        "finish_reason": out.finish_reason,
    }


def completion_choice(
    index: int, out: ChatOutcome, echo_text: str | None, top: int | None, tags: Tags = THINK_TAGS
) -> dict:
    """``tags``: around the thoughts of a reasoning model, which a completion's text holds."""
    prefix = echo_text or ""
    return {
        "index": index,
        "text": prefix + (inline(out.reasoning, out.content, tags) or ""),
        "logprobs": None if top is None else completion_logprobs(out.logprobs, top, len(prefix)),
        "finish_reason": out.finish_reason,
    }


class ChunkMaker:
    """Stream chunks of one response (``chat.completion.chunk`` or ``text_completion``)."""

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        chat: bool,
        *,
        logprobs: bool = False,
        completion_top: int | None = None,
    ):
        self.id, self.model, self.created, self.chat = request_id, model, created, chat
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.logprobs, self.completion_top = logprobs, completion_top
        self._offsets: dict[int, int] = {}

    def _wrap(self, choice: dict, fingerprint: str | None = None, hosts: Sequence[str] = ()) -> bytes:
        obj: dict = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if fingerprint:  # known once the generation finished: the host that served it
            obj["system_fingerprint"] = fingerprint
        if len(hosts) > 1:  # a continuation served part of it: every host, in order (docs/api.md)
            obj["hydra_served_by"] = list(hosts)
        return sse(obj)

    def role(self, index: int) -> bytes:
        return self._wrap(
            {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        )

    def reasoning(self, index: int, text: str) -> bytes:
        """A piece of a chat's thoughts (llama-server's and DeepSeek's ``delta.reasoning_content``)."""
        return self._wrap(
            {"index": index, "delta": {"reasoning_content": text}, "logprobs": None, "finish_reason": None}
        )

    def text(self, index: int, text: str, entries: tuple[TokenLogprob, ...] = ()) -> bytes:
        if self.chat:
            lp = chat_logprobs(entries) if self.logprobs else None
            return self._wrap({"index": index, "delta": {"content": text}, "logprobs": lp, "finish_reason": None})
        lp = None
        if self.completion_top is not None:  # offsets count token text, as in the non-streamed shape
            lp = completion_logprobs(entries, self.completion_top, self._offsets.get(index, 0))
            self._offsets[index] = self._offsets.get(index, 0) + sum(len(e.token) for e in entries)
        return self._wrap({"index": index, "text": text, "logprobs": lp, "finish_reason": None})

    def _call_delta(self, index: int, delta: dict) -> bytes:
        return self._wrap({"index": index, "delta": {"tool_calls": [delta]}, "logprobs": None, "finish_reason": None})

    def tool_call_start(self, index: int, start) -> bytes:
        """A call's first chunk, as OpenAI streams it: index, id, type, name, empty arguments."""
        return self._call_delta(
            index,
            {
                "index": start.index,
                "id": start.id,
                "type": "function",
                "function": {"name": start.name, "arguments": ""},
            },
        )

    def tool_call_arguments(self, index: int, call_index: int, text: str) -> bytes:
        """A fragment of a call's arguments: ``{"index", "function": {"arguments"}}``."""
        return self._call_delta(index, {"index": call_index, "function": {"arguments": text}})

    def tool_call(self, index: int, call) -> bytes:
        """A whole call (parsed once complete) in two chunks: the start, then all its arguments."""
        return self.tool_call_start(index, call) + self.tool_call_arguments(index, call.index, call.arguments)

    def finish(self, index: int, reason: str, served_by: str = "", served_by_all: Sequence[str] = ()) -> bytes:
        if self.chat:
            return self._wrap(
                {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason},
                served_by or None,
                served_by_all,
            )
        return self._wrap(
            {"index": index, "text": "", "logprobs": None, "finish_reason": reason}, served_by or None, served_by_all
        )

    def usage(self, usage: dict) -> bytes:
        obj = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": openai_usage(usage),
        }
        return sse(obj)


class ChunkStream:
    """A streamed chat or completion answer (:class:`hydra_node.api.answer.StreamFormatter`):
    ``chunks``' pieces per chat event, the role (chat; completions: ``echo[k]``, the prompt, when
    echoed) of each of the ``choices`` first, then, with ``include_usage``, every choice's usage in
    one chunk before ``[DONE]``. A failure or a drain is an error chunk, then ``[DONE]``.

    ``inline_tags``: the thoughts go into the text between the tags it returns (asked at the first
    thought): chat's ``reasoning_format: "none"``, and every completion; None: ``reasoning_content``."""

    def __init__(
        self,
        chunks: ChunkMaker,
        *,
        choices: int = 1,
        include_usage: bool = False,
        echo: Sequence[str] | None = None,
        inline_tags: Callable[[], Tags] | None = None,
    ):
        self.chunks, self.choices, self.include_usage, self.echo = chunks, choices, include_usage, echo
        self.usages: list[dict] = []
        self.inline_tags = inline_tags
        self._inline: dict[int, InlineThoughts] = {}

    def reasoning(self, k: int, delta: ReasoningDelta) -> Chunks:
        if self.inline_tags is None:
            return [self.chunks.reasoning(k, delta.text)]
        if k not in self._inline:
            self._inline[k] = InlineThoughts(self.inline_tags())
        return [self.chunks.text(k, self._inline[k].thought(delta.text))]

    def _closing(self, k: int) -> list[bytes]:
        """The close tag of choice ``k``'s inlined thoughts, before whatever follows them."""
        thoughts = self._inline.get(k)
        end = thoughts.close() if thoughts is not None else ""
        return [self.chunks.text(k, end)] if end else []

    def start(self) -> Chunks:
        if self.chunks.chat:
            return [self.chunks.role(k) for k in range(self.choices)]
        return [self.chunks.text(k, self.echo[k]) for k in range(self.choices)] if self.echo is not None else []

    def text(self, k: int, delta: ContentDelta) -> Chunks:
        return [*self._closing(k), self.chunks.text(k, delta.text, delta.logprobs)]

    def tool_call_start(self, k: int, start: ToolCallStart) -> Chunks:
        return [*self._closing(k), self.chunks.tool_call_start(k, start)]

    def tool_call_arguments(self, k: int, fragment: ToolCallArguments) -> Chunks:
        return [self.chunks.tool_call_arguments(k, fragment.index, fragment.text)]

    def tool_call(self, k: int, call: ParsedToolCall) -> Chunks:
        if call.streamed:  # sent as it came
            return []
        return [*self._closing(k), self.chunks.tool_call(k, call)]

    def finish(self, k: int, done: ChatDone) -> Chunks:
        self.usages.append(done.usage)
        return [*self._closing(k), self.chunks.finish(k, done.finish_reason, done.served_by, done.served_by_all)]

    def end(self) -> Chunks:
        return ([self.chunks.usage(sum_usage(self.usages))] if self.include_usage else []) + [DONE]

    def error(self, exc: GenerationError) -> Chunks:
        return [sse(ApiError.from_generation(exc).body()), DONE]

    def interrupted(self, reason: str) -> bytes:
        return sse(ApiError(503, f"stream ended: {reason}", "node_shutting_down").body()) + DONE
