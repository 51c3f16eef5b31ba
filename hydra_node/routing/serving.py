"""The host side of a peer's request stream: do the work while watching for the requester to leave."""

from __future__ import annotations

from typing import Awaitable, Callable

import trio

from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.wire.errors import LinkClosed, StreamReset

__all__ = ["serve_while_requester_stays"]


async def serve_while_requester_stays(stream: LinkStream, work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work`` (it answers on ``stream``) while reading the stream: a reset by the requester, or a
    lost link, cancels ``work`` at once (the generation or embedding stops where it runs). Returns True
    when the requester left before the answer was complete."""
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            try:
                while await stream.receive():
                    pass  # the requester sends nothing after its request; anything else is ignored
            except (StreamReset, LinkClosed):
                gone = True
                nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        try:
            await work()
        except (StreamReset, LinkClosed):
            gone = True
        nursery.cancel_scope.cancel()
    return gone
