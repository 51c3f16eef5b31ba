"""``POST /v1/responses``: the subset of OpenAI's Responses API the OpenAI Agents SDK uses.

The request is parsed (:mod:`responses_request`), turned into a chat :class:`GenerationRequest`
(:mod:`responses_constraints`: tools and text formats become grammars), run through the chat
machinery (:mod:`hydra_node.api.chat`: tool calls parsed back) and answered as a response
object (:mod:`responses_output`) or as typed server-sent events (:mod:`responses_stream`).
Finished responses are kept in a bounded store (:mod:`responses_store`) for
``previous_response_id`` and ``GET /v1/responses/{id}`` (whole, or with ``stream=true`` replayed
as the events of a stream: :func:`stored_events`). What is supported and what is refused:
docs/responses.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator, Callable

import trio

from hydra_node.api.answer import nothing_to_close, stream_answer
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.moa.answers import MoaApi, caps_of, complete_answer, open_chat_events
from hydra_node.api.errors import ApiError
from hydra_node.api.images import ImagePolicy, check_body_size, refuse_mesh_images, resolve_images
from hydra_node.api.router_api import RouterApi
from hydra_node.responses.constraints import generation_request
from hydra_node.responses.output import (
    conversation_after,
    new_id,
    output_items,
    response_body,
    response_status,
    usage_body,
)
from hydra_node.responses.request import LOGPROBS_INCLUDE, ResponsesCall, parse_responses_body
from hydra_node.responses.store import ResponsesStore
from hydra_node.responses.stream import ResponseEventStream, ResponseStreamFormatter, sse, stored_events
from hydra_node.inference import NO_CAPS, GenerationRequest

__all__ = ["GET_INCLUDES", "ResponsesApi", "retrieve_options"]

#: ``include`` values a ``GET`` accepts: a stored response is returned as it was made, with the
#: logprobs its request asked for (there is nothing more to include: no encrypted reasoning).
GET_INCLUDES = ("reasoning.encrypted_content", LOGPROBS_INCLUDE)


def _query_bool(query: dict, key: str) -> bool | None:
    v = query.get(key)
    if v is None:
        return None
    if v not in ("true", "false"):
        raise ApiError(400, f"query parameter '{key}' must be true or false", "invalid_value", key)
    return v == "true"


def retrieve_options(query: dict) -> tuple[bool, int | None]:
    """``(stream, starting_after)`` of a ``GET /v1/responses/{id}`` query; a 400 naming any
    parameter that is not honoured (docs/responses.md)."""
    for key in query:
        if key not in ("include", "include[]", "stream", "starting_after", "include_obfuscation"):
            raise ApiError(400, f"unknown query parameter '{key}'", "unknown_parameter", key)
    for key in ("include", "include[]"):
        if key in query and query[key] not in GET_INCLUDES:
            raise ApiError(
                400,
                f"query parameter 'include' may hold only {' and '.join(GET_INCLUDES)} (got {query[key]!r:.60})",
                "unsupported_parameter",
                "include",
            )
    if _query_bool(query, "include_obfuscation"):
        raise ApiError(
            400,
            "'include_obfuscation=true' is not supported: streams are never padded (send false, or leave it out)",
            "unsupported_parameter",
            "include_obfuscation",
        )
    stream = bool(_query_bool(query, "stream"))
    after = query.get("starting_after")
    if after is None:
        return stream, None
    if not stream:
        raise ApiError(400, "'starting_after' needs 'stream=true'", "invalid_value", "starting_after")
    if not after.isdigit() or len(after) > 18:
        raise ApiError(
            400, "'starting_after' must be a sequence number (an integer >= 0)", "invalid_value", "starting_after"
        )
    return stream, int(after)


class ResponsesApi:
    """Serves ``POST /v1/responses`` (the caller checks the API key first).

    ``router`` provides ``generate(req)``, ``models()`` and ``recently_seen(model)``."""

    def __init__(
        self,
        router: RouterApi,
        *,
        store: ResponsesStore | None = None,
        clock: Callable[[], float] = time.time,
        moa: MoaApi | None = None,
        images: ImagePolicy | None = None,
    ):
        self.router = router
        self.moa = moa  # model "mesh" (docs/moa.md); None: no mesh model
        self.images = images if images is not None else ImagePolicy()  # image URLs (hydra_node/api/images.py)
        self.store = store if store is not None else ResponsesStore()
        self._clock = clock

    async def handle(self, request: Request) -> Response | StreamResponse:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return exc.response()

    async def _handle(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/")
        if path != "/v1/responses":
            return self._stored(request, path.rsplit("/", 1)[-1] if path.count("/") == 3 else "")
        if request.method != "POST":
            raise ApiError(405, "use POST", "method_not_allowed")
        call = parse_responses_body(request.body, self.store.get)
        check_body_size(len(request.body), call.images)
        self._check_model(call.model)
        if self._mesh(call.model):
            refuse_mesh_images(call.images)
        resp_id = new_id("resp")
        created = int(self._clock())
        call = self._storable(call, resp_id, created)  # before any work on a response it cannot keep
        caps = NO_CAPS if call.reasoning_effort is None else caps_of(self.router, self.moa, call.model)
        req = generation_request(call, resp_id, request.headers.get("x-session-id", "") or call.session, caps)
        if req.images:  # fetched, checked and converted here, before routing (docs/vision.md)
            req = await resolve_images(req, self.images)
        if call.stream:
            return await self._stream(call, req, resp_id, created, request.nursery)
        return await self._complete(call, req, resp_id, created)

    def _stored(self, request: Request, resp_id: str) -> Response | StreamResponse:
        """``GET`` / ``DELETE /v1/responses/{id}`` on the bounded store."""
        if not resp_id:
            raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")
        if request.method not in ("GET", "DELETE"):
            raise ApiError(405, "use GET or DELETE", "method_not_allowed")
        if request.method == "DELETE" and request.query:
            key = min(request.query)
            raise ApiError(400, f"query parameter '{key}' is not supported on DELETE", "unsupported_parameter", key)
        stream, after = retrieve_options(request.query)
        found = self.store.lookup(resp_id)
        if found is None:
            raise ApiError(
                404,
                f"response {resp_id!r:.80} not found (never stored, created with store: false, "
                "or evicted from this node's bounded store)",
                "response_not_found",
            )
        if request.method == "DELETE":
            self.store.pop(resp_id)
            return Response.json(200, {"id": resp_id, "object": "response", "deleted": True})
        if not stream:
            return Response(200, found.body_json)
        events = [e for e in stored_events(found.body) if after is None or e["sequence_number"] > after]
        return StreamResponse(200, _chunks([sse(e) for e in events]), finalizer=nothing_to_close)

    def _mesh(self, model: str) -> bool:
        return self.moa is not None and self.moa.handles(model)

    def _check_model(self, model: str) -> None:
        if self._mesh(model):
            return
        if model not in {m.id for m in self.router.models()} and not self.router.recently_seen(model):
            known = ", ".join(m.id for m in self.router.models()) or "none"
            raise ApiError(404, f"model {model!r} does not exist (available: {known})", "model_not_found", "model")

    def _storable(self, call: ResponsesCall, resp_id: str, created: int) -> ResponsesCall:
        """Refuse, before generating, a response the store could not keep: 400 when the request
        asked for ``store: true`` itself; otherwise it is answered with ``store: false``."""
        if not call.store:
            return call
        skeleton = response_body(call, resp_id, created, status="completed", output=[])
        size = self.store.size_of(call.history, skeleton)
        if size <= self.store.max_response_bytes:
            return call
        if call.store_asked:
            raise ApiError(
                400,
                f"this response cannot be stored: its input and echoed request fields (text.format, "
                f"tools, metadata) already take {size} bytes serialised, over this node's limit of "
                f"{self.store.max_response_bytes} bytes for one stored response "
                "(send 'store': false, or shrink the input or the schema)",
                "response_too_large_to_store",
                "store",
            )
        return dataclasses.replace(call, store=False)

    def _remember(self, call: ResponsesCall, body: dict) -> None:
        """Store a finished response; one its output made too large is answered ``store: false``."""
        if call.store and not self.store.put(body["id"], conversation_after(call, body["output"]), body):
            body["store"] = False

    async def _complete(self, call: ResponsesCall, req: GenerationRequest, resp_id: str, created: int) -> Response:
        out, headers = await complete_answer(self.router, self.moa, req)  # model "mesh": the mixture's answer
        output = output_items(
            out.content,
            out.tool_calls,
            out.finish_reason,
            logprobs=out.logprobs if call.logprobs else None,
            reasoning=out.reasoning,
        )
        for item, made in zip([o for o in output if o["type"] == "function_call"], out.tool_calls):
            if not made.complete:  # cut by max_output_tokens inside its arguments
                item["status"] = "incomplete"
        status, incomplete = response_status(out.finish_reason)
        body = response_body(
            call,
            resp_id,
            created,
            status=status,
            output=output,
            usage=usage_body(out.usage),
            incomplete=incomplete,
            served_by=out.served_by_all,  # more than one host after a continuation (docs/responses.md)
        )
        self._remember(call, body)
        return Response.json(200, body, headers)

    async def _stream(
        self, call: ResponsesCall, req: GenerationRequest, resp_id: str, created: int, nursery: trio.Nursery | None
    ) -> StreamResponse:
        # Open the generation before answering 200, so routing errors get a proper status.
        events, close, headers = await open_chat_events(self.router, self.moa, req, nursery)
        fmt = ResponseStreamFormatter(
            ResponseEventStream(call, resp_id, created), lambda final: self._remember(call, final)
        )
        return stream_answer(events, fmt, close=close, headers=headers)


async def _chunks(chunks: list[bytes]) -> AsyncGenerator[bytes, None]:
    for chunk in chunks:
        yield chunk
