"""A member cannot aim our hole punch at other hosts (issue 25 item 5): a punch connects only to the
peer's IP as the relay sees it (``peer_observed``); an ``addr`` naming another IP is refused
(``bad_punch``) before any connection, and the upgrade ends. On loopback, with a real listening
socket as the would-be victim that counts the connections it accepts."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest
import trio

from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.relay.messages import IncomingRequest, ReplyDecoder, encode_reply, parse_incoming
from hydra_node.mesh.relay.punch import PUNCH_KIND, PunchAddress, encode_punch
from hydra_node.mesh.relay.upgrade import LinkUpgrader, UpgradeInputs, _Refused
from hydra_node.mesh.wire.ids import node_id_from_public_key

TIMEOUT_S = 20
A = "a" * 64


def node_id(settings: LinkSettings) -> str:
    return node_id_from_public_key(bytes(settings.identity.verify_key))


def upgrader(counters: Counter, links: dict | None = None) -> LinkUpgrader:
    links = {} if links is None else links
    return LinkUpgrader(
        True,
        UpgradeInputs(link_settings=lambda: None, members=dict, current=links.get, adopt=lambda _: None),
        counters,
    )


def test_the_relay_tells_each_end_the_other_ends_address() -> None:
    header = {"kind": "relay_incoming", "v": 1, "from": A, "observed": "203.0.113.9", "peer_observed": "198.51.100.7"}
    assert parse_incoming(header) == IncomingRequest(A, "203.0.113.9", "198.51.100.7")
    with pytest.raises(Exception, match="peer_observed"):
        parse_incoming({**header, "peer_observed": "198.51.100.7:80"})
    decoder = ReplyDecoder()
    decoder.receive_data(encode_reply("connected", observed="198.51.100.7", peer_observed="203.0.113.9"))
    assert decoder.next_reply("connected") == {
        "op": "connected",
        "observed": "198.51.100.7",
        "peer_observed": "203.0.113.9",
    }
    bad = ReplyDecoder()
    bad.receive_data(encode_reply("connected", peer_observed="example.com"))
    with pytest.raises(Exception, match="peer_observed"):
        bad.next_reply("connected")


def test_a_punch_goes_only_to_the_ip_the_relay_sees_the_peer_at() -> None:
    counters: Counter[str] = Counter()
    up = upgrader(counters)
    up._peer_observed[A] = "198.51.100.7"
    assert up._punch_target(A, "198.51.100.7:40001") == PunchAddress("198.51.100.7", 40001)
    for addr in ("127.0.0.1:8080", "169.254.169.254:80", "198.51.100.8:40001"):
        with pytest.raises(_Refused) as exc:
            up._punch_target(A, addr)
        assert exc.value.code == "bad_punch"
    assert counters["hole_punch_target_refused"] == 3


def test_a_direct_dial_takes_only_plain_announced_host_ports() -> None:
    from hydra_node.mesh.membership.announcement import Announcement

    ann = Announcement(
        A,
        addresses=(
            "ws://127.0.0.1:1/admin/delete?user=alice&x=",
            "wss://127.0.0.1:2/x",
            "127.0.0.1:3",
            "wss://[::1]:4",
        ),
        extra={"reach": True},
    )
    up = LinkUpgrader(
        True,
        UpgradeInputs(link_settings=lambda: None, members=lambda: {A: ann}, current=dict().get, adopt=lambda _: None),
        Counter(),
    )
    assert up._direct_urls(A) == ["ws://127.0.0.1:3", "wss://[::1]:4"]


class EvilPeer:
    """A member that answers every ``hole_punch`` with a target of its choosing and waits for ``sync``."""

    def __init__(self, mesh, member_settings, target: str) -> None:
        self.settings = member_settings(mesh, on_stream=self.on_stream)
        self.id = node_id(self.settings)
        self.target = target
        self.asked = 0

    async def on_stream(self, link, header, stream) -> None:
        if header.get("kind") == PUNCH_KIND:
            self.asked += 1
            await stream.send(encode_punch("punch", addr=self.target))
            await stream.receive()


async def test_a_member_chosen_punch_target_is_not_connected_to(mesh, member_settings, start_listener) -> None:
    accepted = 0

    async def count(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await stream.aclose()

    counters: Counter[str] = Counter()
    links: dict[str, PeerLink] = {}
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            victim = (await nursery.start(partial(trio.serve_tcp, count, 0, host="127.0.0.1")))[0]
            evil = EvilPeer(mesh, member_settings, f"127.0.0.1:{victim.socket.getsockname()[1]}")
            _, url = await start_listener(nursery, evil.settings)
            driver_settings = member_settings(mesh)
            driver = LinkUpgrader(
                True,
                UpgradeInputs(
                    link_settings=lambda: driver_settings, members=dict, current=links.get, adopt=lambda _: None
                ),
                counters,
            )
            await nursery.start(driver.run)
            async with open_link(url, driver_settings) as link:  # stands in for the relayed link
                links[evil.id] = link
                # the relay saw the peer at 127.0.0.2; it names 127.0.0.1 (another host, for the test)
                driver.relayed_link_up(link, "127.0.0.1", drive=True, peer_observed="127.0.0.2")
                while not counters["upgrades_given_up"]:
                    await trio.sleep(0.05)
                assert not link.closed
            nursery.cancel_scope.cancel()
    assert accepted == 0 and evil.asked == 1
    assert counters["hole_punch_target_refused"] == 1 and counters["hole_punch_failed"] == 1
