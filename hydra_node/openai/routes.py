"""The OpenAI-compatible API on :9337: routes, and chat/completion answers (whole or streamed).

Parsing is pure (:mod:`hydra_node.openai.parse`: body -> requests or a 400 naming the
parameter); running a chat is :mod:`hydra_node.api.chat`; several choices at once
(``n``, several prompts) is :mod:`hydra_node.api.fanout`; the shapes are
:mod:`hydra_node.openai.format`. ``/v1/embeddings`` is :mod:`hydra_node.openai.embeddings`;
``/v1/responses`` and ``/v1/messages`` are their own dialects, and :mod:`hydra_node.api.port` hands
each path to its dialect. docs/api.md is the compatibility table.

As llama-server does, the routes are also served without ``/v1`` (``/chat/completions``,
``/completions``, ``/models``); llama-server's own routes (``/tokenize``, ``/detokenize``,
``/infill``) are :mod:`hydra_node.openai.llama_server`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from urllib.parse import unquote

import trio

from hydra_node.api.answer import stream_answer
from hydra_node.api.chat import sum_usage
from hydra_node.api.errors import ApiError
from hydra_node.api.fanout import StreamFanOut, run_all
from hydra_node.api.images import ImagePolicy, check_body_size, refuse_mesh_images, resolve_images
from hydra_node.api.router_api import RouterApi
from hydra_node.api.tool_choice_header import TOOL_CHOICE_HEADER, override_tool_choice
from hydra_node.http.messages import served_by_header
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.inference import GenerationError, GenerationRequest, ModelCaps
from hydra_node.moa.answers import MoaApi, caps_of
from hydra_node.openai.format import ChunkMaker, ChunkStream, chat_choice, completion_choice, openai_usage
from hydra_node.openai.moa_chat import MoaChat
from hydra_node.openai.parse import ParsedBody, expand, parse_body
from hydra_node.openai.thinking import THINK_TAGS, Tags, tags_of

__all__ = ["OpenAIApi"]

log = logging.getLogger("hydra.api")

_MODELS_PREFIXES = ("/v1/models/", "/models/")
#: The generation routes, each with and without ``/v1`` (llama-server serves both).
GENERATE_PATHS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "completion",
    "/completions": "completion",
}


class OpenAIApi:
    """``/v1/models``, ``/v1/models/{id}``, ``/v1/chat/completions`` and ``/v1/completions``.

    ``router`` provides ``generate(req)``, ``models()`` and ``recently_seen(id)``; ``moa``: the
    mixture of agents behind ``model: "mesh"`` (None: no mesh model); ``images``: how a chat's
    image URLs are fetched (hydra_node/api/images.py)."""

    def __init__(self, router: RouterApi, *, moa: MoaApi | None = None, images: ImagePolicy | None = None):
        self.router = router
        self.moa = moa
        self.images = images if images is not None else ImagePolicy()
        self.moa_chat = MoaChat(moa) if moa is not None else None

    async def handle(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/v1/models", "/models"):
            _method(request, "GET")
            return Response.json(200, self.models_body())
        if path.startswith(_MODELS_PREFIXES):
            _method(request, "GET")
            return Response.json(200, self.model_body(path.split("/models/", 1)[1]))
        if path in GENERATE_PATHS:
            _method(request, "POST")
            return await self._generate(request, GENERATE_PATHS[path])
        raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")

    # ---- models ---------------------------------------------------------------------------
    def models_body(self) -> dict:
        now = int(time.time())
        mesh = self.moa.model_obj(now) if self.moa is not None else None
        return {
            "object": "list",
            "data": [self._model_obj(m, now) for m in self.router.models()] + ([mesh] if mesh else []),
        }

    @staticmethod
    def _model_obj(m, now: int) -> dict:
        return {
            "id": m.id,
            "object": "model",
            "created": now,
            "owned_by": "hydra",
            "hosts": m.hosts,
            "states": m.states,
            "caps": m.caps.to_wire(),  # what the model can do (docs/api.md): reasoning, fim; {} = plain
        }

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

    def served(self) -> list[str]:
        """The ids a body without ``model`` may mean (it is served when there is exactly one)."""
        return [m.id for m in self.router.models()]

    def caps(self, model: str) -> ModelCaps:
        """What ``model`` can do: the mixture's for ``mesh`` (it reasons when a member does)."""
        return caps_of(self.router, self.moa, model)

    def tags(self, model: str) -> Tags:
        """Where ``model``'s thoughts start and end in its text."""
        return tags_of(self.caps(model))

    def check_model(self, model: str) -> None:
        if model not in {m.id for m in self.router.models()} and not self.router.recently_seen(model):
            known = ", ".join(m.id for m in self.router.models()) or "none"
            raise ApiError(404, f"model {model!r} does not exist (available: {known})", "model_not_found", "model")

    # ---- chat and completions -------------------------------------------------------------
    async def _generate(self, request: Request, kind: str) -> Response | StreamResponse:
        raw = override_tool_choice(request.body, request.headers.get(TOOL_CHOICE_HEADER), "chat")  # agents
        parsed = parse_body(raw, kind, served=self.served(), caps=self.caps)
        check_body_size(len(request.body), parsed.request.images)
        session = request.headers.get("x-session-id", "")
        if session:  # routing affinity (docs/scheduler.md); the header wins over the body's user
            parsed = dataclasses.replace(
                parsed, requests=tuple(dataclasses.replace(r, session=session) for r in parsed.requests)
            )
        if self.moa is not None and self.moa.handles(parsed.request.model):
            assert self.moa_chat is not None
            refuse_mesh_images(parsed.request.images)
            return await self.moa_chat.answer(parsed, request.nursery)  # model "mesh" (docs/moa.md)
        self.check_model(parsed.request.model)
        if parsed.request.images:  # fetched, checked and converted here, before routing (docs/vision.md)
            parsed = dataclasses.replace(parsed, requests=(await resolve_images(parsed.request, self.images),))
        reqs = expand(parsed)
        if parsed.stream:
            return await self._stream(parsed, reqs, request.nursery)
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
        usage = openai_usage(sum_usage(o.usage for o in outs))
        thoughts = any(o.reasoning for o in outs)
        tags = self.tags(req.model) if thoughts else THINK_TAGS
        if req.kind == "chat":
            inline_tags = tags if parsed.inline_reasoning else None
            body = {
                "id": req.request_id,
                "object": "chat.completion",
                "created": created,
                "model": req.model,
                "choices": [chat_choice(i, o, req.logprobs, inline_tags) for i, o in enumerate(outs)],
                "usage": usage,
                "system_fingerprint": served_by or None,
            }
        else:
            body = {
                "id": req.request_id,
                "object": "text_completion",
                "created": created,
                "model": req.model,
                "choices": [
                    completion_choice(i, o, self._echo_text(parsed, i), parsed.completion_logprobs, tags)
                    for i, o in enumerate(outs)
                ],
                "usage": usage,
                "system_fingerprint": served_by or None,
            }
        hosts = list(dict.fromkeys(h for o in outs for h in o.served_by_all))
        if len(hosts) > 1:  # a continuation served part of an answer: every host (docs/api.md)
            body["hydra_served_by"] = hosts
        return Response.json(200, body, served_by_header(served_by))

    async def _stream(
        self, parsed: ParsedBody, reqs: list[GenerationRequest], nursery: trio.Nursery | None
    ) -> StreamResponse:
        req, chat = parsed.request, parsed.request.kind == "chat"
        # Open every generation before answering 200, so routing errors get a proper status. The
        # generations run in the request's nursery: a client that leaves cancels them.
        fan = StreamFanOut(self.router, reqs, nursery)
        try:
            await fan.open()
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        chunks = ChunkMaker(
            req.request_id,
            req.model,
            int(time.time()),
            chat,
            logprobs=req.logprobs,
            completion_top=parsed.completion_logprobs,
        )
        echo = [self._echo_text(parsed, k) or "" for k in range(len(reqs))] if parsed.echo else None
        inline = not chat or parsed.inline_reasoning  # a completion's text holds the thoughts

        def tags() -> Tags:
            return self.tags(req.model)

        fmt = ChunkStream(
            chunks,
            choices=len(reqs),
            include_usage=parsed.include_usage,
            echo=echo,
            inline_tags=tags if inline else None,
        )
        hosts = ",".join(dict.fromkeys(h for h in fan.served_by if h))  # each host once, in choice order
        return stream_answer(fan.events, fmt, close=fan.close, headers=served_by_header(hosts))


def _method(request: Request, method: str) -> None:
    if request.method != method:
        raise ApiError(405, f"use {method}", "method_not_allowed")
