"""The management API and console on :3131 (``/api/status``, ``/health``, ``/``).

The composition root (``hydra_node/node.py``) hands it what it serves: a ``healthy()`` and a
``status()`` callable and the table of further routes (``(method, path)`` → handler; a path
ending in ``/*`` matches any suffix), built there from the services' handlers.
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
    def __init__(self, *, healthy: Callable[[], bool], status: Callable[[], Mapping[str, Any]],
                 routes: Mapping[tuple[str, str], Handler], headless: bool, api_key: str | None = None):
        self.healthy = healthy
        self.status = status
        self.routes = routes
        self.headless = headless
        self.api_key = api_key

    async def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path in ("/health", "/healthz"):
            ok = self.healthy()
            return Response.json(200 if ok else 503, {"status": "ok" if ok else "degraded"})
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
