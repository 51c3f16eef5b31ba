"""The management API and console on :3131 (``/api/status``, ``/health``, ``/``).

The composition root (``hydra_node/node.py``) hands it what it serves: a ``health()`` (status code and body) and a
``status()`` callable and the table of further routes (``(method, path)`` → handler; a path
ending in ``/*`` matches any suffix), built there from the services' handlers.

The HTTP server in front of it (``api/http.py`` with ``api/http_guard.py``, set up by the root)
refuses, before any handler runs: a foreign ``Host`` on loopback (DNS rebinding), and state
changes (POST/PUT/PATCH/DELETE) without ``Content-Type: application/json`` or from a foreign
``Origin`` (CSRF).  ``/api/status`` hands out no invite token: ``POST /api/invite`` mints one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hydra_node.api.http import Request, Response
from hydra_node.api.openai import ApiError

__all__ = ["Handler", "ManagementApi"]

Handler = Callable[[Request], Awaitable[Response]]

_CONSOLE = """<!doctype html><html><head><meta charset="utf-8"><title>Hydra node</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:60em}pre{background:#f4f4f4;padding:1em;overflow:auto}</style>
</head><body><h1>Hydra node</h1><p>The console is a placeholder: live status below, refreshed every 2 s.
The API is <code>/api/status</code>.</p><pre id="s">loading…</pre>
<script>async function r(){try{const s=await (await fetch('/api/status')).json();
document.getElementById('s').textContent=JSON.stringify(s,null,2)}catch(e){document.getElementById('s').textContent=String(e)}}
r();setInterval(r,2000)</script></body></html>"""


class ManagementApi:
    def __init__(self, *, health: Callable[[], tuple[int, Mapping[str, Any]]], status: Callable[[], Mapping[str, Any]],
                 routes: Mapping[tuple[str, str], Handler], headless: bool, api_key: str | None = None):
        self.health = health
        self.status = status
        self.routes = routes
        self.headless = headless
        self.api_key = api_key

    async def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path in ("/health", "/healthz"):
            status, body = self.health()
            return Response.json(status, body)
        if not request.bearer_matches(self.api_key):
            return ApiError(401, "missing or invalid API key", "invalid_api_key").response()
        if path == "/api/status" and request.method == "GET":
            return Response(200, json.dumps(self.status(), indent=None, default=str).encode())
        handler = self.routes.get((request.method, path))
        if handler is None:
            for (method, prefix), h in self.routes.items():
                if prefix.endswith("/*") and method == request.method and path.startswith(prefix[:-1]):
                    handler = h
                    break
        if handler is not None:
            return await handler(request)
        if path in ("/", "/dashboard") and request.method == "GET":
            if self.headless:
                return ApiError(404, "console disabled (--headless)", "not_found").response()
            return Response(200, _CONSOLE.encode(), "text/html; charset=utf-8")
        return ApiError(404, f"no route for {request.method} {request.path}", "not_found").response()
