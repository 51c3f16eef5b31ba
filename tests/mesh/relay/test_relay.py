"""Relayed links on loopback (real links, real sockets): a reservation, a link through the relay
running the same end-to-end handshake and secure channel, the relay seeing only ciphertext, a
tampering relay cleanly rejected, refusals and limits. Autojump clock: no real waiting."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio

from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.relay.client import accept_relayed, connect_via_relay, hold_reservation
from hydra_node.mesh.relay.limits import RelayLimits
from hydra_node.mesh.relay.messages import CONNECT_KIND, INCOMING_KIND, RESERVE_KIND
from hydra_node.mesh.relay.server import RelayServer
from hydra_node.mesh.wire.errors import LinkClosed
from hydra_node.mesh.wire.ids import node_id_from_public_key

TIMEOUT_S = 30
SECRET = b"plaintext the relay must never see " * 4


def node_id(settings: LinkSettings) -> str:
    return node_id_from_public_key(bytes(settings.identity.verify_key))


async def echo(link: PeerLink, header: dict[str, Any], stream: Any) -> None:
    while chunk := await stream.receive():
        await stream.send(chunk)


class Target:
    """A node behind the relay: accepts relayed links (only while ``allowed``), each running ``echo``."""

    def __init__(self, mesh, member_settings, **inner: Any) -> None:
        self.inner_settings = member_settings(mesh, on_stream=echo, **inner)
        self.settings = LinkSettings(identity=self.inner_settings.identity, mesh=mesh, on_stream=self.on_stream)
        self.links: list[PeerLink] = []
        self.allowed = True

    async def on_stream(self, link: PeerLink, header: dict, stream: Any) -> None:
        assert header["kind"] == INCOMING_KIND
        inner = await accept_relayed(link, header, stream, self.inner_settings, allowed=self.allowed)
        if inner is None:
            return
        async with trio.open_nursery() as nursery:
            await nursery.start(inner.run)
            self.links.append(inner)
            await inner.wait_closed()


async def start_relay(nursery, mesh, member_settings, start_listener, **kw):
    server = RelayServer(RelayLimits(**kw.pop("limits", {})), **kw)
    routes = {RESERVE_KIND: server.serve_reserve, CONNECT_KIND: server.serve_connect}

    async def on_stream(link, header, stream):
        await routes[header["kind"]](link, header, stream)

    settings = member_settings(mesh, on_stream=on_stream)
    _, url = await start_listener(nursery, settings)
    return server, url, node_id(settings)


async def test_relayed_link_end_to_end(mesh, member_settings, start_listener, autojump_clock) -> None:
    seen: list[bytes] = []
    tampering = False

    def tap(chunk: bytes) -> bytes:
        seen.append(chunk)
        return chunk[:-1] + bytes([chunk[-1] ^ 1]) if tampering else chunk

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server, url, relay_id = await start_relay(nursery, mesh, member_settings, start_listener, tamper=tap)
            target = Target(mesh, member_settings)
            dialler = member_settings(mesh)
            async with open_link(url, target.settings) as b_relay, open_link(url, dialler) as a_relay:
                reservation = await nursery.start(hold_reservation, b_relay)
                assert reservation.relay == relay_id and server.statistics().reservations == 1
                inner = await nursery.start(partial(connect_via_relay, a_relay, node_id(target.settings), dialler))
                assert inner.relay == relay_id and inner.peer_id == node_id(target.settings)
                async with inner.open_stream({"kind": "echo"}) as stream:
                    await stream.send(SECRET)
                    got = b""
                    while len(got) < len(SECRET):
                        got += await stream.receive()
                assert got == SECRET
                assert (target.links[0].peer_id, target.links[0].relay) == (node_id(dialler), relay_id)
                assert server.statistics().circuits == 1 and server.bytes_relayed > 2 * len(SECRET)
                assert SECRET[:16] not in b"".join(seen)  # end-to-end encrypted: the relay saw ciphertext only
                # a relay that flips one bit: the target's secure channel rejects the frame and closes
                tampering = True
                with pytest.raises(LinkClosed):
                    async with inner.open_stream({"kind": "echo"}) as stream:
                        await stream.send(b"x" * 100)
                        await stream.receive()
                await target.links[0].wait_closed()
                assert target.links[0].close_error.code == "tamper"
                assert target.links[0].statistics().rejected == {"tamper": 1}
                await inner.wait_closed()
                assert not a_relay.closed and not b_relay.closed  # only the end-to-end link is torn down
                with trio.fail_after(5):
                    while server.statistics().circuits:
                        await trio.sleep(0.1)
            nursery.cancel_scope.cancel()


async def test_refusals_are_clean(mesh, member_settings, start_listener, autojump_clock) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server, url, _ = await start_relay(
                nursery, mesh, member_settings, start_listener, limits={"max_reservations": 1}
            )
            target, dialler = Target(mesh, member_settings), member_settings(mesh)
            async with open_link(url, target.settings) as b_relay, open_link(url, dialler) as a_relay:
                # no reservation yet: the relay refuses the circuit
                with pytest.raises(LinkClosed) as err:
                    await nursery.start(partial(connect_via_relay, a_relay, node_id(target.settings), dialler))
                assert "no_reservation" in str(err.value) and err.value.code == "relay_refused"
                await nursery.start(hold_reservation, b_relay)
                # the relay is full: a second node's reservation is refused
                with pytest.raises(LinkClosed, match="relay_full"):
                    await nursery.start(hold_reservation, a_relay)
                # the target refuses relayed links it did not ask for; the relay passes the refusal on
                target.allowed = False
                with pytest.raises(LinkClosed, match="no_reservation"):
                    await nursery.start(partial(connect_via_relay, a_relay, node_id(target.settings), dialler))
                assert server.statistics().refused == {"no_reservation": 1, "relay_full": 1}
            with trio.fail_after(5):  # the reserving link is gone: so is its reservation
                while server.statistics().reservations:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()


async def test_one_member_gets_its_share_of_circuits_and_an_honest_one_still_gets_one(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server, url, _ = await start_relay(
                nursery, mesh, member_settings, start_listener, limits={"max_circuits": 8}
            )
            target, greedy, honest = Target(mesh, member_settings), member_settings(mesh), member_settings(mesh)
            to = node_id(target.settings)
            share = server.book.limits.max_circuits_per_source
            async with (
                open_link(url, target.settings) as t_relay,
                open_link(url, greedy) as g_relay,
                open_link(url, honest) as h_relay,
            ):
                await nursery.start(hold_reservation, t_relay)
                held = 0
                with pytest.raises(LinkClosed) as err:
                    for _ in range(server.book.limits.max_circuits):  # every circuit, were it let
                        await nursery.start(partial(connect_via_relay, g_relay, to, greedy))
                        held += 1
                assert "circuits_share_exceeded" in str(err.value) and held == share < 8
                await nursery.start(partial(connect_via_relay, h_relay, to, honest))  # still room for others
                assert server.statistics().circuits == share + 1
                assert server.statistics().refused == {"circuits_share_exceeded": 1}
            nursery.cancel_scope.cancel()


async def test_sybil_reservations_from_one_address_are_capped(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server, url, _ = await start_relay(
                nursery, mesh, member_settings, start_listener, limits={"max_reservations_per_address": 2}
            )
            sybils = [member_settings(mesh) for _ in range(3)]  # three node ids, all from 127.0.0.1
            async with (
                open_link(url, sybils[0]) as l0,
                open_link(url, sybils[1]) as l1,
                open_link(url, sybils[2]) as l2,
            ):
                await nursery.start(hold_reservation, l0)
                await nursery.start(hold_reservation, l1)
                with pytest.raises(LinkClosed, match="address_share_exceeded"):
                    await nursery.start(hold_reservation, l2)
                assert server.statistics().reservations == 2  # 62 places left for other members
                assert server.statistics().refused == {"address_share_exceeded": 1}
            nursery.cancel_scope.cancel()


async def test_an_idle_circuit_is_closed_and_counted(mesh, member_settings, start_listener, autojump_clock) -> None:
    quiet = {"ping_interval_s": 10_000.0, "idle_timeout_s": 100_000.0}  # end-to-end links that send nothing
    with trio.fail_after(TIMEOUT_S * 10):
        async with trio.open_nursery() as nursery:
            server, url, _ = await start_relay(
                nursery, mesh, member_settings, start_listener, limits={"circuit_idle_s": 60.0}
            )
            target, dialler = Target(mesh, member_settings, **quiet), member_settings(mesh, **quiet)
            async with open_link(url, target.settings) as t_relay, open_link(url, dialler) as a_relay:
                await nursery.start(hold_reservation, t_relay)
                inner = await nursery.start(partial(connect_via_relay, a_relay, node_id(target.settings), dialler))
                await inner.wait_closed()  # nothing passed for 60 s: the relay ended the circuit
                while server.statistics().circuits:
                    await trio.sleep(0.1)
                assert server.statistics().circuits_idle_closed == 1
                assert not a_relay.closed and not t_relay.closed  # only the idle circuit went
            nursery.cancel_scope.cancel()


async def test_relay_gone_closes_the_relayed_link(mesh, member_settings, start_listener, autojump_clock) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as relay_nursery:
                server, url, _ = await start_relay(relay_nursery, mesh, member_settings, start_listener)
                target, dialler = Target(mesh, member_settings), member_settings(mesh)
                async with open_link(url, target.settings) as b_relay, open_link(url, dialler) as a_relay:
                    await nursery.start(hold_reservation, b_relay)
                    inner = await nursery.start(partial(connect_via_relay, a_relay, node_id(target.settings), dialler))
                    relay_nursery.cancel_scope.cancel()  # the relay node dies
                    await inner.wait_closed()
                    await target.links[0].wait_closed()
            nursery.cancel_scope.cancel()


async def test_relay_paces_to_its_byte_rate(mesh, member_settings, start_listener, autojump_clock) -> None:
    """The relay's token bucket (virtual time): 100 kB echoed through a 10 kB/s relay takes >= 9.9 s."""
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            server, url, _ = await start_relay(
                nursery, mesh, member_settings, start_listener, limits={"bytes_per_s": 10_000, "burst_bytes": 1_000}
            )
            target, dialler = Target(mesh, member_settings), member_settings(mesh)
            async with open_link(url, target.settings) as b_relay, open_link(url, dialler) as a_relay:
                await nursery.start(hold_reservation, b_relay)
                inner = await nursery.start(partial(connect_via_relay, a_relay, node_id(target.settings), dialler))
                t0 = trio.current_time()
                async with inner.open_stream({"kind": "echo"}) as stream:
                    await stream.send(b"z" * 50_000)
                    got = 0
                    while got < 50_000:
                        got += len(await stream.receive())
                assert trio.current_time() - t0 >= (2 * 50_000 - 1_000) / 10_000
                assert server.statistics().bytes_relayed >= 100_000
                nursery.cancel_scope.cancel()


async def test_a_direct_inbound_link_proves_we_can_be_dialled(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    """Reachability (docs/relays.md): a peer that dialled us directly settles it, whatever dial-backs
    say (a loaded host's dial-backs time out like a NAT's); links we dialled, or relayed ones, do not."""
    from hydra_node.mesh.relay.agent import RelayAgent, RelayInputs
    from hydra_node.mesh.relay.settings import RelaySettings

    accepted: list[PeerLink] = []
    dialled: list[PeerLink] = []
    me = member_settings(mesh)
    agent = RelayAgent(
        RelaySettings(),
        RelayInputs(
            node_id=node_id(me),
            role="host",
            link_settings=lambda: me,
            link_to=None,
            open_links=lambda: accepted + dialled,
            members=dict,
            alive=lambda _: True,
            addresses=lambda: ["127.0.0.1:1"],
            adopt=lambda _: None,
        ),
    )
    agent.reachability.set_addresses(("127.0.0.1:1",))
    for checker in ("p1", "p2"):  # two checkers could not reach our advertised address
        agent.reachability.report(checker, {"127.0.0.1:1": False}, trio.current_time())
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            _, url = await start_listener(nursery, me, accepted.append)
            other = member_settings(mesh)
            _, other_url = await start_listener(nursery, other)
            async with open_link(other_url, me) as out:
                dialled.append(out)
                assert agent.reachable() is False  # only a link we dialled
                async with open_link(url, member_settings(mesh)):
                    while not accepted:
                        await trio.sleep(0.01)
                    assert agent.reachable() is True and agent.reachability_view().method == "inbound_link"
                    assert agent.offering  # reachable hosts relay by default (--relay auto)
            nursery.cancel_scope.cancel()


async def test_a_relayed_link_moves_to_a_direct_one_after_its_streams(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    """The link table keeps a direct link over a relayed one; the relayed link closes once the streams
    open on it end, and with it the relay's circuit. The relay told each end its observed address."""
    from hydra_node.mesh.link_table import LinkTable

    observed: list[str | None] = []
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            server, url, relay_id = await start_relay(nursery, mesh, member_settings, start_listener)
            target, dialler = Target(mesh, member_settings), member_settings(mesh)
            _, direct_url = await start_listener(nursery, target.inner_settings)
            table = LinkTable(
                node_id(dialler),
                nursery,
                lambda: dialler,
                addresses_of=lambda _: [],
                on_up=lambda _: None,
                on_down=lambda _: None,
            )
            async with open_link(url, target.settings) as b_relay, open_link(url, dialler) as a_relay:
                await nursery.start(hold_reservation, b_relay)
                relayed = await nursery.start(
                    partial(connect_via_relay, a_relay, node_id(target.settings), dialler, on_observed=observed.append)
                )
                assert observed == ["127.0.0.1"]
                table.adopt(relayed)
                async with relayed.open_stream({"kind": "echo"}) as stream:
                    async with open_link(direct_url, dialler) as direct:
                        table.adopt(direct)
                        assert table.get(node_id(target.settings)) is direct and direct.path == "direct"
                        table.adopt(relayed)  # adopted again (both ends race): the direct link stays
                        assert table.get(node_id(target.settings)) is direct
                        await trio.sleep(5)
                        assert not relayed.closed  # a stream is still open on it
                        await stream.send(b"finishing on the relayed link")
                        await stream.send_eof()
                        assert await stream.receive_all(1024) == b"finishing on the relayed link"
                await relayed.wait_closed()
                assert relayed.close_error.code == "local_close" and "moved" in str(relayed.close_error)
                while server.statistics().circuits:
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
