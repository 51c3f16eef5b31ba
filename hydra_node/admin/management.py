"""The management API and console on :3131 (``/api/status``, ``/health``, ``/``, ``/console/*``).

The composition root (``hydra_node/node.py``) hands it what it serves: a ``health()`` (status code and body) and a
``status()`` callable, the OpenAI API's handler (``/v1/*`` is passed to it, for the console's chat
page) and the table of further routes (``(method, path)`` → handler; a path ending in ``/*``
matches any suffix), built there from the services' handlers.  The console's files
(``admin/assets.py``) are answered before the key check: they hold no data.

The HTTP server in front of it (``http/server.py`` with ``http/guard.py``, set up by the root)
refuses, before any handler runs: a foreign ``Host`` on loopback (DNS rebinding), and state
changes (POST/PUT/PATCH/DELETE) without ``Content-Type: application/json`` or from a foreign
``Origin`` (CSRF).  ``/api/status`` hands out no invite token: ``POST /api/invite`` mints one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hydra_node.admin.assets import PUBLIC_PATHS, ConsoleAssets
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.api.errors import ApiError

__all__ = ["Handler", "ManagementApi"]

Handler = Callable[[Request], Awaitable[Response | StreamResponse]]  # e.g. GET /api/events streams


class ManagementApi:
    def __init__(
        self,
        *,
        health: Callable[[], tuple[int, Mapping[str, Any]]],
        status: Callable[[], Mapping[str, Any]],
        routes: Mapping[tuple[str, str], Handler],
        headless: bool,
        api_key: str | None = None,
        console: ConsoleAssets | None = None,
        openai: Handler | None = None,
    ):
        self.health = health
        self.status = status
        self.routes = routes
        self.headless = headless
        self.api_key = api_key
        #: The web console's files (``admin/assets.py``); served without the key, 404 when headless.
        self.console = console if console is not None else ConsoleAssets(headless=headless)
        #: What the HTTP guard serves without the key: the console's files (they hold no data).
        self.public_paths = PUBLIC_PATHS
        #: The OpenAI API's handler: ``/v1/*`` here too, so the console's chat page stays on one origin.
        self.openai = openai

    async def handle(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/health", "/healthz"):
            status, body = self.health()
            return Response.json(status, body)
        page = self.console.respond(request.method, request.path, request.headers)
        if page is not None:
            return page
        if not request.bearer_matches(self.api_key):
            return ApiError(401, "missing or invalid API key", "invalid_api_key").response()
        if path == "/api/status" and request.method == "GET":
            return Response(200, json.dumps(self.status(), indent=None, default=str).encode())
        if self.openai is not None and path.startswith("/v1/"):
            return await self.openai(request)
        handler = self.routes.get((request.method, path))
        if handler is None:
            for (method, prefix), h in self.routes.items():
                if prefix.endswith("/*") and method == request.method and path.startswith(prefix[:-1]):
                    handler = h
                    break
        if handler is not None:
            return await handler(request)
        return ApiError(404, f"no route for {request.method} {request.path}", "not_found").response()
