"""Publisher and discoverer against nostr-sdk's LocalRelay (and a hostile relay) on loopback.

LocalRelay runs on nostr-sdk's own threads, so its tests keep the real clock and wait for
conditions with a bound. The hostile, silent and mute relays are trio servers in this run, so
those tests use the autojump clock: timeouts, pings and back-off happen in virtual time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import socket
import time

import pytest
import trio
from nostr_sdk import EventBuilder, Keys, Kind, Tag, Timestamp

from discovery_helpers import FAST_RELAY, build_local_relay
from hydra_node.discovery.nostr.events import ListingContent, build_listing_event
from hydra_node.discovery.nostr.relay import RelayConnection, backoff_delay, publish_once, validate_relay_url
from hydra_node.discovery.nostr.services import DiscovererConfig, NostrDiscoverer, NostrPublisher, PublisherConfig
from waiting import wait_until

CONTENT = ListingContent(mesh_id="mesh-1", invite_token="invite-abc", serving=("SmolLM2-135M",), node_count=2)
#: A listing published after the fact, to prove by its arrival that nothing unwanted came first.
MARKER = ListingContent(mesh_id="marker", invite_token="invite-marker", serving=("SmolLM2-135M",), node_count=1)


def pub_config(*urls, **kw) -> PublisherConfig:
    return PublisherConfig(relays=tuple(urls), relay=FAST_RELAY, deletion_bound_s=2.0, **kw)


def disc_config(*urls) -> DiscovererConfig:
    return DiscovererConfig(relays=tuple(urls), relay=FAST_RELAY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_publish_discover_and_delete_on_shutdown(nursery, relay_url):
    keys = Keys.generate()
    publisher = NostrPublisher(keys, lambda: CONTENT, pub_config(relay_url))
    discoverer = NostrDiscoverer(disc_config(relay_url))
    await nursery.start(discoverer.run)
    with trio.CancelScope() as pub_scope:
        async with trio.open_nursery() as inner:
            await inner.start(publisher.run)
            with trio.fail_after(10):
                (listing,) = await discoverer.wait_for(lambda ls: len(ls) == 1)
            assert listing.content == CONTENT and listing.pubkey == keys.public_key().to_hex()
            assert listing.expires_at - listing.created_at == 120
            pub_scope.cancel()
    with trio.fail_after(10):
        await discoverer.wait_for(lambda ls: not ls)  # the NIP-09 deletion arrived live
    assert discoverer.statistics().table.deleted == 1
    late = NostrDiscoverer(disc_config(relay_url))  # a newcomer does not see the deleted listing either
    async with trio.open_nursery() as inner:
        await inner.start(late.run)
        with trio.fail_after(10):
            await late.wait_synced()  # EOSE: the relay has sent every stored listing it would ever send
            await publish_once(relay_url, build_listing_event(Keys.generate(), MARKER, now=int(time.time())))
            first = await late.wait_for(lambda ls: len(ls) >= 1)
        assert [listing.content for listing in first] == [MARKER]  # nothing from the deleted listing came before
        assert late.statistics().relays[0].connected
        inner.cancel_scope.cancel()


async def test_expired_listing_is_ignored(nursery, relay_url):
    keys = Keys.generate()
    await publish_once(relay_url, build_listing_event(keys, CONTENT, now=int(time.time()), ttl_s=60))
    future = NostrDiscoverer(disc_config(relay_url), clock=lambda: time.time() + 300)  # sees it as expired
    present = NostrDiscoverer(disc_config(relay_url))
    await nursery.start(future.run)
    await nursery.start(present.run)
    with trio.fail_after(10):
        await present.wait_for(lambda ls: len(ls) == 1)
        await wait_until(lambda: future.statistics().table.rejected.get("expired", 0) >= 1)
    assert future.listings() == ()


async def test_relay_down_and_back(nursery):
    from hydra_node.discovery.nostr import _uniffi_trio

    _uniffi_trio.install()
    port = free_port()
    relay = build_local_relay(port)
    await relay.run()
    url = str(await relay.url())
    publisher = NostrPublisher(Keys.generate(), lambda: CONTENT, pub_config(url))
    await nursery.start(publisher.run)
    try:
        with trio.fail_after(10):
            await wait_until(lambda: publisher.statistics().relays[0].ok_accepted >= 1)
        relay.shutdown()
        with trio.fail_after(10):
            await wait_until(lambda: publisher.statistics().relays[0].failures >= 1)
        relay = build_local_relay(port)  # a fresh relay: empty store
        await relay.run()
        discoverer = NostrDiscoverer(disc_config(url))
        await nursery.start(discoverer.run)
        with trio.fail_after(15):
            await discoverer.wait_for(lambda ls: len(ls) == 1)  # republished after reconnecting
        assert publisher.statistics().relays[0].connects >= 2
    finally:
        nursery.cancel_scope.cancel()
        relay.shutdown()


async def test_dead_relay_does_not_stall_publishing_or_shutdown(nursery, relay_url):
    dead = f"ws://127.0.0.1:{free_port()}"
    publisher = NostrPublisher(Keys.generate(), lambda: CONTENT, pub_config(dead, relay_url))
    discoverer = NostrDiscoverer(disc_config(dead, relay_url))
    await nursery.start(discoverer.run)
    with trio.fail_after(10):
        async with trio.open_nursery() as inner:
            await inner.start(publisher.run)
            await discoverer.wait_for(lambda ls: len(ls) == 1)
            inner.cancel_scope.cancel()  # shutdown is bounded even with a dead relay
    dead_stats = discoverer.statistics().relays[0]
    assert not dead_stats.connected and dead_stats.failures >= 1 and dead_stats.last_error


async def test_withdraw_when_full_and_republish(nursery, relay_url):
    state = {"content": CONTENT}
    publisher = NostrPublisher(Keys.generate(), lambda: state["content"], pub_config(relay_url))
    discoverer = NostrDiscoverer(disc_config(relay_url))
    await nursery.start(discoverer.run)
    await nursery.start(publisher.run)
    with trio.fail_after(10):
        await discoverer.wait_for(lambda ls: len(ls) == 1)
        state["content"] = None
        publisher.refresh()
        await discoverer.wait_for(lambda ls: not ls)
        state["content"] = dataclasses.replace(CONTENT, node_count=5)
        publisher.refresh()
        (listing,) = await discoverer.wait_for(lambda ls: len(ls) == 1)
    assert listing.content.node_count == 5 and publisher.statistics().withdrawn == 1


async def test_upstream_mesh_llm_events_are_ignored(nursery, relay_url):
    keys = Keys.generate()
    now = int(time.time())
    exp = ["expiration", str(now + 120)]
    both = [["d", "hydra:mesh-1"], ["k", "hydra"], ["t", "mesh-llm"], exp]
    upstream = [["d", "mesh-llm"], ["k", "mesh-llm"], exp]
    for tags in (both, upstream):
        ev = (
            EventBuilder(Kind(31990), CONTENT.to_json())
            .tags([Tag.parse(t) for t in tags])
            .custom_created_at(Timestamp.from_secs(now))
            .finalize(keys)
        )
        await publish_once(relay_url, ev)
    discoverer = NostrDiscoverer(disc_config(relay_url))
    await nursery.start(discoverer.run)
    with trio.fail_after(10):
        await wait_until(lambda: discoverer.statistics().table.rejected.get("upstream_mesh_llm", 0) >= 1)
    assert discoverer.listings() == ()
    assert discoverer.statistics().relays[0].events_received == 1  # the relay filtered k=mesh-llm out


async def test_hostile_relay_events_are_dropped_and_counted(nursery, hostile_relay, autojump_clock):
    keys = Keys.generate()
    now = int(time.time())
    good = json.loads(build_listing_event(keys, CONTENT, now=now).as_json())
    other = json.loads(
        build_listing_event(Keys.generate(), dataclasses.replace(CONTENT, mesh_id="m2"), now=now).as_json()
    )
    tampered = dict(good, content=good["content"].replace("invite-abc", "invite-evil"))
    wrong_sig = dict(other, sig=good["sig"])
    expired = json.loads(build_listing_event(keys, dataclasses.replace(CONTENT, mesh_id="m3"), now=now - 500).as_json())

    def script(sub: str) -> list:
        return [
            ["EVENT", sub, tampered],
            ["EVENT", sub, wrong_sig],
            ["EVENT", sub, expired],
            "not json",
            ["EVENT", "unknown-sub", good],
            ["NOTICE", "hi"],
            ["EVENT", sub, good],
            ["EOSE", sub],
        ]

    relay = await hostile_relay(script)
    discoverer = NostrDiscoverer(disc_config(relay.url))
    await nursery.start(discoverer.run)
    with trio.fail_after(10):
        (listing,) = await discoverer.wait_for(lambda ls: len(ls) == 1)
    assert listing.content.invite_token == "invite-abc"
    stats = discoverer.statistics()
    assert stats.table.rejected == {"bad_signature": 2, "expired": 1}
    assert stats.relays[0].protocol_errors == 1 and stats.relays[0].notices == 1
    assert stats.relays[0].events_received == 4  # the unknown subscription's event was not even parsed
    assert relay.received[0][0] == "REQ" and relay.received[0][2]["#k"] == ["hydra"]


async def test_closed_subscription_reconnects_with_backoff(nursery, hostile_relay, autojump_clock):
    relay = await hostile_relay(lambda sub: [["CLOSED", sub, "error: go away"]])
    discoverer = NostrDiscoverer(disc_config(relay.url))
    await nursery.start(discoverer.run)
    with trio.fail_after(10):
        await wait_until(lambda: discoverer.statistics().relays[0].connects >= 3)
    assert "go away" in discoverer.statistics().relays[0].last_error


def test_backoff_is_exponential_jittered_and_capped():
    import random

    rng = random.Random(1)
    cfg = FAST_RELAY
    for n in range(40):
        d = backoff_delay(n, rng, cfg)
        full = min(cfg.backoff_cap_s, cfg.backoff_base_s * 2**n)
        assert full / 2 <= d <= full


def test_relay_urls_are_validated():
    assert validate_relay_url("wss://relay.damus.io")
    for bad in ("http://x", "relay.damus.io", "ws://", "wss:///path"):
        with pytest.raises(ValueError):
            validate_relay_url(bad)
    with pytest.raises(ValueError):
        RelayConnection("https://nos.lol")


async def _silent_tcp_server(nursery) -> int:
    """Accepts TCP and never answers: a hung relay."""
    held = []

    async def handler(stream):
        held.append(stream)
        await trio.sleep_forever()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def _mute_websocket_server(nursery) -> int:
    """Completes the websocket handshake, then never reads again (so pings go unanswered)."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    async def handler(stream):
        conn = WSConnection(ConnectionType.SERVER)
        while True:
            conn.receive_data(await stream.receive_some(4096))
            if any(isinstance(e, Request) for e in conn.events()):
                break
        await stream.send_all(conn.send(AcceptConnection()))
        await trio.sleep_forever()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def test_hung_relay_times_out_and_retries(nursery, autojump_clock):
    port = await _silent_tcp_server(nursery)
    cfg = dataclasses.replace(FAST_RELAY, connect_timeout_s=0.2)
    conn = RelayConnection(f"ws://127.0.0.1:{port}", config=cfg)
    await nursery.start(conn.run)
    with trio.fail_after(10):
        await wait_until(lambda: conn.statistics().failures >= 2)
    assert "TooSlowError" in conn.statistics().last_error and not conn.connected


async def test_unanswered_ping_ends_the_session(nursery, autojump_clock):
    port = await _mute_websocket_server(nursery)
    cfg = dataclasses.replace(FAST_RELAY, ping_interval_s=0.1, ping_timeout_s=0.2)
    conn = RelayConnection(f"ws://127.0.0.1:{port}", config=cfg)
    await nursery.start(conn.run)
    with trio.fail_after(10):
        await wait_until(lambda: conn.statistics().failures >= 1)
    stats = conn.statistics()
    assert stats.connects >= 1 and "TooSlowError" in stats.last_error


async def test_discoverer_sync_covers_failed_relays(nursery, relay_url):
    dead = f"ws://127.0.0.1:{free_port()}"
    discoverer = NostrDiscoverer(disc_config(relay_url, dead))
    assert not discoverer.synced()
    await nursery.start(discoverer.run)
    with trio.fail_after(10):
        await discoverer.wait_synced()
    relays = discoverer.statistics().relays
    assert relays[0].connected and relays[1].failures >= 1
