"""Before authentication a listener holds little per connection (issue 14 items 5 and 6, mesh side):
handshake-sized websocket messages only, a short handshake deadline, handshake slots per source
address, and a foreign-mesh refusal that does not name our mesh."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio_websocket

from hydra_node.mesh.link.endpoints import (
    ACCEPT_HANDSHAKE_TIMEOUT_S,
    HANDSHAKE_WS_MESSAGE_BYTES,
    MAX_HANDSHAKES_PER_ADDRESS,
    connect_link,
)
from hydra_node.mesh.wire.errors import RejectedByPeer
from hydra_node.mesh.wire.ids import MeshSecret
from waiting import wait_until

TIMEOUT_S = 30


async def _raw_ws(nursery: trio.Nursery, port: int, source: str = "127.0.0.1") -> trio_websocket.WebSocketConnection:
    """A websocket to the listener that never says hello (from ``source``, any 127/8 address)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    return await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", "/")


async def test_a_big_message_before_authentication_is_refused(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh))
            ws = await _raw_ws(nursery, listener.port)
            await ws.send_message(b"\x00" * (HANDSHAKE_WS_MESSAGE_BYTES + 1))  # far below the 8 MiB frame bound
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason.code == 1009  # message too big
            nursery.cancel_scope.cancel()


async def test_stalled_hellos_hold_slots_of_their_own_address_only_and_expire(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh))
            stalled = [
                await _raw_ws(nursery, listener.port, "127.0.0.2") for _ in range(MAX_HANDSHAKES_PER_ADDRESS + 3)
            ]
            await wait_until(lambda: listener.statistics().handshake_failures.get("busy", 0) >= 3)
            # another address (127.0.0.1) still gets in while those stall
            link = await nursery.start(partial(connect_link, url, member_settings(mesh)))
            await link.aclose("done", "")
            start = trio.current_time()
            await wait_until(
                lambda: (
                    listener.statistics().handshake_failures.get("handshake_timeout", 0) >= MAX_HANDSHAKES_PER_ADDRESS
                )
            )
            assert trio.current_time() - start <= ACCEPT_HANDSHAKE_TIMEOUT_S + 1
            del stalled
            nursery.cancel_scope.cancel()


async def test_the_foreign_mesh_refusal_does_not_name_our_mesh(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh))
            with pytest.raises(RejectedByPeer) as info:
                await nursery.start(connect_link, url, member_settings(MeshSecret.generate()))
            assert info.value.code == "foreign_mesh" and mesh.mesh_id not in str(info.value)
            nursery.cancel_scope.cancel()
