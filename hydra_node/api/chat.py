"""Running one chat generation through the router, as typed chat events.

The router yields raw :class:`TextDelta`/:class:`Finished`; a chat with tools needs the model's
``<tool_call>…</tool_call>`` text parsed back into calls (:mod:`hydra_node.grammar.toolcalls`). This
module does that once, for every API that answers chats (``/v1/chat/completions``,
``/v1/responses``):

* :func:`stream_chat` — an async context manager that opens the generation (routing errors raise
  :class:`GenerationError` from ``__aenter__``, before anything is answered) and yields an async
  iterator of :class:`ContentDelta` / :class:`ToolCallStart` / :class:`ToolCallArguments` /
  :class:`ToolCallDelta` … then one :class:`ChatDone`;
* :func:`complete_chat` — the same, collected into a :class:`ChatOutcome`.

Streamed calls: when the request carries the tool-call grammar (``tool_choice`` ``auto`` with its
lazy grammar, ``required``, a named function), a call comes as :class:`ToolCallStart` (name
complete), :class:`ToolCallArguments` fragments as they are generated, then :class:`ToolCallDelta`
with ``call.streamed`` set (the end; its ``arguments`` compact). Without a grammar a call comes
whole, as one :class:`ToolCallDelta`. A call cut before its arguments ended (``max_tokens``, a
stop sequence) ends with ``call.complete`` False and the finish reason is the generation's
(``length``), not ``tool_calls``.

Logprobs: each :class:`ContentDelta` carries the token entries of the deltas behind it, including
the tokens of tool-call text (the model generated them; OpenAI reports content tokens only, so the
chat formatter reports them under ``logprobs.content`` as they come).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Sequence

from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal

from hydra_node.grammar.toolcalls import (
    OPEN_TAG,
    ContentText,
    ParsedToolCall,
    ToolCallArguments,
    ToolCallParser,
    ToolCallStart,
)
from hydra_node.api.router_api import RouterApi
from hydra_node.routing.router import RoutedEvents
from hydra_node.inference import Finished, GenerationError, GenerationEvent, GenerationRequest, TextDelta, TokenLogprob

__all__ = [
    "ReasoningDelta",
    "ContentDelta",
    "ToolCallStart",
    "ToolCallArguments",
    "ToolCallDelta",
    "ChatDone",
    "ChatEvent",
    "ChatOutcome",
    "stream_chat",
    "complete_chat",
    "chat_events",
    "usage_of",
    "parses_tool_calls",
    "served_by_field",
    "sum_usage",
]


@dataclass(frozen=True)
class ContentDelta:
    """Assistant text (may be empty when only logprobs came with it)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    """A reasoning model's thoughts (the host split them from the answer: docs/reasoning.md);
    they come before the answer's content and never hold tool calls."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call, whole, or the end of a streamed one (``call.index`` counts calls from 0 within the answer)."""

    call: ParsedToolCall


@dataclass(frozen=True)
class ChatDone:
    """The end: ``finish_reason`` is ``tool_calls`` when the answer made calls."""

    finish_reason: str
    usage: dict
    served_by: str
    #: Every host that served a part, in order (more than one after a continuation: docs/api.md).
    served_by_all: tuple[str, ...] = ()


ChatEvent = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArguments | ToolCallDelta | ChatDone


@dataclass
class ChatOutcome:
    content: str | None  # None when the answer is only tool calls
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict = field(default_factory=dict)
    served_by: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    served_by_all: tuple[str, ...] = ()
    reasoning: str = ""  # the thoughts of a reasoning model ("" for others)


def usage_of(fin: Finished) -> dict:
    """OpenAI's ``usage`` object for a finished generation."""
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": fin.reasoning_tokens},
    }


def parses_tool_calls(req: GenerationRequest) -> bool:
    """True when the answer to ``req`` may hold tool calls to parse (tools offered, choice not none)."""
    return req.kind == "chat" and bool(req.tools) and req.tool_choice != "none"


def _parser(req: GenerationRequest) -> ToolCallParser | None:
    """The API node parses calls; hosts never do. Under the tool-call grammar (the only grammar a
    request with active tools carries) calls stream: lazily from the first open tag (``auto``) or
    from the start of the answer (forced calls; calls-or-JSON on /v1/responses)."""
    if not parses_tool_calls(req):
        return None
    constrained: Literal["lazy", "whole"] | None = None
    if req.grammar and OPEN_TAG in req.grammar:
        constrained = "lazy" if req.grammar_triggers else "whole"
    return ToolCallParser([t.name for t in req.tools], constrained=constrained)


async def chat_events(
    req: GenerationRequest, events: AsyncIterator[GenerationEvent]
) -> AsyncGenerator[ChatEvent, None]:
    """The router's events for ``req`` as chat events (tool-call text parsed into calls)."""
    parser = _parser(req)
    called = cut = False

    def translate(items, logprobs=()):
        nonlocal called, cut
        text, out = [], []
        for item in items:
            if isinstance(item, ContentText):
                text.append(item.text)
                continue
            if text or logprobs:
                out.append(ContentDelta("".join(text), tuple(logprobs)))
                text, logprobs = [], ()
            if isinstance(item, ParsedToolCall):
                called, cut = True, cut or not item.complete
                out.append(ToolCallDelta(item))
            else:
                out.append(item)
        if text or logprobs:
            out.append(ContentDelta("".join(text), tuple(logprobs)))
        return [e for e in out if not (isinstance(e, ContentDelta) and not e.text and not e.logprobs)]

    async for ev in events:
        if isinstance(ev, TextDelta):
            if ev.reasoning:
                yield ReasoningDelta(ev.reasoning)
            if parser is None:
                if ev.text or ev.logprobs:
                    yield ContentDelta(ev.text, ev.logprobs)
                continue
            for out in translate(parser.feed(ev.text), ev.logprobs):
                yield out
        elif isinstance(ev, Finished):
            if parser is not None:
                for out in translate(parser.finish()):
                    yield out
            reason = "tool_calls" if called and not cut else ev.finish_reason
            yield ChatDone(reason, usage_of(ev), ev.served_by, tuple(getattr(events, "served_by_all", ())))
            return
    raise GenerationError("the generation ended without a result", code="incomplete_generation", status=502)


@asynccontextmanager
async def stream_chat(router: RouterApi, req: GenerationRequest) -> AsyncIterator[RoutedEvents[ChatEvent]]:
    """Open ``req`` on the router; yield its events as chat events (see the module doc).

    Entering raises :class:`GenerationError` when no target can take the request; iterating may
    raise it too (the generation failed part-way). Leaving cancels the generation where it runs."""
    async with router.generate(req) as events:
        async with aclosing(chat_events(req, events)) as translated:
            yield RoutedEvents(translated, getattr(events, "served_by", ""))


async def complete_chat(router: RouterApi, req: GenerationRequest) -> ChatOutcome:
    """Run ``req`` to the end. Raises :class:`GenerationError`."""
    text: list[str] = []
    thoughts: list[str] = []
    out = ChatOutcome(content=None)
    async with stream_chat(router, req) as events:
        async for ev in events:
            if isinstance(ev, ReasoningDelta):
                thoughts.append(ev.text)
            elif isinstance(ev, ContentDelta):
                text.append(ev.text)
                out.logprobs.extend(ev.logprobs)
            elif isinstance(ev, ToolCallDelta):
                out.tool_calls.append(ev.call)
            elif isinstance(ev, ChatDone):
                out.finish_reason, out.usage, out.served_by = ev.finish_reason, ev.usage, ev.served_by
                out.served_by_all = ev.served_by_all
    content = "".join(text)
    out.content = content if (content or not out.tool_calls) else None
    out.reasoning = "".join(thoughts)
    return out


def served_by_field(hosts: Sequence[str]) -> dict[str, list[str]]:
    """``{"hydra_served_by": hosts}`` when more than one host served an answer (a continuation:
    :attr:`ChatDone.served_by_all`, from the router's record), else ``{}`` (docs/api.md)."""
    return {"hydra_served_by": list(hosts)} if len(hosts) > 1 else {}


def sum_usage(usages: Iterable[dict]) -> dict:
    """The usage of several generations added up (OpenAI reports one usage for all choices)."""
    total: dict[str, Any] = {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    for u in usages:
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            total[key] += u.get(key, 0)
        total["prompt_tokens_details"]["cached_tokens"] += u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        total["completion_tokens_details"]["reasoning_tokens"] += u.get("completion_tokens_details", {}).get(
            "reasoning_tokens", 0
        )
    return total
