"""The OpenAI-compatible API: request parsing, responses, SSE chunks, error bodies.

Parsing is pure (JSON body -> :class:`GenerationRequest` or :class:`ApiError`);
the handler drives a generation through the router and formats it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import secrets
import time

import trio

from hydra_node.api.http import Request, Response, StreamResponse
from hydra_node.inference import (Finished, GenerationError, GenerationRequest, InvalidRequest, TextDelta)

log = logging.getLogger("hydra.api")

_ROLES = ("system", "user", "assistant", "tool", "developer")
#: Largest accepted chat history, in messages.
MAX_MESSAGES = 4096


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
             409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             499: "request_cancelled"}

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.retry_after = status, message, code, param, retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> Response:
        headers = []
        if self.retry_after is not None:
            headers.append(("retry-after", str(max(1, math.ceil(self.retry_after)))))
        return Response.json(self.status, self.body(), headers)

    @classmethod
    def from_generation(cls, exc: GenerationError) -> "ApiError":
        return cls(exc.status, exc.message, exc.code, retry_after=exc.retry_after)


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code, param)


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"'{key}' must be a number", key, "invalid_type")
    return float(v)


def _content_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):  # [{"type": "text", "text": "..."}]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or an array of text parts", f"messages[{i}].content",
               "invalid_type")


def parse_request(raw: bytes, kind: str) -> tuple[GenerationRequest, bool, bool]:
    """Parse a chat or completion body. Returns (request, stream, include_usage_in_stream)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", None, "invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model", "missing_required_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    opts = body.get("stream_options") or {}
    include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    n = body.get("n", 1)
    if n != 1:
        raise _bad("only n = 1 is supported", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise _bad("'max_tokens' must be an integer", "max_tokens", "invalid_type")
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise _bad("'stop' must be a string or an array of strings", "stop", "invalid_type")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad("'seed' must be an integer", "seed", "invalid_type")
    fields = dict(model=model, max_tokens=max_tokens, temperature=_number(body, "temperature", 0.8),
                  top_p=_number(body, "top_p", 0.95), stop=stop, seed=seed,
                  request_id=("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12))
    for key in ("session_id", "prompt_cache_key", "user"):  # routing affinity key, if the client sent one
        if isinstance(body.get(key), str) and body[key]:
            fields["session"] = body[key]
            break
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _bad("'messages' must be a non-empty array", "messages",
                       "missing_required_parameter" if msgs is None else "invalid_type")
        if len(msgs) > MAX_MESSAGES:
            raise _bad(f"'messages' has more than {MAX_MESSAGES} entries", "messages")
        parsed = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise _bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
            role = m.get("role")
            if role not in _ROLES:
                raise _bad(f"messages[{i}].role must be one of {', '.join(_ROLES)}", f"messages[{i}].role")
            parsed.append(("system" if role == "developer" else role, _content_text(m.get("content"), i)))
        fields["messages"] = tuple(parsed)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("'prompt' must be a string", "prompt",
                       "missing_required_parameter" if prompt is None else "invalid_type")
        fields["prompt"] = prompt
    try:
        req = GenerationRequest(kind=kind, **fields)
    except InvalidRequest as exc:
        raise _bad(exc.message, exc.param) from None
    return req, stream, include_usage


def _usage(fin: Finished) -> dict:
    return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
            "total_tokens": fin.prompt_tokens + fin.completion_tokens}


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class OpenAIApi:
    """Routes for :9337.  ``router`` provides ``generate(req)`` and ``models()``."""

    def __init__(self, router, *, api_key: str | None = None, on_request=None):
        self.router = router
        self.api_key = api_key
        self.on_request = on_request  # callback(path, status) for counters

    async def handle(self, request: Request) -> Response | StreamResponse:
        try:
            resp = await self._route(request)
        except ApiError as exc:
            resp = exc.response()
        if self.on_request is not None:
            self.on_request(request.path, resp.status)
        return resp

    def _check_auth(self, request: Request) -> None:
        if not request.bearer_matches(self.api_key):
            raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')", "invalid_api_key")

    async def _route(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/health", "/healthz"):
            return Response.json(200, {"status": "ok"})
        self._check_auth(request)
        if path in ("/v1/models", "/models"):
            if request.method != "GET":
                raise ApiError(405, "use GET", "method_not_allowed")
            return Response.json(200, self.models_body())
        if path in ("/v1/chat/completions", "/v1/completions"):
            if request.method != "POST":
                raise ApiError(405, "use POST", "method_not_allowed")
            kind = "chat" if path.endswith("chat/completions") else "completion"
            req, stream, include_usage = parse_request(request.body, kind)
            session = request.headers.get("x-session-id", "")
            if session:  # routing affinity (docs/scheduler.md); the header wins over the body's user
                req = dataclasses.replace(req, session=session)
            self._check_model(req.model)
            if stream:
                return await self._stream(req, include_usage)
            return await self._complete(req)
        raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")

    def models_body(self) -> dict:
        now = int(time.time())
        return {"object": "list", "data": [
            {"id": m.id, "object": "model", "created": now, "owned_by": "hydra", "hosts": m.hosts,
             "states": m.states} for m in self.router.models()]}

    def _check_model(self, model: str) -> None:
        if model not in {m.id for m in self.router.models()} and not self.router.recently_seen(model):
            known = ", ".join(m.id for m in self.router.models()) or "none"
            raise ApiError(404, f"model {model!r} does not exist (available: {known})", "model_not_found", "model")

    async def _complete(self, req: GenerationRequest) -> Response:
        text: list[str] = []
        fin: Finished | None = None
        try:
            async with self.router.generate(req) as events:
                async for ev in events:
                    if isinstance(ev, TextDelta):
                        text.append(ev.text)
                    elif isinstance(ev, Finished):
                        fin = ev
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        if fin is None:
            raise ApiError(502, "the generation ended without a result", "incomplete_generation")
        created = int(time.time())
        content = "".join(text)
        if req.kind == "chat":
            body = {"id": req.request_id, "object": "chat.completion", "created": created, "model": req.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "logprobs": None, "finish_reason": fin.finish_reason}],
                    "usage": _usage(fin), "system_fingerprint": fin.served_by or None}
        else:
            body = {"id": req.request_id, "object": "text_completion", "created": created, "model": req.model,
                    "choices": [{"index": 0, "text": content, "logprobs": None, "finish_reason": fin.finish_reason}],
                    "usage": _usage(fin)}
        return Response.json(200, body, [("x-hydra-served-by", fin.served_by)] if fin.served_by else [])

    async def _stream(self, req: GenerationRequest, include_usage: bool) -> StreamResponse | Response:
        created = int(time.time())
        chat = req.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, finish: str | None, role: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else (
                    {"content": delta_text} if delta_text is not None else {})
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
            return {"id": req.request_id, "object": obj, "created": created, "model": req.model,
                    "choices": [choice]}

        # Open the generation before answering 200, so routing errors get a proper status.
        cm = self.router.generate(req)
        try:
            events = await cm.__aenter__()
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None

        async def body():
            try:
                if chat:
                    yield _sse(chunk(None, None, role=True))
                async for ev in events:
                    if isinstance(ev, TextDelta):
                        yield _sse(chunk(ev.text, None))
                    elif isinstance(ev, Finished):
                        yield _sse(chunk(None, ev.finish_reason))
                        if include_usage:
                            yield _sse({"id": req.request_id, "object": obj, "created": created,
                                        "model": req.model, "choices": [], "usage": _usage(ev)})
                yield b"data: [DONE]\n\n"
            except GenerationError as exc:
                yield _sse(ApiError.from_generation(exc).body())
                yield b"data: [DONE]\n\n"
            finally:
                await close()

        closed = False

        async def close() -> None:
            # Leaving the generation always cancels it where it runs (bounded, shielded).
            nonlocal closed
            if not closed:
                closed = True
                with trio.CancelScope(shield=True):
                    await cm.__aexit__(None, None, None)

        def interrupted(reason: str) -> bytes:
            return _sse(ApiError(503, f"stream ended: {reason}", "node_shutting_down").body()) + b"data: [DONE]\n\n"

        return StreamResponse(200, body(), on_interrupt=interrupted, finalizer=close)
