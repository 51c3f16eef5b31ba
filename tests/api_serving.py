"""One API class (OpenAI, Responses, Messages...) served by a real ``HttpServer`` on loopback, as
the node's port does it: an :class:`ApiError` becomes its typed answer."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from hydra_node.api.errors import ApiError
from hydra_node.http.server import HttpServer, Request


@asynccontextmanager
async def serving(api):
    async def handler(request: Request):
        try:
            return await api.handle(request)
        except ApiError as exc:
            return exc.response()

    server = HttpServer(handler, "127.0.0.1", 0, "test")
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()
