"""Moving a link to a direct path, on loopback (real sockets, real links): the punched connection's
websocket roles and handshake, a peer that refuses to punch, and the direct dial of a peer that can
be dialled. The TCP simultaneous open across two NATs is tested in the NAT lab
(tests/mesh/relay/test_relay_natlab.py); on loopback there is no NAT to open."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest
import trio

from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.membership.announcement import Announcement
from hydra_node.mesh.relay.punch import PUNCH_KIND, websocket_client
from hydra_node.mesh.relay.simopen import PunchFailed, run_punched_link
from hydra_node.mesh.relay.upgrade import LinkUpgrader, UpgradeInputs
from hydra_node.mesh.wire.ids import node_id_from_public_key

TIMEOUT_S = 20


def node_id(settings: LinkSettings) -> str:
    return node_id_from_public_key(bytes(settings.identity.verify_key))


async def echo(link, header, stream) -> None:
    while chunk := await stream.receive():
        await stream.send(chunk)


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """Both ends of one loopback TCP connection (what a simultaneous open leaves each end with)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listeners[0]:
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listeners[0].accept()
    return client, server


async def test_a_punched_connection_runs_an_ordinary_link(mesh, member_settings, autojump_clock) -> None:
    """Both ends think they dialled: the smaller id is the websocket client and handshake initiator."""
    one, two = member_settings(mesh, on_stream=echo), member_settings(mesh, on_stream=echo)
    a, b = await tcp_pair()
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            ends = [
                nursery.start(partial(run_punched_link, a, node_id(two), one)),
                nursery.start(partial(run_punched_link, b, node_id(one), two)),
            ]
            links: list[PeerLink] = []

            async def up(start) -> None:
                links.append(await start)

            async with trio.open_nursery() as both:
                for start in ends:
                    both.start_soon(up, start)
            assert {link.path for link in links} == {"punched"} and {link.relay for link in links} == {None}
            for link in links:
                me = node_id(one) if link.peer_id == node_id(two) else node_id(two)
                assert link.is_initiator == websocket_client(me, link.peer_id)
            async with links[0].open_stream({"kind": "echo"}) as stream:
                await stream.send(b"over the punched path")
                await stream.send_eof()
                assert await stream.receive_all(1024) == b"over the punched path"
            nursery.cancel_scope.cancel()


async def test_a_punched_connection_to_someone_else_is_refused(mesh, member_settings, autojump_clock) -> None:
    """An end that expected another node drops the connection (``wrong_peer``); no link is kept."""
    third, two, one = sorted((member_settings(mesh) for _ in range(3)), key=node_id)
    # one has the largest id: the websocket server for both ends, so the handshake completes and
    # one's own check of the authenticated peer is what refuses it.
    a, b = await tcp_pair()
    failures: dict[str, str] = {}
    ended: list[str] = []

    async def end(name, stream, peer, settings) -> None:
        try:
            await run_punched_link(stream, peer, settings)
            ended.append(name)
        except PunchFailed as exc:
            failures[name] = exc.reason

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(end, "one", a, node_id(third), one)  # one expected third; two answered
            nursery.start_soon(end, "two", b, node_id(one), two)
    assert failures == {"one": "wrong_peer"} and ended == ["two"]  # two's link closed at once


async def test_two_ends_that_both_act_as_client_fail_cleanly(mesh, member_settings, autojump_clock) -> None:
    """A peer that breaks the role rule (both send an HTTP request) costs a failed attempt, never a crash."""
    low, mid, high = sorted((member_settings(mesh) for _ in range(3)), key=node_id)
    a, b = await tcp_pair()
    failures: dict[str, str] = {}

    async def end(name, stream, peer, settings) -> None:
        try:
            await run_punched_link(stream, peer, settings)
        except PunchFailed as exc:
            failures[name] = exc.reason

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(end, "low", a, node_id(mid), low)  # low < mid: a client
            nursery.start_soon(end, "mid", b, node_id(high), mid)  # mid < high: a client too
    assert set(failures) == {"low", "mid"} and set(failures.values()) <= {"websocket", "handshake"}


class Node:
    """A link endpoint whose ``hole_punch`` streams go to its upgrader."""

    def __init__(self, mesh, member_settings, enabled: bool, members=dict) -> None:
        self.settings = member_settings(mesh, on_stream=self.on_stream)
        self.id = node_id(self.settings)
        self.counters: Counter[str] = Counter()
        self.links: dict[str, PeerLink] = {}
        self.adopted: list[PeerLink] = []
        self.upgrader = LinkUpgrader(
            enabled,
            UpgradeInputs(
                link_settings=lambda: self.settings, members=members, current=self.links.get, adopt=self.adopt
            ),
            self.counters,
        )

    def adopt(self, link: PeerLink) -> None:
        self.adopted.append(link)
        self.links[link.peer_id] = link

    async def on_stream(self, link, header, stream) -> None:
        if header.get("kind") == PUNCH_KIND:
            await self.upgrader.on_punch(link, header, stream)


@pytest.mark.parametrize("enabled, code", [(False, "disabled"), (True, "not_relayed")])
async def test_a_peer_that_will_not_punch_ends_the_upgrade_and_the_link_stays(
    mesh, member_settings, start_listener, autojump_clock, enabled, code
) -> None:
    """``[relay] hole_punch = false`` is honoured: the peer refuses, the driver gives up at once."""
    driver, peer = Node(mesh, member_settings, True), Node(mesh, member_settings, enabled)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.upgrader.run)
            await nursery.start(peer.upgrader.run)
            _, url = await start_listener(nursery, peer.settings)
            async with open_link(url, driver.settings) as link:
                driver.links[peer.id] = link
                driver.upgrader.relayed_link_up(link, "127.0.0.1", drive=True, peer_observed="127.0.0.1")
                while not driver.counters["upgrades_given_up"]:
                    await trio.sleep(0.05)
                assert driver.counters["hole_punch_failed"] == 1 and peer.counters["hole_punch_refused"] == 1
                assert not link.closed and driver.adopted == []
            nursery.cancel_scope.cancel()


async def test_a_peer_that_can_be_dialled_is_dialled_directly(
    mesh, member_settings, start_listener, autojump_clock
) -> None:
    """When the other end announced ``reach: true``, the driver dials it instead of punching."""
    target = Node(mesh, member_settings, True)
    accepted: list[PeerLink] = []
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            _, url = await start_listener(nursery, target.settings, accepted.append)
            ann = Announcement(target.id, addresses=(url.removeprefix("ws://"),), extra={"reach": True})
            driver = Node(mesh, member_settings, True, members=lambda: {target.id: ann})
            await nursery.start(driver.upgrader.run)
            async with open_link(url, driver.settings) as first:  # stands in for the relayed link
                driver.links[target.id] = first
                driver.upgrader.relayed_link_up(first, None, drive=True)
                while not driver.adopted:
                    await trio.sleep(0.05)
                direct = driver.adopted[0]
                assert direct is not first and direct.peer_id == target.id and direct.path == "direct"
                assert driver.counters["direct_dial_ok"] == 1 and driver.counters["direct_dial_attempts"] == 1
                assert driver.counters["hole_punch_attempts"] == 0
            nursery.cancel_scope.cancel()
