"""A listener fed garbage (websocket messages, raw TCP, hostile handshakes) stays up and counts it."""

from __future__ import annotations

import random

import pytest
import trio
from nacl.bindings import crypto_scalarmult_base
from nacl.signing import SigningKey
from trio_websocket import ConnectionClosed, open_websocket_url

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.link.endpoints import connect_link, open_link
from hydra_node.mesh.wire.errors import GenerationMismatch, RejectedByPeer
from hydra_node.mesh.wire.handshake import Handshake, Reject, Welcome, parse_handshake_message
from hydra_node.mesh.link.peer_link import close_websocket
from waiting import wait_until

TIMEOUT_S = 30


async def _send_garbage(url: str, messages: list[bytes | str]) -> bytes | str | None:
    """Send messages on a raw websocket; return the listener's first reply, if any."""
    reply = None
    try:
        async with open_websocket_url(url, connect_timeout=5, disconnect_timeout=1) as ws:
            try:
                for message in messages:
                    await ws.send_message(message)
                with trio.move_on_after(2):
                    reply = await ws.get_message()
            finally:
                await close_websocket(ws)  # trio-websocket 0.12 leaks the socket when the server closes first
    except ConnectionClosed:
        pass
    return reply


async def test_listener_survives_garbage(mesh, member_settings, start_listener, autojump_clock) -> None:
    rng = random.Random(1234)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh, handshake_timeout_s=3))
            port = int(url.rsplit(":", 1)[1])
            cases: list[list[bytes | str]] = [[rng.randbytes(rng.randint(0, 300))] for _ in range(25)]
            cases += [["not binary"], [b""], [cbor.encode({"type": "hello"})], [cbor.encode([1, 2, 3])]]
            low_order = cbor.encode({"eph": bytes(32), "gen": 1, "mesh": mesh.mesh_id, "type": "hello"})
            good_hello = cbor.encode(
                {"eph": crypto_scalarmult_base(bytes([5]) * 32), "gen": 1, "mesh": mesh.mesh_id, "type": "hello"}
            )
            cases += [[low_order], [good_hello, rng.randbytes(50)], [good_hello, good_hello]]
            replies = []
            for messages in cases:
                replies.append(await _send_garbage(url, messages))
            # raw TCP garbage that is not even a websocket upgrade
            for _ in range(3):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(rng.randbytes(200) + b"\r\n\r\n")
                with trio.move_on_after(3):
                    while await stream.receive_some(4096):
                        pass
                await stream.aclose()
            # every refused handshake was answered with a typed reject (or a welcome before the garbage), never a crash
            answers = [parse_handshake_message(r) for r in replies if isinstance(r, bytes)]
            assert sum(isinstance(a, Reject) for a in answers) >= len(cases) - 3
            assert all(isinstance(a, (Reject, Welcome)) for a in answers)
            failures = listener.statistics().handshake_failures
            assert sum(failures.values()) == len(cases)
            assert set(failures) <= {
                "bad_handshake",
                "generation_mismatch",
                "foreign_mesh",
                "peer_authentication_failed",
                "bad_ephemeral",
                "peer_closed",
                "handshake_timeout",
            }
            assert "internal_error" not in failures
            # and it still admits a real member
            async with open_link(url, member_settings(mesh)) as link:
                await link.send_message({"after": "fuzz"})
                assert not link.closed
            assert listener.statistics().links_opened == 1
            nursery.cancel_scope.cancel()


async def test_generation_mismatch_over_the_wire(mesh, member_settings, start_listener, autojump_clock) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh))
            hello = cbor.encode({"eph": bytes(range(32)), "gen": 2, "mesh": mesh.mesh_id, "type": "hello"})
            reply = await _send_garbage(url, [hello])
            reject = parse_handshake_message(reply)
            assert isinstance(reject, Reject) and reject.code == "generation_mismatch" and reject.gen == 1
            # a generation-1 initiator reading such a reply from a generation-2 node reports both versions
            initiator = Handshake("initiator", SigningKey.generate(), mesh, now=0)
            initiator.initiate()
            from_gen2 = cbor.encode({"code": "generation_mismatch", "gen": 2, "message": "x", "type": "reject"})
            with pytest.raises(GenerationMismatch, match="this node speaks generation 1, the peer speaks generation 2"):
                initiator.receive(from_gen2)
            assert listener.statistics().handshake_failures == {"generation_mismatch": 1}
            nursery.cancel_scope.cancel()


async def test_listener_bounds_concurrent_handshakes(
    mesh, member_settings, start_listener, monkeypatch, autojump_clock
) -> None:
    from hydra_node.mesh.link import endpoints

    monkeypatch.setattr(endpoints, "MAX_CONCURRENT_HANDSHAKES", 2)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh, handshake_timeout_s=5))
            stalled = trio.Event()
            opened = 0

            async def stall() -> None:  # opens a websocket and never says hello
                nonlocal opened
                async with open_websocket_url(url, connect_timeout=5, disconnect_timeout=1) as ws:
                    opened += 1
                    try:
                        await stalled.wait()
                    finally:
                        await close_websocket(ws)

            nursery.start_soon(stall)
            nursery.start_soon(stall)
            await wait_until(lambda: opened >= 2)
            with pytest.raises(RejectedByPeer) as info:
                await nursery.start(connect_link, url, member_settings(mesh))
            assert info.value.code == "busy"
            assert listener.statistics().handshake_failures == {"busy": 1}
            stalled.set()
            nursery.cancel_scope.cancel()
