"""A member cannot aim our dial-back at other hosts (issue 25 item 5): the pure rules (strict
``host:port``, the host pinned to the requester's observed address, ports from its announcement,
a per-peer token bucket) and, on loopback with real sockets, a request naming a foreign target
(another listening socket, a path and a query, the metadata address) that connects nowhere while
the legitimate address is dialled, and a flood from one member that is rate-limited."""

from __future__ import annotations

import os
from functools import partial

import pytest
import trio

from hydra_node.mesh.link.dialback_policy import (
    DIALBACK_BURST,
    DIALBACK_RATE_PER_S,
    DialbackAddressError,
    DialbackLimiter,
    DialbackTarget,
    dialback_targets,
    parse_host_port,
)
from hydra_node.mesh.link.endpoints import open_link
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.membership.announcement import Announcement
from hydra_node.mesh.relay.agent import RelayAgent, RelayInputs
from hydra_node.mesh.relay.messages import DIALBACK_KIND, NONCE_BYTES, RELAY_VERSION
from hydra_node.mesh.relay.server import read_reply
from hydra_node.mesh.relay.settings import RelaySettings
from hydra_node.mesh.wire.ids import node_id_from_public_key

TIMEOUT_S = 30


@pytest.mark.parametrize(
    "text, expected",
    [
        ("10.0.0.1:9338", ("10.0.0.1", 9338)),
        ("ws://10.0.0.1:9338", ("10.0.0.1", 9338)),
        ("[2001:DB8::1]:1", ("2001:db8::1", 1)),
        ("Node.Example:65535", ("node.example", 65535)),
    ],
)
def test_plain_host_port_parses(text, expected) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "ws://127.0.0.1:80/admin/delete?user=alice&x=",
        "127.0.0.1:80/x",
        "127.0.0.1:80?q",
        "127.0.0.1:80#f",
        "user:pw@127.0.0.1:80",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:+80",
        "127.0.0.1:٨٠",
        "127.0.0.1",
        ":80",
        "2001:db8::1:80",
        "[10.0.0.1]:80",
        "wss://127.0.0.1:80",
        "127.0.0.1:80 ",
        "",
        7,
    ],
)
def test_anything_but_host_port_is_refused(text) -> None:
    with pytest.raises(DialbackAddressError):
        parse_host_port(text)


def test_targets_are_the_observed_host_at_announced_ports_only() -> None:
    announced = ["198.51.100.7:9338", "10.1.2.3:9400"]
    targets = dialback_targets(
        [
            "198.51.100.7:9338",  # ours: dialled
            "ws://198.51.100.7:9400",  # observed host, an announced port: dialled
            "198.51.100.7:22",  # a port it does not announce
            "10.1.2.3:9400",  # announced, but not where the request came from
            "169.254.169.254:80",
            "ws://198.51.100.7:9338/admin/delete?user=alice&x=",
        ],
        "198.51.100.7",
        announced,
    )
    assert targets == {
        "198.51.100.7:9338": DialbackTarget("198.51.100.7", 9338),
        "ws://198.51.100.7:9400": DialbackTarget("198.51.100.7", 9400),
        "198.51.100.7:22": None,
        "10.1.2.3:9400": None,
        "169.254.169.254:80": None,
        "ws://198.51.100.7:9338/admin/delete?user=alice&x=": None,
    }
    assert DialbackTarget("198.51.100.7", 9338).url == "ws://198.51.100.7:9338"
    assert DialbackTarget("2001:db8::1", 5).url == "ws://[2001:db8::1]:5"
    # a dual-stack listener sees an IPv4 peer as IPv4-mapped IPv6; an observed host that is no IP: no dial
    assert dialback_targets(["198.51.100.7:9338"], "::ffff:198.51.100.7", announced) == {
        "198.51.100.7:9338": DialbackTarget("198.51.100.7", 9338)
    }
    assert dialback_targets(["198.51.100.7:9338"], "not-an-ip", announced) == {"198.51.100.7:9338": None}
    # a requester whose observed address is link-local may be dialled there (it is where it is)
    assert dialback_targets(["169.254.1.1:9"], "169.254.1.1", ["169.254.1.1:9"]) == {
        "169.254.1.1:9": DialbackTarget("169.254.1.1", 9)
    }


def test_the_limiter_is_a_token_bucket_per_peer() -> None:
    limiter = DialbackLimiter(burst=4, rate_per_s=0.5)
    assert limiter.allow("a", 3, 0.0) and limiter.allow("a", 1, 0.0)
    assert not limiter.allow("a", 1, 0.0) and limiter.refused == 1
    assert limiter.allow("b", 4, 0.0)  # another peer has its own bucket
    assert not limiter.allow("a", 2, 3.0) and limiter.allow("a", 1, 3.0)  # 1.5 tokens regained
    assert limiter.allow("a", 0, 3.0)  # a request that dials nothing costs nothing
    assert limiter.allow("a", 4, 1000.0) and not limiter.allow("a", 1, 1000.0)  # the bucket holds at most burst
    small = DialbackLimiter(burst=1, rate_per_s=1, max_tracked=2)
    for peer in "xyz":
        assert small.allow(peer, 1, 0.0)
    assert len(small._buckets) == 2
    with pytest.raises(ValueError, match="burst"):
        DialbackLimiter(burst=0)


def node_id(settings: LinkSettings) -> str:
    return node_id_from_public_key(bytes(settings.identity.verify_key))


class CountingListener:
    """A plain TCP socket on 127.0.0.1 that counts the connections it accepts (a would-be victim)."""

    def __init__(self) -> None:
        self.accepted = 0

    async def start(self, nursery: trio.Nursery) -> int:
        async def handler(stream: trio.SocketStream) -> None:
            self.accepted += 1
            await stream.aclose()

        listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        return listeners[0].socket.getsockname()[1]


async def ask(link: PeerLink, addrs: list[str]) -> dict:
    header = {"kind": DIALBACK_KIND, "v": RELAY_VERSION, "addrs": addrs, "nonce": os.urandom(NONCE_BYTES)}
    async with link.open_stream(header) as stream:
        await stream.send_eof()
        reply, _ = await read_reply(stream, "dialback")
    return reply


async def start_checker(nursery, mesh, member_settings, start_listener, announced: dict) -> tuple[RelayAgent, str]:
    """A node whose ``reach_dialback`` streams go to its relay agent; ``announced``: id -> addresses."""
    agent: RelayAgent | None = None

    async def on_stream(link, header, stream) -> None:
        assert header["kind"] == DIALBACK_KIND and agent is not None
        await agent.on_dialback(link, header, stream)

    me = member_settings(mesh, on_stream=on_stream)
    agent = RelayAgent(
        RelaySettings(),
        RelayInputs(
            node_id=node_id(me),
            role="host",
            link_settings=lambda: me,
            link_to=None,
            open_links=list,
            members=lambda: {pid: Announcement(pid, addresses=tuple(a)) for pid, a in announced.items()},
            alive=lambda _: True,
            addresses=list,
            adopt=lambda _: None,
        ),
    )
    _, url = await start_listener(nursery, me)
    return agent, url


async def test_a_dialback_naming_a_foreign_target_connects_nowhere_but_ours_is_dialled(
    mesh, member_settings, start_listener
) -> None:
    victim = CountingListener()
    announced: dict[str, list[str]] = {}
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            victim_port = await victim.start(nursery)
            requester = member_settings(mesh)
            _, own_url = await start_listener(nursery, requester)  # answers dial-back proofs
            own = own_url.removeprefix("ws://")
            announced[node_id(requester)] = [own, f"10.9.9.9:{victim_port}"]
            agent, checker_url = await start_checker(nursery, mesh, member_settings, start_listener, announced)
            async with open_link(checker_url, requester) as link:
                foreign = [
                    f"ws://127.0.0.1:{victim_port}/admin/delete?user=alice&x=",
                    f"127.0.0.1:{victim_port}/admin",
                    f"localhost:{victim_port}",
                    "169.254.169.254:80",
                ]
                reply = await ask(link, [*foreign, own])
            nursery.cancel_scope.cancel()
    assert reply["op"] == "dialback"
    assert reply["results"] == {**dict.fromkeys(foreign, False), own: True}
    assert victim.accepted == 0
    assert agent.counters["dialbacks_served"] == 1 and agent.counters["dialback_addresses_not_dialled"] == 4


async def test_a_flood_of_dialbacks_from_one_member_is_rate_limited(mesh, member_settings, start_listener) -> None:
    """Each request names the requester's own (announced) listener; the checker dials at most its
    bucket's worth (a burst, then the refill over the elapsed time) and refuses the rest
    (``rate_limited``), counted. The connections are counted at the requester's listener."""
    announced: dict[str, list[str]] = {}
    requests = 40
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            requester = member_settings(mesh)
            listener, own_url = await start_listener(nursery, requester)
            own = own_url.removeprefix("ws://")
            announced[node_id(requester)] = [own]
            agent, checker_url = await start_checker(nursery, mesh, member_settings, start_listener, announced)
            async with open_link(checker_url, requester) as link:
                started = trio.current_time()
                replies = [await ask(link, [own]) for _ in range(requests)]
                elapsed = trio.current_time() - started
            nursery.cancel_scope.cancel()
    allowed = int(DIALBACK_BURST + elapsed * DIALBACK_RATE_PER_S)
    served = [r for r in replies if r["op"] == "dialback"]
    refused = [r for r in replies if r["op"] == "refused"]
    assert all(r["results"] == {own: True} for r in served) and len(served) >= DIALBACK_BURST
    assert {r["code"] for r in refused} == {"rate_limited"} and len(served) <= allowed
    assert agent.counters["dialbacks_refused_rate_limited"] == len(refused) == requests - len(served)
    assert listener.statistics().connections == len(served)
