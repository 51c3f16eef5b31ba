"""The OpenAI-compatible API on :9337: routes, and chat/completion answers (whole or streamed).

Parsing is pure (:mod:`hydra_node.api.openai_parse`: body -> requests or a 400 naming the
parameter); running a chat is :mod:`hydra_node.api.chat`; several choices at once
(``n``, several prompts) is :mod:`hydra_node.api.fanout`; the shapes are
:mod:`hydra_node.api.openai_format`. ``/v1/responses`` and ``/v1/embeddings`` have their own
handlers (:mod:`hydra_node.api.responses`, :mod:`hydra_node.api.embeddings`). docs/api.md is
the compatibility table.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import aclosing
from urllib.parse import unquote


from hydra_node.api.chat import ChatDone, ContentDelta, ToolCallArguments, ToolCallDelta, ToolCallStart
from hydra_node.api.embeddings import EmbeddingsApi
from hydra_node.api.fanout import StreamFanOut, run_all
from hydra_node.api.http import Request, Response, StreamResponse
from hydra_node.api.http_types import served_by_header
from hydra_node.api.moa_api import MoaApi
from hydra_node.api.openai_errors import ApiError, bad
from hydra_node.api.openai_format import (DONE, ChunkMaker, chat_choice, completion_choice, sse, sum_usage)
from hydra_node.api.openai_parse import MAX_JSON_DEPTH, ParsedBody, expand, parse_body, parse_request
from hydra_node.api.responses import ResponsesApi
from hydra_node.api.anthropic import MessagesApi
from hydra_node.api.http_guard import key_matches
from hydra_node.api.tool_choice_header import TOOL_CHOICE_HEADER, override_tool_choice
from hydra_node.inference import GenerationError, GenerationRequest

__all__ = ["ApiError", "OpenAIApi", "parse_request", "bad"]

log = logging.getLogger("hydra.api")

_MODELS_PREFIXES = ("/v1/models/", "/models/")


class OpenAIApi:
    """Routes for :9337.  ``router`` provides ``generate(req)``, ``models()`` and ``recently_seen(id)``."""

    def __init__(self, router, *, api_key: str | None = None, on_request=None, health=None, moa=None,
                 claude_model: str | None = None):
        """``health()``: ``(status, body)`` for ``/health`` (the node's: degraded while a model failed);
        ``moa``: the :class:`~hydra_node.api.moa.MixtureOfAgents` behind ``model: "mesh"`` (None: no mesh model);
        ``claude_model``: the model ``claude-*`` ids map to on /v1/messages (``[api] claude_model``; None: the largest)."""
        self.moa = MoaApi(moa) if moa is not None else None
        self.router = router
        self.health = health
        self.api_key = api_key
        self.on_request = on_request  # callback(path, status) for counters
        self.responses = ResponsesApi(router, moa=self.moa)
        self.embeddings = EmbeddingsApi(router)
        self.messages = MessagesApi(router, claude_model=claude_model, moa=self.moa)  # Anthropic's (docs/agents.md)

    async def handle(self, request: Request) -> Response | StreamResponse:
        try:
            resp = await self._route(request)
        except ApiError as exc:
            resp = exc.response()
        except RecursionError:  # a handler decoded a body nested deeper than Python's stack allows
            resp = bad(f"request body nests deeper than {MAX_JSON_DEPTH} levels", None, "invalid_json").response()
        if self.on_request is not None:
            self.on_request(request.path, resp.status)
        return resp

    def _check_auth(self, request: Request) -> None:
        if not key_matches(request.headers, self.api_key):
            raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                           "invalid_api_key")

    async def _route(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/health", "/healthz"):
            return Response.json(*(self.health() if self.health is not None else (200, {"status": "ok"})))
        self._check_auth(request)
        if path in ("/v1/models", "/models"):
            _method(request, "GET")
            return Response.json(200, self.models_body())
        if path.startswith(_MODELS_PREFIXES):
            _method(request, "GET")
            return Response.json(200, self.model_body(path.split("/models/", 1)[1]))
        if path in ("/v1/chat/completions", "/v1/completions"):
            _method(request, "POST")
            return await self._generate(request, "chat" if path.endswith("chat/completions") else "completion")
        for name, handler in (("/v1/responses", self.responses), ("/v1/embeddings", self.embeddings),
                              ("/v1/messages", self.messages)):
            if path == name or path.startswith(name + "/"):
                return await handler.handle(request)
        raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")

    # ---- models ---------------------------------------------------------------------------
    def models_body(self) -> dict:
        now = int(time.time())
        mesh = self.moa.model_obj(now) if self.moa is not None else None
        return {"object": "list", "data": [self._model_obj(m, now) for m in self.router.models()] + ([mesh] if mesh else [])}

    @staticmethod
    def _model_obj(m, now: int) -> dict:
        return {"id": m.id, "object": "model", "created": now, "owned_by": "hydra", "hosts": m.hosts,
                "states": m.states}

    def model_body(self, raw_id: str) -> dict:
        """``GET /v1/models/{id}``: the id is the rest of the path (ids may hold ``/``), raw or %-encoded."""
        by_id = {m.id: m for m in self.router.models()}
        mesh = self.moa.model_obj(int(time.time())) if self.moa and self.moa.handles(unquote(raw_id)) else None
        if mesh is not None:
            return mesh
        for candidate in (raw_id, unquote(raw_id)):
            if candidate in by_id:
                return self._model_obj(by_id[candidate], int(time.time()))
        raise ApiError(404, f"The model {unquote(raw_id)!r} does not exist", "model_not_found", "model")

    def _check_model(self, model: str) -> None:
        if model not in {m.id for m in self.router.models()} and not self.router.recently_seen(model):
            known = ", ".join(m.id for m in self.router.models()) or "none"
            raise ApiError(404, f"model {model!r} does not exist (available: {known})", "model_not_found", "model")

    # ---- chat and completions -------------------------------------------------------------
    async def _generate(self, request: Request, kind: str) -> Response | StreamResponse:
        raw = override_tool_choice(request.body, request.headers.get(TOOL_CHOICE_HEADER), "chat")  # agents
        parsed = parse_body(raw, kind)
        session = request.headers.get("x-session-id", "")
        if session:  # routing affinity (docs/scheduler.md); the header wins over the body's user
            parsed = dataclasses.replace(parsed, requests=tuple(
                dataclasses.replace(r, session=session) for r in parsed.requests))
        if self.moa is not None and self.moa.handles(parsed.request.model):
            return await self.moa.chat(parsed)  # model "mesh": the mixture of agents (docs/moa.md)
        self._check_model(parsed.request.model)
        reqs = expand(parsed)
        if parsed.stream:
            return await self._stream(parsed, reqs)
        return await self._complete(parsed, reqs)

    def _echo_text(self, parsed: ParsedBody, index: int) -> str | None:
        return parsed.requests[index // parsed.n].prompt if parsed.echo else None

    async def _complete(self, parsed: ParsedBody, reqs: list[GenerationRequest]) -> Response:
        try:
            outs = await run_all(self.router, reqs)
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        req, created = parsed.request, int(time.time())
        served_by = outs[0].served_by
        usage = sum_usage(o.usage for o in outs)
        if req.kind == "chat":
            body = {"id": req.request_id, "object": "chat.completion", "created": created, "model": req.model,
                    "choices": [chat_choice(i, o, req.logprobs) for i, o in enumerate(outs)],
                    "usage": usage, "system_fingerprint": served_by or None}
        else:
            body = {"id": req.request_id, "object": "text_completion", "created": created, "model": req.model,
                    "choices": [completion_choice(i, o, self._echo_text(parsed, i), parsed.completion_logprobs)
                                for i, o in enumerate(outs)], "usage": usage}
        return Response.json(200, body, served_by_header(served_by))

    async def _stream(self, parsed: ParsedBody, reqs: list[GenerationRequest]) -> StreamResponse:
        req, chat = parsed.request, parsed.request.kind == "chat"
        # Open every generation before answering 200, so routing errors get a proper status.
        fan = StreamFanOut(self.router, reqs)
        try:
            await fan.open()
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        chunks = ChunkMaker(req.request_id, req.model, int(time.time()), chat, logprobs=req.logprobs,
                            completion_top=parsed.completion_logprobs)

        async def body():
            try:
                for k in range(len(reqs)):
                    if chat:
                        yield chunks.role(k)
                    elif parsed.echo:
                        yield chunks.text(k, self._echo_text(parsed, k) or "")
                usages = []
                async with aclosing(fan.events()) as events:
                    async for k, ev in events:
                        if isinstance(ev, ContentDelta):
                            yield chunks.text(k, ev.text, ev.logprobs)
                        elif isinstance(ev, ToolCallStart):
                            yield chunks.tool_call_start(k, ev)
                        elif isinstance(ev, ToolCallArguments):
                            yield chunks.tool_call_arguments(k, ev.index, ev.text)
                        elif isinstance(ev, ToolCallDelta) and not ev.call.streamed:  # streamed: already sent
                            yield chunks.tool_call(k, ev.call)
                        elif isinstance(ev, ChatDone):
                            usages.append(ev.usage)
                            yield chunks.finish(k, ev.finish_reason, ev.served_by)
                if parsed.include_usage:
                    yield chunks.usage(sum_usage(usages))
                yield DONE
            except GenerationError as exc:
                yield sse(ApiError.from_generation(exc).body())
                yield DONE
            finally:
                await fan.close()

        def interrupted(reason: str) -> bytes:
            return sse(ApiError(503, f"stream ended: {reason}", "node_shutting_down").body()) + DONE

        hosts = ",".join(dict.fromkeys(h for h in fan.served_by if h))  # each host once, in choice order
        return StreamResponse(200, body(), on_interrupt=interrupted, finalizer=fan.close,
                              headers=served_by_header(hosts))


def _method(request: Request, method: str) -> None:
    if request.method != method:
        raise ApiError(405, f"use {method}", "method_not_allowed")
