"""A handler that returns while its peer is still sending: what it sent is delivered before the reset."""

from __future__ import annotations

import pytest
import trio

from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.wire.errors import StreamReset

PAYLOAD = b"x" * 200_000  # more than one DATA chunk: still queued when the handler returns


async def answer_and_return(link, header, stream) -> None:
    await stream.send(PAYLOAD)
    await stream.send(b"final error event")
    await stream.send_eof()  # and return at once: the requester never half-closes


@pytest.mark.parametrize("rounds", [5])
async def test_last_bytes_reach_the_peer_before_the_reset(
    rounds, mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, url = await start_listener(nursery, member_settings(mesh, on_stream=answer_and_return))
            async with open_link(url, member_settings(mesh)) as link:
                for _ in range(rounds):
                    got = b""
                    try:
                        async with link.open_stream({"kind": "ask"}) as stream:
                            while chunk := await stream.receive():
                                got += chunk
                    except StreamReset:
                        pass  # after everything sent: the handler's side is gone
                    assert got == PAYLOAD + b"final error event"
            nursery.cancel_scope.cancel()
