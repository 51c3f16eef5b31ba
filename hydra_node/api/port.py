"""The inference port (:9337): ``/health``, the API key, and each path to the dialect that serves it.

The composition root builds every dialect (OpenAI, Responses, Anthropic's Messages, embeddings) and
hands them here as ``(path, handler)`` pairs: a request for ``path`` or ``path/...`` goes to that
handler. Every :class:`ApiError` a handler raises becomes its JSON error response here, once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from hydra_node.api.body import MAX_JSON_DEPTH
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.images import IMAGE_PATHS, TEXT_BODY_BYTES
from hydra_node.http.guard import key_matches
from hydra_node.http.server import Request, Response, StreamResponse

__all__ = ["Handler", "InferencePort"]

Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


class InferencePort:
    """Routes for :9337.  ``health()``: ``(status, body)`` for ``/health`` (the node's: degraded while a
    model failed); ``on_request(path, status)``: counts every answer."""

    def __init__(
        self,
        routes: Sequence[tuple[str, Handler]],
        *,
        api_key: str | None = None,
        health: Callable[[], tuple[int, dict]] | None = None,
        on_request: Callable[[str, int], None] | None = None,
    ):
        self.routes = tuple(routes)
        self.api_key = api_key
        self.health = health
        self.on_request = on_request

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

    async def _route(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/health", "/healthz"):
            return Response.json(*(self.health() if self.health is not None else (200, {"status": "ok"})))
        if not key_matches(request.headers, self.api_key):
            raise ApiError(
                401,
                "missing or invalid API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
                "invalid_api_key",
            )
        if len(request.body) > TEXT_BODY_BYTES and path not in IMAGE_PATHS:  # only chats carry images
            raise ApiError(413, f"request body exceeds {TEXT_BODY_BYTES} bytes", "request_too_large")
        for prefix, handler in self.routes:
            if path == prefix or path.startswith(prefix + "/"):
                return await handler(request)
        raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")
