"""MdnsService on loopback multicast with a test port: mutual discovery, goodbyes, own packets.

Every service runs in this trio run and loopback multicast is delivered within the send call,
so the tests use the autojump clock: announcement gaps and answer delays pass in virtual time.
"""

from __future__ import annotations

import dataclasses
import socket

import trio

from discovery_helpers import make_advert
from hydra_node.discovery.mdns.service import MdnsService
from hydra_node.discovery.mdns.wire import decode_packet, encode_announcement, encode_query
from waiting import TRIO_POLL_S, wait_until


async def _send_raw(cfg, data: bytes) -> None:
    s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(cfg.interface))
        await s.sendto(data, (cfg.group, cfg.port))


async def test_two_services_see_each_other_and_goodbye_removes(nursery, mdns_config, autojump_clock):
    a, b = make_advert("a"), make_advert("b", port=9400)
    sa, sb = MdnsService(mdns_config, a), MdnsService(mdns_config, b)
    await nursery.start(sa.run)
    with trio.CancelScope() as b_scope:
        async with trio.open_nursery() as inner:
            await inner.start(sb.run)
            with trio.fail_after(10):
                assert await sa.wait_for(lambda ads: len(ads) == 1) == (b,)
                assert await sb.wait_for(lambda ads: len(ads) == 1) == (a,)
            assert sa.seen()[0].advert.port == 9400
            b_scope.cancel()
    with trio.fail_after(5):
        assert await sa.wait_for(lambda ads: not ads) == ()  # b's goodbye, not TTL expiry (120 s)
    stats = sa.statistics()
    assert stats.own_dropped > 0 and stats.announcements_sent >= 1 and stats.adverts == 0


async def test_a_lone_service_ignores_its_own_packets(nursery, mdns_config, autojump_clock):
    a = make_advert("alone")
    sa = MdnsService(mdns_config, a)
    await nursery.start(sa.run)
    with trio.fail_after(5):
        await wait_until(lambda: sa.statistics().own_dropped >= 2)  # its own announcement and query came back
    assert sa.adverts() == () and sa.statistics().queries_answered == 0


async def test_browse_only_and_update_propagates(nursery, mdns_config, autojump_clock):
    a = make_advert("a")
    sa = MdnsService(mdns_config, a)
    browser = MdnsService(mdns_config, None)
    await nursery.start(browser.run)
    await nursery.start(sa.run)
    with trio.fail_after(10):
        await browser.wait_for(lambda ads: len(ads) == 1)
    assert sa.adverts() == ()  # a browser announces nothing
    sa.update_advert(dataclasses.replace(a, node_count=4, models=("x", "y")))
    with trio.fail_after(10):
        (seen,) = await browser.wait_for(lambda ads: ads and ads[0].node_count == 4)
    assert seen.models == ("x", "y")


async def test_answers_queries_and_counts_junk(nursery, mdns_config, autojump_clock):
    mdns_config = dataclasses.replace(mdns_config, announce_gaps_s=(0.2, 0.4))
    a = make_advert("a")
    sa = MdnsService(mdns_config, a)
    browser = MdnsService(mdns_config, None)
    started = trio.current_time()
    await nursery.start(sa.run)
    with trio.fail_after(10):
        await wait_until(lambda: sa.statistics().announcements_sent >= 3)  # initial announcements (0, 0.2, 0.6 s)
    assert 0.6 <= trio.current_time() - started < 0.6 + 2 * TRIO_POLL_S  # virtual time: the gaps, exactly
    await _send_raw(mdns_config, b"\x00\x01junk")
    await _send_raw(mdns_config, encode_query(7))
    with trio.fail_after(5):
        await wait_until(lambda: sa.statistics().queries_answered >= 1 and sa.statistics().malformed >= 1)
    # a late browser still learns about a through queries
    await nursery.start(browser.run)
    with trio.fail_after(5):
        await browser.wait_for(lambda ads: len(ads) == 1)


async def test_foreign_advert_with_our_origin_is_dropped(nursery, mdns_config, autojump_clock):
    a = make_advert("a")
    sa = MdnsService(mdns_config, a)
    await nursery.start(sa.run)
    spoof = make_advert("spoof", origin=a.origin)
    honest = make_advert("honest")
    await _send_raw(mdns_config, encode_announcement(spoof))
    await _send_raw(mdns_config, encode_announcement(honest))
    with trio.fail_after(5):
        assert await sa.wait_for(lambda ads: len(ads) == 1) == (honest,)


async def test_one_shot_query_gets_a_unicast_answer(nursery, mdns_config, autojump_clock):
    a = make_advert("a")
    await nursery.start(MdnsService(mdns_config, a).run)
    s = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with s:
        await s.bind(("127.0.0.1", 0))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        await s.sendto(encode_query(99), (mdns_config.group, mdns_config.port))
        with trio.fail_after(5):
            data, addr = await s.recvfrom(9000)
    event = decode_packet(data)
    assert event.adverts == ((a, 10),) and addr[1] == mdns_config.port
