"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API on :9337.

Built like ``/v1/responses``: the body is parsed into the shared chat vocabulary
(:mod:`anthropic_request`), tools become the same grammars as on ``/v1/chat/completions``
(:mod:`hydra_node.grammar.constraints`: ``any`` and a named ``tool`` force a call, ``auto`` gets the lazy
grammar), the generation runs through :mod:`hydra_node.api.chat` (tool calls parsed back, streamed
as they are generated) and the answer is shaped by :mod:`anthropic_format`. Errors are
Anthropic-shaped. Model ids: :mod:`anthropic_models`. What is supported: docs/agents.md.

``stop_sequences`` are cut by the host's runner like OpenAI's ``stop``; to tell which one ended
the answer (``stop_reason: "stop_sequence"`` and ``stop_sequence``), such a request also asks the
host for per-token entries (``logprobs``), whose bytes are every token generated, the stop's own
tokens included; the entries are not shown to the client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from contextlib import aclosing

import trio

from hydra_node.grammar import constraints as grammar  # built on the API node, enforced by the host's sampler
from hydra_node.anthropic.format import (MessageEventStream, error_response, matched_stop, message_body, new_id,
                                             sse, stop_reason, usage_body)
from hydra_node.anthropic.models import resolve_model
from hydra_node.anthropic.request import MessagesCall, parse_count_tokens_body, parse_messages_body
from hydra_node.api.chat import ChatDone, ContentDelta, ToolCallArguments, ToolCallDelta, ToolCallStart, complete_chat
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.http.messages import served_by_header
from hydra_node.moa.answers import MoaApi, open_chat_events
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.router_api import RouterApi
from hydra_node.api.tool_choice_header import TOOL_CHOICE_HEADER, override_tool_choice
from hydra_node.inference import GenerationError, GenerationRequest, InvalidRequest, TokenLogprob

__all__ = ["MessagesApi", "generation_request"]

MESSAGES_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"


def generation_request(call: MessagesCall, request_id: str, session: str = "") -> GenerationRequest:
    """The chat generation serving ``call`` (tools -> grammars as on /v1/chat/completions)."""
    fields: dict = {}
    try:
        if call.tools and call.tool_choice != "none":
            fields["grammar"] = grammar.tool_call_grammar(call.tools, name=call.tool_name or None,
                                                          parallel=call.parallel_tool_calls)
            if call.tool_choice == "auto":
                fields["grammar_triggers"] = (grammar.TOOL_CALL_TRIGGER,)
        return GenerationRequest(
            model=call.model, kind="chat", messages=call.messages, max_tokens=call.max_tokens,
            temperature=call.temperature, top_p=call.top_p if call.top_p > 0 else 1.0, stop=call.stop_sequences,
            request_id=request_id, session=session or call.session, tools=call.tools, tool_choice=call.tool_choice,
            tool_name=call.tool_name, parallel_tool_calls=call.parallel_tool_calls,
            logprobs=bool(call.stop_sequences), **fields)
    except InvalidRequest as exc:
        raise bad(exc.message, exc.param) from None


def _generated_text(entries: list[TokenLogprob]) -> str:
    return b"".join(e.bytes for e in entries).decode("utf-8", "replace")


class MessagesApi:
    """Serves the Messages routes (the caller checked the key: ``x-api-key`` or Bearer).

    ``router`` provides ``generate(req)``, ``models()`` and ``recently_seen(model)``;
    ``claude_model``: the mesh model ``claude-*`` ids map to (None: the largest)."""

    def __init__(self, router: RouterApi, *, claude_model: str | None = None, moa: MoaApi | None = None):
        self.router = router
        self.claude_model = claude_model
        self.moa = moa  # model "mesh" (docs/moa.md); None: no mesh model

    async def handle(self, request: Request) -> Response | StreamResponse:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return error_response(exc)
        except RecursionError:
            return error_response(bad("request body nests too deeply", None, "invalid_json"))

    async def _handle(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/")
        if path not in (MESSAGES_PATH, COUNT_PATH):
            raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")
        if request.method != "POST":
            raise ApiError(405, "use POST", "method_not_allowed")
        session = request.headers.get("x-session-id", "")
        if path == COUNT_PATH:
            return await self._count(self._resolved(parse_count_tokens_body(request.body)), session)
        raw = override_tool_choice(request.body, request.headers.get(TOOL_CHOICE_HEADER), "messages")
        call = self._resolved(parse_messages_body(raw))
        req = generation_request(call, new_id("msg"), session)
        if call.stream:
            return await self._stream(call, req, request.nursery)
        return await self._complete(call, req)

    def _resolved(self, call: MessagesCall) -> MessagesCall:
        ids = [m.id for m in self.router.models()]
        model = resolve_model(call.model, ids, self.claude_model)
        if self.moa is not None and self.moa.handles(model):
            return dataclasses.replace(call, model=model)
        if model not in ids and not self.router.recently_seen(model):
            raise ApiError(404, f"model {call.model!r} does not exist (available: {', '.join(ids) or 'none'}; "
                                "claude-* names map to the largest)", "model_not_found", "model")
        return dataclasses.replace(call, model=model)

    async def _count(self, call: MessagesCall, session: str) -> Response:
        """The prompt's tokens as the host renders them: a one-token generation's ``prompt_tokens``
        (the host's prefix cache keeps the prompt for the request that follows)."""
        req = generation_request(call, new_id("count"), session)
        try:
            out = await complete_chat(self.router, req)
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        return Response.json(200, {"input_tokens": out.usage.get("prompt_tokens", 0)})

    def _stop(self, call: MessagesCall, finish: str, entries: list[TokenLogprob]) -> str | None:
        if finish != "stop" or not call.stop_sequences:
            return None
        return matched_stop(_generated_text(entries), call.stop_sequences)

    async def _complete(self, call: MessagesCall, req: GenerationRequest) -> Response:
        headers: list[tuple[str, str]] | None = None
        try:
            if self.moa is not None and self.moa.handles(req.model):
                out, _, headers = await self.moa.answer(req)  # the mixture of agents' answer
            else:
                out = await complete_chat(self.router, req)
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        stop = self._stop(call, out.finish_reason, out.logprobs)
        body = message_body(req.request_id, call.model, out.content, out.tool_calls,
                            stop_reason(out.finish_reason, stop), stop, usage_body(out.usage))
        return Response.json(200, body, headers if headers is not None else served_by_header(out.served_by))

    async def _stream(self, call: MessagesCall, req: GenerationRequest,
                      nursery: trio.Nursery | None) -> StreamResponse:
        # Open the generation before answering 200, so routing errors get a proper status.
        events, close, headers = await open_chat_events(self.router, self.moa, req, nursery)
        builder = MessageEventStream(req.request_id, call.model)

        async def body() -> AsyncGenerator[bytes, None]:
            entries: list[TokenLogprob] = []
            try:
                for ev in builder.start():
                    yield sse(ev)
                async with aclosing(events()) as stream:
                    async for _, ev in stream:
                        out: list[dict] = []
                        if isinstance(ev, ContentDelta):
                            entries.extend(ev.logprobs)
                            out = builder.text_delta(ev.text)
                        elif isinstance(ev, ToolCallStart):
                            out = builder.call_start(ev)
                        elif isinstance(ev, ToolCallArguments):
                            out = builder.call_arguments(ev.text)
                        elif isinstance(ev, ToolCallDelta):
                            out = builder.tool_call(ev.call)
                        elif isinstance(ev, ChatDone):
                            stop = self._stop(call, ev.finish_reason, entries)
                            out = builder.finish(stop_reason(ev.finish_reason, stop), stop, usage_body(ev.usage))
                        for e in out:
                            yield sse(e)
            except GenerationError as exc:
                for e in builder.fail(exc.message, exc.status):
                    yield sse(e)
            finally:
                await close()

        def interrupted(reason: str) -> bytes:
            return b"".join(sse(e) for e in builder.fail(f"stream ended: {reason}", 503))

        return StreamResponse(200, body(), on_interrupt=interrupted, finalizer=close, headers=headers)

