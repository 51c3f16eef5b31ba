"""Real links over trio-websocket on 127.0.0.1: streams, gossip beside bulk data, admission, rejection.

Every test runs on trio's autojump clock: both ends live in this trio run and loopback TCP
delivers within the send call, so pings, fault-injection delays and the `fail_after` bounds
count virtual seconds and the suite never waits on the real clock.
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

import pytest
import trio
from nacl.signing import SigningKey

from hydra_node.mesh.link.endpoints import connect_link, open_link, serve_links
from hydra_node.mesh.wire.errors import LinkClosed, RejectedByPeer, StreamReset
from hydra_node.mesh.link.faults import FaultInjection
from hydra_node.mesh.wire.frames import Message, encode_frame
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.wire.token import issue_invite, parse_invite
from waiting import wait_until

TIMEOUT_S = 20


async def echo(link: PeerLink, header: dict[str, Any], stream: Any) -> None:
    while chunk := await stream.receive():
        await stream.send(chunk)


async def test_concurrent_streams_echo(mesh, member_settings, start_listener, autojump_clock) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh, on_stream=echo))
            async with open_link(url, member_settings(mesh)) as link:
                results: dict[int, bytes] = {}

                async def one(i: int) -> None:
                    payload = bytes([i]) * (100_000 + 37_000 * i)
                    async with link.open_stream({"kind": "echo", "i": i}) as stream:
                        async with trio.open_nursery() as inner:
                            inner.start_soon(stream.send, payload)
                            got = bytearray()
                            while len(got) < len(payload):
                                got += await stream.receive()
                        await stream.send_eof()
                        assert await stream.receive() == b""
                    results[i] = bytes(got)

                async with trio.open_nursery() as streams:
                    for i in range(6):
                        streams.start_soon(one, i)
                assert all(results[i] == bytes([i]) * (100_000 + 37_000 * i) for i in range(6))
                assert link.statistics().rejected == {}
                (server_link,) = listener.links
                assert server_link.peer_id == node_id_from_public_key(bytes(link._settings.identity.verify_key))
                assert link.peer_id == node_id_from_public_key(bytes(listener._settings.identity.verify_key))
            nursery.cancel_scope.cancel()


async def test_gossip_flows_while_a_bulk_stream_is_stalled_and_running(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    """A 6 MiB transfer whose reader pauses (window exhausted) must not delay priority-lane messages."""
    total = 6 * 1024 * 1024
    gate = trio.Event()
    progress = {"bulk": 0, "done": False}
    seen: list[tuple[int, int]] = []
    got_message = trio.Event()

    async def sink(link: PeerLink, header: dict[str, Any], stream: Any) -> None:
        digest = hashlib.sha256()
        while chunk := await stream.receive():
            digest.update(chunk)
            progress["bulk"] += len(chunk)
            if progress["bulk"] >= 1024 * 1024 and not gate.is_set():
                await gate.wait()  # stop reading: the sender runs out of credit
        progress["done"] = True
        await stream.send(digest.digest())

    async def on_message(link: PeerLink, body: dict[str, Any]) -> None:
        seen.append((body["seq"], progress["bulk"]))
        got_message.set()

    payload = (b"0123456789abcdef" * 65536) * 6
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            _, url = await start_listener(nursery, member_settings(mesh, on_stream=sink, on_message=on_message))
            async with open_link(url, member_settings(mesh)) as link:
                async with link.open_stream({"kind": "bulk"}) as stream:
                    sent = trio.Event()

                    async def send_all() -> None:
                        await stream.send(payload)
                        await stream.send_eof()
                        sent.set()

                    nursery.start_soon(send_all)
                    await wait_until(lambda: progress["bulk"] >= 1024 * 1024)
                    for seq in range(20):  # the bulk sender is blocked on credit now
                        await link.send_message({"seq": seq})
                    await wait_until(lambda: len(seen) >= 20)
                    assert not sent.is_set() and not progress["done"]
                    assert [s for s, _ in seen] == list(range(20))
                    gate.set()
                    for seq in range(20, 40):  # and while it runs again
                        await link.send_message({"seq": seq})
                    digest = await stream.receive_all(64)
                    assert digest == hashlib.sha256(payload).digest()
                await wait_until(lambda: len(seen) >= 40)
                assert [s for s, _ in seen] == list(range(40))
                assert progress["bulk"] == total
            nursery.cancel_scope.cancel()


async def test_joiner_with_invite_receives_mesh_key(mesh, member_settings, autojump_clock) -> None:
    """The integration path: serve_links + nursery.start(connect_link, ..., invite=token)."""
    admitted: list[PeerLink] = []

    async def on_link(link: PeerLink) -> None:
        admitted.append(link)

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            member = member_settings(mesh, on_stream=echo, wall_clock=lambda: 1e9)
            port = await nursery.start(serve_links, on_link, "127.0.0.1", 0, member)
            token = parse_invite(issue_invite(member.identity, mesh.mesh_id, [f"127.0.0.1:{port}"], 600, 1e9), 1e9)
            joiner = LinkSettings(identity=SigningKey.generate(), wall_clock=lambda: 1e9)  # no mesh key yet
            link = await nursery.start(partial(connect_link, token.urls[0], joiner, invite=token))
            assert link.mesh == mesh and link.admitted_by == "token"
            async with link.open_stream({"kind": "echo"}) as stream:
                await stream.send(b"hello")
                assert await stream.receive() == b"hello"
            await wait_until(lambda: admitted)
            assert admitted[0].peer_id == node_id_from_public_key(bytes(joiner.identity.verify_key))
            assert admitted[0].admitted_by == "token"
            await link.aclose()
            await admitted[0].wait_closed()
            assert admitted[0].close_error.code == "peer_goaway"
            # now a member: the key it received lets it join by mac
            member_again = LinkSettings(identity=joiner.identity, mesh=link.mesh)
            async with open_link(f"ws://127.0.0.1:{port}", member_again) as again:
                assert again.admitted_by == "mac"
            nursery.cancel_scope.cancel()


async def test_expired_invite_and_wrong_mesh_are_refused(mesh, member_settings, start_listener, autojump_clock) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            member = member_settings(mesh, wall_clock=lambda: 2e9)  # the member's clock is past the expiry
            listener, url = await start_listener(nursery, member)
            token = parse_invite(issue_invite(member.identity, mesh.mesh_id, [url], 600, 1e9), 1e9)
            with pytest.raises(RejectedByPeer) as info:
                joiner = LinkSettings(identity=SigningKey.generate(), wall_clock=lambda: 1e9)
                await nursery.start(partial(connect_link, url, joiner, invite=token))
            assert info.value.code == "token_expired"
            with pytest.raises(RejectedByPeer) as info:
                await nursery.start(connect_link, url, member_settings(MeshSecret.generate()))
            assert info.value.code == "foreign_mesh"
            await wait_until(lambda: sum(listener.statistics().handshake_failures.values()) >= 2)
            assert listener.statistics().handshake_failures == {"token_expired": 1, "foreign_mesh": 1}
            with pytest.raises(LinkClosed) as closed:
                await nursery.start(connect_link, "ws://127.0.0.1:1", member_settings(mesh))
            assert closed.value.code == "connect_failed"
            nursery.cancel_scope.cancel()


async def test_replayed_frame_is_dropped_and_counted(mesh, member_settings, start_listener, autojump_clock) -> None:
    received: list[dict[str, Any]] = []

    async def on_message(link: PeerLink, body: dict[str, Any]) -> None:
        received.append(body)

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(
                nursery, member_settings(mesh, on_message=on_message, ping_interval_s=60)
            )
            async with open_link(url, member_settings(mesh, ping_interval_s=60)) as link:
                await wait_until(lambda: listener.links)
                server_link = next(iter(listener.links))
                await wait_until(lambda: server_link.statistics().frames_in >= 1)  # the first ping
                # seal one frame by hand and send it twice on the raw websocket
                wire = link._channel.seal(encode_frame(Message({"seq": 1})))
                await link._ws.send_message(wire)
                await link._ws.send_message(wire)
                await wait_until(lambda: server_link.statistics().rejected.get("replay"))
                await link.send_message({"seq": 2})
                await wait_until(lambda: len(received) == 2)
                assert received == [{"seq": 1}, {"seq": 2}] and not server_link.closed
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", ["tamper", "garbage", "text"])
async def test_tampered_or_garbage_frame_closes_the_link(
    kind: str, mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh, on_stream=echo))
            async with open_link(url, member_settings(mesh, ping_interval_s=60)) as link:
                await wait_until(lambda: listener.links)
                server_link = next(iter(listener.links))
                if kind == "tamper":
                    wire = bytearray(link._channel.seal(encode_frame(Message({"x": 1}))))
                    wire[-3] ^= 0x40
                    await link._ws.send_message(bytes(wire))
                elif kind == "garbage":
                    await link._ws.send_message(b"\xff" * 100)
                else:
                    await link._ws.send_message("hello")
                await server_link.wait_closed()
                expected = {"tamper": "tamper", "garbage": "reorder", "text": "bad_frame"}[kind]
                assert server_link.statistics().rejected == {expected: 1}
                assert server_link.close_error.code == expected
                await wait_until(lambda: link.closed)
                with pytest.raises(LinkClosed):
                    async with link.open_stream({"kind": "echo"}):
                        pass
            # the listener is still up and serves a fresh link
            async with open_link(url, member_settings(mesh)) as again:
                async with again.open_stream({"kind": "echo"}) as stream:
                    await stream.send(b"still here")
                    assert await stream.receive() == b"still here"
            nursery.cancel_scope.cancel()


async def test_oversized_websocket_message_is_rejected(mesh, member_settings, start_listener, autojump_clock) -> None:
    from hydra_node.mesh.wire.constants import MAX_LINK_FRAME_BYTES

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh))
            async with open_link(url, member_settings(mesh, ping_interval_s=60)) as link:
                await wait_until(lambda: listener.links)
                server_link = next(iter(listener.links))
                await link._ws.send_message(b"\x00" * (MAX_LINK_FRAME_BYTES + 1))
                await server_link.wait_closed()
                assert server_link.statistics().rejected == {"oversize": 1}
            nursery.cancel_scope.cancel()


async def test_stream_reset_and_refusal(mesh, member_settings, start_listener, autojump_clock) -> None:
    async def failing(link: PeerLink, header: dict[str, Any], stream: Any) -> None:
        await stream.receive()
        raise RuntimeError("handler bug")

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            _, url = await start_listener(nursery, member_settings(mesh, on_stream=failing))
            async with open_link(url, member_settings(mesh)) as link:
                async with link.open_stream({"kind": "x"}) as stream:
                    await stream.send(b"boom")
                    with pytest.raises(StreamReset) as info:
                        await stream.receive()
                    assert info.value.code == "error"
                # the link survives a handler bug
                await link.send_message({"still": "up"})
                assert not link.closed
            _, url2 = await start_listener(nursery, member_settings(mesh))  # accepts no streams
            async with open_link(url2, member_settings(mesh)) as link:
                async with link.open_stream({"kind": "x"}) as stream:
                    with pytest.raises(StreamReset) as info:
                        await stream.receive()
                    assert info.value.code == "refused"
            nursery.cancel_scope.cancel()


async def test_fault_injection_latency_and_message_loss(mesh, member_settings, start_listener, autojump_clock) -> None:
    received: list[dict[str, Any]] = []

    async def on_message(link: PeerLink, body: dict[str, Any]) -> None:
        received.append(body)

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            listener, url = await start_listener(nursery, member_settings(mesh, on_message=on_message, on_stream=echo))
            slow = member_settings(mesh, fault=FaultInjection(latency_s=0.05, message_loss=0.5, seed=3))
            async with open_link(url, slow) as link:
                await wait_until(lambda: link.rtt_ms is not None)
                assert 50.0 <= link.rtt_ms < 60.0  # the ping's delay line; in virtual time nothing else costs
                for seq in range(40):
                    await link.send_message({"seq": seq})
                async with link.open_stream({"kind": "echo"}) as stream:  # streams stay reliable
                    await stream.send(b"x" * 200_000)
                    got = bytearray()
                    while len(got) < 200_000:
                        got += await stream.receive()
                stats = link.statistics()
                assert 0 < stats.messages_dropped < 40 and stats.messages_out == 40 - stats.messages_dropped
                await wait_until(lambda: len(received) == stats.messages_out)
                seqs = [m["seq"] for m in received]
                assert seqs == sorted(seqs)
            lossy = member_settings(mesh, ping_interval_s=60, fault=FaultInjection(frame_loss=0.5, seed=1))
            async with open_link(url, lossy) as link:
                await wait_until(lambda: listener.links)
                (server_link,) = listener.links
                with pytest.raises(LinkClosed):  # some frames vanish: the peer sees a counter gap and closes
                    for seq in range(1000):
                        await link.send_message({"lossy": seq})
                        await trio.sleep(0.005)
                await link.wait_closed()
                assert link.statistics().rejected["dropped_by_fault"] >= 1
                await server_link.wait_closed()
                assert server_link.statistics().rejected == {"reorder": 1}
                assert link.close_error.code in {"peer_closed", "send_failed"}
            nursery.cancel_scope.cancel()
