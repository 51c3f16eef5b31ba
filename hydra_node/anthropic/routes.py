"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API on :9337.

Built like ``/v1/responses``: the body is parsed into the shared chat vocabulary
(:mod:`anthropic_request`), tools become the same grammars as on ``/v1/chat/completions``
(:mod:`hydra_node.grammar.constraints`: ``any`` and a named ``tool`` force a call, ``auto`` gets the lazy
grammar), the generation runs through :mod:`hydra_node.api.chat` (tool calls parsed back, streamed
as they are generated) and the answer is shaped by :mod:`anthropic_format`. Errors are
Anthropic-shaped. Model ids: :mod:`anthropic_models`. What is supported: docs/agents.md.

``thinking`` and ``output_config.effort`` become the reasoning fields for the model
(:func:`reasoning_fields`; docs/reasoning.md), refused naming the model where it does not reason.

``stop_sequences`` are cut by the host's runner like OpenAI's ``stop``; to tell which one ended
the answer (``stop_reason: "stop_sequence"`` and ``stop_sequence``), such a request also asks the
host for per-token entries (``logprobs``), whose bytes are every token generated, the stop's own
tokens included; the entries are not shown to the client.
"""

from __future__ import annotations

import dataclasses

import trio

from hydra_node.grammar import constraints as grammar  # built on the API node, enforced by the host's sampler
from hydra_node.anthropic.format import (
    MessageEventStream,
    MessageStreamFormatter,
    error_response,
    message_body,
    new_id,
    stop_reason,
    stop_sequence,
    usage_body,
)
from hydra_node.anthropic.models import resolve_model
from hydra_node.anthropic.request import MessagesCall, parse_count_tokens_body, parse_messages_body
from hydra_node.api.answer import stream_answer
from hydra_node.api.chat import complete_chat
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.moa.answers import MoaApi, caps_of, complete_answer, open_chat_events
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.images import ImagePolicy, check_body_size, refuse_mesh_images, resolve_images
from hydra_node.api.reasoning import effort_fields, thinking_fields
from hydra_node.api.router_api import RouterApi
from hydra_node.api.tool_choice_header import TOOL_CHOICE_HEADER, override_tool_choice
from hydra_node.inference import NO_CAPS, GenerationError, GenerationRequest, InvalidRequest, ModelCaps

__all__ = ["MessagesApi", "generation_request", "reasoning_fields"]

MESSAGES_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"


def reasoning_fields(call: MessagesCall, caps: ModelCaps) -> dict:
    """The request fields of ``thinking`` and ``output_config.effort`` for a model that can do
    ``caps``: ``enabled`` sets the budget (refused on a model that does not reason); ``disabled``
    turns thinking off (nothing to turn off on a model that does not reason); ``adaptive`` or none
    leaves the model's default, which ``output_config.effort`` sets on a reasoning model."""
    if call.thinking == "enabled":
        fields = thinking_fields(caps, call.model, enabled=True, budget_tokens=call.budget_tokens)
        return fields | ({"reasoning_effort": call.effort} if call.effort else {})
    if not caps.reasons:
        return {}
    if call.thinking == "disabled":
        return thinking_fields(caps, call.model, enabled=False, budget_tokens=None)
    return effort_fields(caps, call.model, call.effort, param="output_config.effort")


def generation_request(
    call: MessagesCall, request_id: str, session: str = "", caps: ModelCaps = NO_CAPS
) -> GenerationRequest:
    """The chat generation serving ``call`` on a model that can do ``caps`` (tools -> grammars as
    on /v1/chat/completions)."""
    fields: dict = reasoning_fields(call, caps)
    try:
        if call.tools and call.tool_choice != "none":
            fields["grammar"] = grammar.tool_call_grammar(
                call.tools, name=call.tool_name or None, parallel=call.parallel_tool_calls
            )
            if call.tool_choice == "auto":
                fields["grammar_triggers"] = (grammar.TOOL_CALL_TRIGGER,)
        return GenerationRequest(
            model=call.model,
            kind="chat",
            messages=call.messages,
            images=call.images,
            max_tokens=call.max_tokens,
            temperature=call.temperature,
            top_p=call.top_p if call.top_p > 0 else 1.0,
            top_k=call.top_k,
            stop=call.stop_sequences,
            request_id=request_id,
            session=session or call.session,
            tools=call.tools,
            tool_choice=call.tool_choice,
            tool_name=call.tool_name,
            parallel_tool_calls=call.parallel_tool_calls,
            logprobs=bool(call.stop_sequences),
            **fields,
        )
    except InvalidRequest as exc:
        raise bad(exc.message, exc.param) from None


class MessagesApi:
    """Serves the Messages routes (the caller checked the key: ``x-api-key`` or Bearer).

    ``router`` provides ``generate(req)``, ``models()`` and ``recently_seen(model)``;
    ``claude_model``: the mesh model ``claude-*`` ids map to (None: the largest)."""

    def __init__(
        self,
        router: RouterApi,
        *,
        claude_model: str | None = None,
        moa: MoaApi | None = None,
        images: ImagePolicy | None = None,
    ):
        self.router = router
        self.claude_model = claude_model
        self.moa = moa  # model "mesh" (docs/moa.md); None: no mesh model
        self.images = images if images is not None else ImagePolicy()  # image URLs (hydra_node/api/images.py)

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
            counted = self._resolved(parse_count_tokens_body(request.body))
            check_body_size(len(request.body), counted.images)
            return await self._count(counted, session)
        raw = override_tool_choice(request.body, request.headers.get(TOOL_CHOICE_HEADER), "messages")
        call = self._resolved(parse_messages_body(raw))
        check_body_size(len(request.body), call.images)
        req = await self._with_images(generation_request(call, new_id("msg"), session, self._caps(call)))
        if call.stream:
            return await self._stream(call, req, request.nursery)
        return await self._complete(call, req)

    async def _with_images(self, req: GenerationRequest) -> GenerationRequest:
        """``req`` with its images fetched, checked and converted here, before routing (docs/vision.md)."""
        if not req.images:
            return req
        if self.moa is not None and self.moa.handles(req.model):
            refuse_mesh_images(req.images)
        return await resolve_images(req, self.images)

    def _caps(self, call: MessagesCall) -> ModelCaps:
        """What the model can do, asked only when the request has reasoning controls."""
        if not call.thinking and not call.effort:
            return NO_CAPS
        return caps_of(self.router, self.moa, call.model)

    def _resolved(self, call: MessagesCall) -> MessagesCall:
        ids = [m.id for m in self.router.models()]
        model = resolve_model(call.model, ids, self.claude_model)
        if self.moa is not None and self.moa.handles(model):
            return dataclasses.replace(call, model=model)
        if model not in ids and not self.router.recently_seen(model):
            raise ApiError(
                404,
                f"model {call.model!r} does not exist (available: {', '.join(ids) or 'none'}; "
                "claude-* names map to the largest)",
                "model_not_found",
                "model",
            )
        return dataclasses.replace(call, model=model)

    async def _count(self, call: MessagesCall, session: str) -> Response:
        """The prompt's tokens as the host renders them: a one-token generation's ``prompt_tokens``
        (the host's prefix cache keeps the prompt for the request that follows)."""
        req = await self._with_images(generation_request(call, new_id("count"), session, self._caps(call)))
        try:
            out = await complete_chat(self.router, req)
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        return Response.json(200, {"input_tokens": out.usage.get("prompt_tokens", 0)})

    async def _complete(self, call: MessagesCall, req: GenerationRequest) -> Response:
        out, headers = await complete_answer(self.router, self.moa, req)  # model "mesh": the mixture's answer
        stop = stop_sequence(out.finish_reason, out.logprobs, call.stop_sequences)
        body = message_body(
            req.request_id,
            call.model,
            out.content,
            out.tool_calls,
            stop_reason(out.finish_reason, stop),
            stop,
            usage_body(out.usage),
            out.served_by_all,  # more than one host after a continuation (docs/api.md)
            out.reasoning,
            call.show_thinking,
        )
        return Response.json(200, body, headers)

    async def _stream(self, call: MessagesCall, req: GenerationRequest, nursery: trio.Nursery | None) -> StreamResponse:
        # Open the generation before answering 200, so routing errors get a proper status.
        events, close, headers = await open_chat_events(self.router, self.moa, req, nursery)
        fmt = MessageStreamFormatter(
            MessageEventStream(req.request_id, call.model, call.show_thinking), call.stop_sequences
        )
        return stream_answer(events, fmt, close=close, headers=headers)
